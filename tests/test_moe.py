"""The toy MoE routes, dispatches and balances as model.MoE's docstring says (fp32 softmax router, top-k, renormalised
weights, dropless grouped dispatch, load-balance and z-losses), drops no token, and compiles."""
import copy

import pytest
import torch
import torch.nn.functional as F

from activations import VARIANTS, glu
from model import GPTConfig
from model import GPT
from test_model import corpus_batch


def make_moe(ffn, d=32, E=4, k=2, **kw):
    torch.manual_seed(0)
    cfg = GPTConfig(n_embd=d, n_head=4, ffn=ffn, n_expert=E, top_k=k, **kw)
    moe = GPT(GPTConfig(**{**cfg.__dict__, "n_layer": 1})).transformer.h[0].ffn  # the GPT's own init
    for p in moe.parameters():  # move gates/coefficients off their init so every path matters
        p.data.add_(0.05 * torch.randn_like(p))
    return moe


def naive_moe(moe, x):
    """Token by token: softmax router in fp32, top-k, renormalise, and sum the k experts' FFN outputs."""
    out = []
    for xt in x.reshape(-1, x.shape[-1]):
        p = torch.softmax(xt.float() @ moe.router.weight.float().T, -1)
        w, e = p.topk(moe.top_k)
        w = w / w.sum() if moe.top_k > 1 else w  # top-1 keeps its probability (Switch Transformer)
        xt = xt[None]
        y = 0
        for wi, ei in zip(w, e):
            if moe.act_up is None:
                h = moe.act(xt @ moe.w_up[ei], moe.act.token_gates(xt))
            else:
                h = glu(moe.act, moe.act_up, xt @ moe.w_gate[ei], xt @ moe.w_up[ei], moe.act.token_gates(xt), moe.act_up.token_gates(xt))
            y = y + wi * (h @ moe.w_down[ei])
        out.append(y[0])
    return torch.stack(out).view_as(x)


def outputs_and_grads(fn, moe, x):
    x = x.clone().requires_grad_(True)
    y = fn(x)
    grads = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum(), [x, *moe.parameters()], allow_unused=True)
    return y, grads


