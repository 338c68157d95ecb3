"""How ``backward`` walks the graph: accumulation, resets, shared paths, seeds,
deep chains and the lifetime of the graph itself."""

from __future__ import annotations

import gc
import sys
import time
import weakref

import numpy as np
import pytest

from glassllm import Tensor


def test_leaves_accumulate_across_backward_calls():
    w = Tensor(np.array([1.0, -2.0]), requires_grad=True)
    b = Tensor(np.array(0.5), requires_grad=True)
    loss = (w * w).sum() + b * 3.0
    loss.backward()
    np.testing.assert_allclose(w.grad, [2.0, -4.0])
    np.testing.assert_allclose(b.grad, 3.0)
    loss.backward()
    np.testing.assert_allclose(w.grad, [4.0, -8.0])
    np.testing.assert_allclose(b.grad, 6.0)
    # A second graph over the same leaves adds to what is there.
    (w.sum() * 10.0).backward()
    np.testing.assert_allclose(w.grad, [14.0, 2.0])
    np.testing.assert_allclose(b.grad, 6.0)


def test_leaf_grad_is_owned_by_the_leaf():
    """Editing a leaf's gradient in place (clipping, an optimizer) must not reach
    the seed the user passed or other nodes' gradients."""
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x + 0.0
    seed = np.array([1.0, 1.0])
    y.backward(seed)
    x.grad *= 100.0
    np.testing.assert_array_equal(seed, [1.0, 1.0])
    np.testing.assert_array_equal(y.grad, [1.0, 1.0])


def test_intermediate_grads_hold_this_traversals_value():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * x  # intermediate
    out = (h * 3.0).sum()
    out.backward()
    np.testing.assert_allclose(h.grad, [3.0, 3.0])
    np.testing.assert_allclose(out.grad, 1.0)
    # Reset at the start of the next traversal, not accumulated.
    out.backward()
    np.testing.assert_allclose(h.grad, [3.0, 3.0])
    np.testing.assert_allclose(x.grad, [12.0, 24.0])
    out.backward(np.array(2.0))
    np.testing.assert_allclose(h.grad, [6.0, 6.0])
    np.testing.assert_allclose(out.grad, 2.0)
    # A different output through the same intermediate: h.grad is that traversal's.
    other = (h * 5.0).sum()
    other.backward()
    np.testing.assert_allclose(h.grad, [5.0, 5.0])


def test_intermediate_that_gets_nothing_this_traversal_is_reset():
    """An intermediate on a path whose VJP returns None keeps no stale value."""
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * 2.0
    h.sum().backward()
    np.testing.assert_allclose(h.grad, [1.0, 1.0])
    blocked = Tensor(h.data.copy(), parents=(h,), backward=lambda g: (None,), requires_grad=True)
    blocked.sum().backward()
    assert h.grad is None or not np.any(h.grad)
    np.testing.assert_allclose(x.grad, [2.0, 2.0])  # the leaf is untouched by the blocked path


def test_intermediate_grads_have_their_shape_and_dtype():
    x = Tensor(np.ones((2, 3), dtype=np.float32), requires_grad=True)
    h = x.exp()
    s = h.sum(axis=0)
    s.sum().backward()
    for node in (h, s):
        assert node.grad.shape == node.shape
        assert node.grad.dtype == np.float32


def test_diamond_shared_path_adds_contributions():
    a = Tensor(np.array([0.5, -1.5, 2.0]), requires_grad=True)
    b = a + a
    c = b * b
    c.backward()
    np.testing.assert_allclose(a.grad, 8.0 * a.data)
    np.testing.assert_allclose(b.grad, 2.0 * b.data)


def test_many_paths_to_one_leaf():
    x = Tensor(np.array(1.5), requires_grad=True)
    y = x * x * x + x.exp() * x - x / x  # x^3 + x e^x - 1
    y.backward()
    np.testing.assert_allclose(x.grad, 3 * 1.5**2 + np.exp(1.5) * (1 + 1.5), rtol=1e-12)


