"""A sweep's verdict is measured on fresh seeds: the rate is chosen on the sweep's seeds, and the table's losses come
from new seeds at that rate. On synthetic runs whose seed luck is shared by both halves of the validation windows (as
a run's two halves share its model), reporting the chosen rate's own runs is biased low; the fresh seeds are not."""
import os
import random
import statistics
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare  # noqa: E402
from comparison import report  # noqa: E402
from comparison.runs import Run  # noqa: E402

RATES = (1e-3, 2e-3, 4e-3)
TRUE = {1e-3: 2.10, 2e-3: 2.00, 4e-3: 2.00}  # two rates equally good: which one wins is seed luck
NOISE, WINDOWS = 0.02, 0.001  # seed-to-seed noise of a run's loss, and the much smaller noise between the two halves
SWEEP, FRESH = [0, 1, 2], [3, 4, 5]


def run(variant, lr, seed, loss, rng):
    """A finished run in memory whose two validation halves share its seed luck (loss), as train.py logs them."""
    halves = [loss + rng.gauss(0, WINDOWS), loss + rng.gauss(0, WINDOWS)]
    spec = dict(variant=variant, seed=seed, lr=lr, name='', dir=f'{variant}/lr{lr}/seed{seed}', processes=1,
                settings={'max_iters': 4})
    records = [{'iter': 4, 'tokens': 64, 'val_loss': sum(halves) / 2, 'val_halves': halves}]
    return Run(spec, 'done', records, [], None, {}, None)


def trial(rng):
    """One sweep and its verdict for a variant whose loss at each rate is TRUE plus seed luck (shared by the baseline
    too: the same seed, the same batches)."""
    luck = lambda seed, lr: rng.gauss(0, NOISE)
    sweep = [run(v, lr, s, TRUE[lr] + luck(s, lr), rng) for v in ('base', 'var') for lr in RATES for s in SWEEP]
    chosen = compare.best_rates(sweep)
    fresh = [run(v, chosen[v]['best'], s, TRUE[chosen[v]['best']] + luck(s, 0), rng) for v in ('base', 'var')
             for s in FRESH]
    head = dict(baseline='base', seeds=FRESH, variants=['base', 'var'], dataset='synthetic', settings={})
    shapes = {v: {'params': {}, 'scale': {'flops_per_token': 1}} for v in ('base', 'var')}
    summary, _ = report.summarize_sweep(head, sweep, fresh, shapes, chosen, 2e-3)
    best = summary['lr']['var']['best']
    return summary['variants']['var']['final_val_loss']['mean'], summary['lr']['var']['report'][repr(best)]['mean']


def test_the_verdict_on_fresh_seeds_is_unbiased_and_the_sweeps_own_runs_are_not():
    rng = random.Random(0)
    verdict, own = zip(*(trial(rng) for _ in range(400)))
    se = NOISE / len(FRESH) ** 0.5 / 400 ** 0.5  # the standard error of the mean verdict over the trials
    # the true loss at the chosen rate is 2.00 either way; the sweep's own runs at the rate they chose are lucky ones
    assert abs(statistics.fmean(verdict) - 2.00) < 4 * se
    assert statistics.fmean(own) < 2.00 - 0.005


def test_fresh_seeds_follow_the_sweeps_and_hold_the_best_rate_only(tmp_path):
    cfg = compare.settings([f'--out_dir={tmp_path}', '--variants=gelu,relu2', '--seeds=2', '--seed=7',
                            '--lrs=1e-3,2e-3', '--learning_rate=1e-3', '--eval_iters=2', '--device=cpu'])
    comp = compare.check_comparison(cfg)
    assert comp['seeds'] == [7, 8] and comp['fresh_seeds'] == [9, 10]
    chosen = {'gelu': {'best': 2e-3}, 'relu2': {'best': 1e-3}}
    fresh = compare.verdict_specs(cfg, comp, chosen)
    assert {(r['variant'], r['lr'], r['seed']) for r in fresh} == {
        ('gelu', 2e-3, 9), ('gelu', 2e-3, 10), ('relu2', 1e-3, 9), ('relu2', 1e-3, 10)}
    grid_dirs = {r.dir for r in compare.grid_runs(cfg, comp)}
    assert not grid_dirs & {r['dir'] for r in fresh}  # the best rate's directory holds seeds no other rate's does


def test_every_pair_is_the_paired_difference_of_its_two_variants():
    """summary['pairs'][a][b]: a's final loss minus b's, seed by seed; the opposite pair is its negative. Each
    variant's std over seeds is the sample's (n − 1), and the pooled seed noise the root mean square of those."""
    rng = random.Random(1)
    loss = {(v, s): 2.0 + 0.1 * i + 0.01 * s for i, v in enumerate(('base', 'x', 'y')) for s in FRESH}
    runs = [run(v, None, s, loss[v, s], rng) for v, s in loss]
    head = dict(baseline='base', seeds=FRESH, variants=['base', 'x', 'y'], dataset='synthetic', settings={})
    shapes = {v: {'params': {}, 'scale': {'flops_per_token': 1}} for v in head['variants']}
    summary = report.summarize(head, runs, shapes)[0]
    pairs = summary['pairs']
    finals = [[r.final() for r in runs if r.variant == v] for v in head['variants']]
    assert [summary['variants'][v]['final_val_loss']['std'] for v in head['variants']] == pytest.approx(
        [statistics.stdev(f) for f in finals])
    assert summary['seed_std'] == pytest.approx(statistics.fmean(statistics.variance(f) for f in finals) ** 0.5)
    gaps = [runs[2 * len(FRESH) + i].final() - runs[len(FRESH) + i].final() for i in range(len(FRESH))]
    assert pairs['y']['x']['mean'] == pytest.approx(statistics.fmean(gaps)) == -pairs['x']['y']['mean']
    assert 0.09 < pairs['y']['x']['mean'] < 0.11
    assert pairs['y']['x']['resolved'] and set(pairs['base']) == {'x', 'y'}


def test_a_variant_with_a_diverged_seed_gets_no_verdict_from_the_seeds_that_survived():
    """var is far better on the two seeds that finished, and diverged on the third: the survivors' mean would call it
    a resolved win; a diverged seed is a failure (as in the choice of a rate), so no paired verdict is given."""
    rng = random.Random(2)
    runs = [run(v, None, s, 2.0 - 0.1 * (v == 'var') + 0.01 * s, rng) for v in ('base', 'var') for s in FRESH]
    runs[-1] = Run({**runs[-1].spec, 'settings': {'max_iters': 4}}, 'diverged', runs[-1].records[:0], [], None, {},
                   None)
    head = dict(baseline='base', seeds=FRESH, variants=['base', 'var'], dataset='synthetic', settings={})
    shapes = {v: {'params': {'total': 1, 'active': 1, 'ffn': 1, 'extras': 0}, 'scale': {'flops_per_token': 1}}
              for v in head['variants']}
    summary, _ = report.summarize(head, runs, shapes)
    var = summary['variants']['var']
    assert var['status'] == 'diverged' and var['diff_to_baseline'] is None and var['matched'] is None
    assert summary['pairs']['var']['base'] is None is summary['pairs']['base']['var']
    row = next(line for line in report.table(summary).splitlines() if line.startswith('| var '))
    assert '(diverged)' in row and '– (a seed diverged)' in row and 'yes' not in row
    runs[-1] = run('var', None, FRESH[-1], 1.9, rng)  # all three finished: the same win is resolved
    assert report.summarize(head, runs, shapes)[0]['variants']['var']['diff_to_baseline']['resolved']
