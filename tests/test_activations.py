"""The activations equal their papers' formulas (independent float64 references written here, not imported): every
dictionary entry, every MoA gate and every FFN variant of the registry, values and gradients; exactly where an
equivalence is claimed (LA one-hot = the fixed activation, MoA with zero gates = LA, bi-sided GLUs = SwiGLU); the
formulas pass float64 gradcheck as training runs them; a run follows an edit of a formula, eager and compiled; and the
learned activations keep no more memory for backward than the baselines do."""
import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import activations as A
import train
from bench import saved_bytes_for_backward
from model import FFN, GPT, GPTConfig

torch.manual_seed(0)
ROOT = Path(__file__).resolve().parent.parent
LEARNED = [v for v in A.VARIANTS if A.VARIANTS[v].extras(GPTConfig(ffn=v)) > 0]  # variants with learned extras
MOA = [v for v in A.VARIANTS if isinstance(A.make_activations(GPTConfig(ffn=v))[0], A.MoA)]
ALPHA_GATES = [g for g in A.MOA_GATES if A.MoA(["relu"], 4, gate=g).alpha is not None]  # the gates that contain LA
PAPER_DICT = "identity,relu,relu2,gelu,silu,leaky_relu,tanh"  # the paper's dictionary, as its public summaries report


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


# one per entry of activations.BASIS (an entry added there needs its reference here)
REF_BASIS = {
    "identity": lambda h: h,
    "relu": lambda h: torch.clamp(h, min=0),
    "relu2": lambda h: torch.clamp(h, min=0) ** 2,
    "gelu": lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2))),
    "silu": lambda h: h / (1 + torch.exp(-h)),
    "leaky_relu": lambda h: torch.where(h > 0, h, 0.01 * h),
    "tanh": lambda h: (torch.exp(h) - torch.exp(-h)) / (torch.exp(h) + torch.exp(-h)),
}


def ref_basis(name):
    assert name in REF_BASIS, f"add an independent reference for {name!r} to REF_BASIS in tests/test_activations.py"
    return REF_BASIS[name]


# MoA's c(x) from its logits z = Ux (+ b), one per activations.MOA_GATES (a gate added there needs its line here)
REF_GATES = {
    "sigmoid": lambda z, alpha: alpha * 2 / (1 + torch.exp(-z)),
    "softmax": lambda z, alpha: alpha * z.shape[-1] * torch.exp(z) / torch.exp(z).sum(-1, keepdim=True),
    "tanh": lambda z, alpha: alpha * (1 + REF_BASIS["tanh"](z)),
    "plain_sigmoid": lambda z, alpha: 1 / (1 + torch.exp(-z)),
}


def mixture_reference(act, x, h):
    """Σ_k c_k φ_k(h): c = α for LA, MoA's gate of REF_GATES for MoA; φ_k of REF_BASIS."""
    c = act.alpha
    if isinstance(act, A.MoA):
        assert act.gate_kind in REF_GATES, f"add moa_gate={act.gate_kind!r} to REF_GATES in tests/test_activations.py"
        W, b = act.mix_logits.weight, act.mix_logits.bias
        c = REF_GATES[act.gate_kind](x @ W.T + (0 if b is None else b), act.alpha)
    return sum(c[..., k : k + 1] * ref_basis(n)(h) for k, n in enumerate(act.names))


def xielu_reference(h, alpha_p, alpha_n, beta=0.5, eps=-1e-6):
    """xIELU (Huang et al. 2024), with α_p, α_n the positive coefficients themselves (not their softplus parameters)."""
    pos = alpha_p * h * h + beta * h
    neg = alpha_n * (torch.exp(torch.minimum(h, torch.tensor(eps, dtype=h.dtype))) - 1 - h) + beta * h
    return torch.where(h > 0, pos, neg)


def xielu_of(act, h):
    softplus = lambda v: torch.log1p(torch.exp(v))
    return xielu_reference(h, softplus(act.a_p), 0.5 + softplus(act.a_n))


