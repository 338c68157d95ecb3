"""``glassllm view``: a local web page onto a run: sampling, the model's insides, its training
and the autograd graph. `serve` is what the command calls; `make_server` builds one for tests."""

from .server import make_server, serve

__all__ = ["make_server", "serve"]
