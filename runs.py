"""
A comparison's runs as data: what each run is (its settings, a dict), where it lives, what its directory already
holds (finished, resumable, stopped, someone else's), and the one command that trains it.

A run is a plain train.py run in <out_dir>/<variant>/seed<seed> (with a learning-rate sweep,
<out_dir>/<variant>/lr<rate>/seed<seed>), with the comparison's settings except ffn, seed and, in a sweep, the rate.
It is recognised afterwards by the settings its checkpoint holds (train.py saves all of them), or before its first
checkpoint by the compare.json that compare.py writes when it starts one, whoever trained it.
"""
import os
import shlex
import sys

from configurator import DEFAULTS, to_argv
from rundir import STOPPED, checkpoint_field, read_json, read_log

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_PY = os.path.join(HERE, 'train.py')
RECORD = 'compare.json'  # in each run directory compare.py started: the run's settings, and how it ended
WHERE_KEYS = ('out_dir', 'data_dir', 'init_from', 'overwrite')  # where a run lives and how it starts, not what it is


def identifies(key):
    """Whether a setting is part of what a run is: not where it lives or how it starts, nor its experiment tracking,
    nor whether it was compiled (the same training, losses within float rounding: a run is reused either way)."""
    return key not in WHERE_KEYS and not key.startswith('wandb_') and key not in ('compile', 'compile_mode')


def identity(settings, processes):
    """What a run is: its identifying settings (train.py's defaults filling what it did not set) and processes."""
    full = {**DEFAULTS, **{k: v for k, v in settings.items() if k in DEFAULTS}}
    return {**{k: v for k, v in full.items() if identifies(k)}, 'processes': processes}


def rate_name(lr):
    return f'lr{lr:.3g}'


def make_run(cfg, variant, seed, lr=None, extra=None):
    """One run of a comparison: cfg's settings with this variant, seed and (in a sweep) learning rate; min_lr keeps
    its ratio to the peak rate. `extra`: settings of this run only (wandb's names)."""
    parts = [cfg['out_dir'], variant] + ([rate_name(lr)] if lr is not None else []) + [f'seed{seed}']
    settings = {k: cfg[k] for k in DEFAULTS}
    settings.update(ffn=variant, seed=seed, out_dir=os.path.join(*parts), **(extra or {}))
    if lr is not None:
        settings.update(learning_rate=lr, min_lr=cfg['min_lr'] * lr / cfg['learning_rate'])
    return dict(variant=variant, seed=seed, lr=lr, dir=settings['out_dir'], processes=cfg['nproc_per_run'],
                settings=settings)


def found_settings(d):
    """The settings the run in directory d was trained with, whoever started it: its checkpoint's config, else the
    record compare.py wrote when it started it; None if neither says."""
    config = checkpoint_field(d, 'config')
    if isinstance(config, dict):
        return identity(config, checkpoint_field(d, 'world_size') or 1)
    record = read_json(os.path.join(d, RECORD)) or {}
    if isinstance(record.get('settings'), dict):
        return identity(record['settings'], record.get('processes', 1))
    return None


def run_state(run):
    """What run's directory holds: 'done', 'stopped', 'resume' (a checkpoint to continue from), 'scratch' (nothing,
    or a start cut off before its first checkpoint), 'retrain' (a checkpoint whose log lines are gone: its results
    cannot be read, so it trains again) or 'mismatch' (a run of other settings)."""
    d, wanted = run['dir'], identity(run['settings'], run['processes'])
    found = found_settings(d)
    if found is not None and found != wanted:
        return 'mismatch'
    log = read_log(os.path.join(d, 'log.jsonl'))
    if log and log[-1]['iter'] == run['settings']['max_iters'] and 'val_loss' in log[-1]:
        return 'done'
    record = read_json(os.path.join(d, RECORD)) or {}
    if os.path.exists(os.path.join(d, STOPPED)) or record.get('status') == 'stopped':
        return 'stopped'
    saved = checkpoint_field(d, 'iter_num')
    if saved is None:
        return 'scratch'
    return 'resume' if any(r['iter'] == saved and 'val_loss' in r for r in log) else 'retrain'


def describe_mismatch(run):
    found, wanted = found_settings(run['dir']), identity(run['settings'], run['processes'])
    keys = sorted(k for k in wanted if found.get(k) != wanted[k])
    shown = ', '.join(f"{k}={found.get(k)!r} (now {wanted[k]!r})" for k in keys[:4])
    return f"{run['dir']} was trained with other settings: {shown}"


def describe_progress(run):
    log = read_log(os.path.join(run['dir'], 'log.jsonl'))
    return f"{run['dir']} is at iteration {log[-1]['iter']}" if log else f"{run['dir']} has not started"


def train_command(run, mode):
    """The exact command of one run: train.py with every setting explicit (so it does not depend on the defaults of
    the code that runs it) and absolute paths (so it may run from any directory), through torchrun for several
    processes. mode: 'scratch', 'resume' (from its checkpoint), or 'overwrite' (replace what the directory holds)."""
    settings = {**run['settings'], 'out_dir': os.path.abspath(run['dir']),
                'data_dir': os.path.abspath(run['settings']['data_dir']),
                'init_from': 'resume' if mode == 'resume' else 'scratch', 'overwrite': mode == 'overwrite'}
    n = run['processes']
    launch = [sys.executable] + (['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={n}'] if n > 1 else [])
    return launch + [TRAIN_PY] + to_argv(settings)


def command_line(run, mode, threads):
    """A run's command as one shell line, with its thread count in front when one is set."""
    prefix = f"OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} " if threads else ''
    return prefix + shlex.join(train_command(run, mode))
