"""Random problems for qkv's C++ interval kernel against a float64 dense reference (issue 40).

    .venv/bin/python benchmarks/fuzz_kernel.py [--cases 500] [--seed 0] [--only N,M,...]

Each case draws, from its own seed (``--only N,M`` reruns cases N and M alone):

* shapes: batch 1-2, key heads 1-3, query heads 1-3 per key head (grouped-query attention),
  head dims 1-72 (odd ones included), 40-330 query rows (below ``MIN_ROWS`` the spans path
  answers), keys as many or 24-330 others;
* a mask whose rows each keep one interval of keys: a sliding window (either alignment, one- or
  two-sided), causality, packed documents (per batch row or shared), and intersections of them;
* dtype: float32 mostly (the kernel's), now and then float64 or bfloat16 (the spans path must
  take those);
* threads: 1-4 (the backward splits query tiles into runs when pairs are fewer than threads);
* scale: 1/√d, or one drawn from 0 to 2;
* layouts for q, k, v, out and dout: contiguous, transposed (b, n, h, d), expanded along the rows
  (stride 0), expanded over heads or over the batch, overlapping rows (``as_strided``), a slice
  of wider rows, every other element of the last dim, a size-1 dim with an odd stride;
* the pass: the kernel's forward and backward called directly (out and dout in odd layouts,
  with or without a gradient reaching lse), or ``qkv.scaled_dot_product_attention`` with a
  block mask under autograd, reduced by ``sum(dim=2)`` (autograd hands an expanded dout) or by
  a random weighting (of out, or of out transposed to (b, t, h, d): a transposed dout; and of
  lse where the case draws a gradient reaching it).

The contract, per case: out, lse, dq, dk and dv within the derived tolerance of the float64
answer — ``factor`` × the error that the plain float32 (or the case's dtype) reference path
makes on the same numbers + 2 ulp (tests/tolerance.py; factor 4 for the forward, 8 for
gradients, as tests/attention/test_kernel.py derives) — and, for the gradients, where the
kernel ran, × the error of the spans path it replaces where larger (both are FlashAttention-2);
where the spans path answers alone, + what FlashAttention-2 may add to the plain path's error
(``flash_terms``, derived there: P recomputed from a rounded lse, bounded by the sum of |terms|
of each gradient, not its result — a gradient that cancels has a result near 0 and terms that
are not) — no NaN where the reference is finite,
and nothing written to file descriptors 1 or 2 while the kernel runs (BLAS prints "Intel
oneMKL ERROR" there when it refuses a leading dimension, then skips the product).

Why the spans path's gradients get a second term (issue 40: seed 11's cases 68, 430, 927, 1743
and 2671, fewer than 64 rows on bottom-right causal masks, were 1.0-5.1× a bound taken from the
plain path alone). FlashAttention-2 — the kernel, and torch's flash kernel under the spans path —
recomputes P_ij = exp(S_ij − lse_i) in the backward from an lse rounded to float32 at |lse_i|;
the plain softmax subtracts the row's max in the very rounding it exponentiates, so where one
key dominates a row it gets P = 1 exactly where FA2's P is off by an ulp of |lse|, the same for
every key of the row. That is the algorithm, not a defect of the path: with the lse computed in
float64 and rounded once, case 68's dv stayed 1.3× the old bound (1.44× with torch's). Each P_ij
carries a relative error ρ_i ≤ eps · |lse_i| (½ ulp, ×2 for the exp and the scores' own
rounding), and through dS_ij = P_ij (dP_ij − D_i + dlse_i), whose D_i = dO_i · O_i comes from
the forward's P:

    |ΔdS_ij| ≤ ρ_i P_ij (|dP_ij| + |D_i| + |dlse_i|) + P_ij Σ_k ρ_i P_ik |dP_ik|   (E_ij)
    |Δdq_ic| ≤ scale Σ_j E_ij |k_jc|,   |Δdk_jc| ≤ scale Σ_i E_ij |q_ic|,
    |Δdv_jc| ≤ Σ_i ρ_i P_ij |dO_ic|

— first order in eps, every term at its worst sign: the sum of |terms| of each gradient (its
condition number), not its result. A gradient that cancels (equal keys: Σ_j dS_ij k_j =
k Σ_j dS_ij ≈ 0; equal values: dP_ij − D_i ≈ 0; a row of one key: P = 1) has a float64 result
near 0 while these terms are not; a bound from |result| cannot hold there. ``FLASH_FACTOR`` (2)
× that is added to the spans path's bound. Where the kernel ran, the spans path it replaces is
FA2 too: its realised error is the yardstick and the term is not added (a kernel backward that
read the spans forward's lse — seed 11's case 13 — was 4.9× that tighter bound).

Prints one line per failing case and a summary: cases, how many ran the kernel's forward and
backward, seconds. Exit status 1 when any case fails.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import qkv  # noqa: E402
from qkv.attention import kernels, spans  # noqa: E402
from qkv.attention.blockwise import compute_dtype  # noqa: E402
from qkv.masks import and_masks, causal, document, sliding_window  # noqa: E402
from tolerance import FUSED_FACTOR, attention_reference, bound, max_err  # noqa: E402

# flash_terms bounds each term at its worst; FLASH_FACTOR × that: the got and the float64 answer
# each off by it on opposite sides, as tests/tolerance.py's factor 2
FLASH_FACTOR = 2.0

LAYOUTS = ("contiguous", "transposed", "expanded rows", "expanded heads", "overlapping",
           "sliced", "strided last dim", "size-1 odd stride")


def in_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A (b, h, n, d) tensor in ``layout`` (its values may change: an expansion repeats a row)."""
    b, h, n, d = x.shape
    if layout == "transposed":
        return x.transpose(1, 2).contiguous().transpose(1, 2)  # (b, h, n, d) view of (b, n, h, d)
    if layout == "expanded rows":
        return x[:, :, :1].expand(b, h, n, d)  # stride 0 along n
    if layout == "expanded heads":
        return x[:, :1].expand(b, h, n, d)
    if layout == "expanded batch":
        return x[:1].expand(b, h, n, d)  # stride 0 along b: the kernel reads each batch in place
    if layout == "overlapping" and d > 1:
        step = max(1, d // 2)  # each row shares d − step elements with the next
        base = x.flatten()[: (b * h * n - 1) * step + d].clone()
        return base.as_strided((b, h, n, d), (h * n * step, n * step, step, 1))
    if layout == "sliced":
        return torch.cat([x, x + 1], -1)[..., :d]  # row stride 2d
    if layout == "strided last dim":
        return torch.stack([x, x - 1], -1).flatten(-2)[..., ::2]
    if layout == "size-1 odd stride" and n == 1:
        return x.clone().as_strided((b, h, 1, d), (h * d, d, 0, 1))
    return x.contiguous()


def documents(gen: random.Random, b: int, n: int, per_row: bool) -> torch.Tensor:
    """Packed document ids: (n,) or (b, n), each document's tokens contiguous."""
    rows = []
    for _ in range(b if per_row else 1):
        ids, doc = [], 0
        while len(ids) < n:
            ids += [doc] * gen.choice([1, 2, gen.randint(1, 40), gen.randint(20, 200)])
            doc += 1
        rows.append(ids[:n])
    out = torch.tensor(rows)
    return out if per_row else out[0]


def draw_mask(gen: random.Random, b: int, t: int, s: int):
    """(name, mask_mod, batch for create_block_mask): an interval mask for t rows and s keys."""
    align = gen.choice(["top_left", "bottom_right"])
    window = sliding_window(gen.randint(0, 80), gen.choice([0, 0, gen.randint(0, 25)]), align)
    kinds = ["window", "causal", "causal ∩ window"]
    if t == s:
        kinds += ["documents", "documents ∩ causal", "documents ∩ window"]
    kind = gen.choice(kinds)
    per_row = b > 1 and gen.random() < 0.5
    docs = document(documents(gen, b, t, per_row)) if "documents" in kind else None
    mod = {"window": lambda: window, "causal": lambda: causal(align),
           "causal ∩ window": lambda: and_masks(causal(align), window),
           "documents": lambda: docs, "documents ∩ causal": lambda: and_masks(docs, causal()),
           "documents ∩ window": lambda: and_masks(docs, window)}[kind]()
    return f"{kind} ({align})", mod, (b if per_row else None)


@dataclass
class Case:
    index: int
    b: int
    h_kv: int
    g: int
    t: int
    s: int
    d: int
    dtype: torch.dtype
    threads: int
    scale: float
    mask: str
    layouts: dict
    path: str  # "direct" or "autograd"
    reduce: str
    with_dlse: bool
    ran_kernel: bool = False
    problems: list = field(default_factory=list)
    margins: dict = field(default_factory=dict)  # name → error / limit (≤ 1 holds)

    def describe(self) -> str:
        odd = {k: v for k, v in self.layouts.items() if v != "contiguous"}
        return (f"case {self.index}: b={self.b} h={self.h_kv * self.g}/{self.h_kv} t={self.t} "
                f"s={self.s} d={self.d} {str(self.dtype)[6:]} threads={self.threads} "
                f"scale={self.scale:.3g} {self.mask} {self.path}/{self.reduce} "
                f"dlse={self.with_dlse} layouts={odd}")


class Quiet:
    """Captures file descriptors 1 and 2 (where BLAS writes, below Python's sys.stdout)."""

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile()
        self.saved = [os.dup(1), os.dup(2)]
        os.dup2(self.file.fileno(), 1)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        self.file.seek(0)
        self.text = self.file.read().decode(errors="replace")
        self.file.close()


def flash_terms(q, k, v, bm, scale, dout, dlse, dtype) -> dict:
    """What FlashAttention-2's backward may add to the plain path's error, per element of dq, dk
    and dv (float64, shaped like them): the bound derived in this module's doc (the sum of
    |terms| of each gradient weighted by the relative error ρ of its recomputed P)."""
    eps = torch.finfo(compute_dtype(dtype)).eps
    g = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)  # (b, h, s, d)
    keep = bm.materialize()  # (B', H', t, s)
    S = (scale * q @ kr.transpose(-1, -2)).masked_fill(~keep, -math.inf)  # (b, h, t, s)
    lse = S.logsumexp(-1, keepdim=True)  # (b, h, t, 1)
    P = torch.where(keep & ~lse.isneginf(), (S - lse).exp(), 0.0)  # (b, h, t, s)
    rho = eps * lse.masked_fill(lse.isneginf(), 0).abs()  # (b, h, t, 1)
    dP = dout @ vr.transpose(-1, -2)  # (b, h, t, s)
    D = (P * dP).sum(-1, keepdim=True)  # (b, h, t, 1)
    extra = 0 if dlse is None else dlse.abs().unsqueeze(-1)
    E = rho * P * (dP.abs() + D.abs() + extra) + P * (rho * P * dP.abs()).sum(-1, keepdim=True)
    per_kv = lambda x: x.unflatten(1, (k.shape[1], g)).sum(2)  # noqa: E731  (b, h, s, d) → (b, h_kv, s, d)
    return {"dq": scale * E @ kr.abs(), "dk": per_kv(scale * E.transpose(-1, -2) @ q.abs()),
            "dv": per_kv((rho * P).transpose(-1, -2) @ dout.abs())}


