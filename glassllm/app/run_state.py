"""A training run's state as its checkpoint stores it, and the rules for resuming a run.

A run's checkpoint (``OUT_DIR/ckpt.safetensors``) is a `glassllm.save` file: the tensors of the
model and the optimizer, and metadata that `RunState` writes (`RunState.to_metadata`) and reads
(`RunState.from_metadata`); nothing else in glassllm writes or reads that schema. A file whose
metadata lacks ``format = "glassllm.gpt"`` holds "another model".

Reading a checkpoint (`SavedRun.read`) takes the file in once (`glassllm.checkpoint.read`, which
verifies its digest before the metadata is decoded; a file without a digest is refused), then
checks every value of the metadata, type and range, with the rules the command line applies to
the same options, then checks the model's shape against the file's own tensors (so a model
built from the metadata is no larger than the file) and that no tensor holds NaN or infinity,
all before anything is built from it. Any failure is a `CheckpointError` naming the file and
the field; nothing else escapes, whatever the file holds.

Resuming (``glassllm train --resume``), in order:

1. `read_for_resume` reads ``OUT_DIR/ckpt.safetensors`` (once) into a `SavedRun`, refusing a
   file without a training configuration or generator states;
2. `SavedRun.resume_config` takes the checkpoint's training configuration and applies the
   options given on the command line: every option given overrides the checkpoint's, in
   particular the optimisation (``--lr``, ``--min-lr``, ``--warmup-iters``,
   ``--lr-decay-iters``, ``--weight-decay``, ``--beta1``, ``--beta2``, ``--grad-clip``), the
   length (``--max-iters``), evaluation and ``--sample-tokens``;
3. `glassllm.app.train.Trainer` takes that configuration and the `SavedRun`:
   `SavedRun.check_resumable` checks they belong together (the fields of `FIXED_ON_RESUME`,
   model shape, data, tokenizer and seed, keep the checkpoint's values; ``max_iters`` is beyond
   its iteration; a run started ``--init-from`` a checkpoint keeps that path and refuses the
   options its checkpoint decided) and `TrainConfig.validate` the values, the tokenizer comes
   from the metadata (no model is built for it), the model and optimizer state are loaded from the
   tensors already in memory, and the optimizer keeps the configuration's hyper-parameters (the
   ones saved in the file are those of the checkpoint's configuration, and step 2 decided which
   of them change);
4. the log keeps the records up to the checkpoint's last evaluation (`kept_log`) and drops any
   that a crash left after it; the checkpoint carries its evaluation's record
   (``last_eval_record``), which restores the log's last line when a kill came between the
   checkpoint's rename and the log's append. Checkpoint and log agree after any kill.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import glassllm
from glassllm._text import shown
from glassllm.app.config import (
    CHECKPOINT_NAME,
    DEFAULT_OUT_DIR,
    MAX_STEPS,
    TrainConfig,
    refuse_init_checkpoint_options,
)
from glassllm.app.options import field_problems
from glassllm.app.run_log import EvalRecord
from glassllm.chat_template import ChatTemplate
from glassllm.checkpoint import Checkpoint, CheckpointError, load, read
from glassllm.data import Tokenizer, tokenizer_from_dict
from glassllm.models import GPT, GPTConfig
from glassllm.models.gpt import size_problems

# metadata["format"] of a run's checkpoint; anything else is another model.
CHECKPOINT_FORMAT = "glassllm.gpt"

# The fields of train_config that describe the model_config of a run trained from scratch.
_SHAPED = ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias")

# Fields that shape the model, its tokens or its randomness: a resumed run must keep them.
FIXED_ON_RESUME = (
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "dropout",
    "bias",
    "data",
    "tokenizer",
    "vocab_size",
    "seed",
)

# The model recipe's fields (--arch, or the checkpoint --init-from named), fixed on resume as
# those above; a tuple of their own, as FIXED_ON_RESUME lists the fields every checkpoint has had
# since the first.
FIXED_ARCHITECTURE = ("arch", "n_kv_head", "init_from")


@dataclasses.dataclass(frozen=True)
class GeneratorStates:
    """The states (``Generator.bit_generator.state``) of a run's three random generators."""

    model: dict[str, Any]  # initial weights, then dropout masks
    batches: dict[str, Any]  # training batches
    default: dict[str, Any]  # glassllm's default generator (layers given no rng)

    @classmethod
    def capture(
        cls, model_rng: np.random.Generator, batch_rng: np.random.Generator
    ) -> GeneratorStates:
        """The states now of ``model_rng``, ``batch_rng`` and glassllm's default generator."""
        return cls(
            model=model_rng.bit_generator.state,
            batches=batch_rng.bit_generator.state,
            default=glassllm.get_rng().bit_generator.state,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "batches": self.batches, "default": self.default}

    @classmethod
    def from_dict(cls, values: Any) -> GeneratorStates:
        """Inverse of `to_dict`; each state must be one that NumPy's default bit generator
        (PCG64) accepts, else a ValueError naming it (``rng.batches: ...``)."""
        if not isinstance(values, dict):
            raise ValueError(f"rng must be a JSON object, got {shown(values)}")
        states = {}
        for name in ("model", "batches", "default"):
            if name not in values:
                raise ValueError(f"rng has no {name!r} state")
            probe = np.random.default_rng(0)
            try:
                probe.bit_generator.state = values[name]
            except (TypeError, ValueError, KeyError, OverflowError) as err:
                raise ValueError(
                    f"rng.{name} is not a state of NumPy's {type(probe.bit_generator).__name__} "
                    f"generator ({type(err).__name__}: {err})"
                ) from None
            states[name] = values[name]
        return cls(**states)


