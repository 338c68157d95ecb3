"""Hostile and damaged input to the program, class by class: every case is one line on stderr and
exit status 2 (130 for Ctrl-C), nothing built from an unverified byte, nothing half-written.

1. nothing read from a checkpoint is used before the file is verified (digest, then every value);
3/4. self-consistent files (digest recomputed) with wrongly typed or unbounded values are refused
     before anything starts, naming the file and the field;
5. a kill between the checkpoint's rename and the log's append loses no log line;
7. divergence stops the run, keeps the last good checkpoint, and logs stay strict JSON;
8. Ctrl-C at any moment of the command, and output the terminal cannot encode.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy
from conftest import run_cli as run

import glassllm
import glassllm.app.cli as cli
import glassllm.checkpoint
from glassllm.app.cli import main
from glassllm.app.config import CHECKPOINT_NAME, LOG_NAME
from glassllm.app.run_state import load_trained_model
from glassllm.models import GPT

ROOT = Path(__file__).resolve().parents[2]
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--max-iters", "12", "--eval-interval", "5", "--eval-iters", "2",
        "--sample-tokens", "20", "--warmup-iters", "2"]  # fmt: skip


def assert_one_line_error(status, err, *fragments, options_at_fault=False):
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, (status, err)
    assert lines[0].startswith("glassllm: error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    if not options_at_fault:  # a file's fault is not the options'
        assert "try a smaller" not in lines[0], lines[0]


def env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 12-step run (evaluations at 0, 5, 10, 12): its out_dir."""
    root = tmp_path_factory.mktemp("hard")
    (root / "tiny.txt").write_text(TEXT)
    assert (
        main(["train", *TINY, "--data", str(root / "tiny.txt"), "--out-dir", str(root / "o")]) == 0
    )
    return root / "o"


def entries(path):
    with safetensors.safe_open(str(path), framework="np") as handle:
        header = dict(handle.metadata())
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    return tensors, header


def rewritten(source, dest, mutate=None, digest=True, tensors_mutate=None):
    """Copy the checkpoint ``source`` to ``dest`` with its metadata changed by ``mutate`` (on
    the decoded dict; written with Python's json, so NaN and Infinity can appear), the digest
    recomputed (a self-consistent hostile file) unless ``digest`` is False (a damaged one)."""
    tensors, header = entries(source)
    if mutate is not None:
        metadata = json.loads(header["glassllm.metadata"])
        mutate(metadata)
        header["glassllm.metadata"] = json.dumps(metadata)
    if tensors_mutate is not None:
        tensors_mutate(tensors)
    if digest:
        header["glassllm.sha256"] = glassllm.checkpoint._digest(tensors, header)
    dest.parent.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(tensors, str(dest), metadata=header)
    return dest


def count_models(monkeypatch):
    built = []
    real_init = GPT.__init__

    def counting_init(self, *args, **kwargs):
        built.append(args[0] if args else kwargs.get("config"))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "__init__", counting_init)
    return built


def set_in(*keys, value):
    def mutate(metadata):
        target = metadata
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return mutate


# ---------------------------------------------------------------- 1. verify before use


def _both_commands(trained, tmp_path, capsys, path, *fragments):
    """``sample`` and ``train --resume`` on ``path`` both fail with one line naming it."""
    out_dir = path.parent
    assert_one_line_error(
        *run(["sample", "--checkpoint", path], capsys)[::2], str(path), *fragments
    )
    argv = ["train", "--resume", "--out-dir", out_dir, "--max-iters", "20"]
    assert_one_line_error(*run(argv, capsys)[::2], str(path), *fragments)


