"""Attention's fast kernels: causal tiles on worker threads, in-place writes into packed heads.

`attention(q, k, v, scale, bias, dropout_p, rng, dtype)` and `packed_attention(heads, scale,
causal, dropout_p, rng, keep)` compute what the definitions in `glassllm.functional.attention`
do and return ``(out, vjp)``. The kernels scale ``k`` on a contiguous transposed copy (not ``q``),
fold the softmax's division into one reciprocal, take ``rowsum(dP * P)`` as ``rowsum(G * O)``
on ``(Tq, dv)``, and write the packed op's output and gradient straight into the merged
``(B, T, E)`` and ``(B, T, 3E)`` arrays. Causal self-attention runs in tiles of `CAUSAL_TILE`
queries that skip the fully masked keys to their right, over blocks of the batch on the worker
threads; each row is computed on its own, so any thread count gives the same bits. The kernels
agree with the definitions to float rounding (``tests/kernels/test_kernels.py``).
"""

from __future__ import annotations

from functools import lru_cache, partial

import numpy as np

from glassllm.kernels.sums import exp_shift, sum_last
from glassllm.rng import dropout_mask
from glassllm.threads import row_blocks, run_blocks

# Query rows per tile in causal self-attention (F.packed_attention, training and inference):
# tile [start, stop) attends over keys [0, stop) only, skipping the fully masked blocks to its
# right. At T = 256 that is 10/16 of the T x T work.
CAUSAL_TILE = 64


@lru_cache(maxsize=32)
def _causal_bias(num_queries: int, num_keys: int, dtype: np.dtype) -> np.ndarray:
    """``(Tq, Tk)``: 0 where query ``i`` may see key ``j <= Tk - Tq + i``, ``-inf`` elsewhere."""
    bias = np.triu(
        np.full((num_queries, num_keys), -np.inf, dtype=dtype), k=num_keys - num_queries + 1
    )
    bias.flags.writeable = False
    return bias


@lru_cache(maxsize=32)
def _window_bias(num_queries: int, num_keys: int, window: int, dtype: np.dtype) -> np.ndarray:
    """``(Tq, Tk)``: 0 where query ``i``, at aligned position ``a = Tk - Tq + i``, may see key
    ``j`` with ``0 <= a - j < window`` (causal, the ``window`` latest keys), ``-inf`` elsewhere."""
    offset = num_keys - num_queries  # j - i of the diagonal a = j
    bias = np.triu(np.full((num_queries, num_keys), -np.inf, dtype=dtype), k=offset + 1)
    bias += np.tril(np.full((num_queries, num_keys), -np.inf, dtype=dtype), k=offset - window)
    bias.flags.writeable = False
    return bias


def split_packed_heads(qkv: np.ndarray, num_heads: int) -> np.ndarray:
    """A packed ``qkv (B, T, 3E)`` as a ``(3, B, nh, T, hs)`` view: ``q, k, v = heads``, each
    ``(B, nh, T, hs)``, with ``E = nh hs``; the inverse of merging heads, without a copy.

    >>> split_packed_heads(np.arange(12.0).reshape(1, 1, 12), 2)[:, 0, :, 0].tolist()
    [[[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]], [[8.0, 9.0], [10.0, 11.0]]]
    """
    batch, steps, three_embed = qkv.shape
    head_size = three_embed // 3 // num_heads
    return qkv.reshape(batch, steps, 3, num_heads, head_size).transpose(2, 0, 3, 1, 4)


