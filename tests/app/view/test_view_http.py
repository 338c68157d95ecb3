"""The viewer's HTTP edges, over real sockets against a live server: request framing, the standard
library's own refusals, clients that leave, are slow or are many, IPv6 loopback.

Every answer is parsed strictly (view_http.parse_answers) and checked for JSON errors and the
security headers (view_http.check_answer); ``capsys`` catches what the server prints, since it
serves from a thread of this process.
"""

import http.client
import json
import socket
import struct
import threading
import time
import urllib.request

import pytest
from view_helpers import make_run
from view_http import (
    answers_to,
    check_answer,
    exchange,
    json_post,
    live_server,
    parse_answers,
    read_all,
    request_bytes,
)

from glassllm.app.view import api


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("view_http") / "out", steps=4, eval_interval=4)


@pytest.fixture
def server(out_dir):
    with live_server(out_dir) as server:
        yield server


def one_answer(server, data, **kwargs):
    answers = answers_to(server.port, data, **kwargs)
    assert len(answers) == 1, answers
    return answers[0]


def no_traceback(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception" not in err, err


# ---------------------------------------------------------------------- framing of a body


@pytest.mark.parametrize(
    "length",
    ["+2", "5 ", "\u0665", "\u00b2", "-1", "1e3", "0x10", "2, 2", "2,2", "", "abc", "\x00"],
    ids=repr,
)
def test_a_content_length_that_is_not_ascii_digits_is_a_400(server, capsys, length):
    data = request_bytes(
        "POST",
        "/api/generate",
        server.port,
        [("Content-Type", "application/json"), ("Content-Length", length)],
        b"{}",
    )
    answer = one_answer(server, data)
    assert answer.status == 400 and "Content-Length" in answer.json()["error"]
    assert answer.header("Connection") == "close"
    no_traceback(capsys)


@pytest.mark.parametrize(
    "length", [str(10**6), "9" * 30, "9" * 5000], ids=["1e6", "9x30", "9x5000"]
)
def test_a_content_length_beyond_the_limit_is_a_413_even_while_the_body_comes(
    server, capsys, length
):
    headers = [("Content-Type", "application/json"), ("Content-Length", length)]
    data = request_bytes("POST", "/api/generate", server.port, headers, b"x" * 300_000)
    answer = one_answer(server, data)  # no reset: the server reads on after its answer
    assert answer.status == 413 and answer.header("Connection") == "close"
    no_traceback(capsys)


def test_a_body_needs_one_content_length(server):
    post = [("Content-Type", "application/json")]
    missing = request_bytes("POST", "/api/generate", server.port, post)
    assert one_answer(server, missing).status == 411
    twice = request_bytes(
        "POST", "/api/generate", server.port, [*post, ("Content-Length", "2")] * 2, b"{}"
    )
    assert one_answer(server, twice).status == 400
    chunked = request_bytes(
        "POST", "/api/generate", server.port, [*post, ("Transfer-Encoding", "chunked")]
    )
    answer = one_answer(server, chunked + b"2\r\n{}\r\n0\r\n\r\n")
    assert answer.status == 411 and answer.header("Connection") == "close"
    unknown = request_bytes("POST", "/api/generate", server.port, [("Transfer-Encoding", "gzip")])
    assert one_answer(server, unknown).status == 501
    # both: the framing is ambiguous (request smuggling); refused, and nothing after is read
    smuggled = request_bytes("GET", "/api/nothing", server.port)
    both = request_bytes(
        "POST",
        "/api/generate",
        server.port,
        [*post, ("Content-Length", "2"), ("Transfer-Encoding", "chunked")],
        b"{}",
    )
    assert [a.status for a in answers_to(server.port, both + smuggled)] == [411]


def test_the_body_of_a_get_is_read_not_taken_for_a_request(server):
    inner = request_bytes("GET", "/api/nothing", server.port)
    first = request_bytes("GET", "/api/info?brief=1", server.port, [], inner)
    second = request_bytes("GET", "/api/info?brief=1", server.port)
    assert [a.status for a in answers_to(server.port, first + second)] == [200, 200]


def test_expect_100_continue_is_refused_before_the_body_when_too_large(server):
    headers = [
        ("Content-Type", "application/json"),
        ("Expect", "100-continue"),
        ("Content-Length", str(10**6)),
    ]
    data = request_bytes("POST", "/api/generate", server.port, headers)
    raw = exchange(server.port, data)
    assert raw.startswith(b"HTTP/1.1 413 ")  # no 100 Continue first
    fine = json_post("/api/generate", server.port, {"prompt": "de", "max_new_tokens": 1})
    fine = fine.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n", 1)
    assert [a.status for a in answers_to(server.port, fine)] == [200]


# ---------------------------------------------------------------------- stdlib refusals


@pytest.mark.parametrize(
    "data, status",
    [
        (b"FOO / HTTP/1.1\r\nHost: {host}\r\n\r\n", 501),
        (b"PROPFIND / HTTP/1.1\r\nHost: {host}\r\n\r\n", 501),
        (b"get / HTTP/1.1\r\nHost: {host}\r\n\r\n", 501),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: {host}\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\nHost: {host}\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nHost: {host}\r\n" + b"X-A: 1\r\n" * 120 + b"\r\n", 431),
        (b"GET / HTTP/1.x\r\nHost: {host}\r\n\r\n", 400),
        (b"GET / FTP/1.1\r\nHost: {host}\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: {host}\r\n\r\n", 505),
        (b"GET / HTTP/1.1 extra\r\nHost: {host}\r\n\r\n", 400),
        (b"GET /\r\n\r\n", 400),  # HTTP/0.9: answered with headers all the same
        (b"GET /\r\n", 400),
        (b"POST /\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(40)) + b"\r\n\r\n", 400),
    ],
    ids=lambda v: repr(v)[:40] if isinstance(v, bytes) else str(v),
)
def test_every_refusal_is_json_with_the_security_headers(server, capsys, data, status):
    data = data.replace(b"{host}", f"127.0.0.1:{server.port}".encode())
    answer = one_answer(server, data)
    assert answer.status == status, answer
    assert answer.header("Connection") == "close"
    no_traceback(capsys)


def test_http_0_9_is_refused_without_waiting_for_headers(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /\r\n")  # a 0.9 client sends only this and waits
        answer = parse_answers(read_all(sock))[0]
    assert answer.status == 400


def test_head_answers_the_headers_of_get(server):
    get = one_answer(server, request_bytes("GET", "/style.css", server.port))
    data = request_bytes("HEAD", "/style.css", server.port) + request_bytes(
        "HEAD", "/api/nothing", server.port
    )
    head, missing = answers_to(server.port, data, head_only=True)
    assert head.status == 200 and head.header("Content-Length") == str(len(get.body))
    assert missing.status == 404
    assert exchange(server.port, data).count(b"HTTP/1.1 ") == 2  # and no bodies between


def test_a_405_says_what_is_allowed(server):
    answer = one_answer(server, request_bytes("GET", "/api/generate", server.port))
    assert answer.status == 405 and answer.header("Allow") == "POST"
    answer = one_answer(server, request_bytes("DELETE", "/", server.port))
    assert answer.status == 405 and answer.header("Allow") == "GET, HEAD"


# ---------------------------------------------------------------------- keep-alive


def test_keep_alive_and_close(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        for _ in range(3):  # one connection, three exchanges
            sock.sendall(request_bytes("GET", "/api/info?brief=1", server.port))
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert response.status == 200 and not response.will_close
            response.read()
    closing = request_bytes("GET", "/api/info?brief=1", server.port, [("Connection", "close")])
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(closing)  # no shutdown: the server must close by itself
        (answer,) = parse_answers(read_all(sock))
    assert answer.header("Connection") == "close"
    old = b"GET /api/info?brief=1 HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n\r\n" % server.port
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(old)
        (answer,) = parse_answers(read_all(sock))
    assert answer.status == 200


def test_an_error_that_closes_says_so(server):
    """An answer after which the server closes carries ``Connection: close``, so a client does
    not send its next request into a closed connection."""
    refused = json_post("/api/generate", server.port, {}, [("Host", "evil.example")])
    refused = refused.replace(f"Host: 127.0.0.1:{server.port}\r\n".encode(), b"", 1)
    answer = one_answer(server, refused)
    assert answer.status == 403 and answer.header("Connection") == "close"


# ---------------------------------------------------------------------- host, target, query


def test_one_host_header_and_an_absolute_target_naming_this_server(server, capsys):
    twice = request_bytes("GET", "/api/info", server.port, [("Host", "evil.example")])
    assert one_answer(server, twice).status == 400
    own = f"http://127.0.0.1:{server.port}/api/info?brief=1"
    assert one_answer(server, request_bytes("GET", own, server.port)).status == 200
    other = request_bytes("GET", "http://evil.example/api/info", server.port)
    assert one_answer(server, other).status == 403
    for target in ["http://[::1/api/info", "http://[x]:1/", "http://127.0.0.1:99999999/"]:
        assert one_answer(server, request_bytes("GET", target, server.port)).status in (400, 403)
    no_traceback(capsys)


@pytest.mark.parametrize(
    "target, status",
    [
        ("/api/log?since=%zz", 400),
        ("/api/log?since=%00", 400),
        ("/api/log?since=1%00", 400),
        ("/api/log?since=%ff%fe", 400),
        ("/api/log?since=" + "9" * 5000, 400),
        ("/api/log?since=5&since=x", 400),
        ("/api/log?%", 200),
        ("/api/info?brief=%ff&brief=%00", 200),
        ("/api/log?" + "&".join(f"a{i}=1" for i in range(5000)), 200),
        ("/index.html%00", 404),
        ("/%2e%2e%2fetc/passwd", 404),
        ("/..%5c..%5cwindows", 404),
        ("/STYLE.CSS", 404),
        ("/style.css/", 404),
        ("/.", 404),
        ("*", 404),
        ("/main.js?../../etc/passwd", 200),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_query_strings_and_paths(server, capsys, target, status):
    answer = one_answer(server, request_bytes("GET", target, server.port))
    assert answer.status == status, answer
    no_traceback(capsys)


def test_nul_and_high_bytes_in_the_request_line(server, capsys):
    data = request_bytes("GET", "/", server.port).replace(b"/", b"/api/log?since=\x00\xff", 1)
    assert one_answer(server, data).status == 400
    no_traceback(capsys)


# ---------------------------------------------------------------------- clients that leave


def abort(sock):
    """Close with a reset (SO_LINGER 0), as a killed client does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_a_client_that_leaves_before_its_answer_prints_nothing(server, monkeypatch, capsys):
    done = threading.Event()
    gone = threading.Event()
    real_shutdown = server.shutdown_request

    def shutdown_request(request):
        real_shutdown(request)
        done.set()

    def slow_and_large(_run, _request):
        gone.wait(30)  # answer only once the client has gone
        return {"x": "y" * 5_000_000}

    monkeypatch.setattr(server, "shutdown_request", shutdown_request)
    monkeypatch.setitem(api.ROUTES, ("GET", "/api/info"), (slow_and_large, False))
    for leave in (abort, lambda sock: sock.close()):
        done.clear()
        gone.clear()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(request_bytes("GET", "/api/info", server.port))
        time.sleep(0.2)  # the request is being handled
        leave(sock)
        gone.set()
        assert done.wait(60), "the handler never finished"
    # and one that leaves half-way through its body
    done.clear()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(
        request_bytes(
            "POST",
            "/api/generate",
            server.port,
            [("Content-Type", "application/json"), ("Content-Length", "100")],
            b'{"pro',
        )
    )
    abort(sock)
    assert done.wait(60)
    no_traceback(capsys)
    monkeypatch.undo()
    assert one_answer(server, request_bytes("GET", "/api/info?brief=1", server.port)).status == 200


# ---------------------------------------------------------------------- slow and many clients


def generate_answered(server):
    """A normal client's cheapest model request, answered (the socket's timeout bounds the wait)."""
    data = json_post("/api/generate", server.port, {"prompt": "de", "max_new_tokens": 1})
    return one_answer(server, data, timeout=60).status == 200


def test_slow_clients_do_not_stop_others(server):
    """A slowloris (headers one byte at a time), a slow body and a client that never reads its
    answers all hold connections open while a normal client is answered."""
    stop = threading.Event()
    drip = request_bytes("GET", "/api/info", server.port)
    slow_body = json_post("/api/generate", server.port, {"prompt": "x" * 1000})

    def slowloris(data):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            for byte in data:
                if stop.wait(0.05):
                    return
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    return

    threads = [threading.Thread(target=slowloris, args=(d,)) for d in (drip, slow_body)]
    for thread in threads:
        thread.start()
    deaf = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    inspect = json_post("/api/inspect", server.port, {"prompt": "def f(x):" * 3})
    try:
        deaf.sendall(inspect * 40)  # answers of ~50 KB each, never read
        time.sleep(0.5)
        for _ in range(3):
            assert generate_answered(server)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        abort(deaf)


def test_dead_and_slow_clients_are_dropped(server, capsys):
    server.idle_timeout = 0.5
    server.request_timeout = 1.0
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /api/info HTTP/1.1\r\nHo")  # and then nothing
        assert read_all(sock) == b""  # closed by the server, not by our timeout
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        data = request_bytes("GET", "/api/info", server.port, [("X-Pad", "p" * 200)])
        closed = False
        for byte in data:  # every gap shorter than the idle timeout, the whole far longer
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
        assert closed or read_all(sock) == b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        assert read_all(sock) == b""  # connected and silent
    no_traceback(capsys)
    assert generate_answered(server)


def test_many_concurrent_clients_are_all_answered(server):
    clients, requests_each = 64, 4
    failures, statuses = [], []
    start = threading.Barrier(clients)
    url = f"http://127.0.0.1:{server.port}/api/info?brief=1"

    def client():
        for _ in range(requests_each):
            start.wait()  # every round a burst of new connections at once
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    statuses.append(response.status)
                    json.loads(response.read())
            except OSError as err:  # a reset or refused connection
                failures.append(repr(err))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and statuses == [200] * (clients * requests_each)
    assert server.request_queue_size >= 128


def test_connections_beyond_the_limit_are_a_503(server):
    server.max_connections = 3
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(3)]
    try:
        time.sleep(0.3)  # accepted and counted
        answer = one_answer(server, request_bytes("GET", "/api/info", server.port))
        assert answer.status == 503 and answer.header("Retry-After")
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the slots come back as the server sees the closes
        answer = one_answer(server, request_bytes("GET", "/api/info?brief=1", server.port))
        if answer.status == 200:
            break
        time.sleep(0.1)
    assert answer.status == 200


# ---------------------------------------------------------------------- IPv6


def ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_ipv6_loopback(out_dir):
    with live_server(out_dir, host="::1") as server:
        assert server.url == f"http://[::1]:{server.port}/"
        data = request_bytes("GET", "/api/info?brief=1", server.port)
        data = data.replace(b"Host: 127.0.0.1", b"Host: [::1]")
        answers = answers_to(server.port, data, family=socket.AF_INET6, host="::1")
        assert [a.status for a in answers] == [200]
        evil = data.replace(b"Host: [::1]", b"Host: evil.example")
        answers = answers_to(server.port, evil, family=socket.AF_INET6, host="::1")
        assert [a.status for a in answers] == [403]
        assert server.loopback_only


def test_check_answer_catches_what_it_should():
    """The checker itself: a stdlib-style HTML error fails it."""
    html = (
        b"HTTP/1.1 501 Unsupported method\r\nContent-Type: text/html;charset=utf-8\r\n"
        b"Content-Length: 5\r\n\r\n<p>x<"
    )
    with pytest.raises(AssertionError):
        check_answer(parse_answers(html)[0])
    with pytest.raises(AssertionError):
        parse_answers(b"<html>no status line</html>\r\n\r\n")


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_glassllm_view_listens_on_ipv6_loopback(out_dir):
    from test_view_fuzz import ServedProcess

    served = ServedProcess(out_dir, "--host", "::1")
    try:
        assert served.url == f"http://[::1]:{served.port}/"
        data = request_bytes("GET", "/api/info?brief=1", served.port)
        data = data.replace(b"Host: 127.0.0.1", b"Host: [::1]")
        answers = answers_to(served.port, data, family=socket.AF_INET6, host="::1")
        assert [a.status for a in answers] == [200]
    finally:
        err = served.stop()
    assert "Traceback" not in err and "warning" not in err, err  # loopback: no warning


def test_a_bracketed_ipv6_host_and_an_unknown_host(out_dir):
    from glassllm.app.view import make_server

    with pytest.raises(ValueError, match=r"^cannot listen on no-such-host\.invalid:0: "):
        make_server(out_dir, host="no-such-host.invalid", port=0)
    if ipv6_loopback():
        server = make_server(out_dir, host="[::1]", port=0)
        try:
            assert server.url == f"http://[::1]:{server.port}/" and server.loopback_only
        finally:
            server.server_close()