# one float64 reference per variant of activations.VARIANTS (a variant added there needs its line here): what its FFN
# `f` computes before W_down, from f's learned scalars, the FFN input x and h = W_up x: φ(h) for an mlp variant,
# φ(g) ⊙ φ_up(h) for a glu variant, g = W_gate x
REF_VARIANTS = {
    "relu": lambda f, x, h: ref_basis("relu")(h),
    "gelu": lambda f, x, h: ref_basis("gelu")(h),
    "relu2": lambda f, x, h: ref_basis("relu2")(h),
    "silu": lambda f, x, h: ref_basis("silu")(h),
    "polyrelu": lambda f, x, h: poly_reference("polyrelu", h, f.act.coeffs),
    "polynorm": lambda f, x, h: poly_reference("polynorm", h, f.act.coeffs),
    "polyrelunorm": lambda f, x, h: poly_reference("polyrelunorm", h, f.act.coeffs),
    "la": lambda f, x, h: mixture_reference(f.act, x, h),
    "moa": lambda f, x, h: mixture_reference(f.act, x, h),
    "xielu": lambda f, x, h: xielu_of(f.act, h),
    "swiglu": lambda f, x, g, h: ref_basis("silu")(g) * h,
    "geglu": lambda f, x, g, h: ref_basis("gelu")(g) * h,
    "reglu": lambda f, x, g, h: ref_basis("relu")(g) * h,
    "polynorm_glu": lambda f, x, g, h: poly_reference("polynorm", g, f.act.coeffs) * h,
    "la_glu": lambda f, x, g, h: mixture_reference(f.act, x, g) * mixture_reference(f.act_up, x, h),
    "moa_glu": lambda f, x, g, h: mixture_reference(f.act, x, g) * mixture_reference(f.act_up, x, h),
    "xielu_glu": lambda f, x, g, h: xielu_of(f.act, g) * h,
}


def basis(names):
    return tuple(A.BASIS[n] for n in names)


def check_ffn_against_reference(variant, **settings):
    """The FFN of `variant` (off its init, float64) against REF_VARIANTS: its output and every gradient."""
    args = "g, h" if A.VARIANTS[variant].gated else "h"
    assert variant in REF_VARIANTS, (f"add a float64 reference for {variant!r} to REF_VARIANTS in "
                                     f"tests/test_activations.py: `\"{variant}\": lambda f, x, {args}: ...`")
    torch.manual_seed(0)
    f = FFN(GPTConfig(n_embd=16, n_head=4, ffn=variant, **settings)).double()
    with torch.no_grad():  # off the init, so that every learned scalar and gate matters
        for p in f.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    branches = (f.w_up(x),) if f.w_gate is None else (f.w_gate(x), f.w_up(x))
    y, y_ref = f(x)[0], f.w_down(REF_VARIANTS[variant](f, x, *branches))
    g, wrt = torch.randn_like(y), [x, *f.parameters()]
    grads = [torch.autograd.grad(out, wrt, g, allow_unused=True, materialize_grads=True) for out in (y, y_ref)]
    pairs = [(y, y_ref), *zip(*grads)]
    worst = max((a - b).abs().max().item() for a, b in pairs)
    assert all(torch.allclose(a, b) for a, b in pairs), (
        f"{variant}'s FFN does not compute its formula in REF_VARIANTS (its output or a gradient is off by "
        f"{worst:.3g}): check the record of {variant!r} in activations.VARIANTS against it")


# ---- every variant of the registry ---------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(A.VARIANTS))
def test_every_ffn_computes_its_reference_formula(variant):
    check_ffn_against_reference(variant)


# ---- the dictionary --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(A.BASIS))
def test_dictionary_entries_and_their_slopes_are_the_textbook_functions(name):
    ref = ref_basis(name)
    h = torch.linspace(-6, 6, 1001, dtype=torch.float64).requires_grad_(True)
    torch.testing.assert_close(A.BASIS[name](h), ref(h))
    for got, want in zip(*(torch.autograd.grad(fn(h).sum(), h) for fn in (A.BASIS[name], ref))):
        torch.testing.assert_close(got, want)


def test_the_dictionarys_tanh_is_torch_tanh_exactly_in_fp32():
    h = torch.cat([torch.linspace(-20, 20, 100_001), torch.tensor([1e-5, -1e-5, 1e-30, 0.0, 88.8, -1e30])])
    assert torch.equal(A.BASIS["tanh"](h), torch.tanh(h))


