"""Optimizers: trajectories against torch.optim, dtype, in-place updates, groups, state dicts."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

import glassllm.optim as optim
from glassllm import Tensor
from glassllm.optim import SGD, Adam, AdamW

SHAPES = [(3, 4), (5,), (2, 3, 2)]
STEPS = 20


def gradient(p: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """A gradient that depends on the current parameter, so a wrong step compounds."""
    return np.sin(3.0 * p) + 0.1 * p + noise


def make_problem(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    starts = [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]
    noises = [[rng.standard_normal(shape).astype(dtype) for shape in SHAPES] for _ in range(STEPS)]
    return starts, noises


def skipped(step: int, index: int) -> bool:
    # The last parameter has no gradient on every third step: it must be skipped, as torch does.
    return index == len(SHAPES) - 1 and step % 3 == 1


def run_glassllm(make_opt, starts, noises, groups=None):
    params = [Tensor(s.copy(), requires_grad=True) for s in starts]
    opt = make_opt(params if groups is None else groups(params))
    trajectory = []
    for step in range(STEPS):
        for index, param in enumerate(params):
            param.grad = None if skipped(step, index) else gradient(param.data, noises[step][index])
        opt.step()
        trajectory.append([param.data.copy() for param in params])
    return trajectory, params, opt


def run_torch(torch, make_opt, starts, noises, groups=None):
    params = [torch.tensor(s.copy(), requires_grad=True) for s in starts]
    opt = make_opt(params if groups is None else groups(params))
    trajectory = []
    for step in range(STEPS):
        for index, param in enumerate(params):
            if skipped(step, index):
                param.grad = None
            else:
                param.grad = torch.from_numpy(gradient(param.detach().numpy(), noises[step][index]))
        opt.step()
        trajectory.append([param.detach().numpy().copy() for param in params])
    return trajectory


CONFIGS = {
    "sgd": ("SGD", dict(lr=0.05)),
    "sgd_momentum": ("SGD", dict(lr=0.05, momentum=0.9)),
    "sgd_dampening_wd": ("SGD", dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.1)),
    "sgd_nesterov_wd": ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.05)),
    "adam": ("Adam", dict(lr=0.01)),
    "adam_l2": ("Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    "adamw_default": ("AdamW", dict(lr=0.01)),
    "adamw": ("AdamW", dict(lr=0.02, betas=(0.9, 0.95), weight_decay=0.3)),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_trajectory_matches_torch_float64(config):
    torch = optional("torch")
    cls_name, kwargs = CONFIGS[config]
    starts, noises = make_problem()
    ours, _, _ = run_glassllm(lambda p: getattr(optim, cls_name)(p, **kwargs), starts, noises)
    theirs = run_torch(torch, lambda p: getattr(torch.optim, cls_name)(p, **kwargs), starts, noises)
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            np.testing.assert_allclose(
                x, y, rtol=1e-6, atol=1e-12, err_msg=f"step {step} param {index}"
            )
    # The trajectory actually moved, and the skipped parameter stayed put on its skipped steps.
    assert not np.allclose(ours[-1][0], starts[0])
    np.testing.assert_array_equal(ours[1][-1], ours[0][-1])


def test_param_groups_match_torch():
    torch = optional("torch")
    starts, noises = make_problem(seed=1)

    def groups(params):
        return [
            {"params": params[:2], "weight_decay": 0.2},
            {"params": params[2:], "lr": 0.05, "betas": (0.5, 0.9)},
        ]

    ours, _, opt = run_glassllm(
        lambda g: AdamW(g, lr=0.01, weight_decay=0.0), starts, noises, groups
    )
    theirs = run_torch(
        torch, lambda g: torch.optim.AdamW(g, lr=0.01, weight_decay=0.0), starts, noises, groups
    )
    for a, b in zip(ours, theirs, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-12)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0]
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.05]
    assert opt.param_groups[1]["betas"] == (0.5, 0.9)
    assert [g["param_names"] for g in opt.param_groups] == [["0", "1"], ["2"]]


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_float32_stays_float32_and_matches_torch(cls):
    torch = optional("torch")
    kwargs = dict(lr=0.01, weight_decay=0.1) | ({"momentum": 0.9} if cls is SGD else {})
    starts, noises = make_problem(dtype=np.float32)
    ours, params, opt = run_glassllm(lambda p: cls(p, **kwargs), starts, noises)
    make_torch = getattr(torch.optim, cls.__name__)
    theirs = run_torch(torch, lambda p: make_torch(p, **kwargs), starts, noises)
    for param in params:
        assert param.data.dtype == np.float32
    for entry in opt.state.values():
        for key in cls.array_state_keys:
            assert entry[key].dtype == np.float32
    for x, y in zip(ours[-1], theirs[-1], strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_updates_in_place_without_touching_grad_or_graph(cls):
    kwargs = dict(lr=0.1, weight_decay=0.1) | ({"momentum": 0.9} if cls is SGD else {})
    param = Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    untouched = Tensor(np.array([5.0]), requires_grad=True)
    opt = cls([param, untouched], **kwargs)
    array = param.data
    grad = np.array([0.5, 0.5, -1.0])
    for _ in range(3):
        param.grad = grad
        opt.step()
    assert param.data is array  # written in place: a tie to this array survives
    np.testing.assert_array_equal(grad, [0.5, 0.5, -1.0])  # the gradient was not modified
    assert param.requires_grad and not param.parents
    np.testing.assert_array_equal(untouched.data, [5.0])  # grad None: skipped...
    assert "1" not in opt.state  # ...and no state created
    if cls is not SGD:
        assert opt.state["0"]["step"] == 3


def test_zero_grad_sets_none():
    a, b = Tensor(np.ones(2), requires_grad=True), Tensor(np.ones(3), requires_grad=True)
    opt = SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
    a.grad, b.grad = np.ones(2), np.ones(3)
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_named_parameters_key_the_state():
    w, b = Tensor(np.ones((2, 2)), requires_grad=True), Tensor(np.ones(2), requires_grad=True)
    opt = Adam([("layer.weight", w), ("layer.bias", b)], lr=0.1)
    w.grad, b.grad = np.ones((2, 2)), np.ones(2)
    opt.step()
    assert set(opt.state) == {"layer.weight", "layer.bias"}
    sd = opt.state_dict()
    assert sd["param_groups"][0]["params"] == ["layer.weight", "layer.bias"]
    assert set(sd["state"]["layer.weight"]) == {"step", "exp_avg", "exp_avg_sq"}
    assert sd["state"]["layer.weight"]["exp_avg"] is not opt.state["layer.weight"]["exp_avg"]


def test_named_group_dicts_and_positional_names_across_groups():
    params = [Tensor(np.ones(1), requires_grad=True) for _ in range(3)]
    opt = SGD([{"params": params[:1]}, {"params": params[1:], "lr": 0.5}], lr=0.1)
    assert [name for name, _ in opt.named_parameters()] == ["0", "1", "2"]
    named = SGD([{"params": [("a", params[0])]}, {"params": [("b", params[1])]}], lr=0.1)
    assert [name for name, _ in named.named_parameters()] == ["a", "b"]


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda p: SGD([p[0], p[0]], lr=0.1), ValueError, "more than once"),
        (lambda p: SGD([{"params": [p[0]]}, {"params": [p[0]]}], lr=0.1), ValueError, "once"),
        (lambda p: SGD([("a", p[0]), ("a", p[1])], lr=0.1), ValueError, "both named 'a'"),
        (lambda p: SGD([("a", p[0]), p[1]], lr=0.1), ValueError, "all without"),
        (lambda p: SGD([], lr=0.1), ValueError, "empty parameter list"),
        (lambda p: SGD(p[0], lr=0.1), TypeError, "single Tensor"),
        (lambda p: SGD([np.ones(2)], lr=0.1), TypeError, "not a Tensor"),
        (lambda p: SGD(p, lr=-1.0), ValueError, "invalid lr"),
        (lambda p: SGD(p, lr=0.1, nesterov=True), ValueError, "Nesterov"),
        (lambda p: SGD(p, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), ValueError, "Nest"),
        (lambda p: Adam(p, betas=(0.9, 1.0)), ValueError, "beta parameter at index 1"),
        (lambda p: Adam(p, lr="fast"), TypeError, "lr must be a number"),
        (lambda p: Adam([{"params": p, "momentum": 0.9}]), ValueError, "unknown hyper-parameter"),
    ],
)
def test_bad_construction_raises(build, error, match):
    params = [Tensor(np.ones(2), requires_grad=True) for _ in range(2)]
    with pytest.raises(error, match=match):
        build(params)


def trained_adam(seed: int = 0, steps: int = 4):
    rng = np.random.default_rng(seed)
    params = [
        Tensor(rng.standard_normal(shape, dtype=np.float32), requires_grad=True) for shape in SHAPES
    ]
    opt = AdamW([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}], lr=0.01)
    for _ in range(steps):
        for param in params:
            param.grad = gradient(param.data, 0.0)
        opt.step()
    return params, opt


def test_state_dict_round_trip_continues_bit_for_bit():
    params, opt = trained_adam()
    saved = opt.state_dict()
    copies = [Tensor(param.data.copy(), requires_grad=True) for param in params]
    fresh = AdamW([{"params": copies[:2]}, {"params": copies[2:]}], lr=0.5, weight_decay=0.7)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[1]["weight_decay"] == 0.0 and fresh.param_groups[0]["lr"] == 0.01
    for name in saved["state"]:  # arrays are copied, never the caller's
        saved["state"][name]["exp_avg"][...] = 123.0
    for _ in range(3):
        for a, b in zip(params, copies, strict=True):
            a.grad, b.grad = gradient(a.data, 0.0), gradient(b.data, 0.0)
        opt.step()
        fresh.step()
    for a, b in zip(params, copies, strict=True):
        np.testing.assert_array_equal(a.data, b.data)
    assert fresh.state["0"]["step"] == opt.state["0"]["step"] == 7


def test_state_dict_survives_json_hyperparameters():
    # A checkpoint stores hyper-parameters as JSON, which turns the betas tuple into a list.
    params, opt = trained_adam()
    saved = opt.state_dict()
    saved["param_groups"][0]["betas"] = [0.8, 0.9]
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["betas"] == (0.8, 0.9)


def _snapshot(opt):
    sd = opt.state_dict()
    return sd, {
        name: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in e.items()}
        for name, e in sd["state"].items()
    }


def _corruptions():
    def wrong_shape(sd):
        sd["state"]["0"]["exp_avg"] = np.zeros((4, 3), np.float32)

    def wrong_dtype(sd):
        sd["state"]["1"]["exp_avg_sq"] = sd["state"]["1"]["exp_avg_sq"].astype(np.float64)

    def unknown_name(sd):
        sd["state"]["blocks.9.weight"] = sd["state"]["0"]

    def missing_state_key(sd):
        del sd["state"]["2"]["exp_avg_sq"]

    def negative_step(sd):
        sd["state"]["0"]["step"] = -1

    def group_count(sd):
        sd["param_groups"].pop()

    def group_names(sd):
        sd["param_groups"][0]["params"] = ["0", "x"]

    def bad_hyper(sd):
        sd["param_groups"][1]["lr"] = -0.1

    def missing_hyper(sd):
        del sd["param_groups"][1]["eps"]

    return [
        wrong_shape,
        wrong_dtype,
        unknown_name,
        missing_state_key,
        negative_step,
        group_count,
        group_names,
        bad_hyper,
        missing_hyper,
    ]


@pytest.mark.parametrize("corrupt", _corruptions(), ids=lambda f: f.__name__)
def test_bad_state_dict_raises_and_changes_nothing(corrupt):
    params, opt = trained_adam()
    before, state_before = _snapshot(opt)
    bad = opt.state_dict()
    bad["state"]["0"]["exp_avg"] = bad["state"]["0"]["exp_avg"] + 1.0  # a change that would show
    bad["param_groups"][0]["lr"] = 0.123
    corrupt(bad)
    with pytest.raises(ValueError, match="nothing was changed|cannot load"):
        opt.load_state_dict(bad)
    after, state_after = _snapshot(opt)
    assert [{k: v for k, v in g.items()} for g in after["param_groups"]] == before["param_groups"]
    for name, entry in state_before.items():
        for key, value in entry.items():
            np.testing.assert_array_equal(state_after[name][key], value)


def test_bad_state_dict_lists_every_problem():
    params, opt = trained_adam()
    bad = opt.state_dict()
    bad["state"]["0"]["exp_avg"] = np.zeros(1, np.float32)
    bad["state"]["1"]["step"] = "three"
    with pytest.raises(ValueError) as info:
        opt.load_state_dict(bad)
    message = str(info.value)
    assert "2 problems" in message and "exp_avg of '0'" in message and "step of '1'" in message


def test_sgd_without_momentum_keeps_no_state():
    param = Tensor(np.ones(2), requires_grad=True)
    opt = SGD([param], lr=0.1)
    param.grad = np.ones(2)
    opt.step()
    assert opt.state == {}
    np.testing.assert_allclose(param.data, [0.9, 0.9])


def test_gradient_of_wrong_shape_is_named():
    param = Tensor(np.ones(2), requires_grad=True)
    opt = Adam([("w", param)])
    param.grad = np.ones(3)
    with pytest.raises(ValueError, match="'w': gradient shape"):
        opt.step()


def test_integer_parameter_is_refused_clearly():
    from glassllm import Tensor
    from glassllm.optim import SGD

    with pytest.raises(TypeError, match="int64"):
        SGD([Tensor(np.arange(3), requires_grad=True)], lr=0.1)


def test_zero_grad_accepts_torch_set_to_none():
    # nanoGPT's loop calls optimizer.zero_grad(set_to_none=True); False zeroes the arrays in place.
    a, b = Tensor(np.ones(2), requires_grad=True), Tensor(np.ones(3), requires_grad=True)
    opt = SGD([a, b], lr=0.1)
    a.grad = np.ones(2)
    grad_array = a.grad
    opt.zero_grad(set_to_none=False)
    assert a.grad is grad_array and np.array_equal(a.grad, np.zeros(2)) and b.grad is None
    opt.zero_grad(set_to_none=True)
    assert a.grad is None


def test_check_state_dict_lists_the_problems_load_would_raise_and_changes_nothing():
    params, opt = trained_adam()
    assert opt.check_state_dict(opt.state_dict()) == []
    before, state_before = _snapshot(opt)
    bad = opt.state_dict()
    bad["state"]["0"]["exp_avg"] = np.zeros(1, np.float32)
    bad["param_groups"][1]["params"] = ["2", ["3"]]
    bad["param_groups"][0]["lr"] = 10**400
    assert opt.check_state_dict(bad) == [
        "group 0: lr must be finite, got 1" + "0" * 17 + "..." + "0" * 19,
        "group 1: 'params' must be a list of parameter names",
        "state exp_avg of '0': float32[1] does not match the parameter's float32[3, 4]",
    ]
    assert opt.check_state_dict({"state": {}}) == [
        "expected a mapping with exactly the keys 'state' and 'param_groups'"
    ]
    assert opt.check_state_dict({"state": {}, "param_groups": [{}]}) == [
        "it has 1 parameter group(s), this optimizer has 2"
    ]
    after, state_after = _snapshot(opt)
    assert after["param_groups"] == before["param_groups"]