def _scaled_keys_t(k: np.ndarray, scale: float, dtype: np.dtype) -> np.ndarray:
    """``(k / sqrt d)^T``: ``k (..., Tk, d)`` transposed to a C-contiguous ``(..., d, Tk)``,
    scaled on the way. The scale goes on k, not on q, so the backward can read q where the
    caller keeps it (a view into qkv) instead of a scaled copy saved per layer."""
    # why: a contiguous copy: NumPy's stacked matmul is ~2.5x slower on a transposed (..., d, Tk)
    # view than the copy and a plain product together (300 vs 34 + 117 us at (12, 4, 64, 32),
    # measured on the 2-core dev box); the scale rides on that copy for free.
    keys_t = np.empty(k.shape[:-2] + (k.shape[-1], k.shape[-2]), dtype)
    np.multiply(np.swapaxes(k, -1, -2), scale, out=keys_t, dtype=dtype)  # rounded in dtype
    return keys_t


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    bias: np.ndarray | None,
    dropout_p: float,
    rng: np.random.Generator | None,
    dtype: np.dtype,
    groups: int = 1,
    band: int | None = None,
) -> tuple:
    """``(O, vjp)`` for ``O = dropout(softmax(q k^T scale + bias)) v``;
    ``vjp(G, need_q, need_k, need_v) -> (dq, dk, dv)`` in the broadcast batch shape.
    ``groups`` must be 1 (grouped heads: `glassllm.kernels.grouped_attention`); ``band`` is
    not needed here, ``bias`` holds it."""
    if groups != 1:
        raise ValueError(f"kernels.attention.attention: groups={groups}; use grouped_attention")
    out, residuals = _attention_forward(q, k, v, scale, bias, dropout_p, rng, dtype)

    def vjp(grad: np.ndarray, need_q: bool, need_k: bool, need_v: bool) -> tuple:
        return _attention_backward(grad, residuals, scale, need_q, need_k, need_v)

    return out, vjp


def packed_attention(
    heads: np.ndarray,
    scale: float,
    causal: bool,
    dropout_p: float,
    rng: np.random.Generator | None,
    keep: bool,
    window: int | None = None,
) -> tuple:
    """``(y, vjp)`` for multi-head attention over ``heads = split_packed_heads(qkv, nh)``,
    ``(3, B, nh, T, hs)``: ``y (B, T, E)`` with the heads merged, ``vjp(G (B, T, E)) ->
    dqkv (B, T, 3E)``. ``keep``: whether a backward will run (else no residuals are kept).
    ``window`` (with ``causal``): the tiles skip the keys left of the band too."""
    _, batch, num_heads, steps, head_size = heads.shape
    dtype = heads.dtype
    merged = np.empty((batch, steps, num_heads, head_size), dtype)  # (B, T, nh, hs)
    out = merged.transpose(0, 2, 1, 3)  # (B, nh, T, hs) view: the merge is a write into it
    if causal:
        # (B, nh, T, hs) views into qkv; residuals only when a backward will read them
        residuals = _causal_forward(
            heads[0], heads[1], heads[2], scale, dropout_p, rng, out, keep=keep, window=window
        )
    else:
        _, residuals = _attention_forward(
            heads[0], heads[1], heads[2], scale, None, dropout_p, rng, dtype, out=out
        )

    def vjp(grad: np.ndarray) -> np.ndarray:
        d_qkv = np.empty((batch, steps, 3 * num_heads * head_size), dtype)
        d_heads = split_packed_heads(d_qkv, num_heads)  # (3, B, nh, T, hs) views
        grad_heads = grad.reshape(batch, steps, num_heads, head_size).transpose(0, 2, 1, 3)
        if causal and window is not None:
            _banded_backward(grad_heads, residuals, scale, *d_heads)
        elif causal:
            _causal_backward(grad_heads, residuals, scale, *d_heads)
        else:
            _attention_backward(
                grad_heads, residuals, scale, True, True, True, d_heads[0], d_heads[1], d_heads[2]
            )
        return d_qkv

    return merged.reshape(batch, steps, num_heads * head_size), vjp


def attention_probabilities(
    q: np.ndarray,
    k: np.ndarray,
    scale: float,
    bias: np.ndarray | None,
    dtype: np.dtype,
    groups: int = 1,
) -> np.ndarray:
    """``softmax(q k^T scale + bias)`` with `_attention_forward`'s arithmetic, as a new array
    (``groups`` must be 1: grouped heads are `glassllm.kernels.grouped_attention`'s)."""
    if groups != 1:
        raise ValueError(f"kernels.attention.attention_probabilities: groups={groups}")
    scores = np.asarray(q, dtype=dtype) @ _scaled_keys_t(k, scale, dtype)
    if bias is not None:
        scores = scores + bias  # (..., Tq, Tk)
    scores -= exp_shift(scores, (scores.ndim - 1,))  # row max, 0 if fully masked
    probs = np.exp(scores, out=scores)
    row_sum = sum_last(probs)
    row_sum[row_sum == 0] = 1
    probs *= np.divide(1.0, row_sum)
    return probs


