"""Learning-rate sweeps (compare.py --lrs / --lr_grid / --lr_extend): on synthetic finished runs with known optima the
chosen rates are right, an edge optimum is flagged and the extension walks to the interior, and the choice never reads
the half of the validation windows the comparison is reported on; then (slow) a tiny sweep end to end."""
import builtins
import collections
import contextlib
import dataclasses
import io
import json
import math
import os
import shutil
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_hostile import TINY, call  # noqa: E402
import compare  # noqa: E402
from comparison import report, runs as runs_py  # noqa: E402
from machinery.cli import UserError  # noqa: E402
from machinery.fingerprint import code_hash  # noqa: E402


from comparison import runs  # noqa: E402


def grid_specs(cfg):
    """The specs of every run of a comparison's grid, as compare.py plans them."""
    return [r.spec for r in compare.grid_runs(cfg, compare.check_comparison(cfg))]


OPTIMA = {'gelu': 8e-3, 'swiglu': 2e-3}  # the known best rate of each variant in the synthetic losses below


def settings(out, *extra):
    return compare.settings([f'--out_dir={out}', '--variants=gelu,swiglu', '--seeds=2', '--max_iters=4',
                             '--eval_interval=2', *TINY, '--lrs=1e-3,2e-3,4e-3', '--learning_rate=2e-3', *extra])


@pytest.fixture
def logged_windows(monkeypatch):
    """The dataset as it is now is what the synthetic runs were trained on (no meta.json in their checkpoints, 'v' the
    validation windows their logs name): nothing is read."""
    monkeypatch.setattr(runs_py, 'data_now', lambda settings: (None, 'v'))


def finish(run, select, report_half):
    """Make `run` look finished, as train.py leaves it: its record, a log whose last evaluation has these halves, and
    its checkpoint's settings and iteration."""
    os.makedirs(run['dir'], exist_ok=True)
    with open(os.path.join(run['dir'], runs.INTENT), 'w') as f:
        json.dump({'settings': run['settings'], 'processes': 1}, f)
    last = {'iter': run['settings']['max_iters'], 'tokens': 512, 'loss': 3.0, 'ms': 1.0, 'tok_s': 1e5,
            'val_loss': (select + report_half) / 2, 'val_halves': [select, report_half], 'val_hash': 'v',
            'batch_hash': f"b{run['seed']}"}
    with open(os.path.join(run['dir'], 'log.jsonl'), 'w') as f:
        f.write(json.dumps({'iter': 0, 'tokens': 0, 'val_loss': 4.4, 'val_halves': [4.4, 4.4],
                            'env': {'code': code_hash()}}) + '\n')
        f.write(json.dumps(last) + '\n')
    # what of its checkpoint a comparison reads: a run is done once its checkpoint is at its last iteration
    torch.save({'config': run['settings'], 'world_size': 1, 'iter_num': last['iter']},
               os.path.join(run['dir'], 'ckpt.pt'))


def u_loss(run, half):
    """A U in log2(rate) around the variant's optimum, a little seed noise; the report half is deliberately opposite."""
    x = math.log2(run['lr'] / OPTIMA[run['variant']])
    return 2.0 + (0.05 if half == 0 else -0.05) * x * x + 0.001 * (run['seed'] % 2)


def train_synthetically(cfg, monkeypatch):
    """compare.run_comparison's steps, each run 'trained' with the synthetic losses; returns its runs as scanned."""
    def train_all(todo, slots, threads, overwrite, pbar, finished):
        for r in todo:
            finish(r.spec, u_loss(r.spec, 0), u_loss(r.spec, 1))
        return [runs_py.scan(r.spec) for r in todo]
    monkeypatch.setattr(compare, 'train_all', train_all)
    monkeypatch.setattr(compare, 'check_dataset', lambda cfg: None)
    monkeypatch.setattr(compare, 'write_report', lambda cfg, comp, runs, fresh: runs)
    comp = compare.check_comparison(cfg)
    return compare.run_comparison(cfg, comp, compare.grid_runs(cfg, comp))


def sweep_report(cfg, runs):
    """The sweep's summary, with the chosen rates' own runs standing in for the fresh seeds' (whose table it is)."""
    comp, chosen = compare.check_comparison(cfg), compare.best_rates(runs)
    head = dict(baseline='gelu', seeds=comp['seeds'], variants=comp['variants'], dataset=cfg['dataset'], settings={})
    shapes = {v: {'params': {}, 'scale': {'flops_per_token': 1}} for v in comp['variants']}
    fresh = [r for r in runs if r.lr == chosen[r.variant]['best']]
    return report.summarize_sweep(head, runs, fresh, shapes, chosen, cfg['learning_rate'])[0]


