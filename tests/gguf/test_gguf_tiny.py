"""Tiny random transformers models (Llama with MHA and GQA, tied and untied; Qwen2 with q/k/v
biases; Qwen3 with QK-norm) written as llama.cpp writes a GGUF (its tensor names, Llama's q/k
rows permuted for its interleaved RoPE, metadata under the architecture's keys), then loaded by
glassllm: the logits of transformers' original model to float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional
from gguf_files import Tensor, f32_tensor, write_gguf

from glassllm.gguf.convert import BLOCK_TENSORS, GLOBAL_TENSORS

TOKENS = ["<|endoftext|>", *"abcdefghijklmnopqrstuvwxyz", "Ġ", "ab", "Ġa"]
MERGES = ["a b", "Ġ a"]
VOCAB = len(TOKENS)


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute (rows of each head interleaved)."""
    rows = weights.shape[0]
    shaped = weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
    return shaped.swapaxes(1, 2).reshape(weights.shape)


def gguf_name(hf: str) -> str:
    for theirs, ours in GLOBAL_TENSORS.items():
        if ours == hf:
            return theirs
    _, _, block, rest = hf.split(".", 3)
    return f"blk.{block}." + next(g for g, h in BLOCK_TENSORS.items() if h == rest)


def write_like_llama_cpp(path, model, arch: str, f16: bool = False):
    config = model.config
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": config.num_hidden_layers,
        f"{arch}.embedding_length": config.hidden_size,
        f"{arch}.feed_forward_length": config.intermediate_size,
        f"{arch}.attention.head_count": config.num_attention_heads,
        f"{arch}.attention.head_count_kv": config.num_key_value_heads,
        f"{arch}.rope.freq_base": float(config.rope_parameters["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        f"{arch}.context_length": config.max_position_embeddings,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2" if arch != "llama" else "smollm",
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.eos_token_id": 0,
    }
    if arch == "qwen3":
        meta[f"{arch}.attention.key_length"] = config.head_dim
    tensors = []
    for name, value in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        values = value.detach().numpy()
        if arch == "llama" and ("q_proj" in name or "k_proj" in name):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            values = permute(values, heads)
        if f16 and values.ndim == 2:
            half = np.ascontiguousarray(values, dtype="<f2")
            tensors.append(Tensor(gguf_name(name), list(reversed(half.shape)), 1, half.tobytes()))
        else:
            tensors.append(f32_tensor(gguf_name(name), values))
    return write_gguf(path, meta, tensors)


def random_model(family: str, kv_heads: int = 2, tied: bool = True, f16: bool = False):
    torch = optional("torch")
    transformers = optional("transformers")
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        rope_theta=500.0,
    )
    configs = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=16),
    }
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[family]()).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norms away from 1 and larger weights: every choice shows (design §5)
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
            if f16:
                param.copy_(param.half().float())
    return model


CASES = [
    ("llama", 4, True, False),
    ("llama", 2, True, False),
    ("llama", 1, False, False),
    ("llama", 2, True, True),
    ("qwen2", 2, True, False),
    ("qwen3", 2, False, False),
]


@pytest.mark.parametrize("family, kv_heads, tied, f16", CASES)
def test_logits_of_the_original_model(tmp_path, family, kv_heads, tied, f16):
    torch = optional("torch")
    optional("gguf")
    optional("tokenizers")
    from glassllm.autograd import no_grad
    from glassllm.hf import load_gguf

    model = random_model(family, kv_heads, tied, f16)
    path = write_like_llama_cpp(tmp_path / f"{family}.gguf", model, family, f16)
    glass, tokenizer, _ = load_gguf(path)
    assert glass.config.n_kv_head in (None, kv_heads) and glass.config.tied_head == tied
    ids = tokenizer.encode("ab cab a zebra quiz")
    assert len(ids) > 10
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    with no_grad():
        logits = glass(np.asarray([ids]))[0].data[0]
    assert np.abs(expected).max() > 0.5  # not a degenerate model
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-4)


def test_the_permutation_matters(tmp_path):
    """Written without llama.cpp's permutation, the same model gives other logits: the check
    above sees the un-permutation."""
    torch = optional("torch")
    optional("gguf")
    optional("tokenizers")
    from glassllm.autograd import no_grad
    from glassllm.hf import load_gguf

    model = random_model("llama", 4)
    path = write_like_llama_cpp(tmp_path / "qwen-like.gguf", model, "llama")
    data = path.read_bytes()
    glass = load_gguf(path)[0]
    # read the file as if llama.cpp had not permuted: permute the model instead
    with torch.no_grad():
        for layer in model.model.layers:
            for proj, heads in ((layer.self_attn.q_proj, 4), (layer.self_attn.k_proj, 4)):
                proj.weight.copy_(torch.from_numpy(permute(proj.weight.numpy(), heads)))
    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    with torch.no_grad():
        other = model(torch.tensor([ids])).logits[0].numpy()
    with no_grad():
        logits = glass(np.asarray([ids]))[0].data[0]
    assert np.abs(logits - other).max() > 1e-2
    assert path.read_bytes() == data


def test_the_hugging_face_loaders_open_a_gguf_file(tmp_path):
    """``glassllm.hf.load_pretrained`` and ``load_model`` take a GGUF file as they take a
    directory (the issue's ``from_pretrained`` of a ``.gguf``): the same model as `load_gguf`."""
    optional("gguf")
    optional("tokenizers")
    from gguf_files import tiny_llama

    from glassllm.autograd import no_grad
    from glassllm.hf import load_gguf, load_model, load_pretrained

    meta, tensors = tiny_llama(np.random.default_rng(0), layers=2)
    path = write_gguf(tmp_path / "tiny.gguf", meta, tensors)
    renamed = tmp_path / "tiny-model"  # no suffix: recognised by its magic
    renamed.write_bytes(path.read_bytes())
    expected, expected_tokenizer, _ = load_gguf(path)
    ids = np.asarray([[1, 2, 3, 4, 5]])
    with no_grad():
        reference = expected(ids)[0].data
    for source in (path, str(path), renamed):
        model, tokenizer = load_pretrained(source, require_tokenizer=True)
        assert tokenizer.encode("ab cab") == expected_tokenizer.encode("ab cab")
        with no_grad():
            np.testing.assert_array_equal(model(ids)[0].data, reference)
            np.testing.assert_array_equal(load_model(source)(ids)[0].data, reference)
    wide = load_model(path, dtype=np.float64)
    assert all(p.dtype == np.float64 for p in wide.parameters())
    with no_grad():
        np.testing.assert_allclose(wide(ids)[0].data, reference, atol=1e-5)
