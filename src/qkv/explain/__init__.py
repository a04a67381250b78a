"""Explain attention as a library: a model and a text in, a typed result out.

Every function runs the model's own forward once and returns a frozen dataclass read off the
traces it recorded — never a second, "similar" computation. Each result has `to_dict()`: plain,
JSON-ready data, finite numbers only (a masked key's −inf is written `"-inf"`; the convention is
in `qkv.explain.jsonable`). The `qkv explain` / `qkv heads` commands are these functions
plus printing: `--json` prints `to_dict()`.

* `explain(model, text, *, token, words, top, to, layer)` → [`Overview`][qkv.explain.Overview]:
  every layer × head for one token, ranked (`qkv explain TEXT`)
* `explain_head(model, text, *, token, layer, head, words)` → [`HeadSteps`][qkv.explain.HeadSteps]:
  one head's arithmetic redone in float64 (`qkv explain TEXT --layer L --head H`)
* `attention_map(model, text, *, layer, head, words)` → [`AttentionMap`][qkv.explain.AttentionMap]:
  one head's map (the forward stops after `layer`); `attention_maps(model, text, *, layer, words)` →
  [`AttentionMaps`][qkv.explain.AttentionMaps]: one layer's heads, or (`layer=None`) every head's,
  one forward
* `heads(model, text, *, source, target)` → [`HeadRanking`][qkv.explain.HeadRanking]
  (`qkv heads TEXT --from A --to B` prints its `"heads"` list)
* `probe(model, name=None)` → `ProbeResult` for `"coref"`, `HeadScores` for
  `"induction"` / `"previous-token"` (None: the model's default, coref or — causal — induction;
  `qkv heads --probe NAME`); every probe is a `Probe` record in `PROBES`, and
  `register_probe(Probe(…))` adds one that `probe`, `head_effects` and `faithfulness` run
* `no_projection(model, text, *, layer)` → `NoProjection` (`--no-projection`)
* `ablate(model, text_or_ids, *, heads, mode)` → [`Ablation`][qkv.explain.Ablation],
  `patch(model, clean, corrupted, *, heads)` → [`Patching`][qkv.explain.Patching]
  (interventions.py); `head_effects(model, probe, *, mode)` →
  [`HeadEffects`][qkv.explain.HeadEffects] (`qkv heads --probe P --ablate`);
  `faithfulness(model, probe)` → [`Faithfulness`][qkv.explain.Faithfulness]: each method's Spearman
  ρ with the effects (`qkv faithfulness`)
* `contributions.contributions(model, text, *, method, token, words, target_text)` →
  [`Contributions`][qkv.explain.Contributions]: what each token hands on by `norm`,
  `rollout`, `flow`, `alti`, `value-zeroing` or `grad` (`qkv explain TEXT --method M --json`);
  `explain`, `heads` and `probe` take `method=` too, and
  `compare` runs them all (`--compare`)
* `document(model, text)` → [`Document`][qkv.explain.Document]: a long text after one forward that
  kept each layer's q, k and log-sum-exp (O(N)); `doc.explain(token=…)` is `explain`'s overview,
  plus `weights`, `received`, `block_map` — exact, blockwise
* `cross_attention(model, text, *, token, top, layer, gold, target)` →
  [`CrossAttention`][qkv.explain.CrossAttention] (`qkv explain TEXT --model translate`, or a
  transformers encoder-decoder directory); `attention_maps(model, source, target=…)` gives its
  `.cross` (L, H, t, s) teacher-forced
* `cross_attention_head(model, text, *, token, layer, head, gold)` →
  [`CrossHeadSteps`][qkv.explain.CrossHeadSteps] (`… --model translate --layer L --head H`)
* `received.attention_received(model, text, *, layer, head, words)` → each key's Σ_i w_ij
* `probe(model, "retrieval")` → `RetrievalScores` (Wu et al.'s retrieval heads on
  needle inputs); `needle_map(model, lengths=…, depths=…)` → `NeedleMap` (`qkv
  needle`); `atlas(model, corpus)` → `Atlas`: every head's metrics over a corpus
  (`qkv atlas`) — each at O(N) memory

`model` is a model from [`qkv.load`][qkv.load] (pass it in; nothing here loads or caches models),
asked for its `capabilities` ([`qkv.models.protocol`][qkv.models.protocol]): self-attention models
for the first functions, a model with cross-attention (`qkv.load("translate")`) for the last two.
Layers, heads, indices and occurrences (`token="it@0"`) count from 0.

Every result has a `kind` (`to_dict()["kind"]`) and a row in `kinds.KINDS`, the one
table the CLI, the viewer, the export and a notebook read (nothing here imports them).

Errors: a bad argument raises `ArgumentError` (a `QkvError`, so a
`ValueError`) whose message names the argument as this library spells it — `token 'cat' is not
a token of the text`, `layer 6 is out of range`; the CLI re-spells the same message with its
flags (`--token`, `--layer`, `--from`, `--to`) via `ArgumentError.spelled` — see
`qkv.explain.wording`. Notes about ambiguous choices (a repeated word, a split word) come back
in a result's `notes` the same way.

Examples:
    >>> import qkv
    >>> from qkv.explain import explain, explain_head
    >>> model = qkv.load("minilm")
    >>> text = "The dog found some pizza next to the baby and ate it"
    >>> ov = explain(model, text, token="it")
    >>> ov.units.labels[ov.focus], sum(ov.highlighted(r) for r in ov.rows)    # the focus word
    ('pizza', 7)
    >>> st = explain_head(model, text, token="it", layer=3, head=1)
    >>> round(float(st.weights[st.tokens.index("pizza")]), 2), st.max_abs_diff < 1e-5
    (0.75, True)
    >>> explain(model, text, token="cat")
    Traceback (most recent call last):
    ...
    qkv.explain.wording.ArgumentError: token 'cat' is not a token of the text; the tokens are: 0:[CLS] 1:the 2:dog 3:found 4:some 5:pizza 6:next 7:to 8:the 9:baby 10:and 11:ate 12:it 13:[SEP]

Where things are:

* `forward.py`  — the one traced forward pass every number comes from (`trace_rows`)
* `select.py`   — tokens vs words (`words=True`) and `token="it@1"`
* `overview.py` — [`explain`][qkv.explain.explain]: every layer and head ranked for one token
* `steps.py`    — [`explain_head`][qkv.explain.explain_head]: one head's arithmetic redone in
  float64, compared with the forward
* `maps.py`     — [`attention_map`][qkv.explain.attention_map]: one head's whole map
* `find_heads.py` — [`heads`][qkv.explain.heads] (from one word to another) and the coref probe
* `probes/` — a probe a record (`base.py`: `Probe`, `Effects`), the table and
  `probe` in `registry.py` (`PROBES`, `register_probe`); `induction.py`,
  `retrieval.py`, `needle.py`, `atlas.py`
* `ablation.py` — `no_projection`: attention with q = k = v = x
* `interventions.py`, `head_effects.py`, `faithfulness.py` — removing heads (zero/mean),
  patching them, each head's effect on a probe's task, and which methods agree with it
* `contributions/` — one file per method (`weight.py`, `norm.py`, `rollout.py`,
  `flow.py`, `alti.py`, `value_zeroing.py`, `grad.py`), the registry `METHODS` in its
  `__init__`, `compare.py`; `render_contributions.py` prints the comparison
* `saturation.py` — why divide by √d_k, on random vectors (`qkv softmax-demo`)
* `cross.py`    — [`cross_attention`][qkv.explain.cross_attention]: the same for a translation
  model's cross-attention
* `received.py` — [`attention_received`][qkv.explain.received.attention_received]: each key's total
  weight
* `kinds.py`    — the table of result kinds
* `wording.py`, `jsonable.py` — how messages name arguments; how results become JSON
* `render.py`, `render_cross.py` — terminal tables (rich); `figures.py` — a result's heat
  map (matplotlib), drawn with `plots.py`. None is imported here: the computation does not
  need them.
"""

