"""Differentiable functions with hand-derived, fused, numerically stable VJPs.

``import glassllm.functional as F``. Each function computes its forward in NumPy and makes
its result with ``Tensor.from_op(out, parents, backward)``, one node with a hand-derived
vector-Jacobian product instead of a chain of primitive Tensor ops: fewer temporaries, and the
stability measures (max-subtraction, log-sum-exp, two-pass variance) live in one place. Each
derivation is in its function's docstring; the longer ones are in ``docs/functional.md``.

A fused function is its definition: input checks, forward and VJP in plain NumPy, and one line,
``kernels.select(definition, kernel)``, that takes the implementation to run; the fast ones
(worker threads, BLAS tricks, numba loops) live in `glassllm.kernels`, and
``kernels.use("reference")`` runs the definitions. ``glassllm.functional.compiled`` is the old
name of `glassllm.kernels.compiled`.

Modules, by concept: ``shape`` (concatenate, stack, where), ``probability`` (logsumexp,
softmax, log_softmax), ``losses`` (cross_entropy), ``activations`` (relu, gelu, silu,
swiglu), ``normalization`` (layer_norm, rms_norm), ``regularization`` (dropout), ``rotary``
(rotary_frequencies, rotary_cos_sin, rotary), ``affine`` (linear, embedding), ``quantized``
(quantized_linear and quantized_embedding on a Q4Weight or Q8Weight, GGUF blocks),
``attention`` (scaled_dot_product_attention, and, on ndarrays, attention_probabilities and
split_packed_heads), ``packed_attention`` (split, attend, merge in
one op), ``special`` (erf, erfc on ndarrays). The ``*_array`` functions (rotary_array,
rms_norm_array, swiglu_array, linear_array, quantized_linear_array, attention_array) are their
ops' forwards on plain arrays, the same kernels and bits with no Tensor and no checks, for
decoding under ``no_grad`` (`glassllm.models.decoding`).
"""

from glassllm.functional.activations import gelu, relu, silu, swiglu, swiglu_array
from glassllm.functional.affine import embedding, linear, linear_array
from glassllm.functional.attention import (
    attention_array,
    attention_probabilities,
    scaled_dot_product_attention,
    split_packed_heads,
)
from glassllm.functional.losses import cross_entropy
from glassllm.functional.normalization import layer_norm, rms_norm, rms_norm_array
from glassllm.functional.packed_attention import packed_attention
from glassllm.functional.probability import log_softmax, logsumexp, softmax
from glassllm.functional.quantized import (
    Q4Weight,
    Q8Weight,
    quantized_embedding,
    quantized_linear,
    quantized_linear_array,
)
from glassllm.functional.regularization import dropout
from glassllm.functional.rotary import rotary, rotary_array, rotary_cos_sin, rotary_frequencies
from glassllm.functional.shape import concatenate, stack, where
from glassllm.functional.special import erf, erfc

__all__ = [
    "concatenate",
    "stack",
    "where",
    "logsumexp",
    "softmax",
    "log_softmax",
    "cross_entropy",
    "gelu",
    "relu",
    "silu",
    "swiglu",
    "layer_norm",
    "rms_norm",
    "dropout",
    "rotary",
    "rotary_array",
    "rms_norm_array",
    "swiglu_array",
    "linear_array",
    "quantized_linear_array",
    "attention_array",
    "rotary_cos_sin",
    "rotary_frequencies",
    "embedding",
    "linear",
    "quantized_embedding",
    "quantized_linear",
    "Q4Weight",
    "Q8Weight",
    "scaled_dot_product_attention",
    "packed_attention",
    "attention_probabilities",
    "split_packed_heads",
    "erf",
    "erfc",
]
