"""Tests of compare.py on a tiny model: two variants x two seeds x 4 iterations, trained once (a module fixture, slow
tier) and checked against the runs' own logs; then the same command again (reuse), a cut-off run (resume), a run that
stops on a non-finite loss, and the user mistakes. compare.main runs in-process; each training run is a train.py
subprocess."""
import contextlib
import dataclasses
import io
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import types

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAN_TRAIN = os.path.join(REPO, 'tests', 'nan_train.py')  # train.py whose iteration $NAN_AT has a NaN loss
sys.path.insert(0, REPO)

from test_hostile import call
import compare
import configurator
from machinery import cli, files, fingerprint, progress, run_log
from comparison import report, runs
from machinery.cli import RunStopped, UserError, run_cli
from comparison.runs import tuning_key
from model import GPT, GPTConfig


def grid_specs(cfg):
    """The specs of every run of a comparison's grid, as compare.py plans them."""
    return [r.spec for r in compare.grid_runs(cfg, compare.check_comparison(cfg))]


def scan_state(spec):
    return runs.scan(spec).state

VARIANTS = ['gelu', 'moa']  # a fixed activation and one that logs what it learned ('act')
SEEDS = [1337, 1338]
TINY = ['--seed=1337', '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4', '--max_iters=4',
        '--lr_decay_iters=4', '--warmup_iters=1', '--eval_interval=2', '--eval_iters=2', '--log_interval=1',
        '--device=cpu', '--compile=False', '--dtype=float32', '--lrs=']  # one rate (the default config sweeps 5)


def args(data_dir, out_dir, *extra):
    return [f'--data_dir={data_dir}', f'--out_dir={out_dir}', f'--variants={",".join(VARIANTS)}',
            f'--seeds={len(SEEDS)}', '--jobs=2', '--threads=1', *TINY, *extra]


def run_compare(argv):
    """compare.main in this process; returns what it printed: its progress (stderr), then the table (stdout)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        compare.main(argv)
    return err.getvalue() + out.getvalue()


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope='module')
def compared(shakespeare_char_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('compare') / 'cmp')
    argv = args(shakespeare_char_dir, out)
    stdout = run_compare(argv)
    return argv, out, stdout


def run_dir(out, variant, seed):
    return os.path.join(out, variant, f'seed{seed}')


# ----------------------------------------------------------------------------------------------------------------------
# check 1: the summary is the runs' logs, and every variant saw the same batches and validation windows


@pytest.mark.slow
def test_summary_matches_logs(compared):
    _, out, _ = compared
    with open(os.path.join(out, 'summary.json')) as f:
        summary = json.load(f)
    assert summary['baseline'] == 'gelu' and summary['seeds'] == SEEDS and list(summary['variants']) == VARIANTS
    logs = {(v, s): read_log(os.path.join(run_dir(out, v, s), 'log.jsonl')) for v in VARIANTS for s in SEEDS}
    finals = {}
    for (v, s), log in logs.items():
        assert log[-1]['iter'] == 4 and 'val_loss' in log[-1] and log[-1]['tokens'] == 4 * 4 * 32
        finals[v, s] = log[-1]['val_loss']
    for v in VARIANTS:
        got = summary['variants'][v]
        vals = [finals[v, s] for s in SEEDS]
        assert got['final_val_loss']['mean'] == pytest.approx(statistics.fmean(vals), rel=1e-12)
        assert got['final_val_loss']['std'] == pytest.approx(statistics.stdev(vals), rel=1e-12)
        for r, s in zip(got['runs'], SEEDS):
            log = logs[v, s]
            assert r['seed'] == s and r['final_val_loss'] == finals[v, s] and r['status'] == 'done'
            assert r['batch_hash'] == log[-1]['batch_hash']
            train_lines = [x for x in log if 'loss' in x]
            assert r['tok_s'] == pytest.approx(statistics.median(x['tok_s'] for x in train_lines))
            # every line's ms is the mean step time since the previous line: one step each here (log_interval=1)
            assert r['train_time_s'] == pytest.approx(sum(x['ms'] for x in train_lines) / 1000.0)
            acts = [x['act'] for x in log if x.get('act')]
            assert r['act'] == (acts[-1] if acts else None)
        # parameters: the model the run trained, rebuilt from its checkpoint's model_args
        model_args = torch.load(os.path.join(run_dir(out, v, SEEDS[0]), 'ckpt.pt'), weights_only=True)['model_args']
        assert got['params'] == GPT(GPTConfig(**model_args)).param_report()
    # the paired difference to the baseline, seed by seed
    diffs = [finals['moa', s] - finals['gelu', s] for s in SEEDS]
    d = summary['variants']['moa']['diff_to_baseline']
    assert d['mean'] == pytest.approx(statistics.fmean(diffs), rel=1e-9)
    assert d['std'] == pytest.approx(statistics.stdev(diffs), rel=1e-9)
    assert d['t'] == pytest.approx(d['mean'] / (d['std'] / math.sqrt(2))) and d['resolved'] == (abs(d['t']) > 12.71)
    assert summary['variants']['gelu']['diff_to_baseline'] is None
    pooled = math.sqrt(statistics.fmean([statistics.variance([finals[v, s] for s in SEEDS]) for v in VARIANTS]))
    assert summary['seed_std'] == pytest.approx(pooled, rel=1e-9)
    # what MoA learned: α and the gate statistics per layer, from the last evaluation
    layer = summary['variants']['moa']['learned']['layers'][0]['act']
    assert len(layer['alpha']) == len(layer['c_std']) == 6
    assert summary['variants']['gelu']['learned'] is None
    # same training batches for every variant of a seed (every logged step, not just the last), different across seeds
    for s in SEEDS:
        streams = [[(x['iter'], x['batch_hash']) for x in logs[v, s]] for v in VARIANTS]
        assert all(st == streams[0] for st in streams)
    assert logs['gelu', SEEDS[0]][-1]['batch_hash'] != logs['gelu', SEEDS[1]][-1]['batch_hash']
    # same validation windows everywhere: the hash train.py logs on every evaluation line
    val_hashes = {x['val_hash'] for log in logs.values() for x in log if 'val_loss' in x}
    assert len(val_hashes) == 1 and summary['same_val_windows'] is True
    assert all(summary['same_batches'].values())


# ----------------------------------------------------------------------------------------------------------------------
# check 2: the same command again retrains nothing and writes the same summary


@pytest.mark.slow
def test_rerun_reuses_finished_runs(compared):
    argv, out, _ = compared
    files = [os.path.join(run_dir(out, v, s), name) for v in VARIANTS for s in SEEDS for name in ('ckpt.pt', 'log.jsonl')]
    mtimes = [os.stat(p).st_mtime_ns for p in files]
    with open(os.path.join(out, 'summary.json')) as f:
        before = f.read()
    stdout = run_compare(argv)
    assert '(4 to reuse, 0 to train)' in stdout and stdout.count('reused') == 4
    assert [os.stat(p).st_mtime_ns for p in files] == mtimes
    with open(os.path.join(out, 'summary.json')) as f:
        assert f.read() == before


# ----------------------------------------------------------------------------------------------------------------------
# check 3: the outputs


@pytest.mark.slow
def test_outputs(compared):
    _, out, stdout = compared
    png = os.path.join(out, 'loss.png')
    with open(png, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.image
    img = matplotlib.image.imread(png)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 600
    with open(os.path.join(out, 'summary.md')) as f:
        md = f.read()
    rows = [line for line in md.split('## ')[0].splitlines() if line.startswith('| ')]  # the main table
    for v in VARIANTS:
        assert sum(r.startswith(f'| {v} |') for r in rows) == 1
    # the compute- and time-matched table: one row per variant but the baseline
    matched = md.split('## Compute- and time-matched')[1].split('## ')[0]
    assert '| moa |' in matched and '| gelu |' not in matched
    assert '| gelu |' in stdout and '| moa |' in stdout  # the table is printed at the end
    assert 'second half of the validation windows' not in stdout  # one shared rate: scored on every window
    assert 'Seed noise' in md and 'moa' in md.split('What the learnable activations learned')[1]
    # each run kept its quietened output and the settings it was started with
    rec = json.load(open(os.path.join(run_dir(out, 'moa', SEEDS[1]), 'compare.json')))
    assert rec['settings']['ffn'] == 'moa' and rec['settings']['seed'] == SEEDS[1]
    assert rec['at_once'] == 2 and 'eager times, 2 runs at a time' in md  # as trained (--jobs=2), from the records
    assert 'done: 4 iterations' in open(os.path.join(run_dir(out, 'moa', SEEDS[1]), 'train.out')).read()


# ----------------------------------------------------------------------------------------------------------------------
# a run that stops on a non-finite loss is reported, not hidden, and not retried; a cut-off run resumes from its
# checkpoint and ends exactly where an uninterrupted one does (one partial run serves both: ~2 train.py starts)


@pytest.mark.slow
def test_diverged_and_cut_off_runs(compared, shakespeare_char_dir, tmp_path, monkeypatch):
    _, out, _ = compared
    moved = str(tmp_path / 'cmp')
    shutil.copytree(out, moved)  # a comparison directory may be moved: runs are identified by their settings
    part = run_dir(moved, 'moa', SEEDS[1])
    shutil.rmtree(part)
    argv = args(shakespeare_char_dir, moved)
    monkeypatch.setenv('NAN_AT', '3')  # train.py with a NaN loss at iteration 3 (tests/nan_train.py)
    monkeypatch.setattr(runs, 'TRAIN_PY', NAN_TRAIN)
    stdout = run_compare(argv)
    assert '(3 to reuse, 1 to train, 1 at a time)' in stdout and 'DIVERGED' in stdout and 'non-finite' in stdout
    summary = json.load(open(os.path.join(moved, 'summary.json')))
    moa = summary['variants']['moa']
    assert moa['status'] == 'diverged' and [r['status'] for r in moa['runs']] == ['done', 'diverged']
    assert moa['final_val_loss']['n'] == 1  # the diverged seed has no final loss to average
    assert 'diverged after its last logged iteration, 2 ' in open(os.path.join(moved, 'summary.md')).read()
    monkeypatch.undo()
    assert '(4 to reuse, 0 to train)' in run_compare(argv)  # a divergence is a result: the same command does not retry it

    # what a kill at iteration 3 leaves: the checkpoint and log of iteration 2 (and no diverged.txt: a killed run did
    # not diverge)
    os.remove(os.path.join(part, 'diverged.txt'))
    stdout = run_compare(argv)
    assert '(3 to reuse, 1 to train, 1 at a time)' in stdout and 'resumed from iteration 2' in stdout
    resumed, full = (read_log(os.path.join(d, 'log.jsonl')) for d in (part, run_dir(out, 'moa', SEEDS[1])))
    keys = ('iter', 'tokens', 'loss', 'val_loss', 'batch_hash', 'val_hash', 'act')
    assert [[r.get(k) for k in keys] for r in resumed] == [[r.get(k) for k in keys] for r in full]
    a, b = (json.load(open(os.path.join(d, 'summary.json'))) for d in (moved, out))
    assert a['variants']['moa']['final_val_loss'] == b['variants']['moa']['final_val_loss']


# ----------------------------------------------------------------------------------------------------------------------
# user mistakes: one sentence on stderr, exit status 2, nothing trained


@pytest.mark.parametrize('extra, words', [
    (['--variants=gelu,swishglu'], 'unknown ffn'),
    (['--variants=gelu,relu2', '--baseline=swiglu'], 'baseline'),
    (['--seeds=0'], '--seeds must be between 1 and 100, got 0'),
    (['--seeds=101', '--plan'], '--seeds must be between 1 and 100, got 101'),  # would list 202 runs
    (['--seeds=1000000000'], 'got 1000000000'),  # would make a list of a billion seeds first
    (['--n_layers=2'], 'n_layer'),
    (['--dataset=openwebtext'], 'not prepared'),  # checked before any run starts (bundled ones are prepared)
    (['--device=cuda:99'], 'GPU'),  # a device or dtype this machine lacks: said here, not by each train.py
    (['--dtype=fp16'], 'dtype'),
])
def test_user_mistakes(extra, words, shakespeare_char_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(compare.main, args(shakespeare_char_dir, str(tmp_path / 'cmp'), *extra))
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / 'cmp' / 'gelu')


def test_a_comparison_into_a_runs_folder_is_refused_before_its_pictures_go(shakespeare_char_dir, tmp_path, capsys):
    """--out_dir=out-pn, a train.py run's: its acts.png and acts.json (inspect_run.py's) would be the comparison's."""
    for name in ('ckpt.pt', 'acts.png', 'acts.json'):
        (tmp_path / name).write_text('of the run')
    with pytest.raises(SystemExit) as e:
        run_cli(compare.main, args(shakespeare_char_dir, str(tmp_path)))
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"error: {tmp_path} holds a run (its ckpt.pt), whose pictures a comparison there would replace; choose another "
        f"--out_dir."]
    assert (tmp_path / 'acts.png').read_text() == 'of the run' and not os.path.exists(tmp_path / 'gelu')


