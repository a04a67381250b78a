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

  // What each metric measures, in its unit (the axes' titles; the module doc of
  // qkv.explain.probes.atlas defines them)
  const UNITS = { induction: "weight on the token after an earlier copy", "previous-token": "weight on the previous token",
    retrieval: "share of a needle copied", sink: "share of weight on the sink",
    distance: "mean distance looked back, tokens", entropy: "bits" };
  // a metric's values across the heads → pixels, on a range rounded out to its ticks (1, 2 or 5
  // × a power of ten apart); a range of zero width is widened to ±0.5
  function axis(name, lo, hi) {
    const vs = A.heads.map((r) => r[name]);
    let a = Math.min(...vs), b = Math.max(...vs);
    if (!(b > a)) { a -= 0.5; b += 0.5; }
    const raw = (b - a) / 5, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * p).find((x) => x >= raw);
    a = Math.floor(a / step + 1e-9) * step; b = Math.ceil(b / step - 1e-9) * step;
    const ticks = [];
    for (let v = a; v <= b + step / 2; v += step) ticks.push(Math.abs(v) < step / 1e6 ? 0 : v);
    const digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
    return { at: (v) => lo + (v - a) / (b - a) * (hi - lo), a, b, ticks, digits };
  }
  // Labels placed without overlap: each head's label tried right, left, above and below its point,
  // kept at the first place that overlaps no label or point already placed; a head with no free
  // place is labelled on hover and focus (its <title>) only. Sizes: 9 px text, ~5.6 px a character.
  function placeLabels(points) {
    const boxes = points.map((q) => ({ x0: q.x - 6, y0: q.y - 6, x1: q.x + 6, y1: q.y + 6 }));
    const free = (b) => b.x0 >= 0 && b.x1 <= W && b.y0 >= 0 && b.y1 <= H - P &&
      !boxes.some((o) => b.x0 < o.x1 && o.x0 < b.x1 && b.y0 < o.y1 && o.y0 < b.y1);
    return points.map((q) => {
      const w = 5.6 * q.text.length, hgt = 10;
      for (const [dx, dy, anchor] of [[9, 3, "start"], [-9, 3, "end"], [0, -9, "middle"], [0, 16, "middle"]]) {
        const x0 = anchor === "start" ? q.x + dx : anchor === "end" ? q.x + dx - w : q.x - w / 2;
        const b = { x0, y0: q.y + dy - hgt + 1, x1: x0 + w, y1: q.y + dy + 1 };
        if (free(b)) { boxes.push(b); return { x: q.x + dx, y: q.y + dy, anchor }; }
      }
      return null;
    });
  }
  function headName(r) { return `L${r.layer} H${r.head}`; }
  function metricsLine(r) { return A.metrics.map((m) => `${m} ${fmt(r[m])}`).join(" · "); }

  function draw() {
    const svg = $("plot"), fg = qkvPage.cssColor("--fg"), muted = qkvPage.cssColor("--muted");
    const accent = qkvPage.cssColor("--accent"), focus = qkvPage.cssColor("--focus");
    svg.setAttribute("width", W); svg.setAttribute("height", H);
    const x = axis(S.x, P + 8, W - P), y = axis(S.y, H - P - 8, P / 2);  // room right of a point for its label
    svg.replaceChildren(
      h("line", { x1: P, y1: H - P, x2: W - P / 2, y2: H - P, stroke: muted }),
      h("line", { x1: P, y1: H - P, x2: P, y2: P / 2, stroke: muted }),
      ...x.ticks.flatMap((v) => [h("line", { x1: x.at(v), x2: x.at(v), y1: H - P, y2: H - P + 5, stroke: muted }),
        h("text", { x: x.at(v), y: H - P + 17, "text-anchor": "middle", fill: muted, "font-size": 11, class: "tick x-tick" }, fmt(v, x.digits))]),
      ...y.ticks.flatMap((v) => [h("line", { x1: P - 5, x2: P, y1: y.at(v), y2: y.at(v), stroke: muted }),
        h("text", { x: P - 8, y: y.at(v) + 4, "text-anchor": "end", fill: muted, "font-size": 11, class: "tick y-tick" }, fmt(v, y.digits))]),
      h("text", { x: (W + P / 2) / 2, y: H - 12, "text-anchor": "middle", fill: fg, id: "x-label" },
        `${S.x} (${UNITS[S.x] || "per head"})`),
      h("text", { x: 14, y: H / 2, transform: `rotate(-90 14 ${H / 2})`, "text-anchor": "middle", fill: fg, id: "y-label" },
        `${S.y} (${UNITS[S.y] || "per head"})`));
    const points = A.heads.map((r) => ({ x: x.at(r[S.x]), y: y.at(r[S.y]), text: `L${r.layer}H${r.head}` }));
    // the chosen head's label first, so it always has a place
    const order = A.heads.map((r, i) => i).sort((i, j) => (A.heads[j] === S.chosen) - (A.heads[i] === S.chosen));
    const placed = new Array(points.length);
    placeLabels(order.map((i) => points[i])).forEach((at, k) => { placed[order[k]] = at; });
    A.heads.forEach((r, i) => {
      const chosen = S.chosen === r;
      const c = h("circle", { cx: points[i].x, cy: points[i].y, r: chosen ? 8 : 6, class: "head",
        "data-layer": r.layer, "data-head": r.head, fill: chosen ? focus : accent, "fill-opacity": 0.75,
        tabindex: 0, role: "button", "aria-label": `${headName(r)}: ${metricsLine(r)}` },
        h("title", {}, `${headName(r)}: ${S.x} ${fmt(r[S.x])}, ${S.y} ${fmt(r[S.y])}`));
      c.style.setProperty("cursor", "pointer");
      c.addEventListener("click", () => choose(r));
      c.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); choose(r); } });
      const at = placed[i];
      svg.append(c, at ? h("text", { x: at.x, y: at.y, "text-anchor": at.anchor, fill: chosen ? fg : muted, "font-size": 9,
        class: "head-label", "data-layer": r.layer, "data-head": r.head }, points[i].text) : null);
    });
    const unlabelled = placed.filter((at) => !at).length;
    $("plot-hint").textContent = `— ${A.heads.length} heads placed by ${S.x} (x) and ${S.y} (y); click one for its contexts` +
      (unlabelled ? `; ${qkvPage.plural(unlabelled, "crowded head")} named on hover` : "");
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
    for (const id of ["x-label-wrap", "y-label-wrap", "plot-section", "info"]) $(id).hidden = false;
    $("empty").hidden = true;
    const pick = (want, fallback) => (A.metrics.includes(want) ? want : fallback);
    for (const [sel, want, fallback] of [["x", "previous-token", A.metrics[0]], ["y", "induction", A.metrics[A.metrics.length - 1]]]) {
      $(sel).replaceChildren(...A.metrics.map((m) => h("option", { value: m }, m)));
      S[sel] = pick(want, fallback);
      $(sel).value = S[sel];
    }
    $("title").textContent = `— ${A.model}, ${qkvPage.plural(A.tokens, "token")} in ${qkvPage.plural(A.windows, "window")} of ${A.window}; ` +
      `sink: the first ${qkvPage.plural(A.first, "token")}; retrieval chance ${fmt(A.retrieval_chance)}`;
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
    // nothing to show yet: say how to make an atlas and open it (no empty menus, no empty plot)
    for (const id of ["x-label-wrap", "y-label-wrap", "plot-section", "info"]) $(id).hidden = true;
    $("empty").hidden = false;
    document.body.dataset.state = "ready";
  }
  window.qkvAtlas = { state: S, data: () => A };
})();
