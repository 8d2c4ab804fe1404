"""The activations equal their papers' formulas (independent float64 references written here, not imported), exactly
where an equivalence is claimed (LA one-hot = the fixed activation, MoA with zero gates = LA, bi-sided GLUs = SwiGLU);
their recomputing backwards pass gradcheck; and they keep little memory for backward."""
import math

import pytest
import torch

import activations as A
from bench import saved_bytes_for_backward
from model import FFN, GPTConfig

torch.manual_seed(0)


# ---- independent references, written from the papers' formulas with plain autograd ----------------------------------
def rms_norm(v, eps=1e-6):
    return v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)


def poly_reference(kind, h, coeffs):
    """a_0 + Σ_{p=1..r} a_p · f(base^p), base = h or relu(h), f = RMS norm over the hidden dim (or identity)."""
    base = torch.clamp(h, min=0) if kind in ("polyrelu", "polyrelunorm") else h
    out = coeffs[0] * torch.ones_like(h)
    for p in range(1, len(coeffs)):
        v = base**p
        out = out + coeffs[p] * (rms_norm(v) if kind in ("polynorm", "polyrelunorm") else v)
    return out


REF_BASIS = {
    "identity": lambda h: h,
    "relu": lambda h: torch.clamp(h, min=0),
    "relu2": lambda h: torch.clamp(h, min=0) ** 2,
    "gelu": lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2))),
    "silu": lambda h: h / (1 + torch.exp(-h)),
    "tanh": lambda h: torch.tanh(h),
}


@pytest.mark.parametrize("kind", ["polynorm", "polyrelu", "polyrelunorm"])
@pytest.mark.parametrize("order", [2, 3, 4])
def test_poly_matches_reference_and_init(kind, order):
    act = A.Poly(kind, order)
    assert act.coeffs.tolist() == pytest.approx([0.0] + [1.0 / order] * order, abs=1e-7)  # a_0 = 0, a_1..a_r = 1/r
    act = act.double()
    with torch.no_grad():
        act.coeffs.copy_(torch.randn(order + 1, dtype=torch.float64))
    h = torch.randn(5, 7, 48, dtype=torch.float64, requires_grad=True)
    coeffs = act.coeffs.detach().clone().requires_grad_(True)
    y, y_ref = act(h), poly_reference(kind, h, coeffs)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    dh, da = torch.autograd.grad(y, (h, act.coeffs), g)
    dh_ref, da_ref = torch.autograd.grad(y_ref, (h, coeffs), g)
    torch.testing.assert_close(dh, dh_ref)
    torch.testing.assert_close(da, da_ref)


def test_dictionary_tanh_is_tanh_in_fp32_everywhere():
    # the dictionary computes tanh from σ(h) (cheaper on a CPU): within 2.5e-7 of float64 tanh over the whole fp32
    # range that matters, exactly ±1 in the tails, and no NaN in value or gradient where exp overflows
    h = torch.cat([torch.linspace(-100, 100, 200_001), torch.tensor([-1e30, -88.8, 1e-30, 0.0, 88.8, 1e30])])
    h = h.requires_grad_(True)
    tanh, dtanh = A.BASIS["tanh"]
    y = tanh(h)
    assert (y.double() - torch.tanh(h.detach().double())).abs().max() < 2.5e-7
    assert y[-6].item() == -1.0 and y[-1].item() == 1.0
    (grad,) = torch.autograd.grad(y.sum(), h)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad.double(), 1 - torch.tanh(h.detach().double()) ** 2, atol=5e-7, rtol=0)
    torch.testing.assert_close(dtanh(h.detach()).double(), 1 - torch.tanh(h.detach().double()) ** 2, atol=5e-7, rtol=0)


@pytest.mark.parametrize("name", list(A.BASIS))
def test_la_onehot_equals_fixed_activation_exactly(name):
    la = A.LA(list(A.BASIS), f"onehot:{name}")
    h = torch.randn(4, 9, 64)
    assert torch.equal(la(h), A.Fixed(name)(h))
    torch.testing.assert_close(A.Fixed(name)(h.double()), REF_BASIS[name](h.double()))