@pytest.mark.usefixtures('logged_windows')
def test_the_chosen_rates_are_the_known_optima_and_an_edge_is_extended_to_the_interior(tmp_path, monkeypatch):
    cfg = settings(tmp_path / 'cmp', '--lr_extend=True')
    runs = train_synthetically(cfg, monkeypatch)
    chosen = compare.best_rates(runs)
    assert {v: c['best'] for v, c in chosen.items()} == OPTIMA and not any(c['edge'] for c in chosen.values())
    # gelu's optimum (8e-3) lay beyond the grid: two rates were added above it, the second one past the optimum;
    # swiglu's (2e-3) was inside: nothing added
    assert sorted({r.lr for r in runs if r.variant == 'gelu'}) == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    assert sorted({r.lr for r in runs if r.variant == 'swiglu'}) == [1e-3, 2e-3, 4e-3]


@pytest.mark.usefixtures('logged_windows')
def test_without_extension_an_edge_optimum_is_flagged(tmp_path, monkeypatch):
    cfg = settings(tmp_path / 'cmp', '--lr_extend=False')
    chosen = compare.best_rates(train_synthetically(cfg, monkeypatch))
    assert chosen['gelu'] == {**chosen['gelu'], 'best': 4e-3, 'edge': 'high'} and chosen['swiglu']['edge'] is None


@pytest.mark.usefixtures('logged_windows')
def test_the_extension_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setitem(OPTIMA, 'gelu', 1.0)  # an optimum no bounded walk reaches
    runs = train_synthetically(settings(tmp_path / 'cmp', '--lr_extend=True'), monkeypatch)
    rates = sorted({r.lr for r in runs if r.variant == 'gelu'})
    assert len(rates) == 3 + compare.MAX_EXTEND and rates[-1] == pytest.approx(4e-3 * 2 ** compare.MAX_EXTEND)


@pytest.mark.usefixtures('logged_windows')
def test_the_report_half_cannot_influence_the_choice(tmp_path):
    """The same selection halves with two opposite report halves: the same choice, and the reported losses are the
    report half's."""
    cfg = settings(tmp_path / 'cmp', '--lr_extend=False')
    planned = grid_specs(cfg)
    choices = []
    for sign in (1, -1):
        for r in planned:
            finish(r, u_loss(r, 0), 2.0 + sign * 0.3 * math.log2(r['lr'] / 1e-3))
        runs = [runs_py.scan(r) for r in planned]
        choices.append(compare.best_rates(runs))
        summary = sweep_report(cfg, runs)
        best = summary['lr']['gelu']['best']
        expected = 2.0 + sign * 0.3 * math.log2(best / 1e-3)
        assert summary['lr']['gelu']['report'][repr(best)]['mean'] == pytest.approx(expected)
    assert choices[0] == choices[1]


def test_sweep_settings_are_checked_up_front(tmp_path):
    for extra, words in [(['--lrs=1e-3,abc'], 'comma-separated numbers'), (['--lrs=1e-3,4e-3'], 'include learning_rate'),
                         (['--lrs=2e-3,-1'], 'above 0'), (['--lr_grid=2'], 'give one of them'),
                         (['--lrs=', '--lr_grid=-1'], 'between 0 and 10'), (['--lrs=', '--lr_grid=1100'], 'between'),
                         (['--lrs=', '--lr_grid=2', '--learning_rate=0'], 'above 0'),
                         (['--eval_iters=1'], 'eval_iters'),
                         (['--lrs=1e-3,1.0001e-3,2e-3'], 'share a run directory')]:
        with pytest.raises(UserError, match=words):
            cfg = settings(tmp_path / 'cmp', *extra)
            compare.grid_runs(cfg, compare.check_comparison(cfg))
    grid = compare.learning_rates({**settings(tmp_path / 'cmp', '--lrs='), 'lr_grid': 2})
    assert grid == pytest.approx([5e-4, 1e-3, 2e-3, 4e-3, 8e-3]) and 2e-3 in grid