def test_gradient_flows_only_to_tensors_that_require_it():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    const = Tensor(np.array([3.0, 4.0]))
    (x * const).sum().backward()
    np.testing.assert_allclose(x.grad, [3.0, 4.0])
    assert const.grad is None
    assert not const.requires_grad


def test_ops_on_constants_are_not_tracked():
    a, b = Tensor(np.ones(2)), Tensor(np.ones(2))
    c = a * b + 1.0
    assert not c.requires_grad
    assert c.parents == ()
    c.backward()  # does nothing
    assert a.grad is None and c.grad is None


@pytest.mark.parametrize(
    "seed",
    [np.ones((3, 2)), np.ones(3), np.ones((2,)), np.ones((1, 2, 3)), np.ones(()), 1.0],
    ids=["transposed", "broadcastable-row", "other-row", "extra-axis", "0-d", "python-float"],
)
def test_seed_gradient_of_wrong_shape_raises_value_error_naming_both(seed):
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    h = x * 2.0
    with pytest.raises(ValueError) as excinfo:
        h.backward(seed)
    message = str(excinfo.value)
    assert str((2, 3)) in message
    assert str(np.shape(seed)) in message
    # Nothing happened: no half-written state.
    assert x.grad is None and h.grad is None


def test_seed_gradient_for_a_scalar_output():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (x * x).sum().backward(np.array(0.5))
    np.testing.assert_allclose(x.grad, [1.0, 2.0])


def test_default_seed_differentiates_the_sum():
    x = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]]), requires_grad=True)
    (x * x).backward()
    np.testing.assert_allclose(x.grad, 2.0 * x.data)


def test_output_that_does_not_require_grad_does_nothing():
    out = Tensor(np.ones(3)) * 2.0
    out.backward()
    out.backward(np.ones(3))
    # Even a wrong seed is ignored: there is nothing to differentiate.
    out.backward(np.ones(5))
    assert out.grad is None


def test_backward_on_a_leaf_accumulates_the_seed():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    x.backward(np.array([3.0, 4.0]))
    x.backward()
    np.testing.assert_allclose(x.grad, [4.0, 5.0])


def test_a_100k_operation_chain_runs_without_recursion_error():
    assert sys.getrecursionlimit() < 100_000
    x = Tensor(np.array(1.0), requires_grad=True)
    y = x
    start = time.perf_counter()
    for _ in range(50_000):
        y = y * 1.0
        y = y + 0.5
    y.backward()
    elapsed = time.perf_counter() - start
    np.testing.assert_allclose(x.grad, 1.0)
    np.testing.assert_allclose(y.data, 1.0 + 0.5 * 50_000)
    assert elapsed < 30.0, f"100,000-op forward+backward took {elapsed:.1f} s"
    # Freeing the chain must not recurse in C either.
    del y
    gc.collect()


def _build(x: Tensor) -> tuple[Tensor, list[weakref.ref]]:
    h1 = x @ np.ones((3, 2))
    h2 = h1.tanh() * x[:, :2]
    h3 = (h2 - h2.max(axis=-1, keepdims=True)).exp()
    h4 = h3 / h3.sum(axis=-1, keepdims=True)
    loss = (h4.log() * -1.0).mean() + x.var() + (x**2.0).sqrt().reshape(-1).transpose()[0]
    nodes = [h1, h2, h3, h4, loss]
    return loss, [weakref.ref(n) for n in nodes]


@pytest.mark.parametrize("run_backward", [False, True], ids=["forward-only", "after-backward"])
def test_graph_dies_with_its_output_by_reference_counting_alone(run_backward):
    """With the cycle collector off, dropping the last reference to the output
    frees every node: no reference cycles (an op capturing its own output in its
    VJP would make one)."""
    x = Tensor(np.linspace(-1.0, 1.0, 6).reshape(2, 3), requires_grad=True)
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        loss, refs = _build(x)
        if run_backward:
            loss.backward()
        assert all(r() is not None for r in refs)
        del loss
        alive = [i for i, r in enumerate(refs) if r() is not None]
        assert alive == [], f"nodes {alive} outlived their output"
    finally:
        if was_enabled:
            gc.enable()
    if run_backward:
        assert x.grad is not None and x.grad.shape == (2, 3)


