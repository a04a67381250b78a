// qkv atlas — a head atlas's page: every head a point by two metrics chosen from menus, a click
// listing the contexts where its pattern is strongest. The atlas is an answer: embedded by
// `qkv atlas --html` (<script id="qkv-data">) or, in `qkv view` (/atlas), a saved `qkv atlas --json`
// sent to POST /api/atlas, which checks it (Atlas.from_dict) and answers its to_dict(). The page
// positions points by the answer's numbers and computes none of them.
//
// document.body.dataset.state: "ready" once an atlas is drawn (or the page waits for a file),
// "busy" while one is opened, "error" after a refusal (its one line in the status).
"use strict";

(function () {
  const W = 640, H = 480, P = 56;  // the plot's size and its margin for the axes, px
  const { $, h, fmt, status, update } = qkvPage;
  const S = { x: null, y: null, chosen: null };  // the metrics on each axis; the head clicked
  let A = null;  // the atlas: Atlas.to_dict()

  // a metric's values across the heads → pixels; a range of zero width is widened to ±0.5
  function axis(name, lo, hi) {
    const vs = A.heads.map((r) => r[name]);
    let a = Math.min(...vs), b = Math.max(...vs);
    if (!(b > a)) { a -= 0.5; b += 0.5; }
    return { at: (v) => lo + (v - a) / (b - a) * (hi - lo), a, b };
  }
  function headName(r) { return `L${r.layer} H${r.head}`; }
  function metricsLine(r) { return A.metrics.map((m) => `${m} ${fmt(r[m])}`).join(" · "); }

  function draw() {
    const svg = $("plot"), fg = qkvPage.cssColor("--fg"), muted = qkvPage.cssColor("--muted");
    const accent = qkvPage.cssColor("--accent"), focus = qkvPage.cssColor("--focus");
    svg.setAttribute("width", W); svg.setAttribute("height", H);
    const x = axis(S.x, P, W - P), y = axis(S.y, H - P, P / 2);  // room right of a point for its label
    svg.replaceChildren(
      h("line", { x1: P, y1: H - P, x2: W - P / 2, y2: H - P, stroke: muted }),
      h("line", { x1: P, y1: H - P, x2: P, y2: P / 2, stroke: muted }),
      h("text", { x: (W + P / 2) / 2, y: H - 14, "text-anchor": "middle", fill: fg, id: "x-label" },
        `${S.x} (${fmt(x.a)} … ${fmt(x.b)})`),
      h("text", { x: 16, y: H / 2, transform: `rotate(-90 16 ${H / 2})`, "text-anchor": "middle", fill: fg, id: "y-label" },
        `${S.y} (${fmt(y.a)} … ${fmt(y.b)})`));
    for (const r of A.heads) {
      const chosen = S.chosen === r;
      const c = h("circle", { cx: x.at(r[S.x]), cy: y.at(r[S.y]), r: chosen ? 8 : 6, class: "head",
        "data-layer": r.layer, "data-head": r.head, fill: chosen ? focus : accent, "fill-opacity": 0.75,
        tabindex: 0, role: "button", "aria-label": `${headName(r)}: ${metricsLine(r)}` },
        h("title", {}, `${headName(r)}: ${S.x} ${fmt(r[S.x])}, ${S.y} ${fmt(r[S.y])}`));
      c.style.setProperty("cursor", "pointer");
      c.addEventListener("click", () => choose(r));
      c.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); choose(r); } });
      svg.append(c, h("text", { x: x.at(r[S.x]) + 9, y: y.at(r[S.y]) + 4, fill: muted, "font-size": 9 }, `L${r.layer}H${r.head}`));
    }
    $("plot-hint").textContent = `— ${A.heads.length} heads placed by ${S.x} (x) and ${S.y} (y); click one for its contexts`;
  }

  function choose(r) {
    S.chosen = r;
    $("info-title").textContent = headName(r);
    $("info-metrics").textContent = metricsLine(r);
    const items = r.contexts.map((c) => h("li", { "data-query": c.query, "data-key": c.key },
      h("span", { class: "num" }, `…${c.text}`), " → ", h("strong", {}, c.key_label ?? c.key_text),
      h("span", { class: "hint" }, ` weight ${fmt(c.weight)}, ${c.distance} back (query ${c.query}, key ${c.key})`)));
    $("contexts").replaceChildren(...(items.length ? items : [h("li", { class: "missing" }, "no contexts kept (qkv atlas --contexts 0)")]));
    draw();
  }

  function show(atlas) {
    A = atlas;
    const pick = (want, fallback) => (A.metrics.includes(want) ? want : fallback);
    for (const [sel, want, fallback] of [["x", "previous-token", A.metrics[0]], ["y", "induction", A.metrics[A.metrics.length - 1]]]) {
      $(sel).replaceChildren(...A.metrics.map((m) => h("option", { value: m }, m)));
      S[sel] = pick(want, fallback);
      $(sel).value = S[sel];
    }
    $("title").textContent = `— ${A.model}, ${A.tokens.toLocaleString("en")} tokens in ${A.windows} window(s) of ${A.window}; ` +
      `sink: the first ${A.first} token(s); retrieval chance ${fmt(A.retrieval_chance)}`;
    S.chosen = null;
    choose(A.heads[0]);
  }

  for (const sel of ["x", "y"]) $(sel).addEventListener("change", () => { S[sel] = $(sel).value; if (A) draw(); });
  $("file").addEventListener("change", () => {
    const f = $("file").files[0];
    if (!f) return;
    update(async () => { show(await qkvPage.post("atlas", await f.text())); });
  });
  $("theme").addEventListener("click", () => {
    const root = document.documentElement, dark = matchMedia("(prefers-color-scheme: dark)").matches;
    root.dataset.theme = (root.dataset.theme || (dark ? "dark" : "light")) === "dark" ? "light" : "dark";
    if (A) draw();
  });

  const embedded = document.getElementById("qkv-data");
  if (embedded) {  // qkv atlas --html: the answer is in the page; there is no server to open another
    $("open-label").hidden = true;
    update(async () => show(JSON.parse(embedded.textContent)));
  } else {
    status("open a saved atlas: qkv atlas --model M --file CORPUS --json > atlas.json");
    document.body.dataset.state = "ready";
  }
  window.qkvAtlas = { state: S, data: () => A };
})();
