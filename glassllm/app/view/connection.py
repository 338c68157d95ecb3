"""The viewer's HTTP edges: how many connections are served (`ConnectionServer`), how long a
client may take, how a request's body is framed, what every answer's headers are, and how a
connection ends. The viewer's own rules (hosts, origins, routes) are in server.py.

The rules (each tested over real sockets in tests/app/view/test_view_http.py):

* every read waits at most ``idle`` seconds, and a request, once its first byte is in, must be
  whole (line, headers and body) within ``budget`` seconds: a dead client or a slowloris loses
  its connection, and holds nothing else meanwhile (the body is read before the model lock);
* a body is framed by exactly one ``Content-Length`` of ASCII digits (RFC 9112 section 6.3);
  ``Transfer-Encoding`` is refused (411 for chunked, 501 otherwise), and with it any ambiguity
  of where a request ends (request smuggling);
* at most ``max_connections`` connections at a time, each on its thread; one more is answered
  503 at once; the listen backlog holds a burst of new connections (1024, not the stdlib's 5);
* a refused connection is closed gracefully: the answer, then a bounded drain of what the client
  still sends, so that the client reads the answer instead of a reset.
"""

from __future__ import annotations

import io
import re
import socket
import sys
import threading
import time
from email.message import Message
from http.server import ThreadingHTTPServer
from typing import Any

from glassllm._text import shown

from .fields import ApiError

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
JSON_TYPE = "application/json; charset=utf-8"

IDLE_SECONDS = 30.0  # one read or write of a connection: a browser's idle keep-alive included
REQUEST_SECONDS = 30.0  # a whole request, from its first byte to the end of its body
LINGER_SECONDS = 2.0  # draining a refused client's unread bytes before closing
LINGER_BYTES = 1 << 20
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() takes "\u0665" and "\u00b2"


def answer_headers(
    content_type: str, length: int, *, cache: bool = False, close: bool = False
) -> list[tuple[str, str]]:
    """The headers of every answer, the standard library's own refusals and 503s included."""
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(length)),
        ("Cache-Control", "no-cache" if cache else "no-store"),
        *SECURITY_HEADERS.items(),
    ]
    if close:  # so a client does not send its next request into a closed connection
        headers.append(("Connection", "close"))
    return headers


def busy_answer() -> bytes:
    """A whole ``503`` answer, for a connection beyond the server's limit."""
    body = b'{"error":"too many connections; retry"}'
    headers = [*answer_headers(JSON_TYPE, len(body), close=True), ("Retry-After", "1")]
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return f"HTTP/1.1 503 Service Unavailable\r\n{head}\r\n".encode("latin-1") + body


def body_length(headers: Message, limit: int) -> int:
    """The length of a request's body from its headers (0: none), or `ApiError` 400 (not one
    Content-Length of ASCII digits), 411 (chunked), 501 (another transfer coding), 413 (over
    ``limit`` bytes). Every refusal must close the connection: the body's end is unknown."""
    codings = headers.get_all("Transfer-Encoding")
    if codings:
        if ",".join(codings).rsplit(",", 1)[-1].strip().lower() == "chunked":
            raise ApiError(411, "chunked bodies are not supported; send a Content-Length")
        raise ApiError(501, f"Transfer-Encoding {shown(', '.join(codings))} is not implemented")
    lengths = headers.get_all("Content-Length") or []
    if not lengths:
        return 0
    if len(lengths) > 1:
        raise ApiError(400, "more than one Content-Length header")
    text = lengths[0]
    if not _DIGITS.fullmatch(text):
        raise ApiError(400, f"Content-Length must be a number of bytes (digits), not {shown(text)}")
    significant = text.lstrip("0")
    if len(significant) > len(str(limit)) or int(significant or "0") > limit:
        raise ApiError(413, f"the body is larger than {limit // 1024} KiB")
    return int(significant or "0")


class DeadlineReader(io.RawIOBase):
    """A connection's input (buffered by the handler): each read waits at most ``idle``
    seconds, and from the first byte of a request (`start_request`) until `end_request` the
    request as a whole gets ``budget`` seconds. Either raises `TimeoutError`."""

    def __init__(self, sock: socket.socket, idle: float, budget: float) -> None:
        super().__init__()
        self._sock = sock
        self.idle = idle
        self.budget = budget
        self._deadline: float | None = None
        self._armed = False

    def readable(self) -> bool:
        return True

    def start_request(self) -> None:
        self._deadline, self._armed = None, True

    def end_request(self) -> None:
        self._deadline, self._armed = None, False

    def readinto(self, buffer) -> int:  # type: ignore[override]
        timeout = self.idle
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the request took longer than {self.budget:g} s")
            timeout = min(timeout, left)
        self._sock.settimeout(timeout)
        try:
            count = self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self.idle)  # writes keep the idle timeout
        if count and self._armed and self._deadline is None:
            self._deadline = time.monotonic() + self.budget
        return count


def close_gracefully(sock: socket.socket) -> None:
    """End the answer (FIN), read and drop what the client still sends for a bounded time and
    size, then close: closing with unread bytes would reset the connection, and a reset can
    destroy the answer in the client's buffers before it reads it (a 413 to a large body)."""
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + LINGER_SECONDS
        drained = 0
        while drained < LINGER_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                break
            drained += len(chunk)
    except OSError:  # the client is gone already, or slow to go
        pass
    sock.close()


class ConnectionServer(ThreadingHTTPServer):
    """The standard library's threaded HTTP server with this module's rules: IPv4 or IPv6 by
    the host's form, a listen backlog for bursts, at most ``max_connections`` connections served
    at a time (a 503 beyond), graceful closes, and no traceback for a client that left."""

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog (5 reset ~1% of 50 concurrent clients' calls)
    max_connections = 128  # a browser opens six per site
    idle_timeout = IDLE_SECONDS  # read by the handler for each connection
    request_timeout = REQUEST_SECONDS

    def __init__(self, address: tuple[str, int], handler: type) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._open = self._refusing = 0  # connections being served, refused; under _open_lock
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            busy = self._open >= self.max_connections
            refused = busy and self._refusing < self.max_connections
            self._open += not busy
            self._refusing += refused
        if refused:  # answered 503 on a thread of its own: a graceful close takes a moment
            threading.Thread(target=self._refuse, args=(request,), daemon=True).start()
        elif busy:  # a flood: closed at once
            self.close_request(request)
        else:
            try:
                super().process_request(request, client_address)
            except BaseException:
                self._closed_one()
                raise

    def _refuse(self, request: Any) -> None:
        try:
            request.settimeout(self.idle_timeout)
            request.sendall(busy_answer())
        except OSError:
            pass
        finally:
            close_gracefully(request)
            with self._open_lock:
                self._refusing -= 1

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed_one()

    def _closed_one(self) -> None:
        with self._open_lock:
            self._open -= 1

    def shutdown_request(self, request: Any) -> None:
        close_gracefully(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # the client left or stalled: nothing to report
        super().handle_error(request, client_address)  # a bug: its traceback on the terminal