def test_a_damaged_model_shape_is_never_used(trained, tmp_path, capsys, monkeypatch):
    """n_layer 1 -> 1000000 in the metadata, digest not recomputed: called corrupted at once,
    no model built (before: 10^6 blocks were allocated, then "not enough memory")."""
    path = rewritten(trained / CHECKPOINT_NAME, tmp_path / "o" / CHECKPOINT_NAME,
                     set_in("model_config", "n_layer", value=10**6), digest=False)  # fmt: skip
    built = count_models(monkeypatch)
    _both_commands(trained, tmp_path, capsys, path, "corrupted")
    with pytest.raises(glassllm.checkpoint.CheckpointError, match="corrupted"):
        load_trained_model(path)
    assert built == []


def test_a_file_whose_digest_entry_is_damaged_is_not_trusted(trained, tmp_path, capsys):
    """One flipped byte in the digest's key name leaves a file with no digest: unverifiable."""
    data = (trained / CHECKPOINT_NAME).read_bytes()
    assert data.count(b'"glassllm.sha256"') == 1
    path = tmp_path / "o" / CHECKPOINT_NAME
    path.parent.mkdir()
    path.write_bytes(data.replace(b'"glassllm.sha256"', b'"glassllm.sha257"'))
    _both_commands(trained, tmp_path, capsys, path, "no digest")
    with pytest.raises(glassllm.checkpoint.CheckpointError, match="no digest"):
        load_trained_model(path)


def test_a_damaged_layout_name_is_called_corrupted_too(trained, tmp_path, capsys):
    """The layout entry is checked with the digest: a flipped byte there is damage, not "a
    layout this glassllm cannot read" alone."""
    data = (trained / CHECKPOINT_NAME).read_bytes()
    assert data.count(b"glassllm-checkpoint-1") == 1
    path = tmp_path / "o" / CHECKPOINT_NAME
    path.parent.mkdir()
    path.write_bytes(data.replace(b"glassllm-checkpoint-1", b"glassllm-checkpoint-7"))
    _both_commands(trained, tmp_path, capsys, path, "has layout", "or the file is corrupted")


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda m: [m[key].update(n_layer=10**6) for key in ("model_config", "train_config")],
         "train_config.n_layer must be in [1, 1024], got 1000000"),
        (lambda m: (m.update(train_config=None), m["model_config"].update(n_layer=10**6)),
         "model_config has n_layer=1000000 but the weights hold 1 block"),
        (lambda m: (m.update(train_config=None), m["model_config"].update(n_embd=10**6)),
         "wte.weight has shape"),
        (lambda m: (m.update(train_config=None), m["model_config"].update(block_size=10**7)),
         "wpe.weight has shape"),
    ],
    ids=["train-config", "model-depth", "model-width", "model-context"],
)  # fmt: skip
def test_a_hostile_model_shape_builds_nothing(trained, tmp_path, capsys, monkeypatch, mutate,
                                              fragment):  # fmt: skip
    """Digest recomputed: the shape is checked against the file's own tensors (and the options'
    bounds) before any model is built, so a file cannot cost more than reading it."""
    path = rewritten(trained / CHECKPOINT_NAME, tmp_path / "o" / CHECKPOINT_NAME, mutate)
    built = count_models(monkeypatch)
    assert_one_line_error(*run(["sample", "--checkpoint", path], capsys)[::2], str(path), fragment)
    assert built == []


def test_a_checkpoint_with_nan_weights_is_refused(trained, tmp_path, capsys):
    def poison(tensors):
        tensors["wte.weight"] = tensors["wte.weight"].copy()
        tensors["wte.weight"][0, 0] = np.nan

    path = rewritten(trained / CHECKPOINT_NAME, tmp_path / "o" / CHECKPOINT_NAME,
                     tensors_mutate=poison)  # fmt: skip
    _both_commands(trained, tmp_path, capsys, path, "wte.weight holds NaN or infinite values")


def test_no_program_path_reads_unverified_metadata():
    """`read_metadata` reads the header alone, unverified: the program and the examples never
    call it (they read with `checkpoint.read`, digest first)."""
    sources = sorted((ROOT / "glassllm" / "app").rglob("*.py"))
    sources += sorted((ROOT / "examples").glob("*.py"))
    for source in sources:
        tree = ast.parse(source.read_text())
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        names |= {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                  for a in node.names}  # fmt: skip
        assert "read_metadata" not in names and "safe_open" not in names, source


