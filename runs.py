"""
A comparison's runs as data: what each run is, what its directory already holds, and the command that trains it.

A run is a plain train.py run in <out_dir>/<variant>[/lr<rate>]/seed<seed>, recognised by the settings its checkpoint
holds, or before its first checkpoint by the compare.json that compare.py writes when it starts or plans one (unless
that try failed, or the planned run did not start, before it logged anything).
"""
import os
import sys

from cli import split_list, to_argv
from configurator import DEFAULTS
from rundir import STOPPED, checkpoint_field, read_json, read_log

TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')
RECORD = 'compare.json'  # in each run directory compare.py started or planned: the run's settings, how it ended
# where a run lives, how it starts, whether it is compiled (the same losses within float rounding) and the FLOP/s its
# MFU is measured against: not what it is
NOT_IDENTITY = ('out_dir', 'data_dir', 'init_from', 'overwrite', 'compile', 'compile_mode', 'peak_flops')


def identifies(key):
    """Whether a setting is part of what a run is (its experiment tracking is not)."""
    return key not in NOT_IDENTITY and not key.startswith('wandb_')


def identity(settings, processes):
    """What a run is: its identifying settings (train.py's defaults filling what it did not set) and processes."""
    return {**{k: settings.get(k, v) for k, v in DEFAULTS.items() if identifies(k)}, 'processes': processes}


def make_run(cfg, variant, seed, lr=None):
    """One run of a comparison: cfg's settings with this variant, seed and (in a sweep) rate; min_lr keeps its ratio
    to the rate. With --wandb_log, the comparison's runs share a group and are named and tagged by variant and seed."""
    rate = [f'lr{lr:.3g}'] if lr is not None else []
    settings = {k: cfg[k] for k in DEFAULTS}
    settings.update(ffn=variant, seed=seed, out_dir=os.path.join(cfg['out_dir'], variant, *rate, f'seed{seed}'))
    if lr is not None:
        settings.update(learning_rate=lr, min_lr=cfg['min_lr'] * lr / cfg['learning_rate'])
    if cfg['wandb_log']:
        wandb_name = '-'.join([variant, f'seed{seed}', *rate])
        settings.update(wandb_group=cfg['wandb_group'] or os.path.basename(os.path.abspath(cfg['out_dir'])),
                        wandb_run_name=f"{cfg['wandb_run_name']}-{wandb_name}" if cfg['wandb_run_name'] else wandb_name,
                        wandb_tags=','.join(split_list(cfg['wandb_tags']) + [variant, f'seed{seed}']))
    name = f"{variant} seed {seed}" + (f" lr {lr:.3g}" if lr is not None else '')  # as progress lines show it
    return dict(variant=variant, seed=seed, lr=lr, name=name, dir=settings['out_dir'], processes=cfg['nproc_per_run'],
                settings=settings)


def found_settings(d):
    """The identity of the run in directory d, from its checkpoint or else compare.py's record; None if neither says."""
    config = checkpoint_field(d, 'config')
    if isinstance(config, dict):
        return identity(config, checkpoint_field(d, 'world_size') or 1)
    record = read_json(os.path.join(d, RECORD)) or {}
    # a try that failed before it logged anything (e.g. a device this machine lacks), or a planned run not started yet
    empty = record.get('status') in ('failed', 'planned') and not read_log(os.path.join(d, 'log.jsonl'))
    if isinstance(record.get('settings'), dict) and not empty:
        return identity(record['settings'], record.get('processes', 1))
    return None


def run_state(run):
    """What run's directory holds: 'done', 'stopped', 'resume' (a checkpoint to continue from), 'scratch' (nothing yet),
    'retrain' (a checkpoint whose log lines are gone, so its results cannot be read) or 'mismatch' (other settings)."""
    d, wanted = run['dir'], identity(run['settings'], run['processes'])
    found = found_settings(d)
    if found is not None and found != wanted:
        return 'mismatch'
    log = read_log(os.path.join(d, 'log.jsonl'))
    if log and log[-1]['iter'] == run['settings']['max_iters'] and 'val_loss' in log[-1]:
        return 'done'
    if os.path.exists(os.path.join(d, STOPPED)):  # it diverged (train.py's note): its outcome at these settings
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


def command_line(run, mode):
    """A run's exact command: train.py with every setting explicit and absolute paths, so that it runs the same from
    anywhere, through torchrun for several processes. mode: 'scratch', 'resume' or 'overwrite' (what the dir holds)."""
    settings = {**run['settings'], 'out_dir': os.path.abspath(run['dir']),
                'data_dir': os.path.abspath(run['settings']['data_dir']),
                'init_from': 'resume' if mode == 'resume' else 'scratch', 'overwrite': mode == 'overwrite'}
    n = run['processes']
    launch = [sys.executable] + (['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={n}'] if n > 1 else [])
    return launch + [TRAIN_PY] + to_argv(settings)