def _causal_tiles(steps: int) -> list[tuple[int, int]]:
    """``[start, stop)`` query ranges of `CAUSAL_TILE` rows; tile ``[start, stop)`` sees keys
    ``[0, stop)``."""
    return [(start, min(start + CAUSAL_TILE, steps)) for start in range(0, steps, CAUSAL_TILE)]


def _causal_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    dropout_p: float,
    rng: np.random.Generator | None,
    out: np.ndarray,
    keep: bool,
    window: int | None = None,
) -> list | None:
    """Causal self-attention of ``(B, ..., T, d)`` views into ``out``: `_causal_forward_block` on
    blocks of the batch over the worker threads (k and v may broadcast over middle axes: the
    query heads of a group, `glassllm.kernels.grouped_attention`). The dropout mask is drawn for
    the whole ``(B, ..., T, T)`` at once, the same draw as `_attention_forward`'s. Returns the
    blocks' ``(rows, residuals)`` for `_causal_backward` when ``keep``, else None."""
    batch, steps = q.shape[0], q.shape[-2]
    drop = None
    if dropout_p > 0:
        drop = dropout_mask(out.shape[:-1] + (steps,), dropout_p, out.dtype, rng)  # (B, ..., T, T)
    row_work = max(1, int(np.prod(out.shape[1:-1])) * steps)  # scores per batch row
    blocks = row_blocks(batch, min_rows=-(-_MIN_BLOCK_WORK // row_work))
    residuals: list = [None] * len(blocks)

    def run(index: int, rows: slice) -> None:
        block_drop = None if drop is None else drop[rows]
        block = _causal_forward_block(
            scale, keep, q[rows], k[rows], v[rows], block_drop, out[rows], window
        )
        residuals[index] = (rows, block)

    run_blocks([partial(run, i, rows) for i, rows in enumerate(blocks)], uses_blas=True)
    return residuals if keep else None


def _causal_backward(
    grad: np.ndarray,
    residuals: list,
    scale: float,
    dq: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
) -> None:
    """The VJP of `_causal_forward`, block by block as the forward split the batch."""
    run_blocks(
        [
            partial(_causal_backward_block, scale, grad[rows], block, dq[rows], dk[rows], dv[rows])
            for rows, block in residuals
        ],
        uses_blas=True,
    )


# why: a hand-off to a worker thread costs ~20-50 us; below ~64K attention scores per block the
# split costs more than it saves.
_MIN_BLOCK_WORK = 1 << 16


def _causal_forward_block(
    scale: float,
    keep: bool,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    drop: np.ndarray | None,
    out: np.ndarray,
    window: int | None = None,
) -> tuple | None:
    """Causal self-attention ``(..., T, d)`` into ``out``, in tiles of `CAUSAL_TILE` queries.

    Each tile's rows see keys ``[0, stop)``: the same softmax rows as `_attention_forward` with
    the causal bias (the skipped keys would add ``exp(-inf) = 0``), and only the tile's diagonal
    block needs the bias; every row sees at least key 0, so no row sum is 0. With a ``window``
    ``w`` a tile sees keys ``[lo, stop)``, ``lo = max(0, start - w + 1)``, under the band's bias
    (every row sees its own key). ``drop``: the ``(..., T, T)`` dropout mask or None. Row sums
    are ``einsum`` reductions, each over its own row, so a block of the batch gives the same
    bits as the whole batch. Returns the residuals for the backward when ``keep``, else None.
    """
    # why: skipping the masked blocks right of each tile does 10/16 of the T x T work at
    # T = 256 (GEMMs and softmax passes alike) and keeps 10/16 of the probabilities: fwd+bwd
    # 125 -> 66 ms at (12, 6 heads, 256, 64), 15.8 -> 13.5 ms at (12, 4, 128, 64), 1 thread
    # (issue 13, bench/LOG.md); tile 32 is within 5-7% of 64 either way.
    dtype = out.dtype
    steps = q.shape[-2]
    keys_t = _scaled_keys_t(k, scale, dtype)  # (..., d, T)
    tiles = []
    for start, stop in _causal_tiles(steps):
        lo = 0 if window is None else max(0, start - window + 1)
        scores = q[..., start:stop, :] @ keys_t[..., lo:stop]  # (..., t, stop - lo)
        if window is None:
            scores[..., start:] += _causal_bias(stop - start, stop - start, dtype)  # diagonal
        else:
            scores += _window_bias(steps, steps, window, dtype)[start:stop, lo:stop]
        scores -= exp_shift(scores, (scores.ndim - 1,))
        probs = np.exp(scores, out=scores)
        probs *= np.divide(1.0, np.einsum("...j->...", probs)[..., None])
        weights = probs if drop is None else probs * drop[..., start:stop, lo:stop]
        np.matmul(weights, v[..., lo:stop, :], out=out[..., start:stop, :])
        if keep:
            tiles.append((start, stop, lo, probs, weights))
    return (q, k, v, tiles, drop, out) if keep else None


def _causal_backward_block(
    scale: float,
    grad: np.ndarray,
    residuals: tuple,
    dq: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
) -> None:
    """The VJP of `_causal_forward_block`, tile by tile, written into ``dq, dk, dv`` (strided views
    are fine). Tile ``[start, stop)`` gives ``dq[start:stop]`` and adds to ``dk[:stop]``,
    ``dv[:stop]``; the last tile, which sees every key, writes them first."""
    q, k, v, tiles, drop, out = residuals
    steps = q.shape[-2]
    values_t = np.ascontiguousarray(np.swapaxes(v, -1, -2), dtype=out.dtype)  # see keys_t
    for start, stop, _, probs, weights in reversed(tiles):
        g = grad[..., start:stop, :]  # (..., t, dv)
        first = stop == steps
        part = np.matmul(np.swapaxes(weights, -1, -2), g, out=dv if first else None)
        if not first:
            dv[..., :stop, :] += part
        d_scores = g @ values_t[..., :stop]  # (..., t, stop) dA, then dP, then dS
        if drop is not None:
            d_scores *= drop[..., start:stop, :stop]
        d_scores -= np.einsum("...j,...j->...", g, out[..., start:stop, :])[..., None]
        d_scores *= probs
        dq_tile = np.matmul(d_scores, k[..., :stop, :], out=dq[..., start:stop, :])
        dq_tile *= scale
        part = np.matmul(
            np.swapaxes(d_scores, -1, -2), q[..., start:stop, :], out=dk if first else None
        )
        if not first:
            dk[..., :stop, :] += part
    dk *= scale


def _stack_rows(a: np.ndarray) -> np.ndarray:
    """``(B, KV, groups, t, x) -> (B, KV, groups t, x)``: a group's rows as one block (4-D
    arrays, one query head per kv head, stay as they are)."""
    return a.reshape(a.shape[:2] + (-1, a.shape[-1]))


def _banded_backward(
    grad: np.ndarray,
    residuals: list,
    scale: float,
    dq: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
) -> None:
    """The VJP of `_causal_forward` with a window or grouped heads, block by block as the
    forward split the batch: ``dq`` written, ``dk``, ``dv`` (``(B, KV, T, .)``, strided views
    are fine) zeroed here, then added to by each tile."""
    dk[...] = 0
    dv[...] = 0
    run_blocks(
        [
            partial(_banded_backward_block, scale, grad[rows], block, dq[rows], dk[rows], dv[rows])
            for rows, block in residuals
        ],
        uses_blas=True,
    )


def _banded_backward_block(
    scale: float,
    grad: np.ndarray,
    residuals: tuple,
    dq: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
) -> None:
    """The VJP of `_causal_forward_block` over ``(B, KV, [groups,] T, .)`` tiles, into ``dq`` and
    (adding) ``dk``, ``dv`` ``(B, KV, T, .)``. Tile ``[start, stop)`` saw keys ``[lo, stop)``:
    ``dv[lo:stop] += A^T G`` and ``dk[lo:stop] += dS^T q``, each one product over the group's
    stacked rows (the sum over the query heads of the group)."""
    q, k, v, tiles, drop, out = residuals
    values_t = np.ascontiguousarray(np.swapaxes(v, -1, -2), dtype=out.dtype)  # (B, KV, [1,] dv, T)
    for start, stop, lo, probs, weights in tiles:
        g = grad[..., start:stop, :]  # (B, KV, groups, t, dv)
        dv[..., lo:stop, :] += np.swapaxes(_stack_rows(weights), -1, -2) @ _stack_rows(g)
        d_scores = g @ values_t[..., lo:stop]  # (B, KV, groups, t, stop - lo): dA, dP, dS
        if drop is not None:
            d_scores *= drop[..., start:stop, lo:stop]
        d_scores -= np.einsum("...j,...j->...", g, out[..., start:stop, :])[..., None]
        d_scores *= probs
        dq_tile = np.matmul(d_scores, k[..., lo:stop, :], out=dq[..., start:stop, :])
        dq_tile *= scale
        q_rows = _stack_rows(q[..., start:stop, :])
        dk[..., lo:stop, :] += np.swapaxes(_stack_rows(d_scores), -1, -2) @ q_rows
    dk *= scale


def _attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    bias: np.ndarray | None,
    dropout_p: float,
    rng: np.random.Generator | None,
    dtype: np.dtype,
    out: np.ndarray | None = None,
    few_queries: bool = False,
) -> tuple[np.ndarray, tuple]:
    """``O = dropout(softmax(q k^T scale + bias)) v`` on arrays; returns ``(O, residuals)``.

    ``out`` (optional) receives ``O``: a strided view is fine (the packed op merges heads so).
    ``few_queries``: the scores as ``(k (q scale)^T)^T``, no scaled copy of ``k^T``.
    """
    if few_queries:
        # why: decoding a grouped-query model multiplies a few rows by the whole cache, and the
        # copy of k^T then costs more than the product: at (1, 3, 3 rows, 64) against 512 / 2048
        # keys, k (q scale)^T takes 77-111 / 320-403 us, q (k scale)^T 243-304 / 1334-1775 us.
        rows_t = np.swapaxes(np.multiply(q, scale, dtype=dtype), -1, -2)  # (..., d, Tq)
        scores = np.ascontiguousarray(np.swapaxes(np.asarray(k, dtype=dtype) @ rows_t, -1, -2))
    else:
        keys_t = _scaled_keys_t(k, scale, dtype)  # (..., d, Tk)
        scores = np.asarray(q, dtype=dtype) @ keys_t  # (..., Tq, Tk)
    if bias is not None:
        if np.broadcast_shapes(scores.shape, bias.shape) == scores.shape:
            scores += bias
        else:
            scores = scores + bias  # the mask adds batch axes that q, k lack
    scores -= exp_shift(scores, (scores.ndim - 1,))  # (..., Tq, 1) row max, 0 if fully masked
    probs = np.exp(scores, out=scores)  # (..., Tq, Tk)
    row_sum = sum_last(probs)
    row_sum[row_sum == 0] = 1
    np.divide(1.0, row_sum, out=row_sum)
    probs *= row_sum
    drop = dropout_mask(probs.shape, dropout_p, dtype, rng) if dropout_p > 0 else None
    weights = probs if drop is None else probs * drop  # (..., Tq, Tk)
    out = np.matmul(weights, v, out=out)  # (..., Tq, dv)
    return out, (q, k, v, probs, drop, weights, out)


def _attention_backward(
    grad: np.ndarray,
    residuals: tuple,
    scale: float,
    need_q: bool,
    need_k: bool,
    need_v: bool,
    dq: np.ndarray | None = None,
    dk: np.ndarray | None = None,
    dv: np.ndarray | None = None,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """The VJP of `_attention_forward` (derivation: `scaled_dot_product_attention`).

    ``dq``, ``dk``, ``dv`` (optional) receive the gradients, possibly as strided views; the
    un-needed ones come back None. Shapes are the broadcast batch shape (unbroadcast after).
    """
    q, k, v, probs, drop, weights, out = residuals
    if need_v:
        dv = np.matmul(np.swapaxes(weights, -1, -2), grad, out=dv)
    else:
        dv = None
    if not (need_q or need_k):
        return None, None, dv
    values_t = np.ascontiguousarray(np.swapaxes(v, -1, -2), dtype=probs.dtype)  # see keys_t
    d_scores = grad @ values_t  # (..., Tq, Tk) dA, then dP, then dS
    if drop is not None:
        d_scores *= drop
    row_dot = np.einsum("...j,...j->...", grad, out)[..., None]  # rowsum(dP * P)
    d_scores -= row_dot
    d_scores *= probs
    if need_q:
        dq = np.matmul(d_scores, k, out=dq)
        dq *= scale
    else:
        dq = None
    if need_k:
        dk = np.matmul(np.swapaxes(d_scores, -1, -2), q, out=dk)
        dk *= scale
    else:
        dk = None
    return dq, dk, dv
