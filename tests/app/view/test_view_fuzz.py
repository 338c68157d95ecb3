"""A fuzz of ``glassllm view``'s HTTP edges: generated raw requests (methods, targets, versions,
headers of every size and byte, bodies, pipelines, byte soup, truncations, clients that reset)
over real sockets against a real ``python -m glassllm view`` process, from a fixed seed.

Every exchange must end in well-formed HTTP/1.1 answers (JSON errors with the security headers,
view_http.check_answer) or a clean close, within a bounded wait; the server's stderr must hold
no traceback; and the server must answer afterwards. ``fuzz(out_dir, cases, seed)`` is the whole
run; a longer one: ``python tests/app/view/test_view_fuzz.py 5000 7`` (cases, seed).
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from view_helpers import make_run
from view_http import check_answer, exchange, parse_answers

REPO = Path(__file__).resolve().parents[3]
CASES = 600

# Each part of a request is a usual one most of the time (`pick`), else one of the odd ones.
METHODS = ["GET", "POST", "HEAD"]
ODD_METHODS = [
    "PUT", "DELETE", "OPTIONS", "PATCH", "FOO", "PROPFIND", "CONNECT", "TRACE", "get", "G\x00T",
    "GET\xff", "", "P" * 300,
]  # fmt: skip
TARGETS = [
    "/", "/index.html", "/main.js", "/style.css", "/graph_render.js", "/api/info",
    "/api/info?brief=1", "/api/log", "/api/log?since=2", "/api/graph/examples", "/api/generate",
    "/api/distribution", "/api/inspect", "/api/attention", "/api/neuron", "/api/graph",
    "/api/experiment/patch", "/api/experiment/ablate", "/api/experiment/attribute",
    "/api/experiment/patch_cell", "/api/experiment/steer",
    "/api/log?since=%zz", "/api/log?since=%00", "/api/log?since=\u0665", "/api/info?%",
    "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/main.js%00", "//etc/passwd", "*",
    "http://127.0.0.1:{port}/api/info", "http://evil.example/api/info", "http://[::1/",
    "https://127.0.0.1:{port}/", "evil.example:443", "/api/log?" + "a=1&" * 3000, "/\x00",
    "/\xff\xfe", "/api/info#x", "/a b", "",
]  # fmt: skip
ODD_VERSIONS = [
    "HTTP/1.0", "HTTP/2.0", "HTTP/1.x", "HTTP/01.01", "http/1.1", "HTTP/1.1 extra", "HTTP/",
    "HTTP/1.1\x00", "HTTP/99999999999.1", "",
]  # fmt: skip
LENGTHS = [
    "+5", " 5", "5 ", "\u0665", "\u00b2", "-1", "1e3", "0x10", "5, 5", "", "9" * 30,
    "9" * 5000, "0", "00000000000000000000000000000002", "65537", "\x00",
]  # fmt: skip
BODIES = [
    {"prompt": "def ", "max_new_tokens": 2},
    {"prompt": "x", "max_new_tokens": 1, "temperature": 2.0, "top_k": 3, "seed": 5},
    {"ids": [1, 2, 3], "layer": 0, "index": 1},
    {"ids": [1, 2, 3], "layer": 9},
    {"example": "neuron", "inputs": {"x1": 2.0}},
    # the Experiment tab's fields (on the experiment targets; elsewhere extra fields)
    {"clean": "ab", "corrupted": "ba", "answer": "a", "wrong": "b", "method": "attribution"},
    {"clean": "ab", "corrupted": "ba", "answer": "a", "wrong": "b", "layer": 0},
    {"clean": "ab", "corrupted": "ba", "answer": "a", "wrong": "b", "layer": -1, "method": 3},
    {"clean": "ab", "corrupted": "abc", "answer": "", "wrong": "\u0000", "method": "x" * 500},
    {"prompt": "ab", "heads": [[0, 0]], "how": "resample", "reference": "ba"},
    {"prompt": "ab", "heads": [[0, 0]], "how": "resample", "reference": "b" * 5000},
    {"prompt": "ab", "heads": [[0, 1e308]], "neurons": [[True, 0]], "how": "mean"},
    {"prompt": "ab", "layers": [["attn", 0], ["mlp", 0]], "how": "zero", "max_new_tokens": 2},
    {"prompt": "ab", "answer": "a", "wrong": "b", "method": "integrated_gradients", "n_steps": 8},
    {"prompt": "ab", "answer": "a", "wrong": "b", "n_steps": 10**9},
    {"prompt": "a", "positive": "x", "negative": "y", "layer": 0, "strength": float("inf")},
    {"prompt": "\ud800"},
    {"prompt": ["a"]},
    [],
    "text",
    None,
]


def generate_case(rng: random.Random, port: int) -> dict:
    """One exchange: ``data`` to send, ``leave`` (reset instead of reading), ``head``."""
    roll = rng.random()
    if roll < 0.08:  # byte soup
        soup = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000)))
        if rng.random() < 0.5:
            soup = soup.replace(bytes([rng.randrange(256)]), b"\r\n")
        return {"data": soup, "leave": False, "head": False}
    count = 1 if rng.random() < 0.8 else rng.randrange(2, 4)
    requests = [generate_request(rng, port) for _ in range(count)]
    data = b"".join(data for data, _ in requests)
    head = any(method == "HEAD" for _, method in requests)
    if rng.random() < 0.1:  # cut anywhere
        data = data[: rng.randrange(len(data) + 1)]
    return {"data": data, "leave": rng.random() < 0.08, "head": head}


def pick(rng: random.Random, usual: list, odd: list, p_odd: float = 0.15):
    return rng.choice(odd if rng.random() < p_odd else usual)


def generate_request(rng: random.Random, port: int) -> tuple[bytes, str]:
    method = pick(rng, METHODS, ODD_METHODS)
    target = pick(rng, TARGETS[:16], TARGETS[16:], 0.3).replace("{port}", str(port))
    if rng.random() < 0.05:
        target = "/" + "a" * rng.choice([1000, 65_000, 70_000])
    if rng.random() < 0.05:
        target = "/" + "".join(chr(rng.randrange(256)) for _ in range(rng.randrange(1, 40)))
    version = pick(rng, ["HTTP/1.1"], ODD_VERSIONS, 0.1)
    line = " ".join(part for part in (method, target, version) if part or rng.random() < 0.5)
    headers: list[tuple[str, str]] = []
    host = rng.random()
    if host < 0.9:
        headers.append(("Host", f"127.0.0.1:{port}"))
    elif host < 0.95:
        headers.append(("Host", rng.choice(["evil.example", "127.0.0.1:1", "", "\xff"])))
    if host > 0.97:
        headers += [("Host", f"127.0.0.1:{port}")] * 2
    value = rng.choice(BODIES)
    body = json.dumps(value).encode() if rng.random() < 0.7 else random_bytes(rng)
    if rng.random() < 0.05:
        body = b"{" * rng.randrange(1, 100_000)
    if method == "POST" or rng.random() < 0.1:
        if rng.random() < 0.85:
            headers.append(("Content-Type", "application/json"))
        length = rng.random()
        if length < 0.75:
            headers.append(("Content-Length", str(len(body))))
        elif length < 0.9:
            headers.append(("Content-Length", rng.choice(LENGTHS)))
        elif length < 0.95:
            headers += [("Content-Length", str(len(body)))] * 2
        if rng.random() < 0.07:
            headers.append(("Transfer-Encoding", rng.choice(["chunked", "gzip", "x, chunked"])))
    else:
        body = b""
    for _ in range(pick(rng, [0, 1, 3], [10, 120], 0.1)):
        headers.append((random_text(rng, 1, 20), random_text(rng, 0, 60)))
    extras = [
        ("Connection", rng.choice(["close", "keep-alive", "Upgrade", "\x00"])),
        ("Expect", rng.choice(["100-continue", "nothing"])),
        ("Origin", rng.choice([f"http://127.0.0.1:{port}", "http://evil.example", "null"])),
        ("Sec-Fetch-Site", rng.choice(["same-origin", "cross-site"])),
        ("X-Long", "v" * rng.choice([100, 70_000])),
    ]
    headers += [extra for extra in extras if rng.random() < 0.1]
    rng.shuffle(headers)
    eol = pick(rng, ["\r\n"], ["\n", "\n", "\r"], 0.1)
    head = line + eol + "".join(f"{name}: {value}{eol}" for name, value in headers) + eol
    if rng.random() < 0.03:
        head = head.replace(eol, eol + " folded" + eol, 1)
    return head.encode("latin-1", "replace") + body, method


def random_text(rng: random.Random, low: int, high: int) -> str:
    alphabet = "abcXYZ-_09 :\t\x00\x7f\x80\xff\u00e9"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(low, high + 1)))


def random_bytes(rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 10, 1000, 70_000])))


def run_case(port: int, case: dict) -> str:
    """The exchange's outcome: a status line list, ``"closed"``, ``"left"``; raises on a
    malformed answer, a reset, or a wait past the socket's timeout."""
    if case["leave"]:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:
            sock.sendall(case["data"])
        except OSError:
            pass
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        return "left"
    data = exchange(port, case["data"], timeout=60)
    if not data:
        return "closed"
    answers = parse_answers(data, head_only=None if case["head"] else False)
    for answer in answers:
        check_answer(answer, head_only=case["head"])
    return " ".join(str(answer.status) for answer in answers)


