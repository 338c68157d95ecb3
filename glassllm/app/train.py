"""Train a GPT on text: the loop behind ``glassllm train`` (its options: `glassllm.app.config`;
what a run starts from, a new model, a resumed one or ``--init-from`` a checkpoint:
`glassllm.app.run_start`).

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
* A loss, learning rate or weight that is not finite stops the run (`TrainingDiverged`) before
  anything is saved or logged: the last checkpoint, and the log, stay as they were.

Files in ``out_dir``: ``ckpt.safetensors`` (model, optimizer, and JSON metadata: iteration, best
validation loss, configuration, tokenizer (a BPE's whole ``tokenizer.json``), generator states),
``log.jsonl`` (one line per evaluation: losses in nats per token and, as ``train_bpc`` and
``val_bpc``, in bits per character of text, which compare across tokenizers), ``stats.jsonl``
(every ``stats_interval`` steps: `glassllm.app.stats.StatsLog`) and ``loss.png`` (when
matplotlib is installed).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import glassllm
from glassllm import no_grad, threads
from glassllm.app.config import (
    CHECKPOINT_NAME,
    LOG_NAME,
    PLOT_NAME,
    STATS_NAME,
    TrainConfig,
)
from glassllm.app.jsonl import print_warning
from glassllm.app.out_dir import check_new_run, check_out_dir, remove_run
from glassllm.app.parallel import TrainParallel, agreement, stop_signals
from glassllm.app.plot import plot_or_say_how
from glassllm.app.run_log import EvalRecord, RunLog, kept_log
from glassllm.app.run_start import start_run
from glassllm.app.run_state import GeneratorStates, RunState, SavedRun
from glassllm.app.stats import StatsLog
from glassllm.app.stopping import StopOnCtrlC, TrainingDiverged, stopped_message
from glassllm.app.thread_check import adapts_by_default
from glassllm.checkpoint import load
from glassllm.data import TokenSplits, bits_per_character, get_batch
from glassllm.distributed import World
from glassllm.kernels import compiled
from glassllm.nn.utils import clip_grad_norm_
from glassllm.optim.lr_scheduler import cosine_with_warmup

# How the start-up line names the model of each --arch.
_ARCH_NAMES = {"gpt2": "GPT", "llama": "Llama-style GPT"}

__all__ = ["TrainConfig", "TrainResult", "Trainer", "TrainingDiverged", "train"]

FINAL_SAMPLE_TEMPERATURE = 0.8  # nanoGPT's sample.py default
# why: one forward over 4 evaluation batches costs less per row than 4 (tiny GPT: 9.2 vs 10.6 ms
# per 12 rows) while the logits stay under 64 MiB; a large vocabulary keeps one batch a forward.
EVAL_BATCHES_PER_FORWARD, _EVAL_LOGITS = 4, 1 << 24


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


class Trainer:
    """One training run: ``Trainer(config).fit()``, or ``Trainer(config, resume=True).fit()``.

    resume: False (a fresh run), True (continue from ``OUT_DIR/ckpt.safetensors``), or the
    `SavedRun` of that checkpoint read with ``resuming=True`` (``glassllm train --resume`` reads
    it once to build ``config``); either way `SavedRun.check_resumable` checks ``config``.

    Construction does everything that can fail because of the input (configuration, out_dir,
    data, checkpoint) and raises ValueError or OSError before any file is written or the default
    generator is reseeded: a failed construction changes nothing.

    world: the ranks of an ``mpiexec -n N`` run (see `glassllm.app.parallel`); None: alone.
    overwrite: a fresh run replaces the run in ``out_dir`` (else refused: `glassllm.app.out_dir`).
    """

    def __init__(
        self,
        config: TrainConfig,
        resume: bool | SavedRun = False,
        world: World | None = None,
        overwrite: bool = False,
    ) -> None:
        self.world, self.overwrite = World() if world is None else world, overwrite
        with agreement(self.world):  # every rank fails together, or none does
            self._setup(config, resume)
        self.parallel = TrainParallel.join(self)  # the same config, text and model everywhere
        self._adaptive_default: bool | None = None  # adapt threads to the load? (train_step)
        # Last, once nothing can fail: out_dir, and the default generator (for layers given no rng)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        glassllm.manual_seed(config.seed)
        if self._default_rng_state is not None:
            glassllm.get_rng().bit_generator.state = self._default_rng_state

    def _setup(self, config: TrainConfig, resume: bool | SavedRun) -> None:
        config.validate()
        self.config = config
        self.out_dir = Path(config.out_dir)
        self.checkpoint_path = self.out_dir / CHECKPOINT_NAME
        self.log_path = self.out_dir / LOG_NAME
        check_out_dir(self.out_dir)
        saved = resume if isinstance(resume, SavedRun) else None
        if resume is True:
            saved = SavedRun.read(self.checkpoint_path, resuming=True)
        if saved is not None:
            saved.check_resumable(config)
        if self.world.is_main:  # rank 0 alone writes the run's files
            check_new_run(self.out_dir, self.overwrite, resuming=saved is not None)
        self.resumed = saved is not None
        # Separate generators, so that e.g. evaluating never shifts the training batches:
        # model_rng initialises the weights and then drives dropout (the model keeps it);
        # batch_rng draws the training batches.
        self.model_rng = np.random.default_rng([config.seed, 0])
        self.batch_rng = np.random.default_rng([config.seed, 1])

        start = start_run(config, saved, self.model_rng)  # tokens, tokenizer, model
        self.corpus: TokenSplits = start.corpus  # a text tokenized now, or prepared shards
        self.tokenizer = self.corpus.tokenizer
        self.characters_per_token = self.corpus.characters_per_token()  # for bits per char
        self.model_config, self.model = start.model_config, start.model
        self.chat_template = start.chat_template  # (None unless --init-from an instruct model)
        self.optimizer = self.model.configure_optimizer(
            config.lr, config.weight_decay, (config.beta1, config.beta2)
        )
        # why: listed once; walking the module tree costs ~0.2 ms, 0.5% of a tiny step
        self.parameters = list(self.model.parameters())
        compiled.load()  # the fast extra's kernels now (~0.45 s), not in the first evaluation
        self.stats = StatsLog(  # reads the model, never writes it; rank 0 alone writes the file
            self.out_dir / STATS_NAME,
            self.model.named_parameters(),
            config.stats_interval if self.world.is_main else 0,
            config.grad_clip,
        )
        self.iteration = 0
        self.best_val_loss: float | None = None
        self.last_eval_iteration: int | None = None
        self.last_eval_record: EvalRecord | None = None
        self.elapsed_s = 0.0
        if saved is not None:
            self._restore(saved)
        self._default_rng_state = None if saved is None else saved.state.rng.default

    # ---- resuming

    def _restore(self, saved: SavedRun) -> None:
        """Load model and optimizer state from ``saved`` and continue its counters and
        generators. The optimizer keeps the configuration's hyper-parameters (lr, betas, weight
        decay, eps): the file's are those of the checkpoint's configuration, which the options
        given for the resume may have changed (see `glassllm.app.run_state`)."""
        configured = [
            {key: group[key] for key in self.optimizer.defaults}
            for group in self.optimizer.param_groups
        ]
        load(saved.checkpoint, self.model, self.optimizer)  # checks everything, then copies
        for group, hyperparameters in zip(self.optimizer.param_groups, configured, strict=True):
            group.update(hyperparameters)
        state = saved.state
        self.model_rng.bit_generator.state = state.rng.model
        self.batch_rng.bit_generator.state = state.rng.batches
        self.iteration = state.iteration
        self.best_val_loss = state.best_val_loss
        self.last_eval_iteration = state.last_eval_iteration
        self.last_eval_record = state.last_eval_record
        self.elapsed_s = float(state.elapsed_s)
        if state.data_sha256 != self.corpus.sha256 and self.world.is_main:
            print(
                f"glassllm: warning: {self.config.data!r} is not the text this checkpoint was "
                "trained on; the run continues on the new text",
                file=sys.stderr,
            )

    # ---- checkpoints and logs

    def run_state(self) -> RunState:
        """The run as its checkpoint records it."""
        return RunState(
            model_config=self.model_config,
            tokenizer=self.tokenizer,
            iteration=self.iteration,
            best_val_loss=self.best_val_loss,
            last_eval_iteration=self.last_eval_iteration,
            last_eval_record=self.last_eval_record,
            elapsed_s=self.elapsed_s,
            config=self.config,
            data_sha256=self.corpus.sha256,
            rng=GeneratorStates.capture(self.model_rng, self.batch_rng),
            chat_template=self.chat_template,
        )

    def metadata(self) -> dict[str, Any]:
        """The checkpoint metadata of the run now (`RunState.to_metadata`)."""
        return self.run_state().to_metadata()

    def save_checkpoint(self) -> Path:
        """Write the checkpoint (atomically, on rank 0: every rank holds the same state);
        `TrainingDiverged` instead if a weight is not finite, so that the last good one stays."""
        for name, param in self.model.named_parameters():
            if not np.isfinite(param.data).all():
                self._diverged(f"the weights {name} hold NaN or infinite values")
        if self.world.is_main:
            glassllm.save(self.checkpoint_path, self.model, self.optimizer, self.metadata())
        return self.checkpoint_path

    def _start_log(self) -> None:
        """A fresh run starts an empty log; a resumed one keeps the records up to its checkpoint
        (dropping any a crash left behind after it). Written with the first evaluation, together
        with its checkpoint: a run that fails before then leaves an old log as it was."""
        kept = ""
        warn = print_warning if self.world.is_main else None  # a bad line kept out: say so, once
        if self.overwrite and self.world.is_main:  # the old run's files go before any new one
            remove_run(self.out_dir)
        if self.resumed:
            kept = kept_log(self.log_path, self.last_eval_iteration, self.last_eval_record, warn)
        self.log = RunLog(self.log_path, kept)
        self.stats.start(self.iteration if self.resumed else None, warn)  # as far as the ckpt

    def evaluate(self) -> dict[str, float]:
        """Mean loss of ``eval_iters`` batches of each split, in eval mode under no_grad.

        The batches come from a generator seeded by the run's seed alone: the same batches at
        every evaluation, and the training generators untouched.
        """
        cfg = self.config
        losses: dict[str, float] = {}
        logits = cfg.batch_size * cfg.block_size * self.model.config.vocab_size
        group = max(1, min(EVAL_BATCHES_PER_FORWARD, _EVAL_LOGITS // logits))
        with self.model.evaluating(), no_grad():
            for index, (split, data) in enumerate(
                (("train", self.corpus.train), ("val", self.corpus.val))
            ):
                rng = np.random.default_rng([cfg.seed, 2, index])
                batches = [
                    get_batch(data, cfg.block_size, cfg.batch_size, rng)
                    for _ in range(cfg.eval_iters)
                ]
                total = 0.0
                for start in range(0, cfg.eval_iters, group):  # the same groups on any N
                    if self.parallel.evaluates(start // group):  # ranks share the groups
                        xs, ys = zip(*batches[start : start + group], strict=True)
                        loss = self.model(np.concatenate(xs), np.concatenate(ys))[1]
                        total += float(loss.data) * len(xs)  # equal batches: mean of means
                losses[split] = total
        totals = self.parallel.sum([losses["train"], losses["val"]])
        return {split: total / cfg.eval_iters for split, total in zip(losses, totals, strict=True)}

    def learning_rate(self, iteration: int) -> float:
        cfg = self.config
        return cosine_with_warmup(iteration, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.decay_iters)

    def train_step(self, lr: float | None = None) -> float:
        """One optimisation step on a fresh random batch at learning rate ``lr`` (default: the
        schedule's, `learning_rate`); returns its loss (before the update)."""
        if lr is None:
            lr = self.learning_rate(self.iteration)
        if not math.isfinite(lr):
            self._diverged(f"the learning rate is {lr}")
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self._adaptive_default is None:  # once, before the first step: see thread_check
            self._adaptive_default = adapts_by_default(self)
        with threads.adaptive_step(default=self._adaptive_default, blas=True):  # time -> threads
            return self._step(lr)

    def _step(self, lr: float) -> float:
        cfg = self.config
        x, y = get_batch(self.corpus.train, cfg.block_size, cfg.batch_size, self.batch_rng)
        # (B, T) -> the whole batch's mean cross-entropy, the same on every rank; its gradient
        # averaged over micro-batches and ranks
        loss_value = self.parallel.backward(self.model, x, y, self.iteration)
        if not math.isfinite(loss_value):  # before the update: the weights stay as they were
            self._diverged(f"the training loss is {loss_value}")
        norm = None
        if cfg.grad_clip > 0.0:
            norm = clip_grad_norm_(self.parameters, cfg.grad_clip)
        self.stats.before_update(self.iteration, norm, self.iteration == self.last_eval_iteration)
        self.optimizer.step()
        self.stats.after_update(loss_value, lr)
        self.optimizer.zero_grad()
        self.iteration += 1
        return loss_value

    def _diverged(self, what: str) -> typing.NoReturn:
        last = (
            "no checkpoint was saved"
            if self.last_eval_iteration is None
            else f"the checkpoint of step {self.last_eval_iteration} is kept"
        )
        raise TrainingDiverged(
            f"training diverged at step {self.iteration}: {what}; {last} (try a smaller --lr "
            f"than {self.config.lr:g}, or --grad-clip)"
        )

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
        main = self.world.is_main  # the one rank that writes (the others' stdout is muted)
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
            disable=(None if progress is None else not progress) if main else True,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            file=sys.stderr,
        )
        try:
            # NaN and overflow are caught as values (TrainingDiverged), not warned about
            with (
                StopOnCtrlC(main, stop_signals(self.world)) as stop,
                np.errstate(over="ignore", invalid="ignore", divide="ignore"),
            ):
                while True:
                    self.elapsed_s = elapsed_before + time.perf_counter() - clock
                    if self.parallel.stop_agreed(stop.requested):
                        interrupted = True
                        self.save_checkpoint()
                        break
                    lr = self.learning_rate(self.iteration)  # of this step, and of its evaluation
                    if self._evaluation_due():
                        record = self._evaluate_and_checkpoint(tokens_per_step, lr)
                        evaluations.append(record)
                        bar.write(
                            f"step {record['iter']}: train loss {record['train_loss']:.4f}, "
                            f"val loss {record['val_loss']:.4f} ({record['val_bpc']:.3f} "
                            "bits/char)",
                            file=sys.stdout,
                        )
                    if self.iteration >= cfg.max_iters:
                        if self.iteration == self.last_eval_iteration:
                            self.stats.after_last_evaluation(self.iteration)
                        break
                    started = time.perf_counter()
                    loss = self.train_step(lr)
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
            threads.end_adaptive()  # all threads again for the evaluation and the sample
        if interrupted:
            print(stopped_message(self.iteration, self.checkpoint_path, cfg.out_dir), flush=True)
        if main:  # rank 0 plots and samples
            plot_or_say_how(self.log_path, self.out_dir / PLOT_NAME)
        sample = None
        if main and not interrupted and cfg.sample_tokens > 0:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
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
        cfg, model = self.config, self.model_config
        kv = model.kv_heads
        heads = f"{model.n_head} heads" + ("" if kv == model.n_head else f" ({kv} key/value)")
        start = f"resuming at step {self.iteration}" if self.resumed else "training from scratch"
        name, context = _ARCH_NAMES[cfg.arch], f"context {cfg.block_size}"
        if cfg.init_from is not None:  # the model's own context, and the windows trained on
            start = start if self.resumed else "finetuning"
            name, context = f"GPT from {cfg.init_from}", f"{context} of {model.block_size}"
        return (
            f"glassllm: {start} -> {cfg.max_iters} steps | {name} {model.n_layer} layers x "
            f"{model.n_embd} wide, {heads}, {context}: "
            f"{self.model.num_parameters() / 1e6:.2f}M parameters | {self.tokenizer.kind} "
            f"tokenizer, vocabulary {self.tokenizer.vocab_size} | data {cfg.data}: "
            f"{len(self.corpus.train):,} training and {len(self.corpus.val):,} validation "
            f"tokens | out_dir {cfg.out_dir}"
            f"{self.parallel.describe(cfg.batch_size)}"
        )

    def _evaluation_due(self) -> bool:
        at_interval = self.iteration % self.config.eval_interval == 0
        at_end = self.iteration >= self.config.max_iters
        return (at_interval or at_end) and self.iteration != self.last_eval_iteration

    def _evaluate_and_checkpoint(self, tokens_per_step: int, lr: float) -> dict[str, Any]:
        losses = self.evaluate()
        self.parallel.check_replicas()  # every rank still holds rank 0's model
        for split, loss in losses.items():
            if not math.isfinite(loss):  # before the checkpoint: the last good one stays
                self._diverged(f"the {split} loss is {loss}")
        if self.best_val_loss is None or losses["val"] < self.best_val_loss:
            self.best_val_loss = losses["val"]
        self.last_eval_iteration = self.iteration
        self.last_eval_record = EvalRecord(
            iter=self.iteration,
            train_loss=losses["train"],
            val_loss=losses["val"],
            train_bpc=bits_per_character(losses["train"], self.characters_per_token["train"]),
            val_bpc=bits_per_character(losses["val"], self.characters_per_token["val"]),
            lr=lr,
            tokens=self.iteration * tokens_per_step,
            elapsed_s=round(self.elapsed_s, 3),
        )
        # The checkpoint first, carrying the record: a logged evaluation always has its
        # checkpoint, and a line lost by a kill before the append is restored on resume.
        self.save_checkpoint()
        if self.world.is_main:
            self.log.append(self.last_eval_record)
        return self.last_eval_record.to_dict()


def train(
    config: TrainConfig, resume: bool = False, progress: bool | None = None, overwrite: bool = False
) -> TrainResult:
    """Train as ``glassllm train`` does: ``train(TrainConfig(max_iters=100))``."""
    return Trainer(config, resume=resume, overwrite=overwrite).fit(progress=progress)
