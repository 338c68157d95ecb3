"""Check analytic gradients against central finite differences.

For a random direction r of the output's shape, the scalar f(x) = Σ r ⊙ fn(x)
has gradient ∇f = rᵀJ, which one backward pass with seed r computes. Central
differences estimate each entry as (f(x + εeᵢ) - f(x - εeᵢ)) / 2ε with error
O(ε²), which only float64 resolves: in float32, ε small enough for the
truncation error is too small for the rounding error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from glassllm.autograd import no_grad
from glassllm.tensor import Tensor


def gradcheck(
    fn: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    rng: np.random.Generator | None = None,
) -> bool:
    """Compare ``fn``'s analytic gradients with central finite differences.

    ``fn(*inputs)`` must return a Tensor (any shape: a non-scalar output is
    checked through a random projection). Every input Tensor with
    ``requires_grad=True`` is checked and must be float64. Raises
    AssertionError naming the input and its worst element; returns True.
    Inputs' ``.grad`` values are restored afterwards.

    >>> import numpy as np
    >>> from glassllm import Tensor, gradcheck
    >>> x = Tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    >>> gradcheck(lambda t: (t * t).exp(), [x])
    True
    """
    inputs = list(inputs)
    checked = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input Tensor has requires_grad=True")
    for i in checked:
        if inputs[i].dtype != np.float64:
            raise TypeError(
                f"gradcheck: input {i} is {inputs[i].dtype}; finite differences need float64"
            )
    rng = rng if rng is not None else np.random.default_rng(0)

    output = fn(*inputs)
    if not isinstance(output, Tensor):
        raise TypeError(f"gradcheck: fn must return a Tensor, got {type(output).__name__}")
    direction = rng.standard_normal(output.shape)

    saved_grads = [inputs[i].grad for i in checked]
    try:
        for i in checked:
            inputs[i].grad = None
        output.backward(direction)
        analytic = [
            np.zeros(inputs[i].shape) if inputs[i].grad is None else inputs[i].grad.copy()
            for i in checked
        ]
    finally:
        for i, grad in zip(checked, saved_grads, strict=True):
            inputs[i].grad = grad

    def projected() -> float:
        with no_grad():
            return float(np.sum(fn(*inputs).data * direction))

    for i, exact in zip(checked, analytic, strict=True):
        values = inputs[i].data
        numeric = np.zeros(values.shape)
        # Index the array itself: reshape(-1) of a transposed or strided array is
        # a copy, and perturbing a copy would leave fn's input unchanged.
        for j in np.ndindex(values.shape):
            original = values[j]
            try:
                values[j] = original + eps
                upper = projected()
                values[j] = original - eps
                lower = projected()
            finally:  # fn may raise: never leave the caller's input perturbed
                values[j] = original
            numeric[j] = (upper - lower) / (2 * eps)
        error = np.abs(exact - numeric)
        allowed = atol + rtol * np.abs(numeric)
        if np.any(~(error <= allowed)):
            excess = np.where(np.isnan(error), np.inf, error - allowed)
            worst = np.unravel_index(np.argmax(excess), values.shape) if values.ndim else ()
            raise AssertionError(
                f"gradcheck: input {i} (shape {values.shape}) mismatch at index "
                f"{tuple(map(int, worst))}: analytic {float(exact[worst])!r}, "
                f"finite difference {float(numeric[worst])!r} "
                f"(|diff| {error[worst]:.3g} > atol {atol} + rtol {rtol} * |fd|)"
            )
    return True
