"""GPU checks, for a machine with a CUDA GPU: `python -m pytest -m cuda` (a few minutes, most of it compiling).
They are collected everywhere and skipped, with the reason, where torch sees no CUDA device.

What they establish on the GPU, where the CPU tests cannot look:
- every FFN variant, compiled and run in bf16 autocast as training runs it, computes the loss, logits and gradients
  of the eager fp32 model within a stated tolerance, with no graph break;
- the MoE's grouped matmul (grouped_matmul.GROUPED_MM, bf16 on CUDA) gives the per-expert loop's outputs and gradients,
  and the compiled bf16 MoE GPT has no graph break;
- the optimizer is fused AdamW and steps like the unfused one;
- a 20-step compare.py of a dense and an MoE variant on synthetic shards, compiled in bf16, shares the GPU, trains
  both runs, logs an MFU between 0 and 1, learns, and names the GPU, CUDA and cuDNN in its summary;
- train.py in float16 with the loss scaler learns; a run resumed on CUDA continues to bf16's rounding of an
  uninterrupted one; sample.py samples on CUDA.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from activations import VARIANTS
from data.write import write_shard
from machinery import device, grouped_matmul, speed
from model import GPT, GPTConfig

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (torch.cuda.is_available() is False); run `python -m pytest -m cuda` on a machine with one")]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 512
# bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.2% per operation), with fp32 accumulation in matmuls.
# Through a 2-layer model that stays around 1%; a wrong kernel or a dropped term is off by O(100%). Errors are
# relative L2 norms: |a - b| / |b| over all logits, and over all gradients concatenated.
LOSS_RTOL, LOGITS_RTOL, GRADS_RTOL = 0.01, 0.05, 0.10


def rel_err(a, b):
    a, b = a.detach().float().flatten(), b.detach().float().flatten()
    return ((a - b).norm() / b.norm()).item()


def tiny_gpt(ffn, **kw):
    """A 2-layer GPT on the GPU, its activation coefficients and gates moved off their init so every path counts."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**{**dict(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=VOCAB, ffn=ffn), **kw}))
    gpt = gpt.cuda()
    with torch.no_grad():
        acts = gpt.activation_parameters()
        for name, p in gpt.named_parameters():
            if name in acts:
                p.add_(0.1 * torch.randn_like(p))
    return gpt


