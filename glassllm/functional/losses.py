"""Loss functions: cross-entropy from logits, fused with its log-softmax."""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm.functional._common import exp_shift, float_tensor, integer_array, sum_over
from glassllm.tensor import Tensor


def cross_entropy(logits: Tensor, targets: Any, ignore_index: int | None = None) -> Tensor:
    """Mean negative log-likelihood of integer ``targets`` under ``softmax(logits)``.

    ``logits`` has shape ``(..., C)``, ``targets`` integer shape ``(...)`` with values in
    ``[0, C)`` (or equal to ``ignore_index``). With ``n`` the number of non-ignored positions:

    Forward: ``L = (1/n) sum_i [log sum_c exp(z_ic - m_i) - (z_{i,t_i} - m_i)]``,
    ``m_i = max_c z_ic``: the max-subtraction keeps ``exp`` <= 1 and the log-sum-exp never
    takes ``log 0``.
    VJP: ``dL/dz_ic = (g/n) (p_ic - [c = t_i])`` with ``p = softmax(z)``; the one-hot is a
    scatter-subtract of ``g/n`` at ``(i, t_i)``, never materialised. Ignored rows get 0.

    If every position is ignored (``n = 0``) the loss is 0 with a zero gradient, a choice:
    PyTorch returns nan (0/0), which would poison an optimizer step on a fully padded batch.

    >>> logits = Tensor(np.array([[1e4, 0.0], [0.0, 0.0]], dtype=np.float32), requires_grad=True)
    >>> loss = cross_entropy(logits, np.array([0, 1]))
    >>> round(float(loss.data), 6)  # (0 + log 2) / 2
    0.346574
    """
    logits = float_tensor(logits, "cross_entropy: logits")
    if logits.ndim == 0:
        raise ValueError("cross_entropy: logits must have a class axis, got a 0-d tensor")
    target_ids = integer_array(targets, "cross_entropy: targets")
    if target_ids.shape != logits.shape[:-1]:
        raise ValueError(
            f"cross_entropy: targets shape {target_ids.shape} must equal logits shape "
            f"{logits.shape} without its last (class) axis, {logits.shape[:-1]}"
        )
    num_classes = logits.shape[-1]
    z = logits.data.reshape(-1, num_classes)  # (N, C)
    t = target_ids.reshape(-1)  # (N,)
    kept = np.ones(t.shape, dtype=bool) if ignore_index is None else t != ignore_index
    if kept.all():
        kept = None  # the common case: skip the masking arithmetic below
        safe_t = t
    else:
        safe_t = np.where(kept, t, 0)  # ignored rows index class 0, weighted by 0
    if safe_t.size and (safe_t.min() < 0 or safe_t.max() >= num_classes):
        bad = safe_t[(safe_t < 0) | (safe_t >= num_classes)][0]
        raise ValueError(
            f"cross_entropy: target {bad} is outside [0, {num_classes})"
            + ("" if ignore_index is None else f" and is not ignore_index={ignore_index}")
        )
    rows = np.arange(z.shape[0])
    n = z.shape[0] if kept is None else int(np.count_nonzero(kept))

    m = exp_shift(z, (1,))  # (N, 1) row maxima
    e = np.subtract(z, m)  # (N, C) shifted logits, then their exp
    picked = e[rows, safe_t]  # (N,) z_{i,t_i} - m_i
    np.exp(e, out=e)
    s = sum_over(e, (1,), keepdims=False)  # (N,) >= 1
    nll = np.log(s)
    nll -= picked
    if kept is not None:
        nll *= kept
    total = nll.sum()
    loss = np.asarray(total / n if n else total * 0, dtype=z.dtype)

    def backward(grad: np.ndarray) -> tuple:
        weight = float(grad) / n if n else 0.0  # g/n, a Python float keeps float32
        row_scale = np.full(z.shape[0], weight, dtype=z.dtype)  # (N,) g/n per kept row
        if kept is not None:
            row_scale *= kept
        dz = np.multiply(e, (row_scale / s)[:, None])  # (g/n) * p
        dz[rows, safe_t] -= row_scale  # minus (g/n) * onehot, without building it
        return (dz.reshape(logits.shape),)

    return Tensor.from_op(loss, (logits,), backward).named("cross_entropy")