@dataclasses.dataclass
class RunState:
    """Everything besides tensors that a resumed run or the sampler needs from a checkpoint.

    ``config`` (stored as ``train_config``) and ``rng`` are None in a checkpoint that can be
    sampled from but not resumed (e.g. one written by ``examples/train_tiny_gpt.py``). Scalar
    fields carry their rules as metadata, checked by `from_metadata` as options are.
    """

    model_config: GPTConfig
    tokenizer: Tokenizer
    iteration: int = dataclasses.field(default=0, metadata={"min": 0, "max": MAX_STEPS})
    best_val_loss: float | None = None  # lowest validation loss of any evaluation
    # the step of the last evaluation (its record is the log's last kept line on resume)
    last_eval_iteration: int | None = dataclasses.field(
        default=None, metadata={"min": 0, "max": MAX_STEPS}
    )
    last_eval_record: EvalRecord | None = None  # that evaluation's log record
    elapsed_s: float = dataclasses.field(default=0.0, metadata={"min": 0.0})  # training time
    config: TrainConfig | None = None
    data_sha256: str | None = None  # of the training text, to warn when it changed
    rng: GeneratorStates | None = None
    glassllm_version: str | None = glassllm.__version__  # of the writer
    chat_template: ChatTemplate | None = None  # an --init-from instruct model's (for chat)

    def to_metadata(self) -> dict[str, Any]:
        """The checkpoint metadata of this state (a JSON-able dict, for `glassllm.save`)."""
        metadata = {
            "format": CHECKPOINT_FORMAT,
            "glassllm_version": self.glassllm_version,
            "iteration": self.iteration,
            "best_val_loss": self.best_val_loss,
            "last_eval_iteration": self.last_eval_iteration,
            "last_eval_record": (
                None if self.last_eval_record is None else self.last_eval_record.to_dict()
            ),
            "elapsed_s": self.elapsed_s,
            "train_config": None if self.config is None else self.config.to_dict(),
            "model_config": self.model_config.to_dict(),
            "tokenizer": self.tokenizer.to_dict(),
            "data_sha256": self.data_sha256,
            "rng": None if self.rng is None else self.rng.to_dict(),
        }
        if self.chat_template is not None:  # written only when there is one, as before
            metadata["chat_template"] = self.chat_template.to_dict()
        return metadata

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], path: str | os.PathLike[str]) -> RunState:
        """The state in a checkpoint's ``metadata``, every value checked; ``path`` names the
        file in messages. Missing optional entries take their defaults.

        Raises `CheckpointError` (a ValueError) naming the file and each bad field, or saying
        that the file holds another model; never anything else, whatever ``metadata`` holds.
        """
        path = str(path)
        if not isinstance(metadata, Mapping) or metadata.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(
                f"{path!r} is not a glassllm GPT checkpoint (its metadata has no "
                f"format={CHECKPOINT_FORMAT!r}): it holds another model"
            )
        problems: list[str] = []

        def parsed(key: str, parse: Callable[[Any], Any], required: bool = False) -> Any:
            if metadata.get(key) is None:
                if required:
                    problems.append(f"no {key!r}")
                return None
            try:
                return parse(metadata[key])
            except (TypeError, ValueError, OverflowError, RecursionError) as err:
                problems.append(f"{key}: {err}")
                return None

        model_config = parsed("model_config", GPTConfig.from_dict, required=True)
        tokenizer = parsed("tokenizer", tokenizer_from_dict, required=True)
        config = parsed("train_config", TrainConfig.from_dict)
        rng = parsed("rng", GeneratorStates.from_dict)
        record = parsed("last_eval_record", EvalRecord.from_dict)
        chat_template = parsed("chat_template", ChatTemplate.from_dict)
        if "iteration" not in metadata:
            problems.append("no 'iteration'")
        if config is not None:
            config_problems = config.problems(label=lambda name: f"train_config.{name}")
            problems += config_problems
            if model_config is not None and not config_problems:
                # an --init-from run's model is the checkpoint's: its own fields say no more
                shaped = ("dropout",) if config.init_from else _SHAPED
                problems += [
                    f"model_config.{name} ({getattr(model_config, name)!r}) disagrees with "
                    f"train_config.{name} ({getattr(config, name)!r})"
                    for name in shaped
                    if getattr(model_config, name) != getattr(config, name)
                ]
                if config.init_from and config.block_size > model_config.block_size:
                    problems.append(
                        f"train_config.block_size ({config.block_size}) is beyond the model's "
                        f"context (model_config.block_size {model_config.block_size})"
                    )
                if not config.init_from:
                    problems += _architecture_problems(model_config, config)
        # a tokenizer may be smaller than the vocabulary (Pythia's is padded), never larger
        if model_config is not None and tokenizer is not None:
            if model_config.vocab_size < tokenizer.vocab_size:
                problems.append(
                    f"the model has a vocabulary of {model_config.vocab_size} but its tokenizer "
                    f"{tokenizer.vocab_size}"
                )
        if problems:
            raise _invalid(path, problems)
        defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.init}
        scalars = {
            name: metadata.get(name, defaults[name])
            for name in ("iteration", "best_val_loss", "last_eval_iteration", "elapsed_s",
                         "data_sha256", "glassllm_version")
        }  # fmt: skip
        state = cls(model_config, tokenizer, config=config, rng=rng, last_eval_record=record,
                    chat_template=chat_template, **scalars)  # fmt: skip
        problems = field_problems(state)
        if not problems:
            problems = state._relation_problems()
        if problems:
            raise _invalid(path, problems)
        return state

    def _relation_problems(self) -> list[str]:
        """What contradicts itself between the fields (each of the right type already)."""
        problems = []
        last, record = self.last_eval_iteration, self.last_eval_record
        if last is not None and last > self.iteration:
            problems.append(
                f"last_eval_iteration ({last}) is beyond the iteration ({self.iteration})"
            )
        if record is not None and record.iter != last:
            problems.append(
                f"last_eval_record.iter ({record.iter}) is not the last_eval_iteration ({last})"
            )
        return problems