def batch(B=8, T=64):
    g = torch.Generator(device='cuda').manual_seed(1)
    x = torch.randint(0, VOCAB, (B, T + 1), device='cuda', generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def loss_logits_grads(fn, gpt, x, y):
    logits, loss, _ = fn(x, y)
    grads = torch.autograd.grad(loss, list(gpt.parameters()))
    return loss, logits, torch.cat([g.float().flatten() for g in grads])


@pytest.fixture(autouse=True)
def fp32_reference():
    """The eager reference in true fp32 (no TF32 matmuls), whatever an earlier test set."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision('highest')
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_compiled_bf16_matches_eager_fp32_without_graph_breaks(variant):
    gpt = tiny_gpt(variant)
    x, y = batch()
    ref = loss_logits_grads(gpt, gpt, x, y)
    compiled = torch.compile(gpt)
    with torch.autocast('cuda', dtype=torch.bfloat16):
        got = loss_logits_grads(compiled, gpt, x, y)
    assert abs(got[0].item() - ref[0].item()) <= LOSS_RTOL * ref[0].item(), (got[0].item(), ref[0].item())
    assert rel_err(got[1], ref[1]) < LOGITS_RTOL
    assert rel_err(got[2], ref[2]) < GRADS_RTOL
    assert got[1].dtype == torch.bfloat16  # autocast was in effect: this compared bf16 with fp32
    breaks = dict(torch._dynamo.utils.counters['graph_break'])
    assert not breaks, breaks


@pytest.mark.parametrize('ffn', ['relu', 'swiglu', 'moa_glu'])
def test_moe_grouped_mm_in_bf16_equals_the_per_expert_loop(ffn, monkeypatch):
    if not grouped_matmul._grouped_mm_ok(*(torch.empty(1, 16, device='cuda', dtype=torch.bfloat16),) * 2):
        pytest.skip(f"torch {torch.__version__} has no grouped matmul for bf16 on {torch.cuda.get_device_name()}")
    gpt = tiny_gpt(ffn, n_expert=4, top_k=2, n_layer=1)
    moe = gpt.transformer.h[0].ffn
    x = torch.randn(4, 64, 128, device='cuda')
    calls = []
    grouped_mm = grouped_matmul.GROUPED_MM
    results = {}
    for grouped in (True, False):  # without torch's grouped matmul (None): the per-expert loop
        monkeypatch.setattr(grouped_matmul, 'GROUPED_MM', (lambda *a, **kw: calls.append(1) or grouped_mm(*a, **kw))
                            if grouped else None)
        calls.clear()
        xg = x.clone().requires_grad_(True)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            out = moe(xg)[0]
        grads = torch.autograd.grad((out.float() * torch.linspace(-1, 1, out.numel(), device='cuda').view_as(out)).sum(),
                                    [xg, *moe.parameters()])
        results[grouped] = (out, grads, len(calls))
    (out_g, grads_g, n_grouped), (out_l, grads_l, n_loop) = results[True], results[False]
    assert n_grouped > 0 and n_loop == 0  # each path was the one measured (the output is cast back to x's dtype)
    # the same bf16 operands, both accumulating in fp32: they differ by the rounding of their outputs only
    assert rel_err(out_g, out_l) < 0.01
    for a, b in zip(grads_g, grads_l):
        assert rel_err(a, b) < 0.02


def test_moe_gpt_compiles_in_bf16_without_graph_breaks_and_matches_eager():
    gpt = tiny_gpt('moa', n_expert=4, top_k=2)
    x, y = batch()
    ref = loss_logits_grads(gpt, gpt, x, y)
    with torch.autocast('cuda', dtype=torch.bfloat16):
        got = loss_logits_grads(torch.compile(gpt), gpt, x, y)
    assert abs(got[0].item() - ref[0].item()) <= LOSS_RTOL * ref[0].item()
    assert rel_err(got[2], ref[2]) < GRADS_RTOL
    breaks = dict(torch._dynamo.utils.counters['graph_break'])
    assert not breaks, breaks


def test_optimizer_is_fused_adamw_and_steps_like_the_unfused_one():
    models = [tiny_gpt('polynorm'), tiny_gpt('polynorm')]
    fused = models[0].configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cuda')  # as train.py asks for it on a GPU
    plain = models[1].configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')  # the same groups, not fused
    assert isinstance(fused, torch.optim.AdamW) and fused.defaults['fused'] is True and not plain.defaults['fused']
    x, y = batch()
    for gpt, opt in zip(models, (fused, plain)):
        for _ in range(3):
            opt.zero_grad()
            gpt(x, y)[1].backward()
            opt.step()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert rel_err(a, b) < 1e-4, name


ITOS = [chr(0x4e00 + i) for i in range(VOCAB)]  # a char vocabulary, so that sample.py can decode


def synthetic(tmp_path):
    """A data_dir holding synthetic shards: a fixed random sequence of period 61 repeated, learnt in 20 steps."""
    folder = tmp_path / 'data' / 'synthetic'
    folder.mkdir(parents=True)
    period = np.random.default_rng(0).integers(0, VOCAB, 61)
    write_shard(str(folder / 'train_000.bin'), np.tile(period, 2000))
    write_shard(str(folder / 'val_000.bin'), np.tile(period, 200))
    (folder / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': VOCAB, 'itos': ITOS}))
    return tmp_path / 'data'


SMALL = ['--dataset=synthetic', '--device=cuda', '--n_layer=2', '--n_head=4', '--n_embd=128', '--block_size=128',
         '--batch_size=16', '--eval_iters=4', '--warmup_iters=2', '--learning_rate=3e-3', '--min_lr=3e-4',
         '--lr_decay_iters=20', '--log_interval=5', '--eval_interval=10']


def train(*args):
    p = subprocess.run([sys.executable, 'train.py', *SMALL, *args], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def test_float16_with_the_loss_scaler_learns_and_a_cuda_resume_continues_the_run(tmp_path):
    """float16 (a T4's or V100's precision) steps with the scaler; a run at dtype=auto (bf16, or float16 below compute
    capability 8.0) stopped at 10 and resumed to 20 ends where the uninterrupted one does, to 16-bit rounding (some
    CUDA kernels are not deterministic); sample.py runs on CUDA, in the dtype auto gives this GPU."""
    data = synthetic(tmp_path)
    half = tmp_path / 'fp16'
    train(f'--data_dir={data}', f'--out_dir={half}', '--dtype=float16', '--max_iters=20')
    log = [json.loads(line) for line in open(half / 'log.jsonl')]
    assert log[-1]['iter'] == 20 and log[-1]['val_loss'] < log[0]['val_loss'] - 0.5  # it learned
    ckpt = torch.load(half / 'ckpt.pt', map_location='cpu', weights_only=True)
    assert ckpt['config']['dtype'] == 'float16' and ckpt['scaler']['scale'] > 0  # the scaler ran and was saved
    whole, parts = tmp_path / 'whole', tmp_path / 'parts'
    train(f'--data_dir={data}', f'--out_dir={whole}', '--max_iters=20')
    train(f'--data_dir={data}', f'--out_dir={parts}', '--max_iters=10')
    train(f'--out_dir={parts}', '--init_from=resume', '--max_iters=20')
    final = lambda d: [json.loads(line) for line in open(d / 'log.jsonl')][-1]['val_loss']
    assert abs(final(parts) - final(whole)) < 0.02 * final(whole)
    p = subprocess.run([sys.executable, 'sample.py', f'--out_dir={parts}', '--device=cuda', '--num_samples=1',
                        '--max_new_tokens=20', f'--start={ITOS[0]}'], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and f"on cuda:0, {device.resolve_dtype('auto', 'cuda')}" in p.stderr, p.stderr[-3000:]


def test_a_20_step_compare_of_a_dense_and_an_moe_variant_trains_both_on_one_gpu(tmp_path):
    """compare.py, gelu and moa_glu as an MoE x 1 seed x 20 iterations, on the GPU with its defaults (bf16, compiled,
    runs placed by their size), on synthetic shards."""
    data = synthetic(tmp_path)
    out = tmp_path / 'cmp'
    variants = ('gelu', 'moa_glu:n_expert=4')
    # the default comparison's config is read first (CPU settings): every setting that matters is given here
    cmd = [sys.executable, 'compare.py', '--seed=1337', f'--data_dir={data}', '--dataset=synthetic', f'--out_dir={out}',
           '--device=cuda', '--compile=auto', '--dtype=auto', f'--variants={",".join(variants)}', '--seeds=1',
           '--lrs=', '--jobs=0', '--threads=0', '--max_iters=20', '--lr_decay_iters=20', '--eval_interval=10',
           '--log_interval=5', '--eval_iters=4', '--warmup_iters=2', '--learning_rate=3e-3', '--min_lr=3e-4',
           '--n_layer=2', '--n_head=4', '--n_embd=128', '--block_size=128', '--batch_size=16']
    if speed.peak_flops('cuda', 'bfloat16', 0) is None:  # a GPU missing from speed.PEAK_FLOPS: MFU against an H100's
        cmd.append('--peak_flops=989e12')
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert '2 at a time on GPU 0, up to' in p.stderr and 'too small to fill a GPU' in p.stderr  # tiny runs share it
    logs = {v: [json.loads(l) for l in open(out / v / 'seed1337' / 'log.jsonl')] for v in variants}
    for variant, log in logs.items():
        assert log[-1]['iter'] == 20 and 'val_loss' in log[-1]
        assert log[-1]['val_loss'] < log[0]['val_loss'] - 0.5, variant  # it learned the repeating sequence
        mfus = [r['mfu'] for r in log if 'mfu' in r]
        assert mfus and all(m is not None and 0 < m < 1 for m in mfus), (variant, mfus)
    assert logs['moa_glu:n_expert=4'][-1]['aux'] > 0  # the MoE's load-balance loss: it was an MoE
    assert logs['gelu'][-1]['batch_hash'] == logs['moa_glu:n_expert=4'][-1]['batch_hash']  # the same batches
    summary = json.loads((out / 'summary.json').read_text())
    assert set(summary['variants']) == set(variants)
    assert [e['device'] for e in summary['ran_on']] == [torch.cuda.get_device_name()]
    assert summary['ran_on'][0]['cuda'] == torch.version.cuda and summary['ran_on'][0]['cudnn'] is not None
    ckpt = torch.load(out / 'gelu' / 'seed1337' / 'ckpt.pt', map_location='cpu', weights_only=True)
    assert ckpt['compiled'] is True and ckpt['config']['dtype'] == 'auto'
