"""GGUF files (llama.cpp's format) in: a quantized model file as a glassllm model, its tokenizer
and its chat template.

>>> from glassllm.gguf import load_gguf                                   # doctest: +SKIP
>>> model, tokenizer, chat_template = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP

Needs llama.cpp's ``gguf`` package and ``tokenizers`` (``pip install -e '.[gguf]'`` in the
checkout); the header reader (`glassllm.gguf.header`) needs neither. The weights are dequantized to
float32 at load; the layers then run as for any glassllm model.
"""

from glassllm.gguf.convert import hf_config, hf_name, unpermute
from glassllm.gguf.header import GGUFFormatError, GGUFHeader, TensorInfo, read_header
from glassllm.gguf.load import GGUFContents, is_gguf_path, load_gguf, read_gguf

__all__ = [
    "GGUFContents",
    "GGUFFormatError",
    "GGUFHeader",
    "TensorInfo",
    "hf_config",
    "hf_name",
    "is_gguf_path",
    "load_gguf",
    "read_gguf",
    "read_header",
    "unpermute",
]