@pytest.mark.usefixtures('logged_windows')
def test_a_rate_where_a_seed_diverged_is_a_failure_there(tmp_path):
    """One seed of gelu diverged at 4e-3, its best rate otherwise: the choice moves to 2e-3, the report shows no
    loss at 4e-3 (not the surviving seed's), marks the rate, and summary.json stays plain JSON (no Infinity)."""
    cfg = settings(tmp_path / 'cmp', '--lr_extend=False')
    planned = grid_specs(cfg)
    for r in planned:
        finish(r, u_loss(r, 0), u_loss(r, 1))
    diverged = {('gelu', 4e-3, 1338), ('swiglu', 2e-3, 1337)}  # swiglu's at the shared rate
    runs = [runs_py.scan(r) for r in planned]
    runs = [dataclasses.replace(r, state='diverged') if (r.variant, r.lr, r.seed) in diverged else r for r in runs]
    summary = sweep_report(cfg, runs)
    gelu = summary['lr']['gelu']
    assert gelu['best'] == 2e-3 and gelu['report'][repr(4e-3)] is None and gelu['select_mean'][repr(4e-3)] is None
    assert gelu['sensitivity']['double'] is None and gelu['report'][repr(1e-3)]['n'] == 2
    json.dumps(summary, allow_nan=False)
    section = '\n'.join(report.lr_section(summary))
    assert '| gelu | 1e-3, 2e-3, 4e-3† |' in section and '| swiglu | 1e-3, 2e-3†, 4e-3 |' in section
    assert ' (diverged) |' in next(line for line in section.splitlines() if line.startswith('| swiglu'))


@pytest.mark.slow
def test_a_tiny_sweep_end_to_end_reused_and_planned(shakespeare_char_dir, tmp_path, capsys, monkeypatch):
    """2 variants x 2 seeds x 3 rates trained for real, then each variant at its best rate on 2 fresh seeds; the
    same command again reuses all 16; --plan lists the rate runs of a fresh directory, and the fresh seeds' runs once
    those are done; summary.md and lr.png are written, and summary.json says which seeds chose and which measured."""
    out = tmp_path / 'cmp'
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', '--variants=gelu,swiglu', '--seeds=2',
            '--max_iters=4', '--eval_interval=2', '--jobs=2', '--threads=1', *TINY, '--lrs=1e-3,2e-3,4e-3',
            '--learning_rate=2e-3', '--lr_extend=False']
    code, err = call(compare.main, argv, capsys)
    assert code == 0, err
    summary = json.loads((out / 'summary.json').read_text())
    assert set(summary['lr']) == {'gelu', 'swiglu'} and summary['shared_lr'] == 2e-3
    assert all(len(x['rates']) == 3 for x in summary['lr'].values())
    assert '## Learning rates' in (out / 'summary.md').read_text() and (out / 'lr.png').stat().st_size > 10_000
    assert summary['sweep_seeds'] == [1337, 1338] and summary['seeds'] == [1339, 1340]
    for v, x in summary['lr'].items():  # the verdict's runs: fresh seeds, at the best rate only
        assert [r['seed'] for r in summary['variants'][v]['runs']] == [1339, 1340]
        assert all(f"lr{x['best']:.3g}" in r['dir'] for r in summary['variants'][v]['runs'])
        assert sorted(os.listdir(out / v / f"lr{x['best']:.3g}")) == ['seed1337', 'seed1338', 'seed1339', 'seed1340']
    opened, real_open = collections.Counter(), builtins.open  # the same command again: each run is read once

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.basename(file) in ('log.jsonl', 'ckpt.pt'):
            opened[os.fspath(file)] += 1
        return real_open(file, *args, **kwargs)
    monkeypatch.setattr(builtins, 'open', counting_open)
    code, err = call(compare.main, argv, capsys)
    monkeypatch.setattr(builtins, 'open', real_open)
    assert code == 0 and 'x 3 rates = 12 runs' in err and '(12 to reuse, 0 to train)' in err
    assert 'the verdict, each variant at its chosen rate on fresh seeds: 2 variant(s) x 2 seed(s) = 4 runs' in err
    assert '(4 to reuse, 0 to train)' in err
    assert sum(p.endswith('log.jsonl') for p in opened) == sum(p.endswith('ckpt.pt') for p in opened) == 16
    assert set(opened.values()) == {1}, opened
    compare.main(argv)  # the table says what its loss is: not the runs' own last lines, scored on every window
    assert 'final val loss: on the second half of the validation windows' in capsys.readouterr().out
    with contextlib.redirect_stdout(io.StringIO()) as plan:
        code, err = call(compare.main, [a.replace(str(out), str(tmp_path / 'fresh')) for a in argv] + ['--plan'], capsys)
    lines = plan.getvalue().splitlines()
    assert len(lines) == 12 and sum('--learning_rate=0.004 ' in l and '--min_lr=0.0004 ' in l for l in lines) == 4
    assert 'again until it prints nothing (its runs come in at most 2 rounds' in err  # then the fresh seeds' runs
    best = f"lr{summary['lr']['gelu']['best']:.3g}"
    shutil.rmtree(out / 'gelu' / best / 'seed1340')  # the sweep done: a verdict's run is what is left to plan
    with contextlib.redirect_stdout(io.StringIO()) as plan:
        compare.main(argv + ['--plan'])
    (line,) = plan.getvalue().splitlines()
    assert '--seed=1340 ' in line and f"--out_dir={out / 'gelu' / best / 'seed1340'} " in line
