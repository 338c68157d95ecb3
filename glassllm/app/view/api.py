"""The viewer's JSON endpoints as plain functions: ``fn(run, request) -> dict``.

Each function takes the `Run` and the request (the JSON body of a POST, or the query of a GET as
``{name: value}``) and returns a JSON-serialisable dict, or raises `ApiError` with the status to
answer. No function takes a path from the request. The server calls the model endpoints one at a
time under ``run.lock``; tests call them directly.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from typing import Any

import numpy as np

import glassllm
from glassllm._text import shown
from glassllm.app.sample import EXPLAIN_TOP, generate_explained
from glassllm.autograd import no_grad
from glassllm.graph.examples import EXAMPLES, run_example
from glassllm.models import GPTConfig, sampling
from glassllm.models.inspect import SOURCES, top_k

from .fields import (
    ApiError,
    bad,
    integer,
    number,
    optional_integer,
    optional_number,
    text,
    token_ids,
)
from .run import Run

# The viewer's own limits, for a server's sake (the bounds of sampling are the library's,
# glassllm.models.sampling): a request holds the model's lock while it generates, so one request
# generates at most MAX_NEW_TOKENS tokens, and the page's temperature stays within MAX_TEMPERATURE.
MAX_NEW_TOKENS = 500
MAX_TEMPERATURE = 1e4
MIN_TEMPERATURE = sampling.MIN_TEMPERATURE
MAX_PROMPT_CHARS = 20_000
MLP_TOP = 8  # units per position in the MLP summary
# Attention of every layer goes into one /api/inspect answer up to this many numbers (L*H*T*T);
# beyond, the page asks /api/attention for one layer at a time.
ATTENTION_INLINE = 1 << 20
SEED_MAX = 2**32 - 1


def _model(run: Run) -> Any:
    run.refresh()
    if run.model is None:
        raise ApiError(409, "no checkpoint yet: train until the first evaluation writes one")
    return run.model


def _rounded(array: np.ndarray, decimals: int = 6) -> Any:
    return np.round(np.asarray(array, dtype=np.float64), decimals).tolist()


def _token(run: Run, token_id: int) -> dict[str, Any]:
    return run.token(token_id)  # {"id", "text", "repr"}, from the table built once per model


def _ids_from(run: Run, body: dict[str, Any], max_tokens: int) -> list[int]:
    """The request's tokens: ``ids`` (a list of token ids) or ``prompt`` (text to encode)."""
    vocab = run.model.config.vocab_size
    if body.get("ids") is not None:
        return token_ids(body, "ids", vocab, max_tokens)
    prompt = text(body, "prompt", MAX_PROMPT_CHARS)
    if not prompt:
        raise bad("the prompt is empty; give at least one character")
    try:
        ids = run.tokenizer.encode(prompt)
    except ValueError as err:
        raise bad(f"the prompt cannot be encoded: {err}") from None
    if len(ids) > max_tokens:
        raise bad(f"the prompt is {len(ids)} tokens, more than {max_tokens}")
    return ids


# ---------------------------------------------------------------------- run and logs


def info(run: Run, query: dict[str, Any]) -> dict[str, Any]:
    """What the page shows first: the checkpoint (or None), vocabulary and file names. With
    ``brief=1`` in the query the vocabulary is left out (the page polls that, to notice a new
    checkpoint, without fetching a GPT-2-sized vocabulary every few seconds)."""
    with run.lock:
        run.refresh()
        answer: dict[str, Any] = {
            "glassllm_version": glassllm.__version__,
            "out_dir": str(run.out_dir),
            "log": run.log_path.name,
            "stats": run.stats_path.name,
            "checkpoint": None,
            "reload_error": run.reload_error,
            "limits": {
                "max_new_tokens": MAX_NEW_TOKENS,
                "explain_top": EXPLAIN_TOP,
                "min_temperature": MIN_TEMPERATURE,
            },
        }
        if run.model is None:
            return answer
        source = run.source
        assert source is not None
        answer["checkpoint"] = {
            "file": run.checkpoint_path.name,
            "stamp": list(run._stamp or ()),
            "iteration": source.iteration,
            "best_val_loss": source.best_val_loss,
            "model_config": run.model.config.to_dict(),
            "architecture": architecture(run.model.config),
            "parameters": run.model.num_parameters(),
            "tokenizer": source.tokenizer_kind,
        }
        if query.get("brief") != "1":
            answer["checkpoint"]["vocab"] = run.tokens()
        return answer


# How the page names each MLP's units (the input of the MLP's output projection).
MLP_ACTIVATIONS = {"gelu_tanh": "GELU", "gelu": "GELU (erf)", "swiglu": "silu(gate) × up"}


