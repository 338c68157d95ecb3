"""A prepared corpus read back (``glassllm train --data DIR``): memory-mapped token shards.

Everything in the directory is untrusted until checked. At open (cost: the manifest and one
``stat`` per shard): the manifest is bounded, well-formed JSON of the known format and version,
its tokenizer rebuilds, the dtype fits the vocabulary, every shard name is a plain file name of
this directory, and every shard is a regular file of exactly ``tokens * itemsize`` bytes. Lazily,
the first time a batch reads from a shard (cost: one sequential read of it, about 1 s a GB): its
sha256 is the manifest's and every id is below the vocabulary size; a shard that fails is one
DataError naming it. Checking all of an 8 GB corpus at start would cost every run (and every
rank) a pass over it before the first step; the lazy check costs only the shards a run reads, once.

The shards are read-only memory maps, opened for each batch and closed after it (`TokenShards._map`
says why): a batch copies its windows out, so the process's memory does not grow with the corpus
or with the steps (the page cache, outside it, holds what the kernel chooses).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np

from glassllm._files import FileProblem, read_regular
from glassllm.data.corpus import CORPUS_NAMES, DataError
from glassllm.data.prepare import FORMAT, MANIFEST_NAME, SPLITS, VERSION, shard_dtype
from glassllm.data.tokenizers import Tokenizer, tokenizer_from_dict

MAX_MANIFEST_BYTES = 64 << 20
_SHARD_NAME = re.compile(r"(train|val)_\d{5,}\.bin")
_CHECK_CHUNK = 1 << 22  # tokens per read while verifying a shard (8 MB of uint16)


def is_prepared(path: str) -> bool:
    """Whether ``--data path`` names a prepared directory (a directory holding a manifest); a
    corpus name (``builtin``) wins over a directory of that name, as over a file."""
    if path in CORPUS_NAMES:
        return False
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, MANIFEST_NAME))


class TokenShards:
    """One split's token stream over its shards: ``len``, ``stream[i]``, and `windows`, which
    `glassllm.data.batches.get_batch` reads as it would slice one array."""

    def __init__(
        self, directory: Path, shards: list[dict[str, Any]], dtype: np.dtype, vocab_size: int
    ) -> None:
        self.directory, self.dtype, self.vocab_size = directory, dtype, vocab_size
        self.names = [s["name"] for s in shards]
        self.digests = [s["sha256"] for s in shards]
        counts = [s["tokens"] for s in shards]
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._verified = [False] * len(shards)
        for name, count in zip(self.names, counts, strict=True):
            self._check_size(name, count)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: int) -> int:
        return int(self.windows(np.array([index]), 1)[0, 0])

    def windows(self, starts: np.ndarray, width: int) -> np.ndarray:
        """``(len(starts), width)`` int64: row r holds the tokens ``starts[r]`` to
        ``starts[r] + width - 1`` of the stream, across shard boundaries."""
        out = np.empty((len(starts), width), dtype=np.int64)
        maps: dict[int, np.ndarray] = {}  # this call's maps, unmapped when it returns
        for row, start in enumerate(np.asarray(starts, dtype=np.int64)):
            if start < 0 or start + width > len(self):
                raise IndexError(f"window {start}..{start + width} outside {len(self)} tokens")
            filled, shard = 0, int(np.searchsorted(self.starts, start, side="right")) - 1
            while filled < width:
                if shard not in maps:
                    maps[shard] = self._map(shard)
                offset = int(start + filled - self.starts[shard])
                piece = maps[shard][offset : offset + width - filled]
                out[row, filled : filled + len(piece)] = piece
                filled, shard = filled + len(piece), shard + 1
        return out

    def to_array(self) -> np.ndarray:
        """The whole stream in memory, int64 (for tests and small corpora)."""
        return self.windows(np.array([0]), len(self))[0] if len(self) else np.empty(0, np.int64)

    def _check_size(self, name: str, count: int) -> None:
        path = self.directory / name
        try:
            info = os.stat(path)
        except OSError as err:
            raise DataError(f"shard {str(path)!r} cannot be read ({err.strerror})") from None
        expected = count * self.dtype.itemsize
        if not stat.S_ISREG(info.st_mode) or info.st_size != expected:
            raise DataError(
                f"shard {str(path)!r} is {info.st_size:,} bytes, not the {expected:,} of "
                f"{count:,} {self.dtype.name} tokens the manifest lists: prepare the corpus again"
            )

    def _map(self, shard: int) -> np.ndarray:
        """A read-only map of one shard (verified on first use). Not kept: pages a map touched
        stay in its process's RSS (the kernel maps pages around each one read) until it is
        unmapped, so a map held for a run grows towards the corpus size; nanoGPT, too, maps
        ``train.bin`` afresh for every batch. Opening one cost 0.2 ms on a loaded 2-core box: a
        batch maps each shard it reads once (about 1 ms for 12 windows in 12 shards)."""
        path = self.directory / self.names[shard]
        if not self._verified[shard]:
            self._verify(path, self.digests[shard])
            self._verified[shard] = True
        return np.memmap(path, dtype=self.dtype, mode="r")

    def _verify(self, path: Path, digest: str) -> None:
        """The lazy check of one shard: its digest and its ids, in one bounded sequential read."""
        hasher, largest = hashlib.sha256(), -1
        buffer = memoryview(bytearray(_CHECK_CHUNK * self.dtype.itemsize))  # one, reused
        with open(path, "rb") as handle:
            while size := handle.readinto(buffer):
                hasher.update(buffer[:size])
                ids = np.frombuffer(buffer[:size], dtype=self.dtype)
                largest = max(largest, int(ids.max()) if len(ids) else -1)
        if hasher.hexdigest() != digest:
            raise DataError(
                f"shard {str(path)!r} has sha256 {hasher.hexdigest()[:16]}..., not the "
                f"manifest's {digest[:16]}...: the corpus changed or is damaged; prepare it again"
            )
        if largest >= self.vocab_size:
            raise DataError(
                f"shard {str(path)!r} holds token id {largest}, outside the vocabulary of "
                f"{self.vocab_size}: prepare the corpus again"
            )


class PreparedCorpus:
    """A prepared directory: its manifest (checked), tokenizer, digest and the two splits."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        path = self.directory / MANIFEST_NAME
        label = f"manifest {str(path)!r}"
        try:
            raw = read_regular(path, MAX_MANIFEST_BYTES, label)
        except FileProblem as err:
            raise DataError(f"{err}: is {str(directory)!r} a glassllm prepare output?") from None
        self.sha256 = hashlib.sha256(raw).hexdigest()
        try:
            self.manifest = _checked_manifest(json.loads(raw))
            self.tokenizer: Tokenizer = tokenizer_from_dict(self.manifest["tokenizer"])
        except (ValueError, KeyError, TypeError) as err:
            raise DataError(f"{label} is not a valid manifest: {err}") from None
        vocab = self.tokenizer.vocab_size
        dtype = np.dtype(self.manifest["dtype"])
        if vocab != self.manifest["vocab_size"] or shard_dtype(vocab) != dtype:
            raise DataError(f"{label}: dtype {dtype.name} and vocabulary {vocab} do not agree")
        shards = {split: self.manifest["splits"][split]["shards"] for split in SPLITS}
        self.splits = {s: TokenShards(self.directory, shards[s], dtype, vocab) for s in SPLITS}
        self.characters = {s: self.manifest["splits"][s]["characters"] for s in SPLITS}


