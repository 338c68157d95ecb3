"""Forward + backward time of each functional op at the sizes the nanoGPT CPU model uses, glassllm
vs PyTorch, each side in its own process, alternating.

    python bench/ops.py                      # 3 rounds, 1 thread (an op is too small to split)
    python bench/ops.py --threads 2 --rounds 5 --only attention,layer_norm

Sizes: B=12, T=64, E=128, n_head=4 (head size 32), vocab 65. Each op's inputs require grad; one
call = forward, then backward from a fixed random upstream gradient, then the input gradients are
dropped. Reported: median microseconds per call (forward+backward, and forward alone), and the
ratio glassllm/torch (median of per-round ratios). The "block" rows time one whole transformer
block (attention + MLP with their LayerNorms and residuals) and the "step-shaped matmul" row
times np.matmul / torch.matmul alone, as the floor under "linear".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _harness as H

SCRIPT = Path(__file__).resolve()
B, T, E, NH, V = 12, 64, 128, 4, 65
HS = E // NH


def op_cases() -> dict[str, dict[str, Any]]:
    """name -> input shapes and a description. Inputs are float32 normal(0, 1) unless noted."""
    return {
        "softmax (B,nh,T,T)": {"x": (B, NH, T, T)},
        "log_softmax (B*T,V)": {"x": (B * T, V)},
        "cross_entropy (B,T,V)": {"x": (B, T, V)},
        "layer_norm (B,T,E)": {"x": (B, T, E), "w": (E,)},
        "gelu tanh (B,T,4E)": {"x": (B, T, 4 * E)},
        "attention causal (B,nh,T,hs)": {
            "q": (B, NH, T, HS),
            "k": (B, NH, T, HS),
            "v": (B, NH, T, HS),
        },
        "embedding wte (B,T)->E": {"w": (V, E)},
        "linear E->3E": {"x": (B, T, E), "w": (E, 3 * E)},
        "linear E->4E": {"x": (B, T, E), "w": (E, 4 * E)},
        "linear 4E->E": {"x": (B, T, 4 * E), "w": (4 * E, E)},
        "linear head E->V (tied)": {"x": (B, T, E), "w": (V, E)},
        "add residual (B,T,E)": {"x": (B, T, E), "w": (B, T, E)},
        "block (B,T,E)": {"x": (B, T, E)},
    }


def glassllm_case(name: str, arrays: dict[str, Any], ids: Any) -> tuple[Callable, list]:
    """(function returning the output Tensor, list of leaf Tensors) for one case."""
    import numpy as np

    import glassllm.functional as F
    from glassllm import Tensor

    leaves = {k: Tensor(a, requires_grad=True) for k, a in arrays.items()}
    x, w = leaves.get("x"), leaves.get("w")
    if name.startswith("softmax"):
        fn = lambda: F.softmax(x, axis=-1)
    elif name.startswith("log_softmax"):
        fn = lambda: F.log_softmax(x, axis=-1)
    elif name.startswith("cross_entropy"):
        fn = lambda: F.cross_entropy(x, ids)
    elif name.startswith("layer_norm"):
        fn = lambda: F.layer_norm(x, w)
    elif name.startswith("gelu"):
        fn = lambda: F.gelu(x, approximate="tanh")
    elif name.startswith("attention"):
        q, k, v = leaves["q"], leaves["k"], leaves["v"]
        fn = lambda: F.scaled_dot_product_attention(q, k, v, causal=True)
    elif name.startswith("embedding"):
        fn = lambda: F.embedding(ids, w)
    elif name.startswith("linear head"):
        fn = lambda: F.linear(x, w.transpose(1, 0))
    elif name.startswith("linear"):
        fn = lambda: F.linear(x, w)
    elif name.startswith("add"):
        fn = lambda: x + w
    elif name.startswith("block"):
        from glassllm.models.gpt import Block, GPTConfig

        block = Block(GPTConfig(V, T, 1, NH, E), np.random.default_rng(0), np.float32)
        leaves = {"x": x, **{n: p for n, p in block.named_parameters()}}
        fn = lambda: block(x)
    else:
        raise KeyError(name)
    return fn, list(leaves.values())


def torch_case(name: str, arrays: dict[str, Any], ids: Any) -> tuple[Callable, list]:
    import torch
    from torch.nn import functional as F

    leaves = {k: torch.from_numpy(a).requires_grad_(True) for k, a in arrays.items()}
    x, w = leaves.get("x"), leaves.get("w")
    ids_t = torch.from_numpy(ids)
    if name.startswith("softmax"):
        fn = lambda: F.softmax(x, dim=-1)
    elif name.startswith("log_softmax"):
        fn = lambda: F.log_softmax(x, dim=-1)
    elif name.startswith("cross_entropy"):
        fn = lambda: F.cross_entropy(x.view(-1, V), ids_t.view(-1))
    elif name.startswith("layer_norm"):
        fn = lambda: F.layer_norm(x, (E,), w, None, 1e-5)
    elif name.startswith("gelu"):
        fn = lambda: F.gelu(x, approximate="tanh")
    elif name.startswith("attention"):
        q, k, v = leaves["q"], leaves["k"], leaves["v"]
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif name.startswith("embedding"):
        fn = lambda: F.embedding(ids_t, w)
    elif name.startswith("linear head"):
        fn = lambda: F.linear(x, w)  # nanoGPT's lm_head: weight (V, E), as wte
    elif name.startswith("linear"):
        wt = torch.from_numpy(arrays["w"].T.copy()).requires_grad_(True)  # PyTorch layout (out, in)
        leaves["w"] = wt
        fn = lambda: F.linear(x, wt)
    elif name.startswith("add"):
        fn = lambda: x + w
    elif name.startswith("block"):
        from torch_gpt import Block, TorchGPTConfig

        torch.manual_seed(0)
        block = Block(TorchGPTConfig(V, T, 1, NH, E))
        leaves = {"x": x, **dict(block.named_parameters())}
        fn = lambda: block(x)
    else:
        raise KeyError(name)
    return fn, list(leaves.values())


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    torch_side = args.worker == "torch"
    if torch_side:
        import torch

        H.set_torch_threads(args.threads)
    else:
        import _steps

        _steps.tune_allocator()
    rng = np.random.default_rng(0)
    results = {}
    for name, shapes in op_cases().items():
        if args.only and not any(s in name for s in args.only.split(",")):
            continue
        arrays = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
        ids = rng.integers(0, V, size=(B, T), dtype=np.int64)
        if name.startswith("embedding"):
            arrays.pop("x", None)
        fn, leaves = (torch_case if torch_side else glassllm_case)(name, arrays, ids)
        out_shape = tuple(fn().shape)
        upstream = rng.standard_normal(out_shape, dtype=np.float32)
        call = forward_backward(fn, leaves, torch.from_numpy(upstream) if torch_side else upstream)
        forward_only = fn
        repeats = max(20, int(args.budget / max(_one_call(call), 1e-6)))
        both = H.median(H.time_calls(call, repeats=repeats, warmup=3))
        fwd = H.median(H.time_calls(forward_only, repeats=repeats, warmup=3))
        results[name] = {"fwd_bwd_us": both * 1e6, "fwd_us": fwd * 1e6}

    # The matrix product alone, at the MLP's up-projection shape: the floor under "linear E->4E".
    a = rng.standard_normal((B * T, E), dtype=np.float32)
    b = rng.standard_normal((E, 4 * E), dtype=np.float32)
    if torch_side:
        at, bt = torch.from_numpy(a), torch.from_numpy(b)
        mm = lambda: torch.matmul(at, bt)
    else:
        mm = lambda: np.matmul(a, b)
    results["matmul (B*T,E)@(E,4E) only"] = {
        "fwd_us": H.median(H.time_calls(mm, repeats=500, warmup=10)) * 1e6
    }
    H.emit({"ops": results})


def forward_backward(fn: Callable, leaves: list, upstream: Any) -> Callable[[], None]:
    """One timed call: forward, backward from ``upstream``, drop the leaves' gradients."""

    def call() -> None:
        fn().backward(upstream)
        for leaf in leaves:
            leaf.grad = None

    return call


