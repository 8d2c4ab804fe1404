"""
Every activation of nanoFFN's feed-forward layers, and the registry of FFN variants (`VARIANTS`, at the bottom).

Read it top to bottom. Each family starts with its formula and its source, then the formula as plain PyTorch (a few
lines of autograd), then the module used in training, an `Activation`. model.py builds the FFN around them:
y = W_down φ(W_up x) for "mlp" variants, y = W_down (φ_gate(W_gate x) ⊙ φ_up(W_up x)) for "glu" variants (φ_up is the
identity for plain GLUs), and the Mixture of Experts treats every activation alike through their one interface.
"""
import difflib
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# ----------------------------------------------------------------------------------------------------------------------
# The dictionary of elementwise activations. LA and MoA mix these; a parameter-free activation added here becomes
# available to --act_dict at once.

# name -> φ
BASIS = {
    "identity": lambda h: h,
    "relu": torch.relu,
    "relu2": lambda h: torch.relu(h).square(),
    "gelu": F.gelu,
    "silu": F.silu,
    "leaky_relu": lambda h: F.leaky_relu(h, 0.01),
    "tanh": torch.tanh,
}


def parse_dict(act_dict):
    """'identity,relu,gelu' -> ['identity', 'relu', 'gelu'], checked against BASIS."""
    names = [n.strip() for n in act_dict.split(",") if n.strip()] if isinstance(act_dict, str) else list(act_dict)
    unknown = [n for n in names if n not in BASIS]
    if not names or unknown:
        raise ValueError(f"act_dict must be a comma-separated list of {', '.join(BASIS)}; got {act_dict!r}")
    if len(set(names)) < len(names):  # the learned coefficients are reported by name: a repeat would hide one
        raise ValueError(f"act_dict names each entry once; got {act_dict!r}")
    return names


