// Attention whose mask gives every query row one contiguous interval of keys [lo_i, hi_i):
// a sliding window, causality, packed documents, and their intersections.
//
// interval_forward — one pass per query tile (FlashAttention-2's forward): S = scale · Q_tile ·
// K_spanᵀ by BLAS, the mask and the online softmax fused in one sweep over S while it is in
// cache, then O += P · V_span by BLAS.
//
//   q (B, Hq, t, d), k, v (B, Hkv, s, d)   float32, last dim contiguous, row stride (BLAS's
//                                          leading dimension) in [d, 2³¹); heads and batches
//                                          any strides (they are only read)
//   lo, hi (Bm, t) int64, Bm ∈ {1, B}      row i's keys [lo_i, hi_i) (lo_i ≥ hi_i: no key)
//   → out (B, Hq, t, d), lse (B, Hq, t)     a row with no key: 0 and −inf
//
// interval_backward — FlashAttention-2's backward from the saved lse, over the same tiles and
// intervals: per chunk of a tile's keys, P = exp(scale · Q Kᵀ − lse) recomputed, then
// dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D + dlse) with D = rowsum(dO ∘ O), dQ += scale · dS K,
// dK += scale · dSᵀ Q — five BLAS products to the forward's two.
//
//   out, dout (B, Hq, t, d)                float32, rows as q's
//   lse, dlse (B, Hq, t)                   contiguous; dlse may be empty (no gradient reaches lse)
//   → dq (B, Hq, t, d), dk, dv (B, Hkv, s, d)   a row with no key (lse −inf): dq 0, adds nothing
//
// Query head h reads key head h / (Hq / Hkv) (grouped-query attention).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

// BLAS's sgemm (column-major), as torch's CPU library exports it (MKL in the x86 wheels;
// torch's own gemm wrapper is not exported to extensions). Inside the parallel region MKL runs
// on the calling thread, as it does for torch's own flash kernel.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c, const int* ldc);

namespace {

// C (m, n) = alpha · op(A) op(B) + beta · C, column-major, op = 'T' (transposed) or 'N'.
inline void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int M = m, N = n, K = k, LDA = lda, LDB = ldb, LDC = ldc;
  sgemm_(&ta, &tb, &M, &N, &K, &alpha, a, &LDA, b, &LDB, &beta, c, &LDC);
}

constexpr int LANES = 16;  // independent partial max / sum: the loops vectorise without -ffast-math

// A tile's span of keys is widened to a multiple of this many (the extra keys are masked, as the
// band's are): a window of 512 keys a row with tiles of 64 rows spans 575 keys, whose odd length
// makes BLAS pack and multiply ragged edges and leaves S's rows unaligned — 576 ran 3-5 % faster
// (fp32, N = 16k, one thread of a loaded 2-core AMD EPYC, interleaved). benchmarks/long.py's
// window (i − j ≤ 512: 513 keys a row) spans 576 already.
constexpr int64_t SPAN_MULTIPLE = 16;

// exp(x) for x ≤ 0 (scores minus their running max), Cephes' expf polynomial (≤ 2 ulp on
// [-87, 0]); written branch-free so the compiler vectorises the loop that calls it. Below −87
// it returns exp(−87.3) ≈ 1e-38 instead of a subnormal: nothing a row sum ≥ 1 can see.
inline float exp_le0(float x) {
  x = x < -87.3f ? -87.3f : x;  // NaN stays NaN (the comparison is false)
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest (|n| < 2²²)
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// The largest of x[0, n) and start, 32 at a time in four 8-wide registers (GCC's vector
// extension: AVX2/AVX-512 here, NEON elsewhere; a scalar max loop is not vectorised without
// -ffast-math). A NaN score may make the max NaN: its row is NaN either way.
typedef float f8 __attribute__((vector_size(32)));

inline f8 load8(const float* x) {
  f8 v;
  std::memcpy(&v, x, sizeof v);
  return v;
}

inline f8 max8(f8 a, f8 b) { return a > b ? a : b; }

inline float row_max(const float* x, int64_t n, float start) {
  f8 m0 = {start, start, start, start, start, start, start, start}, m1 = m0, m2 = m0, m3 = m0;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    m0 = max8(m0, load8(x + j));
    m1 = max8(m1, load8(x + j + 8));
    m2 = max8(m2, load8(x + j + 16));
    m3 = max8(m3, load8(x + j + 24));
  }
  for (; j + 8 <= n; j += 8) m0 = max8(m0, load8(x + j));
  m0 = max8(max8(m0, m1), max8(m2, m3));
  float m = start;
  for (int l = 0; l < 8; ++l) m = m0[l] > m ? m0[l] : m;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// x[j] ← exp(x[j] − m) over [0, n); returns their sum.
inline float exp_sum(float* x, int64_t n, float m) {
  float part[LANES] = {0};
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; ++l) {
      float e = exp_le0(x[j + l] - m);
      x[j + l] = e;
      part[l] += e;
    }
  float sum = 0.0f;
  for (; j < n; ++j) {
    float e = exp_le0(x[j] - m);
    x[j] = e;
    sum += e;
  }
  for (int l = 0; l < LANES; ++l) sum += part[l];
  return sum;
}

}  // namespace

