"""
Memory-lean autograd Functions for the learned activations of activations.py: an optimisation, not an idea.

Plain autograd keeps every intermediate of a formula for backward: PolyNorm of order r keeps its r powers and r
normalised tensors, a K-entry mixture its K activations φ_k(h), each as wide as the hidden layer. These Functions keep
only their inputs (and a few per-token scalars) and recompute the rest in backward, so an eager training step keeps no
more for backward than GELU or SwiGLU do (bench.py measures it). Each one equals its plain formula in activations.py:
tests/test_activations.py checks the values, and the gradients by float64 gradcheck. Compiled training does not use
them: Inductor makes the same trade on the plain formulas by itself.

A mixture's dictionary is passed as a tuple of (φ, φ') pairs (activations.BASIS), so this file needs nothing else.
"""
import torch


def fp32(t):
    """At least fp32: half-precision inputs are computed in fp32 (fp64 stays fp64, for gradcheck)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class _Poly(torch.autograd.Function):
    """
    y = a_0 + Σ_{p=1..r} a_p · N(v_p), v_p = h^p (or relu(h)^p), N(v) = v · s(v), s(v) = rsqrt(mean(v²) + ε)
    (N skipped for PolyReLU). Saves h and the r per-token values s_p; recomputes the powers in backward:
        ∂L/∂a_0 = Σ grad_y,   ∂L/∂a_p = Σ grad_y · N(v_p)
        ∂L/∂v_p = a_p [ s_p grad_y − (s_p³ / m) v_p ⟨grad_y, v_p⟩ ]       (the RMS-norm backward, per token)
        ∂L/∂h   = Σ_p ∂L/∂v_p · p·h^{p−1}   (· 1[h>0] with relu)
    """

    @staticmethod
    def forward(ctx, h, coeffs, use_relu, use_norm, eps):
        hf, a = fp32(h), fp32(coeffs)
        base = torch.relu(hf) if use_relu else hf
        y, v, inv_rms = a[0].expand_as(hf), torch.ones_like(base), []
        for p in range(1, a.numel()):
            v = v * base
            if use_norm:
                inv_rms.append(torch.rsqrt(v.square().mean(-1, keepdim=True) + eps))
                y = y + a[p] * (v * inv_rms[-1])
            else:
                y = y + a[p] * v
        ctx.save_for_backward(h, coeffs, *inv_rms)
        ctx.use_relu, ctx.use_norm = use_relu, use_norm
        return y.to(h.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        h, coeffs, *inv_rms = ctx.saved_tensors
        hf, gf, a = fp32(h), fp32(grad_y), fp32(coeffs)
        base = torch.relu(hf) if ctx.use_relu else hf
        grad_a, dh, v_prev = [gf.sum()], torch.zeros_like(hf), torch.ones_like(base)  # v_prev = base^(p-1)
        for p in range(1, a.numel()):
            v = v_prev * base
            if ctx.use_norm:
                s = inv_rms[p - 1]
                grad_a.append((gf * v * s).sum())
                dv = a[p] * (s * gf - (s.pow(3) / hf.shape[-1]) * v * (gf * v).sum(-1, keepdim=True))
            else:
                grad_a.append((gf * v).sum())
                dv = a[p] * gf
            dh = dh + dv * (p * v_prev)
            v_prev = v
        if ctx.use_relu:
            dh = dh * (hf > 0)
        return dh.to(h.dtype), torch.stack(grad_a).to(coeffs.dtype), None, None, None


class _XIELU(torch.autograd.Function):
    """
    y = α_p h² + β h (h > 0);  α_n (expm1(min(h, ε)) − h) + β h (h ≤ 0);  α_p = softplus(a_p), α_n = β + softplus(a_n).
    Saves h, a_p, a_n; backward recomputes both pieces:
        ∂y/∂h = 2 α_p h + β (h > 0);  α_n (e^h·1[h ≤ ε] − 1) + β (h ≤ 0)
        ∂y/∂a_p = h² σ(a_p) (h > 0);   ∂y/∂a_n = (expm1(min(h, ε)) − h) σ(a_n) (h ≤ 0)
    """

    @staticmethod
    def forward(ctx, h, a_p, a_n, beta, eps):
        ctx.save_for_backward(h, a_p, a_n)
        ctx.beta, ctx.eps = beta, eps
        hf = fp32(h)
        alpha_p, alpha_n = torch.nn.functional.softplus(a_p), beta + torch.nn.functional.softplus(a_n)
        neg = alpha_n * (torch.expm1(torch.where(hf <= eps, hf, eps)) - hf)
        return (torch.where(hf > 0, alpha_p * hf * hf, neg) + beta * hf).to(h.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        h, a_p, a_n = ctx.saved_tensors
        hf, gf, pos = fp32(h), fp32(grad_y), fp32(h) > 0
        alpha_p, alpha_n = torch.nn.functional.softplus(a_p), ctx.beta + torch.nn.functional.softplus(a_n)
        slope_neg = alpha_n * (torch.exp(hf) * (hf <= ctx.eps) - 1.0)
        dh = gf * (torch.where(pos, 2.0 * alpha_p * hf, slope_neg) + ctx.beta)
        d_ap = (gf * hf * hf * pos).sum() * torch.sigmoid(a_p)
        d_an = (gf * (torch.expm1(torch.where(hf <= ctx.eps, hf, ctx.eps)) - hf) * ~pos).sum() * torch.sigmoid(a_n)
        return dh.to(h.dtype), d_ap.to(a_p.dtype), d_an.to(a_n.dtype), None, None


def _mix_forward(h, c, basis):
    """Σ_k c_k φ_k(h); c (..., K) broadcasts over the hidden channels."""
    y = torch.zeros_like(h)
    for k, (fn, _) in enumerate(basis):
        y = y + c[..., k : k + 1] * fn(h)
    return y


def _mix_backward(h, c, basis, grad_y):
    """For y = Σ_k c_k φ_k(h): ∂L/∂h = grad_y · Σ_k c_k φ_k'(h), and ∂L/∂c summed to c's shape (per token for MoA;
    over every token too for LA, whose one row of c was broadcast)."""
    slope, dc = torch.zeros_like(h), []
    for k, (fn, grad_fn) in enumerate(basis):
        slope = slope + c[..., k : k + 1] * grad_fn(h)
        dc.append((grad_y * fn(h)).sum(-1) if c.dim() > 1 else (grad_y * fn(h)).sum())
    return grad_y * slope, torch.stack(dc, dim=-1)


class _Mix(torch.autograd.Function):
    """y = Σ_k c_k φ_k(h), c of shape (..., K) (per token: MoA) or (K,) (LA). Saves h and c; recomputes φ_k(h) and
    φ_k'(h) in backward:  ∂L/∂h = grad_y · Σ_k c_k φ_k'(h),  ∂L/∂c_k = Σ_channels grad_y · φ_k(h)."""

    @staticmethod
    def forward(ctx, h, c, basis):
        ctx.save_for_backward(h, c)
        ctx.basis = basis
        return _mix_forward(fp32(h), fp32(c), basis).to(h.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        h, c = ctx.saved_tensors
        dh, dc = _mix_backward(fp32(h), fp32(c), ctx.basis, fp32(grad_y))
        return dh.to(h.dtype), dc.to(c.dtype), None


class _MixGLU(torch.autograd.Function):
    """y = A ⊙ B, A = Σ_k c_k φ_k(g), B = Σ_l e_l φ_l(u), in one Function so that backward keeps g, u and the
    coefficients, not A, B and the 2K activations:  ∂L/∂A = grad_y ⊙ B,  ∂L/∂B = grad_y ⊙ A, then each side as _Mix."""

    @staticmethod
    def forward(ctx, g, u, cg, cu, basis_g, basis_u):
        ctx.save_for_backward(g, u, cg, cu)
        ctx.bases = basis_g, basis_u
        return (_mix_forward(fp32(g), fp32(cg), basis_g) * _mix_forward(fp32(u), fp32(cu), basis_u)).to(g.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        g, u, cg, cu = ctx.saved_tensors
        (basis_g, basis_u), gy = ctx.bases, fp32(grad_y)
        gf, uf, cgf, cuf = fp32(g), fp32(u), fp32(cg), fp32(cu)
        a, b = _mix_forward(gf, cgf, basis_g), _mix_forward(uf, cuf, basis_u)
        dg, dcg = _mix_backward(gf, cgf, basis_g, gy * b)
        du, dcu = _mix_backward(uf, cuf, basis_u, gy * a)
        return dg.to(g.dtype), du.to(u.dtype), dcg.to(cg.dtype), dcu.to(cu.dtype), None, None


# the entry points activations.py calls; each equals the plain formula named, keeping only what its docstring says
poly = _Poly.apply  # activations.poly_formula, keeping h and r per-token scalars for backward
xielu = _XIELU.apply  # activations.xielu_formula, keeping h and the two raw parameters
mix = _Mix.apply  # activations.mix_formula, keeping h and c
mix_glu = _MixGLU.apply  # activations.mix_product (both branches of la_glu / moa_glu), keeping g, u, cg, cu
