"""Fixtures of the viewer's tests: a server in a thread, Debian's chromium driven by Playwright.

The browser is the ``chromium`` package (``make setup`` installs it where it can); Playwright's
own browser download is never used. A machine without chromium **fails** these tests — CI must
run them — unless ``QKV_SKIP_BROWSER_TESTS=1`` says, on a developer's machine, to skip them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

import pytest
from view_checks import DECODER, long_text, tiny_decoder

SKIP_VARIABLE = "QKV_SKIP_BROWSER_TESTS"
MAP_TOKENS = 64  # the served app keeps whole maps up to 64 tokens (512 in qkv view), to test both paths


@dataclass
class Served:
    api: object
    url: str  # http://127.0.0.1:PORT/
    port: int


@pytest.fixture(scope="session")
def served(model):
    """The viewer's app on a free port of 127.0.0.1, uvicorn in a thread (minilm + translate)."""
    import qkv
    from qkv.view.api import Api, Models

    models = Models(["minilm", "translate", DECODER],
                    loader=lambda name: model if name == "minilm" else tiny_decoder(model)
                    if name == DECODER else qkv.load(name))
    with serving(Api(models, map_tokens=MAP_TOKENS)) as s:
        yield s


LONG = "long-decoder"
LONG_TOKENS = 3000  # "a few thousand tokens": the page's token strip and block map at scale


@pytest.fixture(scope="module")
def long_document(model):
    """The Document of a ~3,000-token text read by a random Llama decoder (tiny_decoder with
    4,096 positions)."""
    from qkv.explain.long.document import document

    return document(tiny_decoder(model, positions=4096, name=LONG), long_text(LONG_TOKENS - 2))


@pytest.fixture(scope="module")
def document_served(long_document):
    """``qkv view --file``'s app for ``long_document`` on a free port of 127.0.0.1."""
    from qkv.view.api import Api, Models

    api = Api(Models([LONG], loader=lambda name: long_document.model), document=long_document)
    with serving(api) as s:
        yield s


READER_TEXT = ("The dog found some pizza next to the baby and ate it.\n\n"
               "Then the cat sat on the mat, and the baby laughed.\n") * 6


@pytest.fixture(scope="module")
def reader_document_served():
    """(``qkv view --file``'s app, its Document) on the shipped reader — byte-level BPE, so its
    tokens are "Ġ"-marked words and "Ċ" newlines — reading :data:`READER_TEXT` (~150 tokens)."""
    import qkv
    from qkv.explain.long.document import document
    from qkv.view.api import Api, Models

    doc = document(qkv.load("reader"), READER_TEXT)
    with serving(Api(Models(["reader"], loader=lambda name: doc.model), document=doc)) as s:
        yield s, doc


@pytest.fixture(scope="module")
def sparse_served(tmp_path_factory):
    """(the viewer's app, the model) on a tiny random deepseek_v32 (sparse indexed attention)
    saved by transformers (`tests/hf/hybrids.py`)."""
    pytest.importorskip("transformers")  # the qkv[hf] extra
    import qkv
    from hybrids import save_hybrid
    from qkv.view.api import Api, Models

    path = tmp_path_factory.mktemp("deepseek_v32")
    save_hybrid("deepseek_v32", path)
    model = qkv.load(path)
    with serving(Api(Models(["deepseek_v32"], loader=lambda name: model))) as s:
        yield s, model


@pytest.fixture(scope="module")
def gated_served(tmp_path_factory):
    """(the viewer's app, the model) on `tests/hf/closed_gate.py`'s qwen3_5: head 1 of layer 1
    with its output gate closed."""
    pytest.importorskip("transformers")  # the qkv[hf] extra
    import qkv
    from closed_gate import save_gated
    from qkv.view.api import Api, Models

    path = tmp_path_factory.mktemp("qwen3_5_closed")
    save_gated(path, close=True)
    model = qkv.load(path)
    with serving(Api(Models(["qwen3_5"], loader=lambda name: model))) as s:
        yield s, model


@contextlib.contextmanager
def serving(api):
    """``api``'s app on a free port of 127.0.0.1, uvicorn in a thread, until the block ends."""
    from qkv.view.server import bind, create_app, make_server, url_of

    sock = bind("127.0.0.1", 0)
    server = make_server(create_app(api), sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:  # stopped and the port freed however the session ends, a failed start included
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield Served(api=api, url=url_of(sock), port=sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if os.environ.get(SKIP_VARIABLE) == "1":
        pytest.skip(f"{SKIP_VARIABLE}=1: browser tests skipped on this machine")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("no chromium on PATH: the viewer's browser tests need Debian's chromium package "
                    f"(make setup installs it); set {SKIP_VARIABLE}=1 to skip them locally")
    return path


@pytest.fixture(scope="session")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path)
        try:
            yield b
        finally:
            b.close()


@dataclass
class Watched:
    """A page, with every request it made, the ones refused, and its errors."""

    page: object
    requests: list
    outside: list
    errors: list


@pytest.fixture
def watched(browser):
    """A fresh page whose requests may go to 127.0.0.1 (or the file opened) only; console errors
    and page errors fail the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    requests, outside, errors = [], [], []

    def route(r):
        url = urlparse(r.request.url)
        if url.scheme == "file" or (url.scheme == "http" and url.hostname == "127.0.0.1"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    try:
        page = context.new_page()
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        yield Watched(page, requests, outside, errors)
    finally:
        context.close()
    assert not outside, f"requests that left 127.0.0.1: {outside}"
    assert not errors, f"errors in the page: {errors}"
