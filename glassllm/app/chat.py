"""A terminal chat with an instruct model through its own chat template: ``glassllm chat``.

``glassllm chat --checkpoint SmolLM2-135M-Instruct.Q4_1.gguf`` reads one user message per line
of standard input (a terminal, or a pipe: ``echo "Hi" | glassllm chat ...``), renders the whole
conversation with the model's template (a GGUF file's ``tokenizer.chat_template``, a Hugging Face
directory's ``chat_template.jinja`` or ``tokenizer_config.json``, the one a run finetuned
from either keeps in its checkpoint; `glassllm.chat_template`),
and streams the answer to standard output token by token until the model writes its end token
(``eos_token``: ``<|im_end|>`` for SmolLM2) or ``--max-new-tokens``. Ctrl-C during an answer
stops that answer (what was written so far stays in the conversation) and waits for the next
line; Ctrl-C at the prompt, or the end of input, ends the chat.

When the conversation no longer fits the model's context with room for an answer, its oldest
turns are left out of the prompt (the system message stays), as a chat front end does.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from glassllm.app.config import sampling_options_of
from glassllm.app.options import field_problems, option
from glassllm.app.sample import Opened, open_checkpoint
from glassllm.chat_template import ChatTemplate, ChatTemplateError
from glassllm.models import generation, sampling

GENERATION_CONFIG = "generation_config.json"


@dataclasses.dataclass
class ChatConfig:
    """What ``glassllm chat`` is asked for; ``--top-p 0.9`` sets ``top_p``."""

    checkpoint: str | None = option(
        None,
        "the instruct model: a GGUF file or a Hugging Face directory with a chat template "
        "(required)",
        metavar="PATH",
        if_empty="--checkpoint must name a GGUF file or a model directory",
    )
    system: str | None = option(
        None, "a system message (default: none, or the one the template writes itself)"
    )
    max_new_tokens: int = option(
        256, "at most this many tokens per answer", min=1, max=sampling.MAX_NEW_TOKENS
    )
    temperature: float = option(0.7, "> 1 flattens, < 1 sharpens the distribution", above=0.0)
    top_k: int | None = option(
        None, "only among the k most likely tokens (1: greedy)", min=1, max=sampling.MAX_TOP_K
    )
    top_p: float | None = option(
        None, "nucleus sampling: the most likely tokens adding up to p", above=0.0, max=1.0
    )
    min_p: float | None = option(
        None, "only tokens at least min_p times as likely as the most likely", min=0.0, below=1.0
    )
    seed: int = option(1337, "seed of the sampling generator", min=0)
    keep_quantized: bool = option(
        False,
        "a GGUF file: keep its block-quantized weights (Q4_0 to Q8_0, Q4_K to Q6_K) as "
        "their blocks (half the memory, faster tokens; needs the fast extra)",
    )

    def validate(self) -> None:
        """Raise one ValueError naming every option that cannot work."""
        problems = field_problems(self, label=lambda name: "--" + name.replace("_", "-"))
        if self.checkpoint is None:
            problems.append("chat needs --checkpoint PATH (a GGUF file or a model directory)")
        if not problems:
            try:
                self.sampling_options()
            except ValueError as err:
                problems.append(str(err))
        if problems:
            raise ValueError("; ".join(problems))

    def sampling_options(self) -> sampling.SamplingOptions:
        return sampling_options_of(self)


@dataclasses.dataclass
class Chat:
    """An open model, its template and stop tokens, and the conversation so far."""

    opened: Opened
    template: ChatTemplate
    stop_ids: frozenset[int]
    options: sampling.SamplingOptions
    messages: list[dict[str, str]]
    rng: np.random.Generator

    @classmethod
    def open(cls, config: ChatConfig) -> Chat:
        """Check ``config`` and open its model; a ValueError (or OSError) for the user."""
        config.validate()
        assert config.checkpoint is not None
        opened = open_checkpoint(config.checkpoint, config.keep_quantized)
        template, stop_ids = chat_setup(opened)
        if template is None:
            raise ValueError(
                f"{config.checkpoint} has no chat template (a base model? chat needs an instruct "
                "model whose files carry one)"
            )
        if not stop_ids:
            raise ValueError(f"{config.checkpoint} names no end-of-answer token (eos_token)")
        system = [{"role": "system", "content": config.system}] if config.system else []
        options = config.sampling_options()
        rng = np.random.default_rng(config.seed)
        return cls(opened, template, stop_ids, options, system, rng)

    def prompt_ids(self) -> list[int]:
        """The conversation rendered and encoded, its oldest turns left out until it fits the
        context with room for an answer."""
        block = self.opened.model.config.block_size
        room = max(block - self.options.max_new_tokens, 1)
        first = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        start = first
        while True:
            kept = self.messages[:first] + self.messages[start:]
            ids = self.opened.tokenizer.encode(self.template.render(kept))
            if len(ids) <= room or start >= len(self.messages) - 1:
                break
            start += 2 if start + 1 < len(self.messages) - 1 else 1  # a user turn and its answer
        if len(ids) > block - 1:
            raise ValueError(
                f"the message takes {len(ids)} tokens, more than the model's context of {block}"
            )
        return ids

    def answer(self, user: str, out: TextIO) -> str:
        """Add ``user``'s message, stream the model's answer to ``out``, add and return it. A
        KeyboardInterrupt ends the answer early (the part written is kept)."""
        self.messages.append({"role": "user", "content": user})
        prompt = np.asarray([self.prompt_ids()], dtype=np.int64)  # (1, T)
        tokenizer, answer_ids, written = self.opened.tokenizer, [], ""
        try:
            steps = generation.stream(self.opened.model, prompt, self.options, self.rng)
            for next_ids, _ in steps:
                token = int(next_ids[0])
                if token in self.stop_ids:
                    break
                answer_ids.append(token)
                text = tokenizer.decode(answer_ids)
                if not text.endswith("\ufffd"):  # a character's bytes may span tokens
                    out.write(text[len(written) :])
                    out.flush()
                    written = text
        except KeyboardInterrupt:
            out.write(" [stopped]")
        out.write("\n")
        out.flush()
        reply = tokenizer.decode(answer_ids)
        self.messages.append({"role": "assistant", "content": reply})
        return reply


def chat_setup(opened: Opened) -> tuple[ChatTemplate | None, frozenset[int]]:
    """The chat template of an opened model (a GGUF file's, a Hugging Face directory's, a glassllm
    run's finetuned ``--init-from`` an instruct model; None for a model without one) and the
    tokens that end an answer."""
    template = opened.chat_template
    path = opened.source.path
    if template is None and opened.source.kind == "huggingface" and path is not None:
        template = ChatTemplate.from_directory(path if path.is_dir() else path.parent)
    if template is None or path is None:
        return template, frozenset()
    return template, frozenset(_stop_ids(opened, template, path))


def _stop_ids(opened: Opened, template: ChatTemplate, path: Path) -> set[int]:
    """The tokens that end an answer: the template's ``eos_token`` and, in a Hugging Face
    directory, ``generation_config.json``'s ``eos_token_id`` (one id or a list)."""
    tokenizer = opened.tokenizer
    ids = set()
    eos = template.special_tokens.get("eos_token")
    if eos is not None and tokenizer.token_id(eos) is not None:
        ids.add(int(tokenizer.token_id(eos)))
    directory = path if path.is_dir() else path.parent
    if opened.source.kind == "huggingface" and (directory / GENERATION_CONFIG).is_file():
        from glassllm.hf.untrusted import read_json

        config = read_json(directory / GENERATION_CONFIG)
        value = config.get("eos_token_id") if isinstance(config, dict) else None
        values = value if isinstance(value, list) else [value]
        vocab = opened.model.config.vocab_size
        ids |= {
            v for v in values if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab
        }
    return ids


def run_chat(config: ChatConfig, stdin: TextIO, out: TextIO, err: TextIO) -> None:
    """The chat loop of ``glassllm chat``: one answer per line of ``stdin``. ValueError for bad
    input (a template that refuses the conversation, a message beyond the context)."""
    chat = Chat.open(config)
    interactive = _is_terminal(stdin)
    if interactive:
        name = chat.opened.source.path.name if chat.opened.source.path else "the model"
        err.write(
            f"chatting with {name}: one message per line; Ctrl-C stops an answer, Ctrl-D ends\n"
        )
    while True:
        if interactive:
            err.write("> ")
            err.flush()
        line = stdin.readline()
        if not line:
            return
        user = line.rstrip("\r\n")
        if not user.strip():
            continue
        try:
            chat.answer(user, out)
        except ChatTemplateError as error:
            raise ValueError(f"the chat template: {error}") from None


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def main_chat(config: ChatConfig) -> None:
    run_chat(config, sys.stdin, sys.stdout, sys.stderr)
