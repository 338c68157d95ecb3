"""Layers and the `Module` they are built from (``import glassllm.nn as nn``).

>>> import numpy as np
>>> import glassllm.nn as nn
>>> from glassllm import Tensor
>>> model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
>>> model(Tensor(np.ones((3, 4), dtype=np.float32))).shape, model.num_parameters()
((3, 2), 58)
"""

from glassllm.nn import init, utils
from glassllm.nn.activation import GELU, ReLU, SiLU, Tanh
from glassllm.nn.attention import CausalSelfAttention, MultiHeadAttention
from glassllm.nn.container import ModuleList, Sequential
from glassllm.nn.dropout import Dropout
from glassllm.nn.embedding import Embedding
from glassllm.nn.hooks import HookPoint, RemovableHandle
from glassllm.nn.kv_cache import KVCache
from glassllm.nn.linear import Linear
from glassllm.nn.mlp import SwiGLU
from glassllm.nn.module import IncompatibleKeys, Module, eval_mode
from glassllm.nn.normalization import LayerNorm, RMSNorm
from glassllm.nn.quantized import QuantizedEmbedding, QuantizedLinear
from glassllm.nn.rotary import RotaryEmbedding

__all__ = [
    "CausalSelfAttention",
    "Dropout",
    "Embedding",
    "GELU",
    "HookPoint",
    "IncompatibleKeys",
    "KVCache",
    "LayerNorm",
    "Linear",
    "Module",
    "ModuleList",
    "MultiHeadAttention",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "ReLU",
    "RMSNorm",
    "RemovableHandle",
    "RotaryEmbedding",
    "Sequential",
    "SiLU",
    "SwiGLU",
    "Tanh",
    "eval_mode",
    "init",
    "utils",
]
