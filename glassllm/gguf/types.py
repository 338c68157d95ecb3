"""The ggml tensor types glassllm reads from a GGUF file, and the names of the others.

A quantized type stores ``block_elements`` weights in ``block_bytes`` bytes (Q4_1: 32 weights in
an fp16 scale, an fp16 minimum and 16 bytes of nibbles = 20 bytes). Each type here is dequantized
to float32 by the ``gguf`` package (`glassllm.gguf.dequantize`) and tested against an independent
NumPy transcription of llama.cpp's ``dequantize_row_*`` (tests/gguf/test_gguf_dequantize.py); a
type outside the table is refused by name.

>>> GGML_TYPES[3]
GGMLType(id=3, name='Q4_1', block_elements=32, block_bytes=20)
>>> ggml_type_name(20), ggml_type_name(99)
('IQ4_NL', 'type 99')
"""

from __future__ import annotations

from typing import NamedTuple


class GGMLType(NamedTuple):
    id: int
    name: str
    block_elements: int
    block_bytes: int


GGML_TYPES: dict[int, GGMLType] = {
    t.id: t
    for t in (
        GGMLType(0, "F32", 1, 4),
        GGMLType(1, "F16", 1, 2),
        GGMLType(30, "BF16", 1, 2),
        GGMLType(2, "Q4_0", 32, 18),
        GGMLType(3, "Q4_1", 32, 20),
        GGMLType(6, "Q5_0", 32, 22),
        GGMLType(7, "Q5_1", 32, 24),
        GGMLType(8, "Q8_0", 32, 34),
        GGMLType(12, "Q4_K", 256, 144),
        GGMLType(13, "Q5_K", 256, 176),
        GGMLType(14, "Q6_K", 256, 210),
    )
}

# ggml's other types (ggml.h), named in refusals
_OTHER_NAMES = {
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
    40: "NVFP4",
}


def ggml_type_name(type_id: int) -> str:
    """The ggml name of a type id (``type N`` for an id ggml does not define)."""
    known = GGML_TYPES.get(type_id)
    return known.name if known else _OTHER_NAMES.get(type_id, f"type {type_id}")


def supported_type_names() -> str:
    return ", ".join(t.name for t in GGML_TYPES.values())
