"""The Sample tab's chat mode: ``POST /api/chat``, one assistant answer explained token by token.

The conversation is rendered with the model's own chat template (`glassllm.app.chat`, the same
template and end tokens as ``glassllm chat``), encoded, and sampled with the options of
``/api/generate`` until the model's end token; each token comes with the probability it was drawn
with and its alternatives, from the sampler's own distribution (`glassllm.models.generation`'s
``stream``, ranked as ``explain`` ranks them), so the page's branching works on the answer too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm.app.sample import EXPLAIN_TOP
from glassllm.chat_template import ChatTemplateError
from glassllm.models import generation

from .fields import ApiError, bad
from .run import Run

MAX_MESSAGES = 200
MAX_CHAT_CHARS = 20_000  # of all the messages' contents together


def messages_of(body: dict[str, Any]) -> list[dict[str, str]]:
    """``body["messages"]``: a non-empty list of ``{"role": str, "content": str}``."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects")
    if len(messages) > MAX_MESSAGES:
        raise bad(f"messages holds more than {MAX_MESSAGES} messages")
    checked, total = [], 0
    for message in messages:
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise bad("each message must be an object with exactly role and content")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or not isinstance(content, str) or len(role) > 64:
            raise bad("a message's role and content must be strings (a role of at most 64)")
        total += len(content)
        checked.append({"role": role, "content": content})
    if total > MAX_CHAT_CHARS:
        raise bad(f"the messages are longer than {MAX_CHAT_CHARS} characters")
    return checked


def chat(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """The model's answer to ``messages`` (request: ``messages`` and /api/generate's sampling
    fields): ``prompt`` (the rendered conversation's tokens), ``tokens`` (as /api/generate's),
    ``reply`` (the answer's text), ``ended`` (whether the model wrote its end token)."""
    from .api import _model, _token, sampling_fields

    model = _model(run)
    try:
        template, stop_ids = run.chat_setup()
    except ValueError as err:  # a malformed tokenizer_config.json or chat_template.jinja
        raise ApiError(409, f"the model's chat template cannot be read: {err}") from None
    if template is None:
        raise ApiError(409, "this model has no chat template (chat needs an instruct model)")
    messages = messages_of(body)
    options, fields = sampling_fields(body)
    try:
        ids = run.tokenizer.encode(template.render(messages))
    except ChatTemplateError as err:
        raise bad(str(err)) from None
    except ValueError as err:
        raise bad(f"the conversation cannot be encoded: {err}") from None
    if len(ids) >= model.config.block_size:
        raise bad(
            f"the conversation is {len(ids)} tokens, the model's context {model.config.block_size}"
        )
    rng = np.random.default_rng(options.seed)  # as /api/generate: one generator, seeded once
    tokens, ended = [], False
    steps = generation.stream(model, np.asarray([ids], dtype=np.int64), options, rng)
    for step, (next_ids, probs) in enumerate(steps, start=1):
        token, p = int(next_ids[0]), probs[0]
        if token in stop_ids:
            ended = True
            break
        ranked = np.argsort(-p, kind="stable")[:EXPLAIN_TOP]  # as generation.explain ranks
        tokens.append(
            {
                **_token(run, token),
                "step": step,
                "p": float(p[token]),
                "top": [{**_token(run, int(i)), "p": float(p[i])} for i in ranked if p[i] > 0.0],
            }
        )
    return {
        "prompt": [_token(run, i) for i in ids],
        "tokens": tokens,
        "reply": run.tokenizer.decode([t["id"] for t in tokens]),
        "ended": ended,
        "options": fields,
        "source": "glassllm/app/view/chat_api.py: chat (the template: glassllm/chat_template.py)",
    }
