"""
Every activation of nanoFFN's feed-forward layers, and the registry of FFN variants (`VARIANTS`, at the bottom).

Read it top to bottom. Each family starts with its formula and its source, then a plain reference implementation
(a few lines of autograd: the formula as written), then the module used in training. Where the module runs through
a custom autograd Function, that Function comes last, introduced as what it is: an optimisation that keeps less
memory for backward and pays for it by recomputing.

Eager and compiled take different paths through those modules, on purpose. Eager (plain PyTorch), every operation of
the formula is a kernel of its own and autograd keeps each intermediate for backward, so the memory-lean Functions
pay. Compiled (torch.compile), the modules run the plain reference instead: Inductor fuses its elementwise chain into
a few kernels, and its min-cut partitioner chooses what backward keeps and what it recomputes, which is the Function's
trade made by the compiler. On a CPU, where transcendental functions rather than memory traffic are the cost, the
LA/MoA mixtures tell it to keep their σ(h), erf and exponential instead, and evaluate GELU's derivative from the
exponential inside its erf (compiled_mixture below). A graph of plain operations can also be stored in AOTAutograd's
on-disk cache, which skips graphs that contain a custom autograd Function; so a second run of the same variant loads
its compiled graphs instead of tracing them again.

Every activation has the same two-step interface, so that the FFN and the Mixture of Experts in model.py treat them
all alike:

    coefs = act.token_coefs(x)   # per-token coefficients from the FFN input x (MoA's gates c(x)), else None
    y     = act(h, coefs)        # φ(h), row-wise: row i of h uses row i of coefs
    act.learned(x)               # what it learned, as JSON-able numbers (coefficients, gate statistics); {} if fixed

The split lets a Mixture-of-Experts layer compute MoA's gates once per token and hand the same rows to every expert
it visits. model.py builds the FFN around these modules: y = W_down φ(W_up x) for "mlp" variants and
y = W_down (φ_gate(W_gate x) ⊙ φ_up(W_up x)) for "glu" variants (φ_up is the identity for plain GLUs).

To add an activation: write its module here (formula in the docstring, `token_coefs`, `forward`, `learned`), add
one record to VARIANTS, and one reference test in tests/test_activations.py. Nothing else needs to change: the
command line, the FFN, the MoE, the logs, the summaries and the parameter tests all read the registry.
"""
import functools
import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

# ----------------------------------------------------------------------------------------------------------------------
# The dictionary of elementwise activations, each with its derivative (the recomputing backward passes need both).
# LA and MoA mix these; a parameter-free activation added here becomes available to --act_dict at once.

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _gelu_grad(h):
    # d/dh [h Φ(h)] = Φ(h) + h φ(h), with the exact (erf) GELU that F.gelu computes by default
    return 0.5 * (1.0 + torch.erf(h * _INV_SQRT2)) + h * torch.exp(-0.5 * h * h) * _INV_SQRT_2PI


def _silu_grad(h):
    s = torch.sigmoid(h)
    return s * (1.0 + h * (1.0 - s))


def _silu(h):
    """SiLU(h) = h·σ(h). Eager: F.silu, one kernel that keeps only h for backward. Compiled: written as h·σ(h), so
    that in a mixture Inductor computes σ(h) once for silu and tanh below (it merges identical expressions within a
    kernel; F.silu it lowers as h / (1 + e^−h), which it cannot share)."""
    return h * torch.sigmoid(h) if torch.compiler.is_compiling() else F.silu(h)


