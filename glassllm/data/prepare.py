"""Tokenize a corpus of many files once, into token shards on disk (``glassllm prepare``).

The directory written (nanoGPT's ``train.bin`` / ``val.bin``, cut into shards):

- ``train_00000.bin``, ``train_00001.bin``, ..., ``val_00000.bin``, ...: raw little-endian
  ``uint16`` token ids when the vocabulary has at most 65,536 tokens, else ``uint32``; at most
  ``shard_tokens`` tokens each. Each split is one token stream, cut into shards only for size:
  every document's tokens followed by the end-of-text token (nanoGPT appends GPT-2's to each
  document), the documents in the order of the files and of their lines.
- ``manifest.json`` (`MANIFEST_NAME`): format and version, dtype, the whole tokenizer (so
  ``glassllm train --data DIR`` needs nothing else), the end-of-text id, per split its token,
  document and character counts and its shards (name, tokens, sha256), the source files (path,
  bytes, sha256, documents), the files skipped and why, and the seed and validation fraction.

End of text: a BPE's ``<|endoftext|>`` (glassllm's BPE has it as id 0; another tokenizer's must
have it or an ``eos`` among its special tokens). A char or byte tokenizer has no such token, so
the document separator is the NUL character: never in a document (a file with a NUL is binary and
refused), byte 0 of a byte tokenizer, and a character added to a char tokenizer's vocabulary.
The tokenizers stay plain char and byte tokenizers that any checkpoint reader knows.

The split is by document: document ``j`` of file ``i`` goes to validation when the ``j``-th draw
of ``default_rng([seed, i])`` is below ``val_fraction``, whatever the number of workers.

The output is whole or absent: everything is written into a temporary directory beside
``out_dir`` (`glassllm.atomic_directory`), renamed into place once every shard and the manifest
are flushed; any failure (a bad file, a full disk, Ctrl-C) removes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from glassllm.atomic_directory import make_temporary, recover, replace_directory
from glassllm.atomic_file import fsync_path
from glassllm.data.corpus import DataError
from glassllm.data.sources import BadSource, Source, display_name, read_documents
from glassllm.data.tokenizers import CharTokenizer, Tokenizer, build_tokenizer, tokenizer_from_dict

FORMAT, VERSION = "glassllm-tokens", 1
MANIFEST_NAME = "manifest.json"
DEFAULT_SHARD_TOKENS = 100_000_000  # 200 MB of uint16, nanoGPT's order of a file
DOCUMENT_SEPARATOR = "\0"  # the end of text of char and byte tokenizers
SPLITS = ("train", "val")
_EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")


def shard_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits, else ``uint32``; DataError beyond ``uint32``."""
    if vocab_size <= 1 << 16:
        return np.dtype("<u2")
    if vocab_size <= 1 << 32:
        return np.dtype("<u4")
    raise DataError(f"a vocabulary of {vocab_size:,} tokens does not fit uint32 token ids")


def end_of_text_id(tokenizer: Tokenizer) -> int:
    """The id written after every document (see the module docstring)."""
    if tokenizer.to_dict()["type"] in ("char", "byte"):
        try:
            return tokenizer.encode(DOCUMENT_SEPARATOR)[0]
        except ValueError:  # a char vocabulary given, not learned here
            raise DataError(
                "the char tokenizer has no NUL character to put between documents (one that "
                "glassllm prepare learns has): use --tokenizer char or byte"
            ) from None
    for name in _EOS_NAMES:
        found = tokenizer.token_id(name)  # type: ignore[attr-defined]
        if found is not None:
            return int(found)
    raise DataError(
        f"the tokenizer has no end-of-text token (none of {', '.join(_EOS_NAMES)}) to put "
        "between documents"
    )


@dataclasses.dataclass
class PrepareOptions:
    """How to prepare (the options of ``glassllm prepare``)."""

    tokenizer: str | Tokenizer = "char"  # a kind to learn ("char", "byte", "bpe") or one given
    vocab_size: int | None = None
    val_fraction: float = 0.1
    workers: int = 1
    text_field: str = "text"
    seed: int = 1337
    skip_bad_files: bool = False
    shard_tokens: int = DEFAULT_SHARD_TOKENS

    def validate(self) -> None:
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction must be in (0, 1), got {self.val_fraction}")
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if self.shard_tokens < 1:
            raise ValueError(f"--shard-tokens must be at least 1, got {self.shard_tokens}")


@dataclasses.dataclass
class _Encoded:
    """One source file, tokenized (or the reason it could not be)."""

    index: int
    problem: str | None = None
    ids: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    documents: dict[str, int] = dataclasses.field(default_factory=dict)
    characters: dict[str, int] = dataclasses.field(default_factory=dict)
    size: int = 0
    sha256: str = ""


