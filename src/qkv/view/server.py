"""The viewer's web server: routes, limits, static files, errors as JSON; uvicorn on 127.0.0.1.

Routes (`create_app`):

```text
GET  /                the page (static/index.html with the static files inlined: page.py)
GET  /static/NAME     one of the files in static/ — a fixed list read at start, so no path
                      can name anything else (``/static/../server.py`` is a 404)
GET  /api/info        the models served, the methods, the limits
POST /api/ENDPOINT    a JSON object in, the API's answer out (see :mod:`qkv.view.api`)
GET  /atlas, /needle  a saved result's page (static/atlas.html, needle.html): open a file …
POST /api/atlas       … a saved ``qkv atlas --json`` (``/api/needle``: ``qkv needle --json``)
                      in; out, the result it describes, rebuilt and checked by
                      ``Atlas.from_dict`` / ``NeedleMap.from_dict`` (:data:`SAVED`), as its
                      ``to_dict()``: anything else is a 4xx naming the field and the value
```

Slow clients: a request's line, headers and body must arrive within `REQUEST_TIMEOUT`
seconds of its first byte (else a 408), and a connection still waiting for its request does not
count against the `MAX_CONCURRENT` requests served at once (`_protocol`), so
connections that send half a request line and wait cannot hold good clients out.

Every API error is JSON `{"error": {"field", "message"}}` with a 4xx status: a body over
`MAX_BODY_BYTES` is refused from its `Content-Length` before any of it is read (or, sent
without one, as soon as the bytes read pass the limit); a body that is not a JSON object is a 400.
Anything unexpected is a JSON 500 without a traceback (the tests require that none happens).

DNS rebinding and cross-site requests (as Jupyter guards against them): a page on another site
can make a browser send requests here, and a name the attacker controls can resolve to
127.0.0.1. So every request's `Host` must name this server — the address it is bound to or a
loopback name (`allowed_hosts`) — and an API request that says where it comes from
(`Origin`, `Sec-Fetch-Site`) must come from this same origin: anything else is a 403 JSON
error naming the header (`refusal`). A server bound to every interface (`0.0.0.0`, `::`)
cannot know the names it is reached by and takes any `Host`; the same-origin rule still holds.

`serve` binds the socket itself — so `port=0` picks a free port that can be printed, and
a port in use is one clear `QkvError` — then runs uvicorn until Ctrl-C.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
from pathlib import Path
from typing import Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from qkv.errors import QkvError
from qkv.explain.probes.atlas import Atlas
from qkv.explain.probes.needle import NeedleMap
from qkv.view.answers import saved_labelled
from qkv.view.api import Api, ApiError
from qkv.view.page import STATIC_DIR, page_html, static_files

MAX_BODY_BYTES = 160 * 1024  # a 20,000-character text fits even with every character escaped (6 bytes each)
# a saved atlas: ~600 bytes a head with its three contexts, so 1,024 heads (32 × 32) in ~0.6 MB
MAX_SAVED_BYTES = 8 * 1024 * 1024
# the saved results a page shows (GET /NAME, POST /api/NAME): the class that reads one back
SAVED = {"atlas": Atlas, "needle": NeedleMap}
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
log = logging.getLogger("qkv.view")


def _error(status: int, field: str | None, message: str) -> JSONResponse:
    return JSONResponse({"error": {"field": field, "message": message}}, status_code=status)


async def read_json(request: Request, limit: int = MAX_BODY_BYTES) -> dict:
    """The request's JSON object, read at most `limit` bytes far."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError("body", f"Content-Length {declared[:20]!r} is not a number", 400)
        if int(declared) > limit:
            raise ApiError("body", f"the body is {declared} bytes; the limit is {limit}", 413)
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/json":
        raise ApiError("body", f"send JSON (Content-Type: application/json), not {kind or 'nothing'}", 415)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError("body", f"the body is over the limit of {limit} bytes", 413)
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ApiError("body", f"the body is not valid JSON ({str(e)[:80]})", 400) from None
    except RecursionError:  # [[[[… nested deeper than the parser's stack, well inside the size limit
        raise ApiError("body", "the body nests arrays or objects too deeply", 400) from None
    if not isinstance(body, dict):
        raise ApiError("body", "the body must be a JSON object", 400)
    return body


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def allowed_hosts(bound: str = "127.0.0.1") -> frozenset[str] | None:
    """The `Host` names a server bound to `bound` answers: that address and the loopback
    names; None (any) for a wildcard address."""
    if bound in WILDCARD_HOSTS:
        return None
    return frozenset({bound.lower().strip("[]"), *LOCAL_HOSTS})


def _port(text: str) -> bool:
    """A TCP port's digits: 0–65535."""
    return text.isascii() and text.isdigit() and len(text) <= 5 and int(text) <= 65535