class ServedProcess:
    """``python -m glassllm view ARGS`` on a free port, its stderr in a file."""

    def __init__(self, out_dir: Path, *args: str) -> None:
        self.stderr = tempfile.TemporaryFile("w+")
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        command = [sys.executable, "-m", "glassllm", "view", "--no-browser", "--port", "0"]
        self.process = subprocess.Popen(
            [*command, "--out-dir", str(out_dir), *args],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"},
        )
        line = self.process.stdout.readline()
        match = re.search(r"(http://(?:127\.0\.0\.1|\[::1\]):(\d+)/)", line)
        if match is None:
            self.process.kill()
            raise AssertionError(f"no URL in {line!r}")
        self.url, self.port = match.group(1), int(match.group(2))

    def stop(self) -> str:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        finally:
            self.process.kill()
        self.stderr.seek(0)
        return self.stderr.read()


def fuzz(out_dir: Path, cases: int, seed: int = 0, clients: int = 4) -> collections.Counter:
    """Run ``cases`` generated exchanges from ``clients`` threads; the outcomes counted. Raises
    AssertionError naming the first failing cases."""
    served = ServedProcess(out_dir)
    outcomes: collections.Counter = collections.Counter()
    failures: list[str] = []
    rng = random.Random(seed)
    generated = [generate_case(rng, served.port) for _ in range(cases)]
    lock = threading.Lock()
    work = iter(enumerate(generated))

    def client() -> None:
        while True:
            with lock:
                index, case = next(work, (None, None))
            if case is None:
                return
            try:
                outcome = run_case(served.port, case)
            except (AssertionError, OSError, ValueError) as err:
                outcome = "FAILED"
                failures.append(f"case {index} {case['data'][:120]!r}: {str(err)[:300]}")
            with lock:
                outcomes[outcome] += 1

    try:
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after = run_case(
            served.port,
            {
                "data": b"GET /api/info?brief=1 HTTP/1.1\r\nHost: "
                b"127.0.0.1:%d\r\n\r\n" % served.port,
                "leave": False,
                "head": False,
            },
        )
    finally:
        err = served.stop()
    assert failures == [], f"{len(failures)} of {cases} failed:\n" + "\n".join(failures[:10])
    assert after == "200", after
    assert "Traceback" not in err and "Exception" not in err, err[-3000:]
    return outcomes


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("view_fuzz") / "out", steps=4, eval_interval=4)


def test_generated_requests_get_json_answers_or_a_clean_close(out_dir):
    outcomes = fuzz(out_dir, CASES, seed=20)
    assert sum(outcomes.values()) == CASES
    assert outcomes["closed"] < CASES // 4  # most exchanges are answered, not dropped


if __name__ == "__main__":  # python tests/app/view/test_view_fuzz.py CASES SEED
    with tempfile.TemporaryDirectory() as root:
        counts = fuzz(make_run(Path(root) / "out", steps=4, eval_interval=4),
                      int(sys.argv[1]), int(sys.argv[2]))  # fmt: skip
    statuses = collections.Counter()
    for outcome, n in counts.items():
        for status in outcome.split():
            statuses[status] += n
    print(json.dumps({"exchanges": counts.most_common(), "answers": statuses.most_common()}))
