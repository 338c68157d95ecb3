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
from typing import Any

import common as C
import numpy as np

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(threads=[1])
    parser.add_argument("--budget", type=float, default=0.3, help="seconds of timing per op")
    parser.add_argument("--only", default="", help="comma list of substrings of op names")


def timed(fn: Callable[[], Any], budget: float) -> float:
    """Median microseconds of a call of fn over about ``budget`` seconds (at least 20 calls)."""
    one = C.time_calls(fn, repeats=1, warmup=1)[0]
    return C.median(C.time_calls(fn, repeats=max(20, int(budget / one)), warmup=3)) * 1e6


def worker(args: argparse.Namespace) -> dict[str, Any]:
    torch_side = args.worker == "torch"
    if torch_side:
        import torch

        C.set_torch_threads(args.threads)
    else:
        from glassllm.allocator import tune_allocator

        tune_allocator()
    rng = np.random.default_rng(0)
    results = {}
    for name, shapes in op_cases().items():
        if args.only and not any(s in name for s in args.only.split(",")):
            continue
        arrays = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
        ids = rng.integers(0, V, size=(B, T), dtype=np.int64)
        fn, leaves = (torch_case if torch_side else glassllm_case)(name, arrays, ids)
        upstream = rng.standard_normal(tuple(fn().shape), dtype=np.float32)
        upstream = torch.from_numpy(upstream) if torch_side else upstream

        def call(fn=fn, leaves=leaves, upstream=upstream) -> None:
            fn().backward(upstream)
            for leaf in leaves:
                leaf.grad = None

        results[name] = {"fwd_bwd_us": timed(call, args.budget), "fwd_us": timed(fn, args.budget)}
    # The matrix product alone, at the MLP's up-projection shape: the floor under "linear E->4E".
    a = rng.standard_normal((B * T, E), dtype=np.float32)
    b = rng.standard_normal((E, 4 * E), dtype=np.float32)
    if torch_side:
        a, b = torch.from_numpy(a), torch.from_numpy(b)
    results["matmul (B*T,E)@(E,4E) only"] = {"fwd_us": timed(lambda: a @ b, args.budget)}
    return {"ops": results}


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    results = C.alternate(args, args.threads[0])
    table = {}
    for name in results[args.sides[0]][0]["ops"]:
        table[name] = {}
        for key in ("fwd_bwd_us", "fwd_us"):
            values = {s: [r["ops"][name].get(key) for r in runs] for s, runs in results.items()}
            if None in values[args.sides[0]]:
                continue
            table[name][key] = {s: C.median(v) for s, v in values.items()}
            if len(values) == 2:
                table[name][key]["ratio"] = C.paired_ratio(values["glassllm"], values["torch"])
    payload = {
        "sizes": {"B": B, "T": T, "E": E, "n_head": NH, "vocab": V},
        "threads": args.threads[0],
        "rounds": args.rounds,
        "ops": table,
    }
    print(C.table(*report_rows(payload)))
    return {"tiny": payload}


def report_rows(run: dict[str, Any]) -> tuple[list, list]:
    headers = ["op", "glassllm fwd+bwd µs", "torch fwd+bwd µs", "ratio"]
    headers += ["glassllm fwd µs", "torch fwd µs", "fwd ratio"]
    rows = []
    for name, e in run["ops"].items():
        row = [name]
        for key in ("fwd_bwd_us", "fwd_us"):
            row += [e.get(key, {}).get(k, "-") for k in ("glassllm", "torch", "ratio")]
        rows.append(row)
    return headers, rows


def main(argv: list[str] | None = None) -> int:
    return C.main(
        argv,
        __doc__,
        __file__,
        ("glassllm", "torch"),
        ("glassllm", "torch"),
        worker,
        parent,
        add_arguments,
    )


if __name__ == "__main__":
    sys.exit(main())