def test_a_hundred_seeds_are_a_comparison():
    cfg = compare.settings(['--seeds=100', '--lrs=1e-3,2e-3', '--learning_rate=1e-3', '--device=cpu'])
    comp = compare.check_comparison(cfg)
    assert len(comp['seeds']) == len(comp['fresh_seeds']) == 100


def test_only_a_diverged_run_is_an_outcome(tmp_path):
    """A try that exits non-zero and leaves diverged.txt (train.py's note of a divergence; exit status 3, or torchrun's
    1) ends in the run's outcome: its state is 'diverged', and it is reused. Without it (a full disk) it is a failure:
    the comparison stops, and the same command again continues the run, even with its settings corrected when the
    failed try logged nothing. (compare.py removes an earlier try's note before it starts a run.)"""
    cfg = compare.settings([f'--out_dir={tmp_path}', '--variants=gelu', '--seeds=1', *TINY])
    (spec,) = grid_specs(cfg)
    os.makedirs(spec['dir'])
    job = compare.Job.__new__(compare.Job)  # as Job.__init__ leaves it once its train.py has exited with status 3
    job.run, job.t0, job.name, job.resumed_from = runs.scan(spec), 0.0, spec['name'], None
    job.log_path, job.out_path = os.path.join(spec['dir'], 'log.jsonl'), os.path.join(spec['dir'], 'train.out')
    job.proc = types.SimpleNamespace(returncode=3)
    with open(job.out_path, 'w') as f:
        f.write("$ train.py\nstopped: could not write ckpt.pt (No space left on device); free some space.\n")
    with pytest.raises(RunStopped, match='No space left'):
        job.finish()
    assert scan_state(spec) == 'scratch'
    record = os.path.join(spec['dir'], runs.INTENT)
    files.write_json(record, {'settings': {**spec['settings'], 'n_embd': 64}, 'processes': 1})
    assert scan_state(spec) == 'scratch'  # not 'mismatch': nothing was trained with those settings
    run_log.append_log(job.log_path, {'iter': 0, 'tokens': 0, 'val_loss': 4.2})
    assert scan_state(spec) == 'mismatch'  # but a failed try that trained some says what it was
    os.remove(job.log_path)
    diverged = "the training loss became non-finite (nan) at iteration 3, so the run stopped"
    advice = "; lower learning_rate, set grad_clip, or use another dtype, then resume or start again."
    notes = {os.path.join(spec['dir'], 'diverged.txt'): diverged,
             job.out_path: f"$ train.py\nstopped: {diverged}{advice}"}
    for path, text in notes.items():
        with open(path, 'w') as f:
            f.write(text + '\n')
    job.proc.returncode = 1  # a divergence as torchrun reports it (a DDP run's process exited 3)
    run, line = job.finish()
    assert line.endswith(f'DIVERGED: {diverged} (its result at this rate)')  # not train.py's advice to resume
    assert run.state == 'diverged' == scan_state(spec)
    at_init = ("the untrained model's validation loss is nan, before any step, so the run stopped; its forward "
               "computes a non-finite value at its init: check the code it runs (activations.py, model.py), or use "
               "another dtype.")
    with open(job.out_path, 'w') as f:  # no rate's doing: said whole, the code to check included
        f.write(f"$ train.py\nstopped: {at_init}\n")
    assert job.finish()[1].endswith(f'DIVERGED: {at_init}')


