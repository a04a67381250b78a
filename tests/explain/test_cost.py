"""The cost model (qkv.explain.cost): its estimate against the measured peak, the one-line refusal,
and the one row-block function both the short-text and the long-text paths ask."""

import json
import os
import subprocess
import sys

import pytest
import torch

import qkv
from tolerance import assert_within
from qkv.attention.functional import attention_trace
from qkv.errors import QkvError
from qkv.explain import forward
from qkv.explain.cost import (
    EVERY, FIRST_CALL_BYTES, HEAD, check_fits, forward_bytes, map_cost, whole_maps_fit,
    whole_maps_units,
)
from qkv.explain.forward import trace_layer
from qkv.explain.long.document import document

SENTENCE = "the cat sat on the mat "  # 6 MiniLM tokens; [CLS] and [SEP] make 6k + 2


@pytest.fixture(scope="module")
def model():
    return qkv.load("minilm")


PEAK = """
import json, sys
import torch, qkv
from qkv.explain.cost import map_cost
from qkv.explain.maps import attention_map, attention_maps
def status(key):  # bytes (kB in /proc/self/status)
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
torch.set_num_threads(1)
model = qkv.load("minilm")
request, text = sys.argv[1], sys.argv[2]
attention_maps(model, "the cat sat")  # torch's own first-call buffers are not the request's
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident set (VmHWM) starts again from now
before = status("VmRSS:")
m = attention_maps(model, text) if request == "every" else attention_map(model, text, layer=2, head=3)
t = m.weights.shape[-1]
cost = map_cost(model, t, {"every": "every layer's maps", "head": "one head's map"}[request], layer=2)
print(json.dumps({"peak": status("VmHWM:") - before, "estimate": cost.bytes, "t": t}))
"""


@pytest.mark.parametrize("request_, repeats", [("every", 42), ("every", 85), ("head", 85)])
def test_the_estimate_covers_the_peak(model, tmp_path, request_, repeats):
    """Measured in a fresh process (VmHWM, reset after a first call): 254 and 512 tokens, every
    layer's maps (72 of them: 19 and 75 MB) and one head's. The estimate is never under the peak,
    and over it by at most what it counts that need not be live at the peak — the forward (over
    before the rows are computed), a block's working set, the maps' one temporary copy (the stack
    of every layer's, or the finite check's |w|: not both at once). Measured (loaded machine):
    every 254: 68–76 MB peak, 98 estimated; every 512: 248–288 (from run to run), 347; head 512: 20, 62."""
    script = tmp_path / "peak.py"
    script.write_text(PEAK)
    out = subprocess.run([sys.executable, str(script), request_, SENTENCE * repeats], check=True,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    t = got["t"]
    assert t == 6 * repeats + 2
    estimate = got["estimate"] - FIRST_CALL_BYTES  # the process above has paid the first call
    cost = map_cost(model, t, EVERY if request_ == "every" else HEAD, layer=2)
    idle = forward_bytes(model, t) + cost.block_bytes + cost.result_bytes
    assert got["peak"] <= estimate <= got["peak"] + idle, got


REFUSED = """
import resource, sys
import qkv
from qkv.errors import QkvError
from qkv.explain.maps import attention_maps
model = qkv.load("minilm")
attention_maps(model, "the cat sat")  # threads and first-call buffers: mapped before the limit
mapped = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + 32 * 2**20, resource.RLIM_INFINITY))
try:
    attention_maps(model, sys.argv[1])
except QkvError as e:
    print(e)
"""


def test_a_request_over_the_memory_is_refused_in_one_line(model, tmp_path):
    """Every layer's maps of 512 tokens (~200 MB) in a process with 32 MiB of address space left
    (`ulimit -v`): refused before the forward, naming the length, the estimate, the memory and
    document(), instead of the allocator failing mid-way."""
    script = tmp_path / "refused.py"
    script.write_text(REFUSED)
    out = subprocess.run([sys.executable, str(script), SENTENCE * 85], check=True,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    message = out.stdout.strip()
    need = map_cost(model, 512, EVERY).bytes / 2**30
    assert "\n" not in message and message.startswith("every layer's maps of all-MiniLM-L6-v2 over "
                                                      "512 tokens would take about"), message
    assert f"{need:.2f} GiB (72 maps of 512 × 512" in message and "GiB is available" in message
    assert message.endswith("qkv.explain.long.document.document() (O(N) memory)")


def test_check_fits_names_the_request(model):
    cost = map_cost(model, 100, HEAD, layer=0)
    check_fits(model, cost, cost.bytes)  # exactly enough: no error
    check_fits(model, cost, None)  # memory not known: nothing refused
    with pytest.raises(QkvError, match=r"^one head's map of .* over 100 tokens would take about "
                                       r"0.07 GiB \(1 map of 100 × 100, q, k, lse and a block of rows\) "
                                       r"but 0.00 GiB is available; read a long text with "):
        check_fits(model, cost, 1000)


def test_the_viewer_sends_whole_maps_by_their_bytes(model):
    """MiniLM's 72 maps up to 48 tokens (WHOLE_MAPS_BYTES); a model with fewer heads, longer."""
    assert whole_maps_units(model) == 48
    assert whole_maps_fit(model, 48) and not whole_maps_fit(model, 49)
    assert whole_maps_units(qkv.load("lm")) > 48


def test_both_callers_of_the_row_blocks_give_the_reference_paths_rows(model, monkeypatch):
    """LayerLse.weights (a map) and Document.row_weights (a long text) both go through
    block_weights; with blocks of 3 rows (and a shorter last one) each is as close to the float64
    reference on the same recorded q and k as the whole float32 trace is (the rule of
    tests/tolerance.py), and the two callers agree bit for bit on every head's rows."""
    text = SENTENCE * 3  # 20 tokens: 6 blocks of 3, one of 2
    (rec,) = trace_layer(model, text, 2)
    q, k, mask, scale = rec.record.query, rec.record.key, rec.record.mask, rec.record.scale  # (1, h, t, d), (1, h_kv, s, d)
    plain = attention_trace(q, k, k, mask=mask, scale=scale).weights[0]  # (h, t, s)
    ref = attention_trace(q.double(), k.double(), k.double(), mask=mask, scale=scale).weights[0]
    monkeypatch.setattr(forward, "BLOCK_NUMBERS", 3 * k.shape[2])
    short = rec.weights(list(range(q.shape[1])))  # (h, t, s)
    assert_within(short, ref, plain, what="LayerLse.weights")
    doc = document(model, text)
    assert torch.equal(doc.row_weights(2, range(len(doc))), short)
    rows = [19, 0, 7]  # one head alone: its own call, as close to the reference
    assert_within(doc.weights(2, 5, rows), ref[5, rows], plain[5, rows], what="Document.weights")
