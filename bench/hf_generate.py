"""Generation speed and memory: glassllm's hf.load_model vs transformers, same GPT-2 files.

Both engines load one Hugging Face directory with random weights made here (no download; GPT-2
small's shape by default: 12 layers, 12 heads, width 768, vocabulary 50257, context 1024), and
generate greedily with their key/value caches: glassllm ``generate(top_k=1)``, transformers
``generate(do_sample=False, use_cache=True)``. Each measurement runs in its own process with its
thread count fixed before NumPy or torch is imported; engines alternate, and the order flips every
round, so a change in the machine's load hits both. Reported per engine and thread count: median
tokens per second over the timed runs of every round, resident memory after loading, peak
resident memory, and whether both engines produced the same ids.

    python bench/hf_generate.py                        # GPT-2 small, 1 and 2 threads
    python bench/hf_generate.py --shape tiny --rounds 1 --repeats 1 --new-tokens 8   # smoke test

Needs torch and transformers for the comparison (``--engines glassllm`` runs without them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = {
    "gpt2": dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "tiny": dict(vocab_size=512, block_size=128, n_layer=2, n_head=2, n_embd=64),
}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    """This process's peak resident memory. Linux's VmHWM belongs to the address space, which
    exec starts afresh; ru_maxrss would not do: it survives exec, so a worker would report the
    parent's peak (the parent builds the random model)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_model(shape: str, directory: Path) -> None:
    """Random GPT-2 weights (glassllm's GPT-2 initialisation), written as a HF directory."""
    import numpy as np

    from glassllm.hf import save_pretrained
    from glassllm.models import GPT, GPTConfig

    model = GPT(GPTConfig(**SHAPES[shape], bias=True), rng=np.random.default_rng(0))
    save_pretrained(model, None, directory, overwrite=True)


def worker(args: argparse.Namespace) -> None:
    """One engine, one thread count: load, warm up, time ``repeats`` generations; print JSON."""
    if args.worker == "glassllm":
        import glassllm  # noqa: F401 - before NumPy, as the glassllm command imports it

    import numpy as np

    args.threads = args.threads[0]
    prompt = np.random.default_rng(0).integers(0, 512, size=(1, args.prompt_tokens))
    before = resident_mb()
    start = time.perf_counter()
    if args.worker == "glassllm":
        from glassllm.hf import load_model

        model = load_model(args.model_dir)

        def generate() -> list[int]:
            return model.generate(prompt, args.new_tokens, top_k=1)[0].tolist()
    else:
        import torch
        import transformers

        torch.set_num_threads(args.threads)
        model = transformers.GPT2LMHeadModel.from_pretrained(args.model_dir).eval()
        prompt_ids = torch.from_numpy(prompt)

        def generate() -> list[int]:
            with torch.no_grad():
                out = model.generate(
                    prompt_ids,
                    attention_mask=torch.ones_like(prompt_ids),
                    max_new_tokens=args.new_tokens,
                    min_new_tokens=args.new_tokens,
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=0,
                )
            return out[0].tolist()

    load_s = time.perf_counter() - start
    loaded = resident_mb()
    generate()  # warm-up
    times, ids = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        ids = generate()
        times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "engine": args.worker,
                "threads": args.threads,
                "tok_s": [args.new_tokens / t for t in times],
                "load_s": load_s,
                "rss_before_load_mb": before,
                "rss_after_load_mb": loaded,
                "peak_mb": peak_mb(),
                "ids": ids,
            }
        )
    )


def run_worker(engine: str, threads: int, args: argparse.Namespace, model_dir: Path) -> dict:
    env = {**os.environ, **{name: str(threads) for name in THREAD_VARIABLES}}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [
        sys.executable, __file__, "--worker", engine, "--model-dir", str(model_dir),
        "--threads", str(threads), "--new-tokens", str(args.new_tokens),
        "--prompt-tokens", str(args.prompt_tokens), "--repeats", str(args.repeats),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{engine} worker failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpt2")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--engines", nargs="+", default=["glassllm", "transformers"])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per engine and threads")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="glassllm-hf-bench-") as scratch:
        model_dir = Path(scratch) / args.shape
        make_model(args.shape, model_dir)
        results = []
        for round_index in range(args.rounds):
            for threads in args.threads:
                engines = args.engines if round_index % 2 == 0 else args.engines[::-1]
                for engine in engines:
                    results.append(run_worker(engine, threads, args, model_dir))
                    speed = statistics.median(results[-1]["tok_s"])
                    print(f"round {round_index + 1} {engine:12s} {threads}: {speed:6.1f} tok/s")
    print(
        f"\n{args.shape}: {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, greedy"
    )
    print("engine        threads  median tok/s  RSS after load MB  peak MB  load s")
    for engine in args.engines:
        for threads in args.threads:
            mine = [r for r in results if r["engine"] == engine and r["threads"] == threads]
            speeds = [s for r in mine for s in r["tok_s"]]
            print(
                f"{engine:12s}  {threads:7d}  {statistics.median(speeds):12.1f}  "
                f"{statistics.median(r['rss_after_load_mb'] for r in mine):17.0f}  "
                f"{max(r['peak_mb'] for r in mine):7.0f}  "
                f"{statistics.median(r['load_s'] for r in mine):6.2f}"
            )
    same = len({tuple(r["ids"]) for r in results}) == 1
    print(f"same greedy ids across engines and runs: {same}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
