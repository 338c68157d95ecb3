"""glassllm.gradcheck itself: it passes correct operations and, more importantly,
it fails wrong ones, naming the input and the worst element."""

from __future__ import annotations

import re

import numpy as np
import pytest

from glassllm import Tensor, gradcheck


def _leaf(shape, seed=0):
    return Tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=True)


def test_passes_a_correct_op_with_scalar_and_tensor_outputs():
    a, b = _leaf((2, 3), 1), _leaf((3,), 2)
    assert gradcheck(lambda a, b: (a * b).tanh(), [a, b]) is True
    assert gradcheck(lambda a, b: (a @ b.reshape(3, 1)).sum(), [a, b]) is True
    assert gradcheck(lambda a: a.sum(), [_leaf(())]) is True


def _wrong_at(bad_index: tuple[int, ...]):
    """An elementwise square whose VJP is wrong in one element of its input."""

    def op(x: Tensor) -> Tensor:
        def backward(g: np.ndarray) -> tuple:
            grad = np.array(2.0 * x.data * g)  # a copy, 0-d arrays included
            grad[bad_index] += 1.0
            return (grad,)

        return Tensor(x.data**2, parents=(x,), backward=backward, requires_grad=x.requires_grad)

    return op


def test_fails_a_wrong_op_naming_input_and_worst_element():
    square_wrong_at_1_2 = _wrong_at((1, 2))
    a, b = _leaf((2, 3), 3), _leaf((2, 3), 4)
    with pytest.raises(AssertionError) as excinfo:
        gradcheck(lambda a, b: a * 2.0 + square_wrong_at_1_2(b), [a, b])
    message = str(excinfo.value)
    assert re.search(r"input 1\b", message), message
    assert re.search(r"\(1, 2\)", message), message


def test_fails_a_wrong_op_in_the_first_input_too():
    a, b = _leaf((4,), 5), _leaf((4,), 6)
    with pytest.raises(AssertionError, match=r"input 0\b.*\(3,\)"):
        gradcheck(lambda a, b: _wrong_at((3,))(a) * b, [a, b])


def test_fails_a_wrong_op_on_a_0d_input():
    with pytest.raises(AssertionError, match=r"input 0\b"):
        gradcheck(_wrong_at(()), [_leaf((), 7)])


def test_fails_a_backward_that_forgets_broadcasting_sums():
    """A subtler wrong op: gradient of the right shape, but only one replica's worth."""

    def add_wrong(a: Tensor, b: Tensor) -> Tensor:
        return Tensor(
            a.data + b.data, parents=(a, b), backward=lambda g: (g, g[0]), requires_grad=True
        )

    with pytest.raises(AssertionError, match=r"input 1\b"):
        gradcheck(add_wrong, [_leaf((3, 2), 8), _leaf((2,), 9)])


def test_fails_when_an_input_gets_no_gradient_but_should():
    def drops_b(a: Tensor, b: Tensor) -> Tensor:
        return Tensor(
            a.data * b.data,
            parents=(a, b),
            backward=lambda g: (g * b.data, None),
            requires_grad=True,
        )

    with pytest.raises(AssertionError, match=r"input 1\b"):
        gradcheck(drops_b, [_leaf((2,), 10), _leaf((2,), 11)])


def test_restores_input_grads_and_values():
    x = _leaf((2, 2), 12)
    before = x.data.copy()
    x.grad = np.full((2, 2), 7.0)
    gradcheck(lambda t: (t * t).sum(), [x])
    np.testing.assert_array_equal(x.grad, np.full((2, 2), 7.0))
    np.testing.assert_array_equal(x.data, before)


def test_rejects_float32_inputs():
    x = Tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    with pytest.raises(TypeError, match="float64"):
        gradcheck(lambda t: t * 2.0, [x])


def test_constant_inputs_are_passed_through_unchecked():
    x, c = _leaf((3,), 13), Tensor(np.array([1.0, 2.0, 3.0]))
    assert gradcheck(lambda x, c: x * c, [x, c]) is True


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(6.0).reshape(2, 3).T,
        lambda: np.asfortranarray(np.arange(6.0).reshape(3, 2)),
        lambda: np.arange(24.0).reshape(4, 6)[::2, 1::2],
    ],
    ids=["transposed", "fortran-order", "strided-view"],
)
def test_non_contiguous_inputs_are_perturbed_in_place(make):
    """Finite differences must perturb the Tensor's own array, whatever its memory layout."""
    data = make()
    x = Tensor(data, requires_grad=True)
    assert gradcheck(lambda t: t * t * 0.5 + t.sum(axis=0), [x]) is True
    np.testing.assert_array_equal(x.data, make())


def test_input_is_restored_when_fn_raises_during_finite_differences():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    calls = {"n": 0}

    def flaky(t):
        calls["n"] += 1
        if calls["n"] > 1:  # the analytic pass succeeds, the first perturbed call fails
            raise RuntimeError("boom")
        return t * t

    with pytest.raises(RuntimeError, match="boom"):
        gradcheck(flaky, [x])
    np.testing.assert_array_equal(x.data, [1.0, 2.0])
