"""Sample text from a trained checkpoint or a Hugging Face GPT-2: ``glassllm sample``.

The checkpoint alone rebuilds everything (model shape, weights, tokenizer vocabulary); a Hugging
Face directory does the same from its ``config.json``, ``model.safetensors`` and tokenizer files.
With ``--explain`` each generated token is shown with the probability it was drawn with and the
alternatives the model weighed: the distribution after temperature and top-k, exactly the one the
sampler drew from.

>>> from glassllm.app.sample import format_choice, TokenChoice
>>> print(format_choice(TokenChoice(step=1, token="'e'", prob=0.5,
...                                 alternatives=[("'e'", 0.5), ("'a'", 0.25)])))
    1  'e'     50.0%  | 'e' 50.0%  'a' 25.0%
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from glassllm.app.config import SampleConfig
from glassllm.app.run_state import RunState, SavedRun
from glassllm.data import Tokenizer
from glassllm.models import GPT

EXPLAIN_TOP = 5  # alternatives shown per token by --explain


@dataclasses.dataclass
class TokenChoice:
    """One generated token as ``--explain`` shows it."""

    step: int
    token: str  # printable form (Tokenizer.token_repr)
    prob: float  # probability the token was drawn with
    # the (up to) EXPLAIN_TOP most likely tokens it could be drawn from, most likely first
    alternatives: list[tuple[str, float]]


def format_choice(choice: TokenChoice) -> str:
    alternatives = "  ".join(f"{token} {100 * prob:.1f}%" for token, prob in choice.alternatives)
    return f"{choice.step:5d}  {choice.token:<6} {100 * choice.prob:5.1f}%  | {alternatives}"


def generate_explained(
    model: GPT,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    rng: np.random.Generator,
    top: int = EXPLAIN_TOP,
) -> tuple[np.ndarray, list[list[TokenChoice]]]:
    """Generate like ``model.generate`` and record every choice: ``(ids (B, T + new), choices)``
    with ``choices[b]`` the TokenChoice list of sample ``b``."""
    idx = np.tile(np.asarray(prompt_ids, dtype=np.int64), (num_samples, 1))  # (B, T)
    choices: list[list[TokenChoice]] = [[] for _ in range(num_samples)]
    new_ids = []
    stream = model.generate_stream(idx, max_new_tokens, temperature, top_k, rng)
    for step, (next_ids, probs) in enumerate(stream, start=1):  # (B,), (B, V)
        ranked = np.argsort(-probs, axis=-1, kind="stable")[:, :top]  # (B, top)
        for b in range(num_samples):
            choices[b].append(
                TokenChoice(
                    step=step,
                    token=tokenizer.token_repr(int(next_ids[b])),
                    prob=float(probs[b, next_ids[b]]),
                    alternatives=[  # not tokens that top-k ruled out: they were not weighed
                        (tokenizer.token_repr(int(i)), float(probs[b, i]))
                        for i in ranked[b]
                        if probs[b, i] > 0.0
                    ],
                )
            )
        new_ids.append(next_ids[:, None])
    return np.concatenate([idx, *new_ids], axis=1), choices


def open_model(path: str | Path) -> tuple[GPT, Tokenizer, RunState | None]:
    """``(model in eval mode, tokenizer, run state)`` from a glassllm checkpoint, or from a
    Hugging Face GPT-2 directory (or its ``model.safetensors`` beside a ``config.json``: see
    `glassllm.hf.is_pretrained_path`), which has no run state. Raises ValueError (or OSError)
    with a message for the user; a Hugging Face model without tokenizer files is one."""
    from glassllm.hf import is_pretrained_path, load_pretrained

    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        raise ValueError(
            f"checkpoint {str(path)!r} is a directory, but not a Hugging Face model directory "
            "(no config.json); give a checkpoint file or a directory with config.json"
        )
    if is_pretrained_path(path):
        model, tokenizer = load_pretrained(path, require_tokenizer=True)
        assert tokenizer is not None
        return model, tokenizer, None
    saved = SavedRun.read(path)
    return saved.model(), saved.state.tokenizer, saved.state


@dataclasses.dataclass
class SampleJob:
    """A sampling job ready to run: the configuration, the checkpoint's model and tokenizer, and
    the encoded prompt."""

    config: SampleConfig
    model: GPT
    tokenizer: Tokenizer
    prompt_ids: list[int]
    state: RunState | None  # of the checkpoint sampled from; None for a Hugging Face model

    @classmethod
    def prepare(cls, config: SampleConfig) -> SampleJob:
        """Check ``config``, read the checkpoint (once) and encode the prompt; every failure is a
        ValueError (or OSError) with a message for the user, raised before any output."""
        config.validate()
        model, tokenizer, state = open_model(config.checkpoint)
        try:
            prompt_ids = tokenizer.encode(config.prompt)
        except ValueError as err:
            raise ValueError(f"the prompt cannot be encoded: {err}") from None
        return cls(config, model, tokenizer, prompt_ids, state)

    def run(self, out: TextIO) -> list[str]:
        """Write the samples (and, with explain, each token's choice) to ``out``; return them."""
        o = self.config
        rng = np.random.default_rng(o.seed)
        if o.explain:
            ids, choices = generate_explained(
                self.model,
                self.tokenizer,
                self.prompt_ids,
                o.num_samples,
                o.max_new_tokens,
                o.temperature,
                o.top_k,
                rng,
            )
        else:
            prompt = np.tile(np.asarray(self.prompt_ids, dtype=np.int64), (o.num_samples, 1))
            ids = self.model.generate(prompt, o.max_new_tokens, o.temperature, o.top_k, rng)
            choices = None
        texts = [self.tokenizer.decode(row.tolist()) for row in ids]
        for b, text in enumerate(texts):
            if choices is not None:
                out.write(f"sample {b + 1}: step, token, probability | top {EXPLAIN_TOP}\n")
                out.writelines(format_choice(choice) + "\n" for choice in choices[b])
            out.write(text + "\n---------------\n")
        out.flush()
        return texts


def sample(
    checkpoint: str | Path, prompt: str = "\n", max_new_tokens: int = 300, **options: Any
) -> list[str]:
    """The texts ``glassllm sample`` would print, as a list (nothing printed)."""
    import io

    config = SampleConfig(
        checkpoint=str(checkpoint), prompt=prompt, max_new_tokens=max_new_tokens, **options
    )
    job = SampleJob.prepare(config)
    return job.run(io.StringIO())