def test_la_and_moa_match_mixture_reference():
    names = list(A.BASIS)
    moa = A.MoA(names, 16).double()
    with torch.no_grad():
        moa.mix_logits.weight.normal_()
        moa.mix_logits.bias.normal_()
        moa.alpha.normal_()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    h = torch.randn(3, 5, 32, dtype=torch.float64)
    c = moa.alpha * 2 * torch.sigmoid(x @ moa.mix_logits.weight.T + moa.mix_logits.bias)
    y_ref = sum(c[..., k : k + 1] * REF_BASIS[n](h) for k, n in enumerate(names))
    torch.testing.assert_close(moa(h, moa.token_coefs(x)), y_ref)


@pytest.mark.parametrize("gate", ["sigmoid", "softmax", "tanh"])
def test_moa_with_zero_gates_equals_la_exactly(gate):
    names = list(A.BASIS)
    la, moa = A.LA(names, "mean"), A.MoA(names, 32, "mean", gate)
    with torch.no_grad():
        alpha = torch.randn(len(names))
        la.alpha.copy_(alpha)
        moa.alpha.copy_(alpha)
    x, h = torch.randn(4, 10, 32), torch.randn(4, 10, 128)
    assert torch.equal(moa(h, moa.token_coefs(x)), la(h))


@pytest.mark.parametrize("variant", ["la_glu", "moa_glu"])
def test_bisided_glu_with_onehot_silu_identity_equals_swiglu_exactly(variant):
    d = 32
    mixture = FFN(GPTConfig(n_embd=d, n_head=4, ffn=variant, la_init="onehot:silu/onehot:identity"))
    swiglu = FFN(GPTConfig(n_embd=d, n_head=4, ffn="swiglu"))
    for name in ("w_gate", "w_up", "w_down"):  # weights shared
        getattr(mixture, name).load_state_dict(getattr(swiglu, name).state_dict())
    x = torch.randn(3, 8, d)
    assert torch.equal(mixture(x)[0], swiglu(x)[0])


def test_the_readers_references_in_activations_py_equal_the_lean_functions():
    """activations.py shows each formula as a plain reference before its memory-lean Function: they agree."""
    h = torch.randn(4, 6, 40, dtype=torch.float64)
    a = torch.randn(4, dtype=torch.float64)
    for use_relu, use_norm in [(False, True), (True, False), (True, True)]:
        torch.testing.assert_close(A._PolyFunction.apply(h, a, use_relu, use_norm, 1e-6),
                                   A.poly_reference(h, a, use_relu, use_norm))
        torch.testing.assert_close(A.poly_reference(h, a, use_relu, use_norm),
                                   poly_reference({(False, True): "polynorm", (True, False): "polyrelu",
                                                   (True, True): "polyrelunorm"}[(use_relu, use_norm)], h, a))
    names = tuple(A.BASIS)
    c = torch.randn(4, 6, len(names), dtype=torch.float64)
    torch.testing.assert_close(A._MixFunction.apply(h, c, names), A.mix_reference(h, c, names))


# ---- xIELU (Huang et al. 2024, arXiv 2411.13010) ------------------------------------------------------------------
def xielu_reference(h, alpha_p, alpha_n, beta=0.5, eps=-1e-6):
    """The paper's formula, with α_p, α_n the positive coefficients themselves (not their softplus parameters)."""
    pos = alpha_p * h * h + beta * h
    neg = alpha_n * (torch.exp(torch.minimum(h, torch.tensor(eps, dtype=h.dtype))) - 1 - h) + beta * h
    return torch.where(h > 0, pos, neg)


