"""`qkv evaluate`: a translation model on the grammar's test split, seen and unseen apart.

The report is a plain dict (what `--json` prints; the CLI also prints it as tables,
`qkv.cli.translate.render_report`):

```text
{"model": DIR, "beam": K, "splits": {"all"|"seen"|"unseen": {"sentences", "exact_match", "bleu"}},
 "alignment": {"tokens": n, "heads": [[acc per head] per layer], "best": {layer, head, accuracy}},
 "errors": [{"en", "expected", "got"}, …]   (the first few wrong translations)}
```
"""

from __future__ import annotations

import time
from collections.abc import Callable

from qkv.translate.checkpoint import Checkpoint
from qkv.translate.data import load_splits
from qkv.translate.decode import translate
from qkv.translate.metrics import bleu, exact_match, head_alignment

SHOWN_ERRORS = 5


def test_report(ckpt: Checkpoint, *, beam: int = 1,
                progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Translate the test split of the model's data seed and score it (see the module docstring);
    `progress(stage, done, total)` told while it translates and while it aligns."""
    t0 = time.perf_counter()
    splits = load_splits(int((ckpt.meta.get("train") or {}).get("data_seed", 0)))
    test = splits.test
    hyps = translate(ckpt.model, ckpt.vocab, [p.en for p in test], beam=beam, progress=progress)
    unseen = [splits.is_unseen(p) for p in test]
    parts = {}
    for name, keep in (("all", lambda u: True), ("seen", lambda u: not u), ("unseen", lambda u: u)):
        idx = [i for i, u in enumerate(unseen) if keep(u)]
        h, r = [hyps[i] for i in idx], [test[i].fr for i in idx]
        parts[name] = {"sentences": len(idx), "exact_match": exact_match(h, r), "bleu": bleu(h, r)}
    align = head_alignment(ckpt.model, ckpt.vocab, test, progress=progress)
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