@pytest.mark.parametrize("ffn,k", [(f, 2) for f in VARIANTS] + [("swiglu", 1)])
def test_moe_equals_naive_token_loop(ffn, k):
    moe = make_moe(ffn, k=k)
    x = torch.randn(2, 12, 32)
    y, g = outputs_and_grads(lambda x: moe(x)[0], moe, x)
    y_ref, g_ref = outputs_and_grads(lambda x: naive_moe(moe, x), moe, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-5)
    for name, a, b in zip(["x"] + [n for n, _ in moe.named_parameters()], g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{ffn} grad {name}: {m}")


@pytest.mark.parametrize("ffn", ["relu", "moa_glu"])
def test_grouped_mm_equals_per_expert_loop(ffn, monkeypatch):
    from machinery import grouped_matmul
    moe = make_moe(ffn)
    x = torch.randn(3, 16, 32)
    y, g = outputs_and_grads(lambda x: moe(x)[0], moe, x)
    monkeypatch.setattr(grouped_matmul, "GROUPED_MM", None)  # torch without a grouped matmul: the per-expert loop
    y_loop, g_loop = outputs_and_grads(lambda x: moe(x)[0], moe, x)
    torch.testing.assert_close(y, y_loop, rtol=1e-5, atol=1e-6)
    for a, b in zip(g, g_loop):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# (torch version, CUDA capability): one kernel? torch 2.8's _grouped_mm raises off 9.0; from 2.10 the CUTLASS kernel
# runs on sm90 and sm100, and F.grouped_mm loops over the groups with a host sync elsewhere
PAIRS = [((2, 8), (9, 0), True), ((2, 8), (10, 0), False), ((2, 8), (12, 0), False), ((2, 8), (8, 0), False),
         ((2, 9), (9, 0), True), ((2, 9), (10, 0), False), ((2, 10), (9, 0), True), ((2, 10), (10, 0), True),
         ((2, 13), (10, 3), True), ((2, 13), (12, 0), False), ((2, 13), (8, 9), False), ((2, 13), (8, 0), False),
         ((2, 13), (7, 5), False), ((2, 7), (9, 0), False)]


@pytest.mark.parametrize("version, capability, ok", PAIRS)
def test_the_grouped_matmul_runs_as_one_kernel_only_where_torch_has_one(fake_gpu, monkeypatch, version, capability, ok):
    """The dispatch on fake CUDA operands of each (torch version, capability) pair: bf16 only, 16-byte aligned rows."""
    from machinery import grouped_matmul
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr(grouped_matmul, "TORCH", version)
    monkeypatch.setattr(grouped_matmul.one_kernel, "__defaults__", (None, version))
    fake_gpu(capability=capability)
    with FakeTensorMode():  # shapes, dtypes and devices only: no GPU needed
        cuda = lambda shape, dtype: torch.empty(shape, dtype=dtype, device="cuda")
        assert grouped_matmul._grouped_mm_ok(cuda((8, 16), torch.bfloat16), cuda((2, 16, 16), torch.bfloat16)) == ok
        for dtype in (torch.float16, torch.float32):
            assert not grouped_matmul._grouped_mm_ok(cuda((8, 16), dtype), cuda((2, 16, 16), dtype))
        assert not grouped_matmul._grouped_mm_ok(cuda((8, 16), torch.bfloat16), cuda((2, 16, 3), torch.bfloat16))


def test_the_grouped_matmul_on_a_cpu_is_torchs_public_one_from_2_10(monkeypatch):
    from machinery import grouped_matmul
    a, w = torch.randn(8, 16), torch.randn(2, 16, 16)
    assert grouped_matmul._grouped_mm_ok(a, w) == (grouped_matmul.TORCH >= (2, 10))
    assert not grouped_matmul._grouped_mm_ok(a, w[:, :, :3])  # rows of 12 bytes: not 16-byte aligned
    assert not grouped_matmul._grouped_mm_ok(a.double(), w.double())
    assert not grouped_matmul.one_kernel("cpu", torch.float32, version=(2, 9))  # only torch._grouped_mm: CUDA
    monkeypatch.setattr(grouped_matmul, "GROUPED_MM", None)  # torch 2.6-2.7
    assert not grouped_matmul._grouped_mm_ok(a, w)


def test_the_backward_reads_the_weights_in_place(monkeypatch):
    """No copy of every expert's weights per call: backward hands expert_mm the transposed view of w itself."""
    from machinery import grouped_matmul
    real, seen = grouped_matmul.expert_mm, []
    monkeypatch.setattr(grouped_matmul, "expert_mm", lambda a, w, offs: seen.append(w) or real(a, w, offs))
    a, w = torch.randn(8, 16, requires_grad=True), torch.randn(2, 16, 32, requires_grad=True)
    real(a, w, torch.tensor([3, 8], dtype=torch.int32)).sum().backward()
    assert len(seen) == 1 and seen[0].untyped_storage().data_ptr() == w.untyped_storage().data_ptr()


def routed_batch(moe, preferred):
    """Tokens of E types (one-hot inputs); type j's router logits are large for the experts in preferred(j)."""
    E, d = moe.n_expert, moe.router.weight.shape[1]
    with torch.no_grad():
        moe.router.weight.zero_()
        for j in range(E):
            for e in preferred(j):
                moe.router.weight[e, j] = 20.0
    return F.one_hot(torch.arange(64) % E, d).float()[None]  # (1, 64, d), every type equally often


def test_load_balance_loss_is_alpha_at_balance_and_grows_on_collapse():
    moe = make_moe("relu", E=4, k=2, aux_loss_weight=0.01, z_loss_weight=0.0)
    x = routed_batch(moe, lambda j: (j, (j + 1) % 4))  # each expert gets exactly T·k/E pairs, P̄_i = 1/E
    _, aux = moe(x)
    assert aux[0].item() == pytest.approx(0.01, rel=1e-6)
    x = routed_batch(moe, lambda j: (0, 1))  # collapse: every token to experts 0 and 1
    _, aux = moe(x)
    assert aux[0].item() > 1.9 * 0.01


def test_z_loss_is_the_formula():
    moe = make_moe("relu", z_loss_weight=0.003)
    x = torch.randn(2, 10, 32)
    z = x.reshape(-1, 32) @ moe.router.weight.T
    expected = 0.003 * torch.logsumexp(z, -1).square().mean()
    torch.testing.assert_close(moe(x)[1][1], expected)


@pytest.mark.parametrize("ffn", ["relu", "moa"])
def test_no_token_is_dropped_even_with_a_skewed_router(ffn):
    """Expert e writes its routing weight into output channel e only; every token must show exactly k of them."""
    E, k, d = 4, 2, 32
    moe = make_moe(ffn, d=d, E=E, k=k, act_dict="relu", la_init="sum")
    with torch.no_grad():
        moe.router.weight.normal_()
        moe.router.weight[0, 0] = 10.0  # skewed: with x[0] = 1, expert 0 is nearly everyone's first choice
        moe.w_up.zero_()
        moe.w_up[:, 0, 0] = 1.0  # hidden unit 0 = input channel 0 (set to 1 below)
        moe.w_down.zero_()
        for e in range(E):
            moe.w_down[e, 0, e] = 1.0
        if ffn == "moa":
            moe.act.alpha.fill_(1.0)
            moe.act.mix_logits.weight.zero_()
            moe.act.mix_logits.bias.zero_()
    x = torch.randn(1, 200, d)
    x[..., 0] = 1.0
    y, _ = moe(x)
    contributions = y[0, :, :E]
    assert ((contributions > 0).sum(-1) == k).all()
    torch.testing.assert_close(contributions.sum(-1), torch.ones(200))
    counts = (contributions > 0).sum(0)
    assert counts[0] > 150  # the router really was skewed


def test_tiny_moe_gpt_overfits_one_batch():
    torch.manual_seed(0)
    x, y, vocab = corpus_batch(4, 32)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=vocab, ffn="swiglu", n_expert=4))
    opt = model.configure_optimizers(0.0, 3e-3, (0.9, 0.95), "cpu")
    initial = None
    for step in range(300):
        _, loss, terms = model(x, y)
        initial = initial or terms["ce"].item()
        if terms["ce"].item() < 0.2 * initial:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert terms["ce"].item() < 0.2 * initial


