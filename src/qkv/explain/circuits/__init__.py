"""Circuits: why a head scores a key as it does, and what heads write — exact on one forward.

One concept a file:

* `norms.py`        a LayerNorm / RMSNorm frozen at the scale a forward computed (affine)
* `parts.py`        a model's parts (`model.parts`), read once per model
* `residual.py`     a layer's input split by component: embed, each earlier head, each
                      feed-forward, bias — summing to the recorded hidden state
* `score.py`        `score_attribution` — one score as (query × key components) terms
* `latent.py`       an MLA head's query and key by component, through its latents and RoPE
* `logit.py`        `logit_attribution` — a logit as each component's direct part
* `composition.py`  `composition` — Q-, K-, V-composition of head pairs, from weights
* `ablate.py`       `remove_component` — the causal check: a component taken out of a
                      layer's input through the forward's `interventions`
"""

from qkv.explain.circuits.composition import Composition, composition
from qkv.explain.circuits.logit import LogitAttribution, logit_attribution
from qkv.explain.circuits.score import ScoreAttribution, ScoreRow, score_attribution

__all__ = ["Composition", "LogitAttribution", "ScoreAttribution", "ScoreRow", "composition",
           "logit_attribution", "score_attribution"]
