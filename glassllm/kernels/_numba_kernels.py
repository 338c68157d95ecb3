"""The compiled kernels behind `glassllm.kernels.compiled` (imported only when numba is).

Each kernel is the maths of a NumPy routine in its caller's module, done in one pass per row
instead of one pass over the whole array per operation. ``nogil``: the worker threads run them
side by side. ``reassoc`` lets LLVM vectorise a row's sums (so they add in another order than
NumPy's pairwise sums: float32 rounding, not a change of formula); nothing else is relaxed.
The elementwise kernels (``_exact``) relax nothing: each does its caller's NumPy operations in
the same order, each rounded to the array's dtype, so they give NumPy's bits exactly. Their
constants come from the caller already cast to that dtype, as NumPy casts a Python float.
"""

from __future__ import annotations

import numba
import numpy as np

# error_model="numpy": IEEE division (x/0 = inf, as NumPy) instead of Python's ZeroDivisionError,
# whose check in every iteration also keeps LLVM from vectorising a loop that divides.
_options = dict(nogil=True, cache=True, boundscheck=False, error_model="numpy")
_compile = numba.njit(**_options, fastmath={"reassoc"})
_exact = numba.njit(**_options)


@_compile
def layer_norm_rows(w, b, eps, x, mean, rstd, out):
    """`layer_norm._normalize_rows`: ``mean, rstd`` per row of ``x (n, D)`` and
    ``out = (x - mean) rstd w + b`` (``w``, ``b`` may be None)."""
    rows, dim = x.shape
    zero = x.dtype.type(0)
    inv_dim = x.dtype.type(1.0 / dim)
    for i in range(rows):
        total = zero
        for j in range(dim):
            total += x[i, j]
        mu = total * inv_dim
        squares = zero
        for j in range(dim):
            centred = x[i, j] - mu
            squares += centred * centred
        r = x.dtype.type(1.0) / np.sqrt(squares * inv_dim + x.dtype.type(eps))
        mean[i] = mu
        rstd[i] = r
        for j in range(dim):
            y = (x[i, j] - mu) * r
            if w is not None:
                y *= w[j]
            if b is not None:
                y += b[j]
            out[i, j] = y


@_compile
def layer_norm_rows_vjp(w, dy, x, mean, rstd, dy_centred, dx):
    """`layer_norm._normalize_rows_vjp`: ``dy_centred = dy (x - mean)`` and, when ``dx`` is
    not None, ``dx = g rstd - (rstd mean(g) + (x - mean) rstd^3 mean(g (x - mean)))``,
    ``g = dy w`` (``w`` may be None)."""
    rows, dim = x.shape
    zero = x.dtype.type(0)
    inv_dim = x.dtype.type(1.0 / dim)
    for i in range(rows):
        mu = mean[i]
        sum_g = zero
        sum_g_centred = zero
        for j in range(dim):
            centred = x[i, j] - mu
            g = dy[i, j]
            dy_centred[i, j] = g * centred
            if w is not None:
                g *= w[j]
            sum_g += g
            sum_g_centred += g * centred
        if dx is None:
            continue
        r = rstd[i]
        mean_g = r * sum_g * inv_dim
        centred_coef = r * r * r * sum_g_centred * inv_dim
        for j in range(dim):
            g = dy[i, j]
            if w is not None:
                g *= w[j]
            dx[i, j] = g * r - (mean_g + (x[i, j] - mu) * centred_coef)


@_exact
def gelu_tanh_exponent(x, a, b, s):
    """`gelu._gelu_tanh`'s first passes on 1-D arrays: ``s = (x x a - b) x`` (= -2u)."""
    for i in range(x.size):
        xi = x[i]
        s[i] = (xi * xi * a - b) * xi


@_exact
def gelu_tanh_finish(x, s, out):
    """`gelu._gelu_tanh`'s last passes, after ``s = exp(-2u)``: ``s = 1/(s + 1)`` and
    ``out = x s``."""
    one = s.dtype.type(1)
    for i in range(x.size):
        sigmoid = one / (s[i] + one)
        s[i] = sigmoid
        out[i] = x[i] * sigmoid


