"""Module forward hooks and HookPoint: PyTorch's register_forward_hook / register_forward_pre_hook
as the oracle (order, replacement, removal, prepend, exceptions), gradients through a
replacement against finite differences, and the empty path doing nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import optional

import glassllm.nn as nn
from glassllm import Tensor, gradcheck
from glassllm.nn.hooks import HookPoint, RemovableHandle


class Triple(nn.Module):
    def forward(self, x, y=None):
        return x * 3.0 if y is None else x * 3.0 + y


def _script(seed: int) -> list[tuple]:
    """A random sequence of registrations, removals and calls, the same for both libraries."""
    rng = random.Random(seed)
    steps: list[tuple] = []
    registered = 0
    for _ in range(12):
        action = rng.choice(["fwd", "fwd", "pre", "pre", "remove", "call"])
        if action == "remove" and registered:
            steps.append(("remove", rng.randrange(registered)))
        elif action in ("fwd", "pre"):
            kind = rng.choice(["record", "add", "tuple" if action == "pre" else "add", "single"])
            steps.append((action, kind, rng.choice([1.0, 2.0, 5.0]), rng.random() < 0.3))
            registered += 1
        else:
            steps.append(("call",))
    return [*steps, ("call",)]


def _run(script: list[tuple], module, wrap, unwrap) -> list:
    """Play ``script`` on ``module``; the log of every hook call and every output, as floats."""
    log: list = []
    handles = []
    for number, step in enumerate(script):
        if step[0] in ("fwd", "pre"):
            action, kind, c, prepend = step

            def hook(mod, args, *out, kind=kind, c=c, number=number, action=action):
                seen = [unwrap(a) for a in args] + [unwrap(o) for o in out]
                log.append((number, action, seen))
                if kind == "record":
                    return None
                if action == "fwd":
                    return out[0] + c if kind == "add" else out[0] * c
                if kind == "tuple":
                    return (args[0] + c,)
                return args[0] * c  # a single value: wrapped into a 1-tuple

            name = "register_forward_hook" if action == "fwd" else "register_forward_pre_hook"
            handles.append(getattr(module, name)(hook, prepend=prepend))
        elif step[0] == "remove":
            handles[step[1]].remove()
            handles[step[1]].remove()  # twice: a no-op
        else:
            log.append(("output", unwrap(module(wrap(2.0)))))
    return log


@pytest.mark.parametrize("seed", range(25))
def test_hooks_follow_torch_register_forward_hook(seed):
    torch = optional("torch")

    class TorchTriple(torch.nn.Module):
        def forward(self, x):
            return x * 3.0

    script = _script(seed)
    ours = _run(script, Triple(), lambda v: Tensor(np.float64(v)), lambda t: float(t.data))
    theirs = _run(
        script, TorchTriple(), lambda v: torch.tensor(v, dtype=torch.float64), lambda t: float(t)
    )
    assert ours == theirs


def test_an_exception_in_a_hook_propagates_and_leaves_the_hooks_as_they_were():
    torch = optional("torch")

    def boom(*_):
        raise RuntimeError("boom")

    for module, x in ((Triple(), Tensor(1.0)), (torch.nn.Identity(), torch.tensor(1.0))):
        module.register_forward_hook(boom)
        with pytest.raises(RuntimeError, match="boom"):
            module(x)
        assert len(module._forward_hooks) == 1  # torch keeps it too: removal is the caller's


def test_keyword_arguments_reach_forward_but_not_the_hooks():
    seen = []
    module = Triple()
    module.register_forward_pre_hook(lambda mod, args: seen.append(len(args)))
    out = module(Tensor(1.0), y=Tensor(4.0))
    assert float(out.data) == 7.0 and seen == [1]


def test_a_hook_may_remove_itself_while_running():
    module = Triple()
    calls = []
    handle: RemovableHandle | None = None

    def once(mod, args, out):
        calls.append(1)
        handle.remove()

    handle = module.register_forward_hook(once)
    module(Tensor(1.0))
    module(Tensor(1.0))
    assert calls == [1] and not module._forward_hooks


def test_a_handle_as_a_context_manager_removes_its_hook():
    module = Triple()
    with module.register_forward_hook(lambda m, a, o: o * 0.0):
        assert float(module(Tensor(2.0)).data) == 0.0
    assert float(module(Tensor(2.0)).data) == 6.0


def test_the_class_default_is_never_written_to():
    one, other = Triple(), Triple()
    one.register_forward_hook(lambda m, a, o: None)
    assert nn.Module._forward_hooks == {} and Triple._forward_hooks == {}
    assert "_forward_hooks" not in other.__dict__ and len(one._forward_hooks) == 1


def test_a_hook_must_be_callable():
    with pytest.raises(TypeError, match="callable"):
        Triple().register_forward_hook("not a function")


def test_gradients_flow_through_a_replacement_as_through_any_op():
    linear = nn.Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(0))
    linear.register_forward_hook(lambda m, args, out: out * out + args[0][..., :2])
    x = Tensor(np.random.default_rng(1).standard_normal((4, 3)), requires_grad=True)
    assert gradcheck(lambda t, *_: linear(t), [x, linear.weight, linear.bias])


def test_a_pre_hook_replacement_is_differentiated_too():
    linear = nn.Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(0))
    linear.register_forward_pre_hook(lambda m, args: args[0].tanh())
    x = Tensor(np.random.default_rng(1).standard_normal((4, 3)), requires_grad=True)
    assert gradcheck(lambda t: linear(t), [x])


def test_hook_point_is_the_identity_and_hidden_from_repr():
    point = HookPoint()
    x = Tensor(np.ones(2))
    assert point(x) is x and not point.active
    norm = nn.LayerNorm(4)
    assert repr(norm) == (
        "LayerNorm(4, eps=1e-05, bias=True, dtype=float32)  # weight (4,), bias (4,): 8 parameters"
    )


@pytest.mark.parametrize("norm_class", [nn.LayerNorm, nn.RMSNorm])
def test_norm_hook_points_show_scale_and_normalized_and_keep_the_fused_output(norm_class):
    norm = norm_class(5)
    rng = np.random.default_rng(0)
    norm.weight.data[...] = rng.uniform(0.5, 1.5, 5)
    x = Tensor(rng.standard_normal((2, 3, 5)).astype(np.float32))
    plain = norm(x).data
    seen = {}
    for name in ("hook_scale", "hook_normalized"):
        getattr(norm, name).register_forward_hook(
            lambda m, a, out, name=name: seen.__setitem__(name, out.data)
        )
    assert np.array_equal(norm(x).data, plain)  # read only: the fused op's very numbers
    centred = x.data - x.data.mean(-1, keepdims=True) if norm_class is nn.LayerNorm else x.data
    scale = np.sqrt((centred**2).mean(-1, keepdims=True) + norm.eps)
    np.testing.assert_allclose(seen["hook_scale"], scale, rtol=1e-6)
    np.testing.assert_allclose(seen["hook_normalized"], centred / scale, rtol=1e-5, atol=1e-6)
    norm.hook_normalized.register_forward_hook(lambda m, a, out: out * 0.0)
    expected = 0.0 if norm_class is nn.RMSNorm else norm.bias.data
    np.testing.assert_array_equal(norm(x).data, np.broadcast_to(expected, plain.shape))


def test_norm_hooks_differentiate_through_a_replaced_scale():
    norm = nn.LayerNorm(4, dtype=np.float64)
    norm.hook_scale.register_forward_hook(lambda m, a, scale: scale * 2.0)
    x = Tensor(np.random.default_rng(0).standard_normal((3, 4)), requires_grad=True)
    assert gradcheck(lambda t, *_: norm(t), [x, norm.weight])


def test_a_hook_point_attribute_is_registered_read_fast_and_removable():
    module = Triple()
    module.point = HookPoint()
    assert module.__dict__["point"] is module._modules["point"]  # no __getattr__ per forward
    del module.point
    assert "point" not in module.__dict__ and "point" not in module._modules
    module.point = HookPoint()
    module.point = None  # a plain attribute now, no longer a child
    assert module.point is None and "point" not in module._modules


def test_the_count_of_point_hooks_follows_registration_and_removal():
    from glassllm.nn import hooks

    before = hooks._point_hooks
    point = HookPoint()
    handle = point.register_forward_hook(lambda m, a, o: None)
    Triple().register_forward_hook(lambda m, a, o: None)  # not a point: not counted
    assert hooks._point_hooks == before + 1 and hooks.any_active((point,))
    handle.remove()
    handle.remove()
    assert hooks._point_hooks == before and not hooks.any_active((point,))