@pytest.mark.slow
def test_a_run_killed_after_its_last_write_is_its_result(compared):
    """A kill between a finished run's last write and its exit: the run is done, its result, not a failure that stops
    the comparison."""
    argv, _, _ = compared
    spec = grid_specs(compare.settings(argv))[0]
    job = compare.Job.__new__(compare.Job)  # as Job.__init__ leaves it once its train.py was killed
    job.run, job.t0, job.name, job.resumed_from = runs.scan(spec), 0.0, spec['name'], None
    job.out_path = os.path.join(spec['dir'], 'train.out')
    job.proc = types.SimpleNamespace(returncode=-signal.SIGKILL)
    run, line = job.finish()
    assert run.state == 'done' and 'final val loss' in line


def test_a_run_without_a_checkpoint_does_not_make_the_times_mixed(tmp_path):
    """Whether times are compiled comes from the runs' checkpoints: one that stopped before its first says nothing."""
    cfg = compare.settings([f'--out_dir={tmp_path}', f'--data_dir={tmp_path}', '--variants=gelu,relu2', '--seeds=1',
                            '--vocab_size=65', *TINY])  # no dataset there: none read
    planned = grid_specs(cfg)
    for r in planned:
        os.makedirs(r['dir'])
        run_log.append_log(os.path.join(r['dir'], 'log.jsonl'), {'iter': 0, 'tokens': 0, 'val_loss': 4.2})
    runs_ = [runs.scan(spec) for spec in planned]
    runs_[0] = dataclasses.replace(runs_[0], checkpoint={'compiled': False})  # one eager run with a checkpoint
    shapes = {r.variant: {'params': None, 'scale': None} for r in runs_}
    head = dict(baseline='gelu', seeds=[1337], variants=['gelu', 'relu2'], dataset=cfg['dataset'], settings={})
    summary, _ = report.summarize(head, runs_, shapes)
    assert summary['compiled'] == 'off'


def test_the_token_budget_shown_is_the_longest_runs_not_the_first_variants(tmp_path):
    """A first variant that diverged early logged fewer tokens than the budget the finished runs trained on."""
    summary = json.load(open(os.path.join(REPO, 'results', 'compare_shakespeare_char', 'summary.json')))
    first = next(iter(summary['variants'].values()))
    budget, first['tokens'] = first['tokens'], first['tokens'] // 2
    report.write_markdown(str(tmp_path / 'summary.md'), summary)
    assert f"{budget:,} training tokens per run" in (tmp_path / 'summary.md').read_text()


def test_a_planned_run_that_diverged_before_its_first_checkpoint_keeps_its_settings(shakespeare_char_dir, tmp_path):
    """--plan records each listed run's settings: a planned run not started yet pins nothing, but once it logged
    (here: diverged before any checkpoint) a changed setting is another run, not this outcome reused."""
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={tmp_path}', '--variants=gelu', '--seeds=1', '--lrs=',
            *TINY]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        compare.main(argv + ['--plan=True'])
    (run,) = grid_specs(compare.settings(argv + ['--learning_rate=1e-3']))
    assert scan_state(run) == 'scratch'  # planned, never started: the new settings simply replace the plan
    run_log.append_log(os.path.join(run['dir'], 'log.jsonl'), {'iter': 0, 'tokens': 0, 'val_loss': 4.2,
                                                                'env': {'code': fingerprint.code_hash()}})
    with open(os.path.join(run['dir'], 'diverged.txt'), 'w') as f:
        f.write('the training loss became non-finite\n')
    assert scan_state(grid_specs(compare.settings(argv))[0]) == 'diverged'
    assert scan_state(run) == 'mismatch'
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # planning changes
        compare.main(argv + ['--learning_rate=1e-3', '--overwrite=True', '--plan=True'])  # nothing it holds
    assert scan_state(grid_specs(compare.settings(argv))[0]) == 'diverged'
    assert scan_state(run) == 'mismatch'


def test_the_code_a_run_logs_is_that_of_activations_and_model_comments_and_docstrings_aside(tmp_path):
    for name in fingerprint.IDEAS:
        shutil.copy(os.path.join(REPO, name), tmp_path / name)
    now = lambda: (fingerprint.code_hash.cache_clear(), fingerprint.code_hash(str(tmp_path)))[1]
    assert now() == fingerprint.code_hash()
    act = tmp_path / 'activations.py'
    text = act.read_text()
    assert text.count('"""a_0 + Σ') == text.count('    hf, a =') == text.count('a[p] * inv_rms * base**p') == 1
    assert text.count('(own**p).square().mean(-1, keepdim=True) + eps)') == 1
    noted = text.replace('"""a_0 + Σ', '"""(edited) a_0 + Σ').replace('    hf, a =', '    # why\n    hf, a =').replace(
        'inv_rms * base**p', 'inv_rms * base ** p').replace('.mean(-1, keepdim=True) + eps)', '.mean(-1,\n            keepdim=True)+eps)')
    act.write_text('# a note\n' + noted)
    assert now() == fingerprint.code_hash()  # only what a reader sees changed: comments, docstrings, spacing
    act.write_bytes(b'\xef\xbb\xbf' + text.encode())  # a BOM, as some editors save: Python reads the same code
    assert now() == fingerprint.code_hash()
    act.write_text(text.replace('a[p] * inv_rms * base**p', 'a[p] * inv_rms * 3 * base**p'))
    assert now() != fingerprint.code_hash()  # a learner's edit of a formula
    loop_end = '        y = y + a[p] * inv_rms * base**p\n    return y.to(h.dtype)'
    assert text.count(loop_end) == 1
    act.write_text(text.replace(loop_end, loop_end.replace('    return', '        return')))
    assert now() != fingerprint.code_hash()  # a statement indented into the loop: PolyNorm's first term only


def test_the_code_fingerprint_counts_what_runs_and_nothing_else():
    """Tokens decide: a string's text and the blocks indentation opens count; comments, docstrings, the spacing between
    tokens, tabs for spaces and a line continued with a backslash do not. The same under every Python (an f-string is
    one token, as before 3.12)."""
    same = lambda a, b: fingerprint.code_tokens(a.encode()) == fingerprint.code_tokens(b.encode())
    base = 'def f(a):\n    """Doc."""\n    x = a.split(",")\n    return f"{x} {a!r:>4}"\n'
    for cosmetic in ('# note\ndef f( a ):  # why\n    """Other\n    doc."""\n    x=a.split( "," )\n    return f"{x} {a!r:>4}"\n',
                     base.replace('    ', '\t'), base.replace('    """Doc."""\n', ''),
                     base.replace('x = a', 'x = \\\n        a')):
        assert same(base, cosmetic), cosmetic
    for edit in (base.replace('split(",")', 'split(", ")'), base.replace('{x} {a', '{x}  {a'),
                 base.replace('    return', '        return').replace('x = a.split(",")', 'for x in a:')):
        assert not same(base, edit), edit
    assert not same('def f():\n    "doc"; return 7\n', 'def f():\n    "doc"; return 8\n')  # code beside a docstring


