"""`attnlrp` (Achtibat et al., ICML 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance
Propagation for Transformers"): the relevance of every attention weight for one output.

LRP hands an output's value y back through the network, layer by layer, so that each input
receives a share (its *relevance* R); a rule says how each operation splits what it received.
AttnLRP's rules, all written as "input × a modified gradient" (the paper's efficient form,
R_x = x ⊙ G_x, with G the gradient except where a rule says otherwise):

    linear map  y = W x + b        ε-rule = gradient × input; the bias keeps b · G_y   (§3.1)
    softmax     s = softmax(x)     R_x = x ⊙ (R_s − s Σ R_s)  ≡ the plain softmax gradient;
                                   the linearisation's bias keeps Σ R_s − Σ x ⊙ G_x   (eq. 11)
    products    y = a · b, a @ b   uniform rule: R_a = R_b = ½ R_y — the gradient halved, for
                (q kᵀ, A v, SwiGLU's act(gate) ⊙ up: both factors depend on the input)  (eq. 13)
    norms       LayerNorm, RMSNorm identity rule on the normalisation: 1/σ is a constant, so
                                   the norm is linear in x (γ ⊙ (x − μ)/σ); β keeps β · G  (§3.3)
                                   (a norm written out, x · rsqrt(mean x²): rsqrt held constant)
    activations GELU, SiLU, ReLU   identity rule: R_x = R_y, i.e. G_x = G_y ⊙ f(x) / x   (§3.3)

Every other operation the forward runs (sums, residuals, RoPE's rotation, scaling, reshapes) is
linear and homogeneous, and conserves relevance under plain gradient × input. So, exactly,

    y = Σ_j R(x_j) + absorbed                (x_j: token j's vector entering layer 0)

where `absorbed` is what the biases, the norms' β and the softmax linearisations kept — the
conservation the tests check, term by term.

The rules are applied *to the model's own forward*, not to a copy: while the forward runs, a
`TorchFunctionMode` routes the operations above to autograd functions whose forward is the
very same call (bit-identical results) and whose backward is the rule. The graph starts at the
token embeddings (each `embedding` lookup is made a leaf); weights are never differentiated.

What the method scores, per head (`per="head"`), for a query row i: the relevance of each
attention weight, R^{ℓ,h}_ij = A^{ℓ,h}_ij · G(A^{ℓ,h}_ij) — half the relevance of the term
A_ij v_j in head h's output at i (the other half goes to v_j, by the uniform rule). The output
y explained for row i:

* a decoder: the logit of the model's own next-token prediction at i (as `grad`);
* an encoder: ‖h^L_i‖, token i's final vector read along its own direction (y = h^L_i · u with
  u = h^L_i / ‖h^L_i‖ held constant) — how much of token i's final representation each part of
  the network built, the quantity the coref ablation metric (1 − cos to the clean run) asks about.

One forward and one backward per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from qkv.explain.contributions.base import Method, Scores, check_layers
from qkv.explain.contributions.grad import is_decoder

FORMULA = "R^{ℓ,h}_ij = A_ij · G(A_ij), G the LRP-modified gradient of y (Achtibat et al. 2024)"


# -- the rules, as autograd functions: forward = the model's own call, backward = the rule ------
class _Linear(torch.autograd.Function):
    """`F.linear`; the bias keeps b · G (ε-rule with ε → 0 = gradient × input)."""

    @staticmethod
    def forward(ctx, x, weight, bias, ledger):
        ctx.save_for_backward(weight, bias)
        ctx.ledger = ledger
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        weight, bias = ctx.saved_tensors
        ctx.ledger.append((g * bias).sum().double())
        return g @ weight.to(g.dtype), None, None, None


class _Softmax(torch.autograd.Function):
    """softmax; G_x is the plain gradient, the linearisation keeps Σ s G − Σ x G_x (eq. 11)."""

    @staticmethod
    def forward(ctx, x, dim, ledger):
        s = torch.softmax(x, dim=dim)
        ctx.save_for_backward(x, s)
        ctx.dim, ctx.ledger = dim, ledger
        return s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        sg = s * g
        g_in = sg - s * sg.sum(ctx.dim, keepdim=True)
        # masked keys (x = −inf) have s = 0 and G = 0: no relevance, and no −inf · 0
        kept = torch.where(torch.isfinite(x), x * g_in, 0.0)
        ctx.ledger.append((sg.sum() - kept.sum()).double())
        return g_in, None, None


class _LayerNorm(torch.autograd.Function):
    """LayerNorm with 1/σ held constant (identity rule on the normalisation); β keeps β · G."""

    @staticmethod
    def forward(ctx, x, shape, weight, bias, eps, ledger):
        dims = tuple(range(-len(shape), 0))
        sigma = torch.sqrt(x.var(dims, unbiased=False, keepdim=True) + eps)
        ctx.save_for_backward(weight, bias, sigma)
        ctx.dims, ctx.ledger = dims, ledger
        return F.layer_norm(x, shape, weight, bias, eps)

    @staticmethod
    def backward(ctx, g):
        weight, bias, sigma = ctx.saved_tensors
        if bias is not None:
            ctx.ledger.append((g * bias).sum().double())
        gw = g * weight if weight is not None else g
        return (gw - gw.mean(ctx.dims, keepdim=True)) / sigma, None, None, None, None, None


class _RMSNorm(torch.autograd.Function):
    """RMSNorm with 1/rms held constant: linear in x, nothing kept."""

    @staticmethod
    def forward(ctx, x, shape, weight, eps):
        dims = tuple(range(-len(shape), 0))
        eps = torch.finfo(x.dtype).eps if eps is None else eps  # F.rms_norm's default
        rms = torch.sqrt(x.pow(2).mean(dims, keepdim=True) + eps)
        ctx.save_for_backward(weight, rms)
        return F.rms_norm(x, shape, weight, eps)

    @staticmethod
    def backward(ctx, g):
        weight, rms = ctx.saved_tensors
        gw = g * weight if weight is not None else g
        return gw / rms, None, None, None


class _Identity(torch.autograd.Function):
    """An element-wise activation y = f(x) passing relevance through unchanged: G_x = G_y f(x)/x."""

    @staticmethod
    def forward(ctx, x, f):
        y = f(x)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        nonzero = x != 0  # f(0) = 0 for GELU, SiLU, ReLU: nothing to pass on
        return torch.where(nonzero, g * y / torch.where(nonzero, x, 1.0), 0.0), None


def _uniform(op, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """op(a, b) with the gradient to each factor halved (uniform rule, R_a = R_b = ½ R_y).

    ½ (y + y) is y exactly in binary floating point, so the forward's value is unchanged.
    """
    return 0.5 * (op(a, b.detach()) + op(a.detach(), b))


_PRODUCTS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm,
             torch.mul, torch.Tensor.mul, torch.Tensor.__mul__}
_SOFTMAX = {torch.softmax, torch.Tensor.softmax, F.softmax}
_NORMALISERS = {torch.rsqrt, torch.Tensor.rsqrt}
_ACTIVATIONS = {F.gelu, F.silu, F.relu, torch.relu}


def _depends_on_input(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad and not isinstance(x, nn.Parameter)


class Rules(TorchFunctionMode):
    """Routes the forward's operations to the AttnLRP rules (see the module docstring).

    `ledger` collects, during the backward, every scalar a rule kept (biases, β, softmax).
    """

    def __init__(self):
        super().__init__()
        self.ledger: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.embedding:  # the graph's root: token vectors as leaves
            return func(*args, **kwargs).detach().requires_grad_(True)
        if func in _PRODUCTS and len(args) == 2 and not kwargs and all(map(_depends_on_input, args)):
            return _uniform(func, *args)
        if func in _SOFTMAX:
            x, dim = args[0], kwargs.get("dim", args[1] if len(args) > 1 else None)
            dtype = kwargs.get("dtype", args[2] if len(args) > 2 else None)
            return _Softmax.apply(x if dtype is None else x.to(dtype), dim, self.ledger)
        if func is F.linear:
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if bias is not None:
                return _Linear.apply(x, weight, bias, self.ledger)
        if func is F.layer_norm:
            x, shape, weight, bias, eps = _norm_args(args, kwargs, ("weight", "bias", "eps"),
                                                     (None, None, 1e-5))
            return _LayerNorm.apply(x, tuple(shape), weight, bias, eps, self.ledger)
        if func is F.rms_norm:
            x, shape, weight, eps = _norm_args(args, kwargs, ("weight", "eps"), (None, None))
            return _RMSNorm.apply(x, tuple(shape), weight, eps)
        if func in _NORMALISERS:  # a norm written out (Llama's x · rsqrt(mean x²)): 1/σ constant
            return func(*args, **kwargs).detach()
        if func in _ACTIVATIONS and len(args) == 1:
            return _Identity.apply(args[0], lambda x: func(x, **kwargs))
        return func(*args, **kwargs)


def _norm_args(args, kwargs, names, defaults):
    """(x, shape, *rest) of a norm call, positional or keyword."""
    rest = list(args[2:]) + [kwargs.get(n, d) for n, d in zip(names[len(args) - 2:],
                                                               defaults[len(args) - 2:])]
    return (args[0], args[1], *rest)


# -- one row's relevance -------------------------------------------------------------------------
@dataclass(frozen=True)
class Relevance:
    """AttnLRP for one query row — what `relevance` returns.

    Attributes:
        row: the token whose output is explained.
        target: y in words.
        y: the explained output's value.
        tokens: (t,) R(x_j), each token's relevance at the input of layer 0 (summed over E).
        weights: (L, h, t, s) R^{ℓ,h}_ij, the relevance of every attention weight.
        absorbed: what biases, norms' β and softmax linearisations kept (y = Σ tokens + absorbed).
    """

    row: int
    target: str
    y: float
    tokens: torch.Tensor
    weights: torch.Tensor
    absorbed: float


def _explained(model, out, row: int) -> tuple[torch.Tensor, str]:
    """(y, y in words) for row `row` of the forward `out` (see the module docstring)."""
    if is_decoder(model):
        logits = out.logits[0, row]  # (V,)
        k = int(logits.argmax())
        return logits[k], f"the logit of the predicted next token (id {k}) at token {row}"
    h = out.last_hidden_state[0, row]  # (E,)
    return h @ (h / h.norm()).detach(), f"the length of token {row}'s final vector"


def _weight_relevance(attn, trace, g: torch.Tensor) -> torch.Tensor:
    """(h, t, s) R_ij = A_ij · G(A_ij) = ½ A_ij ⟨G(o_i), v_j⟩ from the gradient reaching the heads'
    outputs o = A v (`g`: (1, t, h·d), out_proj's input): the uniform rule halves it."""
    a, v = trace.attention.weights[0], trace.attention.value[0]  # (h, t, s), (h, s, d)
    t = g.shape[1]
    g = g[0].detach().view(t, attn.num_heads, attn.head_dim).transpose(0, 1)  # (h, t, d)
    return 0.5 * a * (g.to(v.dtype) @ v.transpose(-1, -2))  # (h, t, s)


def relevance(model, ids: torch.Tensor, rows) -> list[Relevance]:
    """AttnLRP on `ids` (1, t), one backward per row in `rows`; one forward for all.

    Examples:
        >>> import qkv
        >>> model = qkv.load("minilm")
        >>> ids = torch.tensor([model.tokenizer.encode("the cat sat").ids])
        >>> r = relevance(model, ids, [3])[0]
        >>> r.weights.shape, abs(r.y - float(r.tokens.sum()) - r.absorbed) < 1e-3 * abs(r.y)
        (torch.Size([6, 12, 5, 5]), True)
    """
    check_layers(model, "attnlrp")
    rules = Rules()
    # the traced forward records the heads' outputs (out_proj's input, MultiHeadTrace.heads) in
    # the graph; no layer-0 leaf is needed: the graph starts at the embeddings (Rules), so
    # hidden_states[0] is in it.
    with torch.enable_grad():
        with rules:
            out = model(ids, torch.ones_like(ids), trace_rows=slice(None), output_hidden_states=True)
        x0 = out.hidden_states[0]  # (1, t, E)
        head_outputs = [tr.self_attn.heads for tr in out.traces]  # L × (1, t, h·d)
        found = []
        for row in [int(r) for r in torch.as_tensor(rows).reshape(-1)]:
            y, what = _explained(model, out, row)
            rules.ledger.clear()
            grads = torch.autograd.grad(y, [x0, *head_outputs], retain_graph=True)
            found.append(Relevance(
                row=row, target=what, y=float(y.detach()),
                tokens=(x0 * grads[0])[0].sum(-1).detach().double(),
                weights=torch.stack([_weight_relevance(layer.self_attn, tr, g) for layer, tr, g
                                     in zip(model.layers, [tr.self_attn for tr in out.traces], grads[1:])]),
                absorbed=float(sum(rules.ledger)) if rules.ledger else 0.0))
    return found


def compute(model, ids: torch.Tensor, rows: torch.Tensor, target_text: str | None = None) -> Scores:
    """(L, h, r, s): each row's R^{ℓ,h}_{row, j} (its own output explained)."""
    rows = torch.as_tensor(rows).reshape(-1)
    found = relevance(model, ids, rows)
    scores = torch.stack([r.weights[:, :, r.row] for r in found], dim=2)  # (L, h, r, s)
    return Scores(method="attnlrp", per="head", rows=rows, scores=scores, target=found[-1].target)


METHOD = Method(name="attnlrp", per="head", formula=FORMULA, compute=compute,
                cost="one forward and one backward per row (all rows traced: (t × t) per head)")
