"""``glassllm train --init-from PATH``: finetuning a glassllm run, a Hugging Face directory and a
GGUF file with each one's own tokenizer; the first evaluation is the loaded model's loss (against
transformers), the resumed run is the uninterrupted one bit for bit, the run's directory samples
alone, and every refusal is one line with exit status 2."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import optional
from conftest import run_cli as run

from glassllm.app.config import CHECKPOINT_NAME, LOG_NAME, TrainConfig
from glassllm.app.run_state import SavedRun
from glassllm.app.train import Trainer
from glassllm.data import get_batch

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "hf"))
sys.path.insert(0, str(TESTS / "gguf"))
from gguf_files import tiny_llama, write_gguf  # noqa: E402
from hf_models import Models, training_text  # noqa: E402

GPT2_FIXTURE = TESTS / "fixtures" / "hf_gpt2_tiny"
BASE = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-iters", "1", "--sample-tokens", "0",
        "--warmup-iters", "1"]  # fmt: skip
STEPS = ["--batch-size", "4", "--eval-iters", "1", "--sample-tokens", "0", "--warmup-iters",
         "1", "--block-size", "16"]  # fmt: skip


def assert_one_line_error(status, err, *fragments):
    assert status == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glassllm: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def log_records(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / LOG_NAME).read_text().splitlines()]


def tensors_of(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(path)


@pytest.fixture
def base_run(text_file, tmp_path, capsys) -> Path:
    """A glassllm run of 4 steps on ``text_file`` (char tokenizer)."""
    out = tmp_path / "base"
    argv = ["train", *BASE, "--data", text_file, "--out-dir", out, "--max-iters", "4",
            "--eval-interval", "4"]  # fmt: skip
    status, _, err = run(argv, capsys)
    assert status == 0, err
    return out


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory) -> Models:
    return Models(tmp_path_factory.mktemp("hf_models"))


def gguf_file(tmp_path: Path) -> Path:
    meta, tensors = tiny_llama(np.random.default_rng(0), layers=2, tied=False)
    return write_gguf(tmp_path / "tiny.gguf", meta, tensors)


# ------------------------------------------------------------------ (a) a glassllm run


@pytest.mark.parametrize("as_file", [False, True], ids=["run_dir", "ckpt_file"])
def test_finetuning_a_run_starts_at_its_loss_and_samples_alone(
    base_run, text_file, tmp_path, capsys, as_file
):
    source = base_run / CHECKPOINT_NAME if as_file else base_run
    out = tmp_path / "ft"
    argv = ["train", "--init-from", source, "--data", text_file, "--out-dir", out,
            *STEPS, "--max-iters", "3", "--eval-interval", "3"]  # fmt: skip
    status, stdout, err = run(argv, capsys)
    assert status == 0, err
    assert f"finetuning -> 3 steps | GPT from {source} 1 layers x 16 wide" in stdout
    assert "char tokenizer, vocabulary" in stdout
    # the same seed and data give the same evaluation batches: step 0 is the base's last loss
    before, first = log_records(base_run)[-1], log_records(out)[0]
    assert first["iter"] == 0 and before["iter"] == 4
    assert first["train_loss"] == before["train_loss"] and first["val_loss"] == before["val_loss"]
    saved = SavedRun.read(out / CHECKPOINT_NAME, resuming=True)
    base = SavedRun.read(base_run / CHECKPOINT_NAME)
    assert saved.state.model_config == base.state.model_config
    assert saved.state.tokenizer.to_dict() == base.state.tokenizer.to_dict()
    assert saved.state.config.init_from == str(source)
    shutil.rmtree(base_run)  # the finetuned run needs nothing of its source
    status, stdout, err = run(["sample", "--checkpoint", out / CHECKPOINT_NAME,
                               "--max-new-tokens", "8", "--num-samples", "1"], capsys)  # fmt: skip
    assert status == 0, err
    assert stdout.strip()


def test_resumed_finetuning_is_the_uninterrupted_run_bit_for_bit(
    base_run, text_file, tmp_path, capsys
):
    common = ["train", "--init-from", base_run, "--data", text_file, *STEPS,
              "--eval-interval", "2", "--dropout", "0.1", "--lr-decay-iters", "7"]  # fmt: skip
    assert run([*common, "--max-iters", "7", "--out-dir", tmp_path / "straight"], capsys)[0] == 0
    assert run([*common, "--max-iters", "3", "--out-dir", tmp_path / "split"], capsys)[0] == 0
    # given again, the same --init-from is the run's own (not read again), as --data is
    status, stdout, err = run(["train", "--resume", "--out-dir", tmp_path / "split",
                               "--init-from", base_run, "--max-iters", "7"], capsys)  # fmt: skip
    assert status == 0, err
    assert "resuming at step 3" in stdout
    straight = tensors_of(tmp_path / "straight" / CHECKPOINT_NAME)
    resumed = tensors_of(tmp_path / "split" / CHECKPOINT_NAME)
    assert straight.keys() == resumed.keys()  # weights and optimizer moments
    for name, value in straight.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    keys = ("train_loss", "val_loss", "lr", "tokens")  # all but the times
    split = {
        record["iter"]: [record[k] for k in keys] for record in log_records(tmp_path / "split")
    }
    for record in log_records(tmp_path / "straight"):  # the split run also evaluated at its stop
        assert split[record["iter"]] == [record[k] for k in keys]


def test_text_the_runs_tokenizer_cannot_encode_is_one_line(base_run, tmp_path, capsys):
    other = tmp_path / "other.txt"
    other.write_text("Ω" * 400)
    status, _, err = run(["train", "--init-from", base_run, "--data", other,
                          "--out-dir", tmp_path / "ft", *STEPS], capsys)  # fmt: skip
    assert_one_line_error(status, err, "does not fit the tokenizer", "'Ω'")
    assert not (tmp_path / "ft").exists()


# ------------------------------------------------------------------ (b) Hugging Face directories


def first_evaluation_and_batches(trainer: Trainer) -> tuple[float, np.ndarray, np.ndarray]:
    """The training loss of the run's first evaluation, and the batches it was measured on (drawn
    as `Trainer.evaluate` draws them)."""
    config = trainer.config
    loss = trainer.evaluate()["train"]
    rng = np.random.default_rng([config.seed, 2, 0])
    xs, ys = zip(
        *[get_batch(trainer.corpus.train, config.block_size, config.batch_size, rng)
          for _ in range(config.eval_iters)],
        strict=True,
    )  # fmt: skip
    return loss, np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "qwen3"])
def test_the_first_evaluation_is_transformers_loss_of_the_loaded_model(hf_models, tmp_path, family):
    """llama: GQA, untied head; gpt2: the committed fixture; gpt_neox: a tokenizer smaller than
    the padded vocabulary (Pythia's), parallel residual; qwen3: QK-norm, a free head_dim."""
    torch = optional("torch")
    transformers = optional("transformers")
    source = GPT2_FIXTURE if family == "gpt2" else hf_models.get(family)
    text = tmp_path / "text.txt"
    text.write_text(training_text())
    config = TrainConfig(init_from=str(source), data=str(text), out_dir=str(tmp_path / "ft"),
                         block_size=16, batch_size=3, eval_iters=2, max_iters=1)  # fmt: skip
    trainer = Trainer(config)
    loss, x, y = first_evaluation_and_batches(trainer)
    oracle = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = oracle(torch.from_numpy(x)).logits
        expected = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1)
        )
    assert abs(loss - float(expected)) <= 1e-4
    result = trainer.fit(progress=False)
    assert result.evaluations[0]["train_loss"] == loss  # the logged step 0 is that loss
    saved = SavedRun.read(result.checkpoint, resuming=True)  # the run's checkpoint reads back
    assert saved.state.model_config == trainer.model_config


