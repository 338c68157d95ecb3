"""Hugging Face GPT-2 files in and out: load a ``gpt2``-style directory as a glassllm GPT, write a
glassllm GPT as one that transformers loads.

>>> from glassllm.hf import load_pretrained, save_pretrained        # doctest: +SKIP
>>> model, tokenizer = load_pretrained("path/to/gpt2")              # doctest: +SKIP
>>> save_pretrained(model, tokenizer, "out/gpt2-copy")              # doctest: +SKIP

Needs numpy and safetensors only; tokenizers (``pip install -e '.[hf]'`` in the checkout) when a
tokenizer is read. The pure converters (configurations and tensor names, both ways) are in
`glassllm.hf.convert`.
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
from glassllm.hf.load import find_tokenizer, is_pretrained_path, load_model, load_pretrained

__all__ = [
    "HFFormatError",
    "check_target",
    "config_from_hf",
    "config_to_hf",
    "find_tokenizer",
    "hf_tokenizer_of",
    "is_pretrained_path",
    "load_model",
    "load_pretrained",
    "name_from_hf",
    "name_to_hf",
    "save_pretrained",
    "state_dict_from_hf",
    "state_dict_to_hf",
]
