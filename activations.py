"""
Every FFN activation of nanoFFN, behind one registry (`FFN_VARIANTS`, at the bottom of this file).

An activation module maps the FFN hidden pre-activation h (..., m) to φ(h) (..., m). Some of them depend on the
token as well (MoA's gates are computed from the FFN input x), so every activation has the same two-step interface:

    ctx = act.context(x)   # per-token state computed once per token per layer (MoA gates), or None
    y   = act(h, ctx)      # φ(h), row-wise: row i of h uses row i of ctx

The split lets a Mixture-of-Experts layer compute MoA's gates once per token and hand the same rows to every expert
(SPEC §2, §4). model.py builds the FFN around these modules: `y = W_down φ(W_up x)` for "mlp" variants and
`y = W_down (φ_gate(W_gate x) ⊙ φ_up(W_up x))` for "glu" variants.

Memory-lean by construction: PolyNorm/PolyReLU/PolyReLUNorm and LA/MoA run through custom autograd Functions that
save only h (plus a few per-token scalars) and recompute x^p, the norms and the K dictionary activations in backward,
instead of keeping r or K hidden-width tensors alive. torch.compile traces these Functions and fuses them.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------------------------------
# The dictionary of elementwise activations, each with its derivative (used by the recomputing backward passes).

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _gelu_grad(h):
    # d/dh [h Φ(h)] = Φ(h) + h φ(h), with the exact (erf) GELU that F.gelu computes by default
    return 0.5 * (1.0 + torch.erf(h * _INV_SQRT2)) + h * torch.exp(-0.5 * h * h) * _INV_SQRT_2PI


def _silu_grad(h):
    s = torch.sigmoid(h)
    return s * (1.0 + h * (1.0 - s))


# name -> (φ, φ')
BASIS = {
    "identity": (lambda h: h, lambda h: 1.0),  # a scalar slope broadcasts; no tensor of ones
    "relu": (torch.relu, lambda h: (h > 0).to(h.dtype)),
    "relu2": (lambda h: torch.relu(h).square(), lambda h: 2.0 * torch.relu(h)),
    "gelu": (F.gelu, _gelu_grad),
    "silu": (F.silu, _silu_grad),
    "tanh": (torch.tanh, lambda h: 1.0 - torch.tanh(h).square()),
}


def parse_dict(act_dict):
    """'identity,relu,gelu' -> ['identity', 'relu', 'gelu'], checked against BASIS."""
    names = [n.strip() for n in act_dict.split(",") if n.strip()] if isinstance(act_dict, str) else list(act_dict)
    unknown = [n for n in names if n not in BASIS]
    if not names or unknown:
        raise ValueError(f"act_dict must be a comma-separated list of {', '.join(BASIS)}; got {act_dict!r}")
    return names


def _wide(t):
    """At least fp32: half-precision inputs are computed in fp32 (fp64 stays fp64, for gradcheck)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


# ----------------------------------------------------------------------------------------------------------------------
# Fixed activations


class Fixed(nn.Module):
    """φ(h) for a fixed φ in BASIS: relu, gelu (exact erf), relu2 = relu(h)² (Primer, So et al. 2021), silu, tanh."""

    def __init__(self, name):
        super().__init__()
        self.name = name
        self.fn = BASIS[name][0]

    def context(self, x):
        return None

    def forward(self, h, ctx=None):
        return self.fn(h)

    def extra_repr(self):
        return self.name


# ----------------------------------------------------------------------------------------------------------------------
# PolyCom: polynomial composition activations (Zhuo et al., ICLR 2025, arXiv 2411.03884, official code
# github.com/BryceZhuo/PolyCom). Coefficients are stored as `coeffs = [a_0, a_1, ..., a_r]` — constant term first,
# then increasing powers. (The official code stores the highest power first; this order reads like the formula.)


