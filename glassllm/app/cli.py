"""The ``glassllm`` command: ``glassllm train`` and ``glassllm sample``.

Every field of :class:`glassllm.app.train.TrainConfig` is a ``train`` option, its name with dashes
(``n_layer`` -> ``--n-layer``), parsed with the field's type. Bad input (a missing data file, an
impossible configuration, a broken checkpoint, ...) ends with one line on stderr,
``glassllm: error: ...``, and exit status 2, never a traceback. A traceback means a bug.

Exit status: 0 done, 2 bad input, 130 stopped by Ctrl-C (after saving a checkpoint).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd program


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``glassllm: error: <message>`` (no usage block)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_BAD_INPUT, f"glassllm: error: {message} (see '{self.prog} --help')\n")


def _fail(message: str) -> int:
    print(f"glassllm: error: {' '.join(message.split())}", file=sys.stderr)  # one line
    return EXIT_BAD_INPUT


# Errors that input can cause: bad values (ValueError, which includes the data, tokenizer and
# checkpoint errors), files (OSError: missing, unwritable, disk full) and sizes the machine cannot
# hold (MemoryError) or NumPy cannot index (OverflowError). BrokenPipeError, an OSError, is not
# among them: a reader that went away is handled in main().
_INPUT_ERRORS = (ValueError, OSError, MemoryError, OverflowError)


def _describe(err: BaseException, smaller: str) -> str:
    """The message of an error from _INPUT_ERRORS; ``smaller``: options that shrink the job."""
    if isinstance(err, MemoryError):
        return f"not enough memory ({str(err) or 'MemoryError'}); try {smaller}"
    if isinstance(err, OverflowError):
        return f"a number is too large to compute with ({err}); try {smaller}"
    return str(err) or type(err).__name__


_TRAIN_SMALLER = "a smaller --batch-size, --block-size, --n-embd or --n-layer"
_SAMPLE_SMALLER = "a smaller --num-samples or --max-new-tokens"


def _field_type(annotation: Any) -> type:
    """The scalar type behind a field's annotation: ``int | None`` -> int."""
    if isinstance(annotation, (types.UnionType,)) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    if annotation in (int, float, str, bool):
        return annotation
    raise TypeError(f"no command-line parser for a field of type {annotation!r}")


def _float(text: str) -> float:
    """float() that refuses nan and inf, which no option here can use."""
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(text)
    return value


_float.__name__ = "float"  # argparse names the type in its message: "invalid float value"


# How an option's value is shown in --help, by type (a field's metadata may say otherwise).
_METAVARS = {bool: None, int: "N", float: "X", str: "TEXT"}


def add_config_options(parser: argparse.ArgumentParser, config_class: type) -> None:
    """One option per dataclass field, defaulting to "not given" so a resumed run can tell which
    options the user set."""
    hints = typing.get_type_hints(config_class)
    defaults = config_class()
    for field in dataclasses.fields(config_class):
        kind = _field_type(hints[field.name])
        flag = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        help_text = field.metadata.get("help", "")
        if "default:" not in help_text:  # a help that names its own default keeps it
            help_text += f" (default: {default})"
        choices = field.metadata.get("choices")
        metavar = "{" + ",".join(choices) + "}" if choices else _METAVARS[kind]
        if kind is bool:
            parser.add_argument(
                flag,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag,
                dest=field.name,
                type=_float if kind is float else kind,
                default=argparse.SUPPRESS,
                choices=choices,
                metavar=field.metadata.get("metavar", metavar),
                help=help_text,
            )


def build_parser() -> argparse.ArgumentParser:
    from glassllm.app.config import TrainConfig
    from glassllm.app.sample import DEFAULT_SAMPLE_OPTIONS as S

    parser = _Parser(
        prog="glassllm",
        description="Train a tiny GPT on text with a NumPy autograd engine, and sample from it.",
    )
    commands = parser.add_subparsers(dest="command", metavar="{train,sample}")

    train = commands.add_parser(
        "train",
        help="train a GPT (defaults: a small model on the built-in corpus, a few minutes)",
        description="Train a GPT on text. Without options: a small character-level model on the "
        "Python documentation that ships with Python, in a few minutes on a laptop CPU.",
    )
    add_config_options(train, TrainConfig)
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT_DIR/ckpt.safetensors exactly where it stopped; the model, data, "
        "tokenizer and seed come from the checkpoint, other options may be changed",
    )

    sample = commands.add_parser(
        "sample",
        help="generate text from a checkpoint",
        description="Generate text from a trained checkpoint (which holds the model and its "
        "tokenizer).",
    )
    sample.add_argument(
        "--checkpoint",
        default=S["checkpoint"],
        help=f"checkpoint file (default: {S['checkpoint']})",
    )
    sample.add_argument(
        "--prompt", default=S["prompt"], help="text to continue (default: a newline)"
    )
    sample.add_argument(
        "--num-samples",
        type=int,
        default=S["num_samples"],
        help=f"independent samples (default: {S['num_samples']})",
    )
    sample.add_argument(
        "--max-new-tokens",
        type=int,
        default=S["max_new_tokens"],
        help=f"tokens to generate per sample (default: {S['max_new_tokens']})",
    )
    sample.add_argument(
        "--temperature",
        type=_float,
        default=S["temperature"],
        help=f"> 1 flattens, < 1 sharpens the distribution (default: {S['temperature']})",
    )
    sample.add_argument(
        "--top-k",
        type=int,
        default=S["top_k"],
        help="sample only among the k most likely tokens (default: all)",
    )
    sample.add_argument(
        "--seed",
        type=int,
        default=S["seed"],
        help=f"seed of the sampling generator (default: {S['seed']})",
    )
    sample.add_argument(
        "--explain",
        action="store_true",
        help="print each generated token's probability and the top alternatives",
    )
    return parser


def _run_train(args: argparse.Namespace) -> int:
    from glassllm.app.train import TrainConfig, Trainer, resume_config

    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if hasattr(args, f.name)
    }
    try:
        config = resume_config(given) if args.resume else TrainConfig(**given)
        config.validate()
        trainer = Trainer(config, resume=args.resume)
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:
        return _fail(_describe(err, _TRAIN_SMALLER))
    try:
        result = trainer.fit()  # Ctrl-C: fit saves a checkpoint and returns interrupted
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:  # e.g. the disk filled up; the last checkpoint is intact
        return _fail(
            f"training stopped at step {trainer.iteration}: {_describe(err, _TRAIN_SMALLER)}"
        )
    return EXIT_INTERRUPTED if result.interrupted else 0


def _run_sample(args: argparse.Namespace) -> int:
    from glassllm.app.sample import SampleOptions

    try:
        options = SampleOptions(
            checkpoint=args.checkpoint,
            prompt=args.prompt,
            num_samples=args.num_samples,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
            explain=args.explain,
        )
        job = options.prepare()
        job.run(sys.stdout)
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:
        return _fail(_describe(err, _SAMPLE_SMALLER))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``glassllm`` console script and ``python -m glassllm``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return _fail("choose a command: train or sample")

    from glassllm.app.allocator import tune_allocator

    tune_allocator()  # reuse freed step buffers instead of page-faulting them back every step
    try:
        if args.command == "train":
            return _run_train(args)
        return _run_sample(args)
    except KeyboardInterrupt:
        print("\nglassllm: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `glassllm sample | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0