def draw(index: int, seed: int):
    """Case ``index`` of run ``seed``: (the case, its mask_mod, the mask's batch, its generator)."""
    gen = random.Random(seed * 1_000_003 + index)
    b, h_kv, g = gen.randint(1, 2), gen.randint(1, 3), gen.choice([1, 1, 2, 3])
    t = gen.choice([gen.randint(40, 130), gen.randint(64, 330)])
    s = t if gen.random() < 0.6 else gen.randint(24, 330)
    d = gen.choice([1, 3, 8, 16, 16, 32, 33, 64, 72])
    dtype = gen.choices([torch.float32, torch.float64, torch.bfloat16], [0.85, 0.1, 0.05])[0]
    scale = 1 / math.sqrt(d) if gen.random() < 0.7 else gen.choice([0.0, gen.uniform(0, 2)])
    mask, mod, batch = draw_mask(gen, b, t, s)
    layouts = {n: gen.choice(LAYOUTS) if gen.random() < 0.6 else "contiguous"
               for n in ("q", "k", "v", "out", "dout")}
    # layouts added since the first runs come from a generator of their own, so that every case
    # of a seed keeps the draw it had (the regression cases in tests/ name them by index)
    later = random.Random(seed * 7_919 + index)
    layouts = {n: "expanded batch" if x == "expanded heads" and b > 1 and later.random() < 0.5 else x
               for n, x in layouts.items()}
    case = Case(index, b, h_kv, g, t, s, d, dtype, gen.randint(1, 4), scale, mask, layouts,
                gen.choice(["direct", "autograd"]), gen.choice(["sum(dim=2)", "weighted"]),
                gen.random() < 0.5)
    return case, mod, batch, gen


