"""The viewer over hostile files (issue 20, classes 1 to 3): a tokenizer that panics at encode
time, a prompt that is not text, FIFOs and garbage lines in the run's logs. Every answer is JSON
(400 with a message, or 200 with what was skipped), within a bounded time; never a 500, a
dropped connection or a request that waits forever."""

import http.client
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from conftest import optional
from view_helpers import make_run

from glassllm.app.view import api, make_server
from glassllm.app.view.fields import ApiError
from glassllm.app.view.run import Run
from glassllm.app.view.server import encode_json

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "hf_gpt2_tiny"
CATASTROPHIC = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated",
                "invert": False}  # fmt: skip
PANIC_PROMPT = "a" * 5000 + "b"
GARBAGE = [
    b'{"iter": 4, "train_loss": 1.0, "val',  # cut by a kill
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError in Python's json
    b'{"iter": 5, "train_loss": NaN, "val_loss": 1.0}',  # not JSON: NaN
    b'{"iter": 5, "train_loss": "\xff\xfe"}',  # not UTF-8
    b'{"iter": "5"}',
    b"x" * (10 << 20),  # a 10 MB line
    b'{"iter": 10, "train_loss": 1e999}',  # overflows a float
]
BOUND_S = 60


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("hostile") / "out", steps=4, eval_interval=2)


@pytest.fixture
def copy(out_dir, tmp_path):
    target = tmp_path / "out"
    shutil.copytree(out_dir, target)
    return target


def within_bound(fn, *args):
    """``fn(*args)`` on a thread; a call still running after BOUND_S fails the test."""
    result = {}

    def call():
        try:
            result["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - handed to the test below
            result["error"] = err

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"{fn.__name__} still waiting after {BOUND_S} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


def served(run_dir, **kwargs):
    server = make_server(run_dir, port=0, **kwargs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def request(server, method, path, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=BOUND_S)
    headers = {"Host": f"127.0.0.1:{server.port}"}
    if raw is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=raw, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data)


def error_of(fn, *args):
    with pytest.raises(ApiError) as info:
        fn(*args)
    return info.value.status, info.value.message


# ------------------------------------------------------------------------ 1. the tokenizer


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory):
    optional("tokenizers")  # a BPE tokenizer
    path = tmp_path_factory.mktemp("gpt2") / "gpt2"
    shutil.copytree(FIXTURE, path)
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = CATASTROPHIC
    (path / "tokenizer.json").write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("endpoint", [api.generate, api.distribution, api.inspect])
def test_a_tokenizer_panic_is_a_400_from_every_endpoint_that_encodes(endpoint, hostile_model):
    run = Run(hostile_model, checkpoint=hostile_model)
    status, message = error_of(endpoint, run, {"prompt": PANIC_PROMPT, "max_new_tokens": 1})
    assert status == 400 and "cannot be encoded" in message and "panic" in message, message
    assert endpoint(run, {"prompt": "hello", "max_new_tokens": 1})  # the next request is served


def test_a_tokenizer_panic_over_http_is_a_json_400_and_the_server_goes_on(hostile_model):
    server = served(hostile_model, checkpoint=hostile_model)
    try:
        body = json.dumps({"prompt": PANIC_PROMPT, "max_new_tokens": 1}).encode()
        status, answer = request(server, "POST", "/api/generate", body)
        assert status == 400 and "panic" in answer["error"], answer
        status, answer = request(server, "POST", "/api/generate", b'{"prompt": "hi"}')
        assert status == 200 and answer["tokens"]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("prompt", ["\ud800", "caf\udce9", "ok \udfff then"])
@pytest.mark.parametrize("which", ["bpe", "char"])
def test_a_prompt_with_a_lone_surrogate_is_a_400(prompt, which, out_dir):
    if which == "bpe":
        optional("tokenizers")
    run = Run(FIXTURE, checkpoint=FIXTURE) if which == "bpe" else Run(out_dir)
    for endpoint in (api.generate, api.inspect):
        status, message = error_of(endpoint, run, {"prompt": prompt, "max_new_tokens": 1})
        assert status == 400 and "cannot be encoded" in message, message


def test_a_lone_surrogate_in_the_json_body_over_http_is_a_json_400():
    optional("tokenizers")  # a BPE tokenizer
    server = served(FIXTURE, checkpoint=FIXTURE)
    try:
        status, answer = request(server, "POST", "/api/generate", b'{"prompt": "\\udcff"}')
        assert status == 400 and "not valid UTF-8" in answer["error"], answer
        status, answer = request(server, "POST", "/api/generate", b'{"prompt": "\xff"}')
        assert status == 400, answer  # bytes that are not UTF-8: the body is not JSON
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------ 2. FIFOs


@pytest.mark.parametrize("name", ["log.jsonl", "stats.jsonl"])
def test_a_fifo_as_a_log_answers_at_once_and_says_so(name, copy):
    (copy / name).unlink()
    os.mkfifo(copy / name)
    run = Run(copy)
    answer = within_bound(api.log, run, {})
    key = "log" if name == "log.jsonl" else "stats"
    assert "FIFO" in answer["skipped"][key]["error"], answer["skipped"]
    other = "stats" if key == "log" else "evals"
    assert answer[other], "the other file is still read"
    server = served(copy)
    try:
        status, answer = within_bound(request, server, "GET", "/api/log")
        assert status == 200 and "FIFO" in answer["skipped"][key]["error"]
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------ 3. garbage lines


def test_garbage_lines_in_both_logs_are_skipped_and_counted(copy):
    evals_before = len(Run(copy).read_log(-1)["evals"])
    for name in ("log.jsonl", "stats.jsonl"):
        with open(copy / name, "ab") as file:
            file.write(b"\n".join(GARBAGE) + b"\n")
    run = Run(copy)
    answer = within_bound(api.log, run, {})
    assert len(answer["evals"]) == evals_before and answer["stats"]
    assert answer["skipped"]["log"]["count"] == len(GARBAGE)
    assert answer["skipped"]["stats"]["count"] == len(GARBAGE)
    assert json.loads(encode_json(answer))  # strict JSON, no NaN anywhere
    server = served(copy)
    try:
        status, answer = request(server, "GET", "/api/log?since=1")
        assert status == 200 and answer["skipped"]["log"]["count"] == len(GARBAGE)
    finally:
        server.shutdown()
        server.server_close()


def test_a_last_line_being_written_is_not_counted_but_a_cut_middle_one_is(copy):
    with open(copy / "log.jsonl", "ab") as file:
        file.write(b'{"iter": 9, "train_lo')  # a run writing right now
    answer = Run(copy).read_log(-1)
    assert "skipped" not in answer
    with open(copy / "log.jsonl", "ab") as file:
        file.write(b'\n{"iter": 10, "train_loss": 1.0, "val_loss": 1.0}\n')
    answer = Run(copy).read_log(-1)
    assert answer["evals"][-1]["iter"] == 10 and answer["skipped"]["log"]["count"] == 1
