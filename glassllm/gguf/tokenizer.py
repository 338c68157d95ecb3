"""The tokenizer a GGUF file describes in its metadata, as a glassllm `BPETokenizer`.

A GGUF has no ``tokenizer.json``: llama.cpp stores the vocabulary (``tokenizer.ggml.tokens``), the
merges (``tokenizer.ggml.merges``, ``"Ġ t"``), each token's type (``tokenizer.ggml.token_type``:
1 normal, 3 control, 4 user-defined), the special ids and the name of the pre-tokenizer
(``tokenizer.ggml.pre``). Byte-level BPE (``tokenizer.ggml.model = gpt2``) is built here with the
``tokenizers`` library the way transformers' GGUF loader builds it (control tokens special,
user-defined ones added whole, tokens outside the byte alphabet respelled as bytes), with the
pre-tokenizer llama.cpp names: ``smollm`` splits digits one by one before GPT-2's pattern, as
SmolLM2's own ``tokenizer.json`` does (transformers 5.24 leaves that split out: the two differ on a
run of spaces before a digit, ``"x  1"``). Sentencepiece files (``tokenizer.ggml.model = llama``)
and other pre-tokenizers are refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from glassllm._text import listed, shown
from glassllm.data.bpe import BPETokenizer, byte_level_alphabet, import_tokenizers
from glassllm.gguf.header import GGUFFormatError

CONTROL, USER_DEFINED = 3, 4

_GPT2_PATTERN = None  # ByteLevel's own regex
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (split digits one by one first, the regex or None for GPT-2's, whether a
# word that is a whole token skips the merges: llama.cpp's ignore_merges, set for Llama-3)
PRE_TOKENIZERS: dict[str, tuple[bool, str | None, bool]] = {
    "default": (False, _GPT2_PATTERN, False),
    "gpt2": (False, _GPT2_PATTERN, False),
    "smollm": (True, _GPT2_PATTERN, False),
    "llama3": (False, _LLAMA3_SPLIT, True),
    "llama-v3": (False, _LLAMA3_SPLIT, True),
    "llama-bpe": (False, _LLAMA3_SPLIT, True),
    "qwen2": (False, _QWEN2_SPLIT, False),
}
SPECIAL_NAMES = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def special_tokens(meta: Mapping[str, Any]) -> dict[str, str]:
    """``{"bos_token": "<|im_start|>", "eos_token": ...}``: the named special tokens the file
    gives (what transformers passes a chat template); ids outside the vocabulary are left out."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return {}
    found = {}
    for name, key in SPECIAL_NAMES.items():
        index = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(tokens):
            found[name] = tokens[index]
    return found


def tokenizer_from_metadata(meta: Mapping[str, Any], subject: str) -> BPETokenizer:
    """The file's tokenizer; GGUFFormatError (naming ``subject``) when it describes none that
    glassllm builds."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        what = f"tokenizer.ggml.model {shown(model)}" if model else "no tokenizer.ggml.model"
        raise GGUFFormatError(subject, [f"{what}; glassllm builds byte-level BPE ('gpt2') only"])
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFFormatError(
            subject,
            [
                f"tokenizer.ggml.pre {shown(pre)} is not one glassllm knows "
                f"({listed(PRE_TOKENIZERS)})"
            ],
        )
    tokens, merges, types = _lists(meta, subject)
    tokenizers = import_tokenizers()
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

    alphabet = byte_level_alphabet()
    bytes_of = {b: ch for ch, b in alphabet.items()}
    spelled = [
        t if set(t) <= alphabet.keys() else "".join(bytes_of[b] for b in t.encode("utf-8"))
        for t in tokens
    ]
    vocab = {token: index for index, token in enumerate(spelled)}
    if len(vocab) < len(spelled):
        raise GGUFFormatError(subject, ["tokenizer.ggml.tokens lists a token twice"])
    digits, split, ignore_merges = PRE_TOKENIZERS[pre]
    try:
        bpe = models.BPE(
            vocab=vocab,
            merges=merges,
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=ignore_merges,
        )
    except Exception as err:  # the library raises its own Exception for merges outside vocab
        raise GGUFFormatError(subject, [f"unusable tokenizer.ggml.merges ({err})"]) from None
    tokenizer = tokenizers.Tokenizer(bpe)
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tokenizer.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    # a control token spelled outside the byte alphabet is a llama.cpp mislabel (transformers
    # skips it too): adding it would give the text a token the model never saw as one
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, types, strict=False)
        if kind == CONTROL and set(t) <= alphabet.keys()
    ]
    user = [
        AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == USER_DEFINED and t in vocab
    ]
    tokenizer.add_special_tokens(control)
    tokenizer.add_tokens(user)
    return BPETokenizer(tokenizer)


def _lists(
    meta: Mapping[str, Any], subject: str
) -> tuple[list[str], list[tuple[str, str]], list[int]]:
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type", [])
    problems = []
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        problems.append("tokenizer.ggml.tokens must be a non-empty array of strings")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        problems.append("tokenizer.ggml.merges must be an array of strings")
    if not isinstance(types, list) or not all(isinstance(t, int) for t in types):
        problems.append("tokenizer.ggml.token_type must be an array of integers")
    elif isinstance(tokens, list) and types and len(types) != len(tokens):
        problems.append(
            f"tokenizer.ggml.token_type has {len(types):,} entries for {len(tokens):,} tokens"
        )
    if problems:
        raise GGUFFormatError(subject, problems)
    pairs = [tuple(m.split(" ")) for m in merges]
    bad = [m for m, p in zip(merges, pairs, strict=True) if len(p) != 2 or not all(p)]
    if bad:
        raise GGUFFormatError(
            subject,
            [f"tokenizer.ggml.merges entries that are not two tokens: {listed(map(shown, bad))}"],
        )
    return tokens, pairs, types  # type: ignore[return-value]