def test_graph_dies_after_a_custom_op_built_with_the_constructor():
    x = Tensor(np.array([0.5, 1.0]), requires_grad=True)
    was_enabled = gc.isenabled()
    gc.disable()
    try:

        def backward(g):
            return (g * np.cos(x.data),)

        y = Tensor(np.sin(x.data), parents=(x,), backward=backward, requires_grad=True)
        z = y.sum()
        z.backward()
        refs = [weakref.ref(y), weakref.ref(z)]
        del y, z, backward
        assert all(r() is None for r in refs)
    finally:
        if was_enabled:
            gc.enable()
    np.testing.assert_allclose(x.grad, np.cos([0.5, 1.0]))


def test_leaf_does_not_keep_its_consumers_alive():
    x = Tensor(np.ones(3), requires_grad=True)
    y = x * 2.0
    ref = weakref.ref(y)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del y
        assert ref() is None
        assert x.parents == ()
    finally:
        if was_enabled:
            gc.enable()


def test_backward_returning_wrong_number_of_gradients_is_reported():
    x = Tensor(np.ones(2), requires_grad=True)
    y = Tensor(x.data * 2, parents=(x,), backward=lambda g: (g, g), requires_grad=True)
    with pytest.raises(ValueError):
        y.backward()


def test_backward_returning_wrong_shape_is_reported():
    x = Tensor(np.ones(2), requires_grad=True)
    y = Tensor(x.data.sum(), parents=(x,), backward=lambda g: (np.ones(3),), requires_grad=True)
    with pytest.raises(ValueError, match=r"\(3,\)"):
        y.backward()


def test_failed_backward_changes_no_gradient():
    """A VJP that raises half-way leaves every leaf and intermediate .grad as it was."""
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    b = Tensor(np.array([3.0, 4.0]), requires_grad=True)
    a.grad = np.array([10.0, 10.0])
    hidden = a * 2.0
    hidden.backward()  # hidden now holds a gradient of its own
    a.grad = np.array([10.0, 10.0])

    def broken(g):
        raise RuntimeError("broken backward")

    # b's contribution is reached first (it is the direct parent); the broken op
    # sits on the path to a.
    bad = Tensor(hidden.data, parents=(hidden,), backward=broken, requires_grad=True)
    out = bad * b
    with pytest.raises(RuntimeError, match="broken backward"):
        out.backward()
    assert b.grad is None
    np.testing.assert_array_equal(a.grad, [10.0, 10.0])
    np.testing.assert_array_equal(hidden.grad, [1.0, 1.0])


def test_wrong_gradient_names_the_operation():
    x = Tensor(np.ones(2), requires_grad=True)

    def my_custom_backward(g):
        return (np.ones(3),)

    y = Tensor(x.data.sum(), parents=(x,), backward=my_custom_backward, requires_grad=True)
    with pytest.raises(ValueError, match="my_custom_backward"):
        y.backward()
    assert x.grad is None


def test_gpt_graph_dies_with_its_loss_by_reference_counting_alone():
    """The whole tiny GPT graph (fused ops, attention, tied head) has no cycles."""
    from glassllm.models import GPT, GPTConfig

    model = GPT(
        GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8),
        rng=np.random.default_rng(0),
    )
    idx = np.random.default_rng(1).integers(0, 11, size=(2, 8))
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        logits, loss = model(idx, idx)
        loss.backward()
        refs, stack, seen = [], [loss], set()
        while stack:  # every non-leaf node of the graph
            node = stack.pop()
            if id(node) in seen or not node.parents:
                continue
            seen.add(id(node))
            refs.append(weakref.ref(node))
            stack.extend(node.parents)
        del node, stack
        assert len(refs) > 20
        del logits, loss
        alive = sum(r() is not None for r in refs)
        assert alive == 0, f"{alive} of {len(refs)} graph nodes outlived the loss"
    finally:
        if was_enabled:
            gc.enable()


