"""``qkv evaluate``: a translation model on the grammar's test split, seen and unseen apart.

The report is a plain dict (what ``--json`` prints)::

    {"model": DIR, "beam": K, "splits": {"all"|"seen"|"unseen": {"sentences", "exact_match", "bleu"}},
     "alignment": {"tokens": n, "heads": [[acc per head] per layer], "best": {layer, head, accuracy}},
     "errors": [{"en", "expected", "got"}, …]   (the first few wrong translations)}
"""

from __future__ import annotations

import time

from qkv.translate.checkpoint import Checkpoint
from qkv.translate.data import load_splits
from qkv.translate.decode import translate
from qkv.translate.metrics import bleu, exact_match, head_alignment

SHOWN_ERRORS = 5


def test_report(ckpt: Checkpoint, *, beam: int = 1) -> dict:
    """Translate the test split of the model's data seed and score it (see the module docstring)."""
    t0 = time.perf_counter()
    splits = load_splits(int((ckpt.meta.get("train") or {}).get("data_seed", 0)))
    test = splits.test
    hyps = translate(ckpt.model, ckpt.vocab, [p.en for p in test], beam=beam)
    unseen = [splits.is_unseen(p) for p in test]
    parts = {}
    for name, keep in (("all", lambda u: True), ("seen", lambda u: not u), ("unseen", lambda u: u)):
        idx = [i for i, u in enumerate(unseen) if keep(u)]
        h, r = [hyps[i] for i in idx], [test[i].fr for i in idx]
        parts[name] = {"sentences": len(idx), "exact_match": exact_match(h, r), "bleu": bleu(h, r)}
    align = head_alignment(ckpt.model, ckpt.vocab, test)
    layer, head, best = align.best()
    errors = [{"en": p.en, "expected": p.fr, "got": h, "unseen": u}
              for p, h, u in zip(test, hyps, unseen) if h != p.fr]
    return {
        "model": str(ckpt.directory), "step": ckpt.step, "beam": beam, "splits": parts,
        "alignment": {"tokens": align.tokens,
                      "heads": [[round(float(a), 4) for a in row] for row in align.accuracy],
                      "best": {"layer": layer, "head": head, "accuracy": round(best, 4)}},
        "wrong": len(errors), "errors": errors[:SHOWN_ERRORS],
        "seconds": round(time.perf_counter() - t0, 2),
    }


def render_report(report: dict, file=None) -> None:
    """Print the report as a few tables (plain text in a pipe)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from qkv.explain.render import console

    out = console(file)
    decoding = "greedy" if report["beam"] == 1 else f"beam {report['beam']}"
    out.print(Text(f"model: {report['model']} (step {report['step']}) · test split · {decoding}"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("test sentences", "left"), ("n", "right"), ("exact match", "right"),
                          ("BLEU", "right")):
        table.add_column(name, justify=justify)
    labels = {"seen": "seen combinations", "unseen": "held-out combinations", "all": "all"}
    for key in ("seen", "unseen", "all"):
        part = report["splits"][key]
        table.add_row(labels[key], str(part["sentences"]), f"{part['exact_match']:.2%}",
                      f"{part['bleu']:.2f}")
    out.print(table)
    al = report["alignment"]
    heads = al["heads"]
    out.print(Text(f"cross-attention alignment accuracy: the fraction of the {al['tokens']} French "
                   f"tokens whose most-attended English token is in the gold alignment"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("layer", justify="right")
    for h in range(len(heads[0])):
        table.add_column(f"H{h}", justify="right")
    for layer, row in enumerate(heads):
        table.add_row(f"L{layer}", *[f"{a:.2%}" for a in row])
    out.print(table)
    best = al["best"]
    out.print(Text(f"best head: L{best['layer']} H{best['head']} ({best['accuracy']:.2%})"))
    if report["errors"]:
        out.print(Text(f"{report['wrong']} wrong translations; the first {len(report['errors'])}:"))
        for e in report["errors"]:
            out.print(Text(f"  {e['en']}\n    expected {e['expected']}\n    got      {e['got']}"))
    else:
        out.print(Text("no wrong translations"))