def fp32(t):
    """At least fp32: half-precision inputs are computed in fp32 (fp64 stays fp64, for gradcheck)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def keep_inputs(formula, *args):
    """formula(*args), keeping only its inputs for backward. Plain autograd would keep every intermediate: PolyNorm of
    order r its r powers and r normalised tensors, a K-entry mixture its K activations, each as wide as the hidden
    layer. Eager, torch's checkpoint keeps the inputs and reruns the formula in backward. Compiled, the plain formula:
    Inductor fuses it and chooses what backward keeps by itself (a checkpoint there would only constrain it)."""
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return formula(*args)
    return checkpoint(formula, *args, use_reentrant=False)


class Activation(nn.Module):
    """What every activation does:
        gates = act.token_gates(x)   per-token gates from the FFN input x (MoA's c(x)), else None
        y     = act(h, gates)        φ(h), row-wise: row i of h uses row i of gates
        act.learned(x)               what it learned: {quantity: number or {name: number}}, e.g. {"alpha": {"gelu":
                                     0.93, ...}}; logged at every evaluation, averaged in summaries and drawn over
                                     training under its own names, so a new activation needs nothing else to show up
        act.curves(grid, h, x)       φ on a grid of points as each token sees it, for the pictures (inspect_run.py)
    The split lets a Mixture-of-Experts layer compute MoA's gates once per token and hand the same rows to every expert
    the token visits."""

    def token_gates(self, x):
        return None

    def learned(self, x):
        return {}

    def curves(self, grid, h, x):
        """φ at the points of grid (G,) for the tokens whose pre-activations h (N, m) and FFN inputs x (N, d) are given:
        one row per token where φ depends on it, else one row. Here φ acts on each point alone, with the token's own
        gates c(x_t) where token_gates gives some: φ_t(v) = forward(v, c(x_t)). An activation whose value at a point
        depends on the token's other channels overrides this (PolyNorm)."""
        gates = self.token_gates(x)
        return self(grid[None], None) if gates is None else self(grid.expand(len(gates), -1), gates)


# ----------------------------------------------------------------------------------------------------------------------
# Fixed activations


class Fixed(Activation):
    """φ(h) for a fixed φ in BASIS: relu, gelu (exact erf), relu2 = relu(h)² (Primer, So et al. 2021), silu,
    leaky_relu = max(h, 0.01h) (Maas et al. 2013), tanh, identity (the up branch of a plain GLU)."""

    def __init__(self, name):
        super().__init__()
        self.name, self.fn = name, BASIS[name]

    def forward(self, h, gates=None):
        return self.fn(h)

    def extra_repr(self):
        return self.name


# ----------------------------------------------------------------------------------------------------------------------
# PolyCom: polynomial composition activations (Zhuo et al., ICLR 2025, arXiv 2411.03884, official code
# github.com/BryceZhuo/PolyCom). Coefficients are stored as `coeffs = [a_0, a_1, ..., a_r]`: constant term first,
# then increasing powers. (The official code stores the highest power first; this order reads like the formula.)


def poly_formula(h, coeffs, use_relu, use_norm, eps=1e-6, norms_of=None):
    """a_0 + Σ_{p=1..r} a_p · N(b(h)^p), b = identity or relu, N(v) = v / sqrt(mean(v²) + ε) over the token's hidden
    channels (skipped without norm); in fp32 (at least), returned in h's dtype. norms_of: the tokens' own
    pre-activations, whose norms N takes where φ is drawn at other points h (the curves): one line computes both."""
    hf, a = fp32(h), fp32(coeffs)
    b = torch.relu if use_relu else (lambda v: v)
    base = b(hf)
    own = base if norms_of is None else b(fp32(norms_of))
    y = a[0] * torch.ones_like(base)
    for p in range(1, len(a)):
        inv_rms = torch.rsqrt((own**p).square().mean(-1, keepdim=True) + eps) if use_norm else 1.0
        y = y + a[p] * inv_rms * base**p
    return y.to(h.dtype)


class Poly(Activation):
    """
    PolyCom activations of order r (2–4), one set of r+1 learned scalars per FFN:
        polyrelu:      φ(h) = Σ_{i=1..r} a_i relu(h)^i + a_0     (no normalisation: can blow up, by design of the paper)
        polynorm:      φ(h) = Σ_{i=1..r} a_i N(h^i) + a_0
        polyrelunorm:  φ(h) = Σ_{i=1..r} a_i N(relu(h)^i) + a_0  (ablation from the paper)
    N normalises over the token's hidden channels (poly_formula). Init a_1..a_r = 1/r, a_0 = 0 (official code).
    Computed in fp32 under bf16/fp16 autocast: N's mean of h^(2r) overflows fp16 for |h| > 6.35 at r = 3.
    """

    def __init__(self, kind, order=3, eps=1e-6):
        super().__init__()
        if not 2 <= order <= 4:
            raise ValueError(f"poly_order must be 2, 3 or 4, got {order}")
        self.kind, self.eps = kind, eps
        self.use_relu = kind in ("polyrelu", "polyrelunorm")
        self.use_norm = kind in ("polynorm", "polyrelunorm")
        self.coeffs = nn.Parameter(torch.tensor([0.0] + [1.0 / order] * order))  # [a_0, a_1, ..., a_r]

    def forward(self, h, gates=None):
        return keep_inputs(poly_formula, h, self.coeffs, self.use_relu, self.use_norm, self.eps)

    def learned(self, x):
        return {"coeffs": {f"a{i}": a for i, a in enumerate(self.coeffs.tolist())}}

    def curves(self, grid, h, x):
        """N normalises each power over the token's own h, so one row per token (one row without N)."""
        return poly_formula(grid[None], self.coeffs, self.use_relu, self.use_norm, self.eps, norms_of=h)

    def extra_repr(self):
        return f"{self.kind}, order={self.coeffs.numel() - 1}"


# ----------------------------------------------------------------------------------------------------------------------
# LA and MoA: learnable and token-adaptive mixtures of the dictionary BASIS
# ("More Expressive Feedforward Layers: Part I", arXiv 2605.26647).


def mix_formula(h, weights, basis):
    """Σ_k c_k φ_k(h) over the dictionary basis (a tuple of φ), the weights c (..., K) broadcast over the hidden
    channels (a single row (K,) for LA's α, a row per token for MoA's gates), in fp32 (at least), returned in h's
    dtype."""
    hf, c = fp32(h), fp32(weights)
    return sum(c[..., k : k + 1] * fn(hf) for k, fn in enumerate(basis)).to(h.dtype)


def mix_product(g, u, cg, cu, basis_g, basis_u):
    """(Σ_k cg_k φ_k(g)) ⊙ (Σ_l cu_l φ_l(u)): both branches of la_glu / moa_glu, in fp32, returned in g's dtype."""
    return (mix_formula(fp32(g), cg, basis_g) * mix_formula(fp32(u), cu, basis_u)).to(g.dtype)


def _init_alpha(names, la_init):
    """LA/MoA coefficient init: 'mean' (1/K each), 'sum' (1 each, as reported for the paper), 'onehot:NAME'
    (α = 1 on NAME, 0 elsewhere: exactly the fixed activation NAME at step 0)."""
    K = len(names)
    if la_init == "mean":
        return torch.full((K,), 1.0 / K)
    if la_init == "sum":
        return torch.ones(K)
    if la_init.startswith("onehot:") and la_init[len("onehot:"):] in names:
        return F.one_hot(torch.tensor(names.index(la_init[len("onehot:"):])), K).float()
    raise ValueError(f"la_init must be onehot, mean, sum or onehot:NAME with NAME one of {', '.join(names)}, or A/B, "
                     f"each of mean, sum or onehot:NAME (gate/up branch); got {la_init!r}")


class LA(Activation):
    """
    Learnable activation: φ(h) = Σ_k α_k φ_k(h), one scalar α_k per dictionary entry per FFN, shared by all tokens
    and channels. Dictionary default: identity, relu, relu2, gelu, silu, tanh (K = 6).
    """

    def __init__(self, names, la_init="mean"):
        super().__init__()
        self.names = tuple(names)
        self.basis = tuple(BASIS[n] for n in self.names)
        self.alpha = nn.Parameter(_init_alpha(self.names, la_init))

    def forward(self, h, gates=None):
        return keep_inputs(mix_formula, h, self.alpha, self.basis)

    def learned(self, x):
        return {"alpha": dict(zip(self.names, self.alpha.tolist()))}

    def extra_repr(self):
        return ",".join(self.names)


MOA_GATES = ("sigmoid", "softmax", "tanh", "plain_sigmoid")  # --moa_gate: the forms of c_k(x) below


class MoA(Activation):
    """
    Mixture of activations: φ(h; x) = Σ_k c_k(x) φ_k(h), with per-token coefficients shared across hidden channels
        sigmoid (default):  c_k(x) = α_k · 2σ(u_k·x + b_k)
        softmax (ablation): c_k(x) = α_k · K·softmax(Ux + b)_k
        tanh (ablation):    c_k(x) = α_k · (1 + tanh(u_k·x + b_k))
        plain_sigmoid:      c_k(x) = σ(u_k·x), no α, no bias: the paper's gate, as its public summaries report it
    U, b (the Linear `mix_logits`) are zero-initialised, so the gates with α start at c_k = α_k: MoA starts exactly
    as LA and contains it. plain_sigmoid starts at c_k = ½, φ = ½ Σ_k φ_k(h), and has no α for la_init to set.
    """

    def __init__(self, names, n_embd, la_init="mean", gate="sigmoid"):
        super().__init__()
        if gate not in MOA_GATES:
            raise ValueError(f"moa_gate must be one of {', '.join(MOA_GATES)}; got {gate!r}")
        self.names, self.gate_kind = tuple(names), gate
        self.basis = tuple(BASIS[n] for n in self.names)
        plain = gate == "plain_sigmoid"
        self.alpha = None if plain else nn.Parameter(_init_alpha(self.names, la_init))
        # skip_init draws nothing from the RNG: a run then starts on the very weights of its seed's GELU run
        self.mix_logits = nn.utils.skip_init(nn.Linear, n_embd, len(self.names), bias=not plain)
        self.mix_logits.zero_init = True  # a GPT's weight init keeps it at zero too
        for p in self.mix_logits.parameters():
            nn.init.zeros_(p)

    def token_gates(self, x):
        """c(x): K gates per token, in fp32 at least (the logits come from the autocast dtype's matmul)."""
        z = fp32(self.mix_logits(x))
        if self.gate_kind == "plain_sigmoid":
            return torch.sigmoid(z)
        if self.gate_kind == "sigmoid":
            s = 2.0 * torch.sigmoid(z)
        elif self.gate_kind == "softmax":
            s = z.shape[-1] * torch.softmax(z, dim=-1)
        else:
            s = 1.0 + torch.tanh(z)
        return self.alpha * s

    def forward(self, h, gates):
        return keep_inputs(mix_formula, h, gates, self.basis)

    def learned(self, x):
        """α (plain_sigmoid: c_mean, the mean of c_k(x) over the tokens of x), and c_std: the std of c_k(x) across the
        tokens of x (how token-adaptive the mixture became)."""
        c = self.token_gates(x).reshape(-1, len(self.names))
        first = ("c_mean", c.mean(0)) if self.alpha is None else ("alpha", self.alpha)
        return {first[0]: dict(zip(self.names, first[1].tolist())), "c_std": dict(zip(self.names, c.std(0).tolist()))}

    def extra_repr(self):
        return f"{','.join(self.names)}, gate={self.gate_kind}"


def glu(act_gate, act_up, g, u, gates_gate, gates_up):
    """φ_gate(g) ⊙ φ_up(u). Two mixtures (la_glu, moa_glu) run as one product that keeps only g, u and their weights
    for backward: two products, each keeping its inputs, would also keep both mixtures' outputs."""
    if isinstance(act_gate, (LA, MoA)) and isinstance(act_up, (LA, MoA)):
        # each side's weights: MoA's per-token gates c(x), or LA's α (no gates), one row for every token
        cg, cu = (a.alpha if c is None else c for a, c in ((act_gate, gates_gate), (act_up, gates_up)))
        return keep_inputs(mix_product, g, u, cg, cu, act_gate.basis, act_up.basis)
    return act_gate(g, gates_gate) * act_up(u, gates_up)


# ----------------------------------------------------------------------------------------------------------------------
# xIELU: the expanded integral of the ELU (Huang et al. 2024, "Deriving Activation Functions Using Integration",
# arXiv 2411.13010), the learnable activation of the Apertus LLMs. A quadratic for positive inputs (like ReLU², but
# with a learned curvature) and, for negative inputs, a learned ELU-integral that keeps a small non-zero gradient.


def xielu_formula(h, a_p, a_n, beta, eps):
    """φ(h) = α_p·h² + β·h for h > 0, α_n·(expm1(min(h, ε)) − h) + β·h for h ≤ 0, with α_p = softplus(a_p),
    α_n = β + softplus(a_n); in fp32 (at least), returned in h's dtype."""
    hf = fp32(h)
    alpha_p, alpha_n = F.softplus(a_p), beta + F.softplus(a_n)
    pos = alpha_p * hf * hf + beta * hf
    # min(h, ε) with slope 1 at h = ε itself, the same in every torch version (torch.clamp's tie rule varies by version)
    neg = alpha_n * (torch.expm1(torch.where(hf <= eps, hf, eps)) - hf) + beta * hf
    return torch.where(hf > 0, pos, neg).to(h.dtype)


class XIELU(Activation):
    """
    φ(h) = α_p·h² + β·h                          for h > 0
    φ(h) = α_n·(expm1(min(h, ε)) − h) + β·h      for h ≤ 0
    with α_p = softplus(a_p), α_n = β + softplus(a_n) (both kept positive, α_n > β), β = 0.5 fixed, ε = −1e-6.
    Two learned scalars per FFN, initialised so that α_p = α_n = 0.8 (the paper's init). Computed in fp32 under
    autocast, as the reference implementations do.
    """

    def __init__(self, alpha_p_init=0.8, alpha_n_init=0.8, beta=0.5, eps=-1e-6):
        super().__init__()
        self.beta, self.eps = beta, eps
        inv_softplus = lambda v: math.log(math.expm1(v))
        self.a_p = nn.Parameter(torch.tensor(inv_softplus(alpha_p_init)))
        self.a_n = nn.Parameter(torch.tensor(inv_softplus(alpha_n_init - beta)))

    def forward(self, h, gates=None):
        return keep_inputs(xielu_formula, h, self.a_p, self.a_n, self.beta, self.eps)

    def learned(self, x):
        return {"alpha_p": F.softplus(self.a_p).item(), "alpha_n": (self.beta + F.softplus(self.a_n)).item()}


# ----------------------------------------------------------------------------------------------------------------------
# The registry: the single source of truth for the FFN variants, their kind (gated or not) and their activations.


@dataclass(frozen=True)
class Variant:
    """
    kind:   'mlp': y = W_down φ(W_up x), m = ffn_mult·d; 'glu': y = W_down (φ(W_gate x) ⊙ φ_up(W_up x)),
            m = round(2/3·ffn_mult·d), so the weights match the mlp.
    act:    builds φ (the gate branch's for glu) from (config, branch); act_up: glu only, builds φ_up (branch 1).
    extras: the learned scalars the activation(s) add per FFN layer, a formula of the config (tests check it).
    source: where the variant comes from (README's table shows it; a test keeps the two equal).
    """
    kind: str
    act: Callable
    act_up: Optional[Callable] = None
    extras: Callable = lambda cfg: 0
    source: str = ""

    @property
    def gated(self):
        return self.kind == "glu"


# What each kind is measured against (bench.py's ratios); la_init='onehot' (the default)
# starts LA/MoA exactly as it: GELU for mlp, SwiGLU (silu gate ⊙ identity up) for glu. In an init ablation on the
# bundled corpus onehot had the lowest mean against mean and sum, within the noise of 3 seeds (BENCHMARKS.md).
BASELINE = {"mlp": "gelu", "glu": "swiglu"}
BASELINE_INIT = {"mlp": "onehot:gelu", "glu": "onehot:silu/onehot:identity"}


def baseline_of(variant):
    return BASELINE[VARIANTS[variant].kind]


def _fixed(name):
    if name not in BASIS:  # a fixed activation is defined once, as a dictionary entry
        raise ValueError(f"_fixed({name!r}) needs BASIS[{name!r}] = φ: add it to BASIS above")
    return lambda cfg, branch: Fixed(name)


def _poly(kind):
    return lambda cfg, branch: Poly(kind, cfg.poly_order)


def _branch_init(cfg, branch):
    """la_init 'A/B' gives the gate branch init A and the up branch init B (glu variants); a single value serves both."""
    la_init = BASELINE_INIT[VARIANTS[cfg.ffn].kind] if cfg.la_init == "onehot" else cfg.la_init
    parts, names = la_init.split("/"), parse_dict(cfg.act_dict)
    missing = [p[len("onehot:"):] for p in parts if p[len("onehot:"):] not in names] if cfg.la_init == "onehot" else []
    if missing:
        raise ValueError(f"la_init=onehot starts {cfg.ffn} as {la_init}, so act_dict must contain "
                         f"{' and '.join(missing)}; add {'them' if len(missing) > 1 else 'it'} or choose "
                         f"la_init=mean, sum or onehot:NAME")
    for part in [cfg.la_init] if len(parts) > 2 or "onehot" in parts else parts:  # bare onehot: a whole variant's
        _init_alpha(names, part)  # each branch's init checked, the one this variant reads or not
    return parts[min(branch, len(parts) - 1)]


def _la(cfg, branch):
    return LA(parse_dict(cfg.act_dict), _branch_init(cfg, branch))


def _moa(cfg, branch):
    init = None if cfg.moa_gate == "plain_sigmoid" else _branch_init(cfg, branch)  # no α: la_init does not apply
    return MoA(parse_dict(cfg.act_dict), cfg.n_embd, init, cfg.moa_gate)


_K = lambda cfg: len(parse_dict(cfg.act_dict))
# one MoA's extras: U (K·d), and b and α (K each) for every gate but plain_sigmoid
_MOA_EXTRAS = lambda c: _K(c) * c.n_embd + (0 if c.moa_gate == "plain_sigmoid" else 2 * _K(c))
_POLY = "PolyCom, Zhuo et al. ICLR 2025 (arXiv 2411.03884)"
_MIX = '"More Expressive Feedforward Layers: Part I" (arXiv 2605.26647)'
_GLU = 'Shazeer 2020, "GLU Variants Improve Transformer"'

VARIANTS = {
    # non-gated
    "relu": Variant("mlp", _fixed("relu"), source="Vaswani et al. 2017"),
    "gelu": Variant("mlp", _fixed("gelu"), source="Hendrycks & Gimpel 2016; GPT-2"),
    "relu2": Variant("mlp", _fixed("relu2"), source="So et al. 2021 (Primer)"),
    "silu": Variant("mlp", _fixed("silu"), source="Elfwing et al. 2017"),
    "polyrelu": Variant("mlp", _poly("polyrelu"), extras=lambda c: c.poly_order + 1, source=_POLY),
    "polynorm": Variant("mlp", _poly("polynorm"), extras=lambda c: c.poly_order + 1, source=_POLY),
    "polyrelunorm": Variant("mlp", _poly("polyrelunorm"), extras=lambda c: c.poly_order + 1, source=_POLY + ", ablation"),
    "la": Variant("mlp", _la, extras=_K, source=_MIX),
    "moa": Variant("mlp", _moa, extras=_MOA_EXTRAS, source=_MIX),
    "xielu": Variant("mlp", lambda cfg, branch: XIELU(), extras=lambda c: 2,
                     source="Huang et al. 2024 (arXiv 2411.13010), Apertus"),
    # gated
    "swiglu": Variant("glu", _fixed("silu"), _fixed("identity"), source=_GLU),
    "geglu": Variant("glu", _fixed("gelu"), _fixed("identity"), source=_GLU),
    "reglu": Variant("glu", _fixed("relu"), _fixed("identity"), source=_GLU),
    "polynorm_glu": Variant("glu", _poly("polynorm"), _fixed("identity"), extras=lambda c: c.poly_order + 1,
                            source="PolyNorm on the gate branch, as Motif 2.6B"),
    "la_glu": Variant("glu", _la, _la, extras=lambda c: 2 * _K(c), source=_MIX + ', "bi-sided"'),
    "moa_glu": Variant("glu", _moa, _moa, extras=lambda c: 2 * _MOA_EXTRAS(c),
                       source=_MIX + ', "bi-MoA": separate gates per branch'),
    "xielu_glu": Variant("glu", lambda cfg, branch: XIELU(), _fixed("identity"), extras=lambda c: 2,
                         source="xIELU on the gate branch"),
}


def check_variant(name):
    """The registry record of `name`, or a ValueError that lists the choices. The one place an ffn name is checked."""
    if name not in VARIANTS:
        close = difflib.get_close_matches(name.lower(), VARIANTS, n=1)  # a typo: polynrom, PolyNorm
        raise ValueError(f"unknown ffn {name!r}{f' (did you mean {close[0]!r}?)' if close else ''}; choose one of: "
                         f"{', '.join(VARIANTS)}")
    return VARIANTS[name]


def make_activations(config):
    """A layer's activation(s) as the config builds them: (gate-branch act, up-branch act or None)."""
    variant = check_variant(config.ffn)
    return variant.act(config, 0), (variant.act_up(config, 1) if variant.gated else None)
