"""Module: registration by assignment, traversal order, modes, state dicts, atomic loading."""

from __future__ import annotations

import numpy as np
import pytest

import glassllm.nn as nn
from glassllm import Tensor


def param(*shape: int, value: float = 0.0, dtype=np.float32) -> Tensor:
    return Tensor(np.full(shape, value, dtype=dtype), requires_grad=True)


class Affine(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = param(n, n, value=1.0)
        self.bias = param(n)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


class Block(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.attn = Affine(n)
        self.mlp = nn.Sequential(Affine(n), nn.ReLU(), Affine(n))


class Net(nn.Module):
    """Own parameter, a ModuleList of blocks, and a head tied to the first block's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = param(3, value=1.0)
        self.blocks = nn.ModuleList([Block(3), Block(3)])
        self.head = Affine(3)
        self.head.weight = self.blocks[0].attn.weight  # tied


HAND_ORDER = [
    "scale",
    "blocks.0.attn.weight",
    "blocks.0.attn.bias",
    "blocks.0.mlp.0.weight",
    "blocks.0.mlp.0.bias",
    "blocks.0.mlp.2.weight",
    "blocks.0.mlp.2.bias",
    "blocks.1.attn.weight",
    "blocks.1.attn.bias",
    "blocks.1.mlp.0.weight",
    "blocks.1.mlp.0.bias",
    "blocks.1.mlp.2.weight",
    "blocks.1.mlp.2.bias",
    "head.bias",  # head.weight is blocks.0.attn.weight: listed once, under its first name
]


# ----------------------------------------------------------------------------- registration


def test_named_parameters_follow_pytorch_order_and_visit_tied_weights_once():
    net = Net()
    assert [name for name, _ in net.named_parameters()] == HAND_ORDER
    params = list(net.parameters())
    assert len(params) == len({id(p) for p in params}) == len(HAND_ORDER)
    assert net.num_parameters() == sum(p.size for p in params) == 3 + 2 * (3 * 12) + 3


def test_named_modules_children_and_module_list_names():
    net = Net()
    names = [name for name, _ in net.named_modules()]
    assert names[:4] == ["", "blocks", "blocks.0", "blocks.0.attn"]
    assert "blocks.1.mlp.1" in names and names[-1] == "head"
    assert [name for name, _ in net.named_children()] == ["blocks", "head"]
    assert list(net.children())[0] is net.blocks
    assert len(list(net.modules())) == len(names)
    shared = Affine(2)
    twice = nn.Sequential(shared, shared)
    assert [name for name, _ in twice.named_modules()] == ["", "0"]
    assert [name for name, _ in twice.named_parameters()] == ["0.weight", "0.bias"]


def test_non_grad_tensor_and_other_values_are_plain_attributes():
    module = nn.Module()
    module.constant = Tensor(np.ones(2))  # requires_grad False: not a parameter
    module.note = "hello"
    module.derived = param(2) * 2.0  # an operation's result, not a leaf: not a parameter
    assert module.derived.requires_grad
    assert list(module.named_parameters()) == [] and module.constant.shape == (2,)
    assert module.state_dict() == {}


def test_reassignment_replaces_registration_and_delete_removes_it():
    module = Affine(2)
    module.bias = None  # parameter -> plain attribute
    assert [name for name, _ in module.named_parameters()] == ["weight"]
    assert module.bias is None
    module.bias = Affine(1)  # plain attribute -> child
    assert [name for name, _ in module.named_children()] == ["bias"]
    assert "bias" not in module.__dict__
    module.bias = param(2)  # child -> parameter
    assert list(module.children()) == []
    assert [name for name, _ in module.named_parameters()] == ["weight", "bias"]
    new_weight = param(2, 2, value=5.0)
    module.weight = new_weight  # same kind: keeps its place in the order
    assert [name for name, _ in module.named_parameters()] == ["weight", "bias"]
    assert module.weight is new_weight
    del module.weight
    assert [name for name, _ in module.named_parameters()] == ["bias"]
    with pytest.raises(AttributeError):
        _ = module.weight
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = module.missing


def test_assigning_before_super_init_names_the_fix():
    class Forgetful(nn.Module):
        def __init__(self) -> None:
            self.weight = param(2)

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Forgetful()


def test_buffers_are_never_parameters_and_persist_only_when_asked():
    module = Affine(2)
    module.register_buffer("mask", np.tril(np.ones((2, 2), dtype=bool)))
    module.register_buffer("running", np.zeros(2, dtype=np.float32), persistent=True)
    assert [name for name, _ in module.named_parameters()] == ["weight", "bias"]
    assert [name for name, _ in module.named_buffers()] == ["mask", "running"]
    assert list(module.state_dict()) == ["weight", "bias", "running"]
    module.mask = np.ones((2, 2), dtype=bool)  # updating a buffer keeps it a buffer
    assert module._buffers["mask"] is module.mask
    running = module.running
    state = module.state_dict()
    state["running"] = np.array([1.0, 2.0], dtype=np.float32)
    module.load_state_dict(state)
    assert module.running is running and running.tolist() == [1.0, 2.0]  # copied in place
    with pytest.raises(KeyError, match="parameter already has that name"):
        module.register_buffer("weight", np.zeros(1))
    with pytest.raises(TypeError, match="ndarray"):
        module.register_buffer("bad", [1, 2])


def test_train_eval_propagate_and_zero_grad_clears():
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(TypeError):
        net.train("no")
    for p in net.parameters():
        p.grad = np.ones_like(p.data)
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_call_runs_forward_and_base_forward_is_not_implemented():
    layer = Affine(2)
    out = layer(Tensor(np.ones((1, 2), dtype=np.float32)))
    np.testing.assert_array_equal(out.data, [[2.0, 2.0]])
    with pytest.raises(NotImplementedError):
        nn.Module()(1)
    with pytest.raises(NotImplementedError, match="iterate"):
        nn.ModuleList([layer])(1)


def test_module_list_operations():
    blocks = nn.ModuleList()
    first, second, third = Affine(1), Affine(1), Affine(1)
    assert blocks.append(first) is blocks
    blocks.extend([second])
    blocks.insert(0, third)
    assert list(blocks) == [third, first, second] and len(blocks) == 3
    assert blocks[-1] is second and blocks[0] is third
    assert list(blocks[1:]) == [first, second]
    blocks[1] = Affine(1)
    assert blocks[1] is not first
    assert [name for name, _ in blocks.named_children()] == ["0", "1", "2"]
    with pytest.raises(IndexError):
        blocks[3]
    with pytest.raises(TypeError, match="holds Modules"):
        blocks.extend([Affine(1), "not a module"])
    assert len(blocks) == 3  # the failed extend added nothing


def test_sequential_chains_and_accepts_names():
    seq = nn.Sequential({"double": Affine(2), "act": nn.ReLU()})
    assert [name for name, _ in seq.named_children()] == ["double", "act"]
    out = seq(Tensor(np.array([[-3.0, 1.0]], dtype=np.float32)))
    np.testing.assert_array_equal(out.data, [[0.0, 0.0]])
    assert len(seq) == 2 and seq[-1] is list(seq)[1]
    with pytest.raises(TypeError):
        nn.Sequential(Affine(1), 3)


def test_repr_shows_tree_shapes_and_counts():
    text = repr(Net())
    assert text.startswith("Net(  # own: scale (3,)")
    assert "(blocks): ModuleList(" in text
    assert "(attn): Affine()  # weight (3, 3), bias (3,): 12 parameters" in text
    assert "(1): ReLU()" in text
    assert text.endswith(f")  # {Net().num_parameters():,} parameters in total")
    linear = "Linear(in_features=4, out_features=2, bias=True, dtype=float32)"
    assert linear in repr(nn.Linear(4, 2))


def test_apply_visits_every_module():
    seen = []
    Net().apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen.count("Affine") == 7


# ----------------------------------------------------------------------------- state dicts


def filled(net: nn.Module, seed: int) -> nn.Module:
    rng = np.random.default_rng(seed)
    for p in net.parameters():
        p.data[...] = rng.standard_normal(p.shape, dtype=np.float32)
    return net


def test_state_dict_copies_and_stores_tied_weights_once():
    net = filled(Net(), 0)
    state = net.state_dict()
    assert list(state) == HAND_ORDER
    assert "head.weight" not in state
    for name, p in net.named_parameters():
        assert state[name].dtype == p.dtype and state[name] is not p.data
        np.testing.assert_array_equal(state[name], p.data)
    net.scale.data[...] = 7.0
    assert not np.any(state["scale"] == 7.0)  # a copy, not a view


def test_round_trip_into_fresh_model_copies_in_place_and_keeps_ties():
    source, target = filled(Net(), 1), Net()
    arrays_before = {name: p.data for name, p in target.named_parameters()}
    state = source.state_dict()
    result = target.load_state_dict(state)
    assert result == nn.IncompatibleKeys([], [])
    missing, unexpected = result
    assert missing == [] and unexpected == []
    for name, p in target.named_parameters():
        assert p.data is arrays_before[name]  # same arrays, new values
        np.testing.assert_array_equal(p.data, state[name])
        assert not np.shares_memory(p.data, state[name])  # caller's arrays not kept
    assert target.head.weight is target.blocks[0].attn.weight
    np.testing.assert_array_equal(target.head.weight.data, state["blocks.0.attn.weight"])
    state["scale"][...] = 123.0
    assert not np.any(target.scale.data == 123.0)


def test_strict_load_reports_every_problem_at_once_and_changes_nothing():
    net = filled(Net(), 2)
    before = {name: p.data.copy() for name, p in net.named_parameters()}
    state = filled(Net(), 3).state_dict()
    state["scale"] = np.zeros(4, dtype=np.float32)  # shape
    state["blocks.0.attn.bias"] = state["blocks.0.attn.bias"].astype(np.float64)  # dtype
    state["blocks.1.attn.bias"] = [0.0, 0.0, 0.0]  # not an array
    del state["head.bias"]  # missing
    state["extra.weight"] = np.zeros(1, dtype=np.float32)  # unexpected
    state["head.weight"] = state["blocks.0.attn.weight"]  # tied alias: unexpected, explained
    with pytest.raises(ValueError) as error:
        net.load_state_dict(state)
    message = str(error.value)
    for fragment in (
        "nothing was changed",
        "scale: shape mismatch, checkpoint (4,) vs model (3,)",
        "blocks.0.attn.bias: dtype mismatch, checkpoint float64 vs model float32",
        "blocks.1.attn.bias: expected a numpy ndarray, got list",
        "missing keys: head.bias",
        "extra.weight",
        "head.weight (tied to blocks.0.attn.weight",
    ):
        assert fragment in message
    for name, p in net.named_parameters():
        np.testing.assert_array_equal(p.data, before[name])


def test_non_strict_load_loads_matches_and_returns_the_rest():
    net = Net()
    state = filled(Net(), 4).state_dict()
    del state["head.bias"]
    state["extra"] = np.zeros(1, dtype=np.float32)
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert missing == ["head.bias"] and unexpected == ["extra"]
    np.testing.assert_array_equal(net.scale.data, state["scale"])
    bad = dict(state, scale=np.zeros(2, dtype=np.float32))
    with pytest.raises(ValueError, match="shape mismatch"):
        net.load_state_dict(bad, strict=False)  # shapes are never tolerated
    with pytest.raises(TypeError, match="mapping"):
        net.load_state_dict([("scale", state["scale"])])


def test_load_float64_model():
    layer = nn.Linear(2, 3, dtype=np.float64)
    state = {name: np.ones_like(array) for name, array in layer.state_dict().items()}
    layer.load_state_dict(state)
    assert layer.weight.dtype == np.float64 and layer.weight.data.sum() == 6.0


def test_zero_grad_accepts_torch_set_to_none():
    net = nn.Linear(2, 3)
    net.weight.grad = np.ones((2, 3), dtype=np.float32)
    net.bias.grad = np.broadcast_to(np.float32(1.0), (3,))  # read-only: replaced, not written
    grad_array = net.weight.grad
    net.zero_grad(set_to_none=False)
    assert net.weight.grad is grad_array and not net.weight.grad.any()
    assert net.bias.grad.dtype == np.float32 and not net.bias.grad.any()
    net.zero_grad(set_to_none=True)
    assert net.weight.grad is None and net.bias.grad is None


def test_check_state_dict_lists_the_problems_load_would_raise_and_changes_nothing():
    net = filled(Net(), 2)
    good = filled(Net(), 3).state_dict()
    assert net.check_state_dict(good) == []
    bad = dict(good, scale=np.zeros(4, dtype=np.float32), extra=np.zeros(1, dtype=np.float32))
    del bad["head.bias"]
    problems = net.check_state_dict(bad)
    assert problems == [
        "scale: shape mismatch, checkpoint (4,) vs model (3,)",
        "missing keys: head.bias",
        "unexpected keys: extra",
    ]
    assert net.check_state_dict(bad, strict=False) == problems[:1]
    with pytest.raises(ValueError) as error:
        net.load_state_dict(bad)
    assert str(error.value).endswith("\n  ".join([""] + problems))
    np.testing.assert_array_equal(net.scale.data, filled(Net(), 2).scale.data)
    with pytest.raises(TypeError, match="mapping"):
        net.check_state_dict([("scale", good["scale"])])


# ---------------------------------------------------------------------- eval mode, then back


def _mixed_tree():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout(0.5), nn.Linear(2, 2)))
    model[1][0].eval()  # a mixed tree: one dropout already in eval mode
    return model, [m.training for m in model.modules()]


def test_evaluating_sets_eval_mode_and_restores_mixed_modes():
    model, before = _mixed_tree()
    assert before == [True, True, True, False, True]
    with model.evaluating():
        assert [m.training for m in model.modules()] == [False] * 5
    assert [m.training for m in model.modules()] == before


def test_evaluating_restores_modes_when_the_body_raises():
    model, before = _mixed_tree()
    with pytest.raises(RuntimeError, match="boom"), model.evaluating():
        raise RuntimeError("boom")
    assert [m.training for m in model.modules()] == before


def test_eval_mode_takes_a_module_list_and_touches_only_it():
    model, before = _mixed_tree()
    listed = [model[0]]
    with nn.eval_mode(listed):
        assert [m.training for m in model.modules()] == [True, False, True, False, True]
    assert [m.training for m in model.modules()] == before
