"""glassllm: a glass-box neural-network framework on a NumPy reverse-mode autograd engine.

>>> from glassllm import Tensor, no_grad
"""

from glassllm.autograd import is_grad_enabled, no_grad
from glassllm.checkpoint import load, save
from glassllm.gradcheck import gradcheck
from glassllm.rng import get_rng, manual_seed
from glassllm.tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "Tensor",
    "no_grad",
    "is_grad_enabled",
    "gradcheck",
    "manual_seed",
    "get_rng",
    "save",
    "load",
    "__version__",
]
