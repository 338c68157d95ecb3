"""Tiny random Hugging Face models of every family glassllm reads, built offline with transformers'
config classes (the recipe of shared/designs/modern_models.md §5), and transformers as the oracle.

Each variant: 2 layers, hidden 64, 4 heads (2 kv heads where the family has grouped-query
attention), intermediate 128, 64 positions, a ~300-token byte-level BPE; weights perturbed before
saving (norm weights uniform in [0.5, 1.5], every other tensor normal(0, 0.1)), since at
transformers' initialisation the logits barely depend on norms, biases or the attention scale.
`Models` builds each variant once per session under a pytest tmp directory (nothing committed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 300
SEED = 21
COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              max_position_embeddings=64)  # fmt: skip
WORDS = (
    "the cat sat on a mat and then it ran to the door; dogs bark at night, birds sing "
    "in trees. def f(x): return x + 1 if x > 0 else -x # 2026 {a: [1, 2]}"
).split()


def _llama(t, **kw):
    return t.LlamaConfig(**{**COMMON, "vocab_size": VOCAB, "num_key_value_heads": 2, **kw})


def _qwen2(t, **kw):
    return t.Qwen2Config(**{**COMMON, "vocab_size": VOCAB, "num_key_value_heads": 2,
                            "tie_word_embeddings": True, **kw})  # fmt: skip


def _neox(t, **kw):
    return t.GPTNeoXConfig(**{**COMMON, "vocab_size": VOCAB + 20, **kw})  # padded, as Pythia's


def _neo(t, **kw):
    local = [[["global", "local"], 1]]
    return t.GPTNeoConfig(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4,
                          intermediate_size=128, max_position_embeddings=64,
                          attention_types=local, window_size=4, **kw)  # fmt: skip


LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
# name -> (config factory taking the transformers module, options)
VARIANTS: dict[str, tuple[Any, dict[str, Any]]] = {
    "llama": (_llama, {}),  # GQA, untied head (TinyLlama)
    "llama_mha_tied": (lambda t: _llama(t, num_key_value_heads=4, tie_word_embeddings=True), {}),
    "llama_bf16": (_llama, {"bf16": True}),
    "llama_v4": (lambda t: _llama(t, rope_parameters=LLAMA3), {"v4": True}),
    "llama3_scaling": (lambda t: _llama(t, rope_parameters=LLAMA3), {}),
    "llama_biases": (lambda t: _llama(t, attention_bias=True, mlp_bias=True), {}),
    "qwen2": (_qwen2, {}),
    "qwen2_v4": (_qwen2, {"v4": True}),  # with Qwen2.5's inactive sliding_window: 32768
    "qwen2_sliding": (
        lambda t: _qwen2(t, use_sliding_window=True, sliding_window=4, max_window_layers=1),
        {},
    ),  # fmt: skip
    "qwen3": (
        lambda t: t.Qwen3Config(
            **COMMON, vocab_size=VOCAB, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True
        ),
        {},
    ),  # fmt: skip
    "gpt_neox": (_neox, {}),  # Pythia: parallel residual, rotary on 25% of each head, untied
    "gpt_neox_v4": (
        lambda t: _neox(
            t,
            use_parallel_residual=False,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 500.0,
                "partial_rotary_factor": 0.5,
            },
        ),
        {"v4": True},
    ),  # fmt: skip
    "gpt_neo": (_neo, {}),  # TinyStories: alternating global/local, window 4, unscaled scores
    "gpt2_untied": (
        lambda t: t.GPT2Config(
            vocab_size=VOCAB,
            n_positions=64,
            n_embd=64,
            n_layer=2,
            n_head=4,
            tie_word_embeddings=False,
            activation_function="gelu",
        ),
        {},
    ),  # fmt: skip
}


def training_text() -> str:
    rng = np.random.default_rng(SEED)
    lines = [" ".join(rng.choice(WORDS, size=12)) for _ in range(400)]
    return "\n".join(lines) + "\n"


def train_tokenizer(tokenizers: Any) -> Any:
    """A byte-level BPE of ~VOCAB tokens whose alphabet is printable ASCII plus GPT-2's stand-ins
    for space and newline: every token prints distinctly (no lone UTF-8 continuation bytes)."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    alphabet = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["\u0120", "\u010a"]
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=alphabet,
                                  limit_alphabet=len(alphabet), show_progress=False,
                                  special_tokens=["<|endoftext|>"])  # fmt: skip
    tokenizer.train_from_iterator(training_text().splitlines(), trainer)
    return tokenizer


