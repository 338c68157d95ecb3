"""Models built from glassllm.nn layers: ``from glassllm.models import GPT, GPTConfig``.

``gpt`` is the model, ``config`` its `GPTConfig` (every family's choices; ``llama_config`` the
Llama recipe); ``generation`` samples from it (``GPT.generate`` calls it).
"""

from glassllm.models import generation
from glassllm.models.config import llama_config
from glassllm.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "generation", "llama_config"]