// Each (n, d) matrix of x (B, H, n, d) is one BLAS reads in place: last dim contiguous, row
// stride (the leading dimension it is handed) at least d — no repeated rows (an expand along n:
// stride 0), no overlapping ones — and a 32-bit int. BLAS refuses anything else with a line on
// stdout and skips the product, which would leave the output tile as it was.
void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.stride(3) == 1 && x.stride(2) >= x.size(3) &&
                  x.stride(2) <= std::numeric_limits<int>::max(),
              name, ": each (n, d) matrix must have contiguous rows of stride in [d, 2^31) (got strides ",
              x.strides(), " for shape ", x.sizes(), ")");
}

// The checks both passes make: q (B, Hq, t, d), k, v (B, Hkv, s, d) float32, rows BLAS reads in
// place (check_rows), Hq a positive multiple of Hkv; lo, hi (1 or B, t) int64, contiguous.
void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lo,
                  const at::Tensor& hi) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, H, n, d)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat, "q, k, v must be float32");
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(v, "v");
  TORCH_CHECK(lo.scalar_type() == at::kLong && hi.scalar_type() == at::kLong && lo.is_contiguous() &&
                  hi.is_contiguous() && lo.dim() == 2 && lo.sizes() == hi.sizes(), "lo, hi: (Bm, t) int64");
  const int64_t B = q.size(0), Hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t Hkv = k.size(1), s = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == s &&
                  k.size(3) == d && v.size(3) == d, "shapes disagree: q ", q.sizes(), ", k ", k.sizes(),
              ", v ", v.sizes());
  TORCH_CHECK(Hkv > 0 && Hq > 0 && Hq % Hkv == 0, "query heads (", Hq,
              ") must be a positive multiple of key/value heads (", Hkv, ")");
  TORCH_CHECK(lo.size(1) == t && (lo.size(0) == 1 || lo.size(0) == B), "lo, hi: (1 or B, t)");
}

