"""`grad` (attention × gradient; Chefer et al., 2021, "Generic Attention-model Explainability
for Interpreting Bi-Modal and Encoder-Decoder Transformers", eq. 5–7): the weights that a chosen
output is sensitive to.

A scalar target y is differentiated with respect to every attention weight; weights that are
large *and* that y would grow with count:

    Ā^ℓ = mean_h (A^{ℓ,h} ⊙ ∂y/∂A^{ℓ,h})⁺          (⁺: the positive part)
    R^ℓ = R^{ℓ−1} + Ā^ℓ R^{ℓ−1},   R^0 = I

and the scores are the rows of R^ℓ − I: R's identity is each token standing for itself through
the residual (1 on the diagonal, against gradients of order 1e-3), and would hide the rest.

The target y (`target`):

* a decoder (GPT-2, Llama): the logit of the model's own next-token prediction at the chosen
  token (the largest logit there);
* an encoder (BERT, MiniLM): the cosine similarity of the text's sentence embedding (the mean of
  the last layer over its tokens, the model's pooling) to that of a second text
  (`target_text`); an encoder without one has nothing to differentiate, so `grad` does not
  apply to it.

The gradient with respect to the weights is read off the forward: head h's output at token i is
`o_i = Σ_j A_ij v_j`, and A enters the forward nowhere else, so ∂y/∂A_ij = ⟨∂y/∂o_i, v_j⟩
with ∂y/∂o from one backward pass to the heads' outputs (`out_proj`'s input) and v_j the
forward's values. One forward and one backward; (t × t) per layer.
"""

from __future__ import annotations

import torch

from qkv.explain.contributions.base import Forward, Matrices, Method, check_layers, run
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import capabilities_of

FORMULA = "R^ℓ = R^{ℓ−1} + mean_h (A ⊙ ∂y/∂A)⁺ R^{ℓ−1}, R^0 = I; y a next-token logit or a similarity"


def is_decoder(model) -> bool:
    """Whether `model` predicts next tokens (its output has `logits`): its capabilities say."""
    return capabilities_of(model).next_token


def check_target(model, target_text: str | None) -> None:
    """ArgumentError when `grad` has no target on `model`, or an empty one."""
    name = model.name
    if is_decoder(model):
        if target_text is not None:
            raise ArgumentError("target_text", "{name} is for encoders: on {model}, a decoder, "
                                "{method} grad differentiates the logit of its own next-token "
                                "prediction", model=name)
        return
    if target_text is None:
        raise ArgumentError("method", "{name} 'grad' does not apply to {model} without a target: "
                            "an encoder has no next token to score; give {target_text} TEXT (the "
                            "similarity of the two sentence embeddings is differentiated)",
                            model=name)
    if not target_text.strip():
        raise ArgumentError("target_text", "{name} is empty; give a second text, e.g. "
                            "{target_text} \"a dog ate the pizza\"")


def _pooled(last: torch.Tensor) -> torch.Tensor:
    """(E,): the mean of the last layer over the tokens — the sentence embedding's direction."""
    return last[0].mean(0)


def target(model, fwd: Forward, row: int, target_text: str | None) -> tuple[torch.Tensor, str]:
    """(y, what y is in words) for the forward `fwd` (run with `grad=True`)."""
    if is_decoder(model):
        logits = fwd.output.logits[0, row]  # (V,)
        k = int(logits.argmax())
        word = model.tokenizer.decode([k]) if model.tokenizer is not None else str(k)  # a bare transformers model
        return logits[k], f"the logit of the predicted next token {word!r} (id {k}) at token {row}"
    ids = torch.tensor([model.tokenizer.encode(target_text).ids], dtype=torch.long)
    with torch.no_grad():
        other = _pooled(model(ids, torch.ones_like(ids)).last_hidden_state)
    y = torch.cosine_similarity(_pooled(fwd.output.last_hidden_state), other, dim=0)
    return y, f"the cosine similarity of the sentence embeddings to {target_text!r}"


def matrices(model, ids: torch.Tensor, rows: torch.Tensor, target_text: str | None = None
             ) -> Matrices:
    """Each layer's Ā^ℓ = mean_h (A ⊙ ∂y/∂A)⁺ (t, t), and the target in words (taken at the
    last of `rows`); `METHOD.run` rolls them out as R^ℓ − I.

    Examples:
        >>> import qkv
        >>> model = qkv.load("minilm")
        >>> ids = torch.tensor([model.tokenizer.encode("the cat sat").ids])
        >>> s = METHOD.run(model, ids, torch.tensor([3]), target_text="a cat")
        >>> s.scores.shape, s.target
        (torch.Size([6, 1, 5]), "the cosine similarity of the sentence embeddings to 'a cat'")
    """
    check_layers(model, "grad")
    check_target(model, target_text)
    row = int(torch.as_tensor(rows).reshape(-1)[-1])
    fwd = run(model, ids, slice(None), grad=True)
    y, what = target(model, fwd, row, target_text)
    grads = torch.autograd.grad(y, fwd.head_outputs)  # L × (1, t, h·d): ∂y/∂o
    out = []
    for layer, tr, g in zip(model.layers, fwd.traces, grads):
        attn, a = layer.self_attn, tr.self_attn.attention.weights[0]  # (h, t, s)
        t = g.shape[1]
        g = g[0].view(t, attn.num_heads, attn.head_dim).transpose(0, 1)  # (h, t, d)
        grad_a = g @ tr.self_attn.attention.value[0].transpose(-1, -2)  # (h, t, s): ∂y/∂A
        out.append((a * grad_a).clamp_min(0).mean(0).detach())  # (t, s)
    return Matrices(out, target=what)


METHOD = Method(name="grad", per="layer", formula=FORMULA, matrices=matrices,
                add_identity=True, gradients=True, reads_target=True,
                cost="one forward and one backward; (t × t) per layer")