def perturb(model: Any, torch: Any, seed: int = SEED) -> None:
    """Norm weights (the 1-D weights) uniform in [0.5, 1.5], every other tensor normal(0, 0.1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1 and name.endswith("weight"):
                param.copy_(0.5 + torch.rand(param.shape, generator=generator))
            else:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))


def to_v4(directory: Path) -> None:
    """Rewrite a transformers-5 config.json in the transformers-4 spelling most Hub files carry."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["torch_dtype"] = config.pop("dtype")
    rope = config.pop("rope_parameters", None) or {}
    if config["model_type"] == "gpt_neox":
        config["rotary_emb_base"] = rope.pop("rope_theta")
        config["rotary_pct"] = rope.pop("partial_rotary_factor")
    elif rope:
        config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    if config["model_type"] in ("qwen2", "qwen3"):
        config.pop("layer_types")
        if not config["use_sliding_window"]:
            config["sliding_window"] = 32768  # as Qwen2.5's files: present, inactive
    path.write_text(json.dumps(config, indent=2))


class Models:
    """Builds each variant's directory once (``get``) and its transformers oracle (``oracle``)."""

    def __init__(self, root: Path) -> None:
        from conftest import optional

        self.torch = optional("torch")
        self.transformers = optional("transformers")
        self.tokenizers = optional("tokenizers")
        self.root = root
        self._oracles: dict[str, Any] = {}
        self.tokenizer = train_tokenizer(self.tokenizers)

    def get(self, variant: str) -> Path:
        directory = self.root / variant
        if directory.exists():
            return directory
        make, options = VARIANTS[variant]
        self.torch.manual_seed(SEED)
        model = self.transformers.AutoModelForCausalLM.from_config(make(self.transformers))
        perturb(model, self.torch)
        if options.get("bf16"):
            model = model.to(self.torch.bfloat16)
        model.save_pretrained(directory)
        self.save_tokenizer(directory)
        if options.get("v4"):
            to_v4(directory)
        return directory

    def save_tokenizer(self, directory: Path) -> None:
        fast = self.transformers.PreTrainedTokenizerFast(
            tokenizer_object=self.tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
        )
        fast.save_pretrained(directory)

    def oracle(self, variant: str) -> Any:
        """transformers' float32 model of the directory, in eval mode."""
        if variant not in self._oracles:
            model = self.transformers.AutoModelForCausalLM.from_pretrained(
                self.get(variant), dtype=self.torch.float32
            )
            self._oracles[variant] = model.eval()
        return self._oracles[variant]

    def logits(self, variant: str, ids: np.ndarray) -> np.ndarray:
        with self.torch.no_grad():
            return self.oracle(variant)(self.torch.from_numpy(ids)).logits.numpy()

    def greedy(self, variant: str, prompt: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """transformers' greedy continuation of ``prompt`` (1, T) by hand (argmax of a full
        forward each step) and the top-2 logit gap of each step, so that near-ties are not
        asked of a float32 implementation."""
        ids, gaps = prompt, []
        for _ in range(steps):
            last = self.logits(variant, ids)[0, -1]
            first, second = np.sort(last)[-2:][::-1]
            gaps.append(first - second)
            ids = np.concatenate([ids, [[int(np.argmax(last))]]], axis=1)
        return ids, np.array(gaps)
