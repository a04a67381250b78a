"""DNS rebinding and cross-site requests: the viewer answers requests that name it (``Host``) and,
for its API, that come from its own page (``Origin``, ``Sec-Fetch-Site``) — over real HTTP, plus a
fuzz of odd Host/Origin headers that must each be refused with a 403 JSON naming the header."""

from __future__ import annotations

import random

import httpx
import pytest
from view_checks import TEXT

from qkv.view.server import allowed_hosts, refusal

BODY = {"text": TEXT, "token": 1, "layer": 0, "head": 0}


def post(served, host: str | None = None, **headers) -> httpx.Response:
    h = {"Host": host or f"127.0.0.1:{served.port}", **headers}
    return httpx.post(served.url + "api/steps", json=BODY, headers=h, timeout=60)


def test_the_own_page_is_served(served):
    for host in (f"127.0.0.1:{served.port}", f"localhost:{served.port}", "LOCALHOST"):
        assert httpx.get(served.url, headers={"Host": host}).status_code == 200
    ok = post(served, Origin=f"http://127.0.0.1:{served.port}", **{"Sec-Fetch-Site": "same-origin"})
    assert ok.status_code == 200 and ok.json()["kind"] == "steps"
    assert post(served).status_code == 200  # curl, a script: no Origin at all


@pytest.mark.parametrize("host", ["attacker.example", f"attacker.example:{8765}", "127.0.0.1.nip.io",
                                  "localhost.attacker.example", "0.0.0.0"])
def test_a_foreign_host_is_refused_everywhere(served, host):
    for r in (httpx.get(served.url, headers={"Host": host}), httpx.get(served.url + "api/info", headers={"Host": host}),
              post(served, host=host)):
        assert r.status_code == 403 and r.json()["error"]["field"] == "host", r.text
        assert "data" not in r.text and "weights" not in r.text


@pytest.mark.parametrize("origin", ["http://attacker.example", "null", "http://127.0.0.1:1",
                                    "https://127.0.0.1:{port}", "http://localhost:{port}"])
def test_a_cross_origin_api_request_is_refused(served, origin):
    r = post(served, Origin=origin.format(port=served.port))
    assert r.status_code == 403 and r.json()["error"]["field"] == "origin", r.text


def test_a_cross_site_fetch_is_refused(served):
    r = post(served, **{"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403 and r.json()["error"]["field"] == "sec-fetch-site"


def test_hosts_follow_the_bound_address():
    assert allowed_hosts("127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    assert "192.168.1.5" in allowed_hosts("192.168.1.5") and allowed_hosts("0.0.0.0") is None
    # bound to every interface: any Host, still same-origin only for the API
    assert refusal({"host": "box.lan:8765"}, None, api=True) is None
    assert refusal({"host": "box.lan:8765", "origin": "http://evil"}, None, api=True)[0] == "origin"


def _fuzzed_hosts(rng: random.Random, n: int) -> list[str]:
    parts = ["attacker.example", "127.0.0.1.attacker", "127.0.0.2", "[::2]", "localhost:x",
             "", " ", "127.0.0.1:", "127.0.0.1:80:80", "[::1", "::1]", "a" * 300, "local host",
             "127.0.0.1@evil", "évil.example", "127.0.0.1/..", "%31%32%37.0.0.1"]
    out = list(parts)
    while len(out) < n:
        out.append(rng.choice(parts) + rng.choice(["", ":8765", ".", "x", ":65536a"]))
    return out


def test_fuzzed_host_headers_are_refused_without_a_500():
    """Every malformed or foreign Host is refused by the rule itself (no server needed)."""
    hosts = allowed_hosts("127.0.0.1")
    for host in _fuzzed_hosts(random.Random(0), 200):
        why = refusal({"host": host}, hosts, api=True)
        assert why is not None and why[0] == "host", repr(host)


def _fuzzed_origins(rng: random.Random, port: int, n: int) -> list[str]:
    """``n`` Origin headers around the page's own, ``http://127.0.0.1:{port}`` (benchmarks/fuzz_cli.py
    draws from this too)."""
    schemes, names = ["http://", "https://", "", "file://", "ws://"], ["127.0.0.1", "localhost", "attacker.example", "[::1]"]
    return [rng.choice(schemes) + rng.choice(names) + rng.choice(["", f":{port}", f":{port + 1}", "/"])
            for _ in range(n)]


def test_fuzzed_origins_over_http(served):
    port = served.port
    for origin in _fuzzed_origins(random.Random(1), port, 30):
        r = post(served, Origin=origin)
        expected = 200 if origin == f"http://127.0.0.1:{port}" else 403
        assert r.status_code == expected, (origin, r.text)
        if expected == 403:
            assert r.json()["error"]["field"] == "origin"
