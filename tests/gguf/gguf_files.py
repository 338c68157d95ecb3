"""Small GGUF files byte by byte, for the tests: a plain writer (no gguf package) that can also
write what no honest writer would (a count of 2**60, an offset past the end).

``write_gguf(path, metadata, tensors)``: ``metadata`` maps keys to values (str, bool, int as
uint32, float as float32, lists of those; ``Typed(type, value)`` for another GGUF type),
``tensors`` is a list of `Tensor` (ggml dims fastest first, the ggml type id, the raw bytes).
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from typing import Any

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FORMATS = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?"}
_FORMATS |= {U64: "Q", I64: "q", F64: "d"}


@dataclasses.dataclass
class Typed:
    type: int
    value: Any
    element_type: int | None = None  # for an ARRAY
    count: int | None = None  # for an ARRAY or STRING: the length written (a lie if it differs)


@dataclasses.dataclass
class Tensor:
    name: str
    dims: list[int]  # ggml order: [in, out]
    ggml_type: int
    data: bytes
    offset: int | None = None  # None: the next aligned place


def _string(text: str | bytes, count: int | None = None) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if count is None else count) + raw


def _type_of(value: Any) -> int:
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return U32
    if isinstance(value, float):
        return F32
    if isinstance(value, str):
        return STRING
    if isinstance(value, list):
        return ARRAY
    raise TypeError(value)


def _value(value: Any) -> tuple[int, bytes]:
    typed = value if isinstance(value, Typed) else Typed(_type_of(value), value)
    if typed.type == STRING:
        return STRING, _string(typed.value, typed.count)
    if typed.type == ARRAY:
        items = list(typed.value)
        element = typed.element_type
        if element is None:
            element = _type_of(items[0]) if items else U32
            if element == U32 and any(i < 0 for i in items):
                element = I32
        count = len(items) if typed.count is None else typed.count
        body = b"".join(_value(Typed(element, item))[1] for item in items)
        return ARRAY, struct.pack("<IQ", element, count) + body
    if typed.type not in _FORMATS:  # no GGUF type: the bytes given
        return typed.type, bytes(typed.value)
    return typed.type, struct.pack("<" + _FORMATS[typed.type], typed.value)


def gguf_bytes(
    metadata: dict[str, Any],
    tensors: list[Tensor] = (),
    alignment: int = 32,
    version: int = 3,
    magic: bytes = b"GGUF",
    counts: tuple[int, int] | None = None,
) -> bytes:
    """The bytes of a GGUF file; ``counts`` overrides (tensor count, metadata count)."""
    kv = b""
    for key, value in metadata.items():
        value_type, body = _value(value)
        kv += _string(key) + struct.pack("<I", value_type) + body
    offsets, at = [], 0
    for tensor in tensors:  # a tensor with an offset of its own writes no data
        offsets.append(at if tensor.offset is None else tensor.offset)
        if tensor.offset is None:
            at = -(-(at + len(tensor.data)) // alignment) * alignment
    infos = b"".join(
        _string(t.name)
        + struct.pack(f"<I{len(t.dims)}QIQ", len(t.dims), *t.dims, t.ggml_type, offset)
        for t, offset in zip(tensors, offsets, strict=True)
    )
    n_tensors, n_kv = counts or (len(tensors), len(metadata))
    head = magic + struct.pack("<IQQ", version, n_tensors, n_kv) + kv + infos
    data_start = -(-len(head) // alignment) * alignment
    data = bytearray(at)
    for tensor, offset in zip(tensors, offsets, strict=True):
        if tensor.offset is None:
            data[offset : offset + len(tensor.data)] = tensor.data
    return head + bytes(data_start - len(head)) + bytes(data)


def write_gguf(path: Path, metadata: dict[str, Any], tensors: list[Tensor] = (), **kw: Any) -> Path:
    path.write_bytes(gguf_bytes(metadata, tensors, **kw))
    return path


def f32_tensor(name: str, values: np.ndarray) -> Tensor:
    """An F32 tensor of ``values`` given in torch order (its dims written reversed)."""
    values = np.ascontiguousarray(values, dtype="<f4")
    return Tensor(name, list(reversed(values.shape)), 0, values.tobytes())


def tiny_llama(
    rng: np.random.Generator,
    layers: int = 1,
    embed: int = 8,
    heads: int = 2,
    kv_heads: int = 1,
    ffn: int = 16,
    tokens: list[str] | None = None,
    tied: bool = True,
) -> tuple[dict[str, Any], list[Tensor]]:
    """The metadata and F32 tensors of a tiny Llama GGUF with a byte-level vocabulary."""
    tokens = tokens or ["<|endoftext|>", "a", "b", "c", "ab", "Ġ"]
    vocab, head_dim = len(tokens), embed // heads
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "llama.block_count": layers,
        "llama.embedding_length": embed,
        "llama.feed_forward_length": ffn,
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.context_length": 64,
        "llama.vocab_size": vocab,
        "llama.rope.dimension_count": head_dim,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": Typed(ARRAY, [3] + [1] * (vocab - 1), element_type=I32),
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.eos_token_id": 0,
    }

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.5, size=shape).astype(np.float32)

    tensors = [f32_tensor("token_embd.weight", normal(vocab, embed))]
    for i in range(layers):
        b = f"blk.{i}."
        tensors += [
            f32_tensor(b + "attn_norm.weight", 1 + normal(embed) / 4),
            f32_tensor(b + "attn_q.weight", normal(heads * head_dim, embed)),
            f32_tensor(b + "attn_k.weight", normal(kv_heads * head_dim, embed)),
            f32_tensor(b + "attn_v.weight", normal(kv_heads * head_dim, embed)),
            f32_tensor(b + "attn_output.weight", normal(embed, heads * head_dim)),
            f32_tensor(b + "ffn_norm.weight", 1 + normal(embed) / 4),
            f32_tensor(b + "ffn_gate.weight", normal(ffn, embed)),
            f32_tensor(b + "ffn_up.weight", normal(ffn, embed)),
            f32_tensor(b + "ffn_down.weight", normal(embed, ffn)),
        ]
    tensors.append(f32_tensor("output_norm.weight", 1 + normal(embed) / 4))
    if not tied:
        tensors.append(f32_tensor("output.weight", normal(vocab, embed)))
    return meta, tensors
