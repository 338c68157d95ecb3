"""Forward + backward time of each functional op at the nanoGPT CPU model's sizes, glassllm vs
PyTorch, each side in its own process, alternating.

    python bench/ops.py                      # 3 rounds, 1 thread (an op is too small to split)
    python bench/ops.py --threads 2 --rounds 5 --only attention,layer_norm

One call: forward, backward from a fixed random upstream gradient, input gradients dropped. The
"block" row is a whole transformer block; the "matmul only" row is the floor under "linear".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import common as C
import numpy as np

SIDES = DEFAULT_SIDES = ("glassllm", "torch")

B, T, E, NH, V = 12, 64, 128, 4, 65
HS = E // NH


# name -> input shapes (float32 normal(0, 1), requiring grad); every op also gets token ids (B, T).
CASES: dict[str, dict[str, tuple[int, ...]]] = {
    "softmax (B,nh,T,T)": {"x": (B, NH, T, T)},
    "log_softmax (B*T,V)": {"x": (B * T, V)},
    "cross_entropy (B,T,V)": {"x": (B, T, V)},
    "layer_norm (B,T,E)": {"x": (B, T, E), "w": (E,)},
    "gelu tanh (B,T,4E)": {"x": (B, T, 4 * E)},
    "attention causal (B,nh,T,hs)": {"q": (B, NH, T, HS), "k": (B, NH, T, HS), "v": (B, NH, T, HS)},
    "embedding wte (B,T)->E": {"w": (V, E)},
    "linear E->3E": {"x": (B, T, E), "w": (E, 3 * E)},
    "linear E->4E": {"x": (B, T, E), "w": (E, 4 * E)},
    "linear 4E->E": {"x": (B, T, 4 * E), "w": (4 * E, E)},
    "linear head E->V (tied)": {"x": (B, T, E), "w": (V, E)},
    "add residual (B,T,E)": {"x": (B, T, E), "w": (B, T, E)},
    "block (B,T,E)": {"x": (B, T, E)},
}


def case(name: str, arrays: dict[str, Any], ids: Any, torch_side: bool) -> tuple[Callable, list]:
    """(function returning the output, leaf tensors) of one case on one side."""
    from glassllm.models import GPTConfig

    config, block = GPTConfig(V, T, 1, NH, E), None  # the block's, one layer
    if torch_side:
        import torch
        import torch.nn.functional as F
        from torch_gpt import Block

        t = {k: torch.from_numpy(a).requires_grad_(True) for k, a in arrays.items()}
        if name.startswith("linear") and "head" not in name:  # PyTorch's layout: (out, in)
            t["w"] = torch.from_numpy(arrays["w"].T.copy()).requires_grad_(True)
        torch.manual_seed(0)
        block = Block(config) if name.startswith("block") else None
        ids, axis = torch.from_numpy(ids), {"dim": -1}
        ops = {  # nanoGPT's lm_head: weight (V, E), as the wte
            "cross_entropy": lambda: F.cross_entropy(t["x"].view(-1, V), ids.view(-1)),
            "layer_norm": lambda: F.layer_norm(t["x"], (E,), t["w"], None, 1e-5),
            "attention": lambda: F.scaled_dot_product_attention(*t.values(), is_causal=True),
            "linear": lambda: F.linear(t["x"], t["w"]),
        }
    else:
        import glassllm.functional as F
        from glassllm import Tensor
        from glassllm.models.gpt import Block

        t = {k: Tensor(a, requires_grad=True) for k, a in arrays.items()}
        if name.startswith("block"):
            block = Block(config, np.random.default_rng(0), np.float32)
        axis = {"axis": -1}
        ops = {
            "cross_entropy": lambda: F.cross_entropy(t["x"], ids),
            "layer_norm": lambda: F.layer_norm(t["x"], t["w"]),
            "attention": lambda: F.scaled_dot_product_attention(*t.values(), causal=True),
            "linear head": lambda: F.linear(t["x"], t["w"].transpose(1, 0)),
            "linear": lambda: F.linear(t["x"], t["w"]),
        }
    ops |= {
        "softmax": lambda: F.softmax(t["x"], **axis),
        "log_softmax": lambda: F.log_softmax(t["x"], **axis),
        "gelu": lambda: F.gelu(t["x"], approximate="tanh"),
        "embedding": lambda: F.embedding(ids, t["w"]),
        "add": lambda: t["x"] + t["w"],
        "block": lambda: block(t["x"]),
    }
    op = next(ops[k] for k in sorted(ops, key=len, reverse=True) if name.startswith(k))
    leaves = list(t.values()) + (list(block.parameters()) if block is not None else [])
    return op, leaves


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
    C.prepare_worker(args)
    if torch_side:
        import torch
    rng, side_array = np.random.default_rng(0), torch.from_numpy if torch_side else np.asarray
    results = {}
    for name, shapes in CASES.items():
        if args.only and not any(s in name for s in args.only.split(",")):
            continue
        arrays = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
        ids = rng.integers(0, V, size=(B, T), dtype=np.int64)
        fn, leaves = case(name, arrays, ids, torch_side)
        upstream = side_array(rng.standard_normal(tuple(fn().shape), dtype=np.float32))

        def call(fn=fn, leaves=leaves, upstream=upstream) -> None:
            fn().backward(upstream)
            for leaf in leaves:
                leaf.grad = None

        results[name] = {"fwd+bwd µs": timed(call, args.budget), "fwd µs": timed(fn, args.budget)}
    # The matrix product alone, at the MLP's up-projection shape: the floor under "linear E->4E".
    a, b = (side_array(rng.standard_normal(s, dtype=np.float32)) for s in [(B * T, E), (E, 4 * E)])
    results["matmul (B*T,E)@(E,4E) only"] = {"fwd µs": timed(lambda: a @ b, args.budget)}
    return results


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    groups = C.summarise_groups(C.alternate(args, args.threads[0]), ratios=["fwd+bwd µs", "fwd µs"])
    config = dict(B=B, T=T, E=E, n_head=NH, vocab=V, threads=args.threads[0], rounds=args.rounds)
    return {"tiny": dict(config=config, group="op", groups=groups)}


C.run_as_script(__name__)