def test_a_run_trained_with_other_code_is_trained_again_never_reused_but_reported(shakespeare_char_dir, tmp_path,
                                                                                 capsys):
    """A learner edits a formula and runs the same comparison again: a finished run (or a diverged one) whose log
    names other code of activations.py or model.py is refused as one of other settings is, and --overwrite=True
    retrains it; --report reads what the runs measured, whatever their code."""
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={tmp_path}', '--variants=gelu', '--seeds=1', '--lrs=',
            *TINY]
    (spec,) = grid_specs(compare.settings(argv))
    os.makedirs(spec['dir'])
    files.write_json(os.path.join(spec['dir'], runs.INTENT), {'settings': spec['settings'], 'processes': 1})
    log = os.path.join(spec['dir'], 'log.jsonl')
    with open(os.path.join(spec['dir'], 'diverged.txt'), 'w') as f:
        f.write("the untrained model's validation loss is nan\n")
    # the line train.py writes for a run whose untrained model is already non-finite (tests/test_train.py)
    start = {'iter': 0, 'tokens': 0, 'lr': 1e-4, 'batch_hash': '0' * 64}
    for code, state in ((fingerprint.code_hash(), 'diverged'), ('before an edit', 'mismatch'), (None, 'mismatch')):
        files.write_text(log, json.dumps({**start, 'env': {'code': code} if code else {}}) + '\n')
        assert scan_state(spec) == state, code  # this code's outcome is reused; another's, or an unknown's, is not
    assert runs.scan(spec).describe_mismatch() == (
        f"{spec['dir']} does not say which code of activations.py or model.py it was trained with")
    run_log.append_log(log, {**start, 'iter': 1, 'env': {'code': 'before an edit'}})  # and of a second try
    run = runs.scan(spec)
    assert run.state == 'mismatch' and run.describe_mismatch() == (
        f"{spec['dir']} was trained with other code of activations.py or model.py than this comparison's")
    code, err = call(compare.main, argv, capsys)
    assert code == 2 and 'was trained with other code' in err and '--overwrite=True' in err
    assert compare.START[run.state] == 'overwrite'  # what --overwrite=True starts it as
    (reported,) = grid_specs(compare.settings(argv + ['--report=True']))
    assert reported['code'] is None and scan_state(reported) == 'diverged'


def test_a_report_never_pairs_runs_of_two_codes_and_a_comparison_stops_when_its_code_is_edited(tmp_path):
    ran = lambda code: types.SimpleNamespace(records=[{'iter': 0, 'env': {'code': code}}])
    with pytest.raises(UserError, match=r"the runs of .* trained with 2 versions of activations.py or model.py, which "
                                        r"a table would pair as one; run the same command without --report"):
        compare.write_report({'out_dir': str(tmp_path)}, {}, [ran('a'), ran('b')], [ran('a')])
    spec = runs.make_run(dict(compare.DEFAULTS, out_dir=str(tmp_path)), 'gelu', 0)
    spec['code'] = 'before an edit'  # the code as the comparison started; the files hold other code now
    with pytest.raises(UserError, match="activations.py or model.py changed while this comparison ran"):
        compare.train_all([runs.scan(spec)], [None], 0, False, progress.progress_bar(1, 'runs'))


def test_a_run_trained_before_its_dataset_was_prepared_again_is_refused(shakespeare_char_dir, tmp_path, capsys):
    """A run's log names the validation windows it was scored on (val_hash), its checkpoint holds the dataset's
    meta.json (token counts: a new preparation of the training split alone changes them): one trained on its dataset
    as it was before it was prepared again is another run, refused as one of other settings is (--overwrite=True
    retrains it), never reused, and a run of this preparation that stops so is a failure, not a result."""
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={tmp_path}', '--variants=gelu', '--seeds=1', *TINY]
    (spec,) = grid_specs(compare.settings(argv))
    os.makedirs(spec['dir'])
    files.write_json(os.path.join(spec['dir'], runs.INTENT), {'settings': spec['settings'], 'processes': 1})
    log, (meta, val_hash) = os.path.join(spec['dir'], 'log.jsonl'), runs.data_now(spec['settings'])
    env = {'code': fingerprint.code_hash()}  # as a try's first line names the code it trains with
    run_log.append_log(log, {'iter': 0, 'tokens': 0, 'val_loss': 4.2, 'val_hash': val_hash, 'env': env})
    assert scan_state(spec) == 'scratch'  # this dataset's windows: a try to continue
    run_log.append_log(log, {'iter': 2, 'tokens': 256, 'val_loss': 4.0, 'val_hash': 'f' * 64})
    assert scan_state(spec) == 'mismatch'
    code, err = call(compare.main, argv, capsys)
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: {spec['dir']} was trained on other data: its checkpoint's meta.json or its validation windows are not "
        f"those of shakespeare_char as it is prepared now; use another --out_dir, or pass --overwrite=True to retrain "
        f"the runs that differ (1 at this step).")
    os.remove(log)
    run_log.append_log(log, {'iter': 2, 'tokens': 256, 'val_loss': 4.0, 'val_hash': val_hash, 'env': env})
    ckpt = {'config': spec['settings'], 'world_size': 1, 'iter_num': 2, 'meta': meta}
    torch.save(ckpt, os.path.join(spec['dir'], 'ckpt.pt'))
    assert scan_state(spec) == 'resume'
    ckpt['meta'] = {**meta, 'train_tokens': meta['train_tokens'] + 1}
    torch.save(ckpt, os.path.join(spec['dir'], 'ckpt.pt'))
    assert scan_state(spec) == 'mismatch'  # the same validation windows, another training split
    job = compare.Job.__new__(compare.Job)  # as Job.__init__ leaves it once its train.py has exited with status 0
    job.run, job.t0, job.name, job.resumed_from = runs.scan(spec), 0.0, spec['name'], None
    job.out_path, job.proc = os.path.join(spec['dir'], 'train.out'), types.SimpleNamespace(returncode=0)
    with pytest.raises(UserError, match="was trained on other data: .*; that changed while the run trained, so "
                                        "train it again with --overwrite=True."):
        job.finish()


@pytest.mark.slow
def test_finished_runs_on_a_dataset_prepared_again_are_not_reused(compared, tmp_path, capsys):
    """The comparison's finished runs, with their dataset's validation shard written anew: refused, not reused."""
    argv, out, _ = compared
    data = tmp_path / 'data'
    shutil.copytree(os.path.join(next(a[11:] for a in argv if a.startswith('--data_dir=')), 'shakespeare_char'),
                    data / 'shakespeare_char')
    from data.shards import open_shard
    from data.write import write_shard
    val = str(data / 'shakespeare_char' / 'val_000.bin')
    write_shard(val, open_shard(val)[::-1].copy())  # the same characters, in another order
    code, err = call(compare.main, argv + [f'--data_dir={data}'], capsys)
    assert code == 2 and 'was trained on other data' in err and '--overwrite=True' in err


def test_what_a_run_is_leaves_out_where_and_how_it_ran():
    run = grid_specs(compare.settings(['--variants=gelu', '--seeds=1', '--lrs=', *TINY]))[0]
    same = {**run['settings'], 'out_dir': 'elsewhere', 'compile': True, 'peak_flops': 989e12, 'wandb_log': True}
    assert runs.identity(same, 1) == runs.identity(run['settings'], 1) != runs.identity({**same, 'seed': 1}, 1)


