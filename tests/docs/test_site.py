"""The documentation site: it builds with no warning (``mkdocs build --strict``: a broken link, a page
missing from the nav, a docstring mkdocstrings cannot read fail it); every built page parses as
balanced HTML with nothing leaked from a docstring (a ``<s>`` or ``<del>`` outside code, a raw reST
role such as ``:class:``, a ``>>>`` example or an ``Args:`` header left as prose); and the site
works offline in Chromium — from ``file://`` and from ``python -m http.server``, every non-local
request refused — with a search typed into the box returning pages. The README's links into docs/
point at pages that exist."""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "WARNING" not in run.stderr, run.stderr[-4000:]
    return out


def test_the_site_builds_strict(site):
    api = (site / "api" / "attention.html").read_text(encoding="utf-8")
    assert "scaled_dot_product_attention" in api and "doc-object" in api  # the reference was generated


# ---------------------------------------------------------------- every page, parsed

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
CODE = {"code", "pre", "script", "style", "textarea", "svg"}
STRUCK = {"s", "del", "strike"}
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|ref):")
SECTION = re.compile(r"^\s*(?:Args|Arguments|Returns|Raises|Yields|Example|Examples|Attributes|Fields):\s")


class PageCheck(HTMLParser):
    """The findings of one page: leaked struck-through tags, raw roles, prose doctests and
    section headers, and elements closed out of order or never closed."""

    def __init__(self, name: str):
        super().__init__(convert_charrefs=True)
        self.name, self.stack, self.findings = name, [], []

    def found(self, what: str) -> None:
        self.findings.append(f"{self.name}:{self.getpos()[0]}: {what}")

    def in_code(self) -> bool:
        return any(tag in CODE for tag, _ in self.stack)

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        if tag in STRUCK and not self.in_code():
            self.found(f"<{tag}> outside code (text from here on is struck through)")
        self.stack.append((tag, self.getpos()[0]))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if self.stack and self.stack[-1][0] == tag:
            self.stack.pop()
        elif any(t == tag for t, _ in self.stack):
            while self.stack[-1][0] != tag:
                open_tag, line = self.stack.pop()
                self.found(f"</{tag}> closes <{open_tag}> of line {line}, never closed")
            self.stack.pop()
        else:
            self.found(f"</{tag}> closes nothing")

    def handle_data(self, data):
        if self.in_code():
            return
        if (m := ROLE.search(data)):
            self.found(f"raw reST role {m.group(0)!r} in {data.strip()[:60]!r}")
        if data.lstrip().startswith(">>>"):
            self.found(f"a doctest as prose: {data.strip()[:60]!r}")
        if SECTION.match(data):
            self.found(f"a docstring section left as prose: {data.strip()[:60]!r}")

    def close(self):
        super().close()
        for tag, line in self.stack:
            self.found(f"<{tag}> of line {line} never closed")


def page_findings(site: Path) -> list[str]:
    findings = []
    for page in sorted(site.rglob("*.html")):
        check = PageCheck(str(page.relative_to(site)))
        check.feed(page.read_text(encoding="utf-8"))
        check.close()
        findings += check.findings
    return findings


def test_every_page_is_well_formed(site):
    findings = page_findings(site)
    assert not findings, f"{len(findings)} findings:\n" + "\n".join(findings[:60])


def test_the_check_sees_a_leaked_tag_and_a_raw_role():
    check = PageCheck("x.html")
    check.feed('<p>x = ["<s>", "a"]</p><p>see :class:<code>Overview</code></p><pre><code>"<s>"</code></pre>')
    check.close()
    assert any("<s> outside code" in f for f in check.findings)
    assert any("raw reST role ':class:'" in f for f in check.findings)
    assert any("</p> closes <s>" in f for f in check.findings)


# ---------------------------------------------------------------- offline, in Chromium

def chromium():
    sync_api = pytest.importorskip("playwright.sync_api")
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("no chromium on the PATH (Debian's chromium package)")
    return sync_api, path


@pytest.fixture(scope="module")
def http_server(site):
    """``python -m http.server`` serving the built site on a free local port."""
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                               "--directory", str(site)], stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
        port = re.search(r"port (\d+)", line)
        assert port, line
        yield f"http://127.0.0.1:{port.group(1)}/"
    finally:
        server.terminate()
        server.wait(10)


def is_local(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("file", "data", "blob", "about") or parts.hostname in ("127.0.0.1", "localhost")


@pytest.mark.parametrize("served", ["file", "http.server"])
def test_the_site_works_offline_search_included(site, served, request):
    sync_api, path = chromium()
    base = site.as_uri() + "/" if served == "file" else request.getfixturevalue("http_server")
    refused, problems = [], []
    # in a thread of its own: Playwright's sync API refuses a thread where an asyncio loop runs
    # (an earlier test in the same pytest worker may leave one)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(_search_offline, sync_api, path, base, refused, problems).result()
    if refused:
        problems.append(f"requests to the network: {sorted(set(refused))}")
    assert not problems, problems


def _search_offline(sync_api, path: str, base: str, refused: list, problems: list) -> None:
    """Open ``base``'s front page in Chromium with every non-local request refused (kept in
    ``refused``), type a search and check its results and the first code block's width."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=[
            "--no-sandbox", "--disable-background-networking", "--disable-component-update"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})

            def route(r):
                if is_local(r.request.url):
                    r.continue_()
                else:
                    refused.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.goto(base + "index.html")
            box = page.locator("input.md-search__input")
            results = page.locator(".md-search-result__item")
            try:
                # the search index is built in a worker from the whole site (the API pages are
                # large): on a busy 2-core machine that takes tens of seconds, so wait long
                box.click(timeout=120_000)
                box.press_sequentially("attention mask")
                results.first.wait_for(timeout=120_000)
                if "attention" not in results.first.inner_text().lower():
                    problems.append(f"the first result is not about attention: {results.first.inner_text()!r}")
            except sync_api.TimeoutError as e:
                problems.append(f"search: {str(e).splitlines()[0]} (the box or its results never showed)")
            # the front page's first command line fits its box (no horizontal scroll)
            widths = page.evaluate("() => { const c = document.querySelector('.md-content pre code');"
                                   " return [c.scrollWidth, c.clientWidth]; }")
            if widths[0] > widths[1]:
                problems.append(f"the front page's first code block scrolls: {widths[0]} px in {widths[1]}")
        finally:
            browser.close()


def test_the_readme_links_to_pages_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 9
    for link in links:
        assert (ROOT / link).is_file(), link