def _invalid(path: str, problems: list[str]) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path!r} has incomplete or invalid metadata: {'; '.join(problems)}"
    )


@dataclasses.dataclass(frozen=True, eq=False)
class SavedRun:
    """A run's checkpoint read once: the verified file (tensors in memory) and its state."""

    checkpoint: Checkpoint
    state: RunState
    resumable: bool = False  # read with resuming=True: checked to hold what a resume needs

    @property
    def path(self) -> str:
        return self.checkpoint.path

    @classmethod
    def read(
        cls, path: str | os.PathLike[str], resuming: bool = False, command_line: bool = False
    ) -> SavedRun:
        """Read and verify ``path``; raises ValueError (or OSError) with a message for the user
        for a missing, unreadable, damaged or foreign file, or a bad value in its metadata.

        resuming: also refuse a file that cannot be resumed (no training configuration or no
        generator states). command_line: messages about the file say ``--resume`` (read for
        ``glassllm train --resume``, see `read_for_resume`)."""
        path = Path(path)
        named = f"--resume: {str(path)!r}" if command_line else f"checkpoint {str(path)!r}"
        if path.is_dir():
            raise ValueError(f"{named} is a directory, not a checkpoint file")
        if not path.exists():
            if command_line:
                raise ValueError(
                    f"--resume: no checkpoint at {str(path)!r} (train without --resume first, or "
                    f"point --out-dir at the run to continue)"
                )
            raise ValueError(f"{named} not found")
        if not path.is_file():
            raise ValueError(f"{named} is not a regular file")
        checkpoint = read(path)  # CheckpointError (a ValueError): unreadable or corrupted
        if not checkpoint.verified:  # every file glassllm writes has a digest
            raise CheckpointError(
                f"checkpoint {str(path)!r} is corrupted or incomplete: it carries no digest "
                "(glassllm.sha256), so its contents cannot be verified"
            )
        state = RunState.from_metadata(checkpoint.metadata, path)
        problems = _tensor_problems(state.model_config, checkpoint.tensors)
        if problems:
            raise CheckpointError(
                f"checkpoint {str(path)!r} does not hold the model its metadata describes: "
                + "; ".join(problems)
            )
        saved = cls(checkpoint, state, resumable=resuming)
        if resuming:
            saved._check_resumable_file()
        return saved

    def model(self) -> GPT:
        """A GPT of the checkpoint's shape holding its weights, in eval mode (ready to sample)."""
        model = GPT(self.state.model_config, init=False)  # load fills every parameter
        load(self.checkpoint, model)
        model.eval()
        return model

    # ---- resuming

    def _check_resumable_file(self) -> None:
        """Raise ValueError unless the file holds what a resume needs besides the model: the
        training configuration and the states of the random generators."""
        if self.state.config is None:  # e.g. written by examples/train_tiny_gpt.py
            raise ValueError(
                f"--resume: checkpoint {self.path!r} has no training configuration (it was not "
                "written by glassllm train); sample from it with glassllm sample, or train anew"
            )
        if self.state.rng is None:
            raise ValueError(
                f"checkpoint {self.path!r} has incomplete or invalid metadata: no 'rng' (the "
                "states of the run's random generators); it cannot be resumed"
            )

    def _require_resumable(self) -> None:
        """The resume rule for a SavedRun read without ``resuming`` (a library caller's own read):
        a file read with it was checked once, there."""
        if not self.resumable:
            self._check_resumable_file()

    def resume_config(self, given: Mapping[str, Any]) -> TrainConfig:
        """The configuration of the resumed run: the checkpoint's (read with ``resuming``), with
        the options ``given`` (field name -> value) applied; ``out_dir`` is the one the
        checkpoint was read from. Nothing is checked here: `check_resumable` refuses a changed
        field of `FIXED_ON_RESUME`, and `TrainConfig.validate` the values."""
        self._require_resumable()
        if self.state.config.init_from is not None:  # its shape and tokenizer: the checkpoint's
            refuse_init_checkpoint_options(given, self.state.config.init_from)
        changes = {name: value for name, value in given.items() if name != "out_dir"}
        out_dir = given.get("out_dir", Path(self.path).parent)  # where the run is now
        return dataclasses.replace(self.state.config, **changes, out_dir=str(out_dir))

    def check_resumable(self, config: TrainConfig) -> None:
        """Raise ValueError unless a run configured by ``config`` can continue from here (a
        checkpoint read with ``resuming``): ``config`` keeps every field of `FIXED_ON_RESUME`,
        and ``max_iters`` lies beyond the checkpoint's iteration."""
        self._check_fixed(config)
        if self.state.iteration >= config.max_iters:
            raise ValueError(
                f"the checkpoint is already at iteration {self.state.iteration} and max_iters is "
                f"{config.max_iters}: pass a larger --max-iters to train further"
            )

    def _check_fixed(self, config: TrainConfig) -> None:
        self._require_resumable()
        saved = self.state.config
        conflicts = [
            f"{name}={getattr(config, name)!r} (checkpoint: {getattr(saved, name)!r})"
            for name in FIXED_ON_RESUME + FIXED_ARCHITECTURE
            if getattr(config, name) != getattr(saved, name)
        ]
        if conflicts:
            raise ValueError(
                f"cannot change {', '.join(conflicts)} when resuming: the model, data, tokenizer "
                "and seed come from the checkpoint"
            )