def _one_call(call: Callable[[], None]) -> float:
    import time

    call()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--budget", type=float, default=0.3, help="seconds of timing per op and side"
    )
    parser.add_argument("--only", default="", help="comma list of substrings of op names")
    parser.add_argument(
        "--write-results", action="store_true", help="also refresh bench/RESULTS.md"
    )
    parser.add_argument("--worker", choices=["glassllm", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    common = ["--threads", str(args.threads), "--budget", str(args.budget)]
    if args.only:
        common += ["--only", args.only]
    runners = {
        side: (lambda side=side: H.run_worker(SCRIPT, ["--worker", side, *common], args.threads))
        for side in ("glassllm", "torch")
    }
    results = H.alternate(runners, args.rounds, log=lambda s: print(s.split(":")[0], flush=True))
    table = {}
    for name in results["glassllm"][0]["ops"]:
        entry = {}
        for key in ("fwd_bwd_us", "fwd_us"):
            g = [r["ops"][name].get(key) for r in results["glassllm"]]
            t = [r["ops"][name].get(key) for r in results["torch"]]
            if None in g:
                continue
            entry[key] = {
                "glassllm": H.median(g),
                "torch": H.median(t),
                "ratio": H.paired_ratio(g, t),
            }
        table[name] = entry
    H.print_table(
        [
            "op",
            "glassllm fwd+bwd us",
            "torch fwd+bwd us",
            "ratio",
            "glassllm fwd us",
            "torch fwd us",
            "fwd ratio",
        ],
        [
            [
                name,
                *(e.get("fwd_bwd_us", {}).get(k, "-") for k in ("glassllm", "torch", "ratio")),
                *(e["fwd_us"][k] for k in ("glassllm", "torch", "ratio")),
            ]
            for name, e in table.items()
        ],
    )
    path = H.write_json(
        "ops",
        {
            "sizes": {"B": B, "T": T, "E": E, "n_head": NH, "vocab": V},
            "threads": args.threads,
            "rounds": args.rounds,
            "ops": table,
        },
    )
    print(f"wrote {path}")
    if args.write_results:
        import report

        report.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