def _chain_recording_whether_downstream_grads_are_alive(retain: bool) -> tuple[list, Tensor]:
    """x -> a -> b -> loss with custom ops; b's VJP records whether the gradient that loss's
    VJP handed to b is still alive when a's VJP runs (it is, if the engine retains it)."""
    seen: list = []
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)

    def op(parent: Tensor, factor: float, record: bool) -> Tensor:
        def backward(g: np.ndarray) -> tuple:
            if record:  # the first op in the chain: runs last in the traversal
                seen.append(refs[-1]() is not None)  # the gradient b received
            else:
                refs.append(weakref.ref(g))
            return (g * factor,)

        return Tensor.from_op(parent.data * factor, (parent,), backward)

    refs: list = []
    a = op(x, 2.0, record=True)
    b = op(a, 3.0, record=False)
    loss = op(b, 5.0, record=False)
    loss.backward(np.ones(2), retain_intermediate_grads=retain)
    return seen, a


@pytest.mark.parametrize("retain", [True, False])
def test_retain_intermediate_grads_false_frees_them_during_the_traversal(retain):
    seen, a = _chain_recording_whether_downstream_grads_are_alive(retain)
    assert seen == [retain]  # with False, b's incoming gradient is gone before a's VJP runs
    assert (a.grad is not None) == retain


def test_retain_intermediate_grads_false_gives_the_same_leaf_grads():
    x = Tensor(np.array([0.5, -1.0, 2.0], dtype=np.float32), requires_grad=True)
    grads = []
    for retain in (True, False):
        x.grad = None
        h = x * x
        out = (h * h + h).sum()
        out.backward(retain_intermediate_grads=retain)
        grads.append(x.grad.copy())
        assert (h.grad is not None) == retain and (out.grad is not None) == retain
    np.testing.assert_array_equal(grads[0], grads[1])


def _chain_recording_what_is_alive(retain_graph: bool) -> tuple[list, Tensor, Tensor]:
    """x -> a -> b -> c -> loss, each a custom op that saves an array for its VJP; a's VJP (the
    last to run) records whether b's saved array and b's result are still alive. Only x and the
    loss are held here, as a training step holds them."""
    seen: list = []
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)

    def op(parent: Tensor, factor: float) -> Tensor:
        saved = parent.data * factor  # what a real op keeps for its VJP (here: unused copy)

        def backward(g: np.ndarray) -> tuple:
            if parent is x:  # op a: everything downstream has been passed back
                seen.append((refs["saved_b"]() is not None, refs["result_b"]() is not None))
            return (g * factor + 0.0 * saved,)

        out = Tensor.from_op(parent.data * factor, (parent,), backward)
        refs.setdefault("saved_next", saved)
        return out

    refs: dict = {}
    a = op(x, 2.0)
    refs.pop("saved_next")
    b = op(a, 3.0)
    refs["saved_b"] = weakref.ref(refs.pop("saved_next"))
    refs["result_b"] = weakref.ref(b.data)
    loss = op(op(b, 5.0), 7.0).sum()
    del a, b
    loss.backward(retain_intermediate_grads=False, retain_graph=retain_graph)
    return seen, x, loss


@pytest.mark.parametrize("retain_graph", [True, False])
def test_retain_graph_false_frees_what_each_op_saved_during_the_traversal(retain_graph):
    seen, x, _ = _chain_recording_what_is_alive(retain_graph)
    # consumed: b's saved array and its result are gone before a's VJP runs; kept: both alive
    assert seen == [(retain_graph, retain_graph)]
    np.testing.assert_array_equal(x.grad, [210.0, 210.0])


def test_a_consumed_graph_refuses_a_second_backward_and_changes_no_grad():
    _, x, loss = _chain_recording_what_is_alive(retain_graph=False)
    assert loss.parents == ()
    with pytest.raises(RuntimeError, match=r"retain_graph=False.*retain_graph=True"):
        loss.backward()
    np.testing.assert_array_equal(x.grad, [210.0, 210.0])


