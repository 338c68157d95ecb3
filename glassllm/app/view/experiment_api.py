"""The Experiment tab's endpoints: `glassllm.interp` behind the page, ``fn(run, request) -> dict``.

* ``POST /api/experiment/patch``: activation patching of a clean prompt into a corrupted one,
  the logit difference of two answer tokens measured: a (layer x position) sweep of
  ``resid_pre`` and a (layer x head) sweep of the heads' outputs ``hook_z``; all layers, or one
  layer's rows per request (the page's progress, row by row), or attribution patching's
  estimate of both grids;
* ``POST /api/experiment/patch_cell``: one cell of either sweep: its value and the patched
  next-token distribution;
* ``POST /api/experiment/ablate``: heads, MLP neurons or whole attention / MLP layers set to
  zero, to their mean or to their value on another prompt (resampling); the next-token
  distribution and a sampled continuation, each beside the unablated one;
* ``POST /api/experiment/steer``: a contrast pair's direction at one layer, added with a
  strength while generating; the continuation with and without, from the same seed;
* ``POST /api/experiment/attribute``: direct logit attribution per head and MLP at the last
  token, and the input tokens' saliency (gradient x input, or integrated gradients).

The same rules as the rest of the page (`glassllm.app.view.api`): each request's work is
bounded (prompt tokens, cells a sweep runs, new tokens, integration steps), the server runs
them one at a time under ``run.lock`` (they run forwards and, for saliency, a backward under
the process-global grad mode), every refusal is an `ApiError` answered as JSON, and nothing in
a request names a file. An answer token is a token id or a text that encodes to exactly one
token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm import interp
from glassllm._text import shown
from glassllm.autograd import no_grad

from .api import SEED_MAX, _model, _token
from .fields import ApiError, bad, integer, number, optional_integer, text
from .run import Run

MAX_EXPERIMENT_TOKENS = 64  # tokens of each prompt an experiment reads
MAX_PATCH_CELLS = 1024  # patched forwards one sweep runs: layers x (positions + heads)
MAX_PARTS = 64  # heads, neurons and layers one ablation removes
MAX_EXPERIMENT_NEW_TOKENS = 100
MAX_IG_STEPS = 64
MAX_STRENGTH = 1000.0
DISTRIBUTION_TOP = 10  # tokens of a next-token distribution the answer lists
SOURCE = "glassllm/app/view/experiment_api.py, on glassllm/interp/"


def _prompt(run: Run, body: dict[str, Any], name: str) -> list[int]:
    """``body[name]`` (text) encoded, 1..MAX_EXPERIMENT_TOKENS tokens within the context."""
    value = text(body, name, 8 * MAX_EXPERIMENT_TOKENS * 16)
    if not value:
        raise bad(f"{name} is empty; give at least one character")
    try:
        ids = run.tokenizer.encode(value)
    except ValueError as err:
        raise bad(f"{name} cannot be encoded: {err}") from None
    limit = min(MAX_EXPERIMENT_TOKENS, run.model.config.block_size)
    if not ids or len(ids) > limit:
        raise bad(f"{name} is {len(ids)} tokens; an experiment takes 1 to {limit}")
    return list(ids)


def answer_token(run: Run, body: dict[str, Any], name: str) -> int:
    """``body[name]``: a token id, or a text that encodes to exactly one token."""
    value = body.get(name)
    vocab = run.model.config.vocab_size
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < vocab:
            raise bad(f"{name} must be a token id in [0, {vocab}), got {value}")
        return value
    if not isinstance(value, str) or not value or len(value) > 200:
        raise bad(f"{name} must be a token id or the text of one token, got {shown(value)}")
    try:
        ids = run.tokenizer.encode(value)
    except ValueError as err:
        raise bad(f"{name} cannot be encoded: {err}") from None
    if len(ids) != 1:
        raise bad(f"{name} {value!r} is {len(ids)} tokens, not one; give one token or its id")
    return int(ids[0])


def _distribution(run: Run, logits: np.ndarray) -> list[dict[str, Any]]:
    """The top `DISTRIBUTION_TOP` tokens of softmax(logits), most likely first."""
    logits = np.asarray(logits, dtype=np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    ranked = np.argsort(-probs, kind="stable")[:DISTRIBUTION_TOP]
    return [{**_token(run, int(i)), "p": float(probs[i])} for i in ranked]


def _pair(run: Run, body: dict[str, Any]) -> tuple[list[int], list[int], int, int]:
    clean, corrupted = _prompt(run, body, "clean"), _prompt(run, body, "corrupted")
    if len(clean) != len(corrupted):
        raise bad(
            f"the clean and corrupted prompts must be as many tokens, got {len(clean)} and "
            f"{len(corrupted)}"
        )
    return clean, corrupted, answer_token(run, body, "answer"), answer_token(run, body, "wrong")


PATCH_METHODS = {"activation": interp.activation_patch, "attribution": interp.attribution_patch}


def patch(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """Both sweeps of ``clean`` into ``corrupted`` (texts of as many tokens), measuring
    ``logit[answer] - logit[wrong]`` at the last position: ``resid`` (layer x position) and
    ``heads`` (layer x head), each with its values, labels and the clean / corrupted metric.

    ``method``: "activation" (a patched forward per cell, `interp.activation_patch`) or
    "attribution" (its gradient-times-difference estimate from two forwards and a backward,
    `interp.attribution_patch`). ``layer``: only that layer's row of both grids, so that the
    page can sweep a layer per request and draw the rows as they come; ``checkpoint`` in the
    answer tells it whether the rows are all of one model."""
    model = _model(run)
    clean, corrupted, answer, wrong = _pair(run, body)
    config = model.config
    method = body.get("method", "activation")
    if method not in PATCH_METHODS:
        raise bad(f"method must be 'activation' or 'attribution', got {shown(method)}")
    layer = optional_integer(body, "layer", 0, config.n_layer - 1)
    rows = config.n_layer if layer is None else 1
    cells = rows * (len(clean) + config.n_head)
    if method == "activation" and cells > MAX_PATCH_CELLS:  # attribution: 3 passes, any size
        raise bad(
            f"this sweep would patch {cells} cells (layers x (positions + heads)), more than "
            f"{MAX_PATCH_CELLS}; shorten the prompts"
        )
    labels = [_token(run, i)["text"] for i in clean]
    sweeps = {}
    for key, point, index in (("resid", "resid_pre", "pos"), ("heads", "z", "head")):
        result = PATCH_METHODS[method](
            model,
            clean,
            corrupted,
            point,
            index,
            answer=answer,
            wrong=wrong,
            layers=None if layer is None else [layer],
            tokens=labels,
        )
        sweeps[key] = {
            "point": point,
            "values": result.values.tolist(),
            "layers": [int(row) for row in result.layers],
            "positions": result.positions,
            "heads": result.heads,
            "checks": result.checks,
        }
    return {
        **sweeps,
        "method": method,
        "layer": layer,
        "n_layer": config.n_layer,
        "checkpoint": list(run._stamp or ()),
        "clean_metric": result.clean_metric,
        "corrupted_metric": result.corrupted_metric,
        "answer": _token(run, answer),
        "wrong": _token(run, wrong),
        "clean": [_token(run, i) for i in clean],
        "corrupted": [_token(run, i) for i in corrupted],
        "source": f"{SOURCE} (interp.{PATCH_METHODS[method].__name__})",
    }


def patch_cell(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """One cell: ``point`` "resid_pre" (``layer``, ``pos``) or "z" (``layer``, ``head``); its
    patched logit difference and next-token distribution, and the corrupted run's."""
    model = _model(run)
    clean, corrupted, answer, wrong = _pair(run, body)
    point = body.get("point")
    if point not in ("resid_pre", "z"):
        raise bad(f"point must be 'resid_pre' or 'z', got {shown(point)}")
    layer = integer(body, "layer", None, 0, model.config.n_layer - 1)
    pos = head = None
    if point == "resid_pre":
        pos = integer(body, "pos", None, 0, len(clean) - 1)
    else:
        head = integer(body, "head", None, 0, model.config.n_head - 1)
    logits = interp.patched_logits(model, clean, corrupted, point, layer, pos=pos, head=head)
    with no_grad():
        base = model(np.asarray([corrupted], dtype=np.int64))[0].data[0, -1]
    return {
        "point": point,
        "layer": layer,
        "pos": pos,
        "head": head,
        "value": float(logits[answer]) - float(logits[wrong]),
        "patched": _distribution(run, logits),
        "corrupted": _distribution(run, base),
        "source": f"{SOURCE} (interp.patched_logits)",
    }


