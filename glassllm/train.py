"""Train a GPT on text: the configuration and the loop behind ``glassllm train``.

The loop is nanoGPT's ``train.py`` on glassllm parts: random blocks of the training split, AdamW
with decay on matrices only (``GPT.configure_optimizer``), cosine learning rate with linear warmup,
gradient clipping, and every ``eval_interval`` steps an evaluation of both splits under ``no_grad``
followed by a checkpoint. Differences from nanoGPT, and why:

* Evaluation batches are the same at every evaluation (drawn from a generator seeded by
  ``seed`` alone), so two points of the loss curve differ only because the model changed, and
  evaluating never touches the randomness of training.
* The checkpoint is written at every evaluation and at the end, not only when the validation
  loss improves: it is what ``--resume`` continues from, and it holds the state of every random
  generator, so a resumed run reproduces an uninterrupted one bit for bit.
* Ctrl-C finishes the current step, saves a checkpoint and stops (a second Ctrl-C aborts at once).

Files in ``out_dir``: ``ckpt.safetensors`` (model, optimizer, and JSON metadata: iteration, best
validation loss, configuration, tokenizer vocabulary, generator states), ``log.jsonl`` (one line
per evaluation) and ``loss.png`` (when matplotlib is installed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import glassllm
from glassllm import no_grad
from glassllm.data import (
    TOKENIZER_KINDS,
    Tokenizer,
    build_tokenizer,
    check_long_enough,
    get_batch,
    load_text,
    split_train_val,
    tokenizer_from_dict,
)
from glassllm.models import GPT, GPTConfig
from glassllm.nn.utils import clip_grad_norm_
from glassllm.optim.lr_scheduler import cosine_with_warmup

CHECKPOINT_NAME = "ckpt.safetensors"
LOG_NAME = "log.jsonl"
PLOT_NAME = "loss.png"
# metadata["format"] of a checkpoint written here; anything else is "another model".
CHECKPOINT_FORMAT = "glassllm.gpt"
FINAL_SAMPLE_TEMPERATURE = 0.8  # nanoGPT's sample.py default


def _option(default: Any, help: str, **extra: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **extra})


@dataclasses.dataclass
class TrainConfig:
    """Every knob of a training run; ``glassllm train --n-layer 6`` sets ``n_layer``.

    The defaults train a 0.8M-parameter character-level GPT on the built-in corpus (the Python
    documentation) in about three minutes on a 2-core laptop CPU: nanoGPT's "I only have a
    macbook" shakespeare_char configuration, with fewer iterations.
    """

    # model
    n_layer: int = _option(4, "transformer blocks")
    n_head: int = _option(4, "attention heads per block (must divide n_embd)")
    n_embd: int = _option(128, "width of the residual stream")
    block_size: int = _option(64, "context length in tokens")
    dropout: float = _option(0.0, "dropout probability (0 for small models)")
    bias: bool = _option(False, "biases in Linear and LayerNorm layers")
    # data
    data: str = _option("builtin", "'builtin' (Python docs), 'shakespeare' or a text file path")
    tokenizer: str = _option("char", "'char' (one token per character) or 'byte' (UTF-8 bytes)")
    batch_size: int = _option(12, "blocks per step")
    # optimisation
    max_iters: int = _option(600, "training steps")
    lr: float = _option(1e-3, "peak learning rate")
    min_lr: float = _option(1e-4, "learning-rate floor at the end of the cosine decay")
    warmup_iters: int = _option(100, "steps of linear learning-rate warmup")
    lr_decay_iters: int | None = _option(
        None, "step where the cosine decay reaches min_lr (default: max_iters)"
    )
    weight_decay: float = _option(0.1, "AdamW weight decay on matrices")
    beta1: float = _option(0.9, "AdamW beta1")
    beta2: float = _option(0.99, "AdamW beta2")
    grad_clip: float = _option(1.0, "clip the gradient norm to this (0: no clipping)")
    # evaluation, checkpoints, reproducibility
    eval_interval: int = _option(100, "steps between evaluations and checkpoints")
    eval_iters: int = _option(20, "batches per split in each evaluation")
    seed: int = _option(1337, "seed of every random generator of the run")
    out_dir: str = _option("out", "directory for the checkpoint, log and loss plot")
    sample_tokens: int = _option(300, "tokens sampled at the end of training (0: none)")

    def validate(self) -> None:
        """Raise one ValueError naming every field that cannot work."""
        problems: list[str] = []
        for name in (
            "n_layer",
            "n_head",
            "n_embd",
            "block_size",
            "batch_size",
            "eval_interval",
            "eval_iters",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_iters", "warmup_iters", "sample_tokens"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n_head >= 1 and self.n_embd % self.n_head != 0:
            problems.append(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.lr_decay_iters is not None and self.lr_decay_iters < self.warmup_iters:
            problems.append(
                f"lr_decay_iters ({self.lr_decay_iters}) must be >= warmup_iters "
                f"({self.warmup_iters})"
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            problems.append(f"lr must be a positive number, got {self.lr}")
        if not (self.min_lr >= 0 and math.isfinite(self.min_lr)):
            problems.append(f"min_lr must be >= 0, got {self.min_lr}")
        if not self.weight_decay >= 0:
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.grad_clip >= 0:
            problems.append(f"grad_clip must be >= 0 (0 turns clipping off), got {self.grad_clip}")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if self.tokenizer not in TOKENIZER_KINDS:
            problems.append(
                f"tokenizer must be one of {', '.join(TOKENIZER_KINDS)}, got {self.tokenizer!r}"
            )
        if not self.data:
            problems.append("data must name a corpus or a file")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def decay_iters(self) -> int:
        """The step where the cosine decay ends: ``lr_decay_iters``, else ``max_iters`` (or
        ``warmup_iters`` when that is longer: a short run then spends all its steps warming up)."""
        if self.lr_decay_iters is None:
            return max(self.max_iters, self.warmup_iters)
        return self.lr_decay_iters

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}")
        return cls(**values)


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
    "seed",
)


# --------------------------------------------------------------------------------- checkpoints

# Where glassllm.save keeps the caller's metadata dict, JSON-encoded, in the safetensors header
# (the file layout documented in glassllm/checkpoint.py).
_METADATA_HEADER_KEY = "glassllm.metadata"


def _read_metadata(path: Path) -> Any:
    """The metadata dict of a glassllm checkpoint from the safetensors header alone (no tensors
    read; glassllm.load checks the file's digest when the weights are loaded)."""
    import safetensors

    try:
        with safetensors.safe_open(str(path), framework="np") as handle:
            header = handle.metadata() or {}
    except OSError as err:
        raise ValueError(f"cannot read checkpoint {str(path)!r}: {err}") from None
    except Exception as err:  # safetensors raises its own SafetensorError for a broken file
        raise ValueError(
            f"{str(path)!r} is not a readable safetensors checkpoint (truncated, corrupted or "
            f"another format): {err}"
        ) from None
    try:
        return json.loads(header.get(_METADATA_HEADER_KEY, "{}"))
    except ValueError:
        raise ValueError(f"checkpoint {str(path)!r} has corrupted metadata") from None


def read_checkpoint_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of a checkpoint written by :class:`Trainer`, read without building a model.

    Raises ValueError for a missing or unreadable file, and for a checkpoint of another model.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} not found")
    metadata = _read_metadata(path)
    if not isinstance(metadata, dict) or metadata.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{str(path)!r} is not a glassllm GPT checkpoint (its metadata has no "
            f"format={CHECKPOINT_FORMAT!r}): it holds another model"
        )
    return metadata