def _tanh(h):
    """tanh(h) from s = σ(h):  tanh(h) = (2s − 1) / (s² + (1 − s)²)  (the same function: with a = e^h, s/(1 − s) = a,
    and tanh = (a² − 1)/(a² + 1)); the denominator lies in [1/2, 1], so nothing overflows or divides by zero.
    Why not torch.tanh: on a CPU its vectorised kernel is slow (a third of the compiled default dictionary's time).
    Why σ(h): compiled, the mixture shares it with silu, so the dictionary's silu and tanh cost one exponential and
    one division per element in forward and again in backward; the compiled MoA-GLU mixture takes 14% less time than
    with tanh = 2σ(2h) − 1 and F.silu (BENCHMARKS.md). What it costs: an absolute error up to 2.5e-7 in fp32
    (torch.tanh: 5e-8), the rounding of σ near 1/2, so a relative error of up to ~1% near |h| = 1e-5."""
    s = torch.sigmoid(h)
    return (2.0 * s - 1.0) / (s * s + (1.0 - s) * (1.0 - s))


# name -> (φ, φ')
BASIS = {
    "identity": (lambda h: h, lambda h: 1.0),  # a scalar slope broadcasts; no tensor of ones
    "relu": (torch.relu, lambda h: (h > 0).to(h.dtype)),
    "relu2": (lambda h: torch.relu(h).square(), lambda h: 2.0 * torch.relu(h)),
    "gelu": (F.gelu, _gelu_grad),
    "silu": (_silu, _silu_grad),
    "tanh": (_tanh, lambda h: 1.0 - _tanh(h).square()),
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


def _wide(t):
    """At least fp32: half-precision inputs are computed in fp32 (fp64 stays fp64, for gradcheck)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


# ----------------------------------------------------------------------------------------------------------------------
# Fixed activations


class Fixed(nn.Module):
    """φ(h) for a fixed φ in BASIS: relu, gelu (exact erf), relu2 = relu(h)² (Primer, So et al. 2021), silu, tanh,
    identity (the up branch of a plain GLU)."""

    def __init__(self, name):
        super().__init__()
        self.name = name
        self.fn = BASIS[name][0]

    def token_coefs(self, x):
        return None

    def forward(self, h, coefs=None):
        return self.fn(h)

    def learned(self, x):
        return {}

    def extra_repr(self):
        return self.name


# ----------------------------------------------------------------------------------------------------------------------
# PolyCom: polynomial composition activations (Zhuo et al., ICLR 2025, arXiv 2411.03884, official code
# github.com/BryceZhuo/PolyCom). Coefficients are stored as `coeffs = [a_0, a_1, ..., a_r]`: constant term first,
# then increasing powers. (The official code stores the highest power first; this order reads like the formula.)


def rms_normalize(v, eps=1e-6):
    """N(v) = v / sqrt(mean(v²) + ε) over the last (hidden) dimension, per token, with no gain."""
    return v * torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)


def poly_reference(h, coeffs, use_relu, use_norm, eps=1e-6):
    """The PolyCom formula as written, with plain autograd: a_0 + Σ_{p=1..r} a_p · N(base^p), base = h or relu(h),
    computed in fp32 (at least) and returned in h's dtype. Eager, backward keeps every power and every normalised
    tensor alive: r hidden-width tensors or more. Compiled, this is what runs (Poly.forward)."""
    hf, a = _wide(h), _wide(coeffs)
    base = torch.relu(hf) if use_relu else hf
    y = a[0] * torch.ones_like(hf)
    for p in range(1, len(a)):
        v = base**p
        y = y + a[p] * (rms_normalize(v, eps) if use_norm else v)
    return y.to(h.dtype)


class Poly(nn.Module):
    """
    PolyCom activations of order r (2–4), one set of r+1 learned scalars per FFN:
        polyrelu:      φ(h) = Σ_{i=1..r} a_i relu(h)^i + a_0     (no normalisation: can blow up, by design of the paper)
        polynorm:      φ(h) = Σ_{i=1..r} a_i N(h^i) + a_0
        polyrelunorm:  φ(h) = Σ_{i=1..r} a_i N(relu(h)^i) + a_0  (ablation from the paper)
    N(v) = v / sqrt(mean(v²) + 1e-6), an RMS norm over the hidden dimension per token, without gain (rms_normalize).
    Init a_1..a_r = 1/r, a_0 = 0 (official code). Computed in fp32 under bf16/fp16 autocast: h^6 overflows fp16 for
    |h| > 6.35. Eager training runs the formula through _PolyFunction below, which equals poly_reference; compiled
    training runs poly_reference itself (see the top of this file).
    """

    def __init__(self, kind, order=3, eps=1e-6):
        super().__init__()
        if not 2 <= order <= 4:
            raise ValueError(f"poly_order must be 2, 3 or 4, got {order}")
        self.kind, self.eps = kind, eps
        self.use_relu = kind in ("polyrelu", "polyrelunorm")
        self.use_norm = kind in ("polynorm", "polyrelunorm")
        self.coeffs = nn.Parameter(torch.tensor([0.0] + [1.0 / order] * order))  # [a_0, a_1, ..., a_r]

    def token_coefs(self, x):
        return None

    def forward(self, h, coefs=None):
        if torch.compiler.is_compiling():
            return poly_reference(h, self.coeffs, self.use_relu, self.use_norm, self.eps)
        return _PolyFunction.apply(h, self.coeffs, self.use_relu, self.use_norm, self.eps)

    def learned(self, x):
        return {"poly": self.coeffs.tolist()}

    def extra_repr(self):
        return f"{self.kind}, order={self.coeffs.numel() - 1}"


class _PolyFunction(torch.autograd.Function):
    """
    The memory-lean PolyCom: y = a_0 + Σ_{p=1..r} a_p · N(v_p), v_p = h^p (or relu(h)^p), N(v) = v · s(v),
    s(v) = rsqrt(mean(v²) + ε) (N skipped for PolyReLU), computed in fp32 and cast back.

    What it saves: backward keeps only h and the r per-token inverse RMS values s_p, where plain autograd of
    poly_reference keeps the r powers and the r normalised tensors. What it costs: backward recomputes the powers v_p.
    With grad_y the incoming gradient:
        ∂L/∂a_0 = Σ grad_y,   ∂L/∂a_p = Σ grad_y · N(v_p)
        ∂L/∂v_p = a_p [ s_p grad_y − (s_p³ / m) v_p ⟨grad_y, v_p⟩ ]       (the RMS-norm backward, per token)
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
                s = torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)
                inv_rms.append(s)
                y = y + a[p] * (v * s)
            else:
                y = y + a[p] * v
        ctx.save_for_backward(h, coeffs, *inv_rms)
        ctx.use_relu, ctx.use_norm = use_relu, use_norm
        return y.to(h.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        h, coeffs, *inv_rms = ctx.saved_tensors
        hf, gf, a = _wide(h), _wide(grad_y), _wide(coeffs)
        base = torch.relu(hf) if ctx.use_relu else hf
        m = hf.shape[-1]
        grad_a = [gf.sum()]
        dh = torch.zeros_like(hf)
        v_prev = torch.ones_like(base)  # base^(p-1)
        for p in range(1, a.numel()):
            v = v_prev * base
            if ctx.use_norm:
                s = inv_rms[p - 1]
                grad_a.append((gf * v * s).sum())
                dv = a[p] * (s * gf - (s.pow(3) / m) * v * (gf * v).sum(-1, keepdim=True))
            else:
                grad_a.append((gf * v).sum())
                dv = a[p] * gf
            dh = dh + dv * (p * v_prev)
            v_prev = v
        if ctx.use_relu:
            dh = dh * (hf > 0)
        return dh.to(h.dtype), torch.stack(grad_a).to(coeffs.dtype), None, None, None


# ----------------------------------------------------------------------------------------------------------------------
# LA and MoA: learnable and token-adaptive mixtures of the dictionary BASIS
# ("More Expressive Feedforward Layers: Part I", arXiv 2605.26647).


def mix_reference(h, coefs, names, basis=BASIS):
    """The mixture as written, with plain autograd: Σ_k c_k φ_k(h), coefs (..., K) broadcast over the hidden channels
    (a single row (K,) for LA), computed in fp32 (at least) and returned in h's dtype. Eager, backward keeps the K
    activations φ_k(h): K hidden-width tensors. Compiled, this is what runs (LA, MoA and glu); on a CPU,
    compiled_mixture passes basis=_CPU_BASIS, whose GELU shares its erf's exponential (below)."""
    hf, c = _wide(h), _wide(coefs)
    return sum(c[..., k : k + 1] * basis[name][0](hf) for k, name in enumerate(names)).to(h.dtype)


# Compiled on a CPU, the mixtures keep their transcendental results for backward instead of recomputing them.
# Inductor's partitioner recomputes elementwise results in backward rather than store them, which suits a GPU, where
# memory traffic is the cost and an exponential is almost free. On a CPU the transcendental functions are the cost:
# the compiled MoA-GLU mixture evaluated erf, exp and σ again in backward. Two changes, on a CPU only:
#   - GELU(h) = h Φ(h) is written so that its derivative Φ(h) + h φ(h) takes its exponential from the erf:
#     φ(h) ∝ e^{-u²} with u = h/√2, the very exponential that erf(u) evaluates inside (PyTorch's vectorised erf is
#     Abramowitz & Stegun 7.1.26: 1 − t·p(t)·e^{-u²}). Both are written from the same u, and the C++ compiler, which
#     knows the vector exp as a pure function, evaluates it once: one exponential less per element.
#   - A selective activation checkpointing policy (torch.utils.checkpoint; PyTorch's documented way to choose what a
#     compiled backward keeps) marks σ(h), erf(u) and e^{-u²} as must-save and leaves the rest to recompute, so
#     backward evaluates no transcendental function at all.
# What it saves and costs, at the default comparison's shape on a 2-core CPU: see BENCHMARKS.md (the step is shorter;
# backward keeps up to 3 more hidden-width tensors per mixture). On CUDA nothing changes: backward recomputes, and
# keeps only the mixture's inputs.


def _gelu_sharing_exp(h):
    """GELU(h) = h Φ(h), Φ(h) = (1 + erf(u))/2, u = h/√2, with the value of (h/2)(1 + erf(u)) to the last bit (which
    is how Inductor computes F.gelu), and whose derivative Φ(h) + h e^{-u²}/√(2π) autograd takes from the forward's
    own e^{-u²}: the value is computed from h.detach() and the slope enters as (h − h.detach())·slope, zero in value.
    The price: forward also evaluates that zero term, a few multiplications per element, which the saved exponential
    more than pays."""
    hd = h.detach()
    u = hd * _INV_SQRT2
    cdf = 0.5 * (1.0 + torch.erf(u))
    slope = cdf + hd * torch.exp(-(u * u)) * _INV_SQRT_2PI
    return hd * cdf + (h - hd) * slope


_CPU_BASIS = {**BASIS, "gelu": (_gelu_sharing_exp, _gelu_grad)}
_KEPT_FOR_BACKWARD = (torch.ops.aten.sigmoid.default, torch.ops.aten.erf.default, torch.ops.aten.exp.default)


def _keep_transcendentals(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _KEPT_FOR_BACKWARD else CheckpointPolicy.PREFER_RECOMPUTE


_KEEP_TRANSCENDENTALS = functools.partial(create_selective_checkpoint_contexts, _keep_transcendentals)
# AOTAutograd's on-disk cache stores a graph with such a policy only under a key that names the policy: change the key
# whenever the policy changes, or a later run would load graphs compiled under the old one
_KEEP_TRANSCENDENTALS.cache_hash = "nanoffn: must-save " + ", ".join(map(str, _KEPT_FOR_BACKWARD))
# torch warns once per process that a checkpointed region must not hold in-place operations; the mixtures hold none
logging.getLogger("torch._higher_order_ops.wrap").addFilter(lambda r: "context_fn is passed" not in r.getMessage())


def compiled_mixture(fn, h, *args):
    """fn(h, *args) (mix_reference, or the product of two), as compiled training runs it: on a CPU, under the policy
    above; on any other device, as is."""
    if not h.is_cpu:
        return fn(h, *args)
    return checkpoint(fn, h, *args, basis=_CPU_BASIS, use_reentrant=False, context_fn=_KEEP_TRANSCENDENTALS)


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
    and channels. Dictionary default: identity, relu, relu2, gelu, silu, tanh (K = 6). Eager training runs the
    mixture through _MixFunction below, which equals mix_reference; compiled training runs mix_reference itself.
    """

    def __init__(self, names, la_init="mean"):
        super().__init__()
        self.names = tuple(names)
        self.alpha = nn.Parameter(_init_alpha(self.names, la_init))

    def token_coefs(self, x):
        return None

    def coefficients(self, coefs):
        """The mixing coefficients that forward uses: α, the same for every token."""
        return self.alpha

    def forward(self, h, coefs=None):
        if torch.compiler.is_compiling():
            return compiled_mixture(mix_reference, h, self.alpha, self.names)
        return _MixFunction.apply(h, self.alpha, self.names)

    def learned(self, x):
        return {"alpha": dict(zip(self.names, self.alpha.tolist()))}

    def extra_repr(self):
        return ",".join(self.names)


class MoA(nn.Module):
    """
    Mixture of activations: φ(h; x) = Σ_k c_k(x) φ_k(h), with per-token coefficients shared across hidden channels
        sigmoid (default):  c_k(x) = α_k · 2σ(u_k·x + b_k)
        softmax (ablation): c_k(x) = α_k · K·softmax(Ux + b)_k
        tanh (ablation):    c_k(x) = α_k · (1 + tanh(u_k·x + b_k))
    U, b (the Linear `mix_logits`) are zero-initialised, so every gate form starts at c_k = α_k: MoA starts exactly
    as LA and contains it.
    """

    def __init__(self, names, n_embd, la_init="mean", gate="sigmoid"):
        super().__init__()
        if gate not in ("sigmoid", "softmax", "tanh"):
            raise ValueError(f"moa_gate must be sigmoid, softmax or tanh; got {gate!r}")
        self.names, self.gate_kind = tuple(names), gate
        self.alpha = nn.Parameter(_init_alpha(self.names, la_init))
        self.mix_logits = nn.Linear(n_embd, len(self.names), bias=True)
        self.mix_logits.zero_init = True  # a GPT's weight init keeps it at zero too
        nn.init.zeros_(self.mix_logits.weight)
        nn.init.zeros_(self.mix_logits.bias)

    def token_coefs(self, x):
        """c(x): K coefficients per token, at least fp32 (tiny)."""
        z = _wide(self.mix_logits(x))
        if self.gate_kind == "sigmoid":
            s = 2.0 * torch.sigmoid(z)
        elif self.gate_kind == "softmax":
            s = z.shape[-1] * torch.softmax(z, dim=-1)
        else:
            s = 1.0 + torch.tanh(z)
        return self.alpha * s

    def coefficients(self, coefs):
        return coefs

    def forward(self, h, coefs):
        if torch.compiler.is_compiling():
            return compiled_mixture(mix_reference, h, coefs, self.names)
        return _MixFunction.apply(h, coefs, self.names)

    def learned(self, x):
        """α, and c_k(x) over the tokens of x: its mean and its std across tokens (how token-adaptive it became)."""
        c = self.token_coefs(x).reshape(-1, len(self.names))
        named = lambda values: dict(zip(self.names, values.tolist()))
        return {"alpha": named(self.alpha), "gate_mean": named(c.mean(0)), "gate_std": named(c.std(0))}

    def extra_repr(self):
        return f"{','.join(self.names)}, gate={self.gate_kind}"


def glu(act_gate, act_up, g, u, coefs_gate, coefs_up):
    """φ_gate(g) ⊙ φ_up(u). Eager, two mixtures (la_glu, moa_glu) go through one fused, recomputing Function;
    compiled, the product of the two plain mixtures, in fp32 like the Function."""
    if isinstance(act_gate, (LA, MoA)) and isinstance(act_up, (LA, MoA)):
        cg, cu = act_gate.coefficients(coefs_gate), act_up.coefficients(coefs_up)
        if torch.compiler.is_compiling():
            return compiled_mixture(_mix_product, g, u, cg, cu, act_gate.names, act_up.names)
        return _MixGLUFunction.apply(g, u, cg, cu, act_gate.names, act_up.names)
    return act_gate(g, coefs_gate) * act_up(u, coefs_up)


def _mix_product(g, u, cg, cu, names_g, names_u, basis=BASIS):
    """(Σ_k cg_k φ_k(g)) ⊙ (Σ_l cu_l φ_l(u)) with plain autograd, in fp32 (at least), returned in g's dtype."""
    return (mix_reference(_wide(g), cg, names_g, basis) * mix_reference(_wide(u), cu, names_u, basis)).to(g.dtype)


# The memory-lean mixtures. What they save: backward keeps h and the coefficients only, where plain autograd of
# mix_reference keeps the K activations φ_k(h) (K = 6 hidden-width tensors). What they cost: backward recomputes
# φ_k(h) and φ_k'(h), three of them transcendental (erf, exp, tanh); torch.compile fuses that into one kernel.


def _mix_forward(h, c, names):
    """Σ_k c_k φ_k(h); c (..., K) broadcasts over the hidden channels."""
    y = torch.zeros_like(h)
    for k, name in enumerate(names):
        y = y + c[..., k : k + 1] * BASIS[name][0](h)
    return y


def _mix_backward(h, c, names, grad_y):
    """For y = Σ_k c_k φ_k(h): returns ∂L/∂h = grad_y · Σ_k c_k φ_k'(h) and ∂L/∂c (summed to c's shape)."""
    slope = torch.zeros_like(h)
    dc = []
    for k, name in enumerate(names):
        fn, grad_fn = BASIS[name]
        slope = slope + c[..., k : k + 1] * grad_fn(h)
        # MoA: one value per row of h. LA: c was broadcast over every token, so its gradient sums over all of h —
        # as one full reduction, which Inductor runs ~20% faster than per-row sums followed by a sum over rows
        dc.append((grad_y * fn(h)).sum(-1) if c.dim() > 1 else (grad_y * fn(h)).sum())
    return grad_y * slope, torch.stack(dc, dim=-1)


class _MixFunction(torch.autograd.Function):
    """
    y = Σ_k c_k φ_k(h), with c of shape (..., K) broadcast over the hidden channels — per token for MoA, a single
    row (K,) for LA. Backward saves h and c only and recomputes φ_k(h), φ_k'(h):
        ∂L/∂h   = grad_y · Σ_k c_k φ_k'(h)
        ∂L/∂c_k = Σ_channels grad_y · φ_k(h)    (summed over tokens too where c was broadcast)
    Computed in fp32, cast back to h's dtype.
    """

    @staticmethod
    def forward(ctx, h, c, names):
        ctx.save_for_backward(h, c)
        ctx.names = names
        return _mix_forward(_wide(h), _wide(c), names).to(h.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        h, c = ctx.saved_tensors
        dh, dc = _mix_backward(_wide(h), _wide(c), ctx.names, _wide(grad_y))
        return dh.to(h.dtype), dc.to(c.dtype), None


class _MixGLUFunction(torch.autograd.Function):
    """
    The bi-sided gated product y = A ⊙ B, A = Σ_k c_k φ_k(g), B = Σ_l e_l φ_l(u) (la_glu, moa_glu), in one Function
    so that backward keeps only g, u and the coefficients — not A, B and the 2K activations. With grad_y = ∂L/∂y:
        ∂L/∂A = grad_y ⊙ B,  ∂L/∂B = grad_y ⊙ A, then each side as in _MixFunction.
    """

    @staticmethod
    def forward(ctx, g, u, cg, cu, names_g, names_u):
        ctx.save_for_backward(g, u, cg, cu)
        ctx.names = names_g, names_u
        a = _mix_forward(_wide(g), _wide(cg), names_g)
        b = _mix_forward(_wide(u), _wide(cu), names_u)
        return (a * b).to(g.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        g, u, cg, cu = ctx.saved_tensors
        (names_g, names_u), gy = ctx.names, _wide(grad_y)
        gf, uf, cgf, cuf = _wide(g), _wide(u), _wide(cg), _wide(cu)
        a = _mix_forward(gf, cgf, names_g)
        b = _mix_forward(uf, cuf, names_u)
        dg, dcg = _mix_backward(gf, cgf, names_g, gy * b)
        du, dcu = _mix_backward(uf, cuf, names_u, gy * a)
        return dg.to(g.dtype), du.to(u.dtype), dcg.to(cg.dtype), dcu.to(cu.dtype), None, None


# ----------------------------------------------------------------------------------------------------------------------
# xIELU: the expanded integral of the ELU (Huang et al. 2024, "Deriving Activation Functions Using Integration",
# arXiv 2411.13010), the learnable activation of the Apertus LLMs. A quadratic for positive inputs (like ReLU², but
# with a learned curvature) and, for negative inputs, a learned ELU-integral that keeps a small non-zero gradient.


class XIELU(nn.Module):
    """
    φ(h) = α_p·h² + β·h                          for h > 0
    φ(h) = α_n·(expm1(min(h, ε)) − h) + β·h      for h ≤ 0
    with α_p = softplus(a_p), α_n = β + softplus(a_n) (both kept positive, α_n > β), β = 0.5 fixed, ε = −1e-6.
    Two learned scalars per FFN, initialised so that α_p = α_n = 0.8 (the paper's init). Computed in fp32 under
    autocast, as the reference implementations do; plain autograd (it is one elementwise expression that
    torch.compile fuses, forward and backward).
    """

    def __init__(self, alpha_p_init=0.8, alpha_n_init=0.8, beta=0.5, eps=-1e-6):
        super().__init__()
        self.beta, self.eps = beta, eps
        inv_softplus = lambda v: math.log(math.expm1(v))
        self.a_p = nn.Parameter(torch.tensor(inv_softplus(alpha_p_init)))
        self.a_n = nn.Parameter(torch.tensor(inv_softplus(alpha_n_init - beta)))

    def token_coefs(self, x):
        return None

    def alphas(self):
        """(α_p, α_n) from the raw parameters (a_p, a_n)."""
        return F.softplus(self.a_p), self.beta + F.softplus(self.a_n)

    def forward(self, h, coefs=None):
        hf = _wide(h)
        alpha_p, alpha_n = self.alphas()
        pos = alpha_p * hf * hf + self.beta * hf
        neg = alpha_n * (torch.expm1(torch.clamp(hf, max=self.eps)) - hf) + self.beta * hf
        return torch.where(hf > 0, pos, neg).to(h.dtype)

    def learned(self, x):
        alpha_p, alpha_n = self.alphas()
        return {"alpha_p": alpha_p.item(), "alpha_n": alpha_n.item()}


# ----------------------------------------------------------------------------------------------------------------------
# The registry: the single source of truth for the FFN variants, their kind (gated or not) and their activations.


@dataclass(frozen=True)
class Variant:
    """
    kind:   'mlp': y = W_down φ(W_up x), hidden width m = ffn_mult·d.
            'glu': y = W_down (φ(W_gate x) ⊙ φ_up(W_up x)), m = round(2/3·ffn_mult·d), so the weights match the mlp.
    act:    builds φ (the gate branch's for glu) from (config, branch); config is model.GPTConfig, branch 0 = gate.
    act_up: glu only: builds φ_up from (config, branch 1).
    extras: the learned scalars the activation(s) add per FFN, as a formula of the config (the tests check it
            against the built modules, and the README's table states it).
    source: where the variant comes from (README's table of variants shows it; a test keeps the two equal).
    """
    kind: str
    act: Callable
    act_up: Optional[Callable] = None
    extras: Callable = lambda cfg: 0
    source: str = ""

    @property
    def gated(self):
        return self.kind == "glu"


def _fixed(name):
    return lambda cfg, branch: Fixed(name)


def _poly(kind):
    return lambda cfg, branch: Poly(kind, cfg.poly_order)


# la_init='onehot' (the default) starts LA/MoA exactly as the baseline of their kind: GELU for mlp, SwiGLU for glu.
# It won an init ablation (mean / sum / onehot) on the bundled corpus for both LA and MoA; BENCHMARKS.md has it.
BASELINE_INIT = {"mlp": "onehot:gelu", "glu": "onehot:silu/onehot:identity"}


def _branch_init(cfg, branch):
    """la_init 'A/B' gives the gate branch init A and the up branch init B (glu variants); a single value serves both."""
    la_init = BASELINE_INIT[VARIANTS[cfg.ffn].kind] if cfg.la_init == "onehot" else cfg.la_init
    init = la_init.split("/")[min(branch, la_init.count("/"))]
    if cfg.la_init == "onehot" and init[len("onehot:"):] not in parse_dict(cfg.act_dict):
        raise ValueError(f"la_init=onehot starts {cfg.ffn} as {la_init}, so act_dict must contain "
                         f"{init[len('onehot:'):]}; add it or choose la_init=mean, sum or onehot:NAME")
    return init


def _la(cfg, branch):
    return LA(parse_dict(cfg.act_dict), _branch_init(cfg, branch))


def _moa(cfg, branch):
    return MoA(parse_dict(cfg.act_dict), cfg.n_embd, _branch_init(cfg, branch), cfg.moa_gate)


def _xielu(cfg, branch):
    return XIELU()


_K = lambda cfg: len(parse_dict(cfg.act_dict))
_POLY = "PolyCom, Zhuo et al. ICLR 2025 (arXiv 2411.03884)"
_MIX = '"More Expressive Feedforward Layers: Part I" (arXiv 2605.26647)'
_GLU = 'Shazeer 2020, "GLU Variants Improve Transformer"'
_XIELU = "Huang et al. 2024 (arXiv 2411.13010), Apertus"

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
    "moa": Variant("mlp", _moa, extras=lambda c: _K(c) + _K(c) * c.n_embd + _K(c), source=_MIX),
    "xielu": Variant("mlp", _xielu, extras=lambda c: 2, source=_XIELU),
    # gated
    "swiglu": Variant("glu", _fixed("silu"), _fixed("identity"), source=_GLU),
    "geglu": Variant("glu", _fixed("gelu"), _fixed("identity"), source=_GLU),
    "reglu": Variant("glu", _fixed("relu"), _fixed("identity"), source=_GLU),
    "polynorm_glu": Variant("glu", _poly("polynorm"), _fixed("identity"), extras=lambda c: c.poly_order + 1,
                            source="PolyNorm on the gate branch, as Motif 2.6B"),
    "la_glu": Variant("glu", _la, _la, extras=lambda c: 2 * _K(c), source=_MIX + ', "bi-sided"'),
    "moa_glu": Variant("glu", _moa, _moa, extras=lambda c: 2 * (_K(c) + _K(c) * c.n_embd + _K(c)),
                       source=_MIX + ', "bi-MoA": separate gates per branch'),
    "xielu_glu": Variant("glu", _xielu, _fixed("identity"), extras=lambda c: 2, source="xIELU on the gate branch"),
}


def check_variant(name):
    """The registry record of `name`, or a ValueError that lists the choices. The one place an ffn name is checked."""
    if name not in VARIANTS:
        raise ValueError(f"unknown ffn {name!r}; choose one of: {', '.join(VARIANTS)}")
    return VARIANTS[name]
