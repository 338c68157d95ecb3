"""The viewer's HTTP server: the standard library's ThreadingHTTPServer, on loopback by default.

Security for a local tool that reads model files (each rule is tested):

* binds 127.0.0.1 unless told otherwise; requests whose Host header is not this server's
  address (DNS rebinding) get 403;
* static files by exact name from an allow-list, read once from the package; every other path
  is 404, so no request ever names a file (``/../etc/passwd``, ``/%2e%2e/...``);
* POST needs ``Content-Type: application/json`` (415; a cross-site page then needs a CORS
  preflight, which is never granted), an ``Origin`` equal to this server's own when the browser
  sends one (403), and a body of at most 64 KiB (413) holding a JSON object (400); every body,
  of any method, framed by one Content-Length of ASCII digits (400; none on a POST 411;
  Transfer-Encoding 411 or 501: `connection.body_length`) and read whole before the answer;
* no CORS headers; ``Content-Security-Policy: default-src 'self'`` (no inline script, no
  other site) and ``X-Content-Type-Options: nosniff`` on every answer;
* every error is JSON ``{"error": message}``, the standard library's own refusals included
  (unknown methods 501, a long URL 414, long or many headers 431, a bad request line 400, HTTP/0.9
  400); an unexpected exception is a 500 whose traceback goes to the terminal only, and the
  server keeps serving; a client that leaves early is no error at all (nothing printed);
* IPv4 or IPv6 (``--host ::1``); each connection on its own thread, at most
  ``max_connections`` at a time (503 beyond), each read bounded in time and each request as a
  whole (`connection.DeadlineReader`), its body read before the model lock is taken: a slow or
  dead client never holds the lock or another client's turn.
"""

from __future__ import annotations

import errno
import io
import ipaddress
import json
import os
import sys
import threading
import traceback
import webbrowser
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from glassllm._text import finite_for_json

from . import api, experiment_api
from .connection import (
    JSON_TYPE,
    SECURITY_HEADERS,
    ConnectionServer,
    DeadlineReader,
    answer_headers,
    body_length,
)
from .fields import ApiError
from .run import Run

api.ROUTES.update(experiment_api.ROUTES)  # the Experiment tab's endpoints
MAX_BODY = 64 * 1024
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# URL path -> (package, file, content type): the only files ever served.
STATIC = {
    "/": ("glassllm.app.view.static", "index.html", "text/html; charset=utf-8"),
    "/index.html": ("glassllm.app.view.static", "index.html", "text/html; charset=utf-8"),
    "/style.css": ("glassllm.app.view.static", "style.css", "text/css; charset=utf-8"),
    "/favicon.svg": ("glassllm.app.view.static", "favicon.svg", "image/svg+xml"),
    "/graph.css": ("glassllm.graph", "graph.css", "text/css; charset=utf-8"),
    "/graph_render.js": ("glassllm.graph", "render.js", "text/javascript; charset=utf-8"),
    **{
        f"/{name}": ("glassllm.app.view.static", name, "text/javascript; charset=utf-8")
        for name in (
            "main.js",
            "api.js",
            "util.js",
            "sample.js",
            "inside.js",
            "dashboard.js",
            "graph.js",
            "experiment.js",
        )
    },
}


def _static_files() -> dict[str, tuple[bytes, str]]:
    files = {}
    for path, (package, name, content_type) in STATIC.items():
        files[path] = (resources.files(package).joinpath(name).read_bytes(), content_type)
    return files


