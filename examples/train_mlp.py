"""A small experiment of your own with glassllm's layers: an MLP learns three interleaved spirals.

No GPT and no command line here: glassllm.nn layers, a loss from glassllm.functional and an
optimizer from glassllm.optim, in a dozen lines of training loop. Runs in a few seconds.

    python examples/train_mlp.py [--steps 400] [--hidden 64] [--seed 0]

It prints the loss as it falls, the final accuracy, and a map of the plane coloured by the
predicted class (the decision regions the network learned), with the training points on top.
"""

from __future__ import annotations

import argparse

import numpy as np

import glassllm.functional as F
import glassllm.nn as nn
import glassllm.optim as optim
from glassllm import no_grad


def make_spirals(
    n_per_class: int, n_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Points on ``n_classes`` noisy spiral arms (the CS231n toy problem): not linearly
    separable, so a hidden layer has to bend the plane. Returns X (N, 2) float32, y (N,) int64."""
    radius = np.linspace(0.0, 1.0, n_per_class, dtype=np.float32)  # (n,)
    xs, ys = [], []
    for c in range(n_classes):
        angle = np.linspace(4.0 * c, 4.0 * (c + 1), n_per_class, dtype=np.float32)
        angle += 0.2 * rng.standard_normal(n_per_class, dtype=np.float32)  # (n,)
        xs.append(np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1))  # (n, 2)
        ys.append(np.full(n_per_class, c, dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def ascii_map(model: nn.Module, X: np.ndarray, y: np.ndarray, size: int = 24) -> str:
    """The plane [-1, 1]^2 as characters: a, b, c for each cell's predicted class, A, B, C where a
    training point of that class lies."""
    grid = np.linspace(-1.0, 1.0, size, dtype=np.float32)
    cells = np.stack(np.meshgrid(grid, grid[::-1]), axis=-1).reshape(
        -1, 2
    )  # (size^2, 2), top first
    with no_grad():
        predicted = model(cells).data.argmax(axis=-1).reshape(size, size)
    rows = [[chr(ord("a") + int(c)) for c in row] for row in predicted]
    cols = np.clip(((X[:, 0] + 1.0) / 2.0 * (size - 1)).round().astype(int), 0, size - 1)
    lines = np.clip(((1.0 - X[:, 1]) / 2.0 * (size - 1)).round().astype(int), 0, size - 1)
    for line, col, label in zip(lines, cols, y, strict=True):
        rows[line][col] = chr(ord("A") + int(label))
    return "\n".join(" ".join(row) for row in rows)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)  # all randomness of the experiment comes from here
    X, y = make_spirals(n_per_class=100, n_classes=3, rng=rng)  # (300, 2), (300,)

    model = nn.Sequential(
        nn.Linear(2, args.hidden, rng=rng),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden, rng=rng),
        nn.ReLU(),
        nn.Linear(args.hidden, 3, rng=rng),
    )
    optimizer = optim.Adam(model.named_parameters(), lr=args.lr)
    print(f"MLP with {model.num_parameters()} parameters on {len(X)} points")

    for step in range(args.steps + 1):
        logits = model(X)  # (300, 3); the whole data set is one batch
        loss = F.cross_entropy(logits, y)
        if step % 100 == 0:
            accuracy = float((logits.data.argmax(axis=-1) == y).mean())
            print(f"step {step:4d}: loss {float(loss.data):.4f}, accuracy {accuracy:.1%}")
        if step == args.steps:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(ascii_map(model, X, y))
    return accuracy


if __name__ == "__main__":
    main()
