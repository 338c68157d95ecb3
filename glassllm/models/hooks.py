"""Reaching into a GPT's forward: its named hook points, `run_with_cache`, `run_with_hooks` and
the `hooks` context manager, with TransformerLens's names and shapes (`GPT` has each as a
method).

Every site is a `glassllm.nn.HookPoint` in the model itself, so a cached or hooked run is the
model's own forward (``model(ids)``): nothing is re-implemented, and a cache's logits equal
``model(ids)``'s exactly. A point's name is its module path with TransformerLens's spelling of
the norms (``ln_f`` -> ``ln_final``, ``ln_1`` / ``ln_2`` -> ``ln1`` / ``ln2``). For each block
``i`` (``blocks.{i}.``), shapes with B batch, T positions, E width, H heads, KV key/value heads,
hd features per head, M the MLP's width:

* ``hook_embed`` (B, T, E) the token embedding; ``hook_pos_embed`` (B, T, E) the learned
  position embedding (absent with rotary positions);
* ``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid`` (not with a parallel residual),
  ``hook_mlp_out``, ``hook_resid_post``: (B, T, E);
* ``ln1.hook_scale`` (B, T, 1), ``ln1.hook_normalized`` (B, T, E), the same for ``ln2`` and
  ``ln_final`` (and the QK-norms, ``attn.q_norm.*``, per head): before the weight and bias;
* ``attn.hook_q`` (B, T, H, hd), ``attn.hook_k`` / ``hook_v`` (B, T, KV, hd), ``attn.hook_rot_q``
  / ``hook_rot_k`` (rotary models), ``attn.hook_attn_scores`` / ``hook_pattern`` (B, H, T, Tk),
  ``attn.hook_z`` (B, T, H, hd): see `glassllm.nn.attention_hooks`;
* ``mlp.hook_pre`` / ``hook_post`` (B, T, M): the MLP's input projection before and after the
  GELU; a SwiGLU MLP has ``hook_pre`` (the gate, before SiLU), ``hook_pre_linear`` (up) and
  ``hook_post`` (``silu(gate) * up``), as TransformerLens's gated MLP.

Unknown names are errors everywhere (in a cache's name list too): a hook that would silently
never run is the commonest complaint about such tools.

>>> import numpy as np
>>> from glassllm.models import GPT, GPTConfig
>>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8),
...             rng=np.random.default_rng(0))
>>> logits, cache = model.run_with_cache([[1, 2, 3]])
>>> cache["blocks.1.attn.hook_pattern"].shape
(1, 2, 3, 3)
>>> bool((logits.data == model([[1, 2, 3]])[0].data).all())
True
>>> def zero_head_0(z, name):
...     z[:, :, 0] = 0.0  # edit in place or return a new array
>>> patched = model.run_with_hooks([[1, 2, 3]], fwd_hooks=[("blocks.0.attn.hook_z", zero_head_0)])
>>> bool((patched.data != logits.data).any())
True
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from glassllm.autograd import is_grad_enabled, no_grad
from glassllm.nn.hooks import HookPoint, straight_through
from glassllm.tensor import Tensor, unbroadcast

if TYPE_CHECKING:
    from glassllm.models.gpt import GPT

# Module-path parts that TransformerLens spells otherwise
_TL_PARTS = {"ln_f": "ln_final", "ln_1": "ln1", "ln_2": "ln2"}

NameFilter = None | str | Iterable[str] | Callable[[str], bool]
# fn(activation copy, hook name) -> None (keep, or the copy edited in place) | array | Tensor
HookFn = Callable[[np.ndarray, str], Any]


def name_hook_points(model: GPT) -> None:
    """Give every `HookPoint` of ``model`` its TransformerLens name (``HookPoint.name``)."""
    for path, module in model.named_modules():
        if isinstance(module, HookPoint):
            module.name = ".".join(_TL_PARTS.get(part, part) for part in path.split("."))


def hook_points(model: GPT, refresh: bool = True) -> dict[str, HookPoint]:
    """``{name: HookPoint}`` of every site of ``model``, the embeddings first, then block by
    block, then ``ln_final``. The index is kept on the model; ``refresh=False`` reuses it (a
    run checks that every point it hooked did run, and refreshes it if not)."""
    index = model.__dict__.get("_hook_index")
    if refresh or index is None:
        name_hook_points(model)
        points = [module for module in model.modules() if isinstance(module, HookPoint)]
        first = [point for point in points if point.name in ("hook_embed", "hook_pos_embed")]
        index = {point.name: point for point in first + [p for p in points if p not in first]}
        object.__setattr__(model, "_hook_index", index)  # a plain attribute, not a registration
    return index


def _fresh_run(model: GPT, run: Callable[[dict[str, HookPoint]], tuple[Any, list[str]]]) -> Any:
    """``run(points)`` returns its result and the names it hooked that did not run. With the
    kept index first; if a point did not run (the model's modules were replaced since), once
    more with a fresh index; a point that still does not run is an error, never a no-op."""
    for refresh in (False, True):
        result, missing = run(hook_points(model, refresh=refresh))
        if not missing:
            return result
    raise RuntimeError(f"hook points {missing} did not run in the forward")


def resolve(points: Mapping[str, HookPoint], names: NameFilter) -> list[str]:
    """The hook names ``names`` selects: None all, a name, a list of names, or a predicate
    ``f(name) -> bool``. An unknown name, or a predicate that selects nothing, is an error."""
    if names is None:
        return list(points)
    if callable(names):
        chosen = [name for name in points if names(name)]
        if not chosen:
            raise ValueError("the hook-name predicate selects no hook point of this model")
        return chosen
    listed = [names] if isinstance(names, str) else list(names)
    for name in listed:
        if not isinstance(name, str):
            raise TypeError(f"a hook name must be a str, got {type(name).__name__}")
        if name not in points:
            close = difflib.get_close_matches(name, list(points), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise KeyError(f"unknown hook point {name!r}{hint} (model.hook_points() lists them)")
    return list(dict.fromkeys(listed))


class ActivationCache(Mapping):
    """What `run_with_cache` recorded: ``cache[name]`` is a NumPy array (a copy) with the batch
    axis kept; ``cache.grads[name]`` the gradient of the metric with respect to it (empty
    without a metric). Asking for a name that was not cached is a KeyError naming it."""

    def __init__(self, activations: dict[str, np.ndarray], grads: dict[str, np.ndarray]):
        self._activations = activations
        self.grads: Mapping[str, np.ndarray] = grads

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self._activations[name]
        except KeyError:
            raise KeyError(
                f"{name!r} is not in this cache ({len(self)} hook points cached; pass it in "
                "run_with_cache's names, or see model.hook_points())"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._activations)

    def __len__(self) -> int:
        return len(self._activations)

    @property
    def nbytes(self) -> int:
        arrays = [*self._activations.values(), *self.grads.values()]
        return sum(array.nbytes for array in arrays)

    def _repr_html_(self) -> str:  # Jupyter draws this panel instead of the repr
        from glassllm.html import cache_panel

        return cache_panel(self)

    def __repr__(self) -> str:
        return (
            f"ActivationCache({len(self)} activations, {len(self.grads)} gradients, "
            f"{self.nbytes / 1e6:.1f} MB)"
        )


def run_with_cache(
    model: GPT,
    ids: Any,
    names: NameFilter = None,
    *,
    metric: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, ActivationCache]:
    """Run ``model(ids)`` and record the activations at the hook points ``names`` selects.

    ``ids``: (B, T) token ids, or (T,) for one sequence (then B = 1; every cached array keeps
    its batch axis). Returns ``(logits (B, T, V), cache)``; the logits are ``model(ids)``'s.
    Eval mode while it runs (the caller's modes come back after), under no_grad unless
    ``metric`` is given.

    ``metric(logits) -> scalar Tensor``: one backward of it fills ``cache.grads`` with
    ``d metric / d activation`` for every cached name (the engine keeps intermediate
    gradients; the parameters' ``.grad`` are left as they were). Side points (attention
    scores and pattern, norms' scale and normalised value) are then wired into the forward so
    that they get a gradient, and the logits equal ``model(ids)``'s to float rounding only.
    """
    idx = _ids(model, ids)
    if metric is not None and not is_grad_enabled():
        raise RuntimeError("run_with_cache(metric=...) needs gradients: call it outside no_grad")

    def run(points: dict[str, HookPoint]) -> tuple[Any, list[str]]:
        chosen = resolve(points, names)
        activations: dict[str, np.ndarray] = {}
        tensors: dict[str, Tensor] = {}

        def recorder(name: str) -> Callable:
            def record(point: HookPoint, _args: tuple, output: Tensor) -> Tensor | None:
                wired = metric is not None and point.side
                if wired:  # the forward consumes this node, so the metric's gradient reaches it
                    output = straight_through(output, output.data)
                if metric is not None:
                    tensors[name] = output
                activations[name] = np.array(output.data, copy=True)
                return output if wired else None

            return record

        with ExitStack() as stack:
            stack.enter_context(model.evaluating())
            stack.enter_context(no_grad() if metric is None else nullcontext())
            for name in chosen:
                stack.callback(points[name].register_forward_hook(recorder(name)).remove)
            logits, _ = model(idx)
            missing = [name for name in chosen if name not in activations]
            grads = {}
            if metric is not None and not missing:
                grads = _gradients(model, metric(logits), tensors)
        return (logits, ActivationCache(activations, grads)), missing

    return _fresh_run(model, run)


def _gradients(model: GPT, value: Any, tensors: dict[str, Tensor]) -> dict[str, np.ndarray]:
    """``d value / d tensor`` for each of ``tensors``, from one backward; zeros where the value
    does not depend on a tensor. The parameters' gradients are restored afterwards."""
    if not isinstance(value, Tensor) or value.size != 1:
        raise ValueError(
            f"metric(logits) must return a scalar Tensor, got {type(value).__name__}"
            + (f" of shape {value.shape}" if isinstance(value, Tensor) else "")
        )
    params = list(model.parameters())
    kept = [param.grad for param in params]
    try:
        for param in params:
            param.grad = None
        value.reshape(()).backward(retain_intermediate_grads=True, retain_graph=False)
        return {
            name: np.zeros_like(t.data) if t.grad is None else np.array(t.grad, copy=True)
            for name, t in tensors.items()
        }
    finally:
        for param, grad in zip(params, kept, strict=True):
            param.grad = grad


@contextmanager
def hooks(model: GPT, fwd_hooks: Iterable[tuple[Any, HookFn]] = ()) -> Iterator[GPT]:
    """``with hooks(model, [(name_or_predicate, fn), ...]):`` attaches each ``fn`` to the points
    selected (as `resolve`) for the body, and removes them all at the end, also when the body
    or a hook raises. Every name is checked before anything is attached.

    ``fn(activation, name)`` gets a writable copy of the activation (a NumPy array) and returns
    None to keep it (or to keep its in-place edits of that copy), or a replacement: an array of
    the same shape (cast to the activation's dtype) or a glassllm `Tensor` (used as it is, a
    graph node). An array equal to the activation changes nothing: the forward goes on with the
    original node (so a pattern hook that only reads keeps the attention fused). Any other array
    joins the graph as a straight-through node: the gradient reaching it passes unchanged to
    the original activation (exact for an added vector, as in steering; for any other edit,
    the gradient taken at the replaced value). The mode and grad state are the caller's
    (`run_with_hooks` sets eval mode).
    """
    points = hook_points(model)
    with ExitStack() as stack:
        for name, fn in _pairs(points, fwd_hooks):
            stack.callback(points[name].register_forward_hook(_array_hook(name, fn)).remove)
        yield model


def _pairs(points: dict[str, HookPoint], fwd_hooks: Iterable[tuple[Any, HookFn]]) -> list:
    """``[(name, fn)]`` of ``fwd_hooks``, every name resolved (and checked) first."""
    pairs = []
    for spec, fn in fwd_hooks:
        if not callable(fn):
            raise TypeError(f"the hook for {spec!r} must be callable, got {type(fn).__name__}")
        pairs += [(name, fn) for name in resolve(points, spec)]
    return pairs


def run_with_hooks(model: GPT, ids: Any, fwd_hooks: Iterable[tuple[Any, HookFn]] = ()) -> Tensor:
    """The logits (B, T, V) of ``model(ids)`` with ``fwd_hooks`` attached (see `hooks`), in eval
    mode (the caller's modes come back after); ``ids`` as in `run_with_cache`. Gradients are
    tracked as the caller's grad mode says, so a loss of the logits can be back-propagated."""
    idx = _ids(model, ids)
    fwd_hooks = list(fwd_hooks)

    def run(points: dict[str, HookPoint]) -> tuple[Any, list[str]]:
        pairs = _pairs(points, fwd_hooks)
        ran: set[str] = set()
        with ExitStack() as stack:
            stack.enter_context(model.evaluating())
            for name, fn in pairs:
                hook = _array_hook(name, fn, ran)
                stack.callback(points[name].register_forward_hook(hook).remove)
            logits, _ = model(idx)
        return logits, [name for name, _ in pairs if name not in ran]

    return _fresh_run(model, run)


def _array_hook(name: str, fn: HookFn, ran: set[str] | None = None) -> Callable:
    def hook(_point: HookPoint, _args: tuple, output: Tensor) -> Tensor | None:
        if ran is not None:
            ran.add(name)
        original = output.data
        given = np.array(original, copy=True)
        result = fn(given, name)
        if result is None:
            result = given
        if isinstance(result, Tensor):
            _check_shape(name, result.shape, original.shape)
            return result
        result = np.asarray(result)
        _check_shape(name, result.shape, original.shape)
        if np.array_equal(result, original, equal_nan=True):
            return None  # nothing changed: the forward goes on with the very same node
        return straight_through(output, result.astype(original.dtype, copy=False))

    return hook


def _check_shape(name: str, got: tuple, want: tuple) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"the hook on {name!r} returned shape {tuple(got)}; expected {want}")


def _ids(model: GPT, ids: Any) -> np.ndarray:
    idx = np.asarray(ids.data if isinstance(ids, Tensor) else ids)
    return model.check_idx(idx[None, :] if idx.ndim == 1 else idx)


def broadcast_to(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``x`` broadcast to ``shape`` (a read-only view); the gradient sums back to ``x``'s
    shape. How the position embedding (T, E) is shown to its hook as (B, T, E)."""
    return Tensor.from_op(
        np.broadcast_to(x.data, shape), (x,), lambda g: (unbroadcast(g, x.shape),)
    ).named("broadcast_to")