class _PolyFunction(torch.autograd.Function):
    """
    y = a_0 + Σ_{p=1..r} a_p · N(v_p),   v_p = h^p (or relu(h)^p),   N(v) = v · r(v),  r(v) = rsqrt(mean(v²) + ε)
    (N is skipped for PolyReLU). Computed in fp32 whatever the input dtype, cast back at the end: under bf16/fp16
    autocast h^6 would overflow fp16 for |h| > 6.35 (SPEC §2).

    Backward saves only h and the r per-token inverse RMS values, and recomputes v_p. With g the incoming gradient:
        ∂L/∂a_0 = Σ g,   ∂L/∂a_p = Σ g · N(v_p)
        ∂L/∂v_p = a_p [ r_p g − (r_p³ / m) v_p ⟨g, v_p⟩ ]       (the RMS-norm backward, per token)
        ∂L/∂h   = Σ_p ∂L/∂v_p · p·h^{p−1}   (· 1[h>0] with relu)
    """

    @staticmethod
    def forward(ctx, h, coeffs, use_relu, use_norm, eps):
        hf = _wide(h)
        base = torch.relu(hf) if use_relu else hf
        a = _wide(coeffs)
        y = a[0].expand_as(hf)
        inv_rms = []
        v = torch.ones_like(base)
        for p in range(1, a.numel()):
            v = v * base
            if use_norm:
                r = torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)
                inv_rms.append(r)
                y = y + a[p] * (v * r)
            else:
                y = y + a[p] * v
        ctx.save_for_backward(h, coeffs, *inv_rms)
        ctx.use_relu, ctx.use_norm = use_relu, use_norm
        return y.to(h.dtype)

    @staticmethod
    def backward(ctx, g):
        h, coeffs, *inv_rms = ctx.saved_tensors
        hf, gf, a = _wide(h), _wide(g), _wide(coeffs)
        base = torch.relu(hf) if ctx.use_relu else hf
        m = hf.shape[-1]
        grad_a = [gf.sum()]
        dh = torch.zeros_like(hf)
        v_prev = torch.ones_like(base)  # base^(p-1)
        for p in range(1, a.numel()):
            v = v_prev * base
            if ctx.use_norm:
                r = inv_rms[p - 1]
                grad_a.append((gf * v * r).sum())
                dv = a[p] * (r * gf - (r.pow(3) / m) * v * (gf * v).sum(-1, keepdim=True))
            else:
                grad_a.append((gf * v).sum())
                dv = a[p] * gf
            dh = dh + dv * (p * v_prev)
            v_prev = v
        if ctx.use_relu:
            dh = dh * (hf > 0)
        return dh.to(h.dtype), torch.stack(grad_a).to(coeffs.dtype), None, None, None


class Poly(nn.Module):
    """
    PolyCom activations of order r (2–4), one set of r+1 learned scalars per FFN (SPEC §2):
        polyrelu:      φ(h) = Σ_{i=1..r} a_i relu(h)^i + a_0     (no normalisation: can blow up, by design of the paper)
        polynorm:      φ(h) = Σ_{i=1..r} a_i N(h^i) + a_0
        polyrelunorm:  φ(h) = Σ_{i=1..r} a_i N(relu(h)^i) + a_0  (ablation from the paper)
    N(v) = v / sqrt(mean(v²) + 1e-6), an RMS norm over the hidden dimension per token, without gain.
    Init a_1..a_r = 1/r, a_0 = 0 (official code).
    """

    def __init__(self, kind, order=3, eps=1e-6):
        super().__init__()
        if not 2 <= order <= 4:
            raise ValueError(f"poly_order must be 2, 3 or 4, got {order}")
        self.kind, self.eps = kind, eps
        self.use_relu = kind in ("polyrelu", "polyrelunorm")
        self.use_norm = kind in ("polynorm", "polyrelunorm")
        self.coeffs = nn.Parameter(torch.tensor([0.0] + [1.0 / order] * order))  # [a_0, a_1, ..., a_r]

    def context(self, x):
        return None

    def forward(self, h, ctx=None):
        return _PolyFunction.apply(h, self.coeffs, self.use_relu, self.use_norm, self.eps)

    def extra_repr(self):
        return f"{self.kind}, order={self.coeffs.numel() - 1}"


# ----------------------------------------------------------------------------------------------------------------------
# LA and MoA: learnable and token-adaptive mixtures of a dictionary of activations
# ("More Expressive Feedforward Layers: Part I", arXiv 2605.26647).


def _mix_forward(h, c, names):
    """Σ_k c_k φ_k(h) in fp32; c (..., K) broadcasts over the hidden channels."""
    y = torch.zeros_like(h)
    for k, name in enumerate(names):
        y = y + c[..., k : k + 1] * BASIS[name][0](h)
    return y


def _mix_backward(h, c, names, g):
    """Given ∂L/∂y for y = Σ_k c_k φ_k(h): returns ∂L/∂h = g · Σ_k c_k φ_k'(h) and ∂L/∂c (summed to c's shape)."""
    slope = torch.zeros_like(h)
    dc = []
    for k, name in enumerate(names):
        fn, grad_fn = BASIS[name]
        slope = slope + c[..., k : k + 1] * grad_fn(h)
        # MoA: one value per row of h. LA: c was broadcast over every token, so its gradient sums over all of h —
        # as one full reduction, which Inductor runs ~20% faster than per-row sums followed by a sum over rows
        dc.append((g * fn(h)).sum(-1) if c.dim() > 1 else (g * fn(h)).sum())
    return g * slope, torch.stack(dc, dim=-1)