def test_xielu_matches_the_paper_forward_and_gradients():
    act = A.XIELU().double()
    softplus = lambda v: math.log1p(math.exp(v))
    assert softplus(act.a_p.item()) == pytest.approx(0.8) and 0.5 + softplus(act.a_n.item()) == pytest.approx(0.8)
    with torch.no_grad():  # off the init, so both learned scalars matter
        act.a_p.add_(0.3)
        act.a_n.sub_(0.4)
    h = torch.cat([torch.linspace(-6, 6, 97), torch.tensor([0.0, -1e-7, 1e-7])]).double().requires_grad_(True)
    a_p = act.a_p.detach().clone().requires_grad_(True)
    a_n = act.a_n.detach().clone().requires_grad_(True)
    alpha_p = torch.log1p(torch.exp(a_p))
    alpha_n = 0.5 + torch.log1p(torch.exp(a_n))
    y, y_ref = act(h), xielu_reference(h, alpha_p, alpha_n)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (h, act.a_p, act.a_n), g)
    grads_ref = torch.autograd.grad(y_ref, (h, a_p, a_n), g)
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want)
    report = act.learned(None)
    assert report["alpha_p"] == pytest.approx(alpha_p.item()) and report["alpha_n"] == pytest.approx(alpha_n.item())


def test_xielu_computes_in_fp32_under_autocast():
    act = A.XIELU()
    h = torch.linspace(-8, 8, 512).reshape(2, 256)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = act(h.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), act(h), rtol=1e-2, atol=1e-2)


# ---- custom backwards: float64 gradcheck ---------------------------------------------------------------------------
def test_gradcheck_poly_function():
    for use_relu, use_norm in [(False, True), (True, False), (True, True)]:
        h = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
        a = torch.randn(4, dtype=torch.float64, requires_grad=True)
        fn = lambda h, a: A._PolyFunction.apply(h, a, use_relu, use_norm, 1e-6)
        assert torch.autograd.gradcheck(fn, (h, a))


def test_gradcheck_mix_functions():
    names = tuple(A.BASIS)
    K = len(names)
    h = torch.randn(2, 3, 10, dtype=torch.float64, requires_grad=True)
    c_token = torch.randn(2, 3, K, dtype=torch.float64, requires_grad=True)  # MoA
    c_shared = torch.randn(K, dtype=torch.float64, requires_grad=True)  # LA
    assert torch.autograd.gradcheck(lambda h, c: A._MixFunction.apply(h, c, names), (h, c_token))
    assert torch.autograd.gradcheck(lambda h, c: A._MixFunction.apply(h, c, names), (h, c_shared))
    u = torch.randn(2, 3, 10, dtype=torch.float64, requires_grad=True)
    c_up = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    up_names = ("identity", "tanh", "silu")
    glu = lambda h, u, cg, cu: A._MixGLUFunction.apply(h, u, cg, cu, names, up_names)
    assert torch.autograd.gradcheck(glu, (h, u, c_token, c_up))


@pytest.mark.parametrize("variant", ["polynorm", "moa", "moa_glu"])
def test_compiled_ffn_matches_eager(variant):
    torch.manual_seed(1)
    ffn = FFN(GPTConfig(n_embd=32, n_head=4, ffn=variant))
    for p in ffn.parameters():  # move the activations off their init so every path matters
        p.data.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 8, 32, requires_grad=True)
    outputs = []
    for fn in (ffn, torch.compile(ffn)):
        y = fn(x)[0]
        grads = torch.autograd.grad(y.square().sum(), [x, *ffn.parameters()])
        outputs.append((y, grads))
    (y_e, g_e), (y_c, g_c) = outputs
    torch.testing.assert_close(y_c, y_e, rtol=1e-4, atol=1e-5)
    for a, b in zip(g_c, g_e):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# ---- memory and precision ------------------------------------------------------------------------------------------
def saved_bytes(variant, d=128):
    ffn = FFN(GPTConfig(n_embd=d, n_head=4, ffn=variant))
    x = torch.randn(4, 64, d, requires_grad=True)
    return saved_bytes_for_backward(lambda m, x: m(x)[0], ffn, x)[0]


