"""The one boundary around the tokenizers library (glassllm.data.bpe): a tokenizer that panics
at encode time (a real one: a pre-tokenizer regex past Oniguruma's retry limit), text that is not
UTF-8, ids the library cannot take, and tokenizer files that are FIFOs: every failure is a
TokenizerError (a ValueError) in one line, and a good tokenizer works as the library's own."""

import json
import os
import threading
from pathlib import Path

import pytest
from conftest import optional

optional("tokenizers")

from glassllm.data.bpe import BPETokenizer, TokenizerError  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf_gpt2_tiny"
CATASTROPHIC = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated",
                "invert": False}  # fmt: skip
TEXTS = ["hello world", " the  quick\n\tbrown fox ", "café 日本 🙂", "<|endoftext|>x", "", "a" * 99]


def hostile():
    spec = json.loads((FIXTURE / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = CATASTROPHIC
    return BPETokenizer.from_json(json.dumps(spec))


def test_a_panic_at_encode_time_is_one_tokenizer_error():
    tokenizer = hostile()
    assert tokenizer.encode("hello")  # valid: it passes every check
    with pytest.raises(TokenizerError) as info:
        tokenizer.encode("a" * 5000 + "b")
    message = str(info.value)
    assert message.startswith("the tokenizer failed to encode the text (panic: ")
    assert "retry-limit" in message and "\n" not in message
    with pytest.raises(TokenizerError):
        tokenizer.encode_array("a" * 5000 + "b")
    assert tokenizer.encode("hello") == BPETokenizer.from_file(FIXTURE / "tokenizer.json").encode(
        "hello"
    )  # and the library is still usable afterwards


@pytest.mark.parametrize("text", ["\ud800", "ok\udcff", 12, None, b"bytes"])
def test_text_that_is_not_a_str_of_characters_is_refused_before_the_library(text):
    tokenizer = BPETokenizer.from_file(FIXTURE / "tokenizer.json")
    with pytest.raises(TokenizerError, match="the text"):
        tokenizer.encode(text)


@pytest.mark.parametrize("ids", [[10**12], [-1], [2**64]])
def test_ids_the_library_cannot_take_are_a_tokenizer_error(ids):
    tokenizer = BPETokenizer.from_file(FIXTURE / "tokenizer.json")
    with pytest.raises(TokenizerError, match="decode"):
        tokenizer.decode(ids)
    with pytest.raises(TokenizerError, match="look up"):
        tokenizer.token_repr(ids[0])


def test_vocab_and_merges_read_by_glassllm_give_the_librarys_tokenizer():
    """from_vocab_merges reads the files itself (regular, bounded); the result must be the one
    the library's own BPE.from_file builds."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, processors

    ours = BPETokenizer.from_vocab_merges(FIXTURE / "vocab.json", FIXTURE / "merges.txt")
    theirs = tokenizers.Tokenizer(
        models.BPE.from_file(str(FIXTURE / "vocab.json"), str(FIXTURE / "merges.txt"))
    )
    theirs.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    theirs.decoder = decoders.ByteLevel()
    theirs.post_processor = processors.ByteLevel(trim_offsets=False)
    theirs.add_special_tokens(["<|endoftext|>"])
    assert json.loads(ours.to_json()) == json.loads(theirs.to_str())
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(
    ("merges", "fragment"),
    [("#version: 0.2\nĠ t\nnot-a-pair\n", "line 3 is not a pair"), ("a b c\n", "line 1")],
)
def test_a_malformed_merges_file_names_its_line(tmp_path, merges, fragment):
    (tmp_path / "merges.txt").write_text(merges)
    with pytest.raises(TokenizerError, match=fragment):
        BPETokenizer.from_vocab_merges(FIXTURE / "vocab.json", tmp_path / "merges.txt")


@pytest.mark.parametrize("vocab", ['{"a": -1}', '{"a": "0"}', "[1]", '{"a": NaN}', "{"])
def test_a_malformed_vocab_is_a_tokenizer_error(tmp_path, vocab):
    (tmp_path / "vocab.json").write_text(vocab)
    with pytest.raises(TokenizerError, match="cannot read"):
        BPETokenizer.from_vocab_merges(tmp_path / "vocab.json", FIXTURE / "merges.txt")


@pytest.mark.parametrize("which", ["tokenizer.json", "vocab.json", "merges.txt"])
def test_tokenizer_files_that_are_fifos_are_refused_not_waited_on(tmp_path, which):
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        if name == which:
            os.mkfifo(tmp_path / name)
        else:
            (tmp_path / name).write_bytes((FIXTURE / name).read_bytes())
    errors = []

    def read():
        try:
            if which == "tokenizer.json":
                BPETokenizer.from_file(tmp_path / which)
            else:
                BPETokenizer.from_vocab_merges(tmp_path / "vocab.json", tmp_path / "merges.txt")
        except TokenizerError as err:
            errors.append(str(err))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "blocked on a FIFO"
    assert errors and "FIFO" in errors[0], errors