def test_a_finetuned_llama_keeps_its_shape_and_samples_without_its_source(
    hf_models, tmp_path, capsys
):
    optional("tokenizers")
    source = tmp_path / "llama"
    shutil.copytree(hf_models.get("llama"), source)  # GQA, untied head
    text = tmp_path / "text.txt"
    text.write_text(training_text())
    out = tmp_path / "ft"
    status, stdout, err = run(["train", "--init-from", source, "--data", text, "--out-dir", out,
                               *STEPS, "--max-iters", "2", "--eval-interval", "2",
                               "--dropout", "0.1"], capsys)  # fmt: skip
    assert status == 0, err
    assert "2 layers x 64 wide, 4 heads (2 key/value), context 16 of 64" in stdout
    saved = SavedRun.read(out / CHECKPOINT_NAME)
    model_config = saved.state.model_config
    assert (model_config.n_kv_head, model_config.tied_head, model_config.norm) == (
        2,
        False,
        "rmsnorm",
    )
    assert model_config.block_size == 64 and model_config.dropout == 0.1
    tensors = tensors_of(out / CHECKPOINT_NAME)
    assert "lm_head.weight" in tensors and tensors["lm_head.weight"].dtype == np.float32
    from glassllm.hf import find_tokenizer

    assert saved.state.tokenizer.to_json() == find_tokenizer(source).to_json()
    shutil.rmtree(source)
    status, stdout, err = run(["sample", "--checkpoint", out / CHECKPOINT_NAME, "--prompt",
                               "the cat", "--max-new-tokens", "5", "--num-samples", "1"],
                              capsys)  # fmt: skip
    assert status == 0, err
    assert stdout.startswith("the cat")


