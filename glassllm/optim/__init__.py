"""Optimizers and learning-rate schedules.

>>> import glassllm.optim as optim
>>> sorted(name for name in optim.__all__ if name[0].isupper())[:4]
['Adam', 'AdamW', 'Constant', 'CosineWithWarmup']
"""

from glassllm.optim.adam import Adam, AdamW
from glassllm.optim.lr_scheduler import (
    Constant,
    CosineWithWarmup,
    LRScheduler,
    StepLR,
    cosine_with_warmup,
    step_decay,
)
from glassllm.optim.optimizer import Optimizer
from glassllm.optim.sgd import SGD

__all__ = [
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "LRScheduler",
    "Constant",
    "StepLR",
    "CosineWithWarmup",
    "cosine_with_warmup",
    "step_decay",
]