def _checked_manifest(manifest: Any) -> dict[str, Any]:
    """``manifest`` when it has the shape `glassllm.data.prepare` writes; else ValueError."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"its format is not {FORMAT!r}")
    if manifest.get("version") != VERSION:
        raise ValueError(f"version {manifest.get('version')!r}, this glassllm reads {VERSION}")
    if manifest.get("dtype") not in ("uint16", "uint32") or not _count(manifest.get("vocab_size")):
        raise ValueError("dtype must be uint16 or uint32 and vocab_size a positive integer")
    for split in SPLITS:
        info = manifest["splits"][split]
        shards = info["shards"]
        if not isinstance(shards, list) or not _count(info.get("characters")):
            raise ValueError(f"split {split!r} needs a list of shards and a character count")
        for shard in shards:
            if not (
                isinstance(shard, dict)
                and isinstance(shard.get("name"), str)
                and _SHARD_NAME.fullmatch(shard["name"])
                and _count(shard.get("tokens"))
                and isinstance(shard.get("sha256"), str)
            ):
                raise ValueError(f"a shard of split {split!r} is malformed: {str(shard)[:200]}")
        if sum(s["tokens"] for s in shards) != info.get("tokens"):
            raise ValueError(f"split {split!r}: its shards do not add up to its token count")
    return manifest


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