def architecture(config: GPTConfig) -> str:
    """The model's kind for the page's header: "GPT", with the choices beyond GPT-2's in
    parentheses ("GPT (2 key/value heads, RMSNorm, SwiGLU, rotary positions)")."""
    named = {
        "norm": "RMSNorm",
        "mlp": {"gelu": "GELU (erf)", "swiglu": "SwiGLU"}.get(config.mlp, ""),
        "positions": "rotary positions",
        "n_kv_head": f"{config.kv_heads} key/value heads",
        "head_dim": f"heads of {config.head_size}",
        "qk_norm": "QK-norm",
        "parallel_residual": "parallel residual",
        "tied_head": "untied head",
        "attention_scale": f"attention scale {config.attention_scale:g}"
        if config.attention_scale is not None
        else "",
        "local_layers": f"local attention ({config.attention_window}) in blocks "
        + ", ".join(map(str, config.local_layers)),
    }
    choices = [named[name] for name in config.gpt2_differences() if named.get(name)]
    return f"GPT ({', '.join(choices)})" if choices else "GPT"


def log(run: Run, query: dict[str, Any]) -> dict[str, Any]:
    """Records of log.jsonl and stats.jsonl after iteration ``since`` (query, default -1)."""
    since = query.get("since", "-1")
    if isinstance(since, int) and not isinstance(since, bool):
        since = str(since)
    if not isinstance(since, str) or not re.fullmatch(r"-?[0-9]{1,18}", since):
        raise bad(f"since must be an integer, got {shown(since)}")  # "\u0665" is int() 5
    return run.read_log(int(since))


# ---------------------------------------------------------------------- sampling