def encode_json(value: Any) -> bytes:
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except ValueError:
        text = json.dumps(finite_for_json(value), allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8")


class ViewServer(ConnectionServer):
    """One run's viewer; `allowed_hosts` are the Host header values it answers."""

    def __init__(self, run: Run, host: str, port: int) -> None:
        self.run = run
        self.static = _static_files()
        super().__init__((host, port), Handler)
        self.port = self.server_address[1]
        names = {host, *LOOPBACK} if host in LOOPBACK else {host}
        self.allowed_hosts = {f"{name}:{self.port}" for name in names if ":" not in name}
        self.allowed_hosts |= {f"[{name}]:{self.port}" for name in names if ":" in name}
        self.loopback_only = host in LOOPBACK

    def host_allowed(self, header: str) -> bool:
        """Whether a request's Host header names this server. Names are allow-listed (a DNS
        rebinding attack comes with its own domain name); on a non-loopback address, which the
        user chose, any IP literal with the right port is accepted too."""
        if header in self.allowed_hosts:
            return True
        if self.loopback_only:
            return False
        name, _, port = header.rpartition(":")
        if port != str(self.port):
            return False
        try:
            ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            return False
        return True

    @property
    def url(self) -> str:
        host = self.server_address[0]
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"http://{host if ':' not in host else f'[{host}]'}:{self.port}/"


class Handler(BaseHTTPRequestHandler):
    server: ViewServer
    protocol_version = "HTTP/1.1"
    server_version = "glassllm-view"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the standard library's reader: ours bounds the time of each read
        self.reader = DeadlineReader(
            self.connection, self.server.idle_timeout, self.server.request_timeout
        )
        self.rfile = io.BufferedReader(self.reader)
        self.connection.settimeout(self.server.idle_timeout)

    def handle_one_request(self) -> None:
        self.reader.start_request()
        try:
            super().handle_one_request()  # a TimeoutError closes the connection quietly there
        except ConnectionError:  # the client left: nobody to answer, nothing to print
            self.close_connection = True

    def parse_request(self) -> bool:
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        if len(self.requestline.split()) == 2:  # "GET /": HTTP/0.9, answered without headers
            self.command, self.request_version = None, "HTTP/1.1"
            self.close_connection = True
            self.send_error(400, "HTTP/0.9 is not supported; send an HTTP/1.1 request")
            return False
        return super().parse_request()

    def handle_expect_100(self) -> bool:
        """``Expect: 100-continue``: a body the server would refuse is refused before it comes."""
        try:
            body_length(self.headers, MAX_BODY)
        except ApiError as err:
            self.close_connection = True
            self._error(err.status, err.message)
            return False
        return super().handle_expect_100()

    # ---- answers

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        cache: bool = False,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.send_response(status)
        headers = answer_headers(content_type, len(body), cache=cache, close=self.close_connection)
        for name, value in [*headers, *extra]:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value: Any, extra: tuple[tuple[str, str], ...] = ()) -> None:
        self._send(status, encode_json(value), JSON_TYPE, extra=extra)

    def _error(self, status: int, message: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        self._json(status, {"error": message}, extra)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (bad request line, 414, 431, 501, ...) as every
        other error: JSON with the security headers, and the connection closed."""
        if self.request_version == "HTTP/0.9":  # a request line refused before its version
            self.request_version = "HTTP/1.1"  # was read: still a status line and headers
        self.close_connection = True
        text = message or self.responses.get(code, ("error",))[0]
        self._error(code, text if len(text) <= 200 else text[:197] + "...")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        pass  # quiet: the terminal shows the URL and errors only

    # ---- requests

    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle(None)

    do_DELETE = do_PATCH = do_OPTIONS = do_PUT

    def _handle(self, method: str | None) -> None:
        try:
            raw = self._read_body()  # first: whatever the answer, the request is read whole
            if method is None:
                raise ApiError(405, f"method {self.command} is not allowed")
            self._route(method, raw)
        except ApiError as err:
            allow = {405: (("Allow", _allowed(self.path)),)}.get(err.status, ())
            self._error(err.status, err.message, allow)
        except (ConnectionError, TimeoutError):  # the client left or stalled: nobody to answer
            self.close_connection = True
            raise
        except Exception:  # a bug: the terminal gets the traceback, the page a short message
            traceback.print_exc(file=sys.stderr)
            self.close_connection = True
            self._error(500, "internal error (see the terminal)")

    def _read_body(self) -> bytes:
        """The request's body, framed by its one Content-Length, read before anything else (and
        so before the model lock); a framing error closes the connection."""
        try:
            length = body_length(self.headers, MAX_BODY)
        except ApiError:
            self.close_connection = True
            raise
        raw = self.rfile.read(length) if length else b""
        self.reader.end_request()
        if len(raw) < length:
            self.close_connection = True
            raise ApiError(400, f"the body ended after {len(raw)} of {length} bytes")
        return raw

    def _route(self, method: str, raw: bytes) -> None:
        hosts = self.headers.get_all("Host") or [""]
        if len(hosts) > 1:
            self.close_connection = True
            raise ApiError(400, "more than one Host header")
        if not self.server.host_allowed(hosts[0]):
            self.close_connection = True
            raise ApiError(403, "unexpected Host header; open the address the viewer printed")
        if self.headers.get("Sec-Fetch-Site") == "cross-site":
            raise ApiError(403, "cross-site requests are refused")
        path, query = self._target()
        if method == "POST":
            body = self._json_body(raw)
        else:
            body = {k: v[-1] for k, v in parse_qs(query).items()}
        route = api.ROUTES.get((method, path))
        if route is None:
            if method == "GET" and path in self.server.static:
                content, content_type = self.server.static[path]
                self._send(200, content, content_type, cache=True)
                return
            other = "POST" if method == "GET" else "GET"
            if (other, path) in api.ROUTES:
                raise ApiError(405, f"{path} takes {other}")
            shown_path = path if len(path) <= 100 else path[:97] + "..."
            raise ApiError(404, f"no such page: {shown_path}")
        function, locked = route
        run = self.server.run
        if locked:
            with run.lock:
                answer = function(run, body)
        else:
            answer = function(run, body)
        self._json(200, answer)

    def _target(self) -> tuple[str, str]:
        """The path and query of the request target; an absolute URL (RFC 9112 section 3.2.2)
        must name this server as its Host header would."""
        try:
            parts = urlsplit(self.path)
        except ValueError:  # an unclosed "[" of an IPv6 address, a bad port
            raise ApiError(400, "the request target is not a valid URL") from None
        if parts.scheme or parts.netloc:
            if parts.scheme.lower() != "http":
                raise ApiError(400, "the request target must be a path or an http:// URL")
            if not self.server.host_allowed(parts.netloc):
                self.close_connection = True
                raise ApiError(403, "the request names another server")
        return parts.path, parts.query

    def _json_body(self, raw: bytes) -> dict[str, Any]:
        origin = self.headers.get("Origin")
        if origin is not None and origin not in {
            f"http://{self.headers.get('Host', '')}",
        }:
            self.close_connection = True
            raise ApiError(403, f"requests from {origin} are refused")
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            self.close_connection = True
            raise ApiError(415, "the body must be application/json")
        if self.headers.get("Content-Length") is None:
            self.close_connection = True  # a body may follow all the same, of unknown length
            raise ApiError(411, "a Content-Length is required")
        try:
            body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError) as err:
            raise ApiError(400, f"the body is not valid JSON: {err}") from None
        except RecursionError:  # arrays nested thousands deep fit in 64 KiB
            raise ApiError(400, "the body is not valid JSON: nested too deeply") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body


def _allowed(target: str) -> str:
    """The Allow header of a 405 for ``target``: POST for the POST endpoints, else GET."""
    path = target.split("?", 1)[0]
    methods = {method for method, route_path in api.ROUTES if route_path == path}
    if methods == {"POST"}:
        return "POST"
    return "GET, HEAD"  # an API GET, a file of the page, or no page at all


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def make_server(
    out_dir: str | Path,
    checkpoint: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> ViewServer:
    """A viewer of ``out_dir`` bound to ``host:port`` (not yet serving). Raises ValueError with a
    one-line message: nothing to show, not a glassllm checkpoint, or the port in use. An IPv6
    ``host`` may come bracketed as in a URL (``[::1]``)."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    run = Run(out_dir, checkpoint)
    try:
        return ViewServer(run, host, port)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise ValueError(f"port {port} is in use; pass --port 0 for any free port") from None
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ValueError(f"cannot listen on {where}: {err.strerror or err}") from None