class _MixFunction(torch.autograd.Function):
    """
    y = Σ_k c_k φ_k(h), with c of shape (..., K) broadcast over the hidden channels — per token for MoA,
    a single row (K,) for LA. Backward saves h and c only and recomputes φ_k(h), φ_k'(h):
        ∂L/∂h   = g · Σ_k c_k φ_k'(h)
        ∂L/∂c_k = Σ_channels g · φ_k(h)    (summed over tokens too where c was broadcast)
    Computed in fp32, cast back to h's dtype.
    """

    @staticmethod
    def forward(ctx, h, c, names):
        ctx.save_for_backward(h, c)
        ctx.names = names
        return _mix_forward(_wide(h), _wide(c), names).to(h.dtype)

    @staticmethod
    def backward(ctx, g):
        h, c = ctx.saved_tensors
        dh, dc = _mix_backward(_wide(h), _wide(c), ctx.names, _wide(g))
        return dh.to(h.dtype), dc.to(c.dtype), None


class _MixGLUFunction(torch.autograd.Function):
    """
    The bi-sided gated product y = A ⊙ B, A = Σ_k c_k φ_k(g), B = Σ_l e_l φ_l(u) (la_glu, moa_glu), in one Function
    so that backward keeps only g, u and the coefficients — not A, B and the 2K activations. With G = ∂L/∂y:
        ∂L/∂A = G ⊙ B,  ∂L/∂B = G ⊙ A, then each side as in _MixFunction.
    """

    @staticmethod
    def forward(ctx, g, u, cg, cu, names_g, names_u):
        ctx.save_for_backward(g, u, cg, cu)
        ctx.names = names_g, names_u
        a = _mix_forward(_wide(g), _wide(cg), names_g)
        b = _mix_forward(_wide(u), _wide(cu), names_u)
        return (a * b).to(g.dtype)

    @staticmethod
    def backward(ctx, grad):
        g, u, cg, cu = ctx.saved_tensors
        (names_g, names_u), G = ctx.names, _wide(grad)
        gf, uf, cgf, cuf = _wide(g), _wide(u), _wide(cg), _wide(cu)
        a = _mix_forward(gf, cgf, names_g)
        b = _mix_forward(uf, cuf, names_u)
        dg, dcg = _mix_backward(gf, cgf, names_g, G * b)
        du, dcu = _mix_backward(uf, cuf, names_u, G * a)
        return dg.to(g.dtype), du.to(u.dtype), dcg.to(cg.dtype), dcu.to(cu.dtype), None, None


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
    raise ValueError(f"la_init must be 'onehot', 'mean', 'sum' or 'onehot:NAME' with NAME in {names}; got {la_init!r}")


class LA(nn.Module):
    """
    Learnable activation: φ(h) = Σ_k α_k φ_k(h), one scalar α_k per dictionary entry per FFN, shared by all tokens
    and channels. Dictionary default: identity, relu, relu2, gelu, silu, tanh.
    """

    def __init__(self, names, la_init="mean"):
        super().__init__()
        self.names = tuple(names)
        self.alpha = nn.Parameter(_init_alpha(self.names, la_init))

    def context(self, x):
        return None

    def coefficients(self, ctx):
        return self.alpha

    def forward(self, h, ctx=None):
        return _MixFunction.apply(h, self.alpha, self.names)

    def extra_repr(self):
        return ",".join(self.names)


class MoA(nn.Module):
    """
    Mixture of activations: φ(h; x) = Σ_k c_k(x) φ_k(h), with per-token gates shared across hidden channels
        sigmoid (default):  c_k(x) = α_k · 2σ(u_k·x + b_k)
        softmax (ablation): c_k(x) = α_k · K·softmax(Ux + b)_k
        tanh (ablation):    c_k(x) = α_k · (1 + tanh(u_k·x + b_k))
    U, b are zero-initialised, so every gate form starts at c_k = α_k: MoA starts exactly as LA and contains it.
    """

    def __init__(self, names, n_embd, la_init="mean", gate="sigmoid"):
        super().__init__()
        if gate not in ("sigmoid", "softmax", "tanh"):
            raise ValueError(f"moa_gate must be sigmoid, softmax or tanh; got {gate!r}")
        self.names, self.gate_kind = tuple(names), gate
        self.alpha = nn.Parameter(_init_alpha(self.names, la_init))
        self.gate = nn.Linear(n_embd, len(self.names), bias=True)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)
        self.capture = False  # activation_stats() sets this to keep the last gate values
        self.last_coef = None

    def context(self, x):
        z = _wide(self.gate(x))  # K logits per token, at least fp32 (tiny)
        if self.gate_kind == "sigmoid":
            s = 2.0 * torch.sigmoid(z)
        elif self.gate_kind == "softmax":
            s = z.shape[-1] * torch.softmax(z, dim=-1)
        else:
            s = 1.0 + torch.tanh(z)
        coef = self.alpha * s
        if self.capture:
            self.last_coef = coef.detach()
        return coef

    def coefficients(self, ctx):
        return ctx

    def forward(self, h, ctx):
        return _MixFunction.apply(h, ctx, self.names)

    def extra_repr(self):
        return f"{','.join(self.names)}, gate={self.gate_kind}"


