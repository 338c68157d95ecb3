"""The shared argument checks (glassllm._checks) and the messages the library shows with them."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import glassllm.functional as F
import glassllm.nn as nn
from glassllm import Tensor, _checks
from glassllm.optim.lr_scheduler import cosine_with_warmup, step_decay


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3)])
def test_check_int_accepts_python_and_numpy_integers_as_int(value):
    result = _checks.check_int("n", value, min=1)
    assert result == 3 and type(result) is int


@pytest.mark.parametrize(
    "value, minimum, message",
    [
        (True, 1, "n must be a positive integer, got True"),
        (np.bool_(True), None, "n must be an integer, got np.True_"),
        (0, 1, "n must be a positive integer, got 0"),
        (2.0, None, "n must be an integer, got 2.0"),
        ("3", 0, "n must be an integer >= 0, got '3'"),
        (-1, 0, "n must be an integer >= 0, got -1"),
        (4, 5, "n must be an integer >= 5, got 4"),
    ],
)
def test_check_int_refuses_with_one_message(value, minimum, message):
    with pytest.raises(ValueError) as info:
        _checks.check_int("n", value, min=minimum)
    assert str(info.value) == message


def test_check_float_refuses_non_numbers_and_non_finite_values():
    assert _checks.check_float("lr", np.float32(0.5)) == 0.5
    assert type(_checks.check_float("lr", 2)) is float
    for value in (True, "1", None, [1.0]):
        with pytest.raises(TypeError, match="lr must be a number"):
            _checks.check_float("lr", value)
    for value in (float("inf"), float("nan"), 10**400):
        with pytest.raises(ValueError, match="lr must be finite"):
            _checks.check_float("lr", value)


def test_check_probability_and_generator():
    assert _checks.check_probability("p", 1) == 1.0
    with pytest.raises(TypeError, match=r"p must be a number in \[0, 1\], got False"):
        _checks.check_probability("p", False)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\], got 1.5"):
        _checks.check_probability("p", 1.5)
    rng = np.random.default_rng(0)
    assert _checks.check_generator("rng", rng) is rng
    assert _checks.check_generator("rng", None) is None
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator or None, got int"):
        _checks.check_generator("rng", 0)
    assert _checks.check_float_dtype("float32") == np.float32
    with pytest.raises(TypeError, match="floating dtype"):
        _checks.check_float_dtype(np.int32)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: nn.Linear(True, 3), ValueError, "in_features must be a positive integer, got Tr"),
        (lambda: nn.Embedding(4, 0), ValueError, "embedding_dim must be a positive integer"),
        (lambda: nn.LayerNorm(2.0), ValueError, "dim must be a positive integer, got 2.0"),
        (lambda: nn.Linear(2, 3, dtype=np.int64), TypeError, "floating dtype"),
        (lambda: nn.Dropout(2.0), ValueError, "dropout probability p must be in [0, 1]"),
        (lambda: nn.Dropout(0.1, rng=1), TypeError, "rng must be a numpy.random.Generator"),
        (lambda: F.dropout(Tensor(np.ones(2)), True), TypeError, "dropout: p must be a number"),
        (
            lambda: F.packed_attention(Tensor(np.ones((1, 2, 6))), num_heads=True),
            ValueError,
            "attention: num_heads must be a positive integer, got True",
        ),
        (lambda: nn.KVCache(True), ValueError, "capacity must be a positive integer or None"),
        (lambda: step_decay(3, 1.0, step_size=0), ValueError, "step_size must be a positive"),
        (
            lambda: cosine_with_warmup(-1, 1.0, 0.1, 2, 6),
            ValueError,
            "the iteration must be an integer >= 0, got -1",
        ),
        (
            lambda: cosine_with_warmup(0, 1.0, 0.1, False, 6),
            ValueError,
            "warmup_iters must be an integer >= 0, got False",
        ),
    ],
)
def test_library_arguments_are_checked_by_the_shared_checks(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)


def test_docstring_examples():
    assert doctest.testmod(_checks).failed == 0