def _pairs(body: dict[str, Any], name: str, first: Any, second: Any) -> list[tuple]:
    """``body[name]``: a list of two-item lists, each item checked by ``first`` / ``second``."""
    value = body.get(name, [])
    if value is None:
        value = []
    if not isinstance(value, list) or len(value) > MAX_PARTS:
        raise bad(f"{name} must be a list of at most {MAX_PARTS} [a, b] pairs")
    checked = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise bad(f"each of {name} must be a pair [a, b], got {shown(item)}")
        checked.append((first(item[0]), second(item[1])))
    return checked


def _index(name: str, count: int) -> Any:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise bad(f"a {name} must be an integer in [0, {count}), got {shown(value)}")
        return value

    return check


def _kind(value: Any) -> str:
    if value not in ("attn", "mlp"):
        raise bad(f"a layer to ablate is ['attn' | 'mlp', layer], got {shown(value)}")
    return value


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "max_new_tokens": integer(body, "max_new_tokens", 30, 0, MAX_EXPERIMENT_NEW_TOKENS),
        "temperature": number(body, "temperature", 0.8, 0.01, 100.0),
        "seed": integer(body, "seed", 1337, 0, SEED_MAX),
    }


def _continue(run: Run, model: Any, ids: list[int], fields: dict, hooks: list) -> list:
    """``max_new_tokens`` sampled after ``ids`` with ``hooks`` on, seeded: the new tokens."""
    steps = min(fields["max_new_tokens"], model.config.block_size - len(ids))
    rng = np.random.default_rng(fields["seed"])
    with no_grad(), model.hooks(hooks):
        out = model.generate(
            np.asarray([ids], dtype=np.int64), steps, fields["temperature"], rng=rng
        )
    return [_token(run, int(i)) for i in out[0, len(ids) :]]


