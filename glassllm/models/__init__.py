"""Models built from glassllm.nn layers: ``from glassllm.models import GPT, GPTConfig``.

``gpt`` is the model; ``generation`` samples from it (``GPT.generate`` calls it).
"""

from glassllm.models import generation
from glassllm.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "generation"]