@_exact
def gelu_tanh_slope(x, s, grad, c6, c2, slope):
    """`gelu._gelu_tanh_slope` on 1-D arrays:
    ``slope = ((((x x c6 + c2) x) (1 - s) + 1) s) grad``."""
    one = s.dtype.type(1)
    for i in range(x.size):
        xi = x[i]
        si = s[i]
        slope[i] = ((((xi * xi * c6 + c2) * xi) * (one - si) + one) * si) * grad[i]


@_exact
def adam_update(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    shrink,
    l2,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    bias_correction2_sqrt,
    eps,
    neg_step_size,
):
    """`optim.Adam._update` for one parameter, on 1-D arrays: the decoupled shrink
    ``p = p shrink`` (when ``shrink != 1``) or the L2 gradient ``g = p l2 + g`` (when
    ``l2 != 0``), then the moments and ``p = p + (m / (sqrt(v) / bc2 + eps)) (-step_size)``."""
    one = param.dtype.type(1)
    zero = param.dtype.type(0)
    for i in range(param.size):
        p = param[i]
        g = grad[i]
        if shrink != one:
            p = p * shrink
        if l2 != zero:
            g = p * l2 + g
        m = exp_avg[i]
        m = m + (g - m) * one_minus_beta1
        v = exp_avg_sq[i] * beta2 + g * one_minus_beta2 * g
        exp_avg[i] = m
        exp_avg_sq[i] = v
        denom = np.sqrt(v) / bias_correction2_sqrt + eps
        param[i] = p + m / denom * neg_step_size


@_exact
def rotate_pairs(x, cos, sin, inverse, interleaved, out):
    """`rotary.rotate` on ``x, out (N, M, T, D)`` (any strides) and tables ``cos, sin (T,
    half)``: each pair ``(a, b)`` to ``(a cos - b sin, b cos + a sin)``, or ``inverse`` to ``(a
    cos + b sin, b cos - a sin)``, each product rounded before the sum as NumPy's passes do;
    features past ``2 half`` copied."""
    half = cos.shape[1]
    for n in range(x.shape[0]):
        for m in range(x.shape[1]):
            for t in range(x.shape[2]):
                for j in range(half):
                    first = 2 * j if interleaved else j
                    second = first + 1 if interleaved else j + half
                    a = x[n, m, t, first]
                    b = x[n, m, t, second]
                    c = cos[t, j]
                    s = sin[t, j]
                    if inverse:
                        out[n, m, t, first] = a * c + b * s
                        out[n, m, t, second] = b * c - a * s
                    else:
                        out[n, m, t, first] = a * c - b * s
                        out[n, m, t, second] = b * c + a * s
                for j in range(2 * half, x.shape[3]):
                    out[n, m, t, j] = x[n, m, t, j]


@_exact
def q4_row_product(
    scales, offsets, nibbles, x, out, first, last, first_block, last_block, partials
):
    """`glassllm.kernels.quantized.q4_matmul`'s ``x W`` for one row ``x (in,)``: outputs
    ``first:last`` of ``out (out,)`` from the blocks ``first_block:last_block``, each block's term
    ``d (sum q_low x + sum q_high x) + m sum x`` (per output, the low-nibble terms ``j = 0..15``
    in order in one float32 sum, the high-nibble terms in another; the block's 32 inputs summed
    in order) added in block order onto 0. Where ``partials`` has rows, each block's term goes
    to its own row ``b - first_block`` instead, for the caller to add on in the same order: so
    blocks run on another thread give the bits of one pass (`_numba_row_pool`). The inner loop
    runs along the outputs, every output its own lane and its own sum, so LLVM vectorises it
    without reordering one (nothing relaxed); slices keep numba's index checks out of it."""
    _, half, _ = nibbles.shape
    count = last - first
    low = np.empty(count, np.float32)
    high = np.empty(count, np.float32)
    total = out[first:last]
    if partials.shape[0] == 0:
        total[:] = 0
    for b in range(first_block, last_block):
        low[:] = 0
        high[:] = 0
        x_sum = np.float32(0)
        for j in range(2 * half):
            x_sum += x[b * 2 * half + j]
        for j in range(half):
            x_low = x[b * 2 * half + j]
            x_high = x[b * 2 * half + half + j]
            q = nibbles[b, j, first:last]
            for o in range(count):
                low[o] += np.float32(q[o] & 15) * x_low
                high[o] += np.float32(q[o] >> 4) * x_high
        d = scales[b, first:last]
        m = offsets[b, first:last]
        if partials.shape[0] == 0:
            for o in range(count):
                total[o] += d[o] * (low[o] + high[o]) + m[o] * x_sum
        else:
            term = partials[b - first_block, first:last]
            for o in range(count):
                term[o] = d[o] * (low[o] + high[o]) + m[o] * x_sum