@pytest.mark.parametrize("variant,baseline", [("polynorm", "gelu"), ("la", "gelu"), ("moa", "gelu"), ("moa_glu", "swiglu")])
def test_memory_saved_for_backward(variant, baseline):
    ratio = saved_bytes(variant) / saved_bytes(baseline)
    assert ratio <= 1.10, f"{variant} keeps {ratio:.2f}x the bytes of {baseline} for backward"


def test_naive_polynorm_would_keep_much_more():
    """The measurement can fail: plain autograd of the PolyNorm formula keeps several hidden-width tensors."""
    h = torch.randn(4, 64, 512, requires_grad=True)
    a = torch.randn(4, requires_grad=True)
    naive, _ = saved_bytes_for_backward(lambda h: poly_reference("polynorm", h, a), h)
    lean, _ = saved_bytes_for_backward(lambda h: A._PolyFunction.apply(h, a, False, True, 1e-6), h)
    assert naive > 3 * lean


@pytest.mark.parametrize("order", [3, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_polynorm_half_precision_autocast_large_inputs(order, dtype):
    """|h| up to 50: h^6 = 1.6e10 overflows fp16 (max 65504) unless the powers and means are computed in fp32.
    (bf16 has fp32's range, so only the fp16 case would catch a missing widening; bf16 is what GPU training uses.)"""
    act = A.Poly("polynorm", order)
    h = torch.linspace(-50, 50, 8 * 256).reshape(8, 256)[:, torch.randperm(256)]
    ref = act(h)
    with torch.autocast("cpu", dtype=dtype):
        y = act(h.to(dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()
    rel_rms = ((y.float() - ref).square().mean() / ref.square().mean()).sqrt()
    assert rel_rms < 0.02, rel_rms


def dynamo_ops(fn, *args):
    """The operations torch.compile's graph capture (Dynamo) records for fn(*args), by name."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=record, fullgraph=True)(*args)
    nodes = [n for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    return [getattr(n.target, "__name__", str(n.target)) for n in nodes]


@pytest.mark.parametrize("variant", ["polyrelu", "polynorm", "la", "moa", "la_glu", "moa_glu", "polynorm_glu"])
def test_compiled_learned_activations_hold_no_custom_autograd_function(variant):
    """Compiled, the learned activations run their plain formulas: the captured graph holds no custom autograd
    Function, which AOTAutograd's on-disk cache would refuse to store. The lean Function, compiled, does show up."""
    ffn = FFN(GPTConfig(n_embd=32, n_head=4, ffn=variant))
    assert "autograd_function_apply" not in dynamo_ops(ffn, torch.randn(2, 8, 32))
    h, c = torch.randn(2, 8, 40, requires_grad=True), torch.randn(6, requires_grad=True)
    assert "autograd_function_apply" in dynamo_ops(lambda h, c: A._MixFunction.apply(h, c, tuple(A.BASIS)), h, c)


def backward_graph_ops(fn, *args):
    """The operations of the backward graph that torch.compile makes for fn(*args) on this CPU: traced with Inductor's
    decompositions and split by its min-cut partitioner, as Inductor does before generating code."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return gm.forward
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table())
    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args).sum().backward()
    return [(str(n.target), tuple(n.meta["val"].shape)) for n in graphs["backward"].graph.nodes
            if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)]


TRANSCENDENTAL = {"aten.exp.default", "aten.erf.default", "aten.sigmoid.default", "aten.tanh.default"}


@pytest.mark.parametrize("variant", ["la", "moa", "moa_glu"])
def test_compiled_mixture_backward_evaluates_no_transcendental_on_cpu(variant):
    """Compiled on a CPU, the mixtures keep σ(h), erf(h/√2) and e^{-h²/2} for backward, so their backward evaluates no
    transcendental function at the hidden width (MoA's gates, K per token, may recompute their σ). The check can fail:
    the same mixture without that policy recomputes exp and erf at the hidden width."""
    torch.manual_seed(3)
    ffn = FFN(GPTConfig(n_embd=32, n_head=4, ffn=variant))
    hidden = ffn.w_up.out_features
    ops = backward_graph_ops(lambda x: ffn(x)[0], torch.randn(2, 8, 32, requires_grad=True))
    assert not [op for op, shape in ops if op in TRANSCENDENTAL and shape[-1:] == (hidden,)], ops
    h, c = torch.randn(2, 8, hidden, requires_grad=True), torch.randn(6, requires_grad=True)
    plain = backward_graph_ops(lambda h, c: A.mix_reference(h, c, tuple(A.BASIS)), h, c)
    assert {"aten.exp.default", "aten.erf.default"} <= {op for op, shape in plain if shape[-1:] == (hidden,)}, plain


def test_cpu_gelu_is_gelu_and_takes_its_derivative_from_the_erf_exponential():
    """The GELU of the compiled CPU mixtures has the value of (h/2)(1 + erf(h/√2)) bit for bit in fp32 (its zero term
    adds nothing; that formula is how Inductor computes F.gelu), so F.gelu's within float rounding, and GELU's
    derivative (float64 gradcheck against finite differences of its value); its one exponential is e^{-u²} of the
    very u that erf takes, the expression erf evaluates inside, which is what lets the C++ compiler evaluate it once."""
    from torch.fx.experimental.proxy_tensor import make_fx
    h = torch.linspace(-8, 8, 4001)
    assert torch.equal(A._gelu_sharing_exp(h), (0.5 * h) * (1.0 + torch.erf(h * A._INV_SQRT2)))
    torch.testing.assert_close(A._gelu_sharing_exp(h), torch.nn.functional.gelu(h), rtol=0, atol=1e-6)
    assert torch.autograd.gradcheck(A._gelu_sharing_exp, torch.randn(64, dtype=torch.float64, requires_grad=True))
    nodes = make_fx(A._gelu_sharing_exp)(h).graph.nodes
    (erf,) = [n for n in nodes if n.target == torch.ops.aten.erf.default]
    (exp,) = [n for n in nodes if n.target == torch.ops.aten.exp.default]
    neg = exp.args[0]
    assert neg.target == torch.ops.aten.neg.default and neg.args[0].target == torch.ops.aten.mul.Tensor
    assert neg.args[0].args == (erf.args[0], erf.args[0])


@pytest.mark.parametrize("variant", ["polynorm", "la_glu", "moa_glu"])
def test_compiled_path_computes_in_fp32_under_autocast(variant):
    """Traced by torch.compile's aot_eager backend (the compiled path, without Inductor's code generation) under fp16
    autocast with inputs up to |h| = 50, where h^6 or relu(h)^2 products overflow fp16 unless computed in fp32: the
    compiled FFN stays finite and equals the eager FFN, whose Functions widen to fp32 explicitly."""
    torch.manual_seed(2)
    ffn = FFN(GPTConfig(n_embd=32, n_head=4, ffn=variant))
    for p in ffn.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    x = 8 * torch.randn(2, 8, 32)
    outputs = []
    for fn in (ffn, torch.compile(ffn, backend="aot_eager", fullgraph=True)):
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.float16):
            y = fn(xi)[0]
        grads = torch.autograd.grad(y.float().mean(), [xi, *ffn.parameters()])
        outputs.append((y, grads))
    (y_e, g_e), (y_c, g_c) = outputs
    assert y_c.dtype == torch.float16 and torch.isfinite(y_c).all()
    torch.testing.assert_close(y_c, y_e, rtol=2e-3, atol=2e-3)
    for a, b in zip(g_c, g_e):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_readme_variant_table_is_the_registry():
    """README's table of FFN variants lists every registry record, in registry order, with its kind and source."""
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (mlp|glu) \| .* \| ([^|]+) \|$", readme, flags=re.M)
    assert [name for name, _, _ in rows] == list(A.VARIANTS)
    for name, kind, source in rows:
        assert (kind, source.strip()) == (A.VARIANTS[name].kind, A.VARIANTS[name].source), name
