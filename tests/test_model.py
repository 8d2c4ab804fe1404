"""Every FFN variant inside a GPT: finite, starting at ln(V), parameter-matched, learning; every module usable on its
own with its documented init; MoA really token-adaptive; and the GPT's own contracts (padded ids never sampled, no
decay on activation extras, no function too long to read)."""
import gzip
import math
from pathlib import Path

import pytest
import torch

from activations import BASELINE, VARIANTS, make_activations
from model import GPTConfig
from model import FFN, GPT, MoE, Block

FFN_VARIANTS = list(VARIANTS)

ROOT = Path(__file__).resolve().parent.parent
K = 6  # default LA/MoA dictionary size


def tiny(ffn, **kw):
    cfg = dict(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=84, ffn=ffn)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def corpus_batch(n_rows, length, offset=100_000):
    """Character-level rows of the bundled corpus (no prepared shards needed), as ids into its sorted alphabet."""
    text = gzip.open(ROOT / "data" / "shakespeare.txt.gz", "rt").read()
    chars = sorted(set(text))
    chunk = text[offset : offset + n_rows * (length + 1)]
    ids = torch.tensor([chars.index(c) for c in chunk]).view(n_rows, length + 1)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous(), len(chars)


@pytest.mark.parametrize("moe", [{}, dict(n_expert=4, top_k=2)], ids=["dense", "moe"])
@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_every_variant_starts_on_its_baselines_weights_at_the_same_seed(ffn, moe):
    """A comparison pairs runs by seed: a variant's run starts on the very weights its baseline's run of that seed
    starts on (embeddings, attention, FFN matrices), so their difference is the activation's, not the init's.
    Building an activation must draw nothing from the RNG."""
    def weights(name):
        torch.manual_seed(1337)
        return dict(tiny(name, **moe).named_parameters())
    mine, base = weights(ffn), weights(BASELINE[VARIANTS[ffn].kind])
    assert set(base) <= set(mine) and all(torch.equal(mine[k], base[k]) for k in base)  # mine: and its extras


@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_every_variant_is_finite_and_starts_at_log_vocab(ffn):
    torch.manual_seed(0)
    model = tiny(ffn)
    x, y = torch.randint(0, 84, (4, 32)), torch.randint(0, 84, (4, 32))
    for autocast in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, loss, _ = model(x, y)
        loss.backward()
        assert torch.isfinite(logits).all() and torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        assert abs(loss.item() - math.log(84)) < 0.15, (ffn, autocast, loss.item())


@pytest.mark.parametrize("ffn", FFN_VARIANTS)
@pytest.mark.parametrize("d", [64, 128, 768])
def test_ffn_weights_match_the_4d_mlp_and_extras_are_as_declared(d, ffn):
    """Every variant's FFN weights are the non-gated 4d MLP's within 1%, and its learned extras per layer are what its
    registry record declares (the formula the README's table states: r+1, K, K + K·d + K, ...)."""
    n_layer = 2
    reference = 2 * d * 4 * d * n_layer  # the non-gated 4d FFN, no bias
    with torch.device("meta"):  # counts only: no memory, no init time
        config = GPTConfig(n_layer=n_layer, n_head=4, n_embd=d, vocab_size=256, block_size=8, ffn=ffn)
        report = GPT(config).param_report()
    assert abs(report["ffn"] / reference - 1) < 0.01, (ffn, d, report["ffn"], reference)
    per_layer, declared = report["extras"] // n_layer, VARIANTS[ffn].extras(config)
    assert per_layer == declared, (f"{ffn}'s activation has {per_layer} learned scalars per layer at d={d}, but its "
                                   f"record in activations.VARIANTS declares extras={declared}: make extras count them")
    assert report["total"] == sum(v for k, v in report.items() if k not in ("total", "active"))


def test_declared_extras_of_the_papers_variants():
    """The declarations themselves, at d = 64 with the default dictionary (K = 6) and order r = 3, against the counts
    the papers give: PolyCom r+1 coefficients; LA K; MoA K + a gate of K·d + K; bi-sided GLUs two of each."""
    c = GPTConfig(n_embd=64, n_head=4)
    expected = {"polynorm": 4, "polyrelu": 4, "la": 6, "moa": 6 + 6 * 64 + 6, "la_glu": 12,
                "moa_glu": 2 * (6 + 6 * 64 + 6), "gelu": 0, "swiglu": 0, "xielu": 2}
    for ffn, n in expected.items():
        assert VARIANTS[ffn].extras(GPTConfig(**{**c.__dict__, "ffn": ffn})) == n, ffn


