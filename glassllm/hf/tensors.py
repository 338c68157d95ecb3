"""Hugging Face tensors <-> glassllm parameters, by the family tables of `glassllm.hf.families`:
which file tensors make each parameter (`plan`), checked by name and shape before any value is
read, and the layout changes both ways (`from_hf`, `to_hf`).

Shapes are compared in two steps, so that a configuration read from a hostile file costs nothing
before the file's own tensors agree with it: first the cheap ones (the number of blocks, the
embeddings: `size_problems`), then, with the model's parameter table now known to be no larger
than the file, every tensor.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import numpy as np

from glassllm.hf.families import (
    COPY,
    JOINED,
    PER_HEAD,
    PER_HEAD_BIAS,
    STACKED,
    TRANSPOSE,
    Family,
)
from glassllm.hf.untrusted import listed, shown
from glassllm.models.gpt import GPTConfig, parameter_shapes

_BLOCK = re.compile(r"blocks\.(\d+)\.")
HEAD = "lm_head.weight"


@dataclasses.dataclass
class Plan:
    """Where each glassllm parameter comes from: ``sources[ours] = (how, file names)``; ``head``
    names a stored copy of a tied head (to be compared with the embedding once read)."""

    sources: dict[str, tuple[str, tuple[str, ...]]]
    head: str | None = None


def heads(config: GPTConfig) -> tuple[int, int, int]:
    """(query heads, key/value heads, head width) of ``config``."""
    return config.n_head, config.kv_heads, config.head_size


def canonical_names(names: list[str], family: Family) -> tuple[dict[str, str], list[str]]:
    """``{canonical name: file name}``: GPT-2 files written without the ``transformer.`` prefix
    get it (the head never has it), a family's aliases their table name, so every spelling
    matches one table; a tensor given in two spellings is a problem."""
    prefix = family.optional_prefix
    canonical: dict[str, str] = {}
    twice = []
    for name in names:
        full = prefix + name if prefix and not name.startswith(prefix) and name != HEAD else name
        full = family.aliases.get(full, full)
        if full in canonical:
            twice.append(f"{canonical[full]} and {name}")
        else:
            canonical[full] = name
    return canonical, ([f"tensors given twice: {listed(twice)}"] if twice else [])


def shown_name(name: str, family: Family) -> str:
    """A canonical name as messages show it: GPT-2's without the optional prefix."""
    prefix = family.optional_prefix
    return name[len(prefix) :] if prefix and name.startswith(prefix) else name


def size_problems(
    shapes: Mapping[str, tuple[int, ...]], config: GPTConfig, family: Family, keys: tuple[str, ...]
) -> list[str]:
    """Whether the (canonical) file tensors ``shapes`` hold a model of ``config``'s size: as many
    blocks as ``n_layer``, the embeddings of shapes ``(vocab, width)`` and, for learned positions,
    ``(context, width)``. ``keys`` are the family's names for (vocab, context, width, layers,
    heads). Cheap whatever ``config`` says."""
    vocab_key, context_key, width_key, layers_key, _ = keys
    problems = []
    pattern = family.block_index()
    blocks = {m.group(1) for m in map(pattern.match, shapes) if m}
    if len(blocks) != config.n_layer:
        held = f"{len(blocks)} block{'' if len(blocks) == 1 else 's'}"
        problems.append(
            f"config.json has {layers_key}={config.n_layer} but the weights hold {held}"
        )
    embeddings = [("wte.weight", config.vocab_size, vocab_key)]
    if config.positions == "learned":
        embeddings.append(("wpe.weight", config.block_size, context_key))
    for ours, rows, key in embeddings:
        name = family.tensors[ours][1][0]
        stated = f"config.json's {key}={rows} and {width_key}={config.n_embd}"
        wanted = (rows, config.n_embd)
        if name not in shapes:
            problems.append(
                f"missing tensors: {shown_name(name, family)} (where {stated} need {wanted})"
            )
        elif tuple(shapes[name]) != wanted:
            found = shown(tuple(shapes[name]))
            problems.append(f"{shown_name(name, family)} has shape {found}, where {stated} need "
                            f"{wanted}")  # fmt: skip
    return problems


