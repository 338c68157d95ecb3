"""A Llama-style glassllm model exports to a directory transformers loads as LlamaForCausalLM with
the same logits and greedy tokens (`save_pretrained`, ``glassllm export``); a transformers Llama
read by glassllm and written back computes what it computed; configurations no class glassllm
writes represents exactly are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hf_models import Models

from glassllm.app.cli import main
from glassllm.data import train_bpe
from glassllm.hf import HFFormatError, load_model, load_pretrained, save_pretrained
from glassllm.models import GPT
from glassllm.models.config import llama_config

TOLERANCE = 1e-4
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Models:
    return Models(tmp_path_factory.mktemp("hf_export"))


def _llama(seed: int = 0, **fields) -> GPT:
    config = llama_config(vocab_size=290, block_size=64, n_layer=2, n_head=4, n_embd=32, **fields)
    model = GPT(config, rng=np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    for name, p in model.named_parameters():  # norms in [0.5, 1.5], the rest N(0, 0.1)
        shape = p.data.shape
        values = rng.uniform(0.5, 1.5, shape) if name.endswith("norm.weight") or (
            name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
        ) else rng.normal(0.0, 0.1, shape)  # fmt: skip
        p.data[...] = values.astype(np.float32)
    return model.eval()


def _theirs(models: Models, directory, ids: np.ndarray) -> tuple[object, np.ndarray]:
    theirs = models.transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=models.torch.float32
    ).eval()
    with models.torch.no_grad():
        return theirs, theirs(models.torch.from_numpy(ids)).logits.numpy()


@pytest.mark.parametrize(
    "fields",
    [{}, {"tied_head": False, "n_kv_head": 4},
     {"qkv_bias": True, "rope_theta": 500000.0, "rope_scaling": {
         "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 16}},
     {"mlp_bias": True, "norm_eps": 1e-6, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}],
    ids=["gqa_tied", "mha_untied", "llama3_qkv_bias", "linear_mlp_bias"],
)  # fmt: skip
def test_a_llama_style_model_exports_as_llama_for_causal_lm(models, tmp_path, fields):
    tokenizer = train_bpe(TEXT * 20, 290)
    model = _llama(**fields)
    out = save_pretrained(model, tokenizer, tmp_path / "export")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    ids = np.array([tokenizer.encode(TEXT)[:40]])
    theirs, expected = _theirs(models, out, ids)
    assert type(theirs).__name__ == "LlamaForCausalLM"
    assert np.abs(model(ids)[0].data - expected).max() <= TOLERANCE
    their_tokenizer = models.transformers.AutoTokenizer.from_pretrained(out)
    assert their_tokenizer(TEXT, add_special_tokens=False)["input_ids"] == tokenizer.encode(TEXT)
    prompt = models.torch.from_numpy(ids[:, :8])
    with models.torch.no_grad():
        greedy = theirs.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                 attention_mask=models.torch.ones_like(prompt),
                                 pad_token_id=0).numpy()  # fmt: skip
    assert np.array_equal(model.generate(ids[:, :8], 12, top_k=1), greedy)
    back, _ = load_pretrained(out)  # and read back: the same parameters, bit for bit
    for name, value in back.state_dict().items():
        original = model.state_dict().get(name, np.zeros_like(value))  # zero biases added
        assert np.array_equal(value, original), name


@pytest.mark.parametrize("variant", ["llama", "llama_mha_tied", "llama3_scaling"])
def test_a_transformers_llama_round_trips(models, tmp_path, variant):
    directory = models.get(variant)
    model, tokenizer = load_pretrained(directory)
    out = save_pretrained(model, tokenizer, tmp_path / "again")
    ids = np.random.default_rng(0).integers(0, 300, size=(2, 24))
    _, expected = _theirs(models, directory, ids)
    _, again = _theirs(models, out, ids)
    assert np.abs(again - expected).max() <= TOLERANCE


def test_glassllm_export_writes_llama_from_a_hugging_face_directory(models, tmp_path, capsys):
    directory = models.get("llama")
    status = main(["export", "--checkpoint", str(directory), "--out-dir", str(tmp_path / "x")])
    assert status == 0, capsys.readouterr().err
    ids = np.random.default_rng(1).integers(0, 300, size=(1, 20))
    _, expected = _theirs(models, directory, ids)
    _, exported = _theirs(models, tmp_path / "x", ids)
    assert np.abs(exported - expected).max() <= TOLERANCE


@pytest.mark.parametrize(
    "variant, fragment",
    [("qwen3", "qk_norm=True (LlamaForCausalLM needs False)"),
     ("gpt_neox", "parallel_residual=True (LlamaForCausalLM needs False)"),
     ("gpt_neo", "local_layers=(1,) (GPT2LMHeadModel needs ())")],
)  # fmt: skip
def test_configurations_no_written_class_represents_are_refused(
    models, tmp_path, capsys, variant, fragment
):
    model = load_model(models.get(variant))
    with pytest.raises(HFFormatError) as caught:
        save_pretrained(model, None, tmp_path / "out")
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(models.get(variant)),
                 "--out-dir", str(tmp_path / "cli")]) == 2  # fmt: skip