@pytest.mark.parametrize("name", list(A.BASIS))
def test_la_onehot_equals_fixed_activation_exactly(name):
    la = A.LA(list(A.BASIS), f"onehot:{name}")
    h = torch.randn(4, 9, 64)
    assert torch.equal(la(h), A.Fixed(name)(h))


# ---- PolyCom -------------------------------------------------------------------------------------------------------
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


@pytest.mark.parametrize("order", [3, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_polynorm_half_precision_autocast_large_inputs(order, dtype):
    """|h| up to 50: h^6 = 1.6e10 overflows fp16 (max 65504) unless the powers and means are computed in fp32."""
    act = A.Poly("polynorm", order)
    h = torch.linspace(-50, 50, 8 * 256).reshape(8, 256)[:, torch.randperm(256)]
    ref = act(h)
    with torch.autocast("cpu", dtype=dtype):
        y = act(h.to(dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()
    rel_rms = ((y.float() - ref).square().mean() / ref.square().mean()).sqrt()
    assert rel_rms < 0.02, rel_rms


# ---- LA and MoA ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gate", A.MOA_GATES)
def test_la_and_moa_match_mixture_reference(gate):
    """Over the whole dictionary BASIS; test_every_moa_gate_... checks the gradients too, inside the FFN."""
    names = list(A.BASIS)
    moa = A.MoA(names, 16, gate=gate).double()
    with torch.no_grad():
        for p in moa.parameters():
            p.normal_()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    h = torch.randn(3, 5, 32, dtype=torch.float64)
    torch.testing.assert_close(moa(h, moa.token_gates(x)), mixture_reference(moa, x, h))
    la = A.LA(names).double()
    torch.testing.assert_close(la(h), mixture_reference(la, x, h))


@pytest.mark.parametrize("gate", A.MOA_GATES)
@pytest.mark.parametrize("variant", MOA)
def test_every_moa_gate_computes_its_reference_formula(variant, gate):
    """Values and gradients in float64, through the checkpointed formula eager training runs, with the paper's
    dictionary."""
    check_ffn_against_reference(variant, moa_gate=gate, act_dict=PAPER_DICT)


@pytest.mark.parametrize("gate", A.MOA_GATES)
@pytest.mark.parametrize("variant", MOA)
def test_moa_extras_are_counted_for_every_gate(variant, gate):
    """Per layer and branch: the paper's plain gate has U (K·d); the gates with α add α and b (2K)."""
    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=84, ffn=variant, moa_gate=gate, act_dict=PAPER_DICT)
    model = GPT(cfg)
    per_branch = 7 * 64 + (0 if gate == "plain_sigmoid" else 2 * 7)
    assert A.VARIANTS[variant].extras(cfg) == per_branch * (2 if A.VARIANTS[variant].gated else 1)
    own = sum(p.numel() for m in model.modules() if isinstance(m, A.MoA) for p in m.parameters())
    assert model.param_report()["extras"] == 2 * A.VARIANTS[variant].extras(cfg) == own


@pytest.mark.parametrize("variant", MOA)
def test_the_plain_sigmoid_gates_start_at_one_half_exactly(variant):
    """Inside a GPT (whose init keeps the gates at zero): c_k(x) = σ(0) = ½ for every token and entry, so each MoA
    starts as ½ Σ_k φ_k(h), exactly."""
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=84, ffn=variant, moa_gate="plain_sigmoid",
                          act_dict=PAPER_DICT))
    x, h = torch.randn(3, 5, 64), torch.randn(3, 5, 256)
    acts = [m for m in model.modules() if isinstance(m, A.MoA)]
    assert len(acts) == 2 * (2 if A.VARIANTS[variant].gated else 1)
    for act in acts:
        c = act.token_gates(x)
        assert c.shape == (3, 5, 7) and torch.all(c == 0.5)
        assert torch.equal(act(h, c), 0.5 * sum(A.BASIS[n](h) for n in PAPER_DICT.split(",")))


def test_the_papers_moa_trains(shakespeare_char_dir, tmp_path):
    """The paper's form end to end through train.py: its gates log ½ at iteration 0 and move as it trains."""
    tiny = ['--device=cpu', '--dtype=float32', '--compile=False', '--n_layer=1', '--n_head=2', '--n_embd=32',
            '--block_size=32', '--batch_size=4', '--eval_iters=2', '--warmup_iters=0', '--learning_rate=1e-2']
    with contextlib.redirect_stdout(io.StringIO()):
        train.main(tiny + [f'--data_dir={shakespeare_char_dir}', f'--out_dir={tmp_path}', '--max_iters=4',
                           '--eval_interval=2', '--ffn=moa', '--moa_gate=plain_sigmoid', f'--act_dict={PAPER_DICT}'])
    evals = [r for r in map(json.loads, open(tmp_path / 'log.jsonl')) if 'act' in r]
    first, last = (r['act']['layers'][0]['act'] for r in (evals[0], evals[-1]))
    assert evals[0]['iter'] == 0 and list(first['c_mean']) == PAPER_DICT.split(",")
    assert set(first['c_mean'].values()) == {0.5} and set(first['c_std'].values()) == {0.0}
    assert all(math.isfinite(r['val_loss']) for r in evals if 'val_loss' in r) and last['c_mean'] != first['c_mean']


@pytest.mark.parametrize("gate", ALPHA_GATES)
def test_moa_with_zero_gates_equals_la_exactly(gate):
    names = list(A.BASIS)
    la, moa = A.LA(names, "mean"), A.MoA(names, 32, "mean", gate)
    with torch.no_grad():
        alpha = torch.randn(len(names))
        la.alpha.copy_(alpha)
        moa.alpha.copy_(alpha)
    x, h = torch.randn(4, 10, 32), torch.randn(4, 10, 128)
    assert torch.equal(moa(h, moa.token_gates(x)), la(h))


@pytest.mark.parametrize("variant", ["la_glu", "moa_glu"])
def test_bisided_glu_with_onehot_silu_identity_equals_swiglu_exactly(variant):
    d = 32
    mixture = FFN(GPTConfig(n_embd=d, n_head=4, ffn=variant, la_init="onehot:silu/onehot:identity"))
    swiglu = FFN(GPTConfig(n_embd=d, n_head=4, ffn="swiglu"))
    for name in ("w_gate", "w_up", "w_down"):  # weights shared
        getattr(mixture, name).load_state_dict(getattr(swiglu, name).state_dict())
    x = torch.randn(3, 8, d)
    assert torch.equal(mixture(x)[0], swiglu(x)[0])


# ---- xIELU (Huang et al. 2024, arXiv 2411.13010) ------------------------------------------------------------------
def test_xielu_matches_the_paper_forward_and_gradients():
    act = A.XIELU().double()
    softplus = lambda v: math.log1p(math.exp(v))
    assert softplus(act.a_p.item()) == pytest.approx(0.8) and 0.5 + softplus(act.a_n.item()) == pytest.approx(0.8)
    with torch.no_grad():  # off the init, so both learned scalars matter
        act.a_p.add_(0.3)
        act.a_n.sub_(0.4)
    h = torch.cat([torch.linspace(-6, 6, 97), torch.tensor([0.0, -1e-7, 1e-7, -1e-6])]).double().requires_grad_(True)
    a_p = act.a_p.detach().clone().requires_grad_(True)
    a_n = act.a_n.detach().clone().requires_grad_(True)
    alpha_p, alpha_n = torch.log1p(torch.exp(a_p)), 0.5 + torch.log1p(torch.exp(a_n))
    y, y_ref = act(h), xielu_reference(h, alpha_p, alpha_n)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, (h, act.a_p, act.a_n), g), torch.autograd.grad(y_ref, (h, a_p, a_n), g)):
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


