"""The Sample tab's chat mode, /api/chat: the conversation through the model's template, the
answer explained token by token and stopped at the end token, as glassllm chat answers."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_chat import chat_gguf  # noqa: E402

from glassllm.app.chat import Chat, ChatConfig  # noqa: E402
from glassllm.app.view import chat_api  # noqa: E402
from glassllm.app.view.fields import ApiError  # noqa: E402
from glassllm.app.view.run import Run  # noqa: E402

HELLO = [{"role": "user", "content": "hello"}]


def error_of(run, body):
    with pytest.raises(ApiError) as caught:
        chat_api.chat(run, body)
    return caught.value.status, caught.value.message


def test_an_answer_to_the_limit(tmp_path):
    path = chat_gguf(tmp_path / "talks.gguf", ends=False)
    run = Run(tmp_path, path)
    answer = chat_api.chat(run, {"messages": HELLO, "top_k": 1, "max_new_tokens": 4})
    assert answer["reply"] == "aaaa" and answer["ended"] is False
    assert [t["repr"] for t in answer["tokens"]] == ["'a'"] * 4
    prompt = "".join(t["text"] for t in answer["prompt"])
    assert prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    for token in answer["tokens"]:
        assert token["top"][0]["id"] == token["id"] and token["p"] == pytest.approx(1.0)
    config = ChatConfig(checkpoint=str(path), top_k=1, max_new_tokens=4)
    assert Chat.open(config).answer("hello", io.StringIO()) == answer["reply"]


def test_the_end_token_ends_the_answer(tmp_path):
    run = Run(tmp_path, chat_gguf(tmp_path / "ends.gguf", ends=True))
    answer = chat_api.chat(run, {"messages": HELLO, "max_new_tokens": 50})
    assert answer == {**answer, "reply": "", "tokens": [], "ended": True}


def test_bad_requests(tmp_path):
    run = Run(tmp_path, chat_gguf(tmp_path / "talks.gguf", ends=False))
    assert error_of(run, {"messages": []})[0] == 400
    assert "exactly role and content" in error_of(run, {"messages": [{"role": "user"}]})[1]
    assert "strings" in error_of(run, {"messages": [{"role": "user", "content": 3}]})[1]
    long = [{"role": "user", "content": "a" * 30_000}]
    assert "longer than" in error_of(run, {"messages": long})[1]
    assert "top_p" in error_of(run, {"messages": HELLO, "top_p": 0})[1]
    refusing = Run(tmp_path, chat_gguf(tmp_path / "r.gguf", True, "{{ raise_exception('no') }}"))
    assert error_of(refusing, {"messages": HELLO}) == (
        400,
        "the chat template refused the conversation: no",
    )


def test_a_model_without_a_template(tmp_path):
    run = Run(tmp_path, chat_gguf(tmp_path / "base.gguf", ends=True, template=None))
    status, message = error_of(run, {"messages": HELLO})
    assert status == 409 and "no chat template" in message


def test_a_run_finetuned_from_an_instruct_model_chats(tmp_path):
    from glassllm.app.config import TrainConfig
    from glassllm.app.train import Trainer

    text = tmp_path / "letters.txt"
    text.write_text("abc de fab " * 200)
    source = chat_gguf(tmp_path / "ends.gguf", ends=True)
    out = tmp_path / "ft"
    config = TrainConfig(init_from=str(source), data=str(text), out_dir=str(out),
                         block_size=16, batch_size=2, max_iters=1, eval_iters=1, lr=1e-6,
                         sample_tokens=0)  # fmt: skip
    Trainer(config).fit(progress=False)
    source.unlink()  # the run's checkpoint holds the template
    answer = chat_api.chat(Run(out), {"messages": HELLO, "max_new_tokens": 50})
    assert answer == {**answer, "reply": "", "tokens": [], "ended": True}