def run_case(index: int, seed: int) -> Case:
    """Draw case ``index``, run it, and record what broke the contract in ``case.problems``."""
    case, mod, batch, gen = draw(index, seed)
    bm = qkv.create_block_mask(mod, batch, None, case.t, case.s, block_size=gen.choice([32, 64, 128]))
    torch.set_num_threads(case.threads)
    tg = torch.Generator().manual_seed(gen.randrange(2**31))
    shape_q = (case.b, case.h_kv * case.g, case.t, case.d)  # (b, h, t, d)
    shape_k = (case.b, case.h_kv, case.s, case.d)  # (b, h_kv, s, d)
    q64, k64, v64, dout64 = (
        in_layout(torch.randn(shape, generator=tg, dtype=torch.float64), case.layouts[n])
        for shape, n in ((shape_q, "q"), (shape_k, "k"), (shape_k, "v"), (shape_q, "dout")))
    dlse64 = torch.randn(shape_q[:-1], generator=tg, dtype=torch.float64) if case.with_dlse else None
    gqa = case.g > 1
    x = [in_layout(a.to(case.dtype), case.layouts[n]) for a, n in zip((q64, k64, v64), "qkv")]
    case.ran_kernel = kernels.can_run(*x, bm)

    def direct(forward, backward):  # the passes called as the backend calls them
        out, lse = forward(*x, bm, scale=case.scale, enable_gqa=gqa)
        o = in_layout(out, case.layouts["out"])
        o = o if torch.equal(o, out) else out  # only the layouts that keep out's values
        # a gradient reaching lse, where every row has a key (autograd's logsumexp backward is
        # NaN on a row of −inf scores, so the reference could not say)
        dlse = None if dlse64 is None or lse.isneginf().any() else dlse64.float()
        dout = in_layout(dout64.float(), case.layouts["dout"])
        grads = backward(*x, o, dout, lse, bm, scale=case.scale, enable_gqa=gqa, dlse=dlse)
        return (out, lse, *grads), dout.double(), None if dlse is None else dlse.double()

    def autograd(kernel: bool):  # qkv.scaled_dot_product_attention under autograd
        leaves = [a.detach().requires_grad_() for a in x]
        with kernels.use_kernel(kernel):
            out, lse = qkv.scaled_dot_product_attention(*leaves, block_mask=bm, scale=case.scale,
                                                        enable_gqa=gqa, return_lse=True)
            dlse = None
            if case.reduce == "sum(dim=2)":  # d loss / d out = 2 · out.sum(dim=2), expanded along t
                (out.sum(dim=2) ** 2).sum().backward()
                dout = (2 * out.detach().double().sum(dim=2, keepdim=True)).expand(out.shape)
            else:
                # the dout layout "transposed": a weighting of out as (b, t, h, d), so autograd
                # hands the backward a transposed dout (the drawn layout is unused here otherwise)
                w = dout64.to(out.dtype)  # (b, h, t, d)
                if case.layouts["dout"] == "transposed":
                    loss = (out.transpose(1, 2) * w.transpose(1, 2).contiguous()).sum()
                else:
                    loss = (out * w).sum()
                # a gradient reaching lse (where every row has a key, as for direct)
                if case.with_dlse and not lse.isneginf().any():
                    dlse = dlse64.to(lse.dtype)
                    loss = loss + (lse * dlse).sum()
                loss.backward()
                dout = w.double()
        return ((out, lse, *(a.grad for a in leaves)), dout,
                None if dlse is None else dlse.double())

    kernel_direct = case.path == "direct" and case.ran_kernel
    with Quiet() as quiet:
        got, loss_dout, loss_dlse = (direct(kernels.kernel_forward, kernels.kernel_backward)
                                     if kernel_direct else autograd(True))
    if quiet.text.strip():
        case.problems.append(f"wrote to fd 1/2: {quiet.text.strip().splitlines()[0][:120]}")
    # the references read the very numbers the kernel read (a layout may repeat or shift them)
    ref = attention_reference(*(a.double() for a in x), bm, loss_dout, loss_dlse, scale=case.scale, dtype=torch.float64)
    plain = attention_reference(*(a.float() for a in x), bm, loss_dout, loss_dlse, scale=case.scale, dtype=torch.float32)
    # and where the kernel ran, the spans path it replaces: FlashAttention-2's recomputation of P
    # from lse rounds where the plain softmax is exact (a row of one key: P = 1, dq = 0)
    peer = None
    if case.ran_kernel:
        peer = (direct(spans.spans_forward, spans.spans_backward) if kernel_direct
                else autograd(False))[0]
    terms = flash_terms(*(a.double() for a in x), bm, case.scale, loss_dout, loss_dlse, case.dtype)
    check(case, got, ref, plain, peer, terms)
    return case