# ---- the curves the pictures draw (Activation.curves, comparison/acts.py) ----------------------------------------------
@pytest.mark.parametrize("kind", ["polynorm", "polyrelunorm"])
@pytest.mark.parametrize("order", [2, 3, 4])
def test_polynorm_curves_are_the_per_token_formula_in_float64(kind, order):
    """N normalises over the token's own h: φ_t(v) = a_0 + Σ_i a_i b(v)^i / sqrt(mean_j b(h_tj)^(2i) + 1e-6), b = h or
    relu(h), one curve per token."""
    act = A.Poly(kind, order).double()
    with torch.no_grad():
        act.coeffs.copy_(torch.randn(order + 1, dtype=torch.float64))
        h, grid = torch.randn(6, 48, dtype=torch.float64), torch.linspace(-3, 3, 25, dtype=torch.float64)
        b = (lambda v: torch.clamp(v, min=0)) if kind == "polyrelunorm" else (lambda v: v)
        a = act.coeffs
        ref = a[0] + sum(a[i] * b(grid)[None] ** i / torch.sqrt((b(h) ** (2 * i)).mean(-1, keepdim=True) + 1e-6)
                         for i in range(1, order + 1))
        torch.testing.assert_close(act.curves(grid, h, torch.randn(6, 8)), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", list(A.VARIANTS))
def test_every_curve_through_a_tokens_own_inputs_is_what_its_ffn_computes(variant):
    """For every activation the registry builds, token t's curve at its own pre-activations h_t is φ(h)_t as the FFN
    computes it: at the first quarter of them, where a curve that normalised over its points instead of the token's
    row would differ."""
    torch.manual_seed(0)
    d, m = 16, 40
    for act in A.make_activations(GPTConfig(ffn=variant, n_embd=d, n_head=4)):
        if act is None:
            continue
        with torch.no_grad():
            for p in act.parameters():  # off their init, so that MoA's gates differ between tokens
                p.add_(0.3 * torch.randn_like(p))
            h, x = torch.randn(5, m), torch.randn(5, d)
            computed = act(h, act.token_gates(x))
            for t in range(len(h)):
                curve = act.curves(h[t, : m // 4], h[t : t + 1], x[t : t + 1])
                torch.testing.assert_close(curve, computed[t : t + 1, : m // 4])


# ---- the formulas as training runs them: float64 gradcheck, and a run follows an edit of a formula ---------------
def formula_calls():
    """(name, formula, float64 inputs that need gradients) for every formula a learned activation runs."""
    names, up = tuple(A.BASIS), ("identity", "tanh", "silu")
    h, u = (torch.randn(2, 3, 10, dtype=torch.float64) for _ in range(2))
    shapes = [(2, 3, len(names)), (len(names),), (2, 3, 3)]
    c_token, c_shared, c_up = (torch.randn(*shape, dtype=torch.float64) for shape in shapes)
    a = torch.randn(4, dtype=torch.float64)
    ap, an = torch.tensor(0.3, dtype=torch.float64), torch.tensor(-0.2, dtype=torch.float64)
    h_away = torch.cat([torch.linspace(-5, -0.01, 20), torch.linspace(0.01, 5, 20)]).double()  # off xIELU's kinks
    calls = [(f"poly relu={r} norm={n}", lambda h, a, r=r, n=n: A.poly_formula(h, a, r, n), (h, a))
             for r, n in [(False, True), (True, False), (True, True)]]
    calls += [("mix per token", lambda h, c: A.mix_formula(h, c, basis(names)), (h, c_token)),
              ("mix shared", lambda h, c: A.mix_formula(h, c, basis(names)), (h, c_shared)),
              ("mix glu", lambda g, u, cg, cu: A.mix_product(g, u, cg, cu, basis(names), basis(up)),
               (h, u, c_token, c_up)),
              ("xielu", lambda h, a, b: A.xielu_formula(h, a, b, 0.5, -1e-6), (h_away, ap, an))]
    return [(name, f, tuple(t.clone().requires_grad_(True) for t in args)) for name, f, args in calls]


@pytest.mark.parametrize("name,formula,args", formula_calls(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_formula_passes_gradcheck_as_eager_training_runs_it(name, formula, args):
    """Through keep_inputs, which reruns the formula in backward (torch's checkpoint), as an eager step does."""
    assert torch.autograd.gradcheck(lambda *a: A.keep_inputs(formula, *a), args)


@pytest.mark.parametrize("variant", LEARNED)
def test_every_learned_ffn_passes_gradcheck_in_its_input_and_its_learned_scalars(variant):
    """From the registry, so that an activation a learner adds is checked whatever its formula is called: the FFN in
    float64 as an eager step runs it (keep_inputs), in its input x and its activations' own parameters."""
    torch.manual_seed(0)
    ffn = FFN(GPTConfig(n_embd=4, ffn_mult=2.0, ffn=variant)).double()
    with torch.no_grad():  # off the init (MoA's zero gates), so that every parameter matters
        for p in ffn.parameters():
            p.add_(0.1 * torch.randn_like(p))
    names = [n for n, _ in ffn.named_parameters() if n.startswith(("act.", "act_up."))]
    own = tuple(dict(ffn.named_parameters())[n].detach().clone().requires_grad_(True) for n in names)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    f = lambda x, *p: torch.func.functional_call(ffn, dict(zip(names, p)), (x,))[0]
    assert names and torch.autograd.gradcheck(f, (x, *own))


def loss_and_grads(variant, compiled):
    """One step of a 1-layer GPT on a CPU: its loss and every parameter's gradient."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, ffn=variant))
    with torch.no_grad():  # off the init, so that every learned scalar and gate matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = torch.randint(0, 64, (2, 16))
    torch._dynamo.reset()  # compiled: trace the formulas as they are now
    loss = (torch.compile(model) if compiled else model)(x, x)[1]
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def check_a_run_follows_an_edit_of_its_formula(variant, compiled, monkeypatch):
    """A learner's edit of a formula in activations.py (its value times 3, here of every *_formula at once) changes
    the run's loss and gradients, which then equal plain autograd's through the edited formula."""
    before = loss_and_grads(variant, compiled)
    for name in [n for n in vars(A) if n.endswith("_formula")]:  # poly_formula, ..., and any a learner adds
        monkeypatch.setattr(A, name, lambda *a, formula=getattr(A, name), **k: 3 * formula(*a, **k))
    edited = loss_and_grads(variant, compiled)
    monkeypatch.setattr(A, "keep_inputs", lambda formula, *args: formula(*args))
    plain = loss_and_grads(variant, compiled=False)
    assert not torch.allclose(edited[0], before[0])
    assert any(not torch.allclose(a, b) for a, b in zip(edited[1], before[1]))
    tol = dict(rtol=1e-4, atol=1e-5) if compiled else dict(rtol=0, atol=0)
    torch.testing.assert_close(edited[0], plain[0], **tol)
    for a, b in zip(edited[1], plain[1]):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("variant", LEARNED)
def test_an_eager_cpu_run_follows_an_edit_of_the_formula(variant, monkeypatch):
    check_a_run_follows_an_edit_of_its_formula(variant, False, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("variant", LEARNED)
def test_a_compiled_cpu_run_follows_an_edit_of_the_formula(variant, monkeypatch):
    check_a_run_follows_an_edit_of_its_formula(variant, True, monkeypatch)


# ---- memory --------------------------------------------------------------------------------------------------------
def saved_bytes(variant, d=128):
    ffn = FFN(GPTConfig(n_embd=d, n_head=4, ffn=variant))
    x = torch.randn(4, 64, d, requires_grad=True)
    return saved_bytes_for_backward(lambda m, x: m(x)[0], ffn, x)[0]


@pytest.mark.parametrize("variant", LEARNED)
def test_learned_variants_keep_no_more_for_backward_than_their_baseline(variant):
    ratio = saved_bytes(variant) / saved_bytes(A.baseline_of(variant))
    assert ratio <= 1.05, (f"{variant} keeps {ratio:.2f}x the bytes of {A.baseline_of(variant)} for backward: run its "
                           f"formula through keep_inputs")


def test_naive_polynorm_would_keep_much_more():
    """The measurement can fail: plain autograd of the PolyNorm formula keeps several hidden-width tensors."""
    h = torch.randn(4, 64, 512, requires_grad=True)
    a = torch.randn(4, requires_grad=True)
    naive, _ = saved_bytes_for_backward(lambda h: A.poly_formula(h, a, False, True), h)
    kept, _ = saved_bytes_for_backward(lambda h: A.keep_inputs(A.poly_formula, h, a, False, True), h)
    assert naive > 3 * kept


def test_activations_py_holds_ideas_not_compiler_machinery():
    """The file a learner edits: no compiler internals, and eager and compiled part ways in one place only."""
    text = (ROOT / "activations.py").read_text()
    assert not re.findall(r"_inductor|selective_checkpoint|CheckpointPolicy|getLogger|_CPU_", text)
    assert text.count("is_compiling") == 1


# ---- compiled (slow: each compile takes seconds on a CPU) ----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["polynorm", "moa", "moa_glu", "xielu"])
def test_compiled_ffn_matches_eager(variant):
    torch.manual_seed(1)
    ffn = FFN(GPTConfig(n_embd=32, n_head=4, ffn=variant))
    for p in ffn.parameters():  # move the activations off their init so every path matters
        p.data.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 8, 32, requires_grad=True)
    outputs = []
    for fn in (ffn, torch.compile(ffn)):
        y = fn(x)[0]
        outputs.append((y, torch.autograd.grad(y.square().sum(), [x, *ffn.parameters()])))
    (y_e, g_e), (y_c, g_c) = outputs
    torch.testing.assert_close(y_c, y_e, rtol=1e-4, atol=1e-5)
    for a, b in zip(g_c, g_e):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def dynamo_ops(fn, *args):
    """The operations torch.compile's graph capture (Dynamo) records for fn(*args), by name."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=record, fullgraph=True)(*args)
    return [getattr(n.target, "__name__", str(n.target)) for g in graphs for n in g.graph.nodes if n.op == "call_function"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", LEARNED)
def test_compiled_learned_activations_run_the_plain_formula(variant):
    """Compiled, the learned activations run their plain formula, with no checkpoint: Inductor chooses what backward
    keeps. (The check can fail: keep_inputs's checkpoint, compiled, does show up.)"""
    ffn = FFN(GPTConfig(n_embd=32, n_head=4, ffn=variant))
    assert "tag_activation_checkpoint" not in dynamo_ops(ffn, torch.randn(2, 8, 32, requires_grad=True))
    h, c = torch.randn(2, 8, 40, requires_grad=True), torch.randn(len(A.BASIS), requires_grad=True)
    checkpointed = lambda h, c: checkpoint(A.mix_formula, h, c, basis(A.BASIS), use_reentrant=False)
    assert "tag_activation_checkpoint" in dynamo_ops(checkpointed, h, c)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["polynorm", "la_glu", "moa_glu"])
def test_compiled_path_computes_in_fp32_under_autocast(variant):
    """Traced by torch.compile's aot_eager backend under fp16 autocast with inputs up to |h| = 50, where h^6 or relu(h)^2
    products overflow fp16 unless computed in fp32: the compiled FFN stays finite and equals the eager FFN."""
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
        outputs.append((y, torch.autograd.grad(y.float().mean(), [xi, *ffn.parameters()])))
    (y_e, g_e), (y_c, g_c) = outputs
    assert y_c.dtype == torch.float16 and torch.isfinite(y_c).all()
    torch.testing.assert_close(y_c, y_e, rtol=2e-3, atol=2e-3)
    for a, b in zip(g_c, g_e):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["la", "moa", "moa_glu"])
def test_compiled_mixtures_keep_no_more_for_backward_than_their_baseline(variant):
    """Compiled, Inductor chooses what backward keeps: the mixtures stay at their baseline's bytes."""
    def compiled_bytes(v):
        torch._dynamo.reset()
        ffn = FFN(GPTConfig(n_embd=128, n_head=4, ffn=v))
        x = torch.randn(4, 64, 128, requires_grad=True)
        f = torch.compile(lambda x: ffn(x)[0], dynamic=False)
        f(x).sum().backward()  # compile outside the measurement
        return saved_bytes_for_backward(lambda m, x: f(x), ffn, x)[0]
    ratio = compiled_bytes(variant) / compiled_bytes(A.baseline_of(variant))
    assert ratio <= 1.05, f"compiled {variant} keeps {ratio:.2f}x the bytes of {A.baseline_of(variant)} for backward"
