"""nn.init.skip_init and GPT(config, init=False): no draws, no writes, this thread only."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest

import glassllm
from glassllm import Tensor, nn
from glassllm.models import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=True)


def _sentinel(shape: tuple[int, ...]) -> Tensor:
    return Tensor(np.full(shape, 7.0, dtype=np.float32), requires_grad=True)


def test_fillers_leave_arrays_and_generators_alone_inside():
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    default_before = glassllm.get_rng().bit_generator.state
    with nn.init.skip_init():
        assert nn.init.init_skipped()
        for fill in (
            lambda t: nn.init.normal_(t, rng=rng),
            lambda t: nn.init.uniform_(t, -1, 1),
            nn.init.zeros_,
            nn.init.ones_,
            lambda t: nn.init.kaiming_uniform_(t, rng=rng),
            lambda t: nn.init.xavier_normal_(t),
        ):
            t = _sentinel((4, 3))
            assert fill(t) is t
            assert (t.data == 7.0).all()
    assert not nn.init.init_skipped()
    assert rng.bit_generator.state == before
    assert glassllm.get_rng().bit_generator.state == default_before
    t = _sentinel((4, 3))
    nn.init.zeros_(t)  # outside: fills again
    assert (t.data == 0.0).all()


def test_arguments_are_still_checked_inside():
    with nn.init.skip_init(), pytest.raises(ValueError, match="std >= 0"):
        nn.init.normal_(_sentinel((2,)), std=-1.0)


def test_restored_after_an_exception_and_nested():
    with pytest.raises(RuntimeError), nn.init.skip_init():
        with nn.init.skip_init():
            pass
        assert nn.init.init_skipped()  # the inner exit restores the outer setting
        raise RuntimeError
    assert not nn.init.init_skipped()


def test_gpt_init_false_draws_nothing():
    rng = np.random.default_rng(1)
    before = rng.bit_generator.state
    default_before = glassllm.get_rng().bit_generator.state
    model = GPT(CONFIG, rng=rng, init=False)
    assert rng.bit_generator.state == before
    assert glassllm.get_rng().bit_generator.state == default_before
    # Same parameters as an initialised model, and loading a state dict makes them equal.
    reference = GPT(CONFIG, rng=np.random.default_rng(2))
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]
    model.load_state_dict(reference.state_dict())
    x = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(model(x)[0].data, reference(x)[0].data)


def test_gpt_init_false_peak_memory_is_the_model():
    config = GPTConfig(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=256)
    size = sum(p.data.nbytes for p in GPT(config, init=False).parameters())
    peaks = {}
    for init in (True, False):
        tracemalloc.start()
        model = GPT(config, rng=np.random.default_rng(0), init=init)
        peaks[init] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del model
    assert peaks[False] < 1.05 * size + 256 * 1024  # the arrays themselves, nothing drawn
    assert peaks[True] > peaks[False] + size // 8  # initialising draws temporaries


def test_skipping_holds_for_its_own_thread_only():
    entered, built = threading.Event(), threading.Event()
    results = {}

    def skipper() -> None:
        with nn.init.skip_init():
            entered.set()
            built.wait(10)
            results["skipper"] = nn.init.init_skipped()

    def builder() -> None:
        entered.wait(10)
        layer = nn.Linear(8, 4, rng=np.random.default_rng(0))
        results["builder"] = nn.init.init_skipped()
        results["weights"] = layer.weight.data.copy()
        built.set()

    threads = [threading.Thread(target=skipper), threading.Thread(target=builder)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results["skipper"] is True and results["builder"] is False
    expected = nn.Linear(8, 4, rng=np.random.default_rng(0)).weight.data
    np.testing.assert_array_equal(results["weights"], expected)