def _architecture_problems(model_config: GPTConfig, config: TrainConfig) -> list[str]:
    """Where ``model_config`` is not the model ``config`` (its --arch) trains, field by field."""
    try:
        expected = config.model_config(model_config.vocab_size)
    except ValueError as err:
        return [f"train_config does not describe a model: {err}"]
    return [
        f"model_config.{field.name} ({getattr(model_config, field.name)!r}) is not what "
        f"train_config.arch {config.arch!r} trains ({getattr(expected, field.name)!r})"
        for field in dataclasses.fields(GPTConfig)
        if getattr(model_config, field.name) != getattr(expected, field.name)
        and field.name not in _SHAPED
    ]


def _tensor_problems(config: GPTConfig, tensors: Mapping[str, np.ndarray]) -> list[str]:
    """What is wrong with the checkpoint's tensors for a GPT of ``config``, from names and shapes
    alone before any model is built (`glassllm.models.gpt.size_problems`: a model built from
    ``config`` is then no larger than the file), and any tensor with a NaN or an infinity (a run
    that diverged). (`glassllm.load` then checks every name and shape against the built model.)"""
    shapes = {name: array.shape for name, array in tensors.items()}
    problems = size_problems(shapes, config, "model_config")
    for name, array in tensors.items():
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            problems.append(
                f"{name} holds NaN or infinite values (the run diverged before it was saved)"
            )
            break
    return problems