from qkv.explain.circuits import (
    Composition, LogitAttribution, ScoreAttribution, ScoreRow, composition, logit_attribution,
    score_attribution,
)
from qkv.explain.causal.ablation import LayerSelf, NoProjection, no_projection
from qkv.explain.cross import CrossAttention, CrossHeadSteps, cross_attention, cross_attention_head
from qkv.explain.contributions import Contributions
from qkv.explain.long.document import Document, document
from qkv.explain.causal.faithfulness import Faithfulness, faithfulness
from qkv.explain.probes.find_heads import HeadRanking, HeadWeight, ProbeResult, heads
from qkv.explain.probes.base import Effects, Needs, Probe, Task
from qkv.explain.probes.registry import PROBES, probe, register_probe
from qkv.explain.causal.head_effects import HeadEffects, head_effects
from qkv.explain.probes.induction import HeadScores
from qkv.explain.causal.interventions import Ablation, Patching, ablate, patch
from qkv.explain.maps import AttentionMap, AttentionMaps, attention_map, attention_maps
from qkv.explain.overview import HeadRow, Overview, explain
from qkv.explain.steps import HeadSteps, explain_head
from qkv.explain.probes.retrieval import RetrievalScores, retrieval_ablation
from qkv.explain.probes.needle import NeedleMap, needle_map
from qkv.explain.probes.atlas import Atlas, atlas
from qkv.explain.wording import ArgumentError, Message

__all__ = [
    "ArgumentError", "AttentionMap", "AttentionMaps", "CrossAttention", "CrossHeadSteps", "HeadRanking", "HeadRow",
    "HeadScores", "HeadSteps", "HeadWeight", "LayerSelf", "Message", "NoProjection", "Overview", "ProbeResult",
    "attention_map", "attention_maps", "cross_attention", "cross_attention_head", "explain",
    "explain_head", "heads", "no_projection", "probe", "Contributions", "Document", "document",
    "Ablation", "Faithfulness", "HeadEffects", "Patching", "ablate", "faithfulness", "head_effects",
    "patch", "Composition", "LogitAttribution", "ScoreAttribution", "ScoreRow", "composition",
    "logit_attribution", "score_attribution", "RetrievalScores", "retrieval_ablation", "NeedleMap",
    "needle_map", "Atlas", "atlas", "Effects", "Needs", "PROBES", "Probe", "Task", "register_probe",
]
