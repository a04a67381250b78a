"""``qkv view`` under load and in a browser: latency, memory, time to first paint, head switches.

Four measurements, each against a peer taken in the same run (the machine is shared and noisy):

1. **load**: a real ``qkv view`` server (its own process, one torch thread) and N clients × M
   requests each (httpx, one thread per client), mixing ``steps``/``map``/``overview`` over
   every layer, head and token of the example sentence. Reported: errors, median and p99
   latency, requests per second, the server's resident memory (VmRSS) before and after and its
   peak (VmHWM). Peer: the same requests answered by the library directly
   (``Api.handle`` in this process, no HTTP, no cache) — the ratio says what HTTP, JSON and the
   thread pool add.
2. **first paint**: from starting ``qkv view TEXT --no-browser`` to the URL being printed
   (the model loaded), then from navigating chromium to it to the first contentful paint and to
   the step panel's numbers being on screen.
3. **head switch at 512 tokens**: a 512-token text; the first head shown (its one forward for
   every head's map), then K clicks on other heads, each timed from the click to the new head's
   heat map drawn (from Playwright's click, and inside the page: the map's fetch + drawing, which
   leaves out Playwright's own overhead); and token switches (a new overview: one forward). Peer: the library's own
   ``attention_map`` for one head on the same text (what a naive per-head server would pay).
4. **page memory**: chromium's JS heap (CDP ``Performance.getMetrics``) after the 512-token page.

5. **a long document** (``--document N``, ``qkv view --file``): a random Llama (4 layers, 8 heads,
   d_model 256: issue 20's shape) reading MiniLM's tokenizer, N tokens of random words; K clicks
   on tokens of the strip, each timed from the click to ``document.body.dataset.state ==
   "ready"`` (Playwright) and inside the page (the overview's fetch + drawing). Peer: the
   library's ``Document.explain`` for the same tokens.

    python benchmarks/view.py                 # 20 clients × 50 requests, 10 head switches
    python benchmarks/view.py --quick         # 5 × 10, 3 switches
    python benchmarks/view.py --document 8192 --switches 20   # only the long document's page
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXT = "The dog found some pizza next to the baby and ate it"
WORDS = ("the cat sat on the mat while a dog found some pizza next to the baby and ate it after "
         "the storm passed over the quiet town near the river").split()


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def start_server(text: str | None = None) -> tuple[subprocess.Popen, str, float]:
    """``qkv view`` in its own process (one torch thread); (process, URL, seconds to the URL)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "qkv", "view", "--port", "0", "--no-browser"] + ([text] if text else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    url = re.search(r"http://\S+", line)
    if url is None:  # it failed to start: leave no process behind, show why
        stop(proc)
        sys.exit(f"qkv view did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, url[0], time.perf_counter() - t0


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (uvicorn shuts down cleanly on it), then a kill if it still runs after 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def requests_for(client: int, count: int) -> list[tuple[str, dict]]:
    out = []
    for k in range(count):
        layer, head, token = (client + k) % 6, (client * 7 + k) % 12, (client * 3 + k) % 14
        endpoint = ("steps", "map", "overview")[k % 3]
        body = {"text": TEXT, "layer": layer, "head": head, "token": token}
        if endpoint == "map":
            del body["token"]
        if endpoint == "overview":
            body = {"text": TEXT, "token": token}
        out.append((endpoint, body))
    return out


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def load_test(clients: int, per_client: int) -> dict:
    import httpx

    proc, url, _ = start_server()
    base = url.split("?")[0]
    try:
        httpx.post(base + "api/overview", json={"text": TEXT}, timeout=120)  # warm: first forward
        before = rss_kib(proc.pid)
        latencies, errors, lock = [], [], threading.Lock()

        def client(c: int) -> None:
            with httpx.Client(base_url=base, timeout=300) as http:
                for endpoint, body in requests_for(c, per_client):
                    t = time.perf_counter()
                    r = http.post("api/" + endpoint, json=body)
                    dt = time.perf_counter() - t
                    with lock:
                        latencies.append(dt)
                        if r.status_code != 200:
                            errors.append((endpoint, r.status_code))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        after = rss_kib(proc.pid)
    finally:
        stop(proc)

    # the peer: the same requests, answered by the library in this process (no HTTP, no cache)
    import torch

    from qkv.view.api import Api, Models

    torch.set_num_threads(1)
    api = Api(Models(["minilm"]))
    api.handle("overview", {"text": TEXT})
    direct = []
    for c in range(min(clients, 4)):
        for endpoint, body in requests_for(c, per_client):
            t = time.perf_counter()
            api.handle(endpoint, body)
            direct.append(time.perf_counter() - t)
    return {"requests": len(latencies), "errors": len(errors), "median_ms": 1e3 * statistics.median(latencies),
            "p99_ms": 1e3 * percentile(latencies, 99), "rps": len(latencies) / wall,
            "rss_before_mib": before[0] / 1024, "rss_after_mib": after[0] / 1024,
            "peak_mib": after[1] / 1024, "direct_median_ms": 1e3 * statistics.median(direct),
            "direct_serial_rps": len(direct) / sum(direct)}


def browser_test(switches: int) -> dict:
    from playwright.sync_api import sync_playwright

    long_text = " ".join(WORDS[i % len(WORDS)] for i in range(510))  # 512 tokens with [CLS]/[SEP]
    out = {}
    proc, url, to_url = start_server(TEXT)
    out["launch_to_url_s"] = to_url
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"))
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#steps-table", timeout=300_000)
            out["navigate_to_numbers_s"] = time.perf_counter() - t0
            out["first_contentful_paint_ms"] = page.evaluate(
                "() => performance.getEntriesByName('first-contentful-paint')[0]?.startTime")

            base = url.split("?")[0]
            t0 = time.perf_counter()
            page.goto(base + "?" + urllib.parse.urlencode({"text": long_text}))
            page.wait_for_selector("#steps-table", timeout=300_000)
            out["long_open_s"] = time.perf_counter() - t0
            out["long_tokens"] = page.evaluate("() => window.qkvView.data.overview.tokens.length")
            shown = "(k) => { const m = window.qkvView.data.map; return m && m.layer + ':' + m.head === k; }"
            times, inpage = [], []
            for k in range(switches + 1):
                layer, head = (k * 5 + 1) % 6, (k * 7 + 3) % 12
                t = time.perf_counter()
                page.click(f'#grid button.cell[data-layer="{layer}"][data-head="{head}"]')
                page.wait_for_function(shown, arg=f"{layer}:{head}", timeout=300_000)
                times.append(time.perf_counter() - t)
                timing = page.evaluate("() => window.qkvView.data.timings")
                inpage.append(timing["map_ms"] + timing["draw_ms"])
                # let the step panel's request (one forward at 512 tokens) finish, as a reader would
                page.wait_for_function(f"() => document.querySelector('#steps-body p').textContent"
                                       f".includes('Layer {layer}, head {head},')", timeout=300_000)
            out["first_head_s"] = times[0]  # the page's opening already computed every head's map
            out["head_switch_ms"] = [1e3 * x for x in times[1:]]
            out["head_switch_inpage_ms"] = inpage[1:]
            tok = []
            for k in range(3):
                t = time.perf_counter()
                page.click(f'#tokens button[data-token="{100 + 50 * k}"]')
                page.wait_for_function(f"() => document.querySelector('#steps-body p').textContent.includes('token {100 + 50 * k} ')",
                                       timeout=300_000)
                tok.append(time.perf_counter() - t)
            out["token_switch_s"] = tok
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
            out["js_heap_mib"] = metrics["JSHeapUsedSize"] / 2**20
            out["dom_nodes"] = int(metrics["Nodes"])
            browser.close()
        out["server_peak_mib"] = rss_kib(proc.pid)[1] / 1024
    finally:
        stop(proc)

    # the peer: one head's map straight from the library (a forward per head, no cache)
    import torch

    import qkv
    from qkv.explain import attention_map

    torch.set_num_threads(1)
    model = qkv.load("minilm")
    t = time.perf_counter()
    attention_map(model, long_text, layer=1, head=3)
    out["library_one_head_map_s"] = time.perf_counter() - t
    return out


def decoder_test(switches: int) -> dict:
    """A 2,048-token input on a decoder with GPT-2 small's depth and heads (12 layers × 12 heads,
    causal, 2,048 positions; random weights, d_model 384 — no decoder checkpoint is on this machine),
    served in a thread of this process. Over 512 tokens no whole map is kept: the head view draws
    the selected token's row from the overview (every head's row: 144 × 2,048 numbers)."""
    import torch
    from playwright.sync_api import sync_playwright

    import qkv
    from qkv.explain import explain
    from qkv.models.llama import LlamaConfig, LlamaModel
    from qkv.models.tokenizer import Tokenizer
    from qkv.view.api import Api, Models
    from qkv.view.server import bind, create_app, make_server, url_of

    torch.set_num_threads(1)
    bert = qkv.load("minilm")
    tokenizer = Tokenizer(bert.tokenizer._tok, name="minilm's tokenizer", max_length=None)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=384, intermediate_size=1536,
                         num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=2048)
    model = LlamaModel(config, tokenizer=tokenizer, name="decoder-2048").eval()
    text = " ".join(WORDS[i % len(WORDS)] for i in range(2046))  # 2,048 tokens with [CLS]/[SEP]
    sock = bind("127.0.0.1", 0)
    server = make_server(create_app(Api(Models(["decoder-2048"], loader=lambda name: model))), sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    out = {}
    try:
        while not server.started:
            if not thread.is_alive():
                sys.exit("the server did not start")
            time.sleep(0.05)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"))
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(url_of(sock) + "?" + urllib.parse.urlencode({"text": text, "token": 1000}))
            page.wait_for_selector("#steps-table", timeout=600_000)
            out["open_s"] = time.perf_counter() - t0
            out["tokens"] = page.evaluate("() => window.qkvView.data.overview.tokens.length")
            inpage = []
            for k in range(switches):
                layer, head = (k * 5 + 1) % 12, (k * 7 + 3) % 12
                page.click(f'#grid button.cell[data-layer="{layer}"][data-head="{head}"]')
                page.wait_for_function("(k) => { const m = window.qkvView.data.map; return m && m.layer + ':' + m.head === k; }",
                                       arg=f"{layer}:{head}", timeout=600_000)
                timing = page.evaluate("() => window.qkvView.data.timings")
                inpage.append(timing["map_ms"] + timing["draw_ms"])
                page.wait_for_function(f"() => document.querySelector('#steps-body p').textContent"
                                       f".includes('Layer {layer}, head {head},')", timeout=600_000)
            out["head_switch_inpage_ms"] = inpage
            t = time.perf_counter()
            page.click('#tokens button[data-token="1500"]')
            page.wait_for_function("() => document.querySelector('#steps-body p').textContent.includes('token 1500 ')",
                                   timeout=600_000)
            out["token_switch_s"] = time.perf_counter() - t
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
            out["js_heap_mib"] = metrics["JSHeapUsedSize"] / 2**20
            browser.close()
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
    t = time.perf_counter()
    explain(model, text, token="1500")
    out["library_overview_s"] = time.perf_counter() - t
    return out


def document_test(tokens: int, switches: int) -> dict:
    """Token switches in ``qkv view --file``'s page at ``tokens`` tokens (see the module doc, 5)."""
    import copy
    import random

    import torch
    from playwright.sync_api import sync_playwright

    import qkv
    from qkv.explain.long.document import document
    from qkv.models.llama import LlamaConfig, LlamaModel
    from qkv.view.api import Api, Models
    from qkv.view.server import bind, create_app, make_server, url_of

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = copy.copy(qkv.load("minilm").tokenizer)
    tokenizer.max_length = tokens
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=8, max_position_embeddings=tokens)
    model = LlamaModel(config, tokenizer=tokenizer, name="llama-4x256").eval()
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(tokens - 2))  # one token a word, + [CLS], [SEP]
    t = time.perf_counter()
    doc = document(model, text)
    out = {"tokens": len(doc), "document_s": time.perf_counter() - t, "click_ms": [], "inpage_ms": []}
    api = Api(Models(["llama-4x256"], loader=lambda name: model), document=doc)
    sock = bind("127.0.0.1", 0)
    server = make_server(create_app(api), sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    ready = "() => document.body.dataset.state === 'ready'"
    try:
        while not server.started:
            time.sleep(0.05)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"))
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t = time.perf_counter()
            page.goto(url_of(sock))
            page.wait_for_function(ready, timeout=300_000)
            out["open_s"] = time.perf_counter() - t
            page.evaluate("() => { document.getElementById('strip').scrollTop = 0; }")
            page.wait_for_selector('#strip button[data-token="1"]')
            chosen = []
            for k in range(switches):  # a new token each time (no cached answer), in sight
                seen = page.eval_on_selector_all("#strip button", "bs => bs.map(b => Number(b.dataset.token))")
                token = rng.choice([i for i in seen if i not in chosen])
                chosen.append(token)
                t = time.perf_counter()
                page.click(f'#strip button[data-token="{token}"]')
                page.wait_for_function(ready, timeout=60_000)
                out["click_ms"].append(1e3 * (time.perf_counter() - t))
                out["inpage_ms"].append(page.evaluate("() => window.qkvDocument.data.timings.switch_ms"))
            out["dom_nodes"] = page.evaluate("() => document.getElementsByTagName('*').length")
            browser.close()
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
    library = []
    for token in chosen:
        t = time.perf_counter()
        doc.explain(token=str(token))
        library.append(1e3 * (time.perf_counter() - t))
    out["library_ms"] = library
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--decoder-only", action="store_true", help="only the 2,048-token decoder part")
    ap.add_argument("--document", type=int, default=None, metavar="N",
                    help="only the long document's page (qkv view --file) at N tokens")
    ap.add_argument("--switches", type=int, default=20, help="token switches for --document")
    args = ap.parse_args()
    if args.document is not None:
        d = document_test(args.document, args.switches)
        c, i, lib = d["click_ms"], d["inpage_ms"], d["library_ms"]
        print(f"long document: {d['tokens']} tokens, llama 4 layers × 8 heads, d_model 256 (random); "
              f"Document built in {d['document_s']:.1f} s; page open {d['open_s']:.2f} s; {d['dom_nodes']} DOM nodes")
        print(f"  token switch, click → state ready: median {statistics.median(c):.0f} ms, max {max(c):.0f} ms "
              f"over {len(c)}; in the page (fetch + draw): median {statistics.median(i):.0f} ms, max {max(i):.0f} ms")
        print(f"  peer: the library's Document.explain for the same tokens: median {statistics.median(lib):.0f} ms, "
              f"max {max(lib):.0f} ms")
        return
    clients, per, switches = (5, 10, 3) if args.quick else (20, 50, 10)
    if not args.decoder_only:
        report(clients, per, switches)
    d = decoder_test(3 if args.quick else 5)
    print(f"2,048-token decoder ({d['tokens']} tokens, 12 layers × 12 heads, random weights): page open "
          f"{d['open_s']:.1f} s; head switch in the page (the token's row, no fetch) median "
          f"{statistics.median(d['head_switch_inpage_ms']):.0f} ms; token switch {d['token_switch_s']:.1f} s; "
          f"JS heap {d['js_heap_mib']:.1f} MiB")
    print(f"  peer: the library's explain() for one token on the same text {d['library_overview_s']:.1f} s")


def report(clients: int, per: int, switches: int) -> None:
    load = load_test(clients, per)
    print(f"load: {clients} clients × {per} requests = {load['requests']}, errors {load['errors']}")
    print(f"  HTTP latency median {load['median_ms']:.1f} ms, p99 {load['p99_ms']:.1f} ms, "
          f"{load['rps']:.1f} requests/s")
    print(f"  library directly (same requests, serial, no cache): median {load['direct_median_ms']:.1f} ms, "
          f"{load['direct_serial_rps']:.1f} requests/s; ratio HTTP median / direct median "
          f"{load['median_ms'] / load['direct_median_ms']:.2f}")
    print(f"  server memory: {load['rss_before_mib']:.0f} MiB before, {load['rss_after_mib']:.0f} MiB after, "
          f"peak {load['peak_mib']:.0f} MiB")
    b = browser_test(switches)
    hs = b["head_switch_ms"]
    print(f"first paint: qkv view → URL printed (model loaded) {b['launch_to_url_s']:.2f} s; "
          f"navigation → first contentful paint {b['first_contentful_paint_ms']:.0f} ms, → numbers on screen "
          f"{b['navigate_to_numbers_s']:.2f} s")
    print(f"512 tokens ({b['long_tokens']}): page open {b['long_open_s']:.2f} s (overview, every head's map in "
          f"one forward, steps); first switch {b['first_head_s']:.2f} s; head switch median {statistics.median(hs):.0f} ms, "
          f"max {max(hs):.0f} ms over {len(hs)} (in the page, fetch + draw: median "
          f"{statistics.median(b['head_switch_inpage_ms']):.0f} ms); token switch {', '.join(f'{x:.2f}' for x in b['token_switch_s'])} s")
    print(f"  peer: the library's attention_map for one head at 512 tokens {b['library_one_head_map_s']:.2f} s "
          f"(ratio to the viewer's median head switch: {1e3 * b['library_one_head_map_s'] / statistics.median(hs):.0f}× "
          f"click to screen, {1e3 * b['library_one_head_map_s'] / statistics.median(b['head_switch_inpage_ms']):.0f}× in the page)")
    print(f"page memory (512 tokens): JS heap {b['js_heap_mib']:.1f} MiB, {b['dom_nodes']} DOM nodes; "
          f"server peak {b['server_peak_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
