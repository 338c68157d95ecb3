"""GGUF files (llama.cpp's format) in: a quantized model file as a glassllm model, its tokenizer
and its chat template.

>>> from glassllm.hf import load_gguf                                     # doctest: +SKIP
>>> model, tokenizer, chat_template = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP

This package reads the file (`read_gguf`: a transformers-style config dict and tensors, the
tokenizer, the chat template); `glassllm.hf` builds the model from them, and its
`load_pretrained` and `load_model` take a GGUF file as they take a directory.

Needs llama.cpp's ``gguf`` package and ``tokenizers`` (``pip install -e '.[gguf]'`` in the
checkout); the header reader (`glassllm.gguf.header`) needs neither. The weights are dequantized to
float32 at load; the layers then run as for any glassllm model.
"""

from glassllm.gguf.convert import hf_config, hf_name, unpermute
from glassllm.gguf.header import GGUFFormatError, GGUFHeader, TensorInfo, read_header
from glassllm.gguf.load import DeferredTensor, GGUFContents, is_gguf_path, read_gguf

__all__ = [
    "GGUFContents",
    "GGUFFormatError",
    "GGUFHeader",
    "TensorInfo",
    "hf_config",
    "hf_name",
    "is_gguf_path",
    "read_gguf",
    "DeferredTensor",
    "read_header",
    "unpermute",
]
