"""Hugging Face files in and out: load a directory of ``model_type`` gpt2, llama (SmolLM2,
Llama-3.2, TinyLlama), qwen2 (Qwen2.5), qwen3, gpt_neox (Pythia) or gpt_neo (TinyStories) as a
glassllm GPT; write a glassllm GPT as a directory transformers loads (``GPT2LMHeadModel`` or
``LlamaForCausalLM``).

>>> from glassllm.hf import load_pretrained, save_pretrained        # doctest: +SKIP
>>> model, tokenizer = load_pretrained("path/to/gpt2")              # doctest: +SKIP
>>> save_pretrained(model, tokenizer, "out/gpt2-copy")              # doctest: +SKIP

Needs numpy and safetensors only; tokenizers (``pip install -e '.[hf]'`` in the checkout) when a
tokenizer is read or written. The pure converters (configurations and tensors, both ways) are in
`glassllm.hf.convert`; each family's keys and tensor names in `glassllm.hf.families`;
`model_from_hf` converts a config dict and tensors already in memory (a GGUF file's);
`load_pretrained` and `load_model` open a GGUF file too (`load_gguf`, through `glassllm.gguf`).
"""

from glassllm.hf.convert import (
    HFFormatError,
    config_from_hf,
    config_to_hf,
    name_from_hf,
    name_to_hf,
    state_dict_from_hf,
    state_dict_to_hf,
)
from glassllm.hf.export import check_target, hf_tokenizer_of, save_pretrained
from glassllm.hf.families import FAMILIES
from glassllm.hf.load import (
    find_tokenizer,
    is_pretrained_path,
    load_gguf,
    load_model,
    load_pretrained,
    model_from_hf,
)

__all__ = [
    "FAMILIES",
    "HFFormatError",
    "check_target",
    "config_from_hf",
    "config_to_hf",
    "find_tokenizer",
    "hf_tokenizer_of",
    "is_pretrained_path",
    "load_gguf",
    "load_model",
    "load_pretrained",
    "model_from_hf",
    "name_from_hf",
    "name_to_hf",
    "save_pretrained",
    "state_dict_from_hf",
    "state_dict_to_hf",
]
