"""The server over HTTP: bad requests are 4xx JSON naming the field, never a 500; static files
stay inside the package; bodies are capped before they are read; concurrent clients all succeed.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time

import httpx
import pytest
from view_checks import TEXT

from qkv.errors import QkvError
from qkv.view.server import MAX_BODY_BYTES, bind

LONG = " ".join(["word"] * 600)  # 602 tokens: over MiniLM's 512

# (endpoint, body, status, field)
BAD = [
    ("steps", {"text": TEXT, "layer": 99, "head": 0}, 422, "layer"),
    ("steps", {"text": TEXT, "layer": 0, "head": 12}, 422, "head"),
    ("steps", {"text": TEXT, "layer": -1, "head": 0}, 422, "layer"),
    ("steps", {"text": TEXT, "layer": "3", "head": 0}, 422, "layer"),
    ("steps", {"text": TEXT, "layer": True, "head": 0}, 422, "layer"),
    ("steps", {"text": TEXT, "head": 0}, 422, "layer"),
    ("steps", {"text": TEXT, "layer": 0, "head": 0, "token": 99}, 422, "token"),
    ("steps", {"text": TEXT, "layer": 0, "head": 0, "token": "cat"}, 422, "token"),
    ("steps", {"text": TEXT, "layer": 0, "head": 0, "token": -3}, 422, "token"),
    ("steps", {"text": TEXT, "layer": 0, "head": 0, "token": [1]}, 422, "token"),
    ("overview", {"text": TEXT, "method": "magic"}, 422, "method"),
    ("overview", {"text": TEXT, "method": {}}, 422, "method"),
    ("overview", {"text": TEXT, "words": "yes"}, 422, "words"),
    ("overview", {"text": ""}, 422, "text"),
    ("overview", {"text": "   "}, 422, "text"),
    ("overview", {}, 422, "text"),
    ("overview", {"text": 5}, 422, "text"),
    ("overview", {"text": "x" * 20001}, 413, "text"),
    ("overview", {"text": LONG}, 422, "text"),
    ("overview", {"text": TEXT, "foo": 1}, 422, "foo"),
    ("overview", {"text": TEXT, "model": "/etc"}, 422, "model"),
    ("cross", {"text": TEXT, "model": "minilm"}, 422, "model"),
    ("cross", {"text": "the purple dragon", "model": "translate"}, 422, "text"),
    ("cross_steps", {"text": "the red apple", "model": "translate", "layer": 5, "head": 0}, 422, "layer"),
    ("maps", {"text": LONG}, 422, "text"),
    ("map", {"text": TEXT, "layer": 0, "head": 0, "method": "norm"}, 422, "method"),  # weights only
    ("map", {"text": " ".join(["word"] * 70), "layer": 0, "head": 0}, 422, "text"),  # over MAP_TOKENS
    ("nothing", {"text": TEXT}, 404, "endpoint"),
]


@pytest.mark.parametrize("endpoint, body, status, field", BAD, ids=[f"{b[0]}-{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_bad_fields_are_4xx_naming_the_field(served, endpoint, body, status, field):
    r = httpx.post(served.url + "api/" + endpoint, json=body, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["field"] == field and error["message"]
    assert "Traceback" not in r.text


def raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send bytes as they are (no client normalises the path); (status, response body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("path", [
    "/static/../server.py", "/static/..%2fapi.py", "/static/%2e%2e/%2e%2e/errors.py",
    "/static/%2e%2e%2fpage.py", "/static//etc/passwd", "/static/app.js/../../api.py",
    "/static/..\\api.py", "/static/../../../../../../etc/passwd", "/../../etc/passwd",
])
def test_static_files_stay_in_the_package(served, path):
    status, body = raw_request(served.port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    assert status == 404
    assert b"import" not in body and b"root:" not in body


def test_static_files_are_served(served):
    r = httpx.get(served.url + "static/app.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    page = httpx.get(served.url)
    assert "connect-src 'self'" in page.headers["content-security-policy"]


def test_a_huge_body_is_refused_from_its_length_without_being_read(served):
    # Content-Length says 1 GB; nothing of the body is sent: the answer must come anyway.
    head = (f"POST /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {2**30}\r\nConnection: close\r\n\r\n").encode()
    status, body = raw_request(served.port, head)
    assert status == 413 and json.loads(body)["error"]["field"] == "body"


def test_a_chunked_body_is_cut_at_the_limit(served):
    """No Content-Length: the server answers 413 once the bytes read pass the limit, while the
    client is still sending (it stops after 16 MB at most; a server reading it all needs 64 MB)."""
    chunk = b" " * 65536
    sent, answer = 0, b""
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as s:
        s.sendall(b"POST /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        while sent < 64 * 2**20:
            if select.select([s], [], [], 0)[0]:
                break  # the answer has come
            try:
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (TimeoutError, OSError):
                break  # the server stopped reading
            sent += len(chunk)
        s.settimeout(30)
        while b"\r\n\r\n" not in answer and (data := s.recv(65536)):
            answer += data
    assert answer.split(b" ", 2)[1] == b"413", answer[:200]
    assert sent <= 16 * 2**20, sent


@pytest.mark.parametrize("content, kind, status", [
    (b"{not json", "application/json", 400), (b"[1, 2]", "application/json", 400),
    (b"\xff\xfe", "application/json", 400), (b'{"text": "x"}', "text/plain", 415),
    (b'{"text": NaN}', "application/json", 422),
    (b"[" * 100_000, "application/json", 400), (b'{"a":' * 20_000 + b"1" + b"}" * 20_000, "application/json", 400),
])
def test_malformed_bodies(served, content, kind, status):
    r = httpx.post(served.url + "api/overview", content=content, headers={"Content-Type": kind})
    assert r.status_code == status and r.json()["error"]["field"] in ("body", "text")


def test_wrong_methods_and_paths_are_json_4xx(served):
    for r in (httpx.get(served.url + "api/steps"), httpx.get(served.url + "nowhere"),
              httpx.delete(served.url + "api/info")):
        assert 400 <= r.status_code < 500 and "error" in r.json()


def test_concurrent_clients(served):
    """20 clients × 5 requests each (benchmarks/view.py runs 20 × 50), all answered correctly."""
    failures, lock = [], threading.Lock()

    def client(c: int) -> None:
        with httpx.Client(base_url=served.url, timeout=120) as http:
            for k in range(5):
                body = {"text": TEXT, "layer": (c + k) % 6, "head": (c * 5 + k) % 12, "token": (c + k) % 14}
                endpoint = ("steps", "map", "overview")[k % 3]
                if endpoint == "overview":
                    body = {"text": TEXT, "token": body["token"]}
                if endpoint == "map":
                    del body["token"]
                r = http.post("api/" + endpoint, json=body)
                if r.status_code != 200 or r.json()["kind"] != endpoint:
                    with lock:
                        failures.append((endpoint, r.status_code, r.text[:200]))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_a_port_in_use_is_one_clear_error(served):
    with pytest.raises(QkvError, match=rf"port {served.port} on 127.0.0.1 is in use; pick another"):
        bind("127.0.0.1", served.port)


def test_a_body_at_the_limit_is_read_and_one_byte_more_is_refused(served):
    """The longest text the API takes, every character escaped by JSON (é → \\u00e9, 6 bytes),
    padded to exactly MAX_BODY_BYTES, is read whole and reaches the API (which names the extra
    field); one byte more is refused as a body."""
    from qkv.view.api import MAX_TEXT_CHARS

    body = json.dumps({"text": "é" * MAX_TEXT_CHARS, "foo": 1}).encode()
    at_limit = body + b" " * (MAX_BODY_BYTES - len(body))  # JSON allows trailing white space
    assert len(at_limit) == MAX_BODY_BYTES
    headers = {"Content-Type": "application/json"}
    r = httpx.post(served.url + "api/overview", content=at_limit, headers=headers, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["field"] == "foo", r.text[:200]
    r = httpx.post(served.url + "api/overview", content=at_limit + b" ", headers=headers, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["field"] == "body", r.text[:200]


def test_a_method_is_offered_only_where_the_library_runs_it(served):
    """issue 23 (minor): grad was offered on MiniLM, then refused asking for a field the API lacks."""
    info = httpx.get(served.url + "api/info").json()
    methods = {m["name"]: m["methods"] for m in info["models"]}
    assert "grad" not in methods["minilm"] and "grad" in methods["tiny-decoder"]
    assert methods["translate"] == [] and "norm" in methods["minilm"]
    r = httpx.post(served.url + "api/overview", json={"text": TEXT, "method": "grad"}, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["field"] == "method"
    assert "does not apply to minilm" in r.json()["error"]["message"]
    r = httpx.post(served.url + "api/overview", json={"text": TEXT, "method": "grad", "model": "tiny-decoder"},
                   timeout=60)
    assert r.status_code == 200 and r.json()["method"] == "grad"


def test_info_names_the_text_the_bare_page_opens_with(model):
    from qkv.view.api import Api, Models

    assert Api(Models(["minilm"], loader=lambda n: model), text="the cat sat").info()["default_text"] == "the cat sat"
    assert Api(Models(["minilm"], loader=lambda n: model)).info()["default_text"] is None


# -- issue 31 item 7: connections that send half a request cannot lock the viewer out -------------
@contextlib.contextmanager
def _quick_server(api, **options):
    """``api`` served with short read deadlines (``make_server``'s options), in a thread."""
    from qkv.view.server import create_app, make_server, url_of

    sock = bind("127.0.0.1", 0)
    server = make_server(create_app(api), sock, **options)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    try:
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield url_of(sock), sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _slow_clients(port: int, n: int, data: bytes) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(data)
        out.append(s)
    return out


def _answer(s: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing ``s`` (None: still open after ``within`` s)."""
    s.settimeout(within)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return got


def test_slow_headers_do_not_lock_good_clients_out(served):
    """201 connections that sent half a request line made every good request a 503 for as long
    as they stayed (uvicorn's h11 protocol has no deadline on a request line); now they do not
    count against the concurrency limit, and each gets a 408 when its deadline passes."""
    from qkv.view.server import MAX_CONCURRENT

    with _quick_server(served.api, request_timeout=1.5) as (url, port):
        slow = _slow_clients(port, MAX_CONCURRENT + 50, b"GET /api/info HT")
        late_body = _slow_clients(port, 1, b"POST /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"te")
        try:
            with httpx.Client(base_url=url, timeout=10) as http:
                for _ in range(3):  # served while the slow ones hold their connections
                    assert http.get("api/info").status_code == 200
            started = time.monotonic()
            answers = [_answer(s, 10) for s in slow]
            assert time.monotonic() - started < 8  # closed by the deadline, not by the test
            assert all(a is not None and a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[:3]
            assert _answer(late_body[0], 10) is not None  # a body that never ends: closed too
            with httpx.Client(base_url=url, timeout=10) as http:
                assert http.get("api/info").status_code == 200
        finally:
            for s in slow + late_body:
                s.close()


def test_the_longest_waiting_connections_are_dropped_first(served):
    with _quick_server(served.api, request_timeout=30, max_unread=4) as (url, port):
        idle = _slow_clients(port, 6, b"")
        try:
            time.sleep(0.3)
            assert [_answer(s, 0.5) is None for s in idle] == [False, False, True, True, True, True]
            with httpx.Client(base_url=url, timeout=10) as http:  # a new client still gets in
                assert http.get("api/info").status_code == 200
        finally:
            for s in idle:
                s.close()


@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1:65535", True), ("127.0.0.1:0", True), ("[::1]:8765", True),
    ("127.0.0.1:65536", False), ("127.0.0.1:99999999999", False), ("[::1]:70000", False),
    ("127.0.0.1:٣", False),  # an Arabic-Indic digit is a digit to str.isdigit, not a port
])
def test_a_host_port_beyond_65535_is_refused(host, ok):
    from qkv.view.server import allowed_hosts, refusal

    assert (refusal({"host": host}, allowed_hosts(), api=False) is None) == ok
