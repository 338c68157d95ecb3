"""Sample text from a trained checkpoint, a Hugging Face model or a GGUF file: ``glassllm sample``.

The checkpoint alone rebuilds everything (model shape, weights, tokenizer vocabulary); a Hugging
Face directory does the same from its ``config.json``, ``model.safetensors`` and tokenizer files,
a GGUF file from its metadata and tensors.
With ``--explain`` each generated token is shown with the probability it was drawn with and the
alternatives the model weighed: the distribution after temperature, top-k, top-p and min-p,
exactly the one the sampler drew from.

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

from glassllm.app.allocator import release_free_memory
from glassllm.app.config import SampleConfig
from glassllm.app.run_state import RunState, SavedRun
from glassllm.chat_template import ChatTemplate
from glassllm.data import Tokenizer
from glassllm.models import GPT, generation
from glassllm.models.sampling import SamplingOptions
from glassllm.models.source import ModelSource

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
    options: SamplingOptions,
    rng: np.random.Generator,
    top: int = EXPLAIN_TOP,
) -> tuple[np.ndarray, list[list[generation.TokenChoice]]]:
    """`glassllm.models.generation.explain` of ``num_samples`` copies of the prompt: ``(ids
    (B, T + new), choices)``, each choice by token id (`described` words one)."""
    idx = np.tile(np.asarray(prompt_ids, dtype=np.int64), (num_samples, 1))  # (B, T)
    return generation.explain(model, idx, options, rng, top)


def described(choice: generation.TokenChoice, tokenizer: Tokenizer) -> TokenChoice:
    """A choice as ``--explain`` prints it: each token id in its printable form."""
    return TokenChoice(
        step=choice.step,
        token=tokenizer.token_repr(choice.token_id),
        prob=choice.prob,
        alternatives=[(tokenizer.token_repr(i), p) for i, p in choice.alternatives],
    )


@dataclasses.dataclass
class Opened:
    """A model opened by `open_checkpoint`: in eval mode, with its tokenizer and description
    (and, for a glassllm checkpoint, its run state)."""

    model: GPT
    tokenizer: Tokenizer
    source: ModelSource
    state: RunState | None = None
    chat_template: ChatTemplate | None = None  # a GGUF file's (a directory's: ChatTemplate's)


def open_checkpoint(path: str | Path, keep_quantized: bool = False) -> Opened:
    """Open any model the program accepts: a glassllm checkpoint, a Hugging Face directory (or
    its ``model.safetensors`` beside a ``config.json``: see `glassllm.hf.is_pretrained_path`),
    or a GGUF file (``.gguf``, or a file starting with the GGUF magic); ``keep_quantized``: a
    GGUF file's blocks kept (`glassllm.hf.load_gguf`), refused for anything else. Raises
    ValueError (or OSError) with a message for the user; a Hugging Face model without tokenizer
    files is one. The loading's freed temporaries go back to the system
    (`release_free_memory`)."""
    try:
        return _open_checkpoint(path, keep_quantized)
    finally:
        release_free_memory()


def _open_checkpoint(path: str | Path, keep_quantized: bool) -> Opened:
    from glassllm.gguf import is_gguf_path
    from glassllm.hf import is_pretrained_path, load_gguf, load_pretrained

    if is_gguf_path(path):
        model, tokenizer, chat_template = load_gguf(path, keep_quantized=keep_quantized)
        source = ModelSource("gguf", Path(path), model.config, tokenizer.kind)
        return Opened(model, tokenizer, source, chat_template=chat_template)
    if keep_quantized:
        raise ValueError(
            f"--keep-quantized is for GGUF files; {str(path)!r} is not one (its weights are "
            "float, not blocks)"
        )
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        raise ValueError(
            f"checkpoint {str(path)!r} is a directory, but not a Hugging Face model directory "
            "(no config.json); give a checkpoint file or a directory with config.json"
        )
    if is_pretrained_path(path):
        model, tokenizer = load_pretrained(path, require_tokenizer=True)
        assert tokenizer is not None
        source = ModelSource("huggingface", Path(path), model.config, tokenizer.kind)
        return Opened(model, tokenizer, source)
    return opened_run(SavedRun.read(path), Path(path))


def opened_run(saved: SavedRun, path: Path) -> Opened:
    """The model of a glassllm checkpoint already read, with its description."""
    state = saved.state
    source = ModelSource(
        "glassllm",
        path,
        state.model_config,
        state.tokenizer.kind,
        iteration=state.iteration,
        best_val_loss=state.best_val_loss,
        metadata=state.to_metadata(),
    )
    return Opened(saved.model(), state.tokenizer, source, state, state.chat_template)


def open_model(path: str | Path) -> tuple[GPT, Tokenizer, RunState | None]:
    """``(model, tokenizer, run state or None)``: `open_checkpoint` as a tuple."""
    opened = open_checkpoint(path)
    return opened.model, opened.tokenizer, opened.state


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
        opened = open_checkpoint(config.checkpoint, config.keep_quantized)
        model, tokenizer, state = opened.model, opened.tokenizer, opened.state
        try:
            prompt_ids = tokenizer.encode(config.prompt)
        except ValueError as err:
            raise ValueError(f"the prompt cannot be encoded: {err}") from None
        return cls(config, model, tokenizer, prompt_ids, state)

    def run(self, out: TextIO) -> list[str]:
        """Write the samples (and, with explain, each token's choice) to ``out``; return them."""
        o = self.config
        options = o.sampling_options()
        rng = np.random.default_rng(o.seed)
        if o.explain:
            ids, choices = generate_explained(
                self.model, self.tokenizer, self.prompt_ids, o.num_samples, options, rng
            )
        else:
            prompt = np.tile(np.asarray(self.prompt_ids, dtype=np.int64), (o.num_samples, 1))
            if options.top_p is None and options.min_p is None:  # the model's own entry point
                ids = self.model.generate(
                    prompt, options.max_new_tokens, options.temperature, options.top_k, rng
                )
            else:  # GPT.generate takes neither filter
                ids = generation.generate(
                    self.model,
                    prompt,
                    options.max_new_tokens,
                    options.temperature,
                    options.top_k,
                    rng,
                    top_p=options.top_p,
                    min_p=options.min_p,
                )
            choices = None
        texts = [self.tokenizer.decode(row.tolist()) for row in ids]
        for b, text in enumerate(texts):
            if choices is not None:
                out.write(f"sample {b + 1}: step, token, probability | top {EXPLAIN_TOP}\n")
                out.writelines(
                    format_choice(described(choice, self.tokenizer)) + "\n" for choice in choices[b]
                )
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
