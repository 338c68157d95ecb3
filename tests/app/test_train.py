"""The training loop: loss falls, resume is bit-for-bit, Ctrl-C saves, checkpoints hold the run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import optional

import glassllm
from glassllm.app.config import CHECKPOINT_NAME, LOG_NAME
from glassllm.app.plot import plot_losses
from glassllm.app.run_state import load_trained_model, read_checkpoint_metadata, resume_config
from glassllm.app.train import TrainConfig, Trainer

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


def tiny(data, out_dir, **changes):
    """A configuration that trains in a fraction of a second."""
    values = dict(
        n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, max_iters=10,
        warmup_iters=2, lr=1e-2, min_lr=1e-3, eval_interval=5, eval_iters=2, sample_tokens=0,
        data=data, out_dir=str(out_dir),
    )  # fmt: skip
    values.update(changes)
    return TrainConfig(**values)


def parameters(model):
    return {name: p.data.copy() for name, p in model.named_parameters()}


def without_time(records):
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records]


def read_log(out_dir):
    return [json.loads(line) for line in (out_dir / LOG_NAME).read_text().splitlines()]


def test_loss_falls(data, tmp_path):
    config = tiny(data, tmp_path, max_iters=60, eval_interval=60, eval_iters=4)
    result = Trainer(config).fit(progress=False)
    first, last = result.evaluations[0], result.evaluations[-1]
    assert last["iter"] == 60
    assert last["train_loss"] < first["train_loss"] - 1.0  # from ~ln(vocab) = 3.3 down
    assert last["val_loss"] < first["val_loss"] - 1.0
    assert np.mean(result.losses[-10:]) < np.mean(result.losses[:10])
    assert result.best_val_loss == min(e["val_loss"] for e in result.evaluations)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_resume_is_bit_for_bit(data, tmp_path, dropout):
    """2N steps straight == N steps, stop, resume, N more: same losses, parameters, moments."""
    # N = 7 is not a multiple of eval_interval, so the stopped run evaluates at a step the
    # straight run does not: evaluating must not disturb the training randomness.
    fields = dict(max_iters=14, lr_decay_iters=14, dropout=dropout)
    straight = Trainer(tiny(data, tmp_path / "straight", **fields))
    losses_straight = straight.fit(progress=False).losses

    first = Trainer(tiny(data, tmp_path / "split", **{**fields, "max_iters": 7}))
    losses_first = first.fit(progress=False).losses
    resumed = Trainer(tiny(data, tmp_path / "split", **fields), resume=True)
    assert resumed.iteration == 7
    losses_second = resumed.fit(progress=False).losses

    assert len(losses_straight) == 14 and len(losses_first) == len(losses_second) == 7
    assert losses_first + losses_second == losses_straight  # exactly, not approximately
    after_straight, after_resumed = parameters(straight.model), parameters(resumed.model)
    for name, value in after_straight.items():
        np.testing.assert_array_equal(after_resumed[name], value, err_msg=name)
    for name, state in straight.optimizer.state.items():
        np.testing.assert_array_equal(resumed.optimizer.state[name]["exp_avg_sq"],
                                      state["exp_avg_sq"])  # fmt: skip
    # The log of the resumed run holds every evaluation of the straight one (plus the one at 7).
    straight_log = without_time(read_log(tmp_path / "straight"))
    split_log = [r for r in without_time(read_log(tmp_path / "split")) if r["iter"] != 7]
    assert split_log == straight_log


def test_interrupt_saves_a_checkpoint_and_resume_continues_exactly(data, tmp_path):
    straight = Trainer(tiny(data, tmp_path / "straight", max_iters=12, dropout=0.1))
    losses_straight = straight.fit(progress=False).losses

    def stop_at_5(trainer, loss):
        if trainer.iteration == 5:
            raise KeyboardInterrupt  # what Ctrl-C does between two steps

    config = tiny(data, tmp_path / "stopped", max_iters=12, dropout=0.1)
    stopped = Trainer(config).fit(progress=False, on_step=stop_at_5)
    assert stopped.interrupted and stopped.iteration == 5 and stopped.sample is None
    assert read_checkpoint_metadata(stopped.checkpoint)["iteration"] == 5
    rest = Trainer(config, resume=True).fit(progress=False)
    assert stopped.losses + rest.losses == losses_straight


def test_sigint_stops_a_real_run_after_saving(data, tmp_path):
    """Ctrl-C on the command line: finish the step, save, say how to resume, exit 130."""
    out_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "glassllm", "train", "--data", data, "--out-dir", str(out_dir),
            "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
            "--batch-size", "4", "--max-iters", "1000000", "--eval-interval", "1000000",
            "--eval-iters", "1", "--warmup-iters", "2"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log = out_dir / LOG_NAME
        deadline = time.monotonic() + 60
        while not (log.is_file() and log.read_text()):  # the evaluation at step 0 is logged
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
            time.sleep(0.05)
        time.sleep(0.3)  # let it take some steps
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    assert "glassllm train --resume --out-dir" in out
    metadata = read_checkpoint_metadata(out_dir / CHECKPOINT_NAME)
    assert metadata["iteration"] > 0
    assert f"stopped at step {metadata['iteration']};" in out


def test_checkpoint_holds_the_whole_run(data, tmp_path):
    config = tiny(data, tmp_path, max_iters=6, sample_tokens=8)
    trainer = Trainer(config)
    result = trainer.fit(progress=False)
    metadata = read_checkpoint_metadata(tmp_path / CHECKPOINT_NAME)
    assert metadata["iteration"] == 6 and metadata["last_eval_iteration"] == 6
    assert metadata["best_val_loss"] == result.best_val_loss
    assert TrainConfig(**metadata["train_config"]) == config
    assert metadata["tokenizer"] == trainer.tokenizer.to_dict()
    assert set(metadata["rng"]) == {"model", "batches", "default"}
    assert metadata["rng"]["batches"] == trainer.batch_rng.bit_generator.state

    model, tokenizer, _ = load_trained_model(tmp_path / CHECKPOINT_NAME)
    assert not model.training
    for name, value in parameters(trainer.model).items():
        np.testing.assert_array_equal(parameters(model)[name], value)
    assert tokenizer.decode(tokenizer.encode("the fox")) == "the fox"
    assert result.sample is not None and len(result.sample) == 1 + 8  # "\n" prompt + 8 tokens


def test_evaluation_uses_the_same_batches_and_leaves_training_alone(data, tmp_path):
    trainer = Trainer(tiny(data, tmp_path, dropout=0.3))
    states = (trainer.batch_rng.bit_generator.state, trainer.model_rng.bit_generator.state)
    assert trainer.evaluate() == trainer.evaluate()
    assert (trainer.batch_rng.bit_generator.state, trainer.model_rng.bit_generator.state) == states
    assert trainer.model.training


def test_evaluation_is_the_mean_loss_of_its_batches(data, tmp_path):
    """Batches go through the model four at a time (one forward each); the estimate is still the
    mean of the eval_iters batches' own losses, which a batch-by-batch loop gives here."""
    from glassllm import no_grad
    from glassllm.app import train as train_module
    from glassllm.data import get_batch

    trainer = Trainer(tiny(data, tmp_path, eval_iters=7))
    assert train_module.EVAL_BATCHES_PER_FORWARD == 4  # 7 batches: forwards of 4 and 3
    cfg, model = trainer.config, trainer.model
    expected = {}
    model.eval()
    with no_grad():
        for index, (split, tokens) in enumerate(
            [("train", trainer.corpus.train), ("val", trainer.corpus.val)]
        ):
            rng = np.random.default_rng([cfg.seed, 2, index])
            batches = [get_batch(tokens, cfg.block_size, cfg.batch_size, rng) for _ in range(7)]
            expected[split] = np.mean([float(model(x, y)[1].data) for x, y in batches])
    model.train()
    losses = trainer.evaluate()
    assert losses.keys() == expected.keys()
    for split, value in expected.items():
        assert losses[split] == pytest.approx(value, rel=1e-6)
    assert losses["train"] != losses["val"]