std::vector<at::Tensor> interval_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& lo, const at::Tensor& hi, double scale,
                                         int64_t block_q, int64_t block_k) {
  check_inputs(q, k, v, lo, hi);
  const int64_t B = q.size(0), Hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t Hkv = k.size(1), s = k.size(2);
  TORCH_CHECK(block_q > 0 && block_k > 0, "block sizes must be > 0");
  const int64_t g = Hq / Hkv, Bm = lo.size(0);
  auto out = at::empty({B, Hq, t, d}, q.options());  // every tile writes its rows (0 where no key)
  auto lse = at::full({B, Hq, t}, -std::numeric_limits<float>::infinity(), q.options());
  if (t == 0 || s == 0) return {out.zero_(), lse};
  const int64_t tiles = (t + block_q - 1) / block_q;
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const int64_t* lop = lo.data_ptr<int64_t>();
  const int64_t* hip = hi.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  // BLAS reads neither A nor B when alpha is 0: with scale 0 the product runs at alpha 1 and the
  // sweep multiplies by 0, so a NaN or infinite q·k still makes its row NaN (0 · NaN).
  const bool zero_scale = fscale == 0.0f;
  const float s_alpha = zero_scale ? 1.0f : fscale;
  const float NEG_INF = -std::numeric_limits<float>::infinity();

  at::parallel_for(0, B * Hq * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> S(block_q * block_k);            // (m, n) scores, then P
    std::vector<float> mrow(block_q), lrow(block_q);     // running max and sum per row
    std::vector<int64_t> a(block_q), e(block_q);         // row intervals, clamped to [0, s)
    for (int64_t w = begin; w < end; ++w) {
      const int64_t bh = w / tiles, tile = w % tiles, b = bh / Hq, h = bh % Hq, hk = h / g;
      const int64_t r0 = tile * block_q, m = std::min(block_q, t - r0);
      const int64_t* lrow_lo = lop + (Bm == 1 ? 0 : b) * t + r0;
      const int64_t* lrow_hi = hip + (Bm == 1 ? 0 : b) * t + r0;
      int64_t span_lo = s, span_hi = 0;
      for (int64_t i = 0; i < m; ++i) {
        a[i] = std::max<int64_t>(lrow_lo[i], 0);
        e[i] = std::min<int64_t>(lrow_hi[i], s);
        if (a[i] < e[i]) {
          span_lo = std::min(span_lo, a[i]);
          span_hi = std::max(span_hi, e[i]);
        }
        mrow[i] = NEG_INF;
        lrow[i] = 0.0f;
      }
      float* O = op + (bh * t + r0) * d;  // (m, d), contiguous: the accumulator in place
      if (span_lo >= span_hi) {  // no key for any row: out 0, lse −inf already
        std::fill(O, O + m * d, 0.0f);
        continue;
      }
      {  // the span widened to a multiple of SPAN_MULTIPLE keys within [0, s)
        const int64_t want = (span_hi - span_lo + SPAN_MULTIPLE - 1) / SPAN_MULTIPLE * SPAN_MULTIPLE;
        span_hi = std::min(s, span_lo + want);
        span_lo = std::max<int64_t>(0, span_hi - want);
      }
      const float* Q = qp + b * q.stride(0) + h * q.stride(1) + r0 * q.stride(2);
      const float* K = kp + b * k.stride(0) + hk * k.stride(1);
      const float* V = vp + b * v.stride(0) + hk * v.stride(1);
      for (int64_t c0 = span_lo; c0 < span_hi; c0 += block_k) {
        const int64_t n = std::min(block_k, span_hi - c0);
        // S (m, n) row-major = scale · Q Kᵀ; as column-major BLAS: Sᵀ = K · Qᵀ
        gemm('T', 'N', n, m, d, s_alpha, K + c0 * k.stride(2), k.stride(2), Q, q.stride(2), 0.0f,
             S.data(), n);
        for (int64_t i = 0; i < m; ++i) {
          float* row = S.data() + i * n;
          const int64_t ja = std::max(a[i], c0) - c0, je = std::min(e[i], c0 + n) - c0;
          if (ja >= je) {  // none of this chunk's keys: P row 0
            std::fill(row, row + n, 0.0f);
            continue;
          }
          if (zero_scale)
            for (int64_t j = ja; j < je; ++j) row[j] *= 0.0f;
          const float mx = row_max(row + ja, je - ja, mrow[i]);
          const float alpha = mrow[i] == NEG_INF ? 0.0f : std::exp(mrow[i] - mx);
          std::fill(row, row + ja, 0.0f);
          std::fill(row + je, row + n, 0.0f);
          const float sum = exp_sum(row + ja, je - ja, mx);
          if (lrow[i] != 0.0f && alpha != 1.0f)  // an earlier chunk's share: rescale it
            for (int64_t c = 0; c < d; ++c) O[i * d + c] *= alpha;
          lrow[i] = lrow[i] * alpha + sum;
          mrow[i] = mx;
        }
        // O (m, d) += P V_chunk (column-major: Oᵀ += V_chunkᵀ · Pᵀ); the first chunk writes O
        gemm('N', 'N', d, m, n, 1.0f, V + c0 * v.stride(2), v.stride(2), S.data(), n,
             c0 == span_lo ? 0.0f : 1.0f, O, d);
      }
      for (int64_t i = 0; i < m; ++i) {
        if (lrow[i] == 0.0f && mrow[i] == NEG_INF) continue;  // no key: 0, −inf
        const float inv = 1.0f / lrow[i];
        for (int64_t c = 0; c < d; ++c) O[i * d + c] *= inv;
        lp[bh * t + r0 + i] = mrow[i] + std::log(lrow[i]);
      }
    }
  });
  return {out, lse};
}