def test_every_program_path_works_without_read_metadata(trained, tmp_path, capsys, monkeypatch):
    import shutil

    def refuse(*args):
        raise AssertionError("read_metadata called")

    monkeypatch.setattr(glassllm.checkpoint, "read_metadata", refuse)
    out_dir = tmp_path / "copy"
    shutil.copytree(trained, out_dir)
    assert run(["sample", "--checkpoint", out_dir / CHECKPOINT_NAME], capsys)[0] == 0
    assert run(["train", "--resume", "--out-dir", out_dir, "--max-iters", "14"], capsys)[0] == 0
    model, tokenizer, metadata = load_trained_model(out_dir / CHECKPOINT_NAME)
    assert metadata["iteration"] == 14


def test_the_example_reports_a_damaged_file_in_one_line(trained, tmp_path):
    path = rewritten(trained / CHECKPOINT_NAME, tmp_path / CHECKPOINT_NAME,
                     set_in("model_config", "n_layer", value=10**6), digest=False)  # fmt: skip
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "sample.py"), str(path)],
                          capture_output=True, text=True, env=env(), timeout=120)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "corrupted" in done.stderr.strip().splitlines()[-1]


# ---------------------------------------------------------------- 3/4. hostile values


HOSTILE = [
    (set_in("model_config", "n_layer", value="x"), "model_config"),
    (set_in("train_config", "n_layer", value="x"), "train_config.n_layer must be an integer"),
    (set_in("train_config", "beta2", value=[1, 2]), "train_config.beta2 must be a number"),
    (set_in("best_val_loss", value="low"), "best_val_loss must be a number or null, got 'low'"),
    (set_in("elapsed_s", value={}), "elapsed_s must be a number, got {}"),
    (set_in("iteration", value=float("inf")), "Infinity is not a JSON number"),
    (set_in("iteration", value=10**20), "iteration must be in [0, 1000000000]"),
    (set_in("rng", "model", "state", "state", value="garbage"), "rng.model is not a state"),
    (set_in("rng", "batches", value={"bit_generator": "MT19937"}), "rng.batches is not a state"),
    (set_in("train_config", "eval_iters", value=10**57), "train_config.eval_iters must be in"),
    (set_in("train_config", "max_iters", value=10**57), "train_config.max_iters must be in"),
    (set_in("train_config", "lr", value=1e308), "train_config.lr (1e+308) is too large"),
    (set_in("last_eval_record", "val_loss", value="x"), "last_eval_record.val_loss"),
    (set_in("last_eval_record", "iter", value=3), "last_eval_record.iter (3) is not"),
    (set_in("last_eval_iteration", value=13), "last_eval_iteration (13) is beyond"),
    (lambda m: m.update(format="something.else"), "not a glassllm GPT checkpoint"),
]


@pytest.mark.parametrize("mutate, fragment", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_a_self_consistent_hostile_file_is_one_line_naming_file_and_field(
    trained, tmp_path, capsys, monkeypatch, mutate, fragment
):
    path = rewritten(trained / CHECKPOINT_NAME, tmp_path / "o" / CHECKPOINT_NAME, mutate)
    built = count_models(monkeypatch)
    _both_commands(trained, tmp_path, capsys, path, fragment)
    assert built == []  # refused before anything starts


# ---------------------------------------------------------------- 5. kill between save and log

KILLER = """
import os, sys
from glassllm.app import cli, train
real, saves = train.Trainer.save_checkpoint, []
def save(self):
    path = real(self)
    saves.append(self.iteration)
    if len(saves) == int(os.environ["GLASSLLM_TEST_KILL_AFTER_SAVE"]):
        os._exit(137)  # as SIGKILL would: after the checkpoint's rename, before the log's append
    return path
train.Trainer.save_checkpoint = save
sys.exit(cli.main(sys.argv[1:]))
"""


def _records(log):
    return [json.loads(line) for line in log.read_text().splitlines()]


def _untimed(records):
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records]


