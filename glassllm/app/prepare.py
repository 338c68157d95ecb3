"""``glassllm prepare``: tokenize a corpus of many files once into token shards on disk.

The library side is `glassllm.data.prepare` (the files written) and `glassllm.data.sources`
(what is read). Here: the options, the tokenizer named by ``--tokenizer PATH``, the progress bar,
and two refusals:

* under ``mpiexec``: prepare refuses to run. It writes one directory, once; every rank of the
  training run then maps it (``mpiexec -n N glassllm train --data DIR``).
* ``--resume``: refused with the reason. Nothing of a stopped prepare is kept to continue from:
  its temporary directory is removed on any error or Ctrl-C, and a killed one's is removed by the
  next prepare into the same ``--out-dir`` (`glassllm.atomic_directory.recover`). Tokenizing is
  the cheap part of a corpus's life (minutes per GB with ``--workers``): run it again.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from glassllm.data import Tokenizer


def add_parser(commands: Any) -> None:
    """The ``prepare`` subcommand and its options."""
    from glassllm.data.prepare import DEFAULT_SHARD_TOKENS

    parser = commands.add_parser(
        "prepare",
        help="tokenize many files once into token shards for train --data DIR",
        description="Tokenize text files, directories (recursively: .txt, .md, and .jsonl/.json "
        "lines) or standard input (-) into uint16/uint32 token shards and a manifest.json in "
        "OUT_DIR, which `glassllm train --data OUT_DIR` memory-maps (also on every rank of an "
        "mpiexec run).",
    )
    parser.add_argument("--data", nargs="+", required=True, metavar="PATH",
                        help="files, directories or - (standard input)")  # fmt: skip
    parser.add_argument("--out-dir", required=True, metavar="DIR",
                        help="the directory to write (must not exist, or be empty)")  # fmt: skip
    parser.add_argument(
        "--tokenizer",
        default="char",
        metavar="char|byte|bpe|PATH",
        help="learn a 'char' vocabulary or a 'bpe' (on the training documents only), use 'byte', "
        "or take the tokenizer of PATH: a Hugging Face directory or tokenizer.json, a glassllm "
        "checkpoint (.safetensors, or its run directory), a GGUF file (default: char)",
    )
    parser.add_argument("--vocab-size", type=int, metavar="N", help="with --tokenizer bpe")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="share of documents for validation (default: 0.1)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="tokenizing processes (default: 1)")  # fmt: skip
    parser.add_argument("--text-field", default="text",
                        help="the JSON lines' field holding the text (default: text)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1337, help="of the train/val split")
    parser.add_argument("--skip-bad-files", action="store_true",
                        help="skip (counted in the manifest) files not text")  # fmt: skip
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, metavar="N",
                        help=f"tokens per shard (default: {DEFAULT_SHARD_TOKENS:,})")  # fmt: skip
    parser.add_argument("--resume", action="store_true",
                        help="refused, saying why: a stopped prepare keeps nothing")  # fmt: skip
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="the progress bar (default: when stderr is a terminal)")  # fmt: skip


def resolve_tokenizer(spec: str) -> str | Tokenizer:
    """``char``, ``byte`` or ``bpe`` as they are; a path: the tokenizer it holds."""
    if spec in ("char", "byte", "bpe"):
        return spec
    path = Path(spec)
    if not path.exists():
        raise ValueError(f"--tokenizer {spec!r} is neither char, byte, bpe nor an existing path")
    from glassllm.app.config import CHECKPOINT_NAME

    if path.is_dir() and (path / CHECKPOINT_NAME).is_file():
        path = path / CHECKPOINT_NAME
    if path.is_dir():
        from glassllm.hf.load import find_tokenizer

        found = find_tokenizer(path)
        if found is None:
            raise ValueError(f"--tokenizer {spec!r}: the directory holds no tokenizer")
        return found
    if path.suffix == ".gguf":
        from glassllm.gguf import read_header
        from glassllm.gguf.tokenizer import tokenizer_from_metadata

        return tokenizer_from_metadata(read_header(path).metadata, str(path))
    if path.suffix == ".safetensors":
        from glassllm.app.run_state import SavedRun

        return SavedRun.read(path).state.tokenizer
    from glassllm.data import BPETokenizer

    return BPETokenizer.from_file(path)


def run_prepare(args: argparse.Namespace) -> None:
    """``glassllm prepare``; ValueError or OSError for anything that stops it."""
    from glassllm.app.parallel import detect_launch
    from glassllm.data.prepare import PrepareOptions, prepare
    from glassllm.data.sources import find_sources

    launch = detect_launch()
    if launch is not None and launch.size > 1:
        raise ValueError(
            "glassllm prepare runs once, without mpiexec: it writes one directory, which every "
            "rank of `mpiexec -n N glassllm train --data DIR` then reads"
        )
    if args.resume:
        raise ValueError(
            "prepare --resume: a stopped prepare keeps nothing to continue from (its temporary "
            "directory is removed); run the same prepare again"
        )
    options = PrepareOptions(
        tokenizer=resolve_tokenizer(args.tokenizer),
        vocab_size=args.vocab_size,
        val_fraction=args.val_fraction,
        workers=args.workers,
        text_field=args.text_field,
        seed=args.seed,
        skip_bad_files=args.skip_bad_files,
        shard_tokens=args.shard_tokens,
    )
    options.validate()
    sources = find_sources(args.data)
    total = sum(os.path.getsize(s.path) for s in sources if os.path.isfile(s.path))
    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if args.progress is None else args.progress
    counts = {"documents": 0, "tokens": 0}
    with tqdm(total=total, unit="B", unit_scale=True, desc="prepare", disable=not show,
              file=sys.stderr, dynamic_ncols=True) as bar:  # fmt: skip

        def progress(size: int, documents: int, tokens: int) -> None:
            counts["documents"] += documents
            counts["tokens"] += tokens
            bar.set_postfix_str(f"{counts['documents']:,} documents, {counts['tokens']:,} tokens")
            bar.update(size)

        manifest = prepare(sources, args.out_dir, options, progress)
    splits = manifest["splits"]
    skipped = manifest["skipped_count"]
    print(
        f"glassllm: prepared {args.out_dir}: {len(manifest['sources'])} files, "
        f"{splits['train']['tokens']:,} training and {splits['val']['tokens']:,} validation "
        f"tokens ({splits['train']['documents']:,} + {splits['val']['documents']:,} documents) "
        f"in {len(splits['train']['shards']) + len(splits['val']['shards'])} {manifest['dtype']} "
        f"shards, {manifest['tokenizer']['type']} tokenizer of {manifest['vocab_size']:,}"
        + (f"; {skipped} bad files skipped" if skipped else ""),
        flush=True,
    )