def test_learning_rate_follows_nanogpt_schedule(data, tmp_path):
    trainer = Trainer(tiny(data, tmp_path, max_iters=20, warmup_iters=4, lr=1e-2, min_lr=1e-3))
    lrs = [trainer.learning_rate(it) for it in range(25)]
    assert lrs[0] == pytest.approx(1e-2 / 5) and lrs[3] == pytest.approx(1e-2 * 4 / 5)
    assert lrs[4] == pytest.approx(1e-2)
    assert lrs[20] == lrs[24] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))


def test_short_run_warms_up_throughout(data, tmp_path):
    config = tiny(data, tmp_path, max_iters=3, warmup_iters=100)
    assert config.decay_iters == 100
    Trainer(config).fit(progress=False)  # no error although max_iters < warmup_iters


def test_resume_config_keeps_the_checkpoint_values_and_applies_changes(data, tmp_path):
    Trainer(tiny(data, tmp_path, max_iters=3, lr=5e-3)).fit(progress=False)
    config = resume_config({"out_dir": str(tmp_path), "max_iters": 9, "eval_iters": 3})
    assert config.max_iters == 9 and config.eval_iters == 3
    assert config.lr == 5e-3 and config.n_embd == 16 and config.data == data
    assert resume_config({"out_dir": str(tmp_path), "n_layer": 1}).n_layer == 1  # same: fine
    with pytest.raises(ValueError, match=r"cannot change n_embd=32 \(checkpoint: 16\)"):
        resume_config({"out_dir": str(tmp_path), "n_embd": 32})


def test_resume_refuses_another_corpus_and_warns_when_the_file_changed(data, tmp_path, capsys):
    Trainer(tiny(data, tmp_path, max_iters=3)).fit(progress=False)
    other = tmp_path / "other.txt"
    other.write_text(TEXT)
    with pytest.raises(ValueError, match="cannot change data="):
        Trainer(tiny(str(other), tmp_path, max_iters=5), resume=True)
    capsys.readouterr()
    with open(data, "w") as f:  # same file, edited: same characters, different text
        f.write(TEXT.replace("quick", "quiet"))
    Trainer(tiny(data, tmp_path, max_iters=5), resume=True)
    assert "is not the text this checkpoint was trained on" in capsys.readouterr().err


