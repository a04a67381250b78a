"""The head atlas as one self-contained HTML page (``qkv atlas --html FILE``): every head a point
placed by two metrics chosen from menus; a click lists that head's top contexts.

The page draws what :meth:`qkv.explain.probes.atlas.Atlas.to_dict` says and computes nothing: the JSON
is embedded whole (``<`` written ``\\u003c``, so no text of the corpus can close the script).

    >>> page = atlas_page({"kind": "atlas", "model": "</script>", "metrics": ["sink"], "heads": []})
    >>> page.startswith("<!doctype html>"), page.count("</script>")   # the model's name escaped
    (True, 2)
"""

from __future__ import annotations

import html
import json

_SCRIPT = r"""
const A = JSON.parse(document.getElementById('atlas').textContent);
const W = 640, H = 480, P = 48;
const xs = document.getElementById('x'), ys = document.getElementById('y');
for (const sel of [xs, ys]) for (const m of A.metrics) sel.add(new Option(m, m));
xs.value = A.metrics.includes('previous-token') ? 'previous-token' : A.metrics[0];
ys.value = A.metrics.includes('induction') ? 'induction' : A.metrics[A.metrics.length - 1];
const svg = document.getElementById('plot'), info = document.getElementById('info');
const NS = 'http://www.w3.org/2000/svg';
function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function scale(values, lo, hi) {
  let a = Math.min(...values), b = Math.max(...values);
  if (!(b > a)) { a -= 0.5; b += 0.5; }
  return [v => lo + (v - a) / (b - a) * (hi - lo), a, b];
}
function show(h) {
  info.replaceChildren();
  info.append(el('h2', {}, `L${h.layer} H${h.head}`));
  const p = document.createElement('p');
  p.textContent = A.metrics.map(m => `${m} ${h[m].toPrecision(3)}`).join(' · ');
  info.append(p);
  const ol = document.createElement('ol');
  for (const c of h.contexts) {
    const li = document.createElement('li');
    li.textContent = `…${c.text} → "${c.key_text}" (weight ${c.weight.toFixed(3)}, ${c.distance} back)`;
    ol.append(li);
  }
  if (!h.contexts.length) ol.append(Object.assign(document.createElement('li'), {textContent: 'no contexts kept'}));
  info.append(ol);
}
function draw() {
  svg.replaceChildren();
  const [fx, x0, x1] = scale(A.heads.map(h => h[xs.value]), P, W - P / 2);
  const [fy, y0, y1] = scale(A.heads.map(h => h[ys.value]), H - P, P / 2);
  svg.append(el('line', {x1: P, y1: H - P, x2: W - P / 2, y2: H - P, stroke: '#888'}));
  svg.append(el('line', {x1: P, y1: H - P, x2: P, y2: P / 2, stroke: '#888'}));
  svg.append(el('text', {x: W / 2, y: H - 12, 'text-anchor': 'middle'}, `${xs.value} (${x0.toPrecision(3)} … ${x1.toPrecision(3)})`));
  svg.append(el('text', {x: 14, y: H / 2, transform: `rotate(-90 14 ${H / 2})`, 'text-anchor': 'middle'}, `${ys.value} (${y0.toPrecision(3)} … ${y1.toPrecision(3)})`));
  for (const h of A.heads) {
    const c = el('circle', {cx: fx(h[xs.value]), cy: fy(h[ys.value]), r: 6, class: 'head'});
    c.append(el('title', {}, `L${h.layer} H${h.head}`));
    c.addEventListener('click', () => show(h));
    svg.append(c);
    svg.append(el('text', {x: fx(h[xs.value]) + 8, y: fy(h[ys.value]) + 4, class: 'label'}, `L${h.layer}H${h.head}`));
  }
}
xs.addEventListener('change', draw); ys.addEventListener('change', draw);
draw();
if (A.heads.length) show(A.heads[0]);
"""

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
.head { fill: #3465a4; fill-opacity: 0.7; cursor: pointer; } .head:hover { fill: #cc0000; }
.label { font-size: 9px; fill: #555; } #info li { margin: 0.3em 0; font-family: monospace; }
"""


def atlas_page(atlas: dict) -> str:
    """The page for an atlas's ``to_dict()`` (see the module docstring)."""
    data = json.dumps(atlas, ensure_ascii=False).replace("<", "\\u003c")
    title = html.escape(f"qkv atlas · {atlas.get('model', '')}")
    tokens = atlas.get("tokens")
    about = html.escape(f"{tokens:,} tokens in {atlas.get('windows')} windows of {atlas.get('window')}"
                        if isinstance(tokens, int) else "")
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{title}</h1><p>{about} · every head placed by "
            f"two metrics; click one for the contexts where its pattern is strongest.</p>"
            f"<label>x <select id=\"x\"></select></label> <label>y <select id=\"y\"></select></label>"
            f"<div><svg id=\"plot\" width=\"640\" height=\"480\"></svg></div><div id=\"info\"></div>"
            f"<script type=\"application/json\" id=\"atlas\">{data}</script>"
            f"<script>{_SCRIPT}</script></body></html>\n")


__all__ = ["atlas_page"]
