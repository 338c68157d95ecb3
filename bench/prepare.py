"""``glassllm prepare`` throughput against the usual route, and train-time RSS against corpus size.

    python bench/prepare.py --corpus-mb 100               # MB/s: glassllm-1, glassllm-2, datasets
    python bench/prepare.py --sides rss --tokens 10e6 1e9 4e9

Throughput: a synthetic corpus of 20 JSON-lines files, one BPE (learned on 1 MB of it) for every
side; ``glassllm-N``: `glassllm.data.prepare` with N workers; ``datasets``: nanoGPT's OpenWebText
route, Hugging Face ``datasets`` ``map`` (2 processes) of ``tokenizers`` ``encode_batch``, then the
ids written to one uint16 memmap. ``rss``: a sparse prepared corpus of ``--tokens`` tokens,
100 steps of the micro GPT and an evaluation on it; RSS after, and its peak.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    rng, per_file = np.random.default_rng(0), int(megabytes * 1e6 / 20)
    for i in range(20):
        docs = [" ".join(rng.choice(WORDS, 200)) for _ in range(per_file // 800)]
        (root / f"{i:02d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    from glassllm.data import train_bpe

    text = "\n".join(json.loads(line)["text"] for line in open(root / "00.jsonl"))[: 1 << 20]
    (root / "tokenizer.json").write_text(train_bpe(text, 512).to_json())


def sparse_corpus(root: Path, tokens: int) -> None:
    """A prepared directory of ``tokens`` zero ids (end of text), in 100M-token sparse shards."""
    import hashlib

    from glassllm.data.prepare import FORMAT, VERSION

    shards = {"train": [], "val": []}
    for split, count in (("train", tokens), ("val", 10**6)):
        for start in range(0, count, 10**8):
            n, digest = min(10**8, count - start), hashlib.sha256()
            for done in range(0, n, 1 << 24):
                digest.update(bytes(2 * min(1 << 24, n - done)))
            name = f"{split}_{len(shards[split]):05d}.bin"
            with open(root / name, "wb") as f:
                f.truncate(2 * n)
            shards[split].append({"name": name, "tokens": n, "sha256": digest.hexdigest()})
    splits = {s: {"tokens": sum(x["tokens"] for x in v), "characters": sum(x["tokens"] for x in v),
                  "shards": v} for s, v in shards.items()}  # fmt: skip
    manifest = dict(format=FORMAT, version=VERSION, dtype="uint16", vocab_size=65, end_of_text=0,
                    tokenizer={"type": "char", "chars": "".join(map(chr, range(65)))},
                    splits=splits)  # fmt: skip
    (root / "manifest.json").write_text(json.dumps(manifest))


def worker(args: argparse.Namespace) -> dict[str, Any]:
    corpus, start = Path(args.corpus), time.perf_counter()
    if args.worker == "rss":
        options = dict(max_iters=100, eval_iters=20, eval_interval=100, tokenizer="char")
        trainer = C.glassllm_trainer(corpus / "run", "micro", data=str(corpus), **options)
        trainer.fit(progress=False)
        return {"RSS after (MB)": C.rss_bytes() / 1e6, "peak RSS (MB)": C.peak_rss_bytes() / 1e6,
                "s": time.perf_counter() - start}  # fmt: skip
    files = sorted(str(p) for p in corpus.glob("*.jsonl"))
    out = Path(tempfile.mkdtemp(dir=corpus))
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
    runs = {}
    with tempfile.TemporaryDirectory(prefix="glassllm-prepare-bench-") as scratch:
        if "rss" in args.sides:
            groups = {}
            for tokens in map(int, args.tokens):
                (Path(scratch) / str(tokens)).mkdir()
                sparse_corpus(Path(scratch) / str(tokens), tokens)
                result = C.run_side(args, "rss", 1, "--corpus", f"{scratch}/{tokens}")
                groups[f"{tokens:.0e}"] = {"rss": result}
            runs["rss"] = dict(
                config={"model": "micro", "steps": 100}, group="tokens", groups=groups
            )
        if sides := [s for s in args.sides if s != "rss"]:
            synthetic_corpus(Path(scratch), args.corpus_mb)
            args.sides = sides
            rounds = C.alternate(args, args.threads[0], "--corpus", scratch)
            groups = {"1": C.summarise(rounds, baseline="datasets", ratios=["MB/s"])}
            runs["throughput"] = dict(config={"MB": args.corpus_mb}, group="threads", groups=groups)
    return runs


if __name__ == "__main__":
    sys.exit(C.main(sys.modules[__name__]))