def model_from_metadata(
    metadata: dict[str, Any], rng: np.random.Generator | None = None
) -> tuple[GPT, Tokenizer]:
    """An (untrained) GPT of the checkpoint's shape and the checkpoint's tokenizer."""
    try:
        tokenizer = tokenizer_from_dict(metadata["tokenizer"])
        model_config = GPTConfig.from_dict(metadata["model_config"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"checkpoint metadata is incomplete or invalid: {err}") from None
    if model_config.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"checkpoint metadata disagrees with itself: the model has a vocabulary of "
            f"{model_config.vocab_size} but its tokenizer {tokenizer.vocab_size}"
        )
    return GPT(model_config, rng=rng), tokenizer


def load_trained_model(path: str | Path) -> tuple[GPT, Tokenizer, dict[str, Any]]:
    """Rebuild model and tokenizer from a checkpoint file alone: ``(model, tokenizer, metadata)``.

    The model is in eval mode (ready to sample).
    """
    metadata = read_checkpoint_metadata(path)
    model, tokenizer = model_from_metadata(metadata, rng=np.random.default_rng(0))
    glassllm.load(path, model)
    model.eval()
    return model, tokenizer, metadata


def resume_config(given: dict[str, Any]) -> TrainConfig:
    """The configuration of a resumed run: the checkpoint's, updated with the options ``given``.

    The checkpoint is ``given["out_dir"]/ckpt.safetensors`` (default ``out``). Options in
    :data:`FIXED_ON_RESUME` may be given only with the checkpoint's value.
    """
    out_dir = given.get("out_dir", TrainConfig().out_dir)
    path = Path(out_dir) / CHECKPOINT_NAME
    if not path.is_file():
        raise ValueError(
            f"--resume: no checkpoint at {str(path)!r} (train without --resume first, or point "
            f"--out-dir at the run to continue)"
        )
    metadata = read_checkpoint_metadata(path)
    try:
        saved = TrainConfig.from_dict(metadata["train_config"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"checkpoint {str(path)!r} has no usable training configuration: {err}"
        ) from None
    conflicts = [
        f"{name}={given[name]!r} (checkpoint: {getattr(saved, name)!r})"
        for name in FIXED_ON_RESUME
        if name in given and given[name] != getattr(saved, name)
    ]
    if conflicts:
        raise ValueError(
            f"cannot change {', '.join(conflicts)} when resuming: the model, data, tokenizer and "
            "seed come from the checkpoint"
        )
    changes = {name: value for name, value in given.items() if name != "out_dir"}
    return dataclasses.replace(saved, **changes, out_dir=str(out_dir))


# -------------------------------------------------------------------------------------- corpus


@dataclasses.dataclass
class Corpus:
    """The token streams of a run: 90% for training, 10% for validation."""

    tokenizer: Tokenizer
    train: np.ndarray
    val: np.ndarray
    sha256: str  # of the text, so a resumed run can tell whether it trains on the same text


def prepare_corpus(config: TrainConfig, tokenizer: Tokenizer | None = None) -> Corpus:
    """Load ``config.data``, tokenize it (with ``tokenizer``, else a new one of
    ``config.tokenizer``) and split it; every way this can fail raises one ValueError."""
    text = load_text(config.data)
    sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if tokenizer is None:
        tokenizer = build_tokenizer(config.tokenizer, text)
    try:
        ids = tokenizer.encode_array(text)
    except ValueError as err:
        raise ValueError(
            f"data {config.data!r} does not fit the checkpoint's tokenizer: {err}"
        ) from None
    train, val = split_train_val(ids)
    try:
        check_long_enough(train, config.block_size, "training")
        check_long_enough(val, config.block_size, "validation")
    except ValueError as err:
        raise ValueError(
            f"data {config.data!r} is too short for block_size={config.block_size}: {len(ids)} "
            f"tokens, and {err}; use a text of at least {10 * (config.block_size + 2)} tokens "
            "or a smaller --block-size"
        ) from None
    return Corpus(tokenizer, train, val, sha256)


# ------------------------------------------------------------------------------------ training


@dataclasses.dataclass
class TrainResult:
    """What one call of :meth:`Trainer.fit` did."""

    iteration: int  # steps done in total (across resumes)
    best_val_loss: float | None
    losses: list[float]  # training loss of each step this call ran
    evaluations: list[dict[str, Any]]  # the log.jsonl records this call wrote
    checkpoint: Path
    interrupted: bool
    sample: str | None  # the text sampled at the end (None when interrupted or sample_tokens=0)
    elapsed_s: float  # training wall time in total (across resumes)


class _StopOnCtrlC:
    """First Ctrl-C: ask the loop to stop after the current step. Second: abort at once.

    Signal handlers can only be installed from the main thread; elsewhere Ctrl-C keeps Python's
    default behaviour.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _StopOnCtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\nCtrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to abort)",
            file=sys.stderr,
            flush=True,
        )


class Trainer:
    """One training run: ``Trainer(config).fit()``, or ``Trainer(config, resume=True).fit()``.

    Construction does everything that can fail because of the input (configuration, data,
    checkpoint) and raises ValueError or OSError before any file is written.
    """

    def __init__(self, config: TrainConfig, resume: bool = False) -> None:
        config.validate()
        self.config = config
        self.out_dir = Path(config.out_dir)
        self.checkpoint_path = self.out_dir / CHECKPOINT_NAME
        self.log_path = self.out_dir / LOG_NAME
        self.resumed = resume
        # Separate generators, so that e.g. evaluating never shifts the training batches:
        # model_rng initialises the weights and then drives dropout (the model keeps it);
        # batch_rng draws the training batches.
        glassllm.manual_seed(config.seed)
        self.model_rng = np.random.default_rng([config.seed, 0])
        self.batch_rng = np.random.default_rng([config.seed, 1])

        metadata = read_checkpoint_metadata(self.checkpoint_path) if resume else None
        tokenizer = None
        if metadata is not None:
            self._check_same_run(metadata)
            tokenizer = model_from_metadata(metadata, rng=np.random.default_rng(0))[1]
        self.corpus = prepare_corpus(config, tokenizer)
        self.tokenizer = self.corpus.tokenizer
        self.model_config = GPTConfig(
            vocab_size=self.tokenizer.vocab_size,
            block_size=config.block_size,
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_embd=config.n_embd,
            dropout=config.dropout,
            bias=config.bias,
        )
        self.model = GPT(self.model_config, rng=self.model_rng)
        self.optimizer = self.model.configure_optimizer(
            config.lr, config.weight_decay, (config.beta1, config.beta2)
        )
        self.iteration = 0
        self.best_val_loss: float | None = None
        self.last_eval_iteration: int | None = None
        self.elapsed_s = 0.0
        if metadata is not None:
            self._restore(metadata)
        self.out_dir.mkdir(parents=True, exist_ok=True)

    # ---- resuming

    def _check_same_run(self, metadata: dict[str, Any]) -> None:
        saved = metadata.get("train_config", {})
        different = [
            f"{name}: {getattr(self.config, name)!r} vs {saved.get(name)!r} in the checkpoint"
            for name in FIXED_ON_RESUME
            if getattr(self.config, name) != saved.get(name)
        ]
        if different:
            raise ValueError(f"cannot resume with a different {'; '.join(different)}")

    def _restore(self, metadata: dict[str, Any]) -> None:
        glassllm.load(self.checkpoint_path, self.model, self.optimizer)
        # The optimizer state brought the old hyper-parameters; the configuration may change them.
        for group in self.optimizer.param_groups:
            decays = all(p.ndim >= 2 for p in group["params"])
            group["weight_decay"] = self.config.weight_decay if decays else 0.0
            group["betas"] = (self.config.beta1, self.config.beta2)
        self.iteration = int(metadata["iteration"])
        self.best_val_loss = metadata.get("best_val_loss")
        self.last_eval_iteration = metadata.get("last_eval_iteration")
        self.elapsed_s = float(metadata.get("elapsed_s", 0.0))
        states = metadata["rng"]
        self.model_rng.bit_generator.state = states["model"]
        self.batch_rng.bit_generator.state = states["batches"]
        glassllm.get_rng().bit_generator.state = states["default"]
        if metadata.get("data_sha256") != self.corpus.sha256:
            print(
                f"glassllm: warning: {self.config.data!r} is not the text this checkpoint was "
                "trained on; the run continues on the new text",
                file=sys.stderr,
            )
        if self.iteration >= self.config.max_iters:
            raise ValueError(
                f"the checkpoint is already at iteration {self.iteration} and max_iters is "
                f"{self.config.max_iters}: pass a larger --max-iters to train further"
            )

    # ---- checkpoints and logs

    def metadata(self) -> dict[str, Any]:
        """Everything besides tensors that a resumed run or the sampler needs."""
        return {
            "format": CHECKPOINT_FORMAT,
            "glassllm_version": glassllm.__version__,
            "iteration": self.iteration,
            "best_val_loss": self.best_val_loss,
            "last_eval_iteration": self.last_eval_iteration,
            "elapsed_s": self.elapsed_s,
            "train_config": self.config.to_dict(),
            "model_config": self.model_config.to_dict(),
            "tokenizer": self.tokenizer.to_dict(),
            "data_sha256": self.corpus.sha256,
            "rng": {
                "model": self.model_rng.bit_generator.state,
                "batches": self.batch_rng.bit_generator.state,
                "default": glassllm.get_rng().bit_generator.state,
            },
        }

    def save_checkpoint(self) -> Path:
        glassllm.save(self.checkpoint_path, self.model, self.optimizer, self.metadata())
        return self.checkpoint_path

    def _start_log(self) -> None:
        """A fresh run starts an empty log; a resumed one keeps the records up to its checkpoint
        (dropping any a crash left behind after it)."""
        kept: list[str] = []
        if self.resumed and self.log_path.is_file():
            last = -1 if self.last_eval_iteration is None else self.last_eval_iteration
            for line in self.log_path.read_text().splitlines():
                try:
                    if json.loads(line)["iter"] <= last:
                        kept.append(line + "\n")
                except (ValueError, KeyError, TypeError):
                    continue
        self.log_path.write_text("".join(kept))

    def evaluate(self) -> dict[str, float]:
        """Mean loss of ``eval_iters`` batches of each split, in eval mode under no_grad.

        The batches come from a generator seeded by the run's seed alone: the same batches at
        every evaluation, and the training generators untouched.
        """
        cfg = self.config
        losses: dict[str, float] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            with no_grad():
                for index, (split, data) in enumerate(
                    (("train", self.corpus.train), ("val", self.corpus.val))
                ):
                    rng = np.random.default_rng([cfg.seed, 2, index])
                    total = 0.0
                    for _ in range(cfg.eval_iters):
                        x, y = get_batch(data, cfg.block_size, cfg.batch_size, rng)
                        total += float(self.model(x, y)[1].data)
                    losses[split] = total / cfg.eval_iters
        finally:
            self.model.train(was_training)
        return losses

    def learning_rate(self, iteration: int) -> float:
        cfg = self.config
        return cosine_with_warmup(iteration, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.decay_iters)

    def train_step(self) -> float:
        """One optimisation step on a fresh random batch; returns its loss (before the update)."""
        cfg = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(self.iteration)
        x, y = get_batch(self.corpus.train, cfg.block_size, cfg.batch_size, self.batch_rng)
        _, loss = self.model(x, y)  # (B, T) -> scalar mean cross-entropy
        loss.backward()
        if cfg.grad_clip > 0.0:
            clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.iteration += 1
        return float(loss.data)

    def sample_text(
        self, max_new_tokens: int, temperature: float = FINAL_SAMPLE_TEMPERATURE
    ) -> str:
        """A sample continuing a newline (or the first validation token, if there is no newline
        in the vocabulary), drawn from a generator seeded by the run's seed."""
        try:
            prompt = self.tokenizer.encode("\n")
        except ValueError:
            prompt = [int(self.corpus.val[0])]
        rng = np.random.default_rng([self.config.seed, 3])
        ids = self.model.generate(
            np.array([prompt], dtype=np.int64), max_new_tokens, temperature=temperature, rng=rng
        )
        return self.tokenizer.decode(ids[0].tolist())

    # ---- the loop

    def fit(
        self,
        progress: bool | None = None,
        on_step: Callable[[Trainer, float], None] | None = None,
    ) -> TrainResult:
        """Train up to ``max_iters``; evaluate, log and checkpoint every ``eval_interval`` steps
        and at the end; then write ``loss.png`` and print a sample.

        progress: show the tqdm bar (None: only when stderr is a terminal).
        on_step: called after every step with the trainer and the step's loss; raising
        KeyboardInterrupt there stops the run as Ctrl-C does.
        """
        from tqdm.auto import tqdm

        cfg = self.config
        tokens_per_step = cfg.batch_size * cfg.block_size
        print(self._describe(), flush=True)
        self._start_log()
        losses: list[float] = []
        evaluations: list[dict[str, Any]] = []
        interrupted = False
        clock, elapsed_before = time.perf_counter(), self.elapsed_s
        step_time = None  # moving average of seconds per step, for tokens/s
        bar = tqdm(
            total=cfg.max_iters,
            initial=self.iteration,
            disable=None if progress is None else not progress,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            file=sys.stderr,
        )
        try:
            with _StopOnCtrlC() as stop:
                while True:
                    self.elapsed_s = elapsed_before + time.perf_counter() - clock
                    if stop.requested:
                        interrupted = True
                        self.save_checkpoint()
                        break
                    if self._evaluation_due():
                        record = self._evaluate_and_checkpoint(tokens_per_step)
                        evaluations.append(record)
                        bar.write(
                            f"step {record['iter']}: train loss {record['train_loss']:.4f}, "
                            f"val loss {record['val_loss']:.4f}",
                            file=sys.stdout,
                        )
                    if self.iteration >= cfg.max_iters:
                        break
                    lr = self.learning_rate(self.iteration)
                    started = time.perf_counter()
                    loss = self.train_step()
                    seconds = time.perf_counter() - started
                    step_time = seconds if step_time is None else 0.9 * step_time + 0.1 * seconds
                    losses.append(loss)
                    bar.set_postfix_str(
                        f"loss {loss:.4f}, lr {lr:.2e}, {tokens_per_step / step_time:,.0f} tok/s",
                        refresh=False,
                    )
                    bar.update(1)
                    if on_step is not None:
                        try:
                            on_step(self, loss)
                        except KeyboardInterrupt:
                            stop.requested = True
        finally:
            bar.close()
        if interrupted:
            resume = "glassllm train --resume"
            if cfg.out_dir != TrainConfig().out_dir:
                resume += f" --out-dir {cfg.out_dir}"
            print(
                f"stopped at step {self.iteration}; checkpoint saved to {self.checkpoint_path}. "
                f"Continue with: {resume}",
                flush=True,
            )
        self._plot()
        sample = None
        if not interrupted and cfg.sample_tokens > 0:
            sample = self.sample_text(cfg.sample_tokens)
            print(
                f"--- sample ({cfg.sample_tokens} tokens, temperature "
                f"{FINAL_SAMPLE_TEMPERATURE}) ---\n{sample}\n---",
                flush=True,
            )
        return TrainResult(
            iteration=self.iteration,
            best_val_loss=self.best_val_loss,
            losses=losses,
            evaluations=evaluations,
            checkpoint=self.checkpoint_path,
            interrupted=interrupted,
            sample=sample,
            elapsed_s=self.elapsed_s,
        )

    def _describe(self) -> str:
        cfg = self.config
        start = f"resuming at step {self.iteration}" if self.resumed else "training from scratch"
        return (
            f"glassllm: {start} -> {cfg.max_iters} steps | GPT {cfg.n_layer} layers x "
            f"{cfg.n_embd} wide, {cfg.n_head} heads, context {cfg.block_size}: "
            f"{self.model.num_parameters() / 1e6:.2f}M parameters | {cfg.tokenizer} tokenizer, "
            f"vocabulary {self.tokenizer.vocab_size} | data {cfg.data}: {len(self.corpus.train):,} "
            f"training and {len(self.corpus.val):,} validation tokens | out_dir {cfg.out_dir}"
        )

    def _evaluation_due(self) -> bool:
        at_interval = self.iteration % self.config.eval_interval == 0
        at_end = self.iteration >= self.config.max_iters
        return (at_interval or at_end) and self.iteration != self.last_eval_iteration

    def _evaluate_and_checkpoint(self, tokens_per_step: int) -> dict[str, Any]:
        losses = self.evaluate()
        if self.best_val_loss is None or losses["val"] < self.best_val_loss:
            self.best_val_loss = losses["val"]
        self.last_eval_iteration = self.iteration
        record = {
            "iter": self.iteration,
            "train_loss": losses["train"],
            "val_loss": losses["val"],
            "lr": self.learning_rate(self.iteration),
            "tokens": self.iteration * tokens_per_step,
            "elapsed_s": round(self.elapsed_s, 3),
        }
        self.save_checkpoint()  # before the log line: a logged evaluation always has its checkpoint
        with self.log_path.open("a") as log:
            log.write(json.dumps(record) + "\n")
        return record

    def _plot(self) -> None:
        path = self.out_dir / PLOT_NAME
        if not plot_losses(self.log_path, path):
            print(
                f"{PLOT_NAME} skipped: matplotlib is not installed (pip install 'glassllm[plot]')",
                flush=True,
            )


def plot_losses(log_path: str | Path, png_path: str | Path) -> bool:
    """Draw the train and val loss of every evaluation in ``log_path`` into ``png_path``.

    Returns False (and writes nothing) when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    records = [json.loads(line) for line in Path(log_path).read_text().splitlines() if line]
    iters = [r["iter"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(iters, [r["train_loss"] for r in records], marker=".", label="train")
    ax.plot(iters, [r["val_loss"] for r in records], marker=".", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title("glassllm training")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return True


def train(config: TrainConfig, resume: bool = False, progress: bool | None = None) -> TrainResult:
    """Train as ``glassllm train`` does: ``train(TrainConfig(max_iters=100))``."""
    return Trainer(config, resume=resume).fit(progress=progress)
