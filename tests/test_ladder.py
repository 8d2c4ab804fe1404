"""Tests of the scaling ladder: size parsing and per-size settings, the N and FLOPs axes against the model's own
FLOP count (dense and MoE), and a tiny 2-variant x 2-seed x 2-size ladder end to end (then reused; slow tier)."""
import contextlib
import io
import json
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compare
from comparison import ladder, runs
from machinery.cli import UserError
from model import GPT, GPTConfig


def test_sizes_pick_even_head_sizes_between_16_and_64():
    got = ladder.sizes('2x64, 3x96,4x128,1x16,2x48x3')
    assert [(s['name'], s['n_layer'], s['n_embd'], s['n_head']) for s in got] == [
        ('2x64', 2, 64, 2), ('3x96', 3, 96, 3), ('4x128', 4, 128, 4), ('1x16', 1, 16, 1), ('2x48', 2, 48, 3)]
    for s in got:
        q = s['n_embd'] // s['n_head']
        assert s['n_embd'] % s['n_head'] == 0 and q % 2 == 0 and 16 <= q <= 64
    for bad in ('2x', '2by64', '0x64', '2x64,2x64', '2x10', '2x64x3'):
        with pytest.raises(UserError):
            ladder.sizes(bad)


def test_ladder_mistakes_are_one_line_errors_before_anything_runs(tmp_path):
    out = str(tmp_path / 'nothing')
    for bad in (['--sizes=2by64'], ['--sizes=2x64', '--lr_rule=sqrt'], ['--sizes=2x64', '--tokens_per_param=-1'],
                ['--tokens_per_param=20'], ['--lr_rule=width']):
        with pytest.raises(UserError):
            compare.main([f'--out_dir={out}', '--variants=gelu,polynorm', *bad])
    assert not os.path.exists(out)


def test_a_ladder_size_in_a_runs_folder_is_refused_before_its_pictures_go(shakespeare_char_dir, tmp_path):
    """--out_dir=L --sizes=1x16,1x32, L/1x32 a train.py run's: its acts.png would be that size's comparison's."""
    run = tmp_path / '1x32'
    run.mkdir()
    for name in ('ckpt.pt', 'acts.png', 'acts.json'):
        (run / name).write_text('of the run')
    with pytest.raises(UserError, match=f"{run} holds a run"):
        compare.main([f'--data_dir={shakespeare_char_dir}', f'--out_dir={tmp_path}', '--variants=gelu,polynorm',
                      '--sizes=1x16,1x32', *TINY])
    assert (run / 'acts.png').read_text() == 'of the run' and not os.path.exists(tmp_path / '1x16' / 'gelu')


def test_size_settings_token_budget_and_learning_rate_rules(shakespeare_char_dir):
    cfg = dict(compare.DEFAULTS, data_dir=shakespeare_char_dir, variants='gelu', sizes='2x64,3x128', out_dir='L',
               tokens_per_param=20.0, batch_size=8, block_size=32, gradient_accumulation_steps=2, max_iters=100,
               warmup_iters=10, lr_decay_iters=100, eval_interval=25, lr_rule='width', learning_rate=1e-3, min_lr=1e-4)
    first, size = ladder.size_settings(cfg, 'gelu')
    n = ladder.scale_counts(runs.meta_model({**cfg, 'n_layer': 3, 'n_embd': 128, 'n_head': 4, 'vocab_size': 84},
                                              shakespeare_char_dir))['non_embedding']
    s = size['settings']
    assert s['max_iters'] == math.ceil(20 * n / 512)  # 20 tokens per parameter, 512 tokens per iteration
    assert s['warmup_iters'] == round(10 * s['max_iters'] / 100) and s['lr_decay_iters'] == s['max_iters']
    assert s['eval_interval'] == round(25 * s['max_iters'] / 100)  # every size gets the same number of evaluations
    assert s['out_dir'] == os.path.join('L', '3x128') and (s['n_layer'], s['n_embd'], s['n_head']) == (3, 128, 4)
    # 4 DDP processes per run train 4 x 512 tokens per iteration: a quarter of the iterations, rounded up
    four = ladder.size_settings({**cfg, 'nproc_per_run': 4}, 'gelu')[1]['settings']
    assert four['max_iters'] == math.ceil(20 * n / 2048)
    assert s['learning_rate'] == pytest.approx(5e-4) and s['min_lr'] == pytest.approx(5e-5)  # width 64 -> 128
    assert first['settings']['learning_rate'] == pytest.approx(1e-3)
    fixed = ladder.size_settings({**cfg, 'tokens_per_param': 0.0, 'lr_rule': 'fixed'}, 'gelu')[1]['settings']
    assert fixed == dict(n_layer=3, n_embd=128, n_head=4, out_dir=os.path.join('L', '3x128'))  # the comparison's own
    for k in (1e30, 1e305):  # a budget no one means, and one whose product with N overflows to inf
        with pytest.raises(UserError, match='iterations'):
            ladder.size_settings({**cfg, 'tokens_per_param': k}, 'gelu')
    for key in ('batch_size', 'gradient_accumulation_steps', 'nproc_per_run'):  # not a division by zero
        with pytest.raises(UserError, match='at least 1'):
            ladder.size_settings({**cfg, key: 0}, 'gelu')
    # listed rates scale with the learning rate they contain, so every size's sweep contains its own
    swept = ladder.size_settings({**cfg, 'lrs': '5e-4,1e-3,2e-3'}, 'gelu')[1]['settings']
    assert compare.learning_rates({**cfg, **swept}) == pytest.approx([2.5e-4, 5e-4, 1e-3])


