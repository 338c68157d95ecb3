"""A tiny trained run for the viewer's tests: checkpoint, log.jsonl and stats.jsonl in out_dir.

Trained by the shipped training loop (`glassllm.app.train.Trainer`, what ``glassllm train`` runs)
with a tiny `TrainConfig`, so the files are the ones a user's run writes, checkpoint metadata
included (`RunState` is its only writer).
"""

from pathlib import Path

from glassllm.app.config import TrainConfig
from glassllm.app.train import Trainer

TEXT = (
    "".join(
        f"def f{i}(x, y):\n    return x * {i} + y  # line {i}\n\n"
        f"class Box{i}:\n    def get(self):\n        return self.value{i % 7}\n\n"
        for i in range(40)
    )
    + "# <img src=x onerror=window.__xss=1> is text, not markup\n"
)


def make_run(out_dir, steps=60, eval_interval=20, stats_interval=2, seed=0, resume=False):
    """Train a 2-layer GPT (32 wide, context 32) for ``steps`` steps into ``out_dir``, or, with
    ``resume``, continue the run there up to ``steps``."""
    out_dir = Path(out_dir)
    data = out_dir.parent / f"{out_dir.name}.txt"
    data.write_text(TEXT)
    config = TrainConfig(
        n_layer=2,
        n_head=2,
        n_embd=32,
        block_size=32,
        data=str(data),
        batch_size=8,
        max_iters=steps,
        lr=1e-2,
        min_lr=1e-3,
        warmup_iters=0,
        eval_interval=eval_interval,
        eval_iters=1,
        seed=seed,
        out_dir=str(out_dir),
        sample_tokens=0,
        stats_interval=stats_interval,
    )
    Trainer(config, resume=resume, overwrite=not resume).fit(progress=False)  # a new run replaces
    return out_dir