def generate(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """Sample like ``glassllm sample --explain --num-samples 1`` (the same function, so the same
    seed and options give the same tokens and probabilities); every token with its alternatives.

    Request: ``prompt`` (text) or ``ids``, ``max_new_tokens`` (0..500, default 100),
    ``temperature`` (default 0.8), ``top_k`` (null: all), ``top_p`` (in (0, 1], null: all),
    ``min_p`` (in [0, 1), null: all), ``seed`` (default 1337).
    """
    model = _model(run)
    ids = _ids_from(run, body, max_tokens=8 * MAX_PROMPT_CHARS)
    options, fields = sampling_fields(body)
    rng = np.random.default_rng(options.seed)  # as glassllm sample: one generator, seeded once
    _, choices = generate_explained(model, run.tokenizer, ids, 1, options, rng)
    tokens = [
        {
            **_token(run, choice.token_id),
            "step": choice.step,
            "p": choice.prob,
            "top": [{**_token(run, i), "p": p} for i, p in choice.alternatives],
        }
        for choice in choices[0]
    ]
    answer = {
        "prompt": [_token(run, i) for i in ids],
        "tokens": tokens,
        "options": fields,
        "source": "glassllm/models/generation.py: explain",
    }
    if body.get("ids") is None:
        answer["command"] = _sample_command(run, body["prompt"], options)
    return answer


def sampling_fields(body: dict[str, Any]) -> tuple[sampling.SamplingOptions, dict[str, Any]]:
    """The request's sampling options, checked, and as the answer echoes them."""
    fields = {
        "max_new_tokens": integer(body, "max_new_tokens", 100, 0, MAX_NEW_TOKENS),
        "temperature": number(body, "temperature", 0.8, MIN_TEMPERATURE, MAX_TEMPERATURE),
        "top_k": optional_integer(body, "top_k", 1, sampling.MAX_TOP_K),
        "top_p": optional_number(body, "top_p", 0.0, 1.0),
        "min_p": optional_number(body, "min_p", 0.0, 1.0),
        "seed": integer(body, "seed", 1337, 0, SEED_MAX),
    }
    try:  # the exclusive ends (top_p 0, min_p 1) are the library's to refuse
        return sampling.SamplingOptions(**fields), fields
    except ValueError as err:
        raise bad(str(err)) from None


def _sample_command(run: Run, prompt: str, options: sampling.SamplingOptions) -> str:
    parts = [
        "glassllm",
        "sample",
        "--checkpoint",
        str(run.checkpoint_path),
        "--prompt",
        prompt,
        "--num-samples",
        "1",
        "--max-new-tokens",
        str(options.max_new_tokens),
        "--temperature",
        repr(options.temperature),
        "--seed",
        str(options.seed),
    ]
    for flag, value in (("--top-k", options.top_k), ("--top-p", options.top_p)):
        if value is not None:
            parts += [flag, repr(value)]
    if options.min_p is not None:
        parts += ["--min-p", repr(options.min_p)]
    return shlex.join([*parts, "--explain"])


def distribution(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """The model's next-token logits after ``ids`` (the last block_size of them)."""
    model = _model(run)
    ids = _ids_from(run, body, max_tokens=8 * MAX_PROMPT_CHARS)
    window = ids[-model.config.block_size :]
    seen = run.inspection(window)
    return {
        "logits": _rounded(seen.logits[-1]),
        "cropped": len(window) < len(ids),
        "source": SOURCES["logits"],
    }


# ---------------------------------------------------------------------- inside the model


def inspect(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """Attention, logit lens and MLP summaries for ``ids`` or ``prompt`` (the last block_size
    tokens), from one `glassllm.models.inspect.inspect` pass."""
    model = _model(run)
    ids = _ids_from(run, body, max_tokens=8 * MAX_PROMPT_CHARS)
    window = ids[-model.config.block_size :]
    seen = run.inspection(window)
    with no_grad():
        plain_logits = model(np.asarray([window], dtype=np.int64))[0].data[0]
    steps = len(window)
    layers, heads = model.config.n_layer, model.config.n_head
    lens = seen.lens  # top LENS_TOP tokens per (stage, position), and p(actual next token)
    mlp_top, mlp_values = zip(*(top_k(layer, MLP_TOP) for layer in seen.mlp), strict=True)
    inline = layers * heads * steps * steps <= ATTENTION_INLINE
    return {
        "tokens": [_token(run, i) for i in window],
        "cropped": len(window) < len(ids),
        "n_layer": layers,
        "n_head": heads,
        "logits_diff": _max_abs_difference(seen.logits, plain_logits),
        "attention_check": seen.attention_check,
        "lens": {
            "rows": ["embed"] + [f"block {i}" for i in range(layers)],
            "top_ids": lens.top_ids.tolist(),
            "top_p": _rounded(lens.top_p),
            "p_next": _rounded(lens.next_p),
        },
        "mlp": {
            "top_units": np.stack(mlp_top).tolist(),  # (L, T, k)
            "top_values": _rounded(np.stack(mlp_values), 4),
            "active_fraction": _rounded((seen.mlp > 0).mean(axis=(1, 2)), 4),
            "units": int(seen.mlp.shape[-1]),
            "activation": MLP_ACTIVATIONS[model.config.mlp],
        },
        "attention": _rounded(seen.attention) if inline else None,
        "sources": SOURCES,
    }


def _max_abs_difference(a: np.ndarray, b: np.ndarray) -> float:
    difference = np.subtract(a, b)  # (T, V): one temporary, made absolute in place
    return float(np.max(np.abs(difference, out=difference))) if difference.size else 0.0


def attention(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """Attention probabilities ``[head][query][key]`` of one ``layer`` for ``ids``."""
    model = _model(run)
    ids = token_ids(body, "ids", model.config.vocab_size, model.config.block_size)
    layer = integer(body, "layer", None, 0, model.config.n_layer - 1)
    return {"layer": layer, "heads": _rounded(run.inspection(ids).attention[layer])}


def neuron(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """The activation of unit ``index`` of ``layer``'s MLP at every position of ``ids``: what its
    output projection reads (GELU's output, or ``silu(gate) * up`` in a SwiGLU MLP)."""
    model = _model(run)
    ids = token_ids(body, "ids", model.config.vocab_size, model.config.block_size)
    layer = integer(body, "layer", None, 0, model.config.n_layer - 1)
    index = integer(body, "index", None, 0, model.config.mlp_size - 1)
    values = run.inspection(ids).mlp[layer, :, index]
    return {"layer": layer, "index": index, "values": _rounded(values, 5), "source": SOURCES["mlp"]}


# ---------------------------------------------------------------------- autograd graph


def graph_examples(_run: Run, _request: dict[str, Any]) -> dict[str, Any]:
    return {
        "examples": [example.describe() for example in EXAMPLES.values()],
        "source": "glassllm/graph/examples.py",
    }


def graph(_run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """Forward and backward of a fixed example on ``inputs``: the exported graph."""
    name = body.get("example")
    if not isinstance(name, str) or name not in EXAMPLES:
        raise bad(f"example must be one of {', '.join(EXAMPLES)}, got {name!r}")
    inputs = body.get("inputs", {})
    if not isinstance(inputs, dict):
        raise bad("inputs must be an object {name: number or array}")
    try:
        return {**run_example(name, inputs), "source": "glassllm/graph/export.py: export_graph"}
    except ValueError as err:
        raise bad(str(err)) from None


def _chat(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    from .chat_api import chat  # the Sample tab's chat mode

    return chat(run, body)


# (method, path) -> (function, needs the model lock)
Endpoint = Callable[[Run, dict[str, Any]], dict[str, Any]]
ROUTES: dict[tuple[str, str], tuple[Endpoint, bool]] = {
    ("GET", "/api/info"): (info, False),  # takes the lock itself
    ("GET", "/api/log"): (log, False),
    ("GET", "/api/graph/examples"): (graph_examples, False),
    ("POST", "/api/generate"): (generate, True),
    ("POST", "/api/chat"): (_chat, True),
    ("POST", "/api/distribution"): (distribution, True),
    ("POST", "/api/inspect"): (inspect, True),
    ("POST", "/api/attention"): (attention, True),
    ("POST", "/api/neuron"): (neuron, True),
    ("POST", "/api/graph"): (graph, True),  # graph recording: no_grad is process-global
}