def read_for_resume(out_dir: str | os.PathLike[str]) -> SavedRun:
    """The checkpoint of the run in ``out_dir``, read for ``--resume`` (messages say so)."""
    return SavedRun.read(Path(out_dir) / CHECKPOINT_NAME, resuming=True, command_line=True)


def resume_config(given: Mapping[str, Any]) -> TrainConfig:
    """The configuration of a resumed run: the checkpoint in ``given["out_dir"]`` (default
    ``out``), updated with the options ``given`` (see `SavedRun.resume_config`); a changed field
    of `FIXED_ON_RESUME` raises ValueError."""
    saved = read_for_resume(given.get("out_dir", DEFAULT_OUT_DIR))
    config = saved.resume_config(given)
    saved._check_fixed(config)
    return config


# ---------------------------------------------------------------------------- for sampling


def load_trained_model(path: str | os.PathLike[str]) -> tuple[GPT, Tokenizer, dict[str, Any]]:
    """Rebuild model and tokenizer from a checkpoint file alone: ``(model, tokenizer,
    metadata)``, the file read once. The model is in eval mode (ready to sample)."""
    saved = SavedRun.read(path)
    return saved.model(), saved.state.tokenizer, saved.state.to_metadata()


def read_checkpoint_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata of a run's checkpoint, verified and checked (`SavedRun.read`), as a dict."""
    return SavedRun.read(path).state.to_metadata()