def test_param_report_adds_up_to_the_module():
    model = tiny("moa_glu", pos="learned", bias=True)
    assert model.param_report()["total"] == sum(p.numel() for p in model.parameters())


def test_moa_is_token_adaptive_and_la_is_not():
    torch.manual_seed(0)
    x, y, vocab = corpus_batch(8, 32)
    stds = {}
    for ffn in ("moa", "la"):
        torch.manual_seed(0)
        model = tiny(ffn, vocab_size=vocab)
        opt = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cpu")
        for _ in range(5):
            _, loss, _ = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        stats = model.learned(x)["layers"]
        if ffn == "moa":
            stds[ffn] = max(max(layer["act"]["c_std"].values()) for layer in stats)
        else:
            assert "c_std" not in stats[0]["act"]  # LA: one α per entry, the same for every token by construction
            assert len(stats[0]["act"]["alpha"]) == K
    assert stds["moa"] > 1e-4


def test_generate_never_samples_a_padded_id():
    torch.manual_seed(0)
    model = tiny("gelu", vocab_size=70)  # padded to 128
    with torch.no_grad():  # make the padded rows the most likely by far, were they reachable
        model.lm_head.weight[70:] = 10.0
    out = model.generate(torch.zeros(16, 1, dtype=torch.long), 20, temperature=1.0)
    assert out.max() < 70
    out = model.generate(torch.zeros(2, 1, dtype=torch.long), 5, temperature=1.0, top_k=3)
    assert out.max() < 70


@pytest.mark.parametrize("ffn,n_expert", [("moa_glu", 4), ("moa", 0), ("polynorm", 0)])
def test_activation_extras_are_not_weight_decayed(ffn, n_expert):
    from activations import LA, MoA, Poly

    model = tiny(ffn, n_expert=n_expert)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    no_decay = {id(p) for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    # found by module type, not by the name pattern the code uses: every parameter of an activation module
    extras = {id(p) for m in model.modules() if isinstance(m, (LA, MoA, Poly)) for p in m.parameters()}
    assert extras and extras <= no_decay
    matrices = {id(p) for p in model.parameters() if p.dim() >= 2 and id(p) not in extras}
    assert matrices and not matrices & no_decay


@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_activation_parameters_are_the_registrys_extras_and_never_decayed(ffn):
    """GPT.activation_parameters, the one rule for which parameters are an activation's, names the parameters the
    registry declares per layer, dense and in an MoE; param_report counts them as extras and the optimizer decays every
    other matrix, and none of them."""
    for n_expert in (0, 4):
        with torch.device("meta"):  # counts only
            model = tiny(ffn, n_expert=n_expert, moe_every=2)  # with experts: block 0 an MoE, block 1 dense
        params, acts = dict(model.named_parameters()), model.activation_parameters()
        extras = VARIANTS[ffn].extras(model.config) * model.config.n_layer
        counted = sum(params[name].numel() for name in acts)
        assert counted == model.param_report()["extras"] == extras, (
            f"{ffn} (n_expert={n_expert}): its activations hold {counted} parameters, its registry entry's extras say "
            f"{extras}; make Variant.extras in activations.py count them per layer")
        assert all(".ffn.act." in name or ".ffn.act_up." in name for name in acts)
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
        groups = {g["weight_decay"]: g["params"] for g in opt.param_groups}
        assert {id(p) for p in groups[0.1]} == {id(p) for n, p in params.items() if p.dim() >= 2 and n not in acts}
        assert {id(params[name]) for name in acts} <= {id(p) for p in groups[0.0]}


def test_adamw_is_fused_on_cuda_only():
    """train.py and bench.py pass the device type: fused AdamW (one kernel per step) on a GPU, torch's default
    elsewhere (MPS, the CPU). Asked on CPU parameters, which fused AdamW takes too (torch 2.4+); the GPU test steps
    it."""
    model = tiny("gelu", n_layer=1)
    fused = [model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), t).defaults["fused"] for t in ("cuda", "mps", "cpu")]
    assert fused == [True, False, False]


@pytest.mark.parametrize("ffn", ["relu", "polynorm", "moa", "swiglu", "moa_glu"])
def test_tiny_gpt_overfits_one_batch(ffn):
    torch.manual_seed(0)
    x, y, vocab = corpus_batch(4, 32)
    model = tiny(ffn, vocab_size=vocab, n_layer=2, n_embd=64)
    opt = model.configure_optimizers(0.0, 3e-3, (0.9, 0.95), "cpu")
    initial = None
    for step in range(300):
        _, loss, _ = model(x, y)
        initial = initial or loss.item()
        if loss.item() < 0.2 * initial:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2 * initial, (ffn, step, loss.item(), initial)


