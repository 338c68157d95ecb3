"""``glassllm train --arch llama``: the Llama-style recipe through the command line (train, resume
bit for bit, sample, export as LlamaForCausalLM), and its options' errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli as run

from glassllm.app import run_state
from glassllm.app.config import CHECKPOINT_NAME, TrainConfig
from glassllm.models.config import parameter_count

LLAMA = ["--arch", "llama", "--n-layer", "2", "--n-head", "4", "--n-embd", "16",
         "--block-size", "16", "--batch-size", "4", "--max-iters", "12", "--eval-interval", "5",
         "--eval-iters", "2", "--sample-tokens", "10", "--warmup-iters", "2"]  # fmt: skip


def assert_one_line_error(status, err, *fragments):
    assert status == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_train_llama_writes_a_llama_style_checkpoint_and_samples(text_file, tmp_path, capsys):
    from safetensors.numpy import load_file

    status, out, err = run(["train", *LLAMA, "--data", text_file, "--out-dir", tmp_path], capsys)
    assert status == 0, err
    assert "Llama-style GPT 2 layers x 16 wide, 4 heads (2 key/value)" in out
    assert "--- sample (10 tokens" in out
    tensors = load_file(tmp_path / CHECKPOINT_NAME)
    assert "wpe.weight" not in tensors and "lm_head.weight" not in tensors  # rotary, tied
    assert tensors["blocks.0.attn.qkv.weight"].shape == (16, (4 + 2 * 2) * 4)  # GQA: 2 kv heads
    assert {"blocks.1.mlp.gate.weight", "blocks.1.mlp.up.weight"} <= set(tensors)
    assert not any(name.endswith(".bias") for name in tensors)
    status, out, err = run(["sample", "--checkpoint", tmp_path / CHECKPOINT_NAME,
                            "--max-new-tokens", "8", "--top-k", "1", "--num-samples", "1"],
                           capsys)  # fmt: skip
    assert status == 0, err
    assert out.strip()


def test_resume_of_a_llama_run_matches_a_straight_run(text_file, tmp_path, capsys):
    from safetensors.numpy import load_file

    common = [*LLAMA, "--data", text_file, "--lr-decay-iters", "12", "--dropout", "0.1"]
    assert run(["train", *common, "--out-dir", tmp_path / "straight"], capsys)[0] == 0
    assert (
        run(["train", *common, "--max-iters", "7", "--out-dir", tmp_path / "split"], capsys)[0] == 0
    )
    status, out, err = run(["train", "--resume", "--out-dir", tmp_path / "split",
                            "--max-iters", "12"], capsys)  # fmt: skip
    assert status == 0, err
    assert "resuming at step 7" in out
    straight = load_file(tmp_path / "straight" / CHECKPOINT_NAME)
    resumed = load_file(tmp_path / "split" / CHECKPOINT_NAME)
    assert straight.keys() == resumed.keys()  # weights and optimizer moments
    for name, value in straight.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    status, _, err = run(["train", "--resume", "--out-dir", tmp_path / "split", "--arch", "gpt2",
                          "--max-iters", "14"], capsys)  # fmt: skip
    assert_one_line_error(status, err, "cannot change arch='gpt2' (checkpoint: 'llama')")


def test_export_of_a_llama_run_writes_llama_for_causal_lm(text_file, tmp_path, capsys):
    import json

    argv = ["train", *LLAMA, "--max-iters", "1", "--sample-tokens", "0"]
    assert run([*argv, "--data", text_file, "--out-dir", tmp_path / "run"], capsys)[0] == 0
    status, _, err = run(["export", "--checkpoint", tmp_path / "run" / CHECKPOINT_NAME,
                          "--out-dir", tmp_path / "hf"], capsys)  # fmt: skip
    assert status == 0, err
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2


@pytest.mark.parametrize(
    "options, fragments",
    [
        (["--arch", "mamba"], ["--arch: invalid choice: 'mamba'"]),
        (["--n-kv-head", "2"], ["n_kv_head is for --arch llama only"]),
        (["--arch", "llama", "--n-kv-head", "3"], ["n_kv_head (3) must divide n_head (2)"]),
        (["--arch", "llama", "--n-kv-head", "0"], ["n_kv_head must be"]),
        (["--arch", "llama", "--n-embd", "18"], ["rotary positions need an even head_dim, got 9"]),
    ],
)
def test_bad_arch_options(text_file, tmp_path, capsys, options, fragments):
    argv = ["train", "--n-head", "2", "--n-embd", "16", "--data", text_file,
            "--out-dir", tmp_path / "o", *options]  # fmt: skip
    assert_one_line_error(*run(argv, capsys)[::2], *fragments)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name, value", [("arch", "gpt2"), ("n_kv_head", 4)])
def test_the_recipe_is_fixed_on_resume(text_file, tmp_path, capsys, name, value):
    argv = ["train", *LLAMA, "--max-iters", "1", "--sample-tokens", "0", "--data", text_file]
    assert run([*argv, "--out-dir", tmp_path], capsys)[0] == 0
    config = run_state.read_for_resume(tmp_path).resume_config({name: value, "max_iters": 3})
    with pytest.raises(ValueError, match=f"cannot change {name}="):
        run_state.read_for_resume(tmp_path).check_resumable(config)


def test_a_gpt2_run_writes_todays_train_config():
    config = TrainConfig()
    assert "arch" not in config.to_dict() and "n_kv_head" not in config.to_dict()
    assert TrainConfig.from_dict(config.to_dict()) == config
    llama = TrainConfig(arch="llama", n_kv_head=1)
    assert TrainConfig.from_dict(llama.to_dict()) == llama


def test_the_llama_recipe_has_the_gpt2_recipes_parameter_count():
    gpt2, llama = TrainConfig(), TrainConfig(arch="llama")  # nanoGPT's shakespeare_char shape
    counts = [parameter_count(c.model_config(vocab_size=65)) for c in (gpt2, llama)]
    assert abs(counts[1] - counts[0]) / counts[0] < 1e-3, counts