def plan(
    shapes: Mapping[str, tuple[int, ...]], config: GPTConfig, family: Family, keys: tuple[str, ...]
) -> tuple[Plan, list[str]]:
    """Match the file's tensors ``shapes`` (file name -> shape, torch layout) to the parameters of
    a GPT of ``config``. Returns the plan (by file names) and every problem: missing, unexpected,
    duplicated and mis-shaped tensors (only the size problems when the file holds a model of
    another size: then nothing is matched)."""
    canonical, problems = canonical_names(list(shapes), family)
    by_name = {full: tuple(shapes[name]) for full, name in canonical.items()}
    sized = size_problems(by_name, config, family, keys)
    if sized:
        return Plan({}), problems + sized
    used: set[str] = set()
    sources: dict[str, tuple[str, tuple[str, ...]]] = {}
    missing, wrong = [], []
    for ours, shape in parameter_shapes(config).items():
        block = _BLOCK.match(ours)
        pattern = f"blocks.{{i}}.{ours[block.end() :]}" if block else ours
        if pattern not in family.tensors:
            raise RuntimeError(f"{family.model_type} has no tensor for glassllm's {ours}")
        how, names = family.tensors[pattern]
        names = tuple(n.format(i=block.group(1)) if block else n for n in names)
        expected = source_shapes(how, shape, config)
        for name, wanted in zip(names, expected, strict=True):
            if name not in by_name:
                missing.append(shown_name(name, family))
            elif by_name[name] != wanted:
                wrong.append(f"{canonical[name]} {shown(by_name[name])} (expected {wanted})")
        used.update(names)
        sources[ours] = (how, tuple(canonical.get(n, n) for n in names))
    head_name = family.tensors["wte.weight"][1][0]
    head = None
    stored_head = family.tensors["lm_head.weight"][1][0]
    if "lm_head.weight" not in sources and stored_head in by_name:
        head = canonical[stored_head]  # a tied head stored anyway: must equal the embedding
        used.add(stored_head)
        if by_name[stored_head] != by_name[head_name]:
            wrong.append(f"{head} {shown(by_name[stored_head])} (expected the embedding's "
                         f"{by_name[head_name]}: the head is tied)")  # fmt: skip
    unexpected = [canonical[n] for n in by_name if n not in used and not family.is_buffer(n)]
    if missing:
        problems.append(f"missing tensors: {listed(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {listed(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes: {listed(wrong)}")
    return Plan(sources, head), problems


def head_problems(head: np.ndarray, embedding: np.ndarray, head_name: str, embedding_name: str
                  ) -> list[str]:  # fmt: skip
    """[] when a stored head is the tied embedding, else the problem."""
    if np.shape(head) == np.shape(embedding) and np.array_equal(head, embedding):
        return []
    return [f"an untied {head_name} (it differs from {embedding_name}) is not supported while "
            "tie_word_embeddings is true"]  # fmt: skip


# ---------------------------------------------------------------------------- layouts


def source_shapes(how: str, shape: tuple[int, ...], config: GPTConfig) -> list[tuple[int, ...]]:
    """The torch-layout shapes of the file tensors that make a glassllm tensor of ``shape``."""
    H, KV, hd = heads(config)
    if how in (COPY, PER_HEAD_BIAS):
        return [shape]
    if how in (TRANSPOSE, PER_HEAD):
        return [shape[::-1]]
    E = shape[0]
    if how == STACKED:
        return [(H * hd, E), (KV * hd, E), (KV * hd, E)]
    if how == JOINED:
        return [(H * hd,), (KV * hd,), (KV * hd,)]
    raise ValueError(f"unknown layout {how!r}")


def from_hf(how: str, arrays: list[np.ndarray], config: GPTConfig) -> np.ndarray:
    """The glassllm tensor (``(in, out)`` layout, qkv columns ``[q | k | v]``) of the file tensors
    ``arrays`` (torch layout), as a view where no copy is needed."""
    if how == COPY:
        return arrays[0]
    if how == TRANSPOSE:
        return arrays[0].T
    if how == STACKED:
        return np.concatenate(arrays, axis=0).T  # ((H + 2KV) hd, E) -> (E, (H + 2KV) hd)
    if how == JOINED:
        return np.concatenate(arrays)
    H, _, hd = heads(config)
    # GPT-NeoX's rows are [h0: q k v][h1: q k v]...: (H, 3, hd, ...) -> (3, H, hd, ...)
    rest = arrays[0].shape[1:]
    regrouped = arrays[0].reshape(H, 3, hd, *rest).swapaxes(0, 1).reshape(3 * H * hd, *rest)
    return regrouped.T if how == PER_HEAD else regrouped


def to_hf(how: str, array: np.ndarray, config: GPTConfig) -> list[np.ndarray]:
    """`from_hf`'s inverse: the file tensors (torch layout, C-contiguous) of a glassllm tensor."""
    H, KV, hd = heads(config)
    if how == COPY:
        out = [array]
    elif how == TRANSPOSE:
        out = [array.T]
    elif how in (STACKED, JOINED):
        rows = array.T if how == STACKED else array
        out = np.split(rows, [H * hd, (H + KV) * hd])
    else:
        rows = array.T if how == PER_HEAD else array
        rest = rows.shape[1:]
        out = [rows.reshape(3, H, hd, *rest).swapaxes(0, 1).reshape(3 * H * hd, *rest)]
    return [np.ascontiguousarray(a) for a in out]
