"""The viewer's HTTP server: the standard library's ThreadingHTTPServer, on loopback by default.

Security for a local tool that reads model files (each rule is tested):

* binds 127.0.0.1 unless told otherwise; requests whose Host header is not this server's
  address (DNS rebinding) get 403;
* static files by exact name from an allow-list, read once from the package; every other path
  is 404, so no request ever names a file (``/../etc/passwd``, ``/%2e%2e/...``);
* POST needs ``Content-Type: application/json`` (415; a cross-site page then needs a CORS
  preflight, which is never granted), an ``Origin`` equal to this server's own when the browser
  sends one (403), and a body of at most 64 KiB (413) holding a JSON object (400);
* no CORS headers; ``Content-Security-Policy: default-src 'self'`` (no inline script, no
  other site) and ``X-Content-Type-Options: nosniff`` on every answer;
* every error is JSON ``{"error": message}``; an unexpected exception is a 500 whose traceback
  goes to the terminal only, and the server keeps serving.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import sys
import threading
import traceback
import webbrowser
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from glassllm._text import finite_for_json

from . import api
from .fields import ApiError
from .run import Run

MAX_BODY = 64 * 1024
LOOPBACK = ("127.0.0.1", "localhost", "::1")
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
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


class ViewServer(ThreadingHTTPServer):
    """One run's viewer; `allowed_hosts` are the Host header values it answers."""

    daemon_threads = True

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

    # ---- answers

    def _send(self, status: int, body: bytes, content_type: str, cache: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache" if cache else "no-store")
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value: Any) -> None:
        self._send(status, encode_json(value), "application/json; charset=utf-8")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

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
        self._method_not_allowed()

    do_DELETE = do_PATCH = do_OPTIONS = do_PUT

    def _method_not_allowed(self) -> None:
        self.close_connection = True
        self._error(405, f"method {self.command} is not allowed")

    def _handle(self, method: str) -> None:
        try:
            self._route(method)
        except ApiError as err:
            self._error(err.status, err.message)
        except Exception:  # a bug: the terminal gets the traceback, the page a short message
            traceback.print_exc(file=sys.stderr)
            self.close_connection = True
            self._error(500, "internal error (see the terminal)")

    def _route(self, method: str) -> None:
        if not self.server.host_allowed(self.headers.get("Host", "")):
            self.close_connection = True
            raise ApiError(403, "unexpected Host header; open the address the viewer printed")
        if self.headers.get("Sec-Fetch-Site") == "cross-site":
            raise ApiError(403, "cross-site requests are refused")
        parts = urlsplit(self.path)
        path = parts.path
        if method == "POST":
            body = self._read_json_body()
        else:
            body = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        route = api.ROUTES.get((method, path))
        if route is None:
            if method == "GET" and path in self.server.static:
                content, content_type = self.server.static[path]
                self._send(200, content, content_type, cache=True)
                return
            other = "POST" if method == "GET" else "GET"
            if (other, path) in api.ROUTES:
                raise ApiError(405, f"{path} takes {other}")
            raise ApiError(404, f"no such page: {path}")
        function, locked = route
        run = self.server.run
        if locked:
            with run.lock:
                answer = function(run, body)
        else:
            answer = function(run, body)
        self._json(200, answer)

    def _read_json_body(self) -> dict[str, Any]:
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
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            self.close_connection = True
            raise ApiError(411, "a Content-Length is required")
        length = int(length_text)
        if length > MAX_BODY:
            self.close_connection = True  # the unread body must not be taken for a request
            raise ApiError(413, f"the body is larger than {MAX_BODY // 1024} KiB")
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError) as err:
            raise ApiError(400, f"the body is not valid JSON: {err}") from None
        except RecursionError:  # arrays nested thousands deep fit in 64 KiB
            raise ApiError(400, "the body is not valid JSON: nested too deeply") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def make_server(
    out_dir: str | Path,
    checkpoint: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> ViewServer:
    """A viewer of ``out_dir`` bound to ``host:port`` (not yet serving). Raises ValueError with a
    one-line message: nothing to show, not a glassllm checkpoint, or the port in use."""
    run = Run(out_dir, checkpoint)
    try:
        return ViewServer(run, host, port)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise ValueError(f"port {port} is in use; pass --port 0 for any free port") from None
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None


def serve(
    out_dir: str | Path,
    checkpoint: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    open_browser: bool = True,
) -> None:
    """Serve the viewer until Ctrl-C: print its URL, open a browser when asked and possible."""
    server = make_server(out_dir, checkpoint, host, port)
    if host not in LOOPBACK:
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


__all__ = ["HTTPStatus", "ViewServer", "make_server", "serve"]
