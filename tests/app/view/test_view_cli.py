"""``glassllm view`` as a user runs it: a real process, its printed URL, its startup errors, Ctrl-C.

Each process is ``python -m glassllm view ...`` (what the console script runs) on ``--port 0``.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import optional
from view_helpers import make_run

import glassllm
import glassllm.nn as nn

REPO = Path(__file__).resolve().parents[3]
HF_TINY = REPO / "tests" / "fixtures" / "hf_gpt2_tiny"


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("view_cli") / "out", steps=8, eval_interval=4)


def _env():
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}


def view(*args, timeout=60):
    """``glassllm view ARGS --no-browser`` run to its end: (status, stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "glassllm", "view", "--no-browser", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )
    return done.returncode, done.stdout, done.stderr


def one_line_error(status, err, fragment):
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("glassllm: error: ") and fragment in err, err


class Served:
    """``glassllm view ARGS --port 0 --no-browser`` running; ``port`` read from its first line."""

    def __init__(self, *args):
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "glassllm",
                "view",
                "--no-browser",
                "--port",
                "0",
                *map(str, args),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        self.first_line = self.process.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", self.first_line)
        if match is None:
            self.process.kill()
            raise AssertionError(f"no URL in {self.first_line!r}: {self.process.stderr.read()}")
        self.port = int(match.group(1))

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        answer = response.status, json.loads(response.read())
        conn.close()
        return answer

    def stop(self):
        """Ctrl-C; returns (status, stdout, stderr)."""
        self.process.send_signal(signal.SIGINT)
        try:
            out, err = self.process.communicate(timeout=20)
        finally:
            self.process.kill()
        return self.process.returncode, out, err


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_view_prints_its_url_serves_and_stops_on_ctrl_c(out_dir, host):
    served = Served("--out-dir", out_dir, "--host", host)
    try:
        assert "ckpt.safetensors" in served.first_line and "Ctrl-C" in served.first_line
        status, info = served.request("GET", "/api/info")
        assert status == 200 and info["checkpoint"]["iteration"] == 8
        status, answer = served.request(
            "POST", "/api/generate", {"prompt": "def ", "max_new_tokens": 3}
        )
        assert status == 200 and len(answer["tokens"]) == 3
    finally:
        code, out, err = served.stop()
    assert code in (0, 130), err
    assert "stopped" in out and "Traceback" not in err
    warned = "warning: listening on 0.0.0.0: anyone who can reach this machine" in err
    assert warned == (host == "0.0.0.0")


def test_a_log_without_checkpoint_serves_the_dashboard_only(out_dir, tmp_path):
    (tmp_path / "log.jsonl").write_text((out_dir / "log.jsonl").read_text())
    served = Served("--out-dir", tmp_path)
    try:
        assert "dashboard only" in served.first_line
        assert served.request("GET", "/api/info")[1]["checkpoint"] is None
        status, log = served.request("GET", "/api/log")
        assert status == 200 and [e["iter"] for e in log["evals"]] == [0, 4, 8]
    finally:
        code, _, err = served.stop()
    assert code in (0, 130) and "Traceback" not in err


def test_startup_errors_are_one_line_and_status_2(out_dir, tmp_path):
    status, _, err = view("--out-dir", tmp_path, "--port", 0)
    assert status == 2 and err.strip().splitlines() == [
        f"glassllm: error: no checkpoint or log in {str(tmp_path)!r} (train first: glassllm train)"
    ]
    bogus = tmp_path / "ckpt.safetensors"
    bogus.write_bytes(b"not a checkpoint at all")
    one_line_error(*view("--out-dir", tmp_path, "--port", 0)[::2], "safetensors")
    glassllm.save(bogus, nn.Linear(2, 3, rng=np.random.default_rng(0)))  # a model, not a GPT run
    one_line_error(
        *view("--checkpoint", bogus, "--port", 0)[::2], "is not a glassllm GPT checkpoint"
    )
    one_line_error(*view("--checkpoint", tmp_path / "nothing.safetensors")[::2], "not found")
    one_line_error(
        *view("--out-dir", out_dir, "--port", 70000)[::2], "port must be in [0, 65535], got 70000"
    )
    one_line_error(*view("--out-dir", out_dir, "--port", "x")[::2], "invalid int value")


def test_a_damaged_checkpoint_is_refused_before_anything_is_used(out_dir, tmp_path):
    data = bytearray((out_dir / "ckpt.safetensors").read_bytes())
    data[-5] ^= 0x40  # a flipped bit in the last tensor
    (tmp_path / "ckpt.safetensors").write_bytes(bytes(data))
    one_line_error(*view("--out-dir", tmp_path, "--port", 0)[::2], "is corrupted")


def test_port_in_use_suggests_port_0(out_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line_error(
            *view("--out-dir", out_dir, "--port", port)[::2],
            f"port {port} is in use; pass --port 0 for any free port",
        )


def test_a_hugging_face_directory(tmp_path):
    optional("tokenizers")
    served = Served("--out-dir", tmp_path, "--checkpoint", HF_TINY)
    try:
        status, info = served.request("GET", "/api/info")
        assert status == 200
        assert info["checkpoint"]["tokenizer"] == "bpe"
        assert info["checkpoint"]["model_config"]["n_layer"] >= 1
        status, answer = served.request(
            "POST", "/api/generate", {"prompt": "Hello", "max_new_tokens": 4, "seed": 3}
        )
        assert status == 200 and len(answer["tokens"]) == 4
        status, seen = served.request("POST", "/api/inspect", {"prompt": "Hello world"})
        assert status == 200 and seen["logits_diff"] < 1e-4
    finally:
        code, _, err = served.stop()
    assert code in (0, 130) and "Traceback" not in err