def test_config_validation_lists_every_problem():
    config = TrainConfig(n_embd=10, n_head=4, lr=-1.0, beta2=1.0, eval_iters=0)
    with pytest.raises(ValueError) as info:
        config.validate()
    message = str(info.value)
    for fragment in ["n_embd (10) must be divisible by n_head (4)", "lr must be", "beta2",
                     "eval_iters"]:  # fmt: skip
        assert fragment in message
    TrainConfig().validate()  # the defaults are valid


def test_progress_bar_shows_loss_lr_and_tokens_per_second(data, tmp_path, capsys):
    Trainer(tiny(data, tmp_path, max_iters=3)).fit(progress=True)
    err = capsys.readouterr().err
    assert "loss " in err and "lr " in err and "tok/s" in err


def test_plot_is_skipped_with_one_line_without_matplotlib(data, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    Trainer(tiny(data, tmp_path, max_iters=2)).fit(progress=False)
    out = capsys.readouterr().out
    assert "loss.png skipped: matplotlib is not installed (pip install matplotlib" in out
    assert not (tmp_path / "loss.png").exists()


def test_plot_is_written_with_matplotlib(data, tmp_path):
    optional("matplotlib")
    Trainer(tiny(data, tmp_path, max_iters=2)).fit(progress=False)
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert plot_losses(tmp_path / LOG_NAME, tmp_path / "again.png")


def test_fresh_run_does_not_inherit_an_old_log(data, tmp_path):
    Trainer(tiny(data, tmp_path, max_iters=10)).fit(progress=False)
    Trainer(tiny(data, tmp_path, max_iters=5), overwrite=True).fit(progress=False)
    assert [r["iter"] for r in read_log(tmp_path)] == [0, 5]


def test_training_is_reproducible_from_the_seed(data, tmp_path):
    a = Trainer(tiny(data, tmp_path / "a", seed=3)).fit(progress=False).losses
    b = Trainer(tiny(data, tmp_path / "b", seed=3)).fit(progress=False).losses
    c = Trainer(tiny(data, tmp_path / "c", seed=4)).fit(progress=False).losses
    assert a == b and a != c


def test_glassllm_default_generator_is_seeded_by_the_run(data, tmp_path):
    Trainer(tiny(data, tmp_path / "a", seed=5, max_iters=1))
    state = glassllm.get_rng().bit_generator.state
    assert state == glassllm.manual_seed(5).bit_generator.state


def test_interrupt_prints_a_resume_command_a_shell_can_run(data, tmp_path, capsys):
    """An out_dir with a space is quoted in the printed command, so pasting it resumes that run."""
    import shlex

    def stop_at_2(trainer, loss):
        if trainer.iteration == 2:
            raise KeyboardInterrupt

    out_dir = tmp_path / "my run"
    Trainer(tiny(data, out_dir)).fit(progress=False, on_step=stop_at_2)
    command = capsys.readouterr().out.split("Continue with: ")[1].splitlines()[0].strip()
    words = shlex.split(command)
    assert words[words.index("--out-dir") + 1] == str(out_dir)


def test_the_adaptive_thread_count_changes_no_bit_of_the_checkpoint(data, tmp_path, monkeypatch):
    """A fake clock makes one-thread steps look faster, so the run switches OpenBLAS and the
    workers between 2 threads and 1; its weights must be those of a run at 2 throughout."""
    from glassllm import threads

    blas = threads.openblas_thread_functions()
    before = (threads.get_num_threads(), [get() for get, _ in blas])
    used, set_num_threads, now = [], threads.set_num_threads, [0.0]
    monkeypatch.setattr(threads, "set_num_threads", lambda n: (used.append(n), set_num_threads(n)))

    def clock():
        now[0] += 0.5 if threads.get_num_threads() == 1 else 1.0
        return now[0]

    runs = {}
    try:
        for adaptive in (False, True):
            set_num_threads(2)
            for _, set_ in blas:
                set_(2)
            threads.set_adaptive(adaptive, clock=clock)
            config = tiny(data, tmp_path / str(adaptive), n_embd=64, block_size=32, batch_size=8)
            trainer = Trainer(config)
            losses = trainer.fit(progress=False).losses
            runs[adaptive] = parameters(trainer.model) | {"losses": np.array(losses)}
            threads.set_adaptive(None)
    finally:
        threads.set_adaptive(None)
        set_num_threads(before[0])
        for (_, set_), count in zip(blas, before[1], strict=True):
            set_(count)
    assert 1 in used  # the adaptive run did switch
    assert runs[True].keys() == runs[False].keys()
    for name, value in runs[False].items():
        np.testing.assert_array_equal(runs[True][name], value, err_msg=name)
