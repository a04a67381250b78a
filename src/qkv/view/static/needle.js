// qkv needle — a needle map's page: depth (rows) × length (columns) tables of the needle's accuracy
// and the retrieval heads' attention on it, each cell's number in it and its exact value in its
// tooltip. The map is an answer: embedded by `qkv needle --html` (<script id="qkv-data">) or, in
// `qkv view` (/needle), a saved `qkv needle --json` sent to POST /api/needle, which checks it
// (NeedleMap.from_dict) and answers its to_dict(). The page computes none of its numbers.
"use strict";

(function () {
  const { $, h, fmt, status, update } = qkvPage;
  let M = null;  // the map: NeedleMap.to_dict()

  function percent(d) { return Math.round(d * 100) + "%"; }
  function table(id, name, values) {
    const head = h("tr", {}, h("th", { scope: "col" }, "depth \\ length"),
      M.lengths.map((n) => h("th", { scope: "col" }, n.toLocaleString("en"))));
    const rows = M.depths.map((d, i) => h("tr", {}, h("th", { scope: "row" }, percent(d)),
      values[i].map((v, j) => {
        // a cell's shade: its value, 0 … 1 (both maps are shares)
        const td = h("td", { "data-depth": i, "data-length": j,
          title: `depth ${percent(d)}, ${M.lengths[j].toLocaleString("en")} tokens: ${name} ${fmt(v, 6)}` }, fmt(v, 2));
        td.style.setProperty("background", `rgba(${qkvPage.cssColor("--heat")}, ${(0.85 * Math.min(1, Math.max(0, v))).toFixed(3)})`);
        td.style.setProperty("padding", "4px 10px");
        return td;
      })));
    $(id).replaceChildren(head, ...rows);
  }
  function show(map) {
    M = map;
    $("title").textContent = `— ${M.model}`;
    $("about").textContent = `a ${M.needle}-token needle in a ${M.haystack} haystack, copied again at the end ` +
      `(teacher-forced); ${qkvPage.plural(M.samples, "input")} per cell, seeds from ${M.seed}`;
    $("heads").textContent = `(${M.heads.map(([l, hh]) => `L${l} H${hh}`).join(", ")})`;
    table("accuracy", "accuracy", M.accuracy);
    table("attention", "attention", M.attention);
  }

  $("file").addEventListener("change", () => {
    const f = $("file").files[0];
    if (f) update(async () => show(await qkvPage.post("needle", await f.text())));
  });
  $("theme").addEventListener("click", () => {
    const root = document.documentElement, dark = matchMedia("(prefers-color-scheme: dark)").matches;
    root.dataset.theme = (root.dataset.theme || (dark ? "dark" : "light")) === "dark" ? "light" : "dark";
    if (M) show(M);
  });

  const embedded = document.getElementById("qkv-data");
  if (embedded) {  // qkv needle --html: the answer is in the page
    $("open-label").hidden = true;
    update(async () => show(JSON.parse(embedded.textContent)));
  } else {
    status("open a saved needle map: qkv needle --model M --lengths 1024,4096 --json > needle.json");
    document.body.dataset.state = "ready";
  }
  window.qkvNeedle = { data: () => M };
})();