@_exact
def dequantize_q4(scales, offsets, nibbles, out):
    """`glassllm.functional.quantized.dequantize_q4` into ``out (in, out)``: the same ``q d + m``
    for every weight, so the same bits."""
    blocks, half, outputs = nibbles.shape
    for b in range(blocks):
        d = scales[b]
        m = offsets[b]
        for j in range(half):
            q = nibbles[b, j]
            row_low = out[b * 2 * half + j]
            row_high = out[b * 2 * half + half + j]
            for o in range(outputs):
                row_low[o] = np.float32(q[o] & 15) * d[o] + m[o]
                row_high[o] = np.float32(q[o] >> 4) * d[o] + m[o]


@_exact
def q8_row_product(scales, offsets, quants, x, out, first, last, first_block, last_block, partials):
    """`glassllm.kernels.quantized.q8_matmul`'s ``x W`` for one row ``x (in,)``: outputs
    ``first:last`` of ``out (out,)`` from the blocks ``first_block:last_block``, each block's term
    ``d (sum_j q x) [+ m sum x]`` (per output, ``q x`` for ``j = 0..size-1`` added in order into
    one float32 sum; ``m`` times the block's inputs summed in order where ``offsets`` has rows:
    an empty ``offsets`` means none) added in block order onto 0; where ``partials`` has rows,
    each block's term goes to its row ``b - first_block`` instead (as in `q4_row_product`). Four
    ``j`` a pass (a block's 32 or 16 is a multiple of 4), written as four additions in order so
    each pass loads and stores the sums once: the same bits as one ``j`` a pass, half the time.
    Slices, not ``o + first`` indices, keep numba's negative-index check out of the loop, which
    would stop LLVM vectorising it."""
    _, size, _ = quants.shape
    count = last - first
    block_sum = np.empty(count, np.float32)
    total = out[first:last]
    if partials.shape[0] == 0:
        total[:] = 0
    for b in range(first_block, last_block):
        block_sum[:] = 0
        for j in range(0, size, 4):
            x0 = x[b * size + j]
            x1 = x[b * size + j + 1]
            x2 = x[b * size + j + 2]
            x3 = x[b * size + j + 3]
            q0 = quants[b, j, first:last]
            q1 = quants[b, j + 1, first:last]
            q2 = quants[b, j + 2, first:last]
            q3 = quants[b, j + 3, first:last]
            for o in range(count):
                partial = block_sum[o] + np.float32(q0[o]) * x0
                partial = partial + np.float32(q1[o]) * x1
                partial = partial + np.float32(q2[o]) * x2
                block_sum[o] = partial + np.float32(q3[o]) * x3
        d = scales[b, first:last]
        into = total if partials.shape[0] == 0 else partials[b - first_block, first:last]
        if offsets.shape[0] == 0:
            if partials.shape[0] == 0:
                for o in range(count):
                    into[o] += d[o] * block_sum[o]
            else:
                for o in range(count):
                    into[o] = d[o] * block_sum[o]
            continue
        x_sum = np.float32(0)
        for j in range(size):
            x_sum += x[b * size + j]
        m = offsets[b, first:last]
        if partials.shape[0] == 0:
            for o in range(count):
                into[o] += d[o] * block_sum[o] + m[o] * x_sum
        else:
            for o in range(count):
                into[o] = d[o] * block_sum[o] + m[o] * x_sum


@_exact
def dequantize_q8(scales, offsets, quants, out):
    """`glassllm.functional.quantized.dequantize_q8` into ``out (in, out)``: the same ``q d``, or
    ``q d + m`` where ``offsets`` has rows."""
    blocks, size, outputs = quants.shape
    for b in range(blocks):
        d = scales[b]
        for j in range(size):
            q = quants[b, j]
            row = out[b * size + j]
            if offsets.shape[0] == 0:
                for o in range(outputs):
                    row[o] = np.float32(q[o]) * d[o]
            else:
                m = offsets[b]
                for o in range(outputs):
                    row[o] = np.float32(q[o]) * d[o] + m[o]