@pytest.mark.parametrize('moe', [False, True])
def test_flops_axis_is_the_models_count_and_n_excludes_embeddings(moe):
    extra = dict(n_expert=4, top_k=1, pos='learned') if moe else {}
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, **extra))
    counts = ladder.scale_counts(model)
    # PaLM's count, written out here: 6 x active parameters less the position embedding, + 12 L d T attention
    active = model.param_report()['active'] - (model.transformer.wpe.weight.numel() if moe else 0)
    assert counts['flops_per_token'] == 6 * active + 12 * 2 * 32 * 16
    assert model.estimate_mfu(16, 1.0, 1.0) == pytest.approx(counts['flops_per_token'] * 16, rel=1e-12)
    embedding = sum(p.numel() for n, p in model.named_parameters() if n.startswith(('transformer.wte', 'transformer.wpe')))
    total = sum(p.numel() for p in model.parameters())
    assert counts['non_embedding'] == total - embedding
    if moe:  # a token uses top_k = 1 of 4 experts: 3/4 of the expert weights are inactive
        experts = sum(p.numel() for n, p in model.named_parameters() if '.ffn.w_' in n and p.dim() == 3)
        assert counts['non_embedding_active'] == total - embedding - experts * 3 // 4
    else:
        assert counts['non_embedding_active'] == counts['non_embedding']


TINY = ['--seed=1337', '--block_size=32', '--batch_size=4', '--max_iters=4', '--lr_decay_iters=4', '--warmup_iters=1',
        '--eval_interval=2', '--eval_iters=2', '--log_interval=1', '--device=cpu', '--compile=False',
        '--dtype=float32', '--jobs=2', '--threads=1']


@pytest.mark.slow
def test_tiny_ladder_with_tuned_rates_end_to_end_and_reused(shakespeare_char_dir, tmp_path):
    """4 sizes x 2 variants x 2 seeds x 3 rates (--lr_grid=1): every size chooses each variant's rate, the points are
    the tuned runs, the power law and the compute multiplier have 4 sizes to stand on; then the same command reuses
    every run."""
    out = str(tmp_path / 'ladder')
    sizes = ['1x16', '1x32', '1x48', '1x64']
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', '--variants=gelu,polynorm', '--seeds=2',
            f'--sizes={",".join(sizes)}', '--lrs=', '--lr_grid=1', '--lr_extend=False', '--learning_rate=4e-3',
            '--min_lr=4e-4', *TINY]
    with contextlib.redirect_stdout(io.StringIO()) as printed, contextlib.redirect_stderr(io.StringIO()):
        compare.main(argv)
    headed = [line for line in printed.getvalue().splitlines() if line.startswith(('## size', '| variant'))]
    assert headed == [h for s in sizes for h in (f'## size {s}', headed[1])]  # each size's table under its name
    with open(os.path.join(out, 'summary.json')) as f:
        lad = json.load(f)
    assert [s['name'] for s in lad['sizes']] == sizes
    assert os.path.getsize(os.path.join(out, 'ladder.png')) > 0
    md = open(os.path.join(out, 'summary.md')).read()
    assert all(f'| {s} |' in md for s in sizes) and '## Effective compute multiplier' in md
    n_embd = {'1x16': 16, '1x32': 32, '1x48': 48, '1x64': 64}
    for v in ('gelu', 'polynorm'):
        for p in lad['variants'][v]['points']:
            size = json.load(open(os.path.join(out, p['size'], 'summary.json')))
            assert p['best_lr'] == size['lr'][v]['best'] and p['best_lr'] in (2e-3, 4e-3, 8e-3)
            run = size['variants'][v]['runs'][0]['dir']  # the first seed at the chosen rate
            assert f"lr{p['best_lr']:.3g}" in run
            args = torch.load(os.path.join(run, 'ckpt.pt'), weights_only=True)['model_args']
            assert args['n_embd'] == n_embd[p['size']]
            model = GPT(GPTConfig(**args))
            log = [json.loads(l) for l in open(os.path.join(run, 'log.jsonl'))]
            assert p['flops'] == model.flops_per_token() * log[-1]['tokens']  # the model's count x the tokens
            assert p['N'] == sum(q.numel() for n, q in model.named_parameters() if not n.startswith('transformer.w'))
            assert p['seed_losses'] == [log[-1]['val_halves'][1]] + p['seed_losses'][1:]  # the report half
        assert f"| {v} | " + ' | '.join(f"{p['best_lr']:.3g}" for p in lad['variants'][v]['points']) + ' |' in md
    poly = lad['variants']['polynorm']
    # the trend goes through the 4 sizes' mean gaps; the multiplier is per size
    assert poly['trend']['points'] == 4 and len(poly['multiplier']['per_size']) == 4
    assert poly['multiplier']['at_budget']['compute'] == 10 * max(p['flops'] for p in lad['variants']['gelu']['points'])
    # the same command again trains nothing: every run of every size is reused
    buf = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(buf):
        compare.main(argv)
    assert buf.getvalue().count('(12 to reuse, 0 to train)') == 4
    with open(os.path.join(out, 'summary.json')) as f:
        assert json.load(f) == lad


