"""Raw HTTP for the viewer's edge tests: requests as bytes over real sockets, answers parsed
strictly (every answer must be a whole HTTP/1.1 message: status line, headers, and exactly
Content-Length bytes of body), so a malformed answer fails the test rather than being guessed at."""

from __future__ import annotations

import json
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from glassllm.app.view import make_server
from glassllm.app.view.server import SECURITY_HEADERS


@dataclass
class Answer:
    status: int
    headers: dict[str, list[str]] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def json(self):
        return json.loads(self.body)


class Malformed(AssertionError):
    """The server's bytes are not a well-formed HTTP/1.1 answer."""


def parse_answers(data: bytes, head_only: bool | None = False) -> list[Answer]:
    """Every answer in ``data`` (a connection's whole output), interim 100s dropped; raises
    `Malformed` for bytes that are not well-formed answers (a truncated one included).
    ``head_only``: answers to HEAD (no bodies); None: either, each answer followed by its next
    or by the end being one without its body (a pipeline mixing HEAD and other requests)."""
    answers = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            raise Malformed(f"an answer without the end of its headers: {data[:200]!r}")
        lines = head.decode("latin-1").split("\r\n")
        version, _, status_rest = lines[0].partition(" ")
        code = status_rest[:3]
        if version != "HTTP/1.1" or not code.isdigit() or status_rest[3:4] not in ("", " "):
            raise Malformed(f"not a status line: {lines[0]!r}")
        answer = Answer(int(code))
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise Malformed(f"not a header line: {line!r}")
            answer.headers.setdefault(name.lower(), []).append(value.strip())
        if answer.status == 100:
            data = rest
            continue
        length = answer.header("Content-Length")
        if length is None or not length.isascii() or not length.isdigit():
            raise Malformed(f"an answer without a Content-Length: {lines}")
        size = 0 if head_only else int(length)
        if head_only is None and (rest == b"" or rest.startswith(b"HTTP/1.1 ")):
            size = 0
        if len(rest) < size:
            raise Malformed(f"a body of {len(rest)} bytes where {size} were announced")
        answer.body, data = rest[:size], rest[size:]
        answers.append(answer)
    return answers


def check_answer(answer: Answer, head_only: bool = False) -> None:
    """What every answer of the viewer carries: the security headers; and every error (and
    every API answer) is JSON, an error as ``{"error": message}``."""
    for name, value in SECURITY_HEADERS.items():
        assert answer.header(name) == value, (name, answer)
    content_type = answer.header("Content-Type") or ""
    if answer.status >= 400:
        assert content_type == "application/json; charset=utf-8", answer
    if content_type.startswith("application/json") and not head_only:
        value = answer.json()
        if answer.status >= 400:
            assert isinstance(value, dict) and isinstance(value.get("error"), str), answer
            assert 0 < len(value["error"]) <= 400, answer


def exchange(port: int, data: bytes, family=socket.AF_INET, host="127.0.0.1", timeout=30.0):
    """Send ``data``, end the sending side, and return all the server sent until it closed."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect((host, port))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused before reading all of it: its answer is still there
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError as err:
            raise AssertionError(f"reset after {sum(map(len, chunks))} bytes") from err
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def answers_to(port: int, data: bytes, head_only: bool = False, **kwargs) -> list[Answer]:
    """The well-formed, checked answers the server gives to ``data``."""
    answers = parse_answers(exchange(port, data, **kwargs), head_only)
    for answer in answers:
        check_answer(answer, head_only)
    return answers


def request_bytes(method: str, path: str, port: int, headers=(), body: bytes | None = None):
    """One HTTP/1.1 request; ``headers`` as (name, value) pairs (bytes or str) after Host."""
    lines = [f"{method} {path} HTTP/1.1".encode("latin-1"), f"Host: 127.0.0.1:{port}".encode()]
    for name, value in headers:
        name = name.encode("latin-1") if isinstance(name, str) else name
        value = value.encode("utf-8") if isinstance(value, str) else value
        lines.append(name + b": " + value)
    named = {(n.encode() if isinstance(n, str) else n).lower() for n, _ in headers}
    if body is not None and b"content-length" not in named:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def json_post(path: str, port: int, value, extra=()) -> bytes:
    body = json.dumps(value).encode()
    return request_bytes("POST", path, port, [("Content-Type", "application/json"), *extra], body)


@contextmanager
def live_server(out_dir, host="127.0.0.1"):
    """A viewer of ``out_dir`` serving on an ephemeral port in a thread of this process."""
    server = make_server(out_dir, host=host, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