def test_a_bundled_dataset_is_prepared_on_demand(tmp_path):
    """`python compare.py` on a fresh clone: the bundled corpus is turned into shards instead of refusing; never over
    shards it did not write."""
    cfg = dict(compare.DEFAULTS, dataset='shakespeare_char', data_dir=str(tmp_path), block_size=64, batch_size=4)
    compare.check_dataset(cfg)
    meta = json.load(open(tmp_path / 'shakespeare_char' / 'meta.json'))
    assert meta['tokenizer'] == 'char' and meta['vocab_size'] == 84
    os.remove(tmp_path / 'shakespeare_char' / 'meta.json')  # shards without meta.json: none it may replace
    before = {n: open(tmp_path / 'shakespeare_char' / n, 'rb').read() for n in os.listdir(tmp_path / 'shakespeare_char')}
    with pytest.raises(UserError, match='holds train_000.bin, val_000.bin but no meta.json of a prepared dataset'):
        compare.check_dataset(cfg)
    assert {n: open(tmp_path / 'shakespeare_char' / n, 'rb').read() for n in os.listdir(tmp_path / 'shakespeare_char')} \
        == before


@pytest.mark.parametrize('name', sorted(os.listdir(os.path.join(REPO, 'config'))))
def test_every_shipped_config_reads_from_any_working_directory(name, tmp_path, monkeypatch):
    """A config that builds on another finds it beside itself, not in the folder the command was started from."""
    monkeypatch.chdir(tmp_path)
    path = os.path.join(REPO, 'config', name)
    if name.startswith(('compare_', 'sweep_', 'ablate_')):
        compare.settings([path, '--plan'])
    else:
        cli.parse_args(configurator.DEFAULTS, [path], types=configurator.TYPES)


@pytest.mark.parametrize('name', ['compare_shakespeare_char', 'sweep_shakespeare_char', 'compare_owt_dense',
                                  'compare_owt_moe', 'ablate_polycom', 'ablate_moa'])
def test_configs_plan(name):
    """Each shipped comparison config parses and plans (valid variants, baseline, keys) without training anything."""
    cfg = compare.settings([os.path.join(REPO, 'config', f'{name}.py'), '--plan'])  # planned for a GPU elsewhere
    comp = compare.check_comparison(cfg)
    variants, seeds, rates = comp['variants'], comp['seeds'], comp['grid'] or [None]
    assert comp['baseline'] == ('relu' if name == 'ablate_polycom' else 'gelu')
    assert len(grid_specs(cfg)) == len(variants) * len(seeds) * len(rates)
    if name.startswith('ablate'):  # the default comparison's model and budget, at tuned rates, over the paper's variants
        assert len(seeds) == 3 and len(rates) == 3 and cfg['lr_extend'] and cfg['max_iters'] == 300
        if name == 'ablate_moa':
            assert cfg['act_dict'] == 'identity,relu,relu2,gelu,silu,leaky_relu,tanh'  # the paper's K = 7
    elif name == 'sweep_shakespeare_char':  # the sweep that tunes the default comparison
        assert set(variants) >= {'gelu', 'relu2', 'swiglu', 'polyrelu', 'polynorm', 'la', 'moa', 'moa_glu'}
        assert len(seeds) >= 2 and cfg['device'] == 'cpu' and cfg['dtype'] == 'float32'
        assert rates == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2] and cfg['learning_rate'] == 2e-3 and cfg['lr_extend']
    elif name == 'compare_shakespeare_char':  # each variant at its tuned rate, on the seeds after the sweep's
        sweep = compare.settings([os.path.join(REPO, 'config', 'sweep_shakespeare_char.py')])
        assert comp['untuned'] is None and len(set(comp['rates'].values())) > 1 and rates == [None]
        assert seeds == [s + 3 for s in compare.check_comparison(sweep)['seeds']] and tuning_key(cfg) == tuning_key(sweep)
    else:
        assert cfg['dataset'] == 'openwebtext' and cfg['compile'] is True and cfg['dtype'] == 'bfloat16'
        assert (cfg['n_expert'], cfg['top_k']) == ((8, 2) if name.endswith('moe') else (0, 2))


@pytest.mark.slow
def test_changed_settings_are_refused(compared, shakespeare_char_dir, capsys):
    argv, out, _ = compared
    with pytest.raises(SystemExit) as e:
        run_cli(compare.main, argv + ['--learning_rate=0.01'])
    err = capsys.readouterr().err
    assert e.value.code == 2 and 'learning_rate' in err and '--overwrite=True' in err


@pytest.mark.slow
def test_a_compile_setting_does_not_make_finished_runs_stale(compared):
    """Whether runs are compiled does not identify them (the same training, losses within 5e-4): the comparison's
    eager runs are reused under --compile=True, nothing retrains, and the summary says the runs were not compiled."""
    argv, out, _ = compared
    stdout = run_compare(argv + ['--compile=True'])
    assert stdout.count('reused (finished)') == len(VARIANTS) * len(SEEDS) and 'trained in' not in stdout
    with open(os.path.join(out, 'summary.json')) as f:
        assert json.load(f)['compiled'] == 'off'


def test_a_failed_attempt_is_reported_with_its_own_message(tmp_path):
    out = tmp_path / 'train.out'
    out.write_text("$ train.py --seed=1\nstopped: non-finite loss (nan) at iteration 15\n"
                   "$ train.py --seed=1 --init_from=resume\nTraceback (most recent call last):\n"
                   "RuntimeError: out of memory\n")
    assert compare.last_error_line(str(out)) == 'RuntimeError: out of memory'


def test_the_times_note_claims_nothing_unrecorded():
    """The summary's note on its times (test_outputs checks it comes from the runs' records): eager or compiled, and a
    number of runs side by side only where every record gives the same one."""
    note = lambda compiled, at_once: report.times_note({'compiled': compiled, 'at_once': at_once})
    assert note('off', 2) == 'eager times, 2 runs at a time' and note('on', 1) == 'compiled times'
    assert note('on', None) == 'compiled times' and 'different' in note('off', 'mixed')
    assert 'do not compare' in note('mixed', 1)


@pytest.mark.slow
def test_a_planned_run_that_diverges_is_reported_as_diverged(shakespeare_char_dir, tmp_path, monkeypatch):
    """A run launched from --plan's command (no compare.py around it to record the stop) leaves diverged.txt; the
    comparison then counts it as diverged instead of asking for it again. A deliberate new try removes the note."""
    cfg = compare.settings(args(shakespeare_char_dir, str(tmp_path / 'cmp')) + ['--variants=gelu', '--seeds=1'])
    (run,) = grid_specs(cfg)
    monkeypatch.setattr(runs, 'TRAIN_PY', NAN_TRAIN)
    cmd = runs.command_line(run, 'scratch')
    monkeypatch.undo()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'NAN_AT': '3'})
    assert p.returncode == 3, p.stderr[-2000:]
    assert 'non-finite' in open(os.path.join(run['dir'], 'diverged.txt')).read()
    assert scan_state(run) == 'diverged'
    p = subprocess.run(runs.command_line(run, 'resume'), capture_output=True, text=True)  # tried again, no NaN
    assert p.returncode == 0, p.stderr[-2000:]
    assert not os.path.exists(os.path.join(run['dir'], 'diverged.txt'))
    assert scan_state(run) == 'done'


