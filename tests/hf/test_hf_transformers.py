"""transformers as the oracle: its GPT-2 files load into glassllm with the same logits and greedy
ids, and glassllm's exports load into transformers (model and tokenizer) with the same results."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

from glassllm.data import ByteTokenizer, CharTokenizer, train_bpe
from glassllm.hf import load_pretrained, save_pretrained
from glassllm.models import GPT, GPTConfig

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


def _randomise(model, torch) -> None:
    """Every parameter random, LayerNorm included, so a tensor loaded in the wrong place shows."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.copy_((0.2 if name.endswith("bias") else 0.3) * torch.randn_like(param))


def test_a_transformers_save_loads_with_the_same_logits_and_greedy_ids(tmp_path):
    torch = optional("torch")
    transformers = optional("transformers")
    config = transformers.GPT2Config(
        vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    reference = transformers.GPT2LMHeadModel(config).eval()
    _randomise(reference, torch)
    reference.save_pretrained(tmp_path)
    model, tokenizer = load_pretrained(tmp_path)
    assert tokenizer is None
    idx = np.random.default_rng(0).integers(0, 97, size=(3, 64))
    with torch.no_grad():
        expected = reference(torch.from_numpy(idx)).logits.numpy()
        prompt = torch.from_numpy(idx[:, :8])
        greedy = reference.generate(
            prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False,
            attention_mask=torch.ones_like(prompt), pad_token_id=0,
        ).numpy()  # fmt: skip
    assert np.abs(model(idx)[0].data - expected).max() < 1e-5
    assert np.array_equal(model.generate(idx[:, :8], 20, top_k=1), greedy)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_an_export_loads_in_transformers_with_the_same_logits_and_ids(tmp_path, bias, kind):
    torch = optional("torch")
    transformers = optional("transformers")
    if kind == "char":
        tokenizer = CharTokenizer.from_text(TEXT)
    elif kind == "byte":
        tokenizer = ByteTokenizer()
    else:
        tokenizer = train_bpe(TEXT * 20, 280)
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=16, bias=bias
    )
    model = GPT(config, rng=np.random.default_rng(0))
    rng = np.random.default_rng(1)
    for p in model.parameters():
        p.data += rng.standard_normal(p.shape).astype(np.float32) * 0.2
    out = save_pretrained(model, tokenizer, tmp_path / "export")

    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = tokenizer.encode(TEXT[:32] if kind != "bpe" else TEXT)[:32]
    assert their_tokenizer(TEXT, add_special_tokens=False)["input_ids"][: len(ids)] == ids
    assert their_tokenizer.decode(tokenizer.encode(TEXT)) == TEXT
    idx = np.array([ids])
    prompt = torch.from_numpy(idx[:, :6])
    with torch.no_grad():
        expected = theirs(torch.from_numpy(idx)).logits.numpy()
        greedy = theirs.generate(
            prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False,
            attention_mask=torch.ones_like(prompt), pad_token_id=0,
        ).numpy()  # fmt: skip
    assert np.abs(model.eval()(idx)[0].data - expected).max() < 1e-5
    assert np.array_equal(model.generate(idx[:, :6], 12, top_k=1), greedy)