namespace {

// Each work item of the backward owns the dK, dV rows it adds into: a (batch, key head) pair —
// all its query heads' tiles — or, where there are fewer pairs than threads, one of `parts`
// consecutive runs of its tiles. Runs p and p + 2, p + 4, … must touch disjoint keys: even runs go
// in one parallel sweep, odd runs in a second (no locks, no per-thread copies of dK, dV: the
// backward's memory stays two tiles a thread). Where a long interval (a document) spans several
// runs, one item per pair. The split's speed-up is not measured yet (written on a 2-core machine
// whose other core was busy); one thread never splits.
struct Parts {
  int64_t count = 1;      // runs of tiles per (batch, key head)
  std::vector<int64_t> first;  // run p's tiles: [first[p], first[p + 1])
};

// The runs' key spans over every mask row (clamped to [0, s)); disjoint within each parity?
bool runs_disjoint(const Parts& parts, const int64_t* lo, const int64_t* hi, int64_t Bm, int64_t t,
                   int64_t s, int64_t block_q) {
  std::vector<int64_t> a(parts.count, s), e(parts.count, 0);
  for (int64_t p = 0; p < parts.count; ++p)
    for (int64_t bm = 0; bm < Bm; ++bm)
      for (int64_t i = parts.first[p] * block_q; i < std::min(parts.first[p + 1] * block_q, t); ++i) {
        const int64_t x = std::max<int64_t>(lo[bm * t + i], 0), y = std::min<int64_t>(hi[bm * t + i], s);
        if (x < y) {
          a[p] = std::min(a[p], x);
          e[p] = std::max(e[p], y);
        }
      }
  for (int64_t p = 0; p < parts.count; ++p)
    for (int64_t r = p + 2; r < parts.count; r += 2)
      if (a[p] < e[p] && a[r] < e[r] && a[p] < e[r] && a[r] < e[p]) return false;
  return true;
}

Parts split_tiles(int64_t items, int64_t tiles, const int64_t* lo, const int64_t* hi, int64_t Bm,
                  int64_t t, int64_t s, int64_t block_q) {
  Parts parts;
  const int64_t threads = at::get_num_threads();
  if (items < threads) {  // two sweeps, each with at least one run per thread
    parts.count = std::min(tiles, 2 * ((threads + items - 1) / items));
  }
  for (int64_t p = 0; p <= parts.count; ++p) parts.first.push_back(p * tiles / parts.count);
  if (parts.count > 1 && !runs_disjoint(parts, lo, hi, Bm, t, s, block_q)) {
    parts.count = 1;  // a long interval spans several runs: one item per (batch, key head)
    parts.first = {0, tiles};
  }
  return parts;
}

}  // namespace

