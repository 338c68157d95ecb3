"""Reading files that may be hostile, for the Hugging Face loaders: `glassllm._untrusted`'s error,
bounds and JSON reader under their first address (the chat template reader uses them too, and
must not import `glassllm.hf`, which opens GGUF files through `glassllm.gguf`)."""

from glassllm._untrusted import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_TOKENIZER_BYTES,
    HFFormatError,
    listed,
    parse_json,
    read_json,
    shown,
)

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_TOKENIZER_BYTES",
    "HFFormatError",
    "listed",
    "parse_json",
    "read_json",
    "shown",
]