def _host_name(value: str) -> str | None:
    """`"127.0.0.1:8765"` → `"127.0.0.1"`, `"[::1]:80"` → `"::1"`; None when malformed
    (a port beyond 65535 included)."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1:]
        if end < 0 or (rest and not (rest.startswith(":") and _port(rest[1:]))):
            return None
        return value[1:end]
    name, colon, port = value.partition(":")
    if not name or (colon and not _port(port)):
        return None
    return name


def refusal(headers, hosts: frozenset[str] | None, *, api: bool) -> tuple[str, str] | None:
    """(header, why) when a request must be refused (see the module doc), else None.

    `headers`: a case-insensitive mapping (Starlette's `Headers`); `hosts`: from
    `allowed_hosts`; `api`: the request is for `/api/…`.
    """
    host = headers.get("host")
    name = _host_name(host) if host else None
    if name is None:
        return "host", f"the Host header {str(host)[:80]!r} does not name a server"
    if hosts is not None and name not in hosts:
        return "host", (f"Host {name[:80]!r} is not this server ({', '.join(sorted(hosts))}): a "
                        f"page on another site cannot reach qkv view through a DNS name")
    if not api:
        return None
    origin = headers.get("origin")
    if origin is not None and origin.lower() != f"http://{host.strip().lower()}":
        return "origin", (f"requests from {origin[:80]!r} are refused: the API answers its own "
                          f"page only (http://{host.strip()[:80]})")
    site = headers.get("sec-fetch-site")
    if site is not None and site.lower() not in ("same-origin", "none"):
        return "sec-fetch-site", f"a {site[:40]!r} request is refused: the API answers its own page only"
    return None


class _Guard:
    """ASGI middleware: `refusal` before any route runs."""

    def __init__(self, app, hosts: frozenset[str] | None):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            from starlette.datastructures import Headers

            why = refusal(Headers(scope=scope), self.hosts, api=scope["path"].startswith("/api/"))
            if why is not None:
                await _error(403, *why)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(api: Api, *, static_dir: Path = STATIC_DIR,
               hosts: frozenset[str] | None = allowed_hosts()) -> Starlette:
    """The Starlette app serving `api` and the page. `static_dir` is listed once, here;
    `hosts`: the `Host` names it answers (`allowed_hosts` of the bound address)."""
    files = static_files(static_dir)
    page = page_html(static_dir, page="text" if api.document is None else "document").encode()

    async def index(request: Request) -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=_page_headers())

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in files:  # the list read at start: nothing else is reachable
            return _error(404, "path", f"no static file {name[:80]!r}")
        data, media = files[name]
        return Response(data, media_type=media, headers={"X-Content-Type-Options": "nosniff"})

    async def info(request: Request) -> Response:
        return JSONResponse(api.info())

    async def endpoint(request: Request) -> Response:
        try:
            body = await read_json(request)
            data = await run_in_threadpool(api.answer, request.path_params["endpoint"], body)
        except ApiError as e:
            return JSONResponse(e.to_dict(), status_code=e.status)
        except ClientDisconnect:  # gone, or closed by the read deadline: nobody to answer
            return Response(status_code=408)
        return Response(data, media_type="application/json")

    saved_pages = {name: page_html(static_dir, page=name).encode() for name in SAVED}

    async def saved_page(request: Request) -> Response:
        return Response(saved_pages[request.url.path.strip("/")], media_type="text/html; charset=utf-8",
                        headers=_page_headers())

    async def saved(request: Request) -> Response:
        """A saved result checked: its class's `from_dict` rebuilds it, its `to_dict()` answers."""
        read_back = SAVED[request.url.path.rsplit("/", 1)[1]].from_dict
        try:
            body = await read_json(request, limit=MAX_SAVED_BYTES)
            result = await run_in_threadpool(read_back, body)
        except ApiError as e:
            return JSONResponse(e.to_dict(), status_code=e.status)
        except QkvError as e:  # not the result it claims to be: which field, which value
            return _error(422, "body", str(e))
        except ClientDisconnect:
            return Response(status_code=408)
        return JSONResponse(saved_labelled(result.to_dict()))  # its keys as labels too

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _error(exc.status_code, "path", f"{exc.detail}: {request.method} {request.url.path[:80]}")

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("qkv view: unexpected error on %s", request.url.path)
        return _error(500, None, f"internal error ({type(exc).__name__}); see the server's log")

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/static/{name:path}", static, methods=["GET"]),
        Route("/api/info", info, methods=["GET"]),
        *(Route(f"/{name}", saved_page, methods=["GET"]) for name in SAVED),
        *(Route(f"/api/{name}", saved, methods=["POST"]) for name in SAVED),  # before /api/{endpoint}
        Route("/api/{endpoint}", endpoint, methods=["POST"]),
    ]
    from starlette.middleware import Middleware

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error,
                                                        Exception: server_error},
                     middleware=[Middleware(_Guard, hosts=hosts)])


