"""Models built from glassllm.nn layers: `from glassllm.models import GPT, GPTConfig`."""

from glassllm.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