def glu(act_gate, act_up, g, u, ctx_gate, ctx_up):
    """φ_gate(g) ⊙ φ_up(u). Two mixtures (la_glu, moa_glu) go through one fused, recomputing Function."""
    if isinstance(act_gate, (LA, MoA)) and isinstance(act_up, (LA, MoA)):
        return _MixGLUFunction.apply(
            g, u, act_gate.coefficients(ctx_gate), act_up.coefficients(ctx_up), act_gate.names, act_up.names
        )
    return act_gate(g, ctx_gate) * act_up(u, ctx_up)


# ----------------------------------------------------------------------------------------------------------------------
# The registry: FFN variant name -> (kind, builder of the gate-branch activation, builder of the up-branch activation).
# "mlp": y = W_down φ(W_up x).  "glu": y = W_down (φ(W_gate x) ⊙ φ_up(W_up x)), φ_up = identity unless bi-sided.
# A builder takes the GPTConfig (poly_order, act_dict, la_init, moa_gate, n_embd) and the branch (0 gate, 1 up).


def _fixed(name):
    return lambda cfg, branch: Fixed(name)


def _poly(kind):
    return lambda cfg, branch: Poly(kind, cfg.poly_order)


# la_init='onehot' (the default) starts LA/MoA exactly as the baseline of their kind: best of the init ablation
# (mean / sum / onehot, README "LA/MoA init ablation").
BASELINE_INIT = {"mlp": "onehot:gelu", "glu": "onehot:silu/onehot:identity"}


def _branch_init(cfg, branch):
    """la_init 'A/B' gives the gate branch init A and the up branch init B (glu variants); a single value serves both."""
    la_init = BASELINE_INIT[cfg.ffn_kind] if cfg.la_init == "onehot" else cfg.la_init
    init = la_init.split("/")[min(branch, la_init.count("/"))]
    if cfg.la_init == "onehot" and init[len("onehot:"):] not in parse_dict(cfg.act_dict):
        raise ValueError(f"la_init=onehot starts {cfg.ffn} as {la_init}, so act_dict must contain "
                         f"{init[len('onehot:'):]}; add it or choose la_init=mean, sum or onehot:NAME")
    return init


def _la(cfg, branch):
    return LA(parse_dict(cfg.act_dict), _branch_init(cfg, branch))


def _moa(cfg, branch):
    return MoA(parse_dict(cfg.act_dict), cfg.n_embd, _branch_init(cfg, branch), cfg.moa_gate)


FFN_VARIANTS = {
    # non-gated, hidden width m = ffn_mult·d
    "relu": ("mlp", _fixed("relu"), None),
    "gelu": ("mlp", _fixed("gelu"), None),
    "relu2": ("mlp", _fixed("relu2"), None),
    "silu": ("mlp", _fixed("silu"), None),
    "polyrelu": ("mlp", _poly("polyrelu"), None),
    "polynorm": ("mlp", _poly("polynorm"), None),
    "polyrelunorm": ("mlp", _poly("polyrelunorm"), None),
    "la": ("mlp", _la, None),
    "moa": ("mlp", _moa, None),
    # gated, hidden width ≈ 2/3·ffn_mult·d so the weight count matches the non-gated FFN
    "swiglu": ("glu", _fixed("silu"), _fixed("identity")),  # Shazeer 2020, "GLU Variants Improve Transformer"
    "geglu": ("glu", _fixed("gelu"), _fixed("identity")),
    "reglu": ("glu", _fixed("relu"), _fixed("identity")),
    "polynorm_glu": ("glu", _poly("polynorm"), _fixed("identity")),  # PolyNorm on the gate branch (Motif 2.6B)
    "la_glu": ("glu", _la, _la),  # bi-sided: (Σ α_k φ_k(g)) ⊙ (Σ β_l φ_l(u))
    "moa_glu": ("glu", _moa, _moa),  # bi-MoA: separate gates ρ(x), π(x) per branch
}