def serve(
    out_dir: str | Path,
    checkpoint: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    open_browser: bool = True,
) -> None:
    """Serve the viewer until Ctrl-C: print its URL, open a browser when asked and possible."""
    server = make_server(out_dir, checkpoint, host, port)
    if not server.loopback_only:
        print(
            f"glassllm: warning: listening on {host}: anyone who can reach this machine can "
            "read the model and its training logs",
            file=sys.stderr,
        )
    what = (
        "dashboard only, no checkpoint yet"
        if server.run.model is None
        else (f"checkpoint {server.run.checkpoint_path}")
    )
    print(f"glassllm view: {server.url}  ({what}; Ctrl-C stops)", flush=True)
    if open_browser and has_display():
        threading.Thread(target=_open, args=(server.url,), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("\nglassllm view: stopped", flush=True)
    finally:
        server.server_close()


def has_display() -> bool:
    """Whether a graphical browser can open: always on macOS and Windows, elsewhere only with an
    X or Wayland display (without one, webbrowser may start a text browser in this terminal)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _open(url: str) -> None:
    try:
        webbrowser.open(url)
    except Exception:  # no display or no browser: the printed URL is enough
        pass


__all__ = ["SECURITY_HEADERS", "HTTPStatus", "ViewServer", "make_server", "serve"]
