"""The run state: one schema for a run's checkpoint metadata, checked value by value on reading;
resume reads the file once; the library never imports the program."""

from __future__ import annotations

import ast
import copy
import dataclasses
import doctest
import subprocess
import sys
from pathlib import Path

import pytest

import glassllm
import glassllm.app.options
import glassllm.app.run_state as run_state
from glassllm._text import shown
from glassllm.app.cli import main
from glassllm.app.config import CHECKPOINT_NAME, SampleConfig, TrainConfig
from glassllm.app.run_state import RunState, SavedRun
from glassllm.app.train import Trainer
from glassllm.checkpoint import CheckpointError

ROOT = Path(__file__).resolve().parents[2]
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 4-step run: its Trainer (out_dir holds the checkpoint)."""
    root = tmp_path_factory.mktemp("run")
    (root / "tiny.txt").write_text(TEXT)
    shape = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4)
    schedule = dict(max_iters=4, eval_interval=2, eval_iters=1, warmup_iters=1, sample_tokens=0)
    config = TrainConfig(**shape, **schedule, data=str(root / "tiny.txt"), out_dir=str(root / "o"))
    trainer = Trainer(config)
    trainer.fit(progress=False)
    return trainer


def test_metadata_round_trips_through_run_state(trained):
    metadata = trained.metadata()
    state = RunState.from_metadata(metadata, "x")
    assert state.to_metadata() == metadata
    assert state.config == trained.config and state.iteration == 4
    saved = SavedRun.read(trained.checkpoint_path)
    assert saved.state.to_metadata() == metadata
    assert saved.state.tokenizer.to_dict() == trained.tokenizer.to_dict()


def _set(path):
    """A mutation that sets metadata[path[0]][path[1]]... to a value."""

    def mutate(metadata, value):
        target = metadata
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _deep(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


# (where, value, fragment of the message): each a value a hostile or damaged file could hold.
BAD_VALUES = [
    (("model_config", "n_layer"), "x", "model_config"),
    (("model_config", "vocab_size"), 7, "vocabulary of 7"),
    (("model_config", "n_embd"), 32, "model_config.n_embd (32) disagrees with train_config"),
    (("train_config", "beta2"), [1, 2], "train_config.beta2 must be a number"),
    (("train_config", "eval_iters"), 0, "train_config.eval_iters must be in [1, 100000], got 0"),
    (("train_config", "lr"), 10**400, "train_config.lr must be a finite number"),
    (("train_config", "n_layer"), True, "train_config.n_layer must be an integer"),
    (("train_config", "no_such_field"), 1, "unknown TrainConfig fields"),
    (("best_val_loss",), "low", "best_val_loss must be a number or null"),
    (("elapsed_s",), {}, "elapsed_s must be a number"),
    (("iteration",), -1, "iteration must be in [0, 1000000000], got -1"),
    (("iteration",), 1.5, "iteration must be an integer"),
    (("last_eval_iteration",), "3", "last_eval_iteration must be an integer or null"),
    (("rng", "batches"), {"bit_generator": "PCG64", "state": 7}, "rng.batches"),
    (("rng",), [], "rng must be a JSON object"),
    (("tokenizer",), {"type": "wordpiece"}, "tokenizer: unknown tokenizer type"),
    (("data_sha256",), 5, "data_sha256 must be a text"),
    # found by tests/test_fuzz_checkpoint.py (each escaped as OverflowError or RecursionError)
    (
        ("train_config", "warmup_iters"),
        10**400,
        "warmup_iters must be in [0, 1000000000], got 100000000000000000...000",
    ),
    (("elapsed_s",), _deep(5000), "elapsed_s must be a number, got a deeply nested value"),
]


@pytest.mark.parametrize("where, value, fragment", BAD_VALUES, ids=[
    ".".join(w) + "=" + shown(v, 20) for w, v, _ in BAD_VALUES])  # fmt: skip
def test_from_metadata_names_the_file_and_the_field(trained, where, value, fragment):
    metadata = copy.deepcopy(trained.metadata())
    _set(where)(metadata, value)
    with pytest.raises(CheckpointError) as info:
        RunState.from_metadata(metadata, "runs/ckpt.safetensors")
    message = str(info.value)
    assert "'runs/ckpt.safetensors'" in message and fragment in message, message


def test_an_integer_learning_rate_too_large_for_the_warm_up_is_a_problem_not_a_crash():
    problems = TrainConfig(lr=10**308, warmup_iters=5).problems(label=lambda n: f"c.{n}")
    assert problems == [
        "c.lr (1e+308) is too large for a warm-up of 5 steps (lr x warmup_iters must stay below "
        "1.8e+308)"
    ]


def test_missing_required_entries_are_named(trained):
    metadata = trained.metadata()
    del metadata["model_config"], metadata["iteration"]
    with pytest.raises(CheckpointError, match="no 'model_config'.*no 'iteration'"):
        RunState.from_metadata(metadata, "f")


def test_resume_from_a_self_consistent_hostile_file_is_one_line(trained, tmp_path, capsys):
    """A value of the wrong type, saved with a valid digest, is refused before training starts
    (not at the first evaluation, with a traceback)."""
    metadata = trained.metadata()
    metadata["best_val_loss"] = "low"
    glassllm.save(tmp_path / CHECKPOINT_NAME, trained.model, trained.optimizer, metadata)
    status = main(["train", "--resume", "--out-dir", str(tmp_path), "--max-iters", "9"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "best_val_loss must be a number or null, got 'low'" in err
    assert str(tmp_path / CHECKPOINT_NAME) in err


def test_resume_reads_the_checkpoint_once_and_builds_one_model(trained, tmp_path, monkeypatch):
    import shutil

    out_dir = tmp_path / "copy"
    shutil.copytree(trained.out_dir, out_dir)
    reads, models = [], []
    real_read, real_init = run_state.read, glassllm.models.GPT.__init__
    monkeypatch.setattr(run_state, "read", lambda path: reads.append(path) or real_read(path))
    monkeypatch.setattr(glassllm.checkpoint, "read_metadata", None)  # not called at all

    def counting_init(self, *args, **kwargs):
        models.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(glassllm.models.GPT, "__init__", counting_init)
    assert main(["train", "--resume", "--out-dir", str(out_dir), "--max-iters", "6"]) == 0
    assert len(reads) == 1 and len(models) == 1


def test_resume_keeps_the_configured_optimizer_hyperparameters(trained, tmp_path):
    """Options given for a resume replace the checkpoint's optimizer hyper-parameters; the
    others come back as saved (the matrices decay, biases and gains do not)."""
    import shutil

    out_dir = tmp_path / "copy"
    shutil.copytree(trained.out_dir, out_dir)
    given = {"out_dir": str(out_dir), "max_iters": 6, "beta2": 0.9, "weight_decay": 0.3}
    saved = run_state.read_for_resume(out_dir)
    resumed = Trainer(saved.resume_config(given), resume=saved)
    decay, no_decay = resumed.optimizer.param_groups
    assert decay["betas"] == no_decay["betas"] == (0.9, 0.9)
    assert decay["weight_decay"] == 0.3 and no_decay["weight_decay"] == 0.0
    assert decay["eps"] == trained.optimizer.param_groups[0]["eps"]
    for name, state in trained.optimizer.state.items():
        assert resumed.optimizer.state[name]["step"] == state["step"]


# A value other than the trained run's for each field the checkpoint fixes (each valid alone).
CHANGED = dict(n_layer=2, n_head=4, n_embd=32, block_size=8, dropout=0.1, bias=True,
               data="other.txt", tokenizer="bpe", vocab_size=300, seed=7)  # fmt: skip


@pytest.mark.parametrize("name", run_state.FIXED_ON_RESUME)
def test_each_fixed_field_is_refused_on_resume(trained, name):
    assert CHANGED[name] != getattr(trained.config, name)
    saved = run_state.read_for_resume(trained.out_dir)
    config = saved.resume_config({name: CHANGED[name], "max_iters": 9})
    with pytest.raises(ValueError, match=f"cannot change {name}="):
        saved.check_resumable(config)
    with pytest.raises(ValueError, match=f"cannot change {name}="):
        run_state.resume_config({"out_dir": trained.out_dir, name: CHANGED[name]})


def test_both_resume_paths_refuse_a_changed_model_and_an_unresumable_file(trained, tmp_path):
    """The Trainer checks the rules whether it reads the checkpoint (resume=True, the library)
    or is given it read (resume=SavedRun, as ``glassllm train --resume`` does)."""
    changed = dataclasses.replace(trained.config, n_layer=2, max_iters=9)
    with pytest.raises(ValueError, match=r"cannot change n_layer=2 \(checkpoint: 1\)"):
        Trainer(changed, resume=True)
    saved = run_state.read_for_resume(trained.out_dir)
    with pytest.raises(ValueError, match=r"cannot change n_layer=2 \(checkpoint: 1\)"):
        Trainer(saved.resume_config({"n_layer": 2, "max_iters": 9}), resume=saved)
    with pytest.raises(ValueError, match="already at iteration 4"):
        Trainer(saved.resume_config({}), resume=saved)
    # a checkpoint without generator states (e.g. written by hand) cannot be resumed
    out_dir = tmp_path / "no-rng"
    out_dir.mkdir()
    metadata = {**trained.metadata(), "rng": None}
    glassllm.save(out_dir / CHECKPOINT_NAME, trained.model, trained.optimizer, metadata=metadata)
    config = dataclasses.replace(trained.config, out_dir=str(out_dir), max_iters=9)
    plain = run_state.SavedRun.read(out_dir / CHECKPOINT_NAME)  # a library caller's own read
    assert not plain.resumable
    for resume in (
        lambda: Trainer(config, resume=True),
        lambda: run_state.read_for_resume(out_dir),
        lambda: Trainer(plain.resume_config({"max_iters": 9}), resume=plain),
    ):
        with pytest.raises(ValueError, match="no 'rng'"):
            resume()


def test_help_shows_each_option_range(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--n-layer N transformer blocks (in [1, 1024]; default: 4)" in out
    assert "--beta2 X AdamW beta2 (in [0, 1); default: 0.99)" in out
    assert "--lr X peak learning rate (> 0; default: 0.001)" in out
    with pytest.raises(SystemExit):
        main(["sample", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(in [1, 1000000000]; default: all)" in out and "(> 0; default: 0.8)" in out


def test_sample_config_rules_are_the_command_lines():
    with pytest.raises(ValueError, match=r"num-samples must be in \[1, 10000\], got 0"):
        SampleConfig(num_samples=0).validate()
    with pytest.raises(ValueError, match="top-k must be an integer or null, got 'x'"):
        SampleConfig(top_k="x").validate()
    SampleConfig().validate()
    TrainConfig().validate()


def test_options_docstring_examples():
    result = doctest.testmod(glassllm.app.options)
    assert result.attempted > 0 and result.failed == 0


LIBRARY = ["tensor", "autograd", "functional", "nn", "optim", "models", "data", "checkpoint",
           "rng", "gradcheck", "atomic_file"]  # fmt: skip


def test_the_library_never_imports_the_program():
    """No module outside glassllm/app imports it (but __main__, the command's other door), and
    importing every library module loads nothing of it."""
    package = ROOT / "glassllm"
    for path in package.rglob("*.py"):
        relative = path.relative_to(package)
        if relative.parts[0] == "app" or relative.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            assert not any(n.startswith("glassllm.app") for n in names), (relative, names)
    code = (
        "import sys, importlib\n"
        f"for name in {LIBRARY!r}: importlib.import_module('glassllm.' + name)\n"
        "assert not [m for m in sys.modules if m.startswith('glassllm.app')]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_the_learning_rate_is_computed_once_per_step(trained, tmp_path, monkeypatch):
    import glassllm.app.train as train_module

    calls = []
    real = train_module.cosine_with_warmup
    monkeypatch.setattr(
        train_module, "cosine_with_warmup", lambda *args: calls.append(args[0]) or real(*args)
    )
    config = TrainConfig(**{**trained.config.to_dict(), "out_dir": str(tmp_path)})
    Trainer(config).fit(progress=False)  # 4 steps, evaluations at 0, 2 and 4
    assert calls == [0, 1, 2, 3, 4]  # one per step, and one for the record of the last evaluation


def test_a_chat_template_round_trips_and_a_bad_one_is_named():
    from glassllm.chat_template import ChatTemplate
    from glassllm.data import CharTokenizer
    from glassllm.models import GPTConfig

    template = ChatTemplate("{{ messages[0]['content'] }}", {"eos_token": "b"})
    state = run_state.RunState(
        GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=2),
        CharTokenizer("ab"),
        chat_template=template,
    )
    metadata = state.to_metadata()
    assert run_state.RunState.from_metadata(metadata, "x").chat_template == template
    assert "chat_template" not in dataclasses.replace(state, chat_template=None).to_metadata()
    for bad in ({"source": 1, "special_tokens": {}}, {"source": "", "special_tokens": {"x": "y"}},
                "text", {"source": ""}):  # fmt: skip
        with pytest.raises(CheckpointError, match="chat_template: "):
            run_state.RunState.from_metadata({**metadata, "chat_template": bad}, "x")