@pytest.mark.parametrize("kill_after_save", [1, 2, 4])
def test_a_kill_between_checkpoint_and_log_loses_no_record(trained, tmp_path, capsys,
                                                           kill_after_save):  # fmt: skip
    data = trained.parent / "tiny.txt"
    out_dir = tmp_path / "killed"
    done = subprocess.run(
        [sys.executable, "-c", KILLER, "train", *TINY, "--data", data, "--out-dir", out_dir],
        env={**env(), "GLASSLLM_TEST_KILL_AFTER_SAVE": str(kill_after_save)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 137, done.stderr
    logged = (
        [r["iter"] for r in _records(out_dir / LOG_NAME)] if (out_dir / LOG_NAME).exists() else []
    )
    assert logged == [0, 5, 10, 12][: kill_after_save - 1]  # the last evaluation's line is lost
    argv = ["train", "--resume", "--out-dir", out_dir, "--max-iters", "12"]
    status, out, err = run(argv, capsys)
    if kill_after_save == 4:  # killed after the final checkpoint: nothing left to train
        assert_one_line_error(status, err, "already at iteration 12")
        argv[-1] = "13"
        status, out, err = run(argv, capsys)
        expected = _untimed(_records(trained / LOG_NAME))[:-1]  # the uninterrupted one to 12
        assert _untimed(_records(out_dir / LOG_NAME))[:4] == expected + [
            _untimed(_records(trained / LOG_NAME))[-1]]  # fmt: skip
        return
    assert status == 0, err
    straight, resumed = (trained / LOG_NAME).read_text(), (out_dir / LOG_NAME).read_text()
    assert _untimed(_records(out_dir / LOG_NAME)) == _untimed(_records(trained / LOG_NAME))
    # bit for bit but for the timing field: the same JSON text with elapsed_s blanked
    blank = lambda text: [json.dumps({**json.loads(l), "elapsed_s": 0}) for l in text.splitlines()]  # noqa: E731, E741
    assert blank(resumed) == blank(straight)
    a, b = entries(trained / CHECKPOINT_NAME)[0], entries(out_dir / CHECKPOINT_NAME)[0]
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- 7. divergence


@pytest.mark.parametrize("lr, warmup", [("1e30", "2"), ("1e308", "0")])
def test_divergence_stops_with_one_line_and_keeps_the_last_good_checkpoint(
    trained, tmp_path, lr, warmup
):
    data = trained.parent / "tiny.txt"
    out_dir = tmp_path / "diverged"
    argv = [*TINY, "--data", str(data), "--out-dir", str(out_dir), "--lr", lr,
            "--warmup-iters", warmup]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "glassllm", "train", *argv],
                          env=env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr  # no NumPy warnings either
    assert lines[0].startswith("glassllm: error: training diverged at step "), lines
    assert "the checkpoint of step 0 is kept" in lines[0] and "--lr" in lines[0]
    for line in (out_dir / LOG_NAME).read_text().splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in the log"))
    model, _, metadata = load_trained_model(out_dir / CHECKPOINT_NAME)  # loads: all finite
    assert metadata["iteration"] == 0
    assert all(np.isfinite(p.data).all() for p in model.parameters())


def test_divergence_in_process_raises_no_numpy_warning(trained, tmp_path, capsys):
    data = trained.parent / "tiny.txt"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        argv = ["train", *TINY, "--data", data, "--out-dir", tmp_path / "o", "--lr", "1e30"]
        assert_one_line_error(*run(argv, capsys)[::2], "training diverged", options_at_fault=True)


def test_a_learning_rate_too_large_for_the_warm_up_is_refused_before_anything(tmp_path, capsys):
    argv = ["train", *TINY, "--out-dir", tmp_path / "o", "--lr", "1e308", "--warmup-iters", "100"]
    assert_one_line_error(*run(argv, capsys)[::2], "lr (1e+308) is too large for a warm-up")
    assert not (tmp_path / "o").exists()


def test_the_program_writes_strict_json_only():
    """Every json.dumps of the program refuses NaN (the log is read by strict parsers)."""
    for source in sorted((ROOT / "glassllm" / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("dumps", "dump"):
                keywords = {k.arg: k.value for k in node.keywords}
                allow_nan = keywords.get("allow_nan")
                assert isinstance(allow_nan, ast.Constant) and allow_nan.value is False, (
                    f"{source.name}:{node.lineno}"
                )


# ---------------------------------------------------------------- 8. Ctrl-C, encodings


@pytest.mark.parametrize("where", ["build_parser", "tune_allocator", "parse"])
def test_ctrl_c_at_the_very_start_is_one_line_and_130(capsys, monkeypatch, where):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "build_parser":
        monkeypatch.setattr(cli, "build_parser", interrupt)
    elif where == "tune_allocator":
        monkeypatch.setattr("glassllm.app.allocator.tune_allocator", interrupt)
    else:
        monkeypatch.setattr(cli._Parser, "parse_args", interrupt)
    status, out, err = run(["sample"], capsys)
    assert status == 130 and err.strip() == "glassllm: interrupted", err


def test_ctrl_c_while_starting_a_real_process_is_never_a_traceback(tmp_path):
    """SIGINT delivered to a real process once the command runs (the import of glassllm itself,
    before main, is the library's: see bench/LOG.md, Reliability)."""
    script = (
        "import os, signal, sys\n"
        "import glassllm.app.cli as cli\n"
        "real = cli.build_parser\n"
        "def build():\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # arrives here, at main's first step\n"
        "    return real()\n"
        "cli.build_parser = build\n"
        "sys.exit(cli.main(['sample', '--checkpoint', 'nowhere']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 130 and done.stderr.strip() == "glassllm: interrupted", done.stderr


def test_the_command_imports_no_library_before_main_handles_ctrl_c():
    """What runs before main (``import glassllm``, ``glassllm.app``, ``python -m glassllm``'s
    package) loads neither NumPy nor the library, so a Ctrl-C during start-up reaches main's
    handler: the library's imports, most of a start-up, happen inside main."""
    script = (
        "import sys\n"
        "import glassllm, glassllm.app, glassllm.app.cli\n"
        "heavy = [m for m in ('numpy', 'safetensors', 'glassllm.tensor') if m in sys.modules]\n"
        "print(heavy)\n"
        "from glassllm import Tensor, no_grad\n"
        "print(Tensor.__module__, no_grad.__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "glassllm.tensor glassllm.autograd"]


def test_output_the_terminal_cannot_encode_is_escaped(tmp_path):
    """PYTHONIOENCODING=ascii and a non-ASCII corpus: the run finishes with status 0 and the
    sample is printed with backslash escapes; sampling from it too."""
    data = tmp_path / "accents.txt"
    data.write_text("".join(f"ligne {i}: déjà vu, naïve café, Ελλάδα.\n" for i in range(60)))
    out_dir = tmp_path / "o"
    ascii_env = {**env(), "PYTHONIOENCODING": "ascii"}
    done = subprocess.run(
        [sys.executable, "-m", "glassllm", "train", *TINY, "--data", data, "--out-dir", out_dir],
        env=ascii_env, capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    done.stdout.decode("ascii")  # only ASCII came out
    assert b"--- sample" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "glassllm", "sample", "--checkpoint", str(out_dir / CHECKPOINT_NAME),
         "--prompt", "é", "--max-new-tokens", "5", "--num-samples", "1"],
        env=ascii_env, capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode("ascii").startswith("\\xe9")
