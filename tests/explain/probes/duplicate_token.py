"""An example probe, whole in one file (docs/architecture.md's probe recipe): duplicate-token heads
(Wang et al. 2022's IOI circuit) — from each token of the second copy of r, on repeated random
tokens (prefix, r, r), to that same token's earlier occurrence (key = query − n).

``register_probe(PROBE)`` makes ``probe(model, "duplicate-token")``, ``head_effects`` and
``faithfulness`` run it; tests/explain/probes/test_registry.py does.
"""

from __future__ import annotations

import torch

from qkv.explain import Effects, Probe
from qkv.explain.probes.induction import LOSS, Pattern, pattern_probe, repeated_task, scores_by

#: the score: from the second copy's rows to the same token n positions back
DUPLICATE = Pattern(rows=lambda t, n: torch.arange(t - n, t), back=lambda n: n)

PROBE = Probe(
    name="duplicate-token", sequences="on repeated random tokens",
    run=lambda model, *, method, progress: pattern_probe(model, "duplicate-token", DUPLICATE),
    # ablation reads the loss on the repeated half, as induction's does: a duplicate-token head
    # tells the next layers which tokens came before
    effects=Effects(task=repeated_task, needs=LOSS, scores=scores_by(DUPLICATE),
                    metric="mean next-token loss on the repeated half of random repeated sequences"))
