// What both pages share (app.js: a text; document.js: a long document), loaded before either and
// inlined with app.js in an exported page: the one POST to qkv view's JSON API, the element
// builder, number formatting, float32 decoding, the status line, the busy/ready state, and the
// model view's grid of layers × heads. Every number drawn is an answer's; nothing here computes one.
"use strict";

const qkvPage = (() => {
  const DIGITS = 4; // weights, scores and vector entries are shown with 4 decimals
  const $ = (id) => document.getElementById(id);
  const SVG = ["svg", "line", "text", "rect", "g", "title", "path", "circle"];

  // Identical requests in flight share one promise; an error answer becomes an Error naming its
  // field ("field: message"), as the API's 4xx bodies give them.
  const inflight = new Map();
  function post(endpoint, body) {
    const key = endpoint + body;
    if (inflight.has(key)) return inflight.get(key);
    const p = fetch("api/" + endpoint, { method: "POST", headers: { "Content-Type": "application/json" }, body })
      .then(async (r) => {
        const data = await r.json();
        if (!r.ok) {
          const e = data.error || {};
          throw new Error((e.field ? e.field + ": " : "") + (e.message || r.statusText));
        }
        return data;
      })
      .finally(() => inflight.delete(key));
    inflight.set(key, p);
    return p;
  }

  // h("button", {class, onclick, style: {prop: value}, …}, ...children); svg tags by name.
  function h(tag, attrs, ...children) {
    const el = SVG.includes(tag) ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = v;
      else if (k === "class") el.setAttribute("class", v);
      // through the CSSOM: the exported page's Content-Security-Policy refuses style attributes
      else if (k === "style") for (const [p, x] of Object.entries(v)) el.style.setProperty(p, x);
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c);
    return el;
  }
  function fmt(v, digits = DIGITS) {
    if (v === "-inf") return "−∞";
    if (v === "inf") return "∞";
    if (v === "nan") return "NaN";
    return Number(v).toFixed(digits);
  }
  // "1 token", "3 tokens" (never "token(s)")
  function plural(n, word) { return `${Number(n).toLocaleString("en")} ${word}${Number(n) === 1 ? "" : "s"}`; }
  function signed(v, digits = DIGITS) { return (Number(v) >= 0 ? "+" : "") + fmt(v, digits); }
  // two significant digits (exponent below 0.001): a label that fits a model-view cell
  function compact(v) {
    const a = Math.abs(Number(v));
    const s = a !== 0 && a < 0.001 ? Number(v).toExponential(1) : Number(v).toPrecision(2);
    return (Number(v) >= 0 ? "+" : "") + s;
  }
  function status(msg, isError) {
    const el = $("status");
    el.textContent = msg || "";
    el.classList.toggle("error", !!isError);
  }
  function decodeF32(b64) {
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  }
  function cssColor(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
  function heatRgb() { return cssColor("--heat").split(",").map(Number); }

  // document.body.dataset.state: "busy" while an update runs, "ready" once every running one has
  // finished, "error" after a failure, its message in the status line (tests and benchmarks wait on it).
  let running = 0;
  async function update(work) {
    running++;
    document.body.dataset.state = "busy";
    try {
      await work();
      if (running === 1) status("");
    } catch (e) {
      status(e.message, true);
      running--;
      document.body.dataset.state = "error";
      return;
    }
    running--;
    if (running === 0) document.body.dataset.state = "ready";
  }

  // The model view's grid: a header of heads, then per layer its label and one cell per head
  // (perLayer: one "all heads" column). cell(layer, head) → the button (head null when perLayer).
  function grid(el, { layers, heads, perLayer, cell }) {
    const H = perLayer ? 1 : heads;
    el.replaceChildren();
    el.style.setProperty("grid-template-columns", `2.5em repeat(${H}, minmax(0, 1fr))`);
    el.append(h("span", { class: "collabel" }, ""));
    for (let hh = 0; hh < H; hh++) el.append(h("span", { class: "collabel" }, perLayer ? "all heads" : "H" + hh));
    for (const l of layers) {
      el.append(h("span", { class: "rowlabel" }, "L" + l));
      for (let hh = 0; hh < H; hh++) el.append(cell(l, perLayer ? null : hh));
    }
  }
  // A cell's button: selected when it is the chosen head; text and aria-label from the caller.
  function gridCell({ layer, head, chosen, focus, label, extra, onclick }, ...children) {
    return h("button", { type: "button", class: "cell" + (extra || "") + (focus ? " focus" : "") + (chosen ? " selected" : ""),
      "data-layer": layer, "data-head": head, "aria-label": label, title: label,
      "aria-pressed": chosen ? "true" : "false", onclick }, ...children);
  }

  // A colour scale: the heat colour from transparent (lo) to SHADE_MAX (hi), with ticks, one line
  // of what it measures. shade(v) is the alpha a cell of value v gets on it — cells and legend
  // read the same scale. ticks: the values labelled (by fmt(v, digits)); unit after the last.
  const SHADE_MAX = 0.85;
  function scale({ lo = 0, hi, ticks, digits = 2, unit = "", caption, power = 1, most = SHADE_MAX }) {
    const span = hi > lo ? hi - lo : 1;
    const at = (v) => Math.pow(Math.min(1, Math.max(0, (Number(v) - lo) / span)), power);  // 0 … 1 along the bar
    const shade = (v) => most * at(v);
    const bar = h("div", { class: "legend-bar" });
    bar.style.setProperty("background", `linear-gradient(to right, rgba(${cssColor("--heat")}, 0), rgba(${cssColor("--heat")}, ${most}))`);
    const marks = h("div", { class: "legend-ticks" }, ticks.map((v, k) => h("span", {
      style: { left: (100 * at(v)).toFixed(1) + "%" } }, fmt(v, digits) + (k === ticks.length - 1 && unit ? " " + unit : ""))));
    const el = h("figure", { class: "legend", role: "img", "aria-label": `${caption}: ${ticks.map((v) => fmt(v, digits)).join(", ")}${unit ? " " + unit : ""}` },
      h("figcaption", {}, caption), bar, marks);
    return { el, shade, at };
  }

  return { DIGITS, $, post, h, fmt, signed, compact, status, decodeF32, cssColor, heatRgb, update, grid, gridCell, scale, plural };
})();
const qkvPost = qkvPage.post;