def test_default_onehot_init_needs_the_baseline_in_the_dictionary():
    with pytest.raises(ValueError, match="act_dict must contain gelu"):
        tiny("la", act_dict="relu,tanh")
    with pytest.raises(ValueError, match="act_dict must contain identity"):
        tiny("moa_glu", act_dict="relu,silu")
    with pytest.raises(ValueError, match="act_dict must contain silu and identity; add them"):  # both branches'
        tiny("la_glu", act_dict="relu,gelu")
    tiny("la", act_dict="relu,tanh", la_init="mean")  # any other init works with any dictionary


# ---- every module on its own ---------------------------------------------------------------------------------------
STD = 0.02


def activation_parameters(config):
    """{name: value} of the parameters of a layer's activation(s) as the registry builds them, named as inside an FFN."""
    act, act_up = make_activations(config)
    return {f"{prefix}.{name}": p.detach().clone() for prefix, module in (("act", act), ("act_up", act_up))
            if module is not None for name, p in module.named_parameters()}


@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_every_module_built_on_its_own_is_finite_and_initialised_as_documented(ffn):
    """FFN(config), MoE(config) and Block(config) need no GPT: their weights start at PyTorch's default Linear init
    (uniform in ±1/sqrt(fan_in)), and their activations' extras as the activation module itself starts them (whose
    values each family's test in test_activations.py checks: PolyCom a = [0, 1/r, ...], LA/MoA α one-hot, MoA's gates
    zero, xIELU α_p = α_n = 0.8), the same however the random stream stood: no extra is drawn at random."""
    d = 64
    config = GPTConfig(n_embd=d, n_head=4, ffn=ffn, n_expert=4, top_k=2, n_layer=2)
    torch.manual_seed(1)
    expected = activation_parameters(config)
    torch.manual_seed(2)
    for module in (FFN(config), MoE(config), Block(config, use_moe=True)):
        for name, p in module.named_parameters():
            assert torch.isfinite(p).all(), (ffn, type(module).__name__, name)
            own = name.removeprefix("ffn.")
            if own in expected:
                assert torch.equal(p, expected[own]), (ffn, name)
            elif p.dim() >= 2 and "norm" not in name:  # matrices: nn.Linear's uniform(±1/√fan_in)
                fan_in = p.shape[-2] if p.dim() == 3 else p.shape[-1]
                bound = fan_in ** -0.5
                assert p.abs().max() <= bound and p.abs().max() > 0.5 * bound, (ffn, name)
                assert abs(p.float().std().item() - bound / 3 ** 0.5) < 0.2 * bound / 3 ** 0.5, (ffn, name)
        x = torch.randn(2, 8, d)
        y = module(x)
        assert torch.isfinite(y[0] if isinstance(y, tuple) else y).all()


@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_the_gpt_keeps_every_activation_extra_at_its_start(ffn):
    """GPT-2's re-initialisation of the weights leaves every activation parameter as its module started it."""
    config = GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=84, block_size=16, ffn=ffn)
    expected = activation_parameters(config)
    model = GPT(config)
    acts = model.activation_parameters()
    for name, p in model.named_parameters():
        if name in acts:
            assert torch.equal(p.detach(), expected[name.split(".ffn.")[1]]), (ffn, name)


def test_the_gpt_reinitialises_every_weight_as_gpt2():
    """Inside a GPT every weight is N(0, 0.02), residual output projections N(0, 0.02/sqrt(2·n_layer)), MoA gates 0."""
    torch.manual_seed(0)
    n_layer, d = 4, 256
    model = GPT(GPTConfig(n_layer=n_layer, n_head=4, n_embd=d, vocab_size=256, block_size=8, ffn="moa", n_expert=4))
    for name, p in model.named_parameters():
        if "mix_logits" in name:
            assert torch.all(p == 0), name
        elif name.endswith(("c_proj.weight", "w_down")):
            assert p.std().item() == pytest.approx(STD / math.sqrt(2 * n_layer), rel=0.05), name
        elif p.dim() >= 2 and p.numel() > 4000:
            assert p.std().item() == pytest.approx(STD, rel=0.05), name
            assert abs(p.mean().item()) < 0.1 * STD, name


def test_no_function_is_longer_than_a_screen():
    """Every file reads as named steps: no function or method over 80 lines."""
    import ast
    for path in sorted(p.name for p in ROOT.glob("*.py")):
        tree = ast.parse((ROOT / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 80, f"{path}:{node.lineno} {node.name} is {length} lines"