std::vector<at::Tensor> interval_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& out, const at::Tensor& dout,
                                          const at::Tensor& lse, const at::Tensor& dlse,
                                          const at::Tensor& lo, const at::Tensor& hi, double scale,
                                          int64_t block_q, int64_t block_k) {
  check_inputs(q, k, v, lo, hi);
  TORCH_CHECK(out.sizes() == q.sizes() && dout.sizes() == q.sizes() && out.scalar_type() == at::kFloat &&
                  dout.scalar_type() == at::kFloat, "out, dout: float32 shaped like q");
  check_rows(out, "out");
  check_rows(dout, "dout");
  const int64_t B = q.size(0), Hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t Hkv = k.size(1), s = k.size(2);
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.is_contiguous() &&
                  lse.sizes() == at::IntArrayRef({B, Hq, t}), "lse: contiguous float32 (B, Hq, t)");
  const bool has_dlse = dlse.numel() > 0;
  TORCH_CHECK(!has_dlse || (dlse.scalar_type() == at::kFloat && dlse.is_contiguous() &&
                            dlse.sizes() == lse.sizes()), "dlse: empty, or contiguous float32 like lse");
  TORCH_CHECK(block_q > 0 && block_k > 0, "block sizes must be > 0");
  const int64_t g = Hq / Hkv, Bm = lo.size(0);
  auto dq = at::empty({B, Hq, t, d}, q.options());  // every tile writes its rows (0 where no key)
  auto dk = at::zeros({B, Hkv, s, d}, q.options());
  auto dv = at::zeros({B, Hkv, s, d}, q.options());
  if (t == 0 || s == 0) return {dq.zero_(), dk, dv};
  const int64_t tiles = (t + block_q - 1) / block_q;
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* opp = out.data_ptr<float>();
  const float* dop = dout.data_ptr<float>();
  const float* lsep = lse.data_ptr<float>();
  const float* dlsep = has_dlse ? dlse.data_ptr<float>() : nullptr;
  const int64_t* lop = lo.data_ptr<int64_t>();
  const int64_t* hip = hi.data_ptr<int64_t>();
  float* dqp = dq.data_ptr<float>();
  float* dkp = dk.data_ptr<float>();
  float* dvp = dv.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  // scale 0: the products run at alpha 1 and S, dS are multiplied by 0 (see interval_forward)
  const float s_alpha = fscale == 0.0f ? 1.0f : fscale, s_zero = fscale == 0.0f ? 0.0f : 1.0f;
  const float NEG_INF = -std::numeric_limits<float>::infinity();
  const int64_t ldq = q.stride(2), ldk = k.stride(2), ldv = v.stride(2), ldo = out.stride(2),
                lddo = dout.stride(2);
  const Parts parts = split_tiles(B * Hkv, tiles, lop, hip, Bm, t, s, block_q);

  // Query tile `tile` of query head h in batch b: its dQ rows, its share of key head hk's dK, dV.
  auto tile_backward = [&](int64_t b, int64_t h, int64_t tile, float* S, float* dS, float* D,
                           float* L, int64_t* a, int64_t* e) {
    const int64_t hk = h / g, bh = b * Hq + h, r0 = tile * block_q, m = std::min(block_q, t - r0);
    const int64_t* row_lo = lop + (Bm == 1 ? 0 : b) * t + r0;
    const int64_t* row_hi = hip + (Bm == 1 ? 0 : b) * t + r0;
    const float* Q = qp + b * q.stride(0) + h * q.stride(1) + r0 * ldq;
    const float* O = opp + b * out.stride(0) + h * out.stride(1) + r0 * ldo;
    const float* dO = dop + b * dout.stride(0) + h * dout.stride(1) + r0 * lddo;
    const float* K = kp + b * k.stride(0) + hk * k.stride(1);
    const float* V = vp + b * v.stride(0) + hk * v.stride(1);
    float* dQ = dqp + (bh * t + r0) * d;  // (m, d), contiguous
    float* dK = dkp + (b * Hkv + hk) * s * d;  // (s, d), contiguous
    float* dV = dvp + (b * Hkv + hk) * s * d;
    int64_t span_lo = s, span_hi = 0;
    for (int64_t i = 0; i < m; ++i) {
      L[i] = lsep[bh * t + r0 + i];
      a[i] = std::max<int64_t>(row_lo[i], 0);
      e[i] = L[i] == NEG_INF ? a[i] : std::min<int64_t>(row_hi[i], s);  // lse −inf: no key, P = 0
      if (a[i] >= e[i]) continue;
      span_lo = std::min(span_lo, a[i]);
      span_hi = std::max(span_hi, e[i]);
      float dot = 0.0f;  // D_i = rowsum(dO_i ∘ O_i) − dlse_i: dS = P ∘ (dP − D_i)
      for (int64_t c = 0; c < d; ++c) dot += dO[i * lddo + c] * O[i * ldo + c];
      D[i] = dot - (dlsep ? dlsep[bh * t + r0 + i] : 0.0f);
    }
    if (span_lo >= span_hi) {  // no key for any row: dQ 0, nothing for dK, dV
      std::fill(dQ, dQ + m * d, 0.0f);
      return;
    }
    // the span in equal chunks of at most block_k keys (no short last chunk)
    const int64_t chunks = (span_hi - span_lo + block_k - 1) / block_k;
    const int64_t chunk = (span_hi - span_lo + chunks - 1) / chunks;
    for (int64_t c0 = span_lo; c0 < span_hi; c0 += chunk) {
      const int64_t n = std::min(chunk, span_hi - c0);
      // S (m, n) row-major = scale · Q Kᵀ (column-major: Sᵀ = K · Qᵀ), then P = exp(S − lse)
      gemm('T', 'N', n, m, d, s_alpha, K + c0 * ldk, ldk, Q, ldq, 0.0f, S, n);
      // dP (m, n) = dO Vᵀ (column-major: dPᵀ = V · dOᵀ)
      gemm('T', 'N', n, m, d, 1.0f, V + c0 * ldv, ldv, dO, lddo, 0.0f, dS, n);
      for (int64_t i = 0; i < m; ++i) {
        float* p = S + i * n;
        float* ds = dS + i * n;
        const int64_t ja = std::clamp(a[i] - c0, int64_t(0), n), je = std::clamp(e[i] - c0, ja, n);
        std::fill(p, p + ja, 0.0f);
        std::fill(p + je, p + n, 0.0f);
        std::fill(ds, ds + ja, 0.0f);
        std::fill(ds + je, ds + n, 0.0f);
        const float l = L[i], Di = D[i];
        for (int64_t j = ja; j < je; ++j) {
          // S ≤ lse up to rounding: exp_le0 holds there too (s_zero is 1, or 0 for scale 0)
          const float pj = exp_le0(p[j] * s_zero - l);
          p[j] = pj;
          ds[j] = pj * (ds[j] - Di) * s_zero;
        }
      }
      // dV_chunk (n, d) += Pᵀ dO (column-major: dVᵀ += dOᵀ · P)
      gemm('N', 'T', d, n, m, 1.0f, dO, lddo, S, n, 1.0f, dV + c0 * d, d);
      // dQ (m, d) += scale · dS K_chunk (column-major: dQᵀ += K_chunkᵀ · dSᵀ); the first chunk writes
      gemm('N', 'N', d, m, n, s_alpha, K + c0 * ldk, ldk, dS, n, c0 == span_lo ? 0.0f : 1.0f, dQ, d);
      // dK_chunk (n, d) += scale · dSᵀ Q (column-major: dKᵀ += Qᵀ · dS)
      gemm('N', 'T', d, n, m, s_alpha, Q, ldq, dS, n, 1.0f, dK + c0 * d, d);
    }
  };

  for (int64_t parity = 0; parity < std::min<int64_t>(parts.count, 2); ++parity) {
    const int64_t runs = parts.count == 1 ? 1 : (parts.count - parity + 1) / 2;  // this sweep's runs per item
    at::parallel_for(0, B * Hkv * runs, 1, [&](int64_t begin, int64_t end) {
      // the thread's tiles from torch's allocator (what a caller's memory count sees):
      // P and dP → dS (m, n) each, D and lse per row
      auto buf = at::empty({2 * block_q * block_k + 2 * block_q}, q.options());
      float* S = buf.data_ptr<float>();
      float *dS = S + block_q * block_k, *D = dS + block_q * block_k, *L = D + block_q;
      std::vector<int64_t> a(block_q), e(block_q);
      for (int64_t w = begin; w < end; ++w) {
        const int64_t item = w / runs, run = parity + (parts.count == 1 ? 0 : 2 * (w % runs));
        const int64_t b = item / Hkv, hk = item % Hkv;
        for (int64_t h = hk * g; h < (hk + 1) * g; ++h)
          for (int64_t tile = parts.first[run]; tile < parts.first[run + 1]; ++tile)
            tile_backward(b, h, tile, S, dS, D, L, a.data(), e.data());
      }
    });
  }
  return {dq, dk, dv};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("interval_forward", &interval_forward,
        "attention over one key interval per query row: (out, lse)");
  m.def("interval_backward", &interval_backward,
        "FlashAttention-2's backward over one key interval per query row: (dq, dk, dv)");
}