_WORKER: dict[str, Any] = {}  # the tokenizer and settings of this worker process


def _start_worker(spec: dict[str, Any], settings: dict[str, Any]) -> None:
    tokenizer = tokenizer_from_dict(spec)
    _WORKER.update(settings, tokenizer=tokenizer, eot=end_of_text_id(tokenizer))


def _encode_source(job: tuple[int, Source]) -> _Encoded:
    index, source = job
    try:
        read = read_documents(source, _WORKER["text_field"])
        to_val = _validation_draws(
            _WORKER["seed"], index, len(read.documents), _WORKER["val_fraction"]
        )
        encoded = _Encoded(index, size=read.size, sha256=read.sha256)
        for split in SPLITS:
            docs = [d for d, v in zip(read.documents, to_val, strict=True) if v == (split == "val")]
            encoded.ids[split] = _encode_documents(docs, _WORKER["tokenizer"], _WORKER["eot"])
            encoded.documents[split] = len(docs)
            encoded.characters[split] = sum(map(len, docs)) + len(docs)  # + one end of text
    except ValueError as err:  # BadSource, or a character a given tokenizer cannot encode
        message = str(err) if isinstance(err, BadSource) else f"{source.path!r}: {err}"
        return _Encoded(index, problem=" ".join(message.split()))
    return encoded


def _validation_draws(seed: int, index: int, count: int, fraction: float) -> np.ndarray:
    """Which of a file's ``count`` documents go to validation."""
    return np.random.default_rng([seed, index]).random(count) < fraction


def _encode_documents(docs: list[str], tokenizer: Tokenizer, eot: int) -> np.ndarray:
    """The documents' ids, each followed by ``eot``, as one array of the shard dtype."""
    dtype = shard_dtype(tokenizer.vocab_size)
    if not docs:
        return np.empty(0, dtype)
    library = getattr(tokenizer, "tokenizer", None)  # a BPE: Hugging Face's batch encoder
    if library is not None:
        pieces = [e.ids for e in library.encode_batch(docs, add_special_tokens=False)]
    else:
        pieces = [tokenizer.encode_array(doc) for doc in docs]
    lengths = np.array([len(p) + 1 for p in pieces])
    out = np.full(int(lengths.sum()), eot, dtype=dtype)
    ends = np.cumsum(lengths) - 1
    for piece, end in zip(pieces, ends, strict=True):
        out[end - len(piece) : end] = piece
    return out