@pytest.mark.parametrize("retain_intermediate_grads", [True, False])
def test_retain_graph_false_gives_the_same_grads(retain_intermediate_grads):
    """Shared paths (h is used three times), broadcasting and a leaf used twice."""
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = Tensor(rng.standard_normal(4), requires_grad=True)
    grads = []
    for retain_graph in (True, False):
        x.grad = w.grad = None
        h = x * w
        out = ((h * h).sum(axis=0) + h.sum(axis=0) * w).sum() + h.max()
        out.backward(retain_intermediate_grads=retain_intermediate_grads, retain_graph=retain_graph)
        grads.append((x.grad.copy(), w.grad.copy(), None if h.grad is None else h.grad.copy()))
        assert (h.grad is not None) == retain_intermediate_grads
    for kept, consumed in zip(*grads, strict=True):
        np.testing.assert_array_equal(kept, consumed)


def test_a_consumed_result_is_not_taken_for_a_parameter():
    """Module registers a Tensor as a parameter when it is a leaf; a consumed intermediate has
    no parents left but is not a leaf."""
    from glassllm.nn import Module

    w = Tensor(np.ones(2), requires_grad=True)
    h = w * 2.0
    h.sum().backward(retain_graph=False)
    module = Module()
    module.cached = h
    assert list(module.parameters()) == [] and module.cached is h


def test_consuming_the_graph_frees_a_gpt_forward_during_its_backward():
    """What a training step gains from retain_graph=False: the forward's arrays are freed as the
    backward passes them (bytes as tracemalloc counts NumPy's buffers), so the traversal's peak
    rises less above the end of the forward, and nothing of the forward is left at its end but
    the logits the caller holds."""
    import tracemalloc

    from glassllm.models import GPT, GPTConfig

    config = GPTConfig(vocab_size=11, block_size=32, n_layer=4, n_head=2, n_embd=32)
    model = GPT(config, rng=np.random.default_rng(0))
    idx = np.random.default_rng(1).integers(0, 11, size=(8, 32))
    seen = {}
    for retain_graph in (True, False):
        model.zero_grad()
        tracemalloc.start()
        try:
            logits, loss = model(idx, idx)
            forward = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            loss.backward(retain_intermediate_grads=False, retain_graph=retain_graph)
            left, peak = tracemalloc.get_traced_memory()
            grads = sum(p.grad.nbytes for p in model.parameters())
            seen[retain_graph] = (peak - forward, left - grads - logits.data.nbytes, forward)
        finally:
            tracemalloc.stop()
        del logits, loss
    (rise_kept, left_kept, forward), (rise_consumed, left_consumed, _) = seen[True], seen[False]
    assert left_kept > 0.9 * forward and left_consumed < 0.1 * forward, seen
    assert rise_consumed < 0.8 * rise_kept, seen


def test_a_failing_vjp_under_retain_graph_false_is_named_and_changes_no_grad():
    """The failing node keeps its graph and its name; the nodes passed before it are consumed;
    no .grad moves."""
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    x.grad = np.array([5.0, 5.0])

    def my_op_vjp(g):
        return (np.ones(3),)  # the wrong shape

    bad = Tensor.from_op(x.data * 2, (x,), my_op_vjp)
    loss = (bad * 3.0).sum()
    with pytest.raises(ValueError, match="my_op_vjp"):
        loss.backward(retain_graph=False)
    np.testing.assert_array_equal(x.grad, [5.0, 5.0])
    assert bad._backward is my_op_vjp and bad.parents == (x,)
    with pytest.raises(RuntimeError, match="retain_graph=False"):
        loss.backward()  # the sum and the product were consumed


def test_exporting_a_consumed_graph_is_an_error():
    from glassllm.graph import export_graph

    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = (x * x).sum()
    export_graph(y)  # a live graph exports
    y.backward(retain_graph=False)
    with pytest.raises(ValueError, match="consumed"):
        export_graph(y)