def test_forward_returns_the_loss_and_its_terms():
    """GPT.forward gives (logits, loss, terms): terms are the logits' cross-entropy and the sums of the MoE layers' own
    losses, detached; training's loss is their sum and evaluation's the cross-entropy alone."""
    torch.manual_seed(0)
    x, y, vocab = corpus_batch(4, 32)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=vocab, ffn="moa", n_expert=4))
    layer_aux = []  # each MoE layer's [load balance, z-loss], caught by this test's own hooks
    for block in model.transformer.h:
        block.ffn.register_forward_hook(lambda module, args, out: layer_aux.append(out[1]))
    logits, loss, terms = model(x, y)
    assert sorted(terms) == ["aux", "ce", "z"] and not any(p.requires_grad for p in terms.values())
    assert torch.equal(terms["ce"], F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1)))
    aux = sum(layer_aux)
    assert len(layer_aux) == 2 and aux.min() > 0 and torch.equal(torch.stack([terms["aux"], terms["z"]]), aux)
    torch.testing.assert_close(loss.detach(), terms["ce"] + terms["aux"] + terms["z"])
    model.eval()
    _, loss, terms = model(x, y)
    assert torch.equal(loss, terms["ce"]) and model(x)[1:] == (None, None)


@pytest.mark.slow
def test_moe_gpt_trains_under_compile_like_eager():
    torch.manual_seed(0)
    x, y, vocab = corpus_batch(4, 32)
    eager = GPT(GPTConfig(n_layer=1, n_head=4, n_embd=32, block_size=32, vocab_size=vocab, ffn="moa", n_expert=4))
    compiled_model = copy.deepcopy(eager)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(compiled_model)
    opts = [m.configure_optimizers(0.0, 1e-3, (0.9, 0.95), "cpu") for m in (eager, compiled_model)]
    for step in range(3):
        losses = []
        for model, opt in zip((eager, compiled), opts):
            _, loss, _ = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-4), (step, losses)
    # 0 graph breaks: the expert matmul is a custom op, and expert counts use scatter_add (bincount's shape is dynamic)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    print("graph breaks:", breaks)
    assert breaks == 0, dict(torch._dynamo.utils.counters["graph_break"])


def test_gradcheck_expert_matmul_custom_op():
    """float64 gradcheck of the expert matmul's registered backward (float64 takes the per-expert loop; the grouped
    path is checked against the loop above), with an empty group in the middle."""
    from machinery.grouped_matmul import expert_mm

    a = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    offs = torch.tensor([2, 2, 7], dtype=torch.int32)
    assert torch.autograd.gradcheck(lambda a, w: expert_mm(a, w, offs), (a, w))


@pytest.mark.parametrize("bad", [dict(moe_every=0), dict(expert_hidden=-8), dict(n_expert=-1), dict(top_k=5)])
def test_impossible_moe_settings_are_one_sentence(bad):
    """configurator.model_config, where a person's settings become a model's, refuses them in a sentence."""
    import configurator
    from machinery.cli import UserError
    with pytest.raises(UserError, match=r"^--\w+.*\.$"):
        configurator.model_config({**configurator.DEFAULTS, "n_expert": 4, **bad})


def test_top1_router_learns_from_the_language_model_loss():
    """With k = 1 a renormalised weight would be exactly 1: the router's only gradient would come from the aux losses.
    Top-1 keeps the router probability, so the output's loss alone reaches the router."""
    moe = make_moe("gelu", k=1, aux_loss_weight=0.0, z_loss_weight=0.0)
    y, aux = moe(torch.randn(2, 12, 32))
    assert aux.abs().sum() == 0
    (grad,) = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum(), [moe.router.weight])
    assert grad.abs().max() > 1e-4


def test_moe_output_dropout_as_the_dense_ffn():
    moe = make_moe("gelu", dropout=0.5)
    x = torch.randn(2, 12, 32)
    moe.train()
    assert not torch.equal(moe(x)[0], moe(x)[0])  # a fresh mask per call
    assert (moe(x)[0] == 0).float().mean() > 0.3  # about half of the outputs dropped
    moe.eval()
    torch.testing.assert_close(moe(x)[0], moe(x)[0], rtol=0, atol=0)
