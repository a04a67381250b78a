// qkv view — the page. It shows numbers; it computes none: every weight, vector and difference
// is a field of an answer from the API (qkv/view/api.py → qkv.explain's to_dict()), or, in an
// exported file, the same answers embedded in <script id="qkv-data">.
//
// One selection drives every view: S = {model, text, words, method, token, layer, head, key}. It
// lives in the URL (?text=…&layer=3&head=1&token=12&key=5), so a view can be shared and reopened;
// key is the heat map's clicked column ("why this weight"), null until a cell is clicked.
"use strict";

(function () {
  const EMBED_NODE = document.getElementById("qkv-data");
  const EMBED = EMBED_NODE ? JSON.parse(EMBED_NODE.textContent) : null;
  const ALL_LINES_UNTIL = 64; // longer texts: the head view draws the selected token's lines only

  // text null: the model's example sentence (/api/info); method null: the default method
  const S = { model: null, text: null, words: false, method: null, token: null, layer: 0, head: 0, key: null, effects: null };
  // whether the head is the user's (the URL named one, or a click chose it); until then the page
  // opens on the model view's top-ranked head (#1), not on L0 H0
  let headChosen = false;
  const D = { info: null, overview: null, maps: null, map: null, probe: null, cross: null, effects: null };
  // shared.js: the POST, the element builder, formatting, the busy/ready state, the model grid
  const { $, h, fmt, signed, compact, status, decodeF32, cssColor, heatRgb, update } = qkvPage;

  // -- data: the API, or the answers embedded in an exported file --------------------------------
  // An exported file holds [endpoint, request fields, answer] triples; the page indexes them by
  // endpoint + the fields other than model/text, as canonical JSON (this is the only spelling).
  function answerKey(endpoint, fields) {
    const kept = {};
    for (const k of Object.keys(fields).sort()) {
      if (k !== "model" && k !== "text" && fields[k] !== null && fields[k] !== undefined) kept[k] = fields[k];
    }
    return endpoint + JSON.stringify(kept);
  }
  const EMBEDDED = EMBED ? new Map(EMBED.answers.map(([e, f, a]) => [answerKey(e, f), a])) : null;
  class Missing extends Error {}
  async function ask(endpoint, fields) {
    if (EMBED) {
      const a = EMBEDDED.get(answerKey(endpoint, fields));
      if (!a) throw new Missing("not in this exported file — run qkv view to explore every token and head");
      return a;
    }
    return qkvPage.post(endpoint, JSON.stringify(Object.assign({ model: S.model, text: S.text }, fields)));
  }

  // -- the selection and the URL ---------------------------------------------------------------
  function readUrl() {
    let q;
    try { q = new URLSearchParams(location.search); } catch (e) { return; }
    if (q.has("text")) S.text = q.get("text");
    if (q.has("model")) S.model = q.get("model");
    if (q.has("method")) S.method = q.get("method");
    if (q.has("effects")) S.effects = q.get("effects");
    S.words = q.get("words") === "1";
    for (const k of ["layer", "head", "token", "key"]) {
      if (q.has(k) && /^\d+$/.test(q.get(k))) S[k] = Number(q.get(k));
    }
    headChosen = q.has("layer") || q.has("head");
  }
  function writeUrl() {
    if (EMBED) return; // a file:// or srcdoc page keeps its address
    const q = new URLSearchParams({ model: S.model, text: S.text, method: S.method,
      layer: S.layer, head: S.head });
    if (S.words) q.set("words", "1");
    if (S.token !== null) q.set("token", S.token);
    if (S.key !== null) q.set("key", S.key);
    if (S.effects) q.set("effects", S.effects);
    try { history.replaceState(null, "", "?" + q.toString()); } catch (e) { /* sandboxed */ }
  }

  // -- labels: units of the current text ---------------------------------------------------------
  // the tokens as text (the API's labels: qkv.models.tokenizer.display_token), never a raw Ġ or Ċ
  function queryLabels() { return crossAttention() ? D.cross.target_labels : D.overview ? D.overview.units : []; }
  function keyLabels() { return crossAttention() ? D.cross.source_labels : D.overview ? D.overview.units : []; }
  function numLayers() { return crossAttention() ? D.cross.num_layers : D.overview.num_layers; }
  function numHeads() { return crossAttention() ? D.cross.num_heads : D.overview.num_heads; }

  // -- running ---------------------------------------------------------------------------------
  function run() {
    return update(async () => {
      writeUrl();
      status("running…");
      try {
        if (crossAttention()) {
          D.cross = await ask("cross", { token: S.token });
          if (S.token === null || S.token >= queryLabels().length) S.token = D.cross.focus; // the library's default
        } else {
          D.overview = await ask("overview", { token: S.token, words: S.words, method: S.method });
          S.token = D.overview.unit_index;
          D.maps = null;
          if (D.overview.units.length <= (modelInfo().whole_maps_units || 0)) {  // the library's cost model
            try { D.maps = await ask("maps", { words: S.words }); } catch (e) { D.maps = null; }
          }
          loadProbe();
          loadEffects();
        }
      } catch (e) {
        clearViews(); // nothing of another model or text stays under this one's name
        if (!(e instanceof Missing)) console.warn("qkv view:", e.message);
        throw e;
      }
      if (!headChosen && !crossAttention()) {  // the top-ranked head, as qkv explain ranks them
        const top = headRows()[0];
        if (top) { S.layer = top.layer; if (top.head !== null) S.head = top.head; }
        headChosen = true;
      }
      S.layer = Math.min(S.layer, numLayers() - 1);
      S.head = Math.min(S.head, numHeads() - 1);
      writeUrl();
      status("");
      drawTokens(); drawModelView(); await drawHeadView(); await drawSteps();
    });
  }
  // Every view emptied: the text or model changed and its answers are not in yet (or failed).
  function clearViews() {
    D.overview = null; D.cross = null; D.maps = null; D.map = null;
    for (const id of ["tokens", "grid", "ranking", "effects-ranking", "lines", "steps-body"]) $(id).replaceChildren();
    $("model-hint").textContent = ""; $("head-hint").textContent = "";
    $("head-title").textContent = "Head view";
    $("tip").hidden = true;
    const cv = $("heat"); cv.width = 0; cv.height = 0;
    drawHeatLabels(null);
    for (const sec of document.querySelectorAll("section.head-panel")) sec.hidden = true;
  }
  async function loadProbe() {
    if (D.probe) return;
    const model = S.model;
    try {
      const answer = await ask("probe", {});
      if (model !== S.model) return; // the page moved on to another model meanwhile
      D.probe = answer;
      if (D.overview) drawModelView();
    } catch (e) { /* the probe is an extra (an exported file may lack it); the model view works without it */ }
  }
  async function loadEffects() {
    const model = S.model, probe = S.effects;
    if (!probe || crossAttention()) { D.effects = null; return; }
    if (D.effects && D.effects.model_name === model && D.effects.probe === probe) return;
    D.effects = null;
    if (D.overview) drawModelView(); // "computing…" in the hint
    try {
      const answer = await ask("effects", { probe });
      if (model !== S.model || probe !== S.effects) return; // the page moved on meanwhile
      D.effects = Object.assign({ model_name: model }, answer);
    } catch (e) {
      status(e.message, true);
      if (!(e instanceof Missing)) console.warn("qkv view:", e.message);
      return;
    }
    if (D.overview) drawModelView();
  }
  async function selectToken(t) {
    if (t === S.token) return;
    S.token = t;
    if (crossAttention()) {
      await update(async () => { writeUrl(); drawTokens(); drawModelView(); await drawHeadView(); await drawSteps(); });
    } else {
      await run();
    }
    const b = document.querySelector(`#tokens button[data-token="${t}"]`);
    if (b && document.activeElement && document.activeElement.closest("#tokens")) b.focus();
  }
  async function selectHead(layer, head) {
    S.layer = layer; S.head = head; headChosen = true;
    await update(async () => { writeUrl(); markSelectedHead(); await drawHeadView(); await drawSteps(); });
  }
  // A head switch changes only which cell is selected: no need to redraw 72 thumbnails.
  function markSelectedHead() {
    for (const b of document.querySelectorAll("#grid button.cell")) {
      const on = Number(b.dataset.layer) === S.layer && (b.dataset.head === undefined || Number(b.dataset.head) === S.head);
      b.classList.toggle("selected", on);
      b.setAttribute("aria-pressed", on ? "true" : "false");
    }
  }

  // -- tokens ----------------------------------------------------------------------------------
  function drawTokens() {
    const box = $("tokens");
    box.replaceChildren();
    const labels = queryLabels();
    const special = crossAttention() ? labels.map((t) => t === "[EOS]") : D.overview.special;
    const focus = !crossAttention() ? D.overview.units.indexOf(D.overview.focus) : -1;
    labels.forEach((label, i) => {
      box.append(h("button", { type: "button", "data-token": i, "aria-pressed": i === S.token ? "true" : "false",
        class: (special[i] ? "special " : "") + (!crossAttention() && D.overview.focus === label && i === focus ? "focus" : ""),
        title: `${crossAttention() ? "target token" : D.overview.words ? "word" : "token"} ${i}`,
        onclick: () => selectToken(i) }, label));
    });
    $("tokens-title").firstChild.textContent = crossAttention() ? "Target tokens (queries) " : (S.words ? "Words " : "Tokens ");
  }
  $("tokens").addEventListener("keydown", (ev) => {
    const n = queryLabels().length;
    if (ev.key === "ArrowRight" && S.token < n - 1) { ev.preventDefault(); selectToken(S.token + 1); }
    if (ev.key === "ArrowLeft" && S.token > 0) { ev.preventDefault(); selectToken(S.token - 1); }
  });

  // -- model view: every layer × head for the selected token --------------------------------------
  function headRows() {
    // [{layer, head, weights (row over keys), max, argmax, rank, note, mark}] for the selected token
    const rows = [];
    if (crossAttention()) {
      // the library ranks the heads for each target token (CrossAttention.ranking)
      const c = D.cross, j = S.token, gold = c.gold && j < c.gold.length ? c.gold[j] : null;
      for (const { layer, head } of c.ranking[j]) {
        const li = c.layers.indexOf(layer), e = c.heads[li * c.num_heads + head];
        const w = c.weights[li][head][j], am = e.argmax[j];
        rows.push({ layer, head, weights: w, max: w[am], argmax: c.source_labels[am],
          onGold: gold ? gold.includes(am) : null, count: e.aligned ?? null, mark: !!e.best_aligned });
      }
    } else {
      const probeBest = new Set();
      if (D.probe) D.probe.heads.slice(0, 3).forEach((p) => probeBest.add(p.layer + ":" + p.head));
      for (const r of D.overview.heads) {
        rows.push({ layer: r.layer, head: r.head, weights: r.weights, max: r.max_weight, argmax: r.argmax,
          entropy: r.entropy_bits, focus: r.highlighted, mark: probeBest.has(r.layer + ":" + r.head) });
      }
    }
    rows.forEach((r, i) => { r.rank = i + 1; });
    return rows;
  }
  function drawModelView() {
    // a per-layer method (rollout, alti, …) has one row per layer: one column, "all heads"
    const perLayer = !crossAttention() && D.overview.per === "layer";
    const rows = headRows();
    const byHead = new Map(rows.map((r) => [r.layer + ":" + r.head, r]));
    const layers = crossAttention() ? D.cross.layers : [...Array(numLayers()).keys()];
    const whole = !crossAttention() && D.maps && !isMethod();
    const effects = !crossAttention() && !perLayer && D.effects ? D.effects.effects : null; // [layer][head]
    qkvPage.grid($("grid"), { layers, heads: numHeads(), perLayer, cell: (l, hh) => {
      const r = byHead.get(l + ":" + hh);
      if (!r) { // a hybrid's layer no softmax mixes (the overview's "unscored"): not ranked, its map on a click
        return qkvPage.gridCell({ layer: l, head: hh, chosen: l === S.layer && hh === S.head, focus: false,
          label: `layer ${l} head ${hh}: not ranked (no softmax weights); click for its effective map`, extra: "",
          onclick: () => selectHead(l, hh) }, h("canvas", {}), h("span", { class: "num" }, "—"));
      }
      const cv = h("canvas", {});
      if (whole) drawWholeThumb(cv, l, hh); else drawRowThumb(cv, r.weights);
      const label = crossAttention()
        ? `layer ${l} head ${hh}: rank ${r.rank}, largest weight ${fmt(r.max)} on ${r.argmax}` +
          (r.count !== null ? `, on gold for ${r.count} of ${D.cross.gold.length} target words` : "")
        : `layer ${l}${perLayer ? " (all heads)" : " head " + hh}: rank ${r.rank}, largest ${isMethod() ? S.method + " share" : "weight"} ${fmt(r.max)} on ${r.argmax}, entropy ${fmt(r.entropy, 2)} bits` +
          (r.focus ? ", highlighted" : "") + (r.mark ? `, a best ${probeName()}-probe head` : "") +
          (effects ? `, ablation effect ${signed(effects[l][hh])}` : "");
      return qkvPage.gridCell({ layer: l, head: hh, chosen: l === S.layer && (perLayer || hh === S.head),
        focus: r.focus, label, extra: whole ? " whole" : "", onclick: () => selectHead(l, perLayer ? S.head : hh) },
        cv, h("span", { class: "num" }, "#" + r.rank + " " + fmt(r.max, 2)),
        r.mark ? h("span", { class: "mark" }, crossAttention() ? "★ gold" : "★ " + probeName()) : null,
        // Δ in two significant digits fits a cell at 12 heads a row; its aria-label has all four decimals
        effects ? h("span", { class: "effect", title: "ablation effect Δ" }, compact(effects[l][hh])) : null);
    } });
    const hint = crossAttention()
      ? "per head: the selected target token's weights over the source; " + (D.cross.gold ? "ranked by words on the gold alignment (★: the best heads)" : "ranked by the largest weight in the row")
      : (isMethod() ? `method ${S.method}: ${D.info.methods[S.method]} — rows as shares of their total; ` : "") +
        `ranked by the largest ${isMethod() ? "share" : "weight"} in the row (#1 = most focused), as qkv explain ranks them; ` +
        `${whole ? "whole maps (the selected row outlined)" : "bars: the selected token's row"}; ` +
        `★ ${probeName()}: the ${probeName()} probe's 3 best heads` + (D.probe ? "" : " (computing…)") +
        (D.overview.focus ? `; bold border: heads whose largest weight is on “${D.overview.focus}”` : "");
    $("model-hint").textContent = "— " + hint + effectsHint();
    // the cells' colour scale: a weight (or a method's share) as the thumbnails draw it
    $("grid-legend").replaceChildren(qkvPage.scale({ hi: 1, most: 1, ticks: [0, 0.25, 0.5, 0.75, 1],
      caption: whole ? `shade: a weight of the head's whole map (row: from, column: to)`
        : `shade and bar height: the selected token's ${isMethod() ? S.method + " share" : "weight"} on each key` }).el);
    drawEffectsRanking(perLayer);
    const ol = $("ranking");
    ol.replaceChildren();
    for (const r of rows.slice(0, 12)) {
      ol.append(h("li", {}, h("button", { type: "button", onclick: () => selectHead(r.layer, r.head) },
        `L${r.layer}${r.head === null ? " (all heads)" : " H" + r.head} → ${r.argmax} ${fmt(r.max)}` +
        (r.entropy !== undefined ? ` (entropy ${fmt(r.entropy, 2)} bits)` : "") +
        (r.count !== null && r.count !== undefined ? ` (gold ${r.count}/${D.cross.gold.length})` : "") +
        (r.focus ? " ◆" : "") + (r.mark ? " ★" : ""))));
    }
  }
  function probeName() { return D.probe ? D.probe.probe : "probe"; }
  function effectsHint() {
    if (!S.effects || crossAttention()) return "";
    const e = D.effects;
    if (!e) return `; Δ: ablation effects on ${S.effects} (computing: every head ablated…)`;
    return `; Δ: each head's ablation effect on ${e.probe} — ${e.metric}, with that head ${e.mode}-ablated, ` +
      `minus the clean run's ${fmt(e.clean)} (${e.sequences} sequences; qkv.explain.head_effects)`;
  }
  function drawEffectsRanking(perLayer) {
    // the library's ranking (HeadEffects.ranked): the heads whose removal changes the probe most
    const ol = $("effects-ranking");
    if (!ol) return;
    const e = !crossAttention() && !perLayer ? D.effects : null;
    ol.hidden = !e;
    ol.replaceChildren(...(e ? e.heads.slice(0, 12) : []).map((r) =>
      h("li", {}, h("button", { type: "button", onclick: () => selectHead(r.layer, r.head) },
        `L${r.layer} H${r.head} Δ ${signed(r.effect)}`))));
  }
  // a method whose rows are shares, not the attention weights themselves (the library says which)
  function isMethod() { return !crossAttention() && !(D.info.raw_methods || []).includes(S.method); }
  function drawRowThumb(cv, w) {
    const n = w.length; cv.width = Math.max(n, 1); cv.height = 12;
    const ctx = cv.getContext("2d"), [r, g, b] = heatRgb();
    for (let i = 0; i < n; i++) {
      const v = Number(w[i]) || 0;
      ctx.fillStyle = `rgba(${r},${g},${b},${Math.max(0.04, v)})`;
      ctx.fillRect(i, 12 - Math.max(1, v * 12), 1, Math.max(1, v * 12));
    }
  }
  function drawWholeThumb(cv, l, hh) {
    const [, , U] = D.maps.shape, data = mapsData();
    cv.width = U; cv.height = U;
    const ctx = cv.getContext("2d"), img = ctx.createImageData(U, U), [r, g, b] = heatRgb();
    const off = ((l * D.maps.shape[1]) + hh) * U * U;
    for (let i = 0; i < U * U; i++) {
      img.data[4 * i] = r; img.data[4 * i + 1] = g; img.data[4 * i + 2] = b;
      img.data[4 * i + 3] = Math.round(255 * Math.min(1, data[off + i]));
    }
    ctx.putImageData(img, 0, 0);
    ctx.strokeStyle = cssColor("--focus"); ctx.lineWidth = 1;
    ctx.strokeRect(0, S.token + 0.5, U, 0);
  }
  function mapsData() {
    if (!D.maps._f32) D.maps._f32 = decodeF32(D.maps.weights);
    return D.maps._f32;
  }

  // -- head view: lines and heat map of one head ---------------------------------------------------
  // The current head's map: {rows: labels (queries), cols: labels (keys), n, m, get(i, j), gold}
  async function currentMap() {
    if (crossAttention()) {
      const c = D.cross, li = c.layers.indexOf(S.layer), w = c.weights[li][S.head];
      return { rows: c.target_labels, cols: c.source_labels, n: c.target.length, m: c.source.length,
        get: (i, j) => w[i][j], gold: c.gold, layer: S.layer, head: S.head };
    }
    let data, U;
    const units = D.overview.units;
    if (D.overview.tokens.length > D.info.limits.map_tokens) {
      // a long text: no whole map; the selected token's row of this head, from the overview
      const r = D.overview.heads.find((x) => x.layer === S.layer && x.head === S.head) || D.overview.heads[0];
      return { rows: [units[S.token]], cols: units, n: 1, m: units.length, first: S.token,
        get: (i, j) => r.weights[j], gold: null, layer: S.layer, head: S.head, rowOnly: true };
    }
    // a hybrid's linear / state-space layer (not ranked by the overview): its exact effective map, asked per head
    const effective = ((D.overview.unscored || {}).layers || []).includes(S.layer);
    let marks = {};
    if (D.maps && !effective) {
      U = D.maps.shape[2];
      const all = mapsData(), off = ((S.layer * D.maps.shape[1]) + S.head) * U * U;
      data = all.subarray(off, off + U * U);
    } else {
      const a = await ask("map", { layer: S.layer, head: S.head, words: S.words });
      U = a.shape[0]; data = decodeF32(a.weights);
      if (a.effective) marks = { effective: true, mixer: a.mixer, rowSums: a.row_sums };
    }
    return { rows: units, cols: units, n: U, m: U, get: (i, j) => data[i * U + j], gold: null,
      layer: S.layer, head: S.head, first: 0, ...marks };
  }
  async function drawHeadView() {
    const title = crossAttention() ? `Head view — cross-attention, decoder layer ${S.layer}, head ${S.head}`
      : `Head view — layer ${S.layer}, head ${S.head}`;
    $("head-title").textContent = title;
    let M;
    const t0 = performance.now();
    try { M = await currentMap(); } catch (e) {
      D.map = null;
      $("head-hint").textContent = e.message; $("lines").replaceChildren();
      const cv = $("heat"); cv.width = 1; cv.height = 1;
      drawHeatLabels(null);
      if (!(e instanceof Missing)) throw e;
      return;
    }
    D.map = M;
    $("head-hint").textContent = (M.rowOnly ? "a long text: the selected token's row of this head (from the overview; no whole map is kept); "
      : M.n > ALL_LINES_UNTIL ? "lines: the selected token's row only (long text); " : "lines: thickness = weight; ") +
      "heat map: row = from, column = to; hover a cell for its exact weight" +
      (crossAttention() ? "" : "; click it: why this weight (its score split, under the heat map)") +
      (isMethod() ? `; the head view and the step panel show the attention weights (method ${S.method} drives the model view)` : "") +
      (M.gold ? "; gold alignment: dashed lines, outlined cells" : "") +
      (M.effective ? `. Effective attention of a ${M.mixer} layer: o = M·v exactly, signed (blue < 0 < the heat colour), ` +
        `rows need not sum to 1 — row sums: ${M.rowSums.map((x, i) => `${M.rows[i]} ${signed(x)}`).join(" · ")}` : "");
    const t1 = performance.now();
    drawLines(M); drawHeat(M);
    D.timings = { map_ms: t1 - t0, draw_ms: performance.now() - t1 }; // read by benchmarks/view.py
  }
  function drawLines(M) {
    const svg = $("lines"), rowH = Math.max(M.n, M.m) > 100 ? 4 : 16, W = 300;
    const height = Math.max(M.n + (M.first || 0), M.m) * rowH + 10;
    svg.setAttribute("width", W); svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${W} ${height}`);
    svg.replaceChildren();
    const accent = cssColor("--accent"), focus = cssColor("--focus"), gold = cssColor("--gold");
    const y = (i) => 10 + i * rowH;
    const g = h("g", {});
    const first = M.first || 0;
    for (let i = 0; i < M.n; i++) {
      const sel = i + first === S.token;
      if (M.n > ALL_LINES_UNTIL && !sel) continue;
      for (let j = 0; j < M.m; j++) {
        const w = M.get(i, j);
        if (w < 0.01 && !sel) continue;
        g.append(h("line", { x1: 90, y1: y(i + first) - 4, x2: 210, y2: y(j) - 4, stroke: sel ? focus : accent,
          "stroke-width": Math.max(0.3, w * 6), "stroke-opacity": sel ? Math.max(0.15, w) : w * 0.5 }));
      }
      if (M.gold && i < M.gold.length && (i === S.token || M.n <= ALL_LINES_UNTIL)) {
        for (const j of M.gold[i]) g.append(h("line", { x1: 90, y1: y(i) - 4, x2: 210, y2: y(j) - 4,
          stroke: gold, "stroke-width": 1.2, "stroke-dasharray": "3 2" }));
      }
    }
    svg.append(g);
    if (rowH >= 10) {
      M.rows.forEach((t, i) => svg.append(h("text", { x: 85, y: y(i + (M.first || 0)), "text-anchor": "end",
        class: i + (M.first || 0) === S.token ? "selected" : null }, t)));
      M.cols.forEach((t, j) => svg.append(h("text", { x: 215, y: y(j) }, t)));
    }
  }
  function cellSize(M) { return Math.max(1, Math.min(24, Math.floor(560 / Math.max(M.n, M.m)))); }
  // a row-only map (a long text) is drawn as one strip of cells at least 8 px tall
  function cellHeight(M) { return M.rowOnly ? Math.max(8, cellSize(M)) : cellSize(M); }
  // The heat map's token labels: queries down the left, keys along the top (rotated), one per
  // cell; none when a cell is under 8 px (the tip names every cell).
  function drawHeatLabels(M) {
    const rows = $("heat-rows"), cols = $("heat-cols");
    if (!M || cellSize(M) < 8) { rows.replaceChildren(); cols.replaceChildren(); return; }
    const c = cellSize(M), ch = cellHeight(M), size = Math.min(11, c - 1) + "px", first = M.first || 0;
    rows.replaceChildren(...M.rows.map((t, i) => h("div", { class: i + first === S.token ? "selected" : null, title: t,
      style: { height: ch + "px", "line-height": ch + "px", "font-size": size } }, t)));
    cols.replaceChildren(...M.cols.map((t) => h("div", { title: t, style: { width: c + "px", "font-size": size } }, t)));
  }
  function drawHeat(M, canvas) {
    if (!canvas) drawHeatLabels(M);
    const cv = canvas || $("heat"), c = cellSize(M), ch = cellHeight(M);
    const off = document.createElement("canvas"); off.width = M.m; off.height = M.n;
    const octx = off.getContext("2d"), img = octx.createImageData(M.m, M.n), [r, g, b] = heatRgb();
    // an effective map is signed: a diverging scale, |w| over the map's largest |w|, negatives blue
    let top = 1;
    if (M.effective) {
      top = 0;
      for (let i = 0; i < M.n; i++) for (let j = 0; j < M.m; j++) top = Math.max(top, Math.abs(M.get(i, j)));
    }
    for (let i = 0; i < M.n; i++) for (let j = 0; j < M.m; j++) {
      const k = 4 * (i * M.m + j), w = M.get(i, j), neg = M.effective && w < 0;
      img.data[k] = neg ? 33 : r; img.data[k + 1] = neg ? 102 : g; img.data[k + 2] = neg ? 172 : b;
      img.data[k + 3] = Math.round(255 * Math.min(1, Math.max(0, M.effective ? Math.abs(w) / (top || 1) : w)));
    }
    octx.putImageData(img, 0, 0);
    cv.width = M.m * c; cv.height = M.n * ch;
    const ctx = cv.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.fillStyle = cssColor("--bg"); ctx.fillRect(0, 0, cv.width, cv.height);
    ctx.drawImage(off, 0, 0, cv.width, cv.height);
    ctx.strokeStyle = cssColor("--focus"); ctx.lineWidth = Math.max(1, c / 6);
    ctx.strokeRect(0, (S.token - (M.first || 0)) * ch, cv.width, ch);
    if (S.key !== null && S.key < M.m && !crossAttention()) { // the cell "why this weight" splits
      ctx.strokeStyle = cssColor("--fg"); ctx.lineWidth = Math.max(1, c / 8);
      ctx.strokeRect(S.key * c + 1, (S.token - (M.first || 0)) * ch + 1, c - 2, ch - 2);
    }
    if (M.gold && c >= 4) {
      ctx.strokeStyle = cssColor("--gold");
      M.gold.forEach((js, i) => js.forEach((j) => ctx.strokeRect(j * c + 1, i * c + 1, c - 2, c - 2)));
    }
    if (M.indexed && c >= 4) { // an indexed layer: the keys its indexer kept for the selected row
      ctx.strokeStyle = cssColor("--gold"); ctx.lineWidth = Math.max(1, c / 8);
      const y = (M.indexed.token - (M.first || 0)) * ch;
      for (const j of M.indexed.selected) ctx.strokeRect(j * c + 1, y + 1, c - 2, ch - 2);
    }
  }
  // What the indexer did to cell (i, j) of the map (i: the indexed query's row), for its tooltip
  function indexedNote(M, i, j) {
    const x = M.indexed;
    if (!x || i + (M.first || 0) !== x.token || j > x.token) return "";
    return x.missed[j] === null ? " · kept by the indexer" : ` · left out by the indexer: missed the cut by ${fmt(x.missed[j])}`;
  }
  const heat = $("heat"), tip = $("tip");
  // The exact weight of cell (i, j), as text next to it (mouse or keyboard).
  function showCell(M, i, j) {
    if (i < 0 || j < 0 || i >= M.n || j >= M.m) { tip.hidden = true; return; }
    D.cursor = { i, j };
    tip.hidden = false;
    tip.textContent = `${M.rows[i]} → ${M.cols[j]}: ${fmt(M.get(i, j))}` +
      (M.gold && i < M.gold.length && M.gold[i].includes(j) ? " ✓ gold" : "") + indexedNote(M, i, j);
    tip.dataset.row = i; tip.dataset.col = j;
    tip.style.left = ((j + 1) * cellSize(M) + 8) + "px"; tip.style.top = ((i + 1) * cellHeight(M) + 4) + "px";
  }
  heat.addEventListener("mousemove", (ev) => {
    const M = D.map; if (!M) return;
    const rect = heat.getBoundingClientRect();
    showCell(M, Math.floor((ev.clientY - rect.top) / cellHeight(M)), Math.floor((ev.clientX - rect.left) / cellSize(M)));
  });
  heat.addEventListener("mouseleave", () => { tip.hidden = true; });
  heat.addEventListener("blur", () => { tip.hidden = true; });
  heat.addEventListener("focus", () => { D.cursor = null; }); // the keys start at the selected row
  // A cell (i, j) clicked (or Enter on it): row i becomes the selected token, column j the key
  // whose score "why this weight" splits (a cell panel, PANELS below).
  async function selectCell(i, j) {
    S.key = crossAttention() ? null : j;
    if (i !== S.token) {  // the row's token first (its redraw asks the other panels), the cell's panel at once
      S.token = i;
      await update(async () => { writeUrl(); drawTokens(); if (D.map) { drawLines(D.map); drawHeat(D.map); } await drawHeadPanels(null, "cell", true); });
      await run();
      return;
    }
    await update(async () => { writeUrl(); if (D.map) drawHeat(D.map); await drawHeadPanels(null, "cell", true); });
  }
  // The panel scrolled so that as much of it as fits is in view, its title first
  function inView(sec) {
    const r = sec.getBoundingClientRect();
    if (r.top < 0 || r.bottom > innerHeight) sec.scrollIntoView({ block: r.height > innerHeight ? "start" : "nearest" });
  }
  heat.addEventListener("keydown", (ev) => {
    const M = D.map; if (!M) return;
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    const at = D.cursor && D.cursor.i < M.n && D.cursor.j < M.m ? D.cursor : { i: Math.max(0, S.token - (M.first || 0)), j: -1 };
    if (moves[ev.key]) {
      ev.preventDefault();
      const [di, dj] = moves[ev.key];
      showCell(M, Math.min(M.n - 1, Math.max(0, at.i + di)), Math.min(M.m - 1, Math.max(0, at.j + dj)));
    } else if (ev.key === "Enter" && D.cursor) {
      selectCell(D.cursor.i + (M.first || 0), D.cursor.j);
    }
  });
  heat.addEventListener("click", (ev) => {
    const M = D.map; if (!M) return;
    const rect = heat.getBoundingClientRect();
    const i = Math.floor((ev.clientY - rect.top) / cellHeight(M)), j = Math.floor((ev.clientX - rect.left) / cellSize(M));
    if (i >= 0 && i < M.n && j >= 0 && j < M.m) selectCell(i + (M.first || 0), j);
  });

  // -- step panel: explain_head's numbers ---------------------------------------------------------
  function vec(v, id) { return h("div", { class: "vec", id }, v.map((x) => fmt(x)).join("  ")); }
  async function drawSteps() {
    await drawHeadPanels();
    const body = $("steps-body");
    let st;
    try {
      st = crossAttention()
        ? await ask("cross_steps", { token: S.token, layer: S.layer, head: S.head })
        : await ask("steps", { token: S.token, layer: S.layer, head: S.head, words: S.words });
    } catch (e) {
      body.replaceChildren(h("p", { class: "missing" }, e.message));
      if (!(e instanceof Missing)) throw e;
      return;
    }
    const keysTok = crossAttention() ? st.source_labels : st.labels;
    const qTok = crossAttention() ? (st.target_labels ? st.target_labels[st.target_index] : st.target_token) : st.labels[st.token_index];
    const i = crossAttention() ? st.target_index : st.token_index;
    const gold = crossAttention() && st.gold ? st.gold : [];
    const rows = keysTok.map((t, j) => h("tr", { "data-j": j, class: (j === i && !crossAttention() ? "selected " : "") + (gold.includes(j) ? "gold" : "") },
      h("td", {}, String(j)), h("td", { class: "tok" }, t),
      h("td", { class: "score" }, fmt(st.scores[j])), h("td", { class: "scaled" }, fmt(st.scaled[j])),
      h("td", { class: "mask" }, fmt(st.mask[j])), h("td", { class: "w" }, fmt(st.weights[j])),
      lazyVec(st.keys[j], "k"), lazyVec(st.values[j], "v")));
    const diff = st.max_abs_diff;
    body.replaceChildren(
      h("p", {}, crossAttention()
        ? `Cross-attention, decoder layer ${st.layer}, head ${st.head}, target token ${i} “${qTok}” looking at the source. `
        : `Layer ${st.layer}, head ${st.head}, token ${i} “${qTok}”. ` + (st.word ? `(word “${st.word}”: its last token) ` : ""),
      h("span", { class: "formula" }, `head dim d = ${st.head_dim}; 1/√d = ${fmt(st.scale, 6)}. ` +
        "score_j = q·k_j, scaled_j = score_j/√d (+ mask), w = softmax(scaled), output = Σ_j w_j v_j — recomputed in float64 by qkv.explain")),
      h("details", {}, h("summary", {}, `x — the vector entering the attention (${st.x.length} numbers)` + (st.x_source ? ": " + st.x_source : "")), vec(st.x, "step-x")),
      h("details", { open: true }, h("summary", {}, `q = x·W_Q + b_Q (${st.query.length} numbers)`), vec(st.query, "step-q")),
      h("div", { class: "scroll" }, h("table", { id: "steps-table" },
        h("thead", {}, h("tr", {}, ...["j", crossAttention() ? "source" : "token", "q·k_j", "/√d", "mask", "softmax w_j", "k_j", "v_j"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, rows))),
      h("p", {}, `Σ w_j = ${fmt(st.weights_sum, 6)}`),
      h("details", { open: true }, h("summary", {}, `Σ_j w_j v_j — recomputed (${st.output.length} numbers)`), vec(st.output, "step-out")),
      h("details", { open: true }, h("summary", {}, "the model's own head output"), vec(st.model_output, "step-model-out")),
      h("p", { id: "step-diff" }, "max |difference| = ", h("span", { class: "num ok", id: "step-diff-value" }, Number(diff).toExponential(2)),
        " (recomputed float64 vs the forward's float32)"),
      ...(st.notes || []).map((n) => h("p", { class: "hint" }, "note: " + n)));
  }
  function lazyVec(v, name) {
    const d = h("details", {}, h("summary", {}, `${name}_j (${v.length})`));
    d.addEventListener("toggle", () => { if (d.open && d.children.length === 1) d.append(vec(v)); });
    return h("td", { class: name }, d);
  }

  // -- export of the head view ------------------------------------------------------------------
  function download(name, blob) {
    const a = h("a", { href: URL.createObjectURL(blob), download: name });
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }
  function fileStem() { return `qkv-L${S.layer}-H${S.head}${crossAttention() ? "-cross" : ""}`; }
  function matrix(M) {
    const out = [];
    for (let i = 0; i < M.n; i++) { const r = []; for (let j = 0; j < M.m; j++) r.push(Number(M.get(i, j))); out.push(r); }
    return out;
  }
  function csvCell(s) { return /[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s; }
  function exportCsv(M) {
    const lines = [["from \\ to", ...M.cols].map(csvCell).join(",")];
    for (let i = 0; i < M.n; i++) {
      const r = [csvCell(M.rows[i])];
      for (let j = 0; j < M.m; j++) r.push(String(Number(M.get(i, j))));
      lines.push(r.join(","));
    }
    return lines.join("\n") + "\n";
  }
  function esc(s) { return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c])); }
  function exportSvg(M) {
    const c = Math.max(4, cellSize(M)), left = 90, top = 90;
    const W = left + M.m * c + 10, H = top + M.n * c + 10, [r, g, b] = heatRgb();
    const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="${Math.min(11, c)}">`,
      `<title>${esc(`qkv: layer ${M.layer} head ${M.head} — ${S.text}`)}</title>`,
      `<rect width="${W}" height="${H}" fill="#ffffff"/>`];
    if (c >= 6) {
      M.rows.forEach((t, i) => parts.push(`<text x="${left - 4}" y="${top + i * c + c * 0.75}" text-anchor="end">${esc(t)}</text>`));
      M.cols.forEach((t, j) => parts.push(`<text transform="translate(${left + j * c + c * 0.75},${top - 4}) rotate(-60)">${esc(t)}</text>`));
    }
    for (let i = 0; i < M.n; i++) for (let j = 0; j < M.m; j++) {
      const w = Number(M.get(i, j));
      parts.push(`<rect x="${left + j * c}" y="${top + i * c}" width="${c}" height="${c}" fill="rgb(${r},${g},${b})" fill-opacity="${w.toFixed(4)}"><title>${esc(M.rows[i])} → ${esc(M.cols[j])}: ${fmt(w)}</title></rect>`);
    }
    parts.push("</svg>");
    return parts.join("\n");
  }
  function exportPng(M) {
    const c = Math.max(4, cellSize(M)), left = 90, top = 90;
    const cv = document.createElement("canvas");
    cv.width = left + M.m * c + 10; cv.height = top + M.n * c + 10;
    const ctx = cv.getContext("2d");
    ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, cv.width, cv.height);
    const heatCv = document.createElement("canvas");
    const size = cellSize; // draw the heat map at c px per cell
    const M2 = Object.assign({}, M);
    drawHeatAt(heatCv, M2, c);
    ctx.drawImage(heatCv, left, top);
    ctx.fillStyle = "#1b1f24"; ctx.font = `${Math.min(11, c)}px sans-serif`;
    if (c >= 6) {
      ctx.textAlign = "right";
      M.rows.forEach((t, i) => ctx.fillText(t, left - 4, top + i * c + c * 0.75));
      ctx.textAlign = "left";
      M.cols.forEach((t, j) => { ctx.save(); ctx.translate(left + j * c + c * 0.75, top - 4); ctx.rotate(-Math.PI / 3); ctx.fillText(t, 0, 0); ctx.restore(); });
    }
    void size;
    return new Promise((resolve) => cv.toBlob(resolve, "image/png"));
  }
  function drawHeatAt(cv, M, c) {
    const off = document.createElement("canvas"); off.width = M.m; off.height = M.n;
    const octx = off.getContext("2d"), img = octx.createImageData(M.m, M.n), [r, g, b] = heatRgb();
    for (let i = 0; i < M.n; i++) for (let j = 0; j < M.m; j++) {
      const k = 4 * (i * M.m + j), a = Math.min(1, Math.max(0, M.get(i, j)));
      // composited on white, so the PNG looks the same in either colour scheme
      img.data[k] = Math.round(255 - a * (255 - r)); img.data[k + 1] = Math.round(255 - a * (255 - g));
      img.data[k + 2] = Math.round(255 - a * (255 - b)); img.data[k + 3] = 255;
    }
    octx.putImageData(img, 0, 0);
    cv.width = M.m * c; cv.height = M.n * c;
    const ctx = cv.getContext("2d"); ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, cv.width, cv.height);
  }
  document.querySelectorAll("[data-export]").forEach((b) => b.addEventListener("click", async () => {
    const M = D.map;
    if (!M) { status("nothing to export: no head is shown", true); return; }
    const kind = b.dataset.export, stem = fileStem();
    if (kind === "csv") download(stem + ".csv", new Blob([exportCsv(M)], { type: "text/csv" }));
    if (kind === "svg") download(stem + ".svg", new Blob([exportSvg(M)], { type: "image/svg+xml" }));
    if (kind === "json") {
      const obj = { model: S.model, text: S.text, method: S.method, words: S.words, kind: crossAttention() ? "cross-attention" : "self-attention",
        layer: M.layer, head: M.head, token: S.token, rows: M.rows, columns: M.cols, weights: matrix(M) };
      download(stem + ".json", new Blob([JSON.stringify(obj)], { type: "application/json" }));
    }
    if (kind === "png") download(stem + ".png", await exportPng(M));
  }));

  // -- export of the model view: every head's row for the selected token, as ranked ----------------
  document.querySelectorAll("[data-export-model]").forEach((b) => b.addEventListener("click", () => {
    if (!D.overview && !D.cross) { status("nothing to export yet", true); return; }
    const rows = headRows(), keys = keyLabels(), stem = `qkv-model-token${S.token}`;
    if (b.dataset.exportModel === "json") {
      // the answer itself: the library's to_dict() (explain() or cross_attention())
      const obj = crossAttention() ? D.cross : D.overview;
      download(stem + ".json", new Blob([JSON.stringify(obj)], { type: "application/json" }));
    } else {
      const lines = [["rank", "layer", "head", "max_weight", "argmax", ...keys].map(csvCell).join(",")];
      for (const r of rows) {
        lines.push([r.rank, r.layer, r.head === null ? "" : r.head, r.max, csvCell(String(r.argmax)),
          ...Array.from(r.weights, (w) => String(w))].join(","));
      }
      download(stem + ".csv", new Blob([lines.join("\n") + "\n"], { type: "text/csv" }));
    }
  }));

  // -- the form --------------------------------------------------------------------------------
  // Which panels a model gets: its capabilities (qkv.models.protocol), sent by /api/info.
  function crossAttention() {
    const m = D.info && D.info.models.find((x) => x.name === S.model);
    return !!(m && m.capabilities.cross_attention);
  }
  function modelInfo(name = S.model) { return D.info.models.find((m) => m.name === name) || D.info.models[0]; }
  // Why a control is off, said beside it (a title alone is not seen): an exported file's answers
  // are fixed; a translation model has no contribution methods or ablation probes.
  const READ_ONLY = "an exported file: its answers are fixed — run qkv view to change the model, text, method or effects";
  function fillForm() {
    const sel = $("model");
    sel.replaceChildren(...D.info.models.map((m) => h("option", { value: m.name, selected: m.name === S.model }, m.name + (m.capabilities.cross_attention ? " (translation)" : ""))));
    // the methods the library runs on this model (/api/info asks it per model)
    const offered = modelInfo().methods;
    const methods = Object.entries(D.info.methods).filter(([k]) => offered.includes(k));
    if (!EMBED && !methods.some(([k]) => k === S.method)) S.method = D.info.default_method;
    $("method").replaceChildren(...(methods.length
      ? methods.map(([k, d]) => h("option", { value: k, title: d, selected: k === S.method }, k))
      : [h("option", { value: S.method }, "—")]));
    $("text").value = S.text; $("words").checked = S.words;
    const ro = !!EMBED, why = [];
    if (ro) why.push(READ_ONLY);
    else if (!methods.length) why.push(`${S.model} has no contribution methods (its cross-attention is shown as weights) and no ablation probes`);
    for (const id of ["model", "text", "run", "method", "words"]) {
      $(id).disabled = ro || (id === "words" && crossAttention()) || (id === "method" && !methods.length);
      $(id).title = $(id).disabled ? why.join("; ") || "a translation model's tokens are not grouped into words" : "";
    }
    $("form-hint").textContent = why.join("; ");
    $("form-hint").hidden = !why.length;
    fillEffects(ro);
  }
  function fillEffects(ro) {
    // the probes whose ablation effects the library measures on this model (/api/info asks it)
    const probes = modelInfo().probes;
    if (S.effects && !probes.includes(S.effects)) S.effects = null;
    $("effects-probe").replaceChildren(...(probes.length
      ? probes.map((p) => h("option", { value: p, selected: p === S.effects }, p))
      : [h("option", { value: "" }, "—")]));
    $("effects").checked = !!S.effects;
    $("effects").disabled = $("effects-probe").disabled = ro || !probes.length || crossAttention();
    const why = ro ? READ_ONLY : !probes.length ? `no ablation probe applies to ${S.model}` : "";
    $("effects").title = $("effects-probe").title = why;
    $("effects-why").textContent = why ? "— " + why : "";
  }
  function toggleEffects() {
    S.effects = $("effects").checked ? $("effects-probe").value : null;
    writeUrl();
    loadEffects().then(() => { if (D.overview) drawModelView(); });
  }
  $("effects").addEventListener("change", toggleEffects);
  $("effects-probe").addEventListener("change", () => { if ($("effects").checked) toggleEffects(); });
  $("run-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("text").value, model = $("model").value;
    const modelChanged = model !== S.model, changed = modelChanged || text !== S.text;
    // the old model's example sentence becomes the new one's (the toy translation grammar knows
    // no "pizza"); a sentence typed by hand stays
    S.text = modelChanged && text === modelInfo().example ? modelInfo(model).example : text;
    S.model = model; S.method = $("method").value; S.words = $("words").checked;
    if (changed) { S.token = null; S.key = null; clearViews(); }
    if (modelChanged) { D.probe = null; D.effects = null; }
    fillForm(); run();
  });
  for (const id of ["words", "method", "model"]) $(id).addEventListener("change", () => $("run-form").requestSubmit());
  $("theme").addEventListener("click", () => {
    const root = document.documentElement, dark = matchMedia("(prefers-color-scheme: dark)").matches;
    const now = root.dataset.theme || (dark ? "dark" : "light");
    root.dataset.theme = now === "dark" ? "light" : "dark";
    if (D.overview || D.cross) { drawModelView(); if (D.map) { drawLines(D.map); drawHeat(D.map); } }
  });

  // -- panels: how the page draws each result kind ----------------------------------------------
  // PANELS[kind] for the rows of qkv.explain.kinds (/api/info's kinds: endpoint, fields, panel):
  //   "head" rows: {title, hint, draw(answer) → children} — a section under the head view, asked
  //     again with the selection's values of the row's fields whenever the head changes;
  //   "cell" rows: the same, for the heat map's clicked cell (S.key: its column) — {…, box: the
  //     element draw fills ("table" by default), empty: what it says before a cell is clicked};
  //   alone(answer): a result shown on its own (a notebook's display, qkv.view.notebook).
  // A new result kind is a row in kinds.py and an entry here.
  const PANELS = {
    overview: {},  // the model view, tokens and head view: run()
    cross: {},
    maps: {},
    steps: { alone: () => drawSteps() },
    cross_steps: { alone: () => drawSteps() },
    map: { alone: (a) => {
      D.overview = { units: a.units, special: a.special, num_layers: S.layer + 1, num_heads: S.head + 1, heads: [], words: a.words, tokens: a.units };
      const data = decodeF32(a.weights), U = a.shape[0];
      D.map = { rows: a.units, cols: a.units, n: U, m: U, get: (i, j) => data[i * U + j], gold: null, layer: S.layer, head: S.head };
      drawLines(D.map); drawHeat(D.map);
    } },
    received: {
      title: "Attention received", hint: "— each key's total weight Σᵢ wᵢⱼ over every query, in the selected head",
      draw: (r) => [h("caption", {}, `layer ${r.layer}, head ${r.head}: the ${r.rows} rows' weights summed per key`),
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "j"), h("th", { scope: "col" }, "key"),
          h("th", { scope: "col" }, "received Σᵢ wᵢⱼ"))),
        h("tbody", {}, r.units.map((u, j) => h("tr", { "data-j": j },
          h("td", {}, String(j)), h("td", {}, u), h("td", { class: "num" }, fmt(r.received[j])))))],
    },
    "row-entropy": {
      title: "Row entropy", hint: "— how spread each query's look is in the selected head: 0 bits = all its weight on one key, " +
        "log₂ U bits = spread evenly over all U keys it sees (U: the number of those keys)",
      draw: (r) => [h("caption", {}, `layer ${r.layer}, head ${r.head}: each row's entropy (at most ${fmt(r.bound, 2)} bits)`),
        h("thead", {}, h("tr", {}, ...["i", "query", "entropy (bits)", "top key", "top key's weight"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, r.units.map((u, i) => h("tr", { "data-i": i }, h("td", {}, String(i)), h("td", {}, u),
          h("td", { class: "num" }, fmt(r.entropy[i])), h("td", {}, r.units[r.argmax[i]]), h("td", { class: "num" }, fmt(r.max_weight[i])))))],
    },
    "score-attribution": {
      title: "Why this weight", box: "div",
      hint: "— a cell's score q·k/√d (row: the query, column: the key) split into (query component × key component) " +
        "terms: the embeddings, every earlier head, every earlier feed-forward and a bias (qkv why)",
      empty: "click a cell of the heat map (row: the query, column: the key) to split its score",
      draw: whyPanel,
    },
    // an indexed (sparse) layer: which keys its indexer let through for the query (kinds.py "indexed")
    indexed: {
      title: "Indexer", hint: "— sparse attention: the indexer scores every visible key, keeps the top k (outlined on the heat map's row), and " +
        "the head's softmax runs over those only; hover a key left out (here or on the map) for how far it missed the cut",
      draw: indexedPanel,
    },
    // a gated attention output (kinds.py "gate"): how much of the head's output the gate lets through
    gate: {
      title: "Output gate", hint: "— Qwen3-Next / 3.5: each head's output is multiplied by sigmoid(gate) before W_O; " +
        "a head with high weights and a closed gate contributes little",
      draw: gatePanel,
    },
    probe: { alone: (a) => alonePanel(`${a.probe} probe on ${a.model}: ${a.sentences} sentences; chance ${fmt(a.chance)}`, a.heads) },
    "head-scores": { alone: (a) => alonePanel(`${a.probe} probe on ${a.model}: ${a.sequences} sequences; chance ${fmt(a.chance)}` +
      ((a.effective || []).length ? `; layers ${a.effective.join(", ")} have no softmax weights: scored on their exact effective ` +
        `map as shares of each row's absolute weight, |M[i,k]| / Σ_j |M[i,j]| (the weight itself on a softmax row)` : "") +
      (a.unscored || []).map((u) => `; not scored: layer ${u.layer}, ${u.why}`).join(""), a.heads) },
    head_effects: { alone: (a) => alonePanel(`ablation effects on ${a.probe}, ${a.model}: ${a.metric}, each head ${a.mode}-ablated, ` +
      `minus the clean run's ${fmt(a.clean)} (${a.sequences} sequences)`, a.heads) },
  };
  // panel: "head" and "cell" (which: only one of them)
  function headPanels(which) {
    return Object.values(D.info.kinds).filter((row) => (which ? row.panel === which : row.panel === "head" || row.panel === "cell") &&
      PANELS[row.name] && PANELS[row.name].draw);
  }
  // a cell panel sits right under the head view (its clicks ask it), the head panels before the steps
  function panelSection(row) {
    let sec = $(row.name);
    if (!sec) {
      const p = PANELS[row.name], box = p.box || "table";
      sec = h("section", { id: row.name, class: "head-panel", "aria-labelledby": row.name + "-title" },
        h("h2", { id: row.name + "-title" }, p.title + " ", h("span", { class: "hint" }, p.hint)),
        h(box, { id: row.name + (box === "table" ? "-table" : "-body") }));
      // a cell panel under the heat map that is clicked (where the user is looking); a result
      // shown alone (qkv why --html) has no head view
      if (row.panel === "cell" && !document.querySelector("main .columns").hidden) $("head-view").append(sec);
      else $("steps").before(sec);
    }
    return sec;
  }
  // What a panel shows instead of numbers (a table's caption, or a paragraph)
  function panelNote(box, message) { return h(box.tagName === "TABLE" ? "caption" : "p", { class: "missing" }, message); }
  // The request of a row: the selection's value of each of its fields (their defaults: the row's)
  function requestOf(row) {
    return Object.fromEntries(row.fields.map((f) => [f.name, S[f.name] ?? f.default]));
  }
  // clicked: the cell panel was asked for by a click (it is scrolled into view while it computes)
  async function drawHeadPanels(alone, which, clicked) {
    for (const row of headPanels(which)) {
      const sec = panelSection(row), box = sec.lastElementChild;
      // a panel needs the text's own model view (a notebook's single result has none)
      // a per-layer kind (an indexer's) shows only where the selected layer has one
      sec.hidden = !modelInfo().capabilities[row.needs] || (!D.overview && alone !== row.name) ||
        (row.per_layer && alone !== row.name && !((modelInfo().layers || {})[row.name] || []).includes(S.layer));
      if (sec.hidden) continue;
      const limit = D.info.limits.map_tokens;
      if (row.whole_map && D.overview && D.overview.tokens.length > limit) {  // every row of a head: short texts only
        box.replaceChildren(panelNote(box, `a long text: kept for at most ${limit} tokens`));
        continue;
      }
      if (row.panel === "cell" && alone !== row.name) {
        // a score is between two tokens: a word map's cell is no one pair (the library splits tokens)
        const why = S.key === null ? PANELS[row.name].empty : S.words ? "a score is between two tokens: switch words off, then click a cell" : null;
        if (why) { box.replaceChildren(panelNote(box, why)); continue; }
      }
      // a busy sign while the library computes (a first "why" may take seconds)
      const busy = () => {
        box.replaceChildren(h(box.tagName === "TABLE" ? "caption" : "p", { class: "busy", role: "status" },
          row.panel === "cell" ? "computing this cell's score split…" : "computing…"));
        if (clicked && row.panel === "cell") sec.scrollIntoView({ block: "nearest" });
      };
      // a click shows it at once; a redraw only when an answer is slow (no flicker otherwise)
      const slow = clicked ? busy() : setTimeout(busy, 150);
      sec.setAttribute("aria-busy", "true");
      try {
        box.replaceChildren(...PANELS[row.name].draw(await ask(row.endpoint, requestOf(row))));
      } catch (e) {
        box.replaceChildren(panelNote(box, e.message)); // an extra: the rest still draws
      } finally {
        clearTimeout(slow);
        sec.removeAttribute("aria-busy");
      }
      if (clicked && row.panel === "cell") inView(sec);
    }
  }
  // "Indexer": an IndexedSelection's to_dict() — each visible key's index score, kept (✓, marked
  // row) or left out (its miss margin: the row's tooltip, and shown when the row is clicked)
  function indexedPanel(r) {
    const rank = new Map(r.selected.map((j, n) => [j, n + 1]));
    // the head view's map of this layer and head marks the kept keys on the query's row
    if (D.map && D.map.layer === r.layer && D.map.head === r.head && !D.map.effective && !S.words) {
      D.map.indexed = r; drawHeat(D.map);
    }
    const cut = r.cutoff === null ? "every visible key is kept (no cut)" : `the cut (lowest kept score) ${fmt(r.cutoff)}`;
    const margin = (j) => r.missed[j] === 0 ? "0 (a tie: top-k chose by position)" : fmt(r.missed[j]);
    return [h("caption", {}, `layer ${r.layer}, query ${r.token} “${r.units[r.token]}”: top ${r.topk} of ${r.token + 1} ` +
        `visible keys kept; ${cut}; head ${r.head}'s weights`),
      h("thead", {}, h("tr", {}, ...["j", "key", "index score", "kept", "weight", "missed the cut by"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, r.units.slice(0, r.token + 1).map((u, j) => {
        const kept = r.missed[j] === null;
        const miss = h("td", { class: "num miss" }, "");
        const row = h("tr", { "data-j": j, class: kept ? "kept" : "left-out",
          title: kept ? `kept: rank ${rank.get(j)} of ${r.selected.length} by index score` : `left out: missed the cut by ${margin(j)}` },
        h("td", {}, String(j)), h("td", {}, u), h("td", { class: "num" }, fmt(r.scores[j])),
        h("td", {}, kept ? `✓ ${rank.get(j)}` : "·"), h("td", { class: "num" }, fmt(r.weights[j])), miss);
        if (!kept) row.addEventListener("click", () => { miss.textContent = miss.textContent ? "" : margin(j); });
        return row;
      }))];
  }
  // "Output gate": a GatedHead's to_dict() — the library's verdict, then every token's gate and
  // what the head writes gated and ungated (the query's row marked)
  function gatePanel(r) {
    return [h("caption", { id: "gate-verdict" }, `layer ${r.layer}, head ${r.head}: ${r.verdict}`),
      h("thead", {}, h("tr", {}, ...["i", "token", "mean gate", "‖gated‖", "‖ungated‖", "let through"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, r.units.map((u, i) => h("tr", { "data-i": i, class: i === r.token ? "kept" : "" },
        h("td", {}, String(i)), h("td", {}, u), h("td", { class: "num" }, fmt(r.openness[i])),
        h("td", { class: "num" }, fmt(r.gated[i])), h("td", { class: "num" }, fmt(r.ungated[i])),
        h("td", { class: "num" }, `${fmt(100 * r.kept[i], 3)}%`))))];
  }
  // "Why this weight": a ScoreAttribution's to_dict() — the score, the terms' sum and its derived
  // bound, the library's largest terms (ScoreAttribution.top) and every term as a heat map.
  function whyPanel(a) {
    const pair = `layer ${a.layer}, head ${a.head}: query ${a.token_index} “${a.labels[a.token_index]}” → key ${a.key_index} “${a.labels[a.key_index]}”`;
    const cap = a.capped === null ? "" : ` (the terms are before the soft-cap; after it ${fmt(a.capped)})`;
    return [
      h("p", { id: "why-title" }, pair),
      h("p", {}, "score q·k/√d = ", h("span", { class: "num", id: "why-score" }, fmt(a.score)), ` from the forward${cap} · Σ terms = `,
        h("span", { class: "num", id: "why-sum" }, fmt(a.terms_sum)), " · |Σ terms − score| ≤ ",
        h("span", { class: "num", id: "why-bound" }, Number(a.bound).toExponential(2)), " (the forward's rounding, derived)"),
      ...(a.score_bias ? [h("p", { class: "hint" }, `the forward also added ${signed(a.score_bias)} (a score bias, ALiBi) besides q·k`)] : []),
      h("div", { class: "why-parts" },
        h("table", { id: "why-top" }, h("caption", {}, "the largest terms, by size"),
          h("thead", {}, h("tr", {}, ...["rank", "query side", "key side", "term"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, a.top.map((t, r) => h("tr", {}, h("td", {}, String(r + 1)), h("td", { class: "query" }, t.query),
            h("td", { class: "key" }, t.key), h("td", { class: "num term" }, signed(t.term)))))),
        termsMap(a)),
    ];
  }
  // Every term as a cell: rows the query side's components, columns the key side's; colour by sign,
  // strength by size against the largest; hover for the exact term.
  function termsMap(a) {
    const n = a.query_components.length, m = a.key_components.length, c = Math.max(3, Math.min(12, Math.floor(360 / Math.max(n, m))));
    const cv = h("canvas", { id: "why-map", width: m * c, height: n * c, role: "img",
      "aria-label": `every term: ${n} query-side × ${m} key-side components; hover for a term` });
    const tip = h("p", { class: "hint", id: "why-tip" }, "rows: query side · columns: key side · blue +, orange −; hover a cell");
    const ctx = cv.getContext("2d"), pos = heatRgb(), neg = cssColor("--focus");
    let top = 0;
    for (const row of a.terms) for (const t of row) top = Math.max(top, Math.abs(t));
    ctx.fillStyle = cssColor("--bg"); ctx.fillRect(0, 0, cv.width, cv.height);
    a.terms.forEach((row, i) => row.forEach((t, j) => {
      if (!t) return;
      ctx.globalAlpha = Math.abs(t) / (top || 1);
      ctx.fillStyle = t > 0 ? `rgb(${pos.join(",")})` : neg;
      ctx.fillRect(j * c, i * c, c, c);
    }));
    ctx.globalAlpha = 1;
    cv.addEventListener("mousemove", (ev) => {
      const r = cv.getBoundingClientRect(), i = Math.floor((ev.clientY - r.top) / c), j = Math.floor((ev.clientX - r.left) / c);
      if (i < 0 || j < 0 || i >= n || j >= m) return;
      tip.textContent = `${a.query_components[i]} × ${a.key_components[j]}: ${signed(a.terms[i][j])}`;
    });
    return h("div", { class: "why-map" }, cv, tip);
  }
  // A result on its own: its ranked heads as a table (every field of the answer's rows)
  function alonePanel(caption, heads) {
    const cols = heads.length ? Object.keys(heads[0]) : [];
    const cell = (v) => typeof v === "number" && !Number.isInteger(v) ? fmt(v) : v === null ? "—" : String(v);
    const sec = h("section", { id: "alone", "aria-labelledby": "alone-title" }, h("h2", { id: "alone-title" }, caption),
      h("table", { id: "alone-table" }, h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "rank"), ...cols.map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, heads.map((r, i) => h("tr", {}, h("td", {}, String(i + 1)), ...cols.map((c) => h("td", { class: c }, cell(r[c]))))))));
    hideTextViews();
    $("steps").before(sec);
  }
  // A result shown alone has no text's tokens, model view, head view or steps: not drawn empty
  function hideTextViews() {
    for (const id of ["tokens-section", "steps"]) $(id).hidden = true;
    document.querySelector("main .columns").hidden = true;
  }

  // -- start -----------------------------------------------------------------------------------
  async function start() {
    let alone = null;
    await update(async () => {
      if (EMBED) {
        D.info = EMBED.info;
        S.model = EMBED.model; S.text = EMBED.text;
        Object.assign(S, EMBED.state || {});
        headChosen = true;  // an exported file holds the answers of its own head
      } else {
        const r = await fetch("api/info");
        D.info = await r.json();
        S.model = D.info.default_model;
        S.text = D.info.default_text; // qkv view TEXT: the bare URL shows TEXT
        readUrl();
        if (!D.info.models.some((m) => m.name === S.model)) S.model = D.info.default_model;
      }
      if (S.text === null) S.text = modelInfo().example;
      fillForm();
      const kind = EMBED && EMBED.state && EMBED.state.view, p = kind && PANELS[kind];
      if (p && (p.alone || p.draw)) {
        // a notebook's single result: only its own panel has numbers
        alone = kind;
        status("a single qkv.explain result: only its numbers are in this page");
        if (p.alone) await p.alone(EMBED.answers[0][2]);
        else { hideTextViews(); await drawHeadPanels(kind); }
      }
    });
    if (!alone) await run();
  }
  window.qkvView = { state: S, data: D, answerKey, PANELS };
  start();
})();
