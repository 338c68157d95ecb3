"""The configurations of the commands: `TrainConfig` (``glassllm train``), `SampleConfig`
(``glassllm sample``) and `ViewConfig` (``glassllm view``), one dataclass each.

Each field is a command-line option (``n_layer`` -> ``--n-layer``) made by
`glassllm.app.options.option`: its type, help and range live on the field, and ``--help``, the
checks of `validate` and the checks of a checkpoint's restored configuration all read them
from there. A checkpoint stores the whole `TrainConfig`, so ``--resume`` continues with it,
changed only by the options given again (see `glassllm.app.run_state`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from glassllm.app.options import field_problems, option, type_problems
from glassllm.data import MIN_BPE_VOCAB_SIZE, TOKENIZER_KINDS, MissingDependencyError
from glassllm.data.bpe import DEFAULT_BPE_VOCAB_SIZE, import_tokenizers
from glassllm.models import sampling
from glassllm.models.gpt import (
    MAX_CONTEXT,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    GPTConfig,
    llama_config,
)

# The files a run writes in out_dir, and what each is (for messages).
CHECKPOINT_NAME = "ckpt.safetensors"
LOG_NAME = "log.jsonl"
PLOT_NAME = "loss.png"
STATS_NAME = "stats.jsonl"
OUT_FILES = {
    CHECKPOINT_NAME: "checkpoint",
    LOG_NAME: "log",
    PLOT_NAME: "loss plot",
    STATS_NAME: "training statistics",
}
DEFAULT_OUT_DIR = "out"

# The model recipes of --arch: GPT-2's, and a Llama-style one (glassllm.models.config.llama_config)
ARCHS = ("gpt2", "llama")
# Fields a configuration of today writes only when they differ from these (so a GPT-2 run's
# train_config is the dict it was before --arch existed, and older checkpoints read as gpt2).
_ADDED_FIELDS = {"arch": "gpt2", "n_kv_head": None, "init_from": None}
# The options a run started --init-from a checkpoint takes from it (its model's shape, its
# tokenizer): refused when given, and left out of its train_config, which they do not describe.
FROM_INIT_CHECKPOINT = (
    "n_layer", "n_head", "n_embd", "bias", "arch", "n_kv_head", "tokenizer", "vocab_size"
)  # fmt: skip

# Upper bounds of the options (shown by --help), whether typed or read from a checkpoint: the
# model's shape as glassllm.models.gpt bounds it (MAX_LAYERS, ...), and no value that makes a
# run endless.
MAX_BATCH = 65_536
MAX_STEPS = 1_000_000_000  # steps, warm-up, decay and evaluation intervals
MAX_EVAL_BATCHES = 100_000  # eval_iters (nanoGPT evaluates 200)
MAX_NEW_TOKENS = 1_000_000  # sample_tokens, max_new_tokens
MAX_SAMPLES = 10_000


@dataclasses.dataclass
class TrainConfig:
    """Every knob of a training run; ``glassllm train --n-layer 6`` sets ``n_layer``.

    The defaults are nanoGPT's "I only have a macbook" shakespeare_char configuration (4 layers,
    4 heads, 128 wide, context 64, batch 12, 2000 steps, lr 1e-3 -> 1e-4, beta2 0.99): a
    0.8M-parameter character-level GPT, here trained on the built-in corpus (the Python docs).
    """

    # model
    n_layer: int = option(4, "transformer blocks", min=1, max=MAX_LAYERS)
    n_head: int = option(4, "attention heads per block (must divide n_embd)", min=1, max=MAX_HEADS)
    n_embd: int = option(128, "width of the residual stream", min=1, max=MAX_WIDTH)
    block_size: int = option(64, "context length in tokens", min=1, max=MAX_CONTEXT)
    dropout: float = option(0.0, "dropout probability (0 for small models)", min=0.0, below=1.0)
    bias: bool = option(False, "biases in Linear and LayerNorm layers")
    arch: str = option(
        "gpt2",
        "'gpt2' (LayerNorm, GELU MLP, learned positions, multi-head attention) or 'llama' "
        "(RMSNorm, SwiGLU MLP of the same parameter count, rotary positions, grouped-query "
        "attention, tied head)",
        choices=ARCHS,
    )
    n_kv_head: int | None = option(
        None,
        "key/value heads with --arch llama (must divide n_head; default n_head // 2 when n_head "
        "is even, else n_head)",
        min=1,
        max=MAX_HEADS,
    )
    init_from: str | None = option(
        None,
        "finetune this checkpoint instead of a new model: a glassllm run directory or its "
        "ckpt.safetensors, a Hugging Face model directory or a GGUF file; the model's shape "
        "and tokenizer come from it, --block-size (up to its context), --dropout and the "
        "training options apply",
        metavar="PATH",
        if_empty="init_from must name a checkpoint file or directory",
    )
    # data
    data: str = option(
        "builtin",
        "'builtin' (Python docs), 'shakespeare', a text file path, or a directory written by "
        "glassllm prepare (its shards are memory-mapped; its tokenizer is used)",
        metavar="DATA",
        if_empty="data must name a corpus or a file",
    )
    tokenizer: str = option(
        "char",
        "'char' (one token per character), 'byte' (UTF-8 bytes) or 'bpe' (a byte-level BPE of "
        "--vocab-size tokens, learned deterministically on the training split only and stored "
        "in the checkpoint; needs the hf extra: pip install -e '.[hf]' in the checkout)",
        choices=TOKENIZER_KINDS,
    )
    vocab_size: int | None = option(
        None,
        f"tokens of the BPE vocabulary, with --tokenizer bpe only (default: "
        f"{DEFAULT_BPE_VOCAB_SIZE}); a short text may give fewer",
        min=MIN_BPE_VOCAB_SIZE,
        max=MAX_VOCAB,
    )
    batch_size: int = option(12, "blocks per step", min=1, max=MAX_BATCH)
    # optimisation
    max_iters: int = option(2000, "training steps", min=0, max=MAX_STEPS)
    lr: float = option(1e-3, "peak learning rate", above=0.0)
    min_lr: float = option(1e-4, "learning-rate floor at the end of the cosine decay", min=0.0)
    warmup_iters: int = option(100, "steps of linear learning-rate warmup", min=0, max=MAX_STEPS)
    lr_decay_iters: int | None = option(
        None,
        "step where the cosine decay reaches min_lr (default: max_iters)",
        min=0,
        max=MAX_STEPS,
    )
    weight_decay: float = option(0.1, "AdamW weight decay on matrices", min=0.0)
    beta1: float = option(0.9, "AdamW beta1", min=0.0, below=1.0)
    beta2: float = option(0.99, "AdamW beta2", min=0.0, below=1.0)
    grad_clip: float = option(
        1.0,
        "clip the gradient norm to this (0: no clipping)",
        min=0.0,
        note=" (0 turns clipping off)",
    )
    grad_accum: int = option(
        1,
        "micro-batches per step, gradients summed; --batch-size stays the blocks per step, "
        "split into ranks x K micro-batches",
        min=1,
    )
    # evaluation, checkpoints, reproducibility
    eval_interval: int = option(
        250, "steps between evaluations and checkpoints", min=1, max=MAX_STEPS
    )
    eval_iters: int = option(
        20, "batches per split in each evaluation", min=1, max=MAX_EVAL_BATCHES
    )
    seed: int = option(1337, "seed of every random generator of the run", min=0)
    out_dir: str = option(
        DEFAULT_OUT_DIR,
        "directory for the checkpoint, log and loss plot",
        metavar="DIR",
        if_empty="out_dir must name a directory ('.' for the current one)",
    )
    sample_tokens: int = option(
        300, "tokens sampled at the end of training (0: none)", min=0, max=MAX_NEW_TOKENS
    )
    stats_interval: int = option(
        10,
        "steps between lines of OUT_DIR/stats.jsonl (gradient norms, update ratios; 0: none)",
        min=0,
        max=MAX_STEPS,
    )

    def problems(self, label: Callable[[str], str] = str) -> list[str]:
        """Every field that cannot work, one message each (empty: the configuration is valid);
        ``label`` names a field in the messages (e.g. ``train_config.lr`` for a checkpoint's)."""
        problems = field_problems(self, label)
        if type_problems(self):
            return problems  # relations between fields mean nothing with a field of a wrong type
        if self.init_from is not None:  # the checkpoint's shape and tokenizer, not the fields'
            defaults = TrainConfig()
            problems += [
                f"{label(name)} comes from the init_from checkpoint; leave it unset"
                for name in FROM_INIT_CHECKPOINT
                if getattr(self, name) != getattr(defaults, name)
            ]
            return problems + self._schedule_problems(label)
        if self.n_head >= 1 and self.n_embd % self.n_head != 0:
            problems.append(
                f"{label('n_embd')} ({self.n_embd}) must be divisible by {label('n_head')} "
                f"({self.n_head})"
            )
        if self.n_kv_head is not None and self.arch != "llama":
            problems.append(f"{label('n_kv_head')} is for --arch llama only, not {self.arch!r}")
        elif self.n_kv_head is not None and self.n_kv_head >= 1 and self.n_head % self.n_kv_head:
            problems.append(
                f"{label('n_kv_head')} ({self.n_kv_head}) must divide {label('n_head')} "
                f"({self.n_head})"
            )
        if self.arch == "llama" and not problems:
            try:  # rotary positions rotate pairs: an odd head size cannot
                self.model_config(vocab_size=1)
            except ValueError as err:
                problems.append(f"--arch llama: {str(err).removeprefix('GPTConfig: ')}")
        if self.vocab_size is not None and self.tokenizer != "bpe":
            problems.append(
                f"{label('vocab_size')} ({self.vocab_size}) is for the 'bpe' tokenizer only, not "
                f"{self.tokenizer!r}"
            )
        if self.tokenizer == "bpe":
            try:
                import_tokenizers()
            except MissingDependencyError as err:
                problems.append(str(err))
        return problems + self._schedule_problems(label)

    def _schedule_problems(self, label: Callable[[str], str]) -> list[str]:
        problems = []
        if self.lr_decay_iters is not None and self.lr_decay_iters < self.warmup_iters:
            problems.append(
                f"{label('lr_decay_iters')} ({self.lr_decay_iters}) must be >= "
                f"{label('warmup_iters')} ({self.warmup_iters})"
            )
        elif self.warmup_iters <= MAX_STEPS and not math.isfinite(
            float(self.lr) * max(self.warmup_iters, 1)
        ):
            # why: the warm-up computes lr * (step + 1) before dividing, which overflows here
            problems.append(
                f"{label('lr')} ({self.lr:g}) is too large for a warm-up of {self.warmup_iters} "
                f"steps (lr x warmup_iters must stay below {sys.float_info.max:.3g})"
            )
        return problems

    def validate(self) -> None:
        """Raise one ValueError naming every field that cannot work."""
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def decay_iters(self) -> int:
        """The step where the cosine decay ends: ``lr_decay_iters``, else ``max_iters`` (or
        ``warmup_iters`` when that is longer: a short run then spends all its steps warming up)."""
        if self.lr_decay_iters is None:
            return max(self.max_iters, self.warmup_iters)
        return self.lr_decay_iters

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The GPTConfig this (validated) run trains, for a tokenizer of ``vocab_size``."""
        shape = dict(
            vocab_size=vocab_size,
            block_size=self.block_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
            dropout=self.dropout,
            bias=self.bias,
        )
        if self.arch == "llama":
            return llama_config(**shape, n_kv_head=self.n_kv_head)
        return GPTConfig(**shape)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        for name, default in _ADDED_FIELDS.items():
            if values[name] == default:
                del values[name]
        if self.init_from is not None:
            for name in FROM_INIT_CHECKPOINT:
                values.pop(name, None)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Inverse of `to_dict`; unknown keys raise a ValueError naming them (values are not
        checked here: call `validate`)."""
        if not isinstance(values, dict):
            raise ValueError(f"a training configuration is a JSON object, got {values!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}")
        return cls(**values)


def refuse_init_checkpoint_options(given: Mapping[str, Any], init_from: str) -> None:
    """Raise ValueError naming the options of ``given`` (field name -> value, as typed) that a
    run initialised from the checkpoint ``init_from`` takes from it (`FROM_INIT_CHECKPOINT`)."""
    named = [_flag(name) for name in FROM_INIT_CHECKPOINT if name in given]
    if named:
        raise ValueError(
            f"{', '.join(named)} cannot be given with --init-from {init_from!r}: the model's "
            "shape and its tokenizer come from that checkpoint (--block-size up to its context, "
            "--dropout and the training options apply)"
        )


@dataclasses.dataclass
class LaunchConfig:
    """How this process takes part in a run under ``mpiexec -n N`` (see
    `glassllm.app.parallel`): settings of the launch, not of the run, so a checkpoint does not
    record them and ``--resume`` takes them afresh."""

    dist_timeout: float = option(
        300.0,
        "seconds a rank waits for the others at a collective before naming the silent one "
        "and ending the job; longer than an evaluation plus a checkpoint",
        above=0.0,
    )
    blas_threads: int | None = option(
        None, "BLAS threads of each process (default: its cores / the ranks sharing them)", min=1
    )

    def validate(self) -> None:
        """Raise one ValueError naming every option that cannot work."""
        problems = field_problems(self, label=_dashed)
        if problems:
            raise ValueError("; ".join(problems))


# The bounds of sampling are the library's (glassllm.models.sampling), for every surface.
MIN_TEMPERATURE = sampling.MIN_TEMPERATURE


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def _flag(name: str) -> str:
    return "--" + _dashed(name)


@dataclasses.dataclass
class SampleConfig:
    """What ``glassllm sample`` is asked for; ``--top-k 5`` sets ``top_k``."""

    checkpoint: str = option(
        str(Path(DEFAULT_OUT_DIR) / CHECKPOINT_NAME),
        "a glassllm checkpoint file, a Hugging Face model directory (config.json, "
        "model.safetensors and tokenizer files) or its model.safetensors, or a GGUF file",
        metavar="PATH",
    )
    prompt: str = option(
        "\n",
        "text to continue (default: a newline)",
        if_empty="the prompt is empty; give at least one character",
    )
    num_samples: int = option(3, "independent samples", min=1, max=MAX_SAMPLES)
    max_new_tokens: int = option(
        300, "tokens to generate per sample", min=0, max=sampling.MAX_NEW_TOKENS
    )
    temperature: float = option(0.8, "> 1 flattens, < 1 sharpens the distribution", above=0.0)
    top_k: int | None = option(
        None,
        "sample only among the k most likely tokens (default: all)",
        min=1,
        max=sampling.MAX_TOP_K,
    )
    top_p: float | None = option(
        None,
        "nucleus sampling: only among the most likely tokens whose probabilities add up to p "
        "(after top-k; default: all)",
        above=0.0,
        max=1.0,
    )
    min_p: float | None = option(
        None,
        "only among the tokens at least min_p times as likely as the most likely one (after "
        "top-p; default: all)",
        min=0.0,
        below=1.0,
    )
    seed: int = option(1337, "seed of the sampling generator", min=0)
    explain: bool = option(
        False, "print each generated token's probability and the top alternatives"
    )
    keep_quantized: bool = option(
        False,
        "a GGUF file: keep its block-quantized weights (Q4_0 to Q8_0, Q4_K to Q6_K) as "
        "their blocks (half the memory, faster tokens; needs the fast extra)",
    )

    def validate(self) -> None:
        """Raise one ValueError naming every option that cannot work (named as on the command
        line: ``top-k``)."""
        problems = field_problems(self, label=_dashed)
        if "temperature" not in type_problems(self) and 0 < self.temperature < MIN_TEMPERATURE:
            problems.append(
                f"temperature must be at least {MIN_TEMPERATURE:g}, got {self.temperature:g} "
                "(for greedy decoding use --top-k 1)"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def sampling_options(self) -> sampling.SamplingOptions:
        """The sampling options of this (validated) configuration."""
        return sampling_options_of(self)


@dataclasses.dataclass
class ViewConfig:
    """What ``glassllm view`` serves and where; ``--port 0`` sets ``port``."""

    out_dir: str = option(
        DEFAULT_OUT_DIR,
        "the run's directory (its checkpoint, log.jsonl and stats.jsonl)",
        metavar="DIR",
        if_empty="out_dir must name a directory ('.' for the current one)",
    )
    checkpoint: str | None = option(
        None,
        "a glassllm checkpoint, a Hugging Face model directory or a GGUF file to look at "
        "(default: OUT_DIR/ckpt.safetensors)",
        metavar="PATH",
        if_empty="checkpoint must name a file or a directory",
    )
    host: str = option(
        "127.0.0.1",
        "address to listen on (another than loopback lets others on the network read the model)",
        metavar="ADDRESS",
        if_empty="host must name an address, e.g. 127.0.0.1",
    )
    port: int = option(8000, "port to listen on (0: any free port, printed)", min=0, max=65535)
    browser: bool = option(True, "open the page in a browser when there is a display")

    def validate(self) -> None:
        """Raise one ValueError naming every option that cannot work."""
        problems = field_problems(self, label=_dashed)
        if problems:
            raise ValueError("; ".join(problems))


def sampling_options_of(config: Any) -> sampling.SamplingOptions:
    """The `SamplingOptions` of a command's configuration (``sample``'s, ``chat``'s): its
    max_new_tokens, temperature, top_k, seed, top_p and min_p fields."""
    return sampling.SamplingOptions(
        config.max_new_tokens,
        config.temperature,
        config.top_k,
        config.seed,
        top_p=config.top_p,
        min_p=config.min_p,
    )