def ablate(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """``prompt`` with ``heads`` [[layer, head]], ``neurons`` [[layer, index]] and ``layers``
    [["attn" | "mlp", layer]] removed, ``how`` "zero", "mean" (the mean over the prompt's own
    positions) or "resample" (each position's value on the ``reference`` prompt, of as many
    tokens): the next-token distribution and a continuation, each with and without (no
    ablated continuation for "resample": past the prompt the reference has no value)."""
    model = _model(run)
    config = model.config
    ids = _prompt(run, body, "prompt")
    layer = _index("layer", config.n_layer)
    heads = _pairs(body, "heads", layer, _index("head", config.n_head))
    neurons = _pairs(body, "neurons", layer, _index("neuron", config.mlp_size))
    layers = _pairs(body, "layers", _kind, layer)
    if len(heads) + len(neurons) + len(layers) > MAX_PARTS:
        raise bad(f"an ablation removes at most {MAX_PARTS} parts")
    if not heads and not neurons and not layers:
        raise bad("nothing to ablate: give heads, neurons or layers")
    how = body.get("how", "zero")
    if how not in ("zero", "mean", "resample"):
        raise bad(f"how must be 'zero', 'mean' or 'resample', got {shown(how)}")
    fields = _sampling(body)
    reference = [ids] if how == "mean" else None
    if how == "resample":
        reference = [_prompt(run, body, "reference")]
        if len(reference[0]) != len(ids):
            raise bad(
                f"a resample ablation takes a reference prompt as many tokens as the prompt, "
                f"got {len(reference[0])} and {len(ids)}"
            )
    result = interp.ablate(model, ids, heads, neurons, layers, how, reference)
    hooks = interp.ablation_hooks(model, heads, neurons, layers, how, reference)
    # a resampled value exists at the reference's positions only, none past the prompt
    ablated_continuation = None if how == "resample" else _continue(run, model, ids, fields, hooks)
    return {
        "parts": result.parts,
        "how": how,
        "kl": result.kl,
        "base": _distribution(run, result.base_logits),
        "ablated": _distribution(run, result.logits),
        "prompt": [_token(run, i) for i in ids],
        "base_continuation": _continue(run, model, ids, fields, []),
        "ablated_continuation": ablated_continuation,
        "reference": [_token(run, i) for i in reference[0]] if how == "resample" else None,
        "options": fields,
        "source": f"{SOURCE} (interp.ablate, interp.ablation_hooks)",
    }


def steer(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """The direction ``positive`` minus ``negative`` (texts) at ``layer``'s resid_pre, added
    ``strength`` times while continuing ``prompt``; the continuation with and without."""
    model = _model(run)
    positive, negative = _prompt(run, body, "positive"), _prompt(run, body, "negative")
    ids = _prompt(run, body, "prompt")
    layer = integer(body, "layer", None, 0, model.config.n_layer - 1)
    strength = number(body, "strength", 1.0, -MAX_STRENGTH, MAX_STRENGTH)
    fields = _sampling(body)
    vector = interp.steering_vector(model, positive, negative, layer)
    return {
        "layer": layer,
        "strength": strength,
        "name": vector.name,
        "norm": vector.norm,
        "act_norm": vector.act_norm,
        "prompt": [_token(run, i) for i in ids],
        "base_continuation": _continue(run, model, ids, fields, []),
        "steered_continuation": _continue(run, model, ids, fields, vector.hooks(strength)),
        "options": fields,
        "source": f"{SOURCE} (interp.steering_vector, interp.generate_steered)",
    }


def attribute(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """For ``prompt`` and ``logit[answer] - logit[wrong]`` at its last token: direct logit
    attribution (``dla``: per head, per MLP, every bar) and the input tokens' saliency
    (``saliency``: ``method`` "gradient_x_input" or "integrated_gradients" with ``n_steps``)."""
    model = _model(run)
    ids = _prompt(run, body, "prompt")
    answer, wrong = answer_token(run, body, "answer"), answer_token(run, body, "wrong")
    method = body.get("method", "gradient_x_input")
    labels = [_token(run, i)["text"] for i in ids]
    with no_grad():
        dla = interp.direct_logit_attribution(model, ids, answer, wrong)
    if method == "gradient_x_input":
        saliency = interp.gradient_x_input(model, ids, answer=answer, wrong=wrong, tokens=labels)
    elif method == "integrated_gradients":
        steps = integer(body, "n_steps", 32, 1, MAX_IG_STEPS)
        saliency = interp.integrated_gradients(
            model, ids, answer=answer, wrong=wrong, n_steps=steps, tokens=labels
        )
    else:
        methods = "'gradient_x_input' or 'integrated_gradients'"
        raise bad(f"method must be {methods}, got {shown(method)}")
    if not np.all(np.isfinite(saliency.values)):
        raise ApiError(422, "the saliency is not finite for this prompt (the model overflowed)")
    return {
        "dla": dla.as_dict(),
        "saliency": saliency.as_dict(),
        "prompt": [_token(run, i) for i in ids],
        "answer": _token(run, answer),
        "wrong": _token(run, wrong),
        "source": f"{SOURCE} (interp.direct_logit_attribution, interp.{method})",
    }


ROUTES = {
    ("POST", "/api/experiment/patch"): (patch, True),
    ("POST", "/api/experiment/patch_cell"): (patch_cell, True),
    ("POST", "/api/experiment/ablate"): (ablate, True),
    ("POST", "/api/experiment/steer"): (steer, True),
    ("POST", "/api/experiment/attribute"): (attribute, True),
}
