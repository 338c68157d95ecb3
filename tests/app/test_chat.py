"""glassllm chat as a user drives it, on tiny GGUF files built to answer predictably: one answer
line per input line (a pipe), the end token stops an answer, --max-new-tokens bounds it, Ctrl-C
stops the answer and not the chat, and every bad input is one line with exit status 2."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import optional
from conftest import run_cli as run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gguf"))
from gguf_files import ARRAY, I32, Typed, f32_tensor, tiny_llama, write_gguf  # noqa: E402

TOKENS = ["<|im_end|>", "<|im_start|>", *"abcdefghijklmnopqrstuvwxyz", "Ġ", "Ċ", "!"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EMBED = 8


def chat_gguf(path: Path, ends: bool, template: str | None = TEMPLATE, **extra) -> Path:
    """A one-layer Llama whose blocks add nothing, so the last hidden state is the embedding's
    direction: every token's column 0 is large, and the head scores the end token (id 0) high
    (``ends``: every answer is empty) or lowest, 'a' highest (every answer runs to the limit)."""
    optional("gguf")
    optional("tokenizers")
    optional("jinja2")
    meta, tensors = tiny_llama(np.random.default_rng(0), embed=EMBED, heads=2, kv_heads=2)
    meta.update(
        {
            "llama.vocab_size": len(TOKENS),
            "tokenizer.ggml.tokens": TOKENS,
            "tokenizer.ggml.token_type": Typed(ARRAY, [3, 3] + [1] * (len(TOKENS) - 2), I32),
            "tokenizer.ggml.merges": [],
            "tokenizer.ggml.eos_token_id": 0,
            "tokenizer.ggml.bos_token_id": 1,
            **extra,
        }
    )
    if template is not None:
        meta["tokenizer.chat_template"] = template
    embedding = np.full((len(TOKENS), EMBED), 0.01, np.float32)
    embedding[:, 0] = 10.0
    head = np.zeros((len(TOKENS), EMBED), np.float32)
    head[0, 0] = 10.0 if ends else -10.0
    head[2, 0] = 5.0  # 'a'
    keep = []
    for tensor in tensors:
        if tensor.name in ("blk.0.attn_output.weight", "blk.0.ffn_down.weight"):
            values = np.zeros(tuple(reversed(tensor.dims)), np.float32)  # the block adds nothing
            tensor = f32_tensor(tensor.name, values)
        if tensor.name == "token_embd.weight":
            tensor = f32_tensor(tensor.name, embedding)
        keep.append(tensor)
    keep.append(f32_tensor("output.weight", head))
    return write_gguf(path, meta, keep)


def chat(argv, capsys, monkeypatch, stdin: str):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    return run(["chat", *map(str, argv)], capsys)


def assert_one_line_error(status, err, *fragments):
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glassllm: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_one_answer_per_line_and_the_end_token_stops_it(tmp_path, capsys, monkeypatch):
    path = chat_gguf(tmp_path / "ends.gguf", ends=True)
    status, out, err = chat(["--checkpoint", path], capsys, monkeypatch, "hi\n\nhow are you\n")
    assert status == 0, err
    assert out == "\n\n"  # two messages (the empty line is skipped), two empty answers


def test_max_new_tokens_bounds_an_answer(tmp_path, capsys, monkeypatch):
    path = chat_gguf(tmp_path / "talks.gguf", ends=False)
    argv = ["--checkpoint", path, "--top-k", "1", "--max-new-tokens", "5"]
    status, out, err = chat(argv, capsys, monkeypatch, "hi\nagain\n")
    assert status == 0, err
    assert out == "aaaaa\naaaaa\n"


def test_the_conversation_is_the_templates_rendering(tmp_path):
    from glassllm.app.chat import Chat, ChatConfig

    path = chat_gguf(tmp_path / "talks.gguf", ends=False)
    config = ChatConfig(checkpoint=str(path), system="be brief", top_k=1, max_new_tokens=3)
    session = Chat.open(config)
    session.answer("hi", io.StringIO())
    text = session.opened.tokenizer.decode(session.prompt_ids())
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\naaa<|im_end|>\n<|im_start|>assistant\n"
    )


def test_ctrl_c_stops_the_answer_not_the_chat(tmp_path, capsys, monkeypatch):
    from glassllm.app import chat as chat_app

    path = chat_gguf(tmp_path / "talks.gguf", ends=False)
    real = chat_app.generation.stream
    answers = []

    def interrupted(*args, **kwargs):
        answers.append(1)
        for step, item in enumerate(real(*args, **kwargs)):
            if len(answers) == 1 and step == 2:
                raise KeyboardInterrupt  # what Ctrl-C raises in the main thread
            yield item

    monkeypatch.setattr(chat_app.generation, "stream", interrupted)
    argv = ["--checkpoint", path, "--top-k", "1", "--max-new-tokens", "4"]
    status, out, err = chat(argv, capsys, monkeypatch, "one\ntwo\n")
    assert status == 0, err
    assert out == "aa [stopped]\naaaa\n"


@pytest.mark.parametrize(
    "argv, fragments",
    [
        ([], ["chat needs --checkpoint"]),
        (["--checkpoint", "missing.gguf"], ["missing.gguf", "unreadable"]),
        (["--top-p", "0"], ["--top-p must be in (0, 1]"]),
        (["--min-p", "1"], ["--min-p must be in [0, 1)"]),
        (["--max-new-tokens", "0"], ["--max-new-tokens must be in [1"]),
        (["--temperature", "0"], ["--temperature"]),
    ],
)
def test_bad_options(tmp_path, capsys, monkeypatch, argv, fragments):
    if argv and argv[0] != "--checkpoint":
        argv = ["--checkpoint", chat_gguf(tmp_path / "m.gguf", ends=True), *argv]
    status, _, err = chat(argv, capsys, monkeypatch, "hi\n")
    assert_one_line_error(status, err, *fragments)


def test_a_model_without_a_template(tmp_path, capsys, monkeypatch):
    path = chat_gguf(tmp_path / "base.gguf", ends=True, template=None)
    status, _, err = chat(["--checkpoint", path], capsys, monkeypatch, "hi\n")
    assert_one_line_error(status, err, "has no chat template")


@pytest.mark.parametrize(
    "template, fragments",
    [
        ("{{ raise_exception('roles must alternate') }}", ["roles must alternate"]),
        ("{{ messages.__class__.__mro__ }}", ["sandbox"]),
        (
            "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
            ["steps"],
        ),
        ("{{ 'x' * 100000000 }}", ["characters"]),
        ("{% if %}", ["not valid Jinja"]),
    ],
)
def test_a_hostile_or_refusing_template(tmp_path, capsys, monkeypatch, template, fragments):
    path = chat_gguf(tmp_path / "bad.gguf", ends=True, template=template)
    status, out, err = chat(["--checkpoint", path], capsys, monkeypatch, "hi\n")
    assert_one_line_error(status, err, "chat template", *fragments)
    assert out == ""


def test_python_dash_m_chat_through_a_pipe(tmp_path, run_python):
    path = chat_gguf(tmp_path / "talks.gguf", ends=False)
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "glassllm", "chat", "--checkpoint", str(path), "--top-k", "1",
         "--max-new-tokens", "3"],
        input="hello\nbye\n",
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "aaa\naaa\n" and "Traceback" not in done.stderr


def test_keep_quantized_reaches_the_loader(tmp_path, capsys, monkeypatch):
    import glassllm.hf

    path = chat_gguf(tmp_path / "talks.gguf", ends=False)
    asked, load = [], glassllm.hf.load_gguf

    def recording(*args, keep_quantized=False, **kwargs):
        asked.append(keep_quantized)
        return load(*args, **kwargs)  # this file's F32 tensors have no blocks to keep

    monkeypatch.setattr(glassllm.hf, "load_gguf", recording)
    argv = ["--checkpoint", path, "--top-k", "1", "--max-new-tokens", "2", "--keep-quantized"]
    status, out, err = chat(argv, capsys, monkeypatch, "hi\n")
    assert status == 0, err
    assert asked == [True] and out == "aa\n"
