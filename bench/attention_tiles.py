"""Causal attention's query tiles: F.packed_attention forward + backward per tile size.

    OPENBLAS_NUM_THREADS=1 python bench/attention_tiles.py                  # three sizes
    OPENBLAS_NUM_THREADS=2 python bench/attention_tiles.py --sizes mid --tiles 64 128 --repeats 9

For each GPT size of issue 13 (batch 12; tiny 4 heads x 32 at T = 64, small 4 x 64 at T = 128,
mid 6 x 64 at T = 256) it times one ``F.packed_attention(qkv, causal=True)`` forward and backward
with ``glassllm.kernels.attention.CAUSAL_TILE`` set to each candidate, plus ``T`` itself (one
tile: the whole T x T, as before tiling). The candidates alternate call by call and each row is the
minimum over ``--repeats`` rounds, so a busy machine slows every candidate alike. In-process,
NumPy only, allocator tuned as the ``glassllm`` command does.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

SIZES = {  # name: (batch, T, E, heads)
    "tiny": (12, 64, 128, 4),
    "small": (12, 128, 256, 4),
    "mid": (12, 256, 384, 6),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=list(SIZES))
    parser.add_argument("--tiles", nargs="+", type=int, default=[32, 64, 128])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    import glassllm.functional as F
    import glassllm.kernels.attention as attention
    from glassllm import Tensor
    from glassllm.app.allocator import tune_allocator

    tune_allocator()
    rng = np.random.default_rng(0)
    print("size   T    tile  fwd+bwd ms (min)")
    for size in args.sizes:
        batch, steps, embed, heads = SIZES[size]
        qkv = rng.standard_normal((batch, steps, 3 * embed), dtype=np.float32)
        upstream = rng.standard_normal((batch, steps, embed), dtype=np.float32)
        tiles = sorted({t for t in args.tiles if t < steps} | {steps})
        best = dict.fromkeys(tiles, float("inf"))
        for round_ in range(args.repeats + 1):  # round 0 warms up
            for tile in tiles:
                attention.CAUSAL_TILE = tile
                start = time.perf_counter()
                y = F.packed_attention(Tensor(qkv, requires_grad=True), heads, causal=True)
                y.backward(upstream)
                if round_:
                    best[tile] = min(best[tile], time.perf_counter() - start)
        for tile in tiles:
            label = f"{tile}" + (" (one tile)" if tile == steps else "")
            print(f"{size:6s} {steps:<4d} {label:16s} {best[tile] * 1e3:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