# ------------------------------------------------------------------ (c) a GGUF file


def test_finetuning_a_gguf_file_with_its_metadata_tokenizer(tmp_path, capsys):
    optional("tokenizers")
    source = gguf_file(tmp_path)
    text = tmp_path / "abc.txt"
    rng = np.random.default_rng(1)
    text.write_text(" ".join(rng.choice(["a", "b", "c", "ab"], size=600)))
    out = tmp_path / "ft"
    common = ["train", "--init-from", source, "--data", text, *STEPS, "--eval-interval", "2"]
    status, stdout, err = run([*common, "--max-iters", "2", "--out-dir", out], capsys)
    assert status == 0, err
    assert "bpe tokenizer, vocabulary 6" in stdout
    assert "lm_head.weight" in tensors_of(out / CHECKPOINT_NAME)  # untied stays untied
    source.unlink()
    status, _, err = run(["train", "--resume", "--out-dir", out, "--max-iters", "4"], capsys)
    assert status == 0, err
    status, stdout, err = run(["sample", "--checkpoint", out / CHECKPOINT_NAME, "--prompt", "a",
                               "--max-new-tokens", "4", "--num-samples", "1"], capsys)  # fmt: skip
    assert status == 0, err


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "options",
    [["--n-layer", "4"], ["--arch", "llama"], ["--n-embd", "16", "--bias"],
     ["--tokenizer", "char"], ["--tokenizer", "bpe", "--vocab-size", "300"], ["--n-kv-head", "1"]],
)  # fmt: skip
def test_shape_and_tokenizer_options_are_refused_by_name(base_run, tmp_path, capsys, options):
    status, _, err = run(["train", "--init-from", base_run, *options, "--out-dir",
                          tmp_path / "ft"], capsys)  # fmt: skip
    flags = [word for word in options if word.startswith("--")]
    assert_one_line_error(status, err, f"{', '.join(flags)} cannot be given with --init-from")
    assert not (tmp_path / "ft").exists()


