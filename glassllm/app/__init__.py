"""The program built on the library: the ``glassllm`` command, the training loop and its run state.

The library (``glassllm.tensor``, ``nn``, ``optim``, ``models``, ``data``, ``checkpoint``, ...)
never imports this package.
"""

from glassllm.app.cli import main

__all__ = ["main"]