@pytest.mark.slow
def test_a_ladder_of_variants_at_their_own_rates_names_each_ones_rate(shakespeare_char_dir, tmp_path):
    """The ladder's table names the shared learning rate of each size; variants at rates of their own (gelu@8e-3) are
    at those, and a section says so, per size."""
    out = str(tmp_path / 'ladder')
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', '--variants=gelu@8e-3,relu@4e-3', '--seeds=1',
            '--sizes=1x16,1x32', '--lrs=', '--learning_rate=2e-3', '--min_lr=2e-4', *TINY]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        compare.main(argv)
    lad = json.load(open(os.path.join(out, 'summary.json')))
    assert lad['rates'] == {'gelu': [8e-3, 8e-3], 'relu': [4e-3, 4e-3]}
    md = open(os.path.join(out, 'summary.md')).read()
    assert '## Learning rate of each variant' in md
    assert '| gelu | 0.008 | 0.008 |' in md and '| relu | 0.004 | 0.004 |' in md


def test_a_gpus_eager_times_are_not_called_a_cpus():
    """The speedup's times are a GPU's where every run's log names a GPU, whatever --device said (auto)."""
    gpu, cpu = ({'ran_on': [{'device': name}]} for name in ('NVIDIA H200', 'cpu x86_64'))
    assert ladder.on_gpu(gpu) and not ladder.on_gpu(cpu) and not ladder.on_gpu({'ran_on': [*gpu['ran_on'],
                                                                                          *cpu['ran_on']]})
    assert not ladder.on_gpu({'ran_on': [{'device': 'mps arm'}]}) and not ladder.on_gpu({})


@pytest.mark.parametrize('devices, meaningful', [(['NVIDIA H200'], True), (['NVIDIA H200', 'cpu x86_64'], False)])
def test_the_ladders_speedup_reads_the_device_from_the_runs_logs(monkeypatch, devices, meaningful):
    """summarize asks on_gpu, not --device (auto here), whether eager times are a GPU's."""
    said = []
    monkeypatch.setattr(ladder, 'point', lambda size, summ, v: {'N': size['N'], 'seed_gaps': [0.0, 0.0],
                                                               'seed_losses': [2.0, 2.1]})
    monkeypatch.setattr(ladder, 'multiplier', lambda base, ps, times_meaningful: said.append(times_meaningful))
    summ = {'variants': {'gelu': {'tokens': 64}, 'relu': {'tokens': 64}}, 'baseline': 'gelu', 'seeds': [1, 2],
            'dataset': 'x', 'rates': {}, 'compiled': 'off', 'settings': {'device': 'auto'},
            'ran_on': [{'device': d} for d in devices]}
    sizes = [{'name': f'1x{w}', 'n_layer': 1, 'n_embd': w, 'n_head': 1, 'N': w, 'settings': {}} for w in (16, 32)]
    cfg = {'tokens_per_param': 0, 'max_iters': 4, 'lr_rule': 'fixed', 'learning_rate': 1e-3}
    ladder.summarize(cfg, sizes, [summ, summ])
    assert said == [meaningful]
