// qkv view --file — a long document's page. It shows numbers; it computes none: every weight, sum
// and ranking is a field of an answer from the API (qkv/view/api.py → the "document" rows of
// qkv/explain/kinds.py → qkv.explain.document_results, from the one recorded forward).
//
// One selection drives every view: S = {token, layer, head, method, block, zoom}. It lives in the
// URL (?token=12&layer=1&head=3), so a view can be shared and reopened.
//
// Views: a virtualised token strip (only the lines in sight are in the DOM), the model view (every
// head's row for the token: doc_overview), the block map (doc_block_map tiles → doc_rows of one
// tile → a token), sinks and spans (doc_spans: every head's sink share or mean attention distance
// over the whole document, a layers × heads grid), the attention-received strip (doc_received).
// document.body.dataset.state is
// "busy" while an update runs and "ready" when it has finished ("error" after a failure).
"use strict";

(function () {
  const LINE = 22;        // px: one line of the token strip
  const PER_LINE = 12;    // tokens on a line of the strip
  const SPARE = 3;        // lines drawn above and below the ones in sight
  const MAP_PX = 512;     // the block map's canvas side
  const BLOCKS = [32, 64, 128, 256, 512, 1024];

  // null: the default of the request field, from /api/info (the library's own)
  const S = { token: null, layer: null, head: null, method: null, block: null, zoom: null,
    spans: "sink", first: null };
  const D = { info: null, doc: null, overview: null, weights: null, byHead: null, tiles: null,
    region: null, received: null, spans: null, timings: {} };
  const FIRSTS = [1, 2, 4, 8, 16];  // the sink's sizes offered (the library takes any 1 … N)
  const SPANS = { sink: "sink share", distance: "mean attention distance" };  // doc_spans' metrics

  // shared.js: the POST, the element builder, formatting, the busy/ready state, the model grid
  const { $, h, fmt, status, decodeF32, update, grid, gridCell } = qkvPage;
  function heatRgb() { return qkvPage.cssColor("--heat"); }
  function label(i) { return D.doc.units[i]; }

  function ask(endpoint, fields) { return qkvPage.post(endpoint, JSON.stringify(fields)); }

  // -- the URL ---------------------------------------------------------------------------------
  function readUrl() {
    let q;
    try { q = new URLSearchParams(location.search); } catch (e) { return; }
    for (const k of ["token", "layer", "head", "block", "first"]) {
      if (q.has(k) && /^\d+$/.test(q.get(k))) S[k] = Number(q.get(k));
    }
    if (q.has("method")) S.method = q.get("method");
    if (SPANS[q.get("spans")]) S.spans = q.get("spans");
  }
  function writeUrl() {
    const q = new URLSearchParams({ token: S.token, layer: S.layer, head: S.head, method: S.method, block: S.block,
      spans: S.spans, first: S.first });
    try { history.replaceState(null, "", "?" + q.toString()); } catch (e) { /* sandboxed */ }
  }

  // -- the token strip: lines of PER_LINE tokens, only those in sight in the DOM -------------------
  const strip = $("strip");
  function drawStrip() {
    const n = D.doc.num_tokens, lines = Math.ceil(n / PER_LINE);
    $("strip-spacer").style.height = lines * LINE + "px";
    const first = Math.max(0, Math.floor(strip.scrollTop / LINE) - SPARE);
    const last = Math.min(lines, Math.ceil((strip.scrollTop + strip.clientHeight) / LINE) + SPARE);
    const row = D.byHead ? D.byHead.get(S.layer + ":" + (D.overview.per === "layer" ? null : S.head)) : null;
    // shade on the scale of the row's largest weight (the library's max_weight)
    const most = row !== null && row !== undefined ? D.overview.heads[row].max_weight || 1 : 1;
    const kept = [];
    for (let k = first; k < last; k++) {
      const buttons = [];
      for (let i = k * PER_LINE; i < Math.min(n, (k + 1) * PER_LINE); i++) {
        const w = row !== null && row !== undefined ? D.weights[row * n + i] : 0;
        buttons.push(h("button", { type: "button", "data-token": i, "aria-pressed": i === S.token ? "true" : "false",
          class: D.doc.special[i] ? "special" : null, title: `token ${i}` + (row !== undefined && row !== null ? `: weight ${fmt(w)} from token ${S.token}` : ""),
          style: { "--w": Math.min(1, Math.sqrt(w / most)).toFixed(3) } }, label(i)));
      }
      kept.push(h("div", { class: "line", style: { top: k * LINE + "px" } }, h("span", { class: "num" }, String(k * PER_LINE)), buttons));
    }
    strip.replaceChildren($("strip-spacer"), ...kept);
  }
  strip.addEventListener("scroll", () => requestAnimationFrame(drawStrip));
  strip.addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-token]");
    if (b) selectToken(Number(b.dataset.token));
  });
  strip.addEventListener("keydown", (ev) => {
    const step = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: PER_LINE, ArrowUp: -PER_LINE }[ev.key];
    if (step === undefined) return;
    ev.preventDefault();
    const t = Math.min(D.doc.num_tokens - 1, Math.max(0, S.token + step));
    selectToken(t).then(() => {
      const b = strip.querySelector(`button[data-token="${t}"]`);
      if (b) b.focus();
    });
  });
  function scrollStripTo(t) {
    $("strip-spacer").style.height = Math.ceil(D.doc.num_tokens / PER_LINE) * LINE + "px";
    const y = Math.floor(t / PER_LINE) * LINE;
    if (y < strip.scrollTop || y + LINE > strip.scrollTop + strip.clientHeight) {
      strip.scrollTop = Math.max(0, y - strip.clientHeight / 2);
    }
  }

  // -- the model view: every head's row for the token, ranked by the library -----------------------
  function drawModelView() {
    const ov = D.overview, n = D.doc.num_tokens;
    ROW_SCALE = rowScale();  // its colours are the theme's
    const perLayer = ov.per === "layer";
    const rank = new Map(ov.heads.map((r, i) => [r.layer + ":" + r.head, i]));
    const what = ov.method === "weight" ? "weight" : ov.method + " share";
    grid($("grid"), { layers: [...Array(ov.num_layers).keys()], heads: ov.num_heads, perLayer, cell: (l, hh) => {
      const i = rank.get(l + ":" + hh), r = ov.heads[i];
      const cv = h("canvas", {});
      drawRow(cv, D.weights.subarray(i * n, (i + 1) * n), r.max_weight);
      return gridCell({ layer: l, head: hh, chosen: l === S.layer && (perLayer || hh === S.head), focus: r.highlighted,
        label: `layer ${l}${perLayer ? " (all heads)" : " head " + hh}: rank ${i + 1}, largest ${what} ` +
          `${fmt(r.max_weight)} on ${r.argmax}, entropy ${fmt(r.entropy_bits, 2)} bits` + (r.highlighted ? ", highlighted" : ""),
        onclick: () => selectHead(l, perLayer ? S.head : hh) },
        cv, h("span", { class: "num" }, "#" + (i + 1) + " " + fmt(r.max_weight, 2)));
    } });
    $("grid-legend").replaceChildren(ROW_SCALE.el);
    $("model-hint").textContent = `— token ${ov.token_index} “${ov.unit}”: each head's row over all ${n} keys; ` +
      `ranked by the largest ${what} in the row (#1 = most focused), as qkv explain ranks them` +
      (ov.focus ? `; bold border: heads whose largest ${what} is on “${ov.focus}”` : "");
    const ol = $("ranking");
    ol.replaceChildren(...ov.heads.slice(0, 12).map((r) => h("li", {}, h("button", { type: "button",
      onclick: () => selectHead(r.layer, r.head === null ? S.head : r.head) },
      `L${r.layer}${r.head === null ? " (all heads)" : " H" + r.head} → ${r.argmax} ${fmt(r.max_weight)} (entropy ${fmt(r.entropy_bits, 2)} bits)`))));
  }
  // A row of N weights in a thumbnail a few hundred pixels wide: each pixel shows the largest weight
  // of the keys it covers, on the scale of the row's largest (the library's max_weight); drawing
  // only, the numbers shown are the answer's.
  // Height and shade: √(w / the row's largest), so that the keys with a tenth of the largest weight
  // still show (a row over thousands of keys is mostly near-zero); the legend says so.
  const ROW_H = 24;
  let ROW_SCALE = null;
  function rowScale() {
    return qkvPage.scale({ hi: 1, ticks: [0, 0.1, 0.25, 0.5, 1], power: 0.5,
      caption: "bars: a key's weight ÷ its row's largest (the number after #rank), on a √ scale; x: the keys 0 … N − 1" });
  }
  function drawRow(cv, w, most) {
    const n = w.length, W = Math.min(n, 240);
    cv.width = W; cv.height = ROW_H;
    const ctx = cv.getContext("2d"), rgb = heatRgb();
    for (let x = 0; x < W; x++) {
      let v = 0;
      for (let j = Math.floor(x * n / W); j < Math.floor((x + 1) * n / W); j++) v = Math.max(v, w[j]);
      const a = ROW_SCALE.at(v / (most || 1));
      if (!(a > 0)) continue;
      ctx.fillStyle = `rgba(${rgb},${Math.max(0.15, ROW_SCALE.shade(v / (most || 1)))})`;
      ctx.fillRect(x, ROW_H - Math.max(1, a * ROW_H), 1, Math.max(1, a * ROW_H));
    }
  }

  // -- the block map: tiles → one tile's rows → a token ----------------------------------------------
  const map = $("map"), tip = $("tip");
  function mapTitle() { return `Block map — layer ${S.layer}, head ${S.head}`; }
  function drawCrumbs() {
    const items = [h("button", { type: "button", "aria-current": S.zoom ? null : "true", onclick: () => zoom(null) },
      `all ${D.doc.num_tokens} tokens in tiles of ${S.block}`)];
    if (S.zoom) {
      const z = S.zoom;
      items.push(" › ", h("button", { type: "button", "aria-current": "true" },
        `rows ${z.rows[0]}–${z.rows[1] - 1} × keys ${z.keys[0]}–${z.keys[1] - 1}`));
    }
    $("crumbs").replaceChildren(...items);
  }
  function drawMap() {
    $("map-title").textContent = mapTitle();
    tip.hidden = true; // a redrawn map (zoomed, another head): the tip named a cell of the old one
    drawCrumbs();
    const z = S.zoom, M = z ? D.region : D.tiles;
    if (!M) return;
    const n = M.shape[0], m = M.shape[1], c = Math.max(1, Math.floor(MAP_PX / Math.max(n, m)));
    const off = document.createElement("canvas"); off.width = m; off.height = n;
    const octx = off.getContext("2d"), img = octx.createImageData(m, n);
    const rgb = heatRgb().split(",").map(Number);
    // a tile's colour: its sum over the rows it holds (≤ block); a cell's: its weight on the scale
    // of the region's largest (drawing only: the numbers shown are the answer's)
    const scale = z ? M.values.reduce((a, b) => Math.max(a, b), 0) || 1 : S.block;
    for (let k = 0; k < n * m; k++) {
      img.data[4 * k] = rgb[0]; img.data[4 * k + 1] = rgb[1]; img.data[4 * k + 2] = rgb[2];
      img.data[4 * k + 3] = Math.round(255 * Math.min(1, Math.sqrt(Math.max(0, M.values[k]) / scale)));
    }
    octx.putImageData(img, 0, 0);
    map.width = m * c; map.height = n * c;
    const ctx = map.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, map.width, map.height);
    // the selected token's row, where it is on this map
    const t = S.token, row = z ? t - z.rows[0] : Math.floor(t / S.block);
    if (row >= 0 && row < n) {
      ctx.strokeStyle = getComputedStyle(document.documentElement).getPropertyValue("--focus").trim();
      ctx.lineWidth = Math.max(1, c / 4);
      ctx.strokeRect(0, row * c, map.width, c);
    }
    $("map-hint").textContent = z
      ? "one tile's rows: each cell is one query token's weight on one key (exact, doc.weights); hover for it, click a row to select its token; Esc zooms out"
      : `each tile is the sum of the weights from ${S.block} query rows to ${S.block} keys (exact, doc.block_map; a full row of tiles sums to ${S.block}); hover for it, click to zoom into its rows`;
    D.mapCell = c;
  }
  function cellAt(ev) {
    const r = map.getBoundingClientRect(), c = D.mapCell || 1;
    return [Math.floor((ev.clientY - r.top) / c), Math.floor((ev.clientX - r.left) / c)];
  }
  function showTip(i, j) {
    const z = S.zoom, M = z ? D.region : D.tiles;
    if (!M || i < 0 || j < 0 || i >= M.shape[0] || j >= M.shape[1]) { tip.hidden = true; return; }
    const v = M.values[i * M.shape[1] + j], n = D.doc.num_tokens;
    if (z) {
      const qi = z.rows[0] + i, kj = z.keys[0] + j;
      tip.textContent = `${label(qi)} (${qi}) → ${label(kj)} (${kj}): ${fmt(v)}`;
    } else {
      const b = S.block;
      tip.textContent = `rows ${i * b}–${Math.min(n, (i + 1) * b) - 1} → keys ${j * b}–${Math.min(n, (j + 1) * b) - 1}: Σ ${fmt(v)}`;
    }
    tip.dataset.row = i; tip.dataset.col = j; tip.hidden = false;
    tip.style.left = ((j + 1) * D.mapCell + 8) + "px"; tip.style.top = ((i + 1) * D.mapCell + 4) + "px";
  }
  map.addEventListener("mousemove", (ev) => showTip(...cellAt(ev)));
  map.addEventListener("mouseleave", () => { tip.hidden = true; });
  map.addEventListener("click", (ev) => {
    const [i, j] = cellAt(ev), n = D.doc.num_tokens;
    if (S.zoom) {
      if (i >= 0 && i < D.region.shape[0]) selectToken(S.zoom.rows[0] + i);
      return;
    }
    if (i < 0 || j < 0 || i >= D.tiles.shape[0] || j >= D.tiles.shape[1]) return;
    const b = S.block;
    zoom({ rows: [i * b, Math.min(n, (i + 1) * b)], keys: [j * b, Math.min(n, (j + 1) * b)] });
  });
  map.addEventListener("keydown", (ev) => { if (ev.key === "Escape" && S.zoom) zoom(null); });
  function zoom(z) {
    S.zoom = z;
    return update(async () => { await loadMap(); drawMap(); });
  }
  async function loadMap() {
    if (S.zoom) {
      const z = S.zoom;
      const a = await ask("doc_rows", { layer: S.layer, head: S.head, start: z.rows[0], stop: z.rows[1],
        key_start: z.keys[0], key_stop: z.keys[1] });
      D.region = { shape: a.shape, values: decodeF32(a.weights) };
    } else {
      const a = await ask("doc_block_map", { layer: S.layer, head: S.head, block: S.block });
      D.tiles = { shape: a.shape, values: decodeF32(a.tiles) };
    }
  }

  // -- attention received: each key's Σ_i w_ij in the selected head ----------------------------------
  const recv = $("received"), rtip = $("received-tip");
  async function loadReceived() {
    const a = await ask("doc_received", { layer: S.layer, head: S.head });
    D.received = { values: decodeF32(a.received), top: a.top, rows: a.rows, layer: a.layer, head: a.head };
  }
  function drawReceived() {
    const r = D.received, n = r.values.length, W = Math.max(1, Math.min(n, recv.clientWidth || 1000));
    recv.width = W; recv.height = 60;
    const ctx = recv.getContext("2d"), rgb = heatRgb(), most = r.top.length ? r.top[0].received : 1;
    // each pixel shows the largest sum among the keys it covers, on the scale of the largest key
    for (let x = 0; x < W; x++) {
      let v = 0;
      for (let j = Math.floor(x * n / W); j < Math.max(Math.floor(x * n / W) + 1, Math.floor((x + 1) * n / W)); j++) v = Math.max(v, r.values[j]);
      const hgt = Math.max(1, Math.sqrt(v / most) * 60);
      ctx.fillStyle = `rgba(${rgb},0.9)`;
      ctx.fillRect(x, 60 - hgt, 1, hgt);
    }
    $("received-hint").textContent = `— layer ${r.layer}, head ${r.head}: each key's total weight Σᵢ wᵢⱼ over the ${r.rows} query rows (exact, doc.received); hover for a key`;
    $("received-top").replaceChildren(...r.top.map((t) => h("li", {}, h("button", { type: "button",
      "data-token": t.index, onclick: () => selectToken(t.index) }, `${label(t.index)} (${t.index}): ${fmt(t.received)}`))));
  }
  recv.addEventListener("mousemove", (ev) => {
    const r = D.received; if (!r) return;
    const box = recv.getBoundingClientRect(), n = r.values.length;
    const j = Math.min(n - 1, Math.max(0, Math.floor((ev.clientX - box.left) / box.width * n)));
    rtip.textContent = `${label(j)} (${j}): Σ ${fmt(r.values[j])}`;
    rtip.dataset.key = j; rtip.hidden = false;
    rtip.style.left = (ev.clientX - box.left + 8) + "px"; rtip.style.top = "64px";
  });
  recv.addEventListener("mouseleave", () => { rtip.hidden = true; });

  // -- sinks and spans: every head's sink share or mean distance over the document ---------------
  const spansGrid = $("spans-grid"), stip = $("spans-tip");
  async function loadSpans() {
    D.spans = await ask("doc_spans", { first: S.first });
  }
  function spanText(r) {
    const v = r[S.spans], sp = D.spans;
    return S.spans === "sink"
      ? `layer ${r.layer} head ${r.head}: sink share ${fmt(v, 6)} — each row's weight on the first ${sp.first} ` +
        `${sp.first === 1 ? "token" : "tokens"}, averaged over ${r.rows} rows`
      : `layer ${r.layer} head ${r.head}: mean attention distance ${fmt(v, 6)} tokens — Σⱼ wᵢⱼ (i − j) ` +
        `averaged over ${r.rows} rows`;
  }
  function drawSpans() {
    const sp = D.spans;
    if (!sp) return;
    const by = new Map(sp.heads.map((r) => [r.layer + ":" + r.head, r]));
    // a cell's shade is the value it shows (as rounded there) on the legend's scale: a sink share
    // on 0 … 1 (a share), a distance on 0 … the largest, in tokens
    const sink = S.spans === "sink", digits = sink ? 3 : 1;
    const most = sp.heads.reduce((a, r) => Math.max(a, Math.abs(r[S.spans])), 0) || 1;
    const top = sink ? 1 : niceCeil(most);
    const legend = qkvPage.scale({ hi: top, ticks: sink ? [0, 0.25, 0.5, 0.75, 1] : [0, top / 4, top / 2, 3 * top / 4, top],
      digits: sink ? 2 : (top >= 8 ? 0 : 1), unit: sink ? "" : "tokens",
      caption: sink ? "shade: the sink share each cell shows (0 none, 1 all of a row's weight on the sink)"
        : "shade: the mean attention distance each cell shows" });
    $("spans-legend").replaceChildren(legend.el);
    $("spans-first-unit").textContent = sp.first === 1 ? "token" : "tokens";
    const layers = [...new Set(sp.heads.map((r) => r.layer))];
    const heads = sp.heads.reduce((a, r) => Math.max(a, r.head + 1), 0);
    stip.hidden = true;
    grid(spansGrid, { layers, heads, perLayer: false, cell: (l, hh) => {
      const r = by.get(l + ":" + hh), v = r[S.spans];
      const shown = fmt(v, digits);
      const b = gridCell({ layer: l, head: hh, chosen: l === S.layer && hh === S.head, label: spanText(r),
        onclick: () => selectHead(l, hh) }, shown);
      b.style.setProperty("--w", legend.shade(Math.abs(Number(shown))).toFixed(3));
      b.dataset.value = v;
      return b;
    } });
    $("spans-hint").textContent = S.spans === "sink"
      ? `— each head's share of attention on the first ${qkvPage.plural(sp.first, "token")} of all ${sp.tokens}, averaged over its rows (exact, head_spans: O(N))`
      : `— how far back each head looks, Σⱼ wᵢⱼ (i − j) averaged over its rows, in tokens (exact, head_spans: O(N))`;
  }
  // the scale's top: the largest distance rounded up to 1, 2 or 5 × a power of ten
  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    return [1, 2, 5, 10].map((m) => m * p).find((x) => x >= v);
  }
  function showSpanTip(b) {
    const r = D.spans.heads.find((x) => x.layer === Number(b.dataset.layer) && x.head === Number(b.dataset.head));
    stip.textContent = spanText(r);
    stip.dataset.layer = r.layer; stip.dataset.head = r.head; stip.hidden = false;
    stip.style.left = (b.offsetLeft + b.offsetWidth + 6) + "px"; stip.style.top = (b.offsetTop + b.offsetHeight) + "px";
  }
  for (const ev of ["mouseover", "focusin"]) {
    spansGrid.addEventListener(ev, (e) => { const b = e.target.closest("button.cell"); if (b) showSpanTip(b); });
  }
  spansGrid.addEventListener("mouseleave", () => { stip.hidden = true; });
  $("spans-metric").addEventListener("change", () => {
    S.spans = $("spans-metric").value;
    writeUrl(); drawSpans();
  });
  $("spans-first").addEventListener("change", () => {
    S.first = Number($("spans-first").value);
    update(async () => { await loadSpans(); writeUrl(); drawSpans(); });
  });

  // -- selections ------------------------------------------------------------------------------
  async function loadOverview() {
    const t0 = performance.now();
    const a = await ask("doc_overview", { token: S.token, method: S.method });
    D.overview = a;
    D.weights = decodeF32(a.weights);
    D.byHead = new Map(a.heads.map((r, i) => [r.layer + ":" + r.head, i]));
    S.token = a.token_index;
    D.timings.overview_ms = performance.now() - t0;
  }
  function selectToken(t) {
    if (t === S.token && D.overview) return Promise.resolve();
    S.token = t;
    const t0 = performance.now();
    return update(async () => {
      await loadOverview();
      writeUrl(); scrollStripTo(S.token); drawStrip(); drawModelView(); drawMap();
      D.timings.switch_ms = performance.now() - t0; // read by benchmarks/view.py --document
    });
  }
  function selectHead(layer, head) {
    S.layer = layer; S.head = head;
    return update(async () => {
      writeUrl();
      await Promise.all([loadMap(), loadReceived()]);
      drawStrip(); drawModelView(); drawMap(); drawReceived(); drawSpans();
    });
  }

  // -- the form --------------------------------------------------------------------------------
  function fillForm() {
    $("method").replaceChildren(...D.doc.methods.map((m) => h("option", { value: m, selected: m === S.method }, m)));
    $("block").replaceChildren(...BLOCKS.filter((b) => Math.ceil(D.doc.num_tokens / b) <= 1024)
      .map((b) => h("option", { value: b, selected: b === S.block }, String(b))));
    $("spans-metric").value = S.spans;
    // the offered sizes within the document, and the one asked for (?first=N) where it is another
    const firsts = [...new Set([...FIRSTS.filter((f) => f <= D.doc.num_tokens), S.first])].sort((a, b) => a - b);
    $("spans-first").replaceChildren(...firsts.map((f) => h("option", { value: f, selected: f === S.first }, String(f))));
  }
  $("method").addEventListener("change", () => {
    S.method = $("method").value;
    update(async () => { await loadOverview(); writeUrl(); drawStrip(); drawModelView(); });
  });
  $("block").addEventListener("change", () => { S.block = Number($("block").value); S.zoom = null; writeUrl(); zoom(null); });
  $("theme").addEventListener("click", () => {
    const root = document.documentElement, dark = matchMedia("(prefers-color-scheme: dark)").matches;
    root.dataset.theme = (root.dataset.theme || (dark ? "dark" : "light")) === "dark" ? "light" : "dark";
    if (D.overview) { drawModelView(); drawMap(); drawReceived(); drawSpans(); }
  });

  // -- start -----------------------------------------------------------------------------------
  async function start() {
    await update(async () => {
      const r = await fetch("api/info");
      D.info = await r.json();
      D.doc = D.info.document;
      const defaults = (kind) => Object.fromEntries(D.info.kinds[kind].fields.map((f) => [f.name, f.default]));
      const first = Object.assign({ layer: 0, head: 0 }, defaults("document-overview"), defaults("block-map"),
        defaults("head-spans"));
      readUrl();
      for (const k of ["layer", "head", "method", "block", "first"]) if (S[k] === null) S[k] = first[k];
      if (S.first < 1 || S.first > D.doc.num_tokens) S.first = first.first;
      if (!D.doc.methods.includes(S.method)) S.method = first.method;
      if (S.token !== null && S.token >= D.doc.num_tokens) S.token = null;
      S.layer = Math.min(S.layer, D.doc.num_layers - 1);
      S.head = Math.min(S.head, D.doc.num_heads - 1);
      if (!BLOCKS.includes(S.block) || Math.ceil(D.doc.num_tokens / S.block) > 1024) S.block = first.block;
      $("doc-title").textContent = `— ${D.doc.model}, ${D.doc.num_tokens} tokens (kept: ${(D.doc.record_bytes / 2 ** 20).toFixed(1)} MiB)`;
      $("strip-hint").textContent = `— ${D.doc.num_tokens} tokens; click one (or use the arrow keys); shade: its weight from the selected token in the selected head`;
      fillForm();
      await Promise.all([loadOverview(), loadMap(), loadReceived()]);
      writeUrl(); scrollStripTo(S.token); drawStrip(); drawModelView(); drawMap(); drawReceived();
    });
    // one sweep per layer over the whole document (answered once, then from the API's cache):
    // after the views above, so the page is usable while it runs
    await update(async () => { await loadSpans(); drawSpans(); });
  }
  window.qkvDocument = { state: S, data: D };
  start();
})();
