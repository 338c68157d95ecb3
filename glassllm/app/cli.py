"""The ``glassllm`` command: ``glassllm train``, ``prepare``, ``sample``, ``chat``, ``export``,
``view``.

The options of each command are the fields of its configuration dataclass
(:class:`glassllm.app.config.TrainConfig`, :class:`glassllm.app.config.SampleConfig`,
:class:`glassllm.app.chat.ChatConfig`, :class:`glassllm.app.export.ExportConfig`,
:class:`glassllm.app.config.ViewConfig`), built by
`glassllm.app.options.add_options`: the name with dashes (``n_layer`` -> ``--n-layer``), parsed
with the field's type, help showing its range and default. Bad input (a missing data file, an
impossible configuration, a broken checkpoint, ...) ends with one line on stderr,
``glassllm: error: ...``, and exit status 2, never a traceback. A traceback means a bug.

Exit status: 0 done (``view``: stopped by Ctrl-C), 2 bad input (or a training run that
diverged), 130 stopped by Ctrl-C (during training: after saving a checkpoint; before: at once,
with one line).

Text the program prints that the terminal's encoding cannot show (a sample of a non-ASCII corpus
under ``PYTHONIOENCODING=ascii``) is written with backslash escapes, never an error.

Under ``mpiexec -n N`` (see `glassllm.app.parallel`) rank 0 alone prints; a bad start ends
every rank with exit status 2, an error of one rank during training ends them all.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import sys
import typing
from collections.abc import Sequence

# why: nothing heavy (NumPy, the library) is imported at the top of this module: main's Ctrl-C
# handling starts before those imports, which take most of a start-up.

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


def _describe(err: BaseException, smaller: str | None) -> str:
    """The message of an error from _INPUT_ERRORS; ``smaller``: options that shrink the job
    (None when the options are not the cause, e.g. reading a checkpoint)."""
    hint = "" if smaller is None else f"; try {smaller}"
    if isinstance(err, MemoryError):
        return f"not enough memory ({str(err) or 'MemoryError'}){hint}"
    if isinstance(err, OverflowError):
        return f"a number is too large to compute with ({err}){hint}"
    return str(err) or type(err).__name__


_TRAIN_SMALLER = "a smaller --batch-size, --block-size, --n-embd or --n-layer"
_SAMPLE_SMALLER = "a smaller --num-samples or --max-new-tokens"


def build_parser() -> argparse.ArgumentParser:
    from glassllm.app.config import LaunchConfig, SampleConfig, TrainConfig, ViewConfig
    from glassllm.app.options import add_options

    parser = _Parser(
        prog="glassllm",
        description="Train a tiny GPT on text with a NumPy autograd engine, and sample from it.",
    )
    commands = parser.add_subparsers(
        dest="command", metavar="{train,prepare,sample,chat,export,view}"
    )

    train = commands.add_parser(
        "train",
        help="train a GPT (defaults: a small model on the built-in corpus, a few minutes)",
        description="Train a GPT on text. Without options: a small character-level model on the "
        "Python documentation that ships with Python, in a few minutes on a laptop CPU.",
    )
    add_options(train, TrainConfig)
    add_options(
        train.add_argument_group("on N processes (mpiexec -n N glassllm train)"), LaunchConfig
    )
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT_DIR/ckpt.safetensors exactly where it stopped; the model, data, "
        "tokenizer and seed come from the checkpoint, other options given replace its values",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run even though OUT_DIR holds one (its checkpoint, log, statistics "
        "and plot are removed when training starts); without it, such an OUT_DIR is refused",
    )

    from glassllm.app.prepare import add_parser

    add_parser(commands)

    sample = commands.add_parser(
        "sample",
        help="generate text from a checkpoint",
        description="Generate text from a trained checkpoint (which holds the model and its "
        "tokenizer), or from a Hugging Face GPT-2 directory such as a downloaded gpt2.",
    )
    add_options(sample, SampleConfig)

    from glassllm.app.chat import ChatConfig

    chat = commands.add_parser(
        "chat",
        help="chat with an instruct model (a GGUF file or a Hugging Face directory)",
        description="Chat in the terminal with an instruct model through its own chat template: "
        "one message per line of standard input, the answer streamed as it is generated. "
        "Ctrl-C stops an answer; Ctrl-D (the end of input) ends the chat.",
    )
    add_options(chat, ChatConfig)

    from glassllm.app.export import ExportConfig

    export = commands.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face GPT-2 directory",
        description="Write a checkpoint (model and tokenizer) as a Hugging Face GPT-2 directory "
        "that transformers' AutoModelForCausalLM and AutoTokenizer load.",
    )
    add_options(export, ExportConfig)

    view = commands.add_parser(
        "view",
        help="a local web page onto a run: sampling, the model's insides, training, autograd",
        description="Serve a page on this machine that shows the run in OUT_DIR: sample with "
        "every token's probability and alternatives, attention, logit lens and MLP neurons, "
        "the training curves (followed while the run trains) and the autograd graph of small "
        "expressions. Stop it with Ctrl-C.",
    )
    add_options(view, ViewConfig)
    return parser


def _run_train(args: argparse.Namespace) -> int:
    from glassllm.app import parallel
    from glassllm.app.config import (
        DEFAULT_OUT_DIR,
        LaunchConfig,
        TrainConfig,
        refuse_init_checkpoint_options,
    )
    from glassllm.app.options import given_options
    from glassllm.app.run_state import read_for_resume
    from glassllm.app.train import Trainer, TrainingDiverged

    launch = parallel.detect_launch()  # from the environment: MPI has not started
    fail = _fail if launch is None or launch.rank == 0 else _fail_quietly
    given = given_options(args, TrainConfig)
    try:
        settings = LaunchConfig(**given_options(args, LaunchConfig))
        settings.validate()
        if not args.resume:  # what can be checked before MPI starts
            if given.get("init_from") is not None:  # its shape and tokenizer: the checkpoint's
                refuse_init_checkpoint_options(given, given["init_from"])
            elif (implied := _prepared_tokenizer(given.get("data", "builtin"))) is not None:
                given.setdefault("tokenizer", implied)  # a prepared DIR's own
            config = TrainConfig(**given)
            config.validate()
            parallel.check_split(config.batch_size, config.grad_accum, launch)
        world = parallel.start_world(settings)
    except (*_INPUT_ERRORS, RuntimeError) as err:  # RuntimeError: a launcher but no mpi4py
        return fail(_describe(err, _TRAIN_SMALLER))
    saved = None
    try:
        # What each rank was asked for: the whole configuration when not resuming (else the
        # options given: the rest comes from rank 0's checkpoint), and how it was launched.
        parallel.check_same_resume(world, args.resume)
        if args.resume and args.overwrite:
            raise ValueError(
                "--overwrite starts a new run and --resume continues the one there: give only one"
            )
        asked = given if args.resume else config.to_dict()
        world.check_same({**asked, **dataclasses.asdict(settings)}, what="configuration")
        if args.resume:  # rank 0 reads the checkpoint once, for the configuration and the state
            with parallel.agreement(world):
                if world.is_main:
                    saved = read_for_resume(given.get("out_dir", DEFAULT_OUT_DIR))
            saved = world.broadcast_object(saved)
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:  # the file's fault, not the options'
        return fail(_describe(err, None))
    try:
        if saved is not None:
            with parallel.agreement(world):
                config = saved.resume_config(given)
                parallel.check_split(
                    config.batch_size,
                    config.grad_accum,
                    parallel.Launch("", world.rank, world.size),
                )
        resume = False if saved is None else saved
        trainer = Trainer(config, resume=resume, world=world, overwrite=args.overwrite)
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:  # the same error on every rank (agreed): rank 0 prints it
        return fail(_describe(err, _TRAIN_SMALLER))
    try:
        result = trainer.fit()  # Ctrl-C: fit saves a checkpoint and returns interrupted
    except BrokenPipeError:
        raise
    except TrainingDiverged as err:  # every rank at the same step (the losses are summed)
        return fail(str(err))
    except _INPUT_ERRORS as err:  # e.g. the disk filled up; the last checkpoint is intact
        message = f"training stopped at step {trainer.iteration}: " + _describe(err, _TRAIN_SMALLER)
        if world.size > 1:  # one rank's error: the others wait at the next collective
            world.abort(" ".join(message.split()), EXIT_BAD_INPUT)
        return _fail(message)
    except KeyboardInterrupt:  # a second Ctrl-C: end every rank now
        if world.size > 1:
            world.abort("interrupted (a second Ctrl-C)", EXIT_INTERRUPTED)
        raise
    return EXIT_INTERRUPTED if result.interrupted else 0


def _prepared_tokenizer(data: str) -> str | None:
    from glassllm.app.training_data import tokenizer_option_for

    return tokenizer_option_for(data)


def _run_prepare(args: argparse.Namespace) -> int:
    from glassllm.app.prepare import run_prepare

    try:
        run_prepare(args)
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:
        return _fail(_describe(err, None))
    return 0


def _fail_quietly(message: str) -> int:
    """A rank other than 0 failing as every rank does: rank 0 prints the message."""
    return EXIT_BAD_INPUT


def _run_sample(args: argparse.Namespace) -> int:
    from glassllm.app.config import SampleConfig
    from glassllm.app.options import given_options
    from glassllm.app.sample import SampleJob

    try:
        job = SampleJob.prepare(SampleConfig(**given_options(args, SampleConfig)))
        job.run(sys.stdout)
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:
        return _fail(_describe(err, _SAMPLE_SMALLER))
    return 0


def _run_chat(args: argparse.Namespace) -> int:
    from glassllm.app.chat import ChatConfig, main_chat
    from glassllm.app.options import given_options

    try:
        main_chat(ChatConfig(**given_options(args, ChatConfig)))
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:
        return _fail(_describe(err, None))
    return 0


def _run_export(args: argparse.Namespace) -> int:
    from glassllm.app.export import ExportConfig, export
    from glassllm.app.options import given_options

    try:
        export(ExportConfig(**given_options(args, ExportConfig)), sys.stdout)
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:
        return _fail(_describe(err, None))
    return 0


def _run_view(args: argparse.Namespace) -> int:
    from glassllm.app.config import ViewConfig
    from glassllm.app.options import given_options
    from glassllm.app.view import serve

    try:
        config = ViewConfig(**given_options(args, ViewConfig))
        config.validate()
        serve(config.out_dir, config.checkpoint, config.host, config.port, config.browser)
    except BrokenPipeError:
        raise
    except _INPUT_ERRORS as err:
        return _fail(_describe(err, "a smaller model"))
    return 0  # Ctrl-C while serving: serve says so and returns


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``glassllm`` console script and ``python -m glassllm``."""
    try:  # from the first statement: a Ctrl-C at any moment is one line and status 130
        with _escaping_unencodable_output():
            return _main(argv)
    except KeyboardInterrupt:
        print("\nglassllm: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


@contextlib.contextmanager
def _escaping_unencodable_output() -> typing.Iterator[None]:
    """While the command runs, stdout and stderr write a character their encoding lacks as a
    backslash escape (``\\xe9``) instead of raising UnicodeEncodeError."""
    restore = []
    for stream in (sys.stdout, sys.stderr):
        # surrogateescape (a C locale's default) still fails on a lone surrogate not from a byte
        if isinstance(stream, io.TextIOWrapper) and stream.errors in ("strict", "surrogateescape"):
            with contextlib.suppress(ValueError, io.UnsupportedOperation):
                errors = stream.errors
                stream.reconfigure(errors="backslashreplace")
                restore.append((stream, errors))
    try:
        yield
    finally:
        for stream, errors in restore:
            with contextlib.suppress(ValueError, io.UnsupportedOperation):
                stream.reconfigure(errors=errors)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return _fail("choose a command: train, prepare, sample, export or view")  # (or chat)

    from glassllm.app.allocator import tune_allocator

    tune_allocator()  # reuse freed step buffers instead of page-faulting them back every step
    try:
        if args.command == "train":
            return _run_train(args)
        if args.command == "prepare":
            return _run_prepare(args)
        if args.command == "export":
            return _run_export(args)
        if args.command == "view":
            return _run_view(args)
        if args.command == "chat":
            return _run_chat(args)
        return _run_sample(args)
    except BrokenPipeError:  # e.g. `glassllm sample | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0