def test_help_shows_the_values_a_bare_run_uses(capsys):
    """`python compare.py --help` lists every key with the value `python compare.py` runs with: the default
    comparison's config file, read first."""
    with pytest.raises(SystemExit):
        compare.main(['--help'])
    out = capsys.readouterr().out
    import re
    cfg = compare.settings([])
    for key in ('n_embd', 'seeds', 'variants', 'max_iters', 'learning_rate'):
        assert re.search(rf'--{key}\s+{re.escape(repr(cfg[key]))}(  # .*)?$', out, flags=re.M), key  # and its note


def test_a_variant_carries_model_settings_of_its_own(tmp_path):
    """polyrelu:poly_order=2 is polyrelu at order 2, a variant of its own: its runs' settings, directory and
    parameter count say so, and one comparison holds it beside polyrelu at the default order."""
    cfg = compare.settings([f'--out_dir={tmp_path}', '--variants=polyrelu,polyrelu:poly_order=2', '--baseline=',
                            '--seeds=1', *TINY])
    default, order2 = grid_specs(cfg)
    assert (default['settings']['poly_order'], order2['settings']['poly_order']) == (3, 2)
    assert order2['settings']['ffn'] == 'polyrelu' and order2['dir'] == os.path.join(str(tmp_path), 'polyrelu:poly_order=2',
                                                                                     f"seed{cfg['seed']}")
    assert runs.identity(order2['settings'], 1) != runs.identity(default['settings'], 1)
    extras = [runs.meta_model({**s['settings'], 'vocab_size': 65}, '').param_report()['extras']
              for s in (default, order2)]
    assert extras[0] - extras[1] == cfg['n_layer']  # one coefficient fewer per layer
    la = compare.settings([f'--out_dir={tmp_path}', '--baseline=', '--seeds=1', *TINY,
                           '--variants=la:act_dict=gelu+relu,la:ffn_mult=1e+0,la:act-dict=gelu+,la:la_init=onehot:relu'])
    assert [{k: s['settings'][k] for k in ('act_dict', 'la_init')} for s in grid_specs(la)] == [
        {'act_dict': 'gelu,relu', 'la_init': 'onehot'}, {'act_dict': la['act_dict'], 'la_init': 'onehot'},  # 1e+0
        {'act_dict': 'gelu,', 'la_init': 'onehot'}, {'act_dict': la['act_dict'], 'la_init': 'onehot:relu'}]
    for bad, words in [('polyrelu:order=2', "unknown config key 'order'"), ('polyrelu:poly_order=x', 'expects an int'),
                       ('gelu:ffn=relu', "unknown config key 'ffn'"), ('polyrelu:poly_order=9', 'poly_order'),
                       ('gelu:block_size=64', 'sets block_size, which fixes the batches and validation windows'),
                       ('polyrelu:poly_order', 'a variant carries model settings as name:key=value'),
                       ('la:act_dict=gelu,relu', r"one entry, as a comma ends a variant; join its entries with '\+'")]:
        with pytest.raises(UserError, match=words):
            compare.check_comparison(compare.settings([f'--out_dir={tmp_path}', f'--variants=gelu,{bad}', '--baseline=',
                                                       *TINY]))


@pytest.mark.parametrize('plan', ['{"settings": 3, "processes": 1}', '{"processes": 1}', '[1, 2]', '{"settings'])
def test_a_plan_compare_py_cannot_use_is_one_sentence(tmp_path, plan, capsys):
    """compare.json of a run that logged but has no checkpoint yet, of another shape: one sentence (exit status 2)
    naming it, and nothing changed."""
    argv = [f'--out_dir={tmp_path}', '--variants=gelu', '--seeds=1', *TINY]
    (spec,) = grid_specs(compare.settings(argv))
    os.makedirs(spec['dir'])
    (tmp_path / spec['dir'] / 'compare.json').write_text(plan)
    (tmp_path / spec['dir'] / 'log.jsonl').write_text('{"iter": 0, "val_loss": 4.2}\n')
    before = {p: open(os.path.join(spec['dir'], p)).read() for p in os.listdir(spec['dir'])}
    code, err = call(compare.main, argv + ['--report'], capsys)
    assert code == 2 and 'Traceback' not in err and len(err.strip().splitlines()) == 1
    assert 'compare.json' in err and {p: open(os.path.join(spec['dir'], p)).read() for p in os.listdir(spec['dir'])} \
        == before


def test_a_sweep_on_the_command_line_replaces_the_config_files():
    """The default config lists its rates (lrs); --lr_grid on the command line replaces them, and the other way round."""
    cfg = compare.settings(['--lr_grid=1'])
    assert cfg['lrs'] == '' and compare.learning_rates(cfg) == pytest.approx([1e-3, 2e-3, 4e-3])
    assert compare.learning_rates(compare.settings(['--lrs=2e-3,4e-3'])) == [2e-3, 4e-3]
    with pytest.raises(UserError, match='give one of them'):  # both on the command line: which one is meant?
        compare.learning_rates(compare.settings(['--lr_grid=1', '--lrs=1e-3,2e-3']))


