"""``glassllm prepare`` throughput against the usual route, and train-time RSS against corpus size.

    python bench/prepare.py --corpus-mb 100               # MB/s: glassllm-1, glassllm-2, datasets
    python bench/prepare.py --sides rss --tokens 10e6 1e9 4e9

Throughput on 20 synthetic JSON-lines files, one BPE (learned on 1 MB of them) for every side:
``glassllm-N``, `glassllm.data.prepare` with N workers; ``datasets``, nanoGPT's OpenWebText route
(``datasets`` map over 2 processes of ``tokenizers`` encode_batch, ids into one uint16 memmap).
``rss``: 100 steps of the micro GPT and an evaluation on a sparse prepared corpus of ``--tokens``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import common as C
import numpy as np

SIDES = ("glassllm-1", "glassllm-2", "datasets", "rss")
DEFAULT_SIDES = SIDES[:3]
WORDS = np.array("the of and a to in is was that for on as with by he at from his it an".split())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(rounds=1, threads=[1])
    parser.add_argument("--corpus-mb", type=float, default=100)
    parser.add_argument("--tokens", type=float, nargs="+", default=[10e6, 1e9, 4e9], help="rss")
    parser.add_argument("--corpus", help=argparse.SUPPRESS)


def synthetic_corpus(root: Path, megabytes: float) -> None:
    from glassllm.data import train_bpe

    rng = np.random.default_rng(0)
    for i in range(20):
        docs = [" ".join(rng.choice(WORDS, 200)) for _ in range(int(megabytes * 1e6 / 16000))]
        (root / f"{i:02d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    text = "\n".join(json.loads(line)["text"] for line in open(root / "00.jsonl"))[: 1 << 20]
    (root / "tokenizer.json").write_text(train_bpe(text, 512).to_json())


def sparse_corpus(root: Path, tokens: int) -> str:
    """A prepared directory ``root`` of ``tokens`` zero ids (end of text) in sparse 100M-token
    shards."""
    from glassllm.data.prepare import FORMAT, VERSION

    root.mkdir()
    splits = {}
    for split, count in (("train", tokens), ("val", 10**6)):
        shards = []
        for start in range(0, count, 10**8):
            n, name = min(10**8, count - start), f"{split}_{len(shards):05d}.bin"
            digest = hashlib.sha256(bytes(2 * n)).hexdigest()  # at most 200 MB at a time
            shards.append({"name": name, "tokens": n, "sha256": digest})
            with open(root / name, "wb") as f:
                f.truncate(2 * n)
        splits[split] = {"tokens": count, "characters": count, "shards": shards}
    tokenizer = {"type": "char", "chars": "".join(map(chr, range(65)))}
    manifest = dict(format=FORMAT, version=VERSION, dtype="uint16", vocab_size=65, end_of_text=0)
    (root / "manifest.json").write_text(
        json.dumps(manifest | dict(tokenizer=tokenizer, splits=splits))
    )
    return str(root)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    corpus, start = Path(args.corpus), time.perf_counter()
    if args.worker == "rss":
        C.prepare_worker(args)
        options = dict(max_iters=100, eval_iters=20, eval_interval=100, tokenizer="char")
        C.glassllm_trainer(corpus / "run", "micro", data=str(corpus), **options).fit(progress=False)
        return {"RSS after (MB)": C.rss_bytes() / 1e6, "peak RSS (MB)": C.peak_rss_bytes() / 1e6}
    files, out = sorted(str(p) for p in corpus.glob("*.jsonl")), Path(tempfile.mkdtemp(dir=corpus))
    if args.worker == "datasets":
        import datasets
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(corpus / "tokenizer.json"))

        def encode(batch: dict[str, list]) -> dict[str, list]:
            ids = [e.ids + [0] for e in tokenizer.encode_batch(batch["text"])]
            return {"ids": ids, "len": [len(i) for i in ids]}

        data = datasets.load_dataset("json", data_files=files, split="train", cache_dir=str(out))
        data = data.map(encode, batched=True, num_proc=2, remove_columns=["text"])
        array = np.memmap(out / "train.bin", dtype=np.uint16, mode="w+", shape=(sum(data["len"]),))
        at = 0
        for shard in range(16):  # nanoGPT's write loop
            ids = np.concatenate(data.shard(16, shard, contiguous=True).with_format("numpy")["ids"])
            array[at : at + len(ids)], at = ids, at + len(ids)
        array.flush()
    else:
        from glassllm.data import BPETokenizer
        from glassllm.data.prepare import PrepareOptions, prepare
        from glassllm.data.sources import Source

        tokenizer = BPETokenizer.from_file(corpus / "tokenizer.json")
        options = PrepareOptions(tokenizer=tokenizer, workers=int(args.worker[-1]))
        prepare([Source(f) for f in files], out / "prepared", options)
    megabytes = sum(Path(f).stat().st_size for f in files) / 1e6
    return {"MB/s": megabytes / (time.perf_counter() - start), "MB": megabytes}


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    runs, sides = {}, [s for s in args.sides if s != "rss"]
    with tempfile.TemporaryDirectory(prefix="glassllm-prepare-bench-") as scratch:
        groups = {}
        for tokens in map(int, args.tokens if "rss" in args.sides else []):
            corpus = sparse_corpus(Path(scratch) / str(tokens), tokens)
            groups[f"{tokens:.0e}"] = {"rss": C.run_side(args, "rss", 1, "--corpus", corpus)}
        if groups:
            runs["rss"] = dict(
                config={"model": "micro", "steps": 100}, group="tokens", groups=groups
            )
        if sides:
            synthetic_corpus(Path(scratch), args.corpus_mb)
            args.sides = sides
            rounds = C.alternate(args, args.threads[0], "--corpus", scratch)
            groups = {"1": C.summarise(rounds, baseline="datasets", ratios=["MB/s"])}
            runs["throughput"] = dict(config={"MB": args.corpus_mb}, group="threads", groups=groups)
    return runs


C.run_as_script(__name__)