def check(case: Case, got, ref, plain, peer=None, terms=None) -> None:
    """Each of out, lse, dq, dk, dv within factor × the error of float64's that the plain float32
    path (or ``peer``, the spans path, where larger) makes (+ 2 ulp); NaN only where float64 has
    NaN.

    The gradients of a case on the spans path (no peer: it is the path under test) may also
    carry FlashAttention-2's own error, ``FLASH_FACTOR × terms[name]`` (``flash_terms``: P
    recomputed from a rounded lse, bounded by the sum of |terms| of each gradient, its
    condition number) — the plain softmax subtracts the row's max in the rounding it
    exponentiates, so its error says nothing of that one. Where the kernel ran, the spans path
    is FA2 too and its realised error is the yardstick (the tighter bound: a kernel backward
    that read another forward's lse was 4.9× it, issue 40); only a gradient that cancelled to 0
    exactly in float64 and on the plain path is held to ``terms`` there. A case in another dtype
    (the spans path's) scales the plain error by the ratio of the dtypes' epsilons (bfloat16:
    2⁻⁸ / 2⁻²³), as tests/tolerance.py's ``assert_agree`` does one precision down."""
    ratio = torch.finfo(case.dtype).eps / torch.finfo(torch.float32).eps
    peer = peer or (None,) * 5
    for name, g, r, p, q, factor in zip(("out", "lse", "dq", "dk", "dv"), got, ref, plain, peer,
                                        (FUSED_FACTOR, FUSED_FACTOR, *(2 * FUSED_FACTOR,) * 3)):
        r = torch.zeros_like(g, dtype=torch.float64) if r is None else r  # allow_unused: no key
        p = torch.zeros_like(r) if p is None else p
        g, r, p = g.detach().double(), r.double(), p.detach().double()
        q = p if q is None else q.detach().double()
        if name == "lse":  # rows with no key: −inf on every path
            if not torch.equal(g.isneginf(), r.isneginf()):
                case.problems.append("lse: −inf rows differ")
            keep = ~r.isneginf()
            g, r, p, q = g[keep], r[keep], p[keep], q[keep]
        if max_err(q, r) > max_err(p, r):
            p = q
        if (g.isnan() & ~r.isnan()).any():
            case.problems.append(f"{name}: NaN where float64 is finite")
            continue
        if case.dtype == torch.float64:  # the reference rounds as much: ×2 (tolerance.assert_agree)
            factor *= 2
        limit = bound(r, p, factor=factor * ratio, dtype=case.dtype)
        flash = FLASH_FACTOR * float(terms[name].max()) if terms and name in terms and r.numel() else 0.0
        if not case.ran_kernel:  # the spans path under test: FA2's own error is not the plain path's
            limit += flash
        elif float(r.abs().max()) == 0 == max_err(p, r):  # cancelled exactly on both peers
            limit = max(limit, flash)
        err = max_err(g, r)
        case.margins[name] = err / limit if limit > 0 else (0.0 if err == 0 else math.inf)
        if not err <= limit:
            case.problems.append(f"{name}: error {err:.3g} > {limit:.3g} (plain {max_err(p, r):.3g})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=lambda x: [int(i) for i in x.split(",")], default=None,
                    help="run these case indices alone (comma-separated), as drawn by --seed")
    ap.add_argument("--case", type=int, default=None, help="run this case alone (as --only N)")
    args = ap.parse_args(argv)
    only = args.only if args.case is None else [args.case]
    if kernels.load() is None:
        print("qkv's C++ kernel is not built here: nothing to fuzz (python -m qkv.attention.kernels.build)")
        return 1
    threads = torch.get_num_threads()
    t0, failed, forward, backward, worst = time.perf_counter(), 0, 0, 0, (0.0, None, None)
    for index in (only if only is not None else range(args.cases)):
        case = run_case(index, args.seed)
        forward += case.ran_kernel
        backward += case.ran_kernel  # the kernel's backward runs wherever its forward can
        worst = max([worst, *((m, name, index) for name, m in case.margins.items())],
                    key=lambda w: w[0])
        if case.problems:
            failed += 1
            print(f"FAIL {case.describe()}: {'; '.join(case.problems)}", flush=True)
    torch.set_num_threads(threads)
    n = len(only) if only is not None else args.cases
    print(f"{n} cases (seed {args.seed}): {n - failed} held, {failed} failed; {forward} ran the "
          f"C++ kernel (the rest: the spans path), {time.perf_counter() - t0:.1f} s; the largest "
          f"error / bound {worst[0]:.3g} ({worst[1]}, case {worst[2]})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