class _ShardWriter:
    """One split's token stream, written as shards of at most ``limit`` tokens."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, limit: int) -> None:
        self.directory, self.split, self.dtype, self.limit = directory, split, dtype, limit
        self.shards: list[dict[str, Any]] = []
        self._file: BinaryIO | None = None
        self._hash: Any = None

    def write(self, ids: np.ndarray) -> None:
        while len(ids):
            if self._file is None:
                name = f"{self.split}_{len(self.shards):05d}.bin"
                self._file = open(self.directory / name, "wb")  # noqa: SIM115 - closed in _end
                self._hash = hashlib.sha256()
                self.shards.append({"name": name, "tokens": 0, "sha256": ""})
            room = self.limit - self.shards[-1]["tokens"]
            piece, ids = ids[:room], ids[room:]
            data = piece.astype(self.dtype, copy=False).tobytes()
            self._file.write(data)
            self._hash.update(data)
            self.shards[-1]["tokens"] += len(piece)
            if self.shards[-1]["tokens"] == self.limit:
                self._end()

    def _end(self) -> None:
        assert self._file is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self.shards[-1]["sha256"] = self._hash.hexdigest()
        self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._end()

    def abandon(self) -> None:
        if self._file is not None:
            self._file.close()


def learn_tokenizer(sources: list[Source], options: PrepareOptions) -> Tokenizer:
    """The tokenizer ``options`` asks for: the one given, or one learned on the sources (a char
    vocabulary from every document, plus the separator; a BPE on the training documents only)."""
    kind = options.tokenizer
    if not isinstance(kind, str):
        return kind
    if kind == "byte":
        return build_tokenizer("byte", "", options.vocab_size)
    if kind == "char":
        if options.vocab_size is not None:
            raise ValueError("--vocab-size is for the 'bpe' tokenizer only, not 'char'")
        chars = {DOCUMENT_SEPARATOR}
        for _, docs in _readable(sources, options):
            chars.update(*map(set, docs))
        return CharTokenizer(sorted(chars))
    if kind != "bpe":
        raise ValueError(f"unknown tokenizer {kind!r}; choose char, byte, bpe or a path")
    training = []
    for index, docs in _readable(sources, options):
        to_val = _validation_draws(options.seed, index, len(docs), options.val_fraction)
        training.extend(d for d, v in zip(docs, to_val, strict=True) if not v)
    if not training:
        raise DataError("the corpus has no training documents to learn a BPE on")
    return build_tokenizer("bpe", "\n".join(training), options.vocab_size)


def _readable(sources: list[Source], options: PrepareOptions) -> Iterator[tuple[int, list[str]]]:
    for index, source in enumerate(sources):
        try:
            yield index, read_documents(source, options.text_field).documents
        except BadSource:
            if not options.skip_bad_files:
                raise


def prepare(
    sources: list[Source],
    out_dir: str | os.PathLike[str],
    options: PrepareOptions,
    progress: Callable[[int, int, int], None] | None = None,
) -> dict[str, Any]:
    """Tokenize ``sources`` into ``out_dir`` (absent or empty: anything else is refused) and
    return the manifest written. ``progress(bytes, documents, tokens)`` after each file.
    Raises DataError (a ValueError) or OSError, with nothing left behind."""
    options.validate()
    target = Path(out_dir)
    recover(target)  # what a killed prepare left beside it
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise DataError(f"--out-dir {str(target)!r} exists and is not empty: choose a new one")
    if any(s.path == "-" for s in sources) and (
        options.tokenizer in ("char", "bpe") or options.workers > 1
    ):
        raise DataError("standard input is read once: use it with --tokenizer byte or a PATH and "
                        "--workers 1")  # fmt: skip
    tokenizer = learn_tokenizer(sources, options)
    dtype, eot = shard_dtype(tokenizer.vocab_size), end_of_text_id(tokenizer)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = make_temporary(target)
    writers = {s: _ShardWriter(temporary, s, dtype, options.shard_tokens) for s in SPLITS}
    try:
        manifest = _write(sources, options, tokenizer, writers, progress)
        manifest.update(dtype=dtype.name, vocab_size=tokenizer.vocab_size, end_of_text=eot)
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        with open(temporary / MANIFEST_NAME, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        fsync_path(temporary)
        replace_directory(temporary, target)
    except BaseException:
        for writer in writers.values():
            writer.abandon()
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return manifest


def _write(
    sources: list[Source],
    options: PrepareOptions,
    tokenizer: Tokenizer,
    writers: dict[str, _ShardWriter],
    progress: Callable[[int, int, int], None] | None,
) -> dict[str, Any]:
    spec = tokenizer.to_dict()
    settings = {k: getattr(options, k) for k in ("seed", "val_fraction", "text_field")}
    totals = {key: dict.fromkeys(SPLITS, 0) for key in ("tokens", "documents", "characters")}
    listed, skipped = [], []
    for done in _encoded(sources, spec, settings, options.workers):
        source = sources[done.index]
        if done.problem is not None:
            if not options.skip_bad_files:
                raise BadSource(done.problem)
            skipped.append({"path": display_name(source), "reason": done.problem})
            continue
        for split in SPLITS:
            writers[split].write(done.ids[split])
            totals["tokens"][split] += len(done.ids[split])
            totals["documents"][split] += done.documents[split]
            totals["characters"][split] += done.characters[split]
        listed.append({"path": display_name(source), "bytes": done.size, "sha256": done.sha256,
                       "documents": sum(done.documents.values())})  # fmt: skip
        if progress is not None:
            tokens = sum(len(ids) for ids in done.ids.values())
            progress(done.size, sum(done.documents.values()), tokens)
    for writer in writers.values():
        writer.close()
    if not totals["tokens"]["train"]:
        raise DataError("the corpus is empty: no document to train on" + _skipped(skipped))
    if not totals["tokens"]["val"]:
        raise DataError(
            f"no document went to validation ({totals['documents']['train']} documents, "
            f"--val-fraction {options.val_fraction}): give more documents (files, or JSON "
            "lines) or a larger --val-fraction"
        )
    splits = {s: {key: totals[key][s] for key in totals} | {"shards": writers[s].shards}
              for s in SPLITS}  # fmt: skip
    return {"format": FORMAT, "version": VERSION, "tokenizer": spec, "splits": splits,
            "sources": listed, "skipped_files": skipped, "skipped_count": len(skipped),
            **settings}  # fmt: skip


def _skipped(skipped: list[dict[str, Any]]) -> str:
    return f" ({len(skipped)} files skipped as bad)" if skipped else ""


def _encoded(
    sources: list[Source], spec: dict[str, Any], settings: dict[str, Any], workers: int
) -> Iterator[_Encoded]:
    """Each source tokenized, in order: here with one worker, else in a pool of processes."""
    jobs = list(enumerate(sources))
    if workers == 1:
        _start_worker(spec, settings)
        yield from map(_encode_source, jobs)
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker process
    context = multiprocessing.get_context("spawn")  # no fork of a threaded tokenizer
    with context.Pool(workers, _start_worker, (spec, settings)) as pool:
        yield from pool.imap(_encode_source, jobs, chunksize=1)
