"""The program built on the library: the ``glassllm`` command and the parts it is made of.

* `glassllm.app.cli`: the command (`main`, also ``python -m glassllm``);
* `glassllm.app.config`: `TrainConfig` and `SampleConfig`, every option of the two commands;
* `glassllm.app.options`: how a configuration field becomes an option and how it is checked;
* `glassllm.app.run_state`: `RunState`, a run's checkpoint metadata (its one writer and reader),
  `SavedRun` (a checkpoint read once) and the rules for resuming;
* `glassllm.app.run_log`: `EvalRecord`, a line of a run's log, and what a resume keeps of it;
* `glassllm.app.train`: `Trainer`, the training loop; `glassllm.app.stopping`: how a run stops
  early (Ctrl-C, divergence); `glassllm.app.sample`: sampling (from a checkpoint or a Hugging Face
  GPT-2 directory); `glassllm.app.export`: ``glassllm export``;
* `glassllm.app.plot`, `glassllm.app.allocator`: the loss plot, glibc's allocator tuning.

The library (``glassllm.tensor``, ``nn``, ``optim``, ``models``, ``data``, ``checkpoint``, ...)
never imports this package, and ``import glassllm`` does not load it.
"""

from glassllm.app.cli import main

__all__ = ["main"]