def test_bad_init_from_paths_are_one_line(base_run, text_file, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    cases = {
        tmp_path / "missing": "does not exist",
        text_file: "is not a readable safetensors checkpoint",
        tmp_path / "empty": "neither config.json (a Hugging Face model) nor ckpt.safetensors",
    }
    for path, fragment in cases.items():
        status, _, err = run(["train", "--init-from", path, "--data", text_file,
                              "--out-dir", tmp_path / "ft"], capsys)  # fmt: skip
        assert_one_line_error(status, err, "--init-from: ", fragment)
    status, _, err = run(["train", "--init-from", base_run, "--data", text_file,
                          "--block-size", "17", "--out-dir", tmp_path / "ft"], capsys)  # fmt: skip
    assert_one_line_error(status, err, "--block-size 17 is beyond the context", "(16 tokens)")
    assert not (tmp_path / "ft").exists()


def test_resuming_a_finetuning_run_refuses_its_shape_and_another_source(
    base_run, text_file, tmp_path, capsys
):
    out = tmp_path / "ft"
    argv = ["train", "--init-from", base_run, "--data", text_file, "--out-dir", out, *STEPS,
            "--max-iters", "1"]  # fmt: skip
    assert run(argv, capsys)[0] == 0
    resume = ["train", "--resume", "--out-dir", out, "--max-iters", "3"]
    status, _, err = run([*resume, "--n-layer", "1"], capsys)
    assert_one_line_error(status, err, "--n-layer cannot be given with --init-from")
    status, _, err = run([*resume, "--init-from", tmp_path], capsys)
    assert_one_line_error(status, err, f"cannot change init_from='{tmp_path}'")


def test_a_config_with_init_from_refuses_shape_fields_and_records_none():
    config = TrainConfig(init_from="run", n_layer=2, tokenizer="bpe")
    problems = config.problems()
    assert "n_layer comes from the init_from checkpoint; leave it unset" in problems
    assert "tokenizer comes from the init_from checkpoint; leave it unset" in problems
    values = TrainConfig(init_from="run", block_size=8).to_dict()
    assert values["init_from"] == "run" and values["block_size"] == 8
    assert not {"n_layer", "n_head", "n_embd", "bias", "arch", "tokenizer"} & set(values)
    assert TrainConfig.from_dict(values).problems() == []
    assert "init_from" not in TrainConfig().to_dict()  # a run from scratch writes what it did


# ------------------------------------------------------------------ chat on a finetuned run


def test_a_run_finetuned_from_an_instruct_model_keeps_its_chat_template(
    tmp_path, capsys, monkeypatch
):
    from test_chat import TEMPLATE, chat, chat_gguf

    source = chat_gguf(tmp_path / "ends.gguf", ends=True)  # every answer: the end token at once
    text = tmp_path / "letters.txt"
    rng = np.random.default_rng(2)
    text.write_text(" ".join("".join(rng.choice(list("abcdef"), size=4)) for _ in range(300)))
    out = tmp_path / "ft"
    status, _, err = run(["train", "--init-from", source, "--data", text, "--out-dir", out,
                          *STEPS, "--max-iters", "1", "--lr", "1e-6"], capsys)  # fmt: skip
    assert status == 0, err
    source.unlink()
    saved = SavedRun.read(out / CHECKPOINT_NAME)
    assert saved.state.chat_template.source == TEMPLATE
    status, answers, err = chat(["--checkpoint", out / CHECKPOINT_NAME], capsys, monkeypatch,
                                "hi\nagain\n")  # fmt: skip
    assert status == 0, err
    assert answers == "\n\n"  # the template's eos_token still ends each answer


# ------------------------------------------------------------------ prepared data


def test_finetuning_on_prepared_data_needs_the_checkpoints_tokenizer(tmp_path, capsys):
    """``--init-from`` with ``--data DIR`` (glassllm prepare): shards prepared with the run's own
    tokenizer train from its weights; shards of another tokenizer are refused in one line."""
    optional("tokenizers")
    from corpus_files import write_corpus

    docs = write_corpus(tmp_path / "docs", files=6)
    text = tmp_path / "all.txt"
    text.write_text("".join(p.read_text() for p in sorted(docs.rglob("*.txt"))))
    base = tmp_path / "base"
    status, _, err = run(["train", *BASE, "--tokenizer", "bpe", "--vocab-size", "300", "--data",
                          text, "--out-dir", base, "--max-iters", "2", "--eval-interval", "2"],
                         capsys)  # fmt: skip
    assert status == 0, err
    for name, tokenizer in (("same", base / CHECKPOINT_NAME), ("byte", "byte")):
        argv = ["prepare", "--data", docs, "--out-dir", tmp_path / name, "--tokenizer", tokenizer,
                "--val-fraction", "0.3"]  # fmt: skip
        status, _, err = run(argv, capsys)
        assert status == 0, err
    finetune = ["train", "--init-from", base, *STEPS, "--max-iters", "2", "--eval-interval", "2"]
    status, _, err = run([*finetune, "--data", tmp_path / "same", "--out-dir", tmp_path / "ft"],
                         capsys)  # fmt: skip
    assert status == 0, err
    assert SavedRun.read(tmp_path / "ft" / CHECKPOINT_NAME).state.iteration == 2
    status, _, err = run([*finetune, "--data", tmp_path / "byte", "--out-dir", tmp_path / "no"],
                         capsys)  # fmt: skip
    assert_one_line_error(status, err, "prepared with another tokenizer")
    assert not (tmp_path / "no").exists()