@pytest.mark.slow
def test_ctrl_c_while_the_report_is_written_ends_quietly_and_leaves_it_whole(compared):
    """A rerun of a finished comparison only writes its report: Ctrl-C at any moment of it ends with 'interrupted.'
    and status 130 (or 0 if it came too late), no traceback, and the summary as it was (the same runs: the same one)."""
    import signal
    argv, out, _ = compared
    before = {name: open(os.path.join(out, name), 'rb').read() for name in ('summary.json', 'summary.md')}
    for delay in (0.3, 0.8, 1.3, 1.8, 2.3, 2.8, 3.3, 3.8):
        p = subprocess.Popen([sys.executable, os.path.join(REPO, 'compare.py'), *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)
        assert p.returncode in (0, 130) and 'Traceback' not in err, (delay, p.returncode, err)
        assert p.returncode == 0 or err.rstrip().endswith('interrupted.'), err
        assert {name: open(os.path.join(out, name), 'rb').read() for name in before} == before


# ----------------------------------------------------------------------------------------------------------------------
# each variant at its tuned rate


def plan(argv, data_dir, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        compare.main([f'--data_dir={data_dir}', f'--out_dir={tmp_path / "plan"}', '--plan', *argv])
    return out.getvalue().splitlines(), err.getvalue()


def test_the_default_comparison_plans_each_variant_at_its_tuned_rate(shakespeare_char_dir, tmp_path):
    """`python compare.py --plan` on a fresh clone: at most 30 runs, at more than one rate, all tuned."""
    lines, err = plan([], shakespeare_char_dir, tmp_path)
    rates = {re.search(r' --learning_rate=(\S+)', line).group(1) for line in lines}
    assert 0 < len(lines) <= 30 and len(rates) > 1 and 'untuned' not in err


def test_a_variant_without_a_tuned_rate_is_named_untuned_with_the_command_that_tunes_it(shakespeare_char_dir,
                                                                                         tmp_path):
    """A variant the tuned rates do not cover (one of the user's own) runs at the shared rate and says so, naming the
    sweep that tunes it; after a change of the model, every tuned rate is untuned; a rate given (@) is the user's."""
    lines, err = plan(['--variants=gelu,xielu,polynorm@4e-3'], shakespeare_char_dir, tmp_path)
    rates = [re.search(r' --learning_rate=(\S+)', line).group(1) for line in lines]
    assert rates == ['0.008', '0.002', '0.004'] * 3  # seed by seed: gelu tuned, xielu shared, polynorm its own
    assert ('compare: xielu runs untuned, at the shared learning_rate 2e-3 (no tuned rate); `python compare.py '
            f'config/sweep_shakespeare_char.py --data_dir={shakespeare_char_dir} --variants=gelu,xielu,polynorm` '
            'tunes it.') in err  # the sweep tunes every variant: no @rate, which a sweep refuses
    _, err = plan(['--n_embd=128', '--compile=True', '--jobs=3'], shakespeare_char_dir, tmp_path / 'wider')
    assert 'gelu, relu2, swiglu, polyrelu, polynorm, la, moa, moa_glu run untuned' in err
    assert 'rates tuned at other settings' in err and ' --n_embd=128` tunes them' in err  # not how the runs run
    assert 'lr_decay_iters' not in err
    _, err = plan(['--n_embd=128', '--variants=gelu,xielu'], shakespeare_char_dir, tmp_path / 'mixed')
    assert re.search(r'gelu, xielu run untuned, at the shared learning_rate 2e-3 \(rates tuned at other settings '
                     r'\(tuned_at \w+, these settings \w+\); no tuned rate for xielu\)', err)
    _, err = plan(['--max_iters=30', '--max_iters=40'], shakespeare_char_dir, tmp_path / 'short')  # schedule: 300
    assert ('compare: note: lr_decay_iters=300 lies past max_iters=40, so the rate never decays to min_lr; '
            '--lr_decay_iters=0 ends the schedule with the run.') in err
    assert ' --max_iters=40` tunes them.' in err and '--max_iters=30' not in err  # given twice: its last value
    _, err = plan(['--variants=polyrelu,polyrelu:poly_order=2', '--baseline=polyrelu'], shakespeare_char_dir,
                  tmp_path / 'own')  # a baseline of the user's: the sweep needs it too, or it refuses the variants
    assert '--variants=polyrelu,polyrelu:poly_order=2 --baseline=polyrelu` tunes it' in err
    summary = {**json.load(open(os.path.join(REPO, 'results', 'compare_shakespeare_char', 'summary.json'))),
               'untuned': ['xielu'], 'untuned_note': 'xielu runs untuned, at the shared learning_rate 2e-3 (...).'}
    report.write_markdown(str(tmp_path / 'summary.md'), summary)
    assert 'Untuned: xielu runs untuned' in (tmp_path / 'summary.md').read_text()
    # tuned rates that happen to be equal are shown all the same: the settings name the shared rate, not theirs
    rates = {v: (8e-3 if v in ('gelu', 'relu2') else 2e-3) for v in summary['rates']}
    for variants, column in (({'gelu', 'relu2'}, True), ({'swiglu'}, False)):  # swiglu: at the shared 2e-3
        table = report.table({**summary, 'variants': {v: s for v, s in summary['variants'].items() if v in variants},
                              'rates': {v: rates[v] for v in variants}, 'untuned': []})
        assert table.startswith('| variant | lr |') == column and ('| gelu | 8e-3 |' in table) == column


def test_a_sweep_refuses_a_variant_that_carries_its_own_rate():
    cfg = compare.settings(['--variants=gelu@8e-3,relu', '--lrs=2e-3,4e-3', '--learning_rate=2e-3'])
    with pytest.raises(UserError, match='gelu cannot carry its own'):
        compare.check_comparison(cfg)
    for bad in ('gelu@', 'gelu@-1', 'gelu@abc'):
        with pytest.raises(UserError, match='carries no rate a run can take'):
            compare.check_comparison(compare.settings([f'--variants={bad}', '--lrs=']))


@pytest.mark.parametrize('argv, words', [
    (['--variants=gelu@1e-3,gelu@2e-3'], 'names gelu twice'),
    (['--variants=gelu,gelu@8e-3'], 'names gelu twice'),
    (['--tuned_lrs=gleu@8e-3'], r"^--tuned_lrs: unknown ffn 'gleu' \(did you mean 'gelu'\?\)"),  # where it was typed
    (['--variants=gelu,polyrelu:poly_order=9'], r"^--variants: variant 'polyrelu:poly_order=9': --poly_order must"),
    (['--variants=polyrelu:poly_order=2,gelu', '--n_head=3'], r"^--n_embd=64 must be divisible by --n_head=3"),
    (['--tuned_lrs=gelu'], "'gelu' carries no rate"),
    (['--ffn=polynorm'], r'^compare.py trains each of --variants, so it does not read --ffn'),
    (['--variants=gelu@8e-3', '--eval_iters=1'], 'eval_iters of at least 2'),
])
def test_mistakes_with_rates_are_one_sentence(argv, words):
    with pytest.raises(UserError, match=words):
        compare.check_comparison(compare.settings(argv))


def test_a_shared_rate_of_0_plans_untuned_runs(shakespeare_char_dir, tmp_path):
    """learning_rate=0 has no ratio for min_lr to keep: the tuned rates do not apply, and nothing divides by it."""
    lines, err = plan(['--learning_rate=0', '--min_lr=0'], shakespeare_char_dir, tmp_path)
    assert len(lines) == 24 and 'run untuned, at the shared learning_rate 0 (' in err


def test_a_run_that_ignores_sigint_as_its_background_compare_does_is_stopped_at_once():
    """A compare.py started in the background of a script (`compare.py &`) ignores SIGINT, and so does each run it
    starts: stopping them, a `kill` of compare.py sends SIGTERM, not a SIGINT they would ignore for a minute."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the child, as a run inherits it
    try:
        job = compare.Job.__new__(compare.Job)
        job.run = types.SimpleNamespace(processes=1)
        job.proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
        job.interrupt(signalled=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert job.proc.returncode == -signal.SIGTERM  # not -SIGKILL, a minute later


# ----------------------------------------------------------------------------------------------------------------------
# what a kill, a hand or a disk can leave in a comparison: the same command again gives the uninterrupted result

# train.py, killed (kill -9) between the two writes of a run's last iteration: after its last log line, in the middle of
# its last checkpoint (a half-written temporary file left); the one test hook, outside train.py
KILLED_TRAIN = """
import os, runpy, signal, sys
sys.path.insert(0, {repo!r})
import torch
save = torch.save
def killed(ckpt, f):  # half of the last checkpoint is in its temporary file when the process dies
    cfg = ckpt['config']
    if ckpt['iter_num'] == cfg['max_iters'] and (cfg['ffn'], cfg['seed']) == {run!r}:
        f.write(b'half')
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    save(ckpt, f)
torch.save = killed
sys.argv[0] = {train!r}
runpy.run_path({train!r}, run_name='__main__')
"""
TIMES = ('tok_s', 'train_time_s', 'at_once', 'matched', 'dir', 'run', 'compiled')  # what depends on when and where


def without_times(x):
    if isinstance(x, dict):
        return {k: without_times(v) for k, v in x.items() if k not in TIMES}
    return [without_times(v) for v in x] if isinstance(x, list) else x


def summary_of(out):
    with open(os.path.join(out, 'summary.json')) as f:
        return without_times(json.load(f))


def dead_pid():
    p = subprocess.Popen([sys.executable, '-c', ''])
    p.wait()
    return p.pid


def test_a_kill_between_a_runs_last_log_line_and_its_last_checkpoint_is_resumed(compared, shakespeare_char_dir,
                                                                                 tmp_path, monkeypatch):
    """The log ends at the last iteration, the checkpoint is an evaluation earlier: the run is not done (a checkpoint
    at iteration k always follows log line k), so the same command resumes it, and its summary is the uninterrupted
    one, acts (read from the checkpoints) included; the half-written checkpoint is gone (the run is read again as it
    ends)."""
    _, out, _ = compared
    killed_out = str(tmp_path / 'cmp')
    argv = args(shakespeare_char_dir, killed_out)
    wrapper = tmp_path / 'killed_train.py'
    wrapper.write_text(KILLED_TRAIN.format(repo=REPO, train=runs.TRAIN_PY, run=('moa', SEEDS[1])))
    monkeypatch.setattr(runs, 'TRAIN_PY', str(wrapper))
    with pytest.raises(RunStopped, match='exit status -9'):
        run_compare(argv)
    part = run_dir(killed_out, 'moa', SEEDS[1])
    assert read_log(os.path.join(part, 'log.jsonl'))[-1]['iter'] == 4
    assert torch.load(os.path.join(part, 'ckpt.pt'), weights_only=True)['iter_num'] == 2
    assert runs.scan(runs.make_run(compare.settings(argv), 'moa', SEEDS[1])).state == 'resume'
    monkeypatch.undo()
    stdout = run_compare(argv)
    assert 'moa seed 1338: resumed from iteration 2' in stdout
    assert summary_of(killed_out) == summary_of(out)
    assert not any(n.startswith('.ckpt.pt.tmp') for n in os.listdir(part))


def test_records_out_of_order_and_temporary_files_left_by_kills(compared, tmp_path):
    """A log whose lines were moved (an evaluation line at the end) or reversed reads in the order of its iterations:
    the runs are done, reused, and the summary is as before. The temporary files of writes a kill cut off (a redrawn
    loss.png, a checkpoint) go with the same command; a live process's stay."""
    argv, out, _ = compared
    moved = str(tmp_path / 'cmp')
    shutil.copytree(out, moved)
    argv = [a if not a.startswith('--out_dir=') else f'--out_dir={moved}' for a in argv]
    for (variant, seed), reorder in ((('gelu', SEEDS[0]), lambda ls: ls[:2] + ls[3:] + ls[2:3]),
                                     (('moa', SEEDS[1]), lambda ls: ls[::-1])):
        path = os.path.join(run_dir(moved, variant, seed), 'log.jsonl')
        lines = open(path).readlines()
        assert '"val_loss"' in lines[2]  # iteration 2's evaluation
        open(path, 'w').writelines(reorder(lines))
    dead, done = dead_pid(), run_dir(moved, 'gelu', SEEDS[1])
    left = [os.path.join(moved, f'.loss.png.tmp{dead}'), os.path.join(done, f'.ckpt.pt.tmp{dead}')]
    live = os.path.join(moved, f'.summary.json.tmp{os.getppid()}')  # a live process's write
    for path in left + [live]:
        open(path, 'w').write('half')
    stdout = run_compare(argv)
    assert '(4 to reuse, 0 to train)' in stdout
    assert summary_of(moved) == summary_of(out)
    assert not any(map(os.path.exists, left)) and os.path.exists(live)


def test_records_without_their_validation_halves_are_no_evaluation_on_them(compared, tmp_path):
    """A record without val_halves (the last evaluation of one run, an earlier one of another) is no evaluation on the
    halves: the run whose last evaluation lacks them has no result there, the other keeps its own; no KeyError."""
    argv, out, _ = compared
    moved = str(tmp_path / 'cmp')
    shutil.copytree(out, moved)
    for (variant, seed), line in ((('moa', SEEDS[1]), -1), (('gelu', SEEDS[0]), 2)):
        path = os.path.join(run_dir(moved, variant, seed), 'log.jsonl')
        records = read_log(path)
        del records[line]['val_halves']
        open(path, 'w').writelines(json.dumps(r) + '\n' for r in records)
    cfg = compare.settings([a if not a.startswith('--out_dir=') else f'--out_dir={moved}' for a in argv])
    comp = compare.check_comparison(cfg)
    grid = compare.grid_runs(cfg, comp)
    assert [r.state for r in grid] == ['done'] * 4
    summary, _ = report.summarize({**comp, 'dataset': cfg['dataset'], 'settings': {}}, grid,
                                  compare.shapes_of(cfg, grid, comp['variants']), report.REPORT_HALF)
    finals = {(v, r['seed']): r['final_val_loss'] for v, s in summary['variants'].items() for r in s['runs']}
    assert finals[('moa', SEEDS[1])] is None and None not in [x for k, x in finals.items() if k != ('moa', SEEDS[1])]
    assert compare.best_rates(grid)  # the selection half: the same records, no KeyError


def test_the_printed_tuning_command_tunes_exactly_this_comparison(shakespeare_char_dir, tmp_path):
    """Run as printed, the command that tunes the untuned variants has this comparison's tuned_at (processes per run
    included), chooses on seeds of its own (not this comparison's), and is accepted: its --plan lists runs."""
    given = ['--variants=gelu,xielu', '--nproc_per_run=2', '--learning_rate=3e-3', '--seed=5', '--n_embd=48']
    _, err = plan(given, shakespeare_char_dir, tmp_path)
    printed = re.search(r'`python compare\.py (.*?)` tunes', err).group(1).split()
    assert printed[0] == 'config/sweep_shakespeare_char.py' and '--nproc_per_run=2' in printed
    here = compare.settings(given + [f'--data_dir={shakespeare_char_dir}'])
    sweep = compare.settings([os.path.join(REPO, printed[0])] + printed[1:])
    assert tuning_key(sweep) == tuning_key(here) and compare.check_comparison(sweep)['grid']
    assert not {here['seed'] + i for i in range(here['seeds'])} & {sweep['seed'] + i for i in range(sweep['seeds'])}
    lines, _ = plan([os.path.join(REPO, printed[0])] + printed[1:], shakespeare_char_dir, tmp_path / 'sweep')
    assert lines and all('--nproc_per_node=2' in line for line in lines)


def test_a_min_lr_equal_to_the_rate_stays_equal_at_each_variants_own_rate(shakespeare_char_dir, tmp_path):
    """min_lr keeps its ratio to each rate a run takes; a ratio of 1 times 7e-4 rounds above 7e-4, which a run would
    refuse, so it is kept at the rate: every run is planned, each with min_lr equal to its rate."""
    lines, _ = plan(['--variants=gelu@7e-4,relu2', '--learning_rate=3e-3', '--min_lr=3e-3', '--seeds=1'],
                    shakespeare_char_dir, tmp_path)
    assert [re.search(r' --learning_rate=(\S+) .* --min_lr=(\S+) ', line).groups() for line in lines] == [
        ('0.0007', '0.0007'), ('0.003', '0.003')]


def test_a_summary_explains_active_parameters_only_where_it_shows_them(tmp_path):
    """An MoE's params column adds '(N active)': its footnote then says what that is; a dense comparison's does not."""
    summary = json.load(open(os.path.join(REPO, 'results', 'compare_shakespeare_char', 'summary.json')))
    explained = lambda: 'active: those a token computes with (its top_k experts)' in (tmp_path / 's.md').read_text()
    report.write_markdown(str(tmp_path / 's.md'), summary)
    assert not explained()
    params = next(iter(summary['variants'].values()))['params']
    params['active'] = params['total'] // 2
    report.write_markdown(str(tmp_path / 's.md'), summary)
    assert explained()


def test_a_single_runs_config_is_refused_for_what_it_sets_not_for_what_it_does_not(tmp_path):
    """config/shakespeare_char.py keeps only the best checkpoint (always_save_checkpoint=False): a comparison cannot
    tell a finished run by it. The refusal names that, not also a --max_iters of at least 1 it already has (2000)."""
    cfg = compare.settings([os.path.join(REPO, 'config', 'shakespeare_char.py'), f'--out_dir={tmp_path}'])
    refusal = (r"^a comparison's run is done .* needs always_save_checkpoint=True; give a comparison's config file, "
               r"or --always_save_checkpoint=True\.$")
    with pytest.raises(compare.UserError, match=refusal):
        compare.check_comparison(cfg)
    with pytest.raises(compare.UserError, match=r"^--max_iters must be at least 1 in a comparison, got 0\.$"):
        compare.check_comparison(compare.settings([f'--out_dir={tmp_path}', '--max_iters=0']))
