"""The `Optimizer` base: parameter groups, per-parameter state keyed by name, and state dicts.

What differs from ``torch.optim.Optimizer``, and why:

* Every parameter has a **name**, and the state is keyed by it, not by position. Pass
  ``model.named_parameters()`` and the names are the model's (``blocks.0.attn.qkv.weight``), so
  optimizer state maps one to one onto checkpoint tensor names (``optim.exp_avg.<name>``).
  Parameters given without names are called ``"0"``, ``"1"``, ... by their position across all
  groups (PyTorch's state-dict indices, as strings). Names and no names cannot be mixed.
* `check_state_dict` lists every problem of a state dict (group count, parameter names,
  hyper-parameters, state keys, shapes and dtypes) without changing anything; `load_state_dict`
  runs it first and raises one ``ValueError`` listing them, so on failure nothing changes. It
  copies the arrays, never keeping the caller's.
* The update rules are written out as NumPy arithmetic on ``param.data``, in place, with no flags
  for alternative kernels (``foreach``, ``fused``, ``capturable``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from glassllm._checks import check_float, is_integer
from glassllm._text import shown
from glassllm.nn.module import clear_grads
from glassllm.tensor import Tensor

# One parameter group as the user writes it, e.g. {"params": [...], "weight_decay": 0.0}.
ParamGroup = dict[str, Any]
Params = Iterable[Tensor] | Iterable[tuple[str, Tensor]] | Iterable[ParamGroup]

# Keys of a param_groups entry that are bookkeeping, not hyper-parameters.
_GROUP_BOOKKEEPING = ("params", "param_names")
# Step counts and other scalar state fit an int64 (and a float exponent such as beta ** step).
_MAX_SCALAR_STATE = 2**63


class Optimizer:
    """Base class: holds ``param_groups`` and ``state``; subclasses write `step`.

    Args:
        params: an iterable of Tensors, of ``(name, Tensor)`` pairs (``model.named_parameters()``),
            or of group dicts ``{"params": [...], <hyper-parameter>: value, ...}`` whose missing
            hyper-parameters take the optimizer's defaults.
        defaults: the hyper-parameters every group starts from.

    Attributes:
        param_groups: list of dicts; each holds the group's hyper-parameters (Python floats,
            bools, tuples), ``"params"`` (its Tensors) and ``"param_names"`` (their names). A
            schedule changes ``group["lr"]`` between steps.
        state: ``{parameter name: {"step": int, "exp_avg": ndarray, ...}}``; a parameter gets an
            entry on its first update.

    Subclasses declare which state entries they keep (`array_state_keys`, `scalar_state_keys`)
    and check a group's hyper-parameters in `_check_group`.

    >>> import numpy as np
    >>> from glassllm import Tensor
    >>> from glassllm.optim import SGD
    >>> w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    >>> opt = SGD([("w", w)], lr=0.5)
    >>> w.grad = np.array([1.0, -2.0])
    >>> opt.step()
    >>> w.data
    array([0.5, 3. ])
    >>> opt.zero_grad(); print(w.grad)
    None
    >>> opt.state_dict()["param_groups"][0]["params"]
    ['w']
    """

    # The per-parameter state a subclass keeps: arrays (of the parameter's shape and dtype) and
    # scalars (Python ints). A checkpoint stores the arrays as tensors, the scalars as JSON.
    array_state_keys: tuple[str, ...] = ()
    scalar_state_keys: tuple[str, ...] = ()

    def __init__(self, params: Params, defaults: Mapping[str, Any]) -> None:
        self.defaults: dict[str, Any] = dict(defaults)
        self.param_groups: list[ParamGroup] = []
        self.state: dict[str, dict[str, Any]] = {}
        # Scratch arrays reused across steps, keyed by (slot, shape, dtype); never part of state.
        self._scratch: dict[tuple[str, tuple[int, ...], np.dtype], np.ndarray] = {}
        self._named: bool | None = None  # whether parameters were given with names

        if isinstance(params, Tensor):
            raise TypeError(
                "params must be an iterable of Tensors, (name, Tensor) pairs or group dicts, "
                "got a single Tensor; wrap it in a list"
            )
        if isinstance(params, Mapping):
            raise TypeError("params must be an iterable; to pass one group dict, wrap it in a list")
        entries = list(params)
        if not entries:
            raise ValueError("optimizer got an empty parameter list")
        if all(isinstance(entry, Mapping) for entry in entries):
            groups = entries
        elif any(isinstance(entry, Mapping) for entry in entries):
            raise TypeError("params mixes group dicts and bare parameters; use group dicts for all")
        else:
            groups = [{"params": entries}]
        for group in groups:
            self.add_param_group(group)

    # ------------------------------------------------------------------ groups and names

    def add_param_group(self, param_group: Mapping[str, Any]) -> None:
        """Add a group (``{"params": [...], hyper-parameter: value, ...}``) to ``param_groups``.

        Missing hyper-parameters take the defaults; unknown ones raise. A parameter already in
        another group, or given twice, raises ``ValueError``.
        """
        entries = self._group_entries(param_group)
        names, params, named = self._names_and_params(entries)
        self._check_unique(names, params)
        hyper = {key: value for key, value in param_group.items() if key != "params"}
        group: ParamGroup = self._normalised({**self.defaults, **hyper})
        self._check_group(group)
        group["params"] = params
        group["param_names"] = names
        self.param_groups.append(group)
        self._named = named

    def _group_entries(self, param_group: Mapping[str, Any]) -> list[Any]:
        """The group's ``"params"`` as a list, after checking the group's keys."""
        if not isinstance(param_group, Mapping) or "params" not in param_group:
            raise TypeError('a parameter group must be a dict with a "params" entry')
        unknown = sorted(set(param_group) - set(self.defaults) - set(_GROUP_BOOKKEEPING))
        if unknown:
            raise ValueError(
                f"unknown hyper-parameter(s) {unknown} for {type(self).__name__}; "
                f"known: {sorted(self.defaults)}"
            )
        if "param_names" in param_group:
            raise ValueError('give names as (name, Tensor) pairs in "params", not as "param_names"')
        raw = param_group["params"]
        if isinstance(raw, (Tensor, Mapping)) or (isinstance(raw, tuple) and _is_named_pair(raw)):
            raw = [raw]
        entries = list(raw)
        if not entries:
            raise ValueError("a parameter group got an empty parameter list")
        return entries

    def _names_and_params(self, entries: list[Any]) -> tuple[list[str], list[Tensor], bool]:
        """Split ``(name, Tensor)`` pairs, or name bare Tensors by position across all groups;
        check that each is a floating-point Tensor with a non-empty str name."""
        named = _is_named_pair(entries[0])
        if any(_is_named_pair(entry) != named for entry in entries) or (
            self._named is not None and self._named != named
        ):
            raise ValueError(
                "all parameters must be given with names ((name, Tensor) pairs) or all without"
            )
        if named:
            names = [entry[0] for entry in entries]
            params = [entry[1] for entry in entries]
        else:
            first_index = sum(len(group["params"]) for group in self.param_groups)
            names = [str(first_index + i) for i in range(len(entries))]
            params = entries
        for name, param in zip(names, params, strict=True):
            if not isinstance(param, Tensor):
                raise TypeError(f"parameter {name!r} is a {type(param).__name__}, not a Tensor")
            if not np.issubdtype(param.dtype, np.floating):
                raise TypeError(
                    f"parameter {name!r} has dtype {param.dtype}; optimizers update floating-point "
                    "parameters only"
                )
            if not isinstance(name, str) or not name:
                raise TypeError(f"parameter names must be non-empty strings, got {name!r}")
        return names, params, named

    def _check_unique(self, names: list[str], params: list[Tensor]) -> None:
        """Raise unless each parameter and each name is new to this optimizer and given once.
        Parameters are compared by identity: two with equal values are still two."""
        seen_params = {id(p) for group in self.param_groups for p in group["params"]}
        seen_names = {n for group in self.param_groups for n in group["param_names"]}
        for name, param in zip(names, params, strict=True):
            if id(param) in seen_params:
                raise ValueError(
                    f"parameter {name!r} appears more than once; each parameter may be in one "
                    "group, once"
                )
            if name in seen_names:
                raise ValueError(f"two parameters are both named {name!r}")
            seen_params.add(id(param))
            seen_names.add(name)

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """Every ``(name, parameter)`` this optimizer updates, group by group."""
        return [
            (name, param)
            for group in self.param_groups
            for name, param in zip(group["param_names"], group["params"], strict=True)
        ]

    def _normalised(self, group: ParamGroup) -> ParamGroup:
        """Hyper-parameters as plain Python values (floats stay floats, so float32 stays float32;
        tuples stay tuples, e.g. after a JSON round trip turned them into lists)."""
        out = dict(group)
        for key, default in self.defaults.items():
            value = out[key]
            if isinstance(default, bool):
                if not isinstance(value, (bool, np.bool_)):
                    raise TypeError(f"{key} must be a bool, got {shown(value)}")
                out[key] = bool(value)
            elif isinstance(default, tuple):
                if not isinstance(value, (tuple, list)) or len(value) != len(default):
                    raise TypeError(
                        f"{key} must be a tuple of {len(default)} numbers, got {shown(value)}"
                    )
                out[key] = tuple(check_float(key, v) for v in value)
            else:
                out[key] = check_float(key, value)
        return out

    def _check_group(self, group: ParamGroup) -> None:
        """Raise ``ValueError`` naming the first invalid hyper-parameter of ``group``."""

    # ------------------------------------------------------------------ stepping

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Set every parameter's ``grad`` to ``None`` (the next backward writes fresh arrays);
        ``set_to_none=False`` fills the gradient arrays with zeros instead (torch's signature)."""
        clear_grads(
            (param for group in self.param_groups for param in group["params"]), set_to_none
        )

    def step(self) -> None:
        """Update every parameter that has a gradient; subclasses implement the rule."""
        raise NotImplementedError

    def _grads(self, group: ParamGroup) -> Iterable[tuple[str, np.ndarray, np.ndarray]]:
        """Yield ``(name, param array, grad array)`` for the group's parameters that have a grad."""
        for name, param in zip(group["param_names"], group["params"], strict=True):
            grad = param.grad
            if grad is None:
                continue  # as in PyTorch: no gradient, no update, no state
            if grad.shape != param.data.shape:
                raise ValueError(
                    f"parameter {name!r}: gradient shape {grad.shape} != parameter shape "
                    f"{param.data.shape}"
                )
            yield name, param.data, grad

    def _buffer(self, slot: str, like: np.ndarray) -> np.ndarray:
        """A scratch array shaped and typed like ``like``, reused from step to step."""
        key = (slot, like.shape, like.dtype)
        buffer = self._scratch.get(key)
        if buffer is None:
            buffer = self._scratch[key] = np.empty_like(like, order="C")
        return buffer

    # ------------------------------------------------------------------ state dicts

    def state_dict(self) -> dict[str, Any]:
        """Return ``{"state": {name: {key: value}}, "param_groups": [{hyper, "params": [names]}]}``.

        Arrays are copies; scalars are Python ints; hyper-parameters Python floats, bools, tuples.
        """
        state = {
            name: {
                key: (value.copy() if isinstance(value, np.ndarray) else value)
                for key, value in entry.items()
            }
            for name, entry in self.state.items()
        }
        groups = [
            {
                **{k: v for k, v in group.items() if k not in _GROUP_BOOKKEEPING},
                "params": list(group["param_names"]),
            }
            for group in self.param_groups
        ]
        return {"state": state, "param_groups": groups}

    def check_state_dict(self, state_dict: Mapping[str, Any]) -> list[str]:
        """Every reason `load_state_dict` would refuse ``state_dict``, one line each; ``[]`` if it
        would load. Nothing is changed.

        Checked: the group count, each group's parameter names (any order) and hyper-parameters
        (same keys, valid values), and each state entry (a known name, exactly this optimizer's
        state keys, arrays of the parameter's shape and dtype, int scalars in ``[0, 2**63)``).
        """
        problems = self._layout_problems(state_dict)
        if problems:
            return problems
        for index, (saved, group) in enumerate(
            zip(state_dict["param_groups"], self.param_groups, strict=True)
        ):
            problems += [f"group {index}: {p}" for p in self._group_problems(saved, group)]
        params = dict(self.named_parameters())
        for name, entry in state_dict["state"].items():
            if name not in params:
                problems.append(f"state for unknown parameter {name!r}")
            else:
                problems += self._entry_problems(name, entry, params[name].data)
        return problems

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a `state_dict`: hyper-parameters and per-parameter state, matched by name.

        Everything is checked first with `check_state_dict`; every problem goes into one
        ``ValueError`` and nothing changes. The arrays are copied, never the caller's kept.
        """
        problems = self.check_state_dict(state_dict)
        if problems:
            raise ValueError(
                f"cannot load {type(self).__name__} state ({len(problems)} problem"
                f"{'s' if len(problems) != 1 else ''}; nothing was changed):\n  "
                + "\n  ".join(problems)
            )
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update(self._normalised(_hyper_parameters(saved)))
        self.state = {
            name: {
                key: (
                    np.array(value, order="C", copy=True)
                    if key in self.array_state_keys
                    else int(value)
                )
                for key, value in entry.items()
            }
            for name, entry in state_dict["state"].items()
        }

    def _layout_problems(self, state_dict: Any) -> list[str]:
        """The top level: ``{"state": dict, "param_groups": list of dicts, one per group}``."""
        if not isinstance(state_dict, Mapping) or set(state_dict) != {"state", "param_groups"}:
            return ["expected a mapping with exactly the keys 'state' and 'param_groups'"]
        groups = state_dict["param_groups"]
        if not isinstance(groups, (list, tuple)) or not all(isinstance(g, Mapping) for g in groups):
            return ["'param_groups' must be a list of dicts"]
        if not isinstance(state_dict["state"], Mapping):
            return ["'state' must be a dict"]
        if len(groups) != len(self.param_groups):
            return [
                f"it has {len(groups)} parameter group(s), this optimizer has "
                f"{len(self.param_groups)}"
            ]
        return []

    def _group_problems(self, saved: Mapping[str, Any], group: ParamGroup) -> list[str]:
        """A saved group against one of ours: the same parameter names, valid hyper-parameters."""
        problems = []
        names = saved.get("params")
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            problems.append("'params' must be a list of parameter names")
        else:
            saved_names, own_names = set(names), set(group["param_names"])
            missing = [n for n in group["param_names"] if n not in saved_names]
            unexpected = [n for n in names if n not in own_names]
            if missing:
                problems.append(f"missing parameters {missing}")
            if unexpected:
                problems.append(f"unexpected parameters {unexpected}")
        hyper = _hyper_parameters(saved)
        missing_keys = sorted(set(self.defaults) - set(hyper))
        unknown_keys = sorted(set(hyper) - set(self.defaults), key=repr)
        if missing_keys or unknown_keys:
            problems.append(f"hyper-parameters missing {missing_keys}, unexpected {unknown_keys}")
            return problems
        try:
            self._check_group(self._normalised(hyper))
        except (TypeError, ValueError) as error:
            problems.append(str(error))
        return problems

    def _entry_problems(self, name: str, entry: Any, data: np.ndarray) -> list[str]:
        """One parameter's saved state against the parameter's array ``data``."""
        expected_keys = set(self.array_state_keys) | set(self.scalar_state_keys)
        if not isinstance(entry, Mapping) or set(entry) != expected_keys:
            got = sorted(entry, key=repr) if isinstance(entry, Mapping) else type(entry).__name__
            return [f"state of {name!r}: expected keys {sorted(expected_keys)}, got {got}"]
        problems = []
        for key in self.array_state_keys:
            value = entry[key]
            if not isinstance(value, np.ndarray):
                problems.append(
                    f"state {key} of {name!r}: expected an ndarray, got {type(value).__name__}"
                )
            elif value.shape != data.shape or value.dtype != data.dtype:
                problems.append(
                    f"state {key} of {name!r}: {value.dtype}{list(value.shape)} does not "
                    f"match the parameter's {data.dtype}{list(data.shape)}"
                )
        for key in self.scalar_state_keys:
            value = entry[key]
            if not is_integer(value) or not 0 <= value < _MAX_SCALAR_STATE:
                problems.append(
                    f"state {key} of {name!r}: expected a non-negative int below 2**63, "
                    f"got {shown(value)}"
                )
        return problems

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for index, group in enumerate(self.param_groups):
            hyper = ", ".join(f"{k}={v}" for k, v in group.items() if k not in _GROUP_BOOKKEEPING)
            lines.append(f"  group {index}: {len(group['params'])} parameters, {hyper}")
        return "\n".join(lines + [")"])


def _is_named_pair(entry: Any) -> bool:
    return (
        isinstance(entry, tuple)
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], Tensor)
    )


def _hyper_parameters(group: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in group.items() if key not in _GROUP_BOOKKEEPING}


def check_non_negative(group: ParamGroup, *keys: str) -> None:
    """Raise ``ValueError`` if any of ``group[key]`` is negative (shared by the subclasses)."""
    for key in keys:
        if group[key] < 0.0:
            raise ValueError(f"invalid {key}: {group[key]} (must be >= 0)")