def _page_headers() -> dict[str, str]:
    # The served page may talk to its own server only; the exported file gets a stricter policy.
    return {"Content-Security-Policy": "default-src 'none'; script-src 'self'; "
            "style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'self'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


# -- running it --------------------------------------------------------------------------------
def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` (0: a free port); QkvError when the port is taken."""
    if not 0 <= port <= 65535:
        raise QkvError(f"--port {port} is out of range (0–65535; 0 picks a free port)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise QkvError(f"port {port} on {host} is in use; pick another with --port N, or "
                           f"--port 0 for a free one") from None
        raise QkvError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


#: seconds a request may take to arrive whole — its line, headers and body — from its first byte
#: (or the connection's opening); a local page sends one in milliseconds
REQUEST_TIMEOUT = 10.0
#: connections still sending a request line or headers; past it the oldest of them is dropped
MAX_UNREAD = 256
#: requests served at once (uvicorn answers 503 beyond it); connections still sending their
#: headers do not count, so they cannot hold the viewer's good clients out
MAX_CONCURRENT = 200


class _ReadDeadline:
    """The limits the viewer adds to uvicorn's h11 protocol (mixed in before it by
    `_protocol`, which sets the class attributes). uvicorn has no deadline for a partial
    request line: 201 connections that sent half a line and waited made every good request a 503
    for as long as they stayed.

    A connection is in one of two states: 1) waiting for a request (new, or kept alive after a
    response) — it does not count towards uvicorn's `limit_concurrency`, and at most
    `max_unread` of them are kept, the longest waiting dropped first; 2) serving one, from its
    headers in to its response complete. From a request's first byte, its line, headers and body
    must arrive within `request_timeout` seconds: else a 408 (a late body: the connection
    closed, which the app reads as the client gone).
    """

    request_timeout: float
    max_unread: int
    waiting_by_server: dict  # id(server state) → {protocol: None}, longest waiting first

    # -- uvicorn's events ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._deadline, self._partial = None, False
        self._waiting = self.waiting_by_server.setdefault(id(self.server_state), {})
        self._idle()
        self._start()  # a connection opened must send its request in time too

    def data_received(self, data: bytes) -> None:
        if not self._serving():
            self._partial = True
            self._start()  # the first byte of the next request: its deadline runs
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self._serving():
            if self in self._waiting and not self.transport.is_closing():
                del self._waiting[self]
                self.connections.add(self)  # headers in: a request being served
            if not self.cycle.more_body:
                self._stop()  # read whole

    def on_response_complete(self) -> None:
        self._stop()
        super().on_response_complete()
        if not self.transport.is_closing():
            self._idle()  # kept alive: uvicorn's keep-alive timeout closes it when idle

    def connection_lost(self, exc) -> None:
        self._waiting.pop(self, None)
        self._stop()
        super().connection_lost(exc)

    # -- states: waiting for a request ↔ serving one ------------------------------------------
    def _idle(self) -> None:
        self.connections.discard(self)
        self._waiting[self] = None
        while len(self._waiting) > self.max_unread:
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            oldest.transport.close()

    def _serving(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    # -- the deadline -------------------------------------------------------------------------
    def _start(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.request_timeout, self._too_slow)

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._partial = None, False

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._partial and not self._serving():  # half a request line or headers: 408
            self._answer_408()
        self.transport.close()

    def _answer_408(self) -> None:
        import h11

        try:
            for event in (h11.Response(status_code=408, headers=[
                              (b"content-type", b"text/plain; charset=utf-8"),
                              (b"connection", b"close")]),
                          h11.Data(data=f"the request did not arrive within "
                                        f"{self.request_timeout:g} s".encode()),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # h11 already in a state that cannot answer
            pass


def _protocol(request_timeout: float, max_unread: int) -> type:
    """uvicorn's h11 protocol with `_ReadDeadline`'s limits: each request must arrive
    within `request_timeout` seconds of its first byte, and at most `max_unread` connections
    wait for one (uvicorn is imported here, when a server is made)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return type("Protocol", (_ReadDeadline, H11Protocol),
                {"request_timeout": request_timeout, "max_unread": max_unread,
                 "waiting_by_server": {}})


def make_server(app, sock: socket.socket, *, log_level: str = "warning",
                request_timeout: float = REQUEST_TIMEOUT, max_unread: int = MAX_UNREAD):
    """A uvicorn server for `app` on `sock` (call `.run(sockets=[sock])`); each request
    must arrive within `request_timeout` seconds (`_protocol`)."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, lifespan="off", access_log=False,
                            timeout_graceful_shutdown=3, limit_concurrency=MAX_CONCURRENT,
                            http=_protocol(request_timeout, max_unread))
    return uvicorn.Server(config)


def serve(app, sock: socket.socket, *, on_started: Callable[[], None] | None = None) -> None:
    """Run `app` on `sock` until Ctrl-C (uvicorn shuts down open connections, then returns)."""
    server = make_server(app, sock)
    if on_started is not None:
        original = server.startup

        async def startup(sockets=None):
            await original(sockets=sockets)
            on_started()

        server.startup = startup
    server.run(sockets=[sock])
