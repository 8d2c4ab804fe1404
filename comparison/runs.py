"""
A comparison's runs as data: what each run is to be (a spec), what its directory holds (a Run, read once), and the
command that trains it.

A run is a plain train.py run in <out_dir>/<variant>[/lr<rate>]/seed<seed>, recognised by the settings its checkpoint
holds, or before its first checkpoint by the compare.json that compare.py writes when it starts or plans one (once
that try has logged something: a try that failed before, or a planned run not started yet, holds nothing).
"""
import hashlib
import json
import os
import sys
from dataclasses import dataclass

from configurator import DEFAULTS, at_rate, variant_settings
from machinery.checkpoint import CKPT, load_checkpoint
from machinery.cli import split_list, to_argv
from machinery.files import reading, remove_dead_temps
from machinery.run_log import LOG, STOPPED, read_log_lines

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'train.py')  # the repo's
# where a run lives, how it starts, its CPU threads, whether it is compiled (the same losses within float rounding) and
# the FLOP/s its MFU is measured against: not what it is
NOT_IDENTITY = ('out_dir', 'data_dir', 'init_from', 'overwrite', 'compile', 'compile_mode', 'peak_flops',
                'threads')
PLAN = 'compare.json'  # compare.py's plan of a run it started or listed: its settings, before any checkpoint
TRAIN_OUT = 'train.out'  # the output of every try compare.py started, each after its `$ command` line
FINISHED = ('done', 'stopped')  # states that are results: reused, never trained again


def identifies(key):
    """Whether a setting is part of what a run is (its experiment tracking is not)."""
    return key not in NOT_IDENTITY and not key.startswith('wandb_')


def identity(settings, processes):
    """What a run is: its identifying settings (train.py's defaults filling what it did not set) and processes."""
    return {**{k: settings.get(k, v) for k, v in DEFAULTS.items() if identifies(k)}, 'processes': processes}


# what a tuned learning rate does not depend on: the variant and seed, the rate itself (min_lr as its ratio to it), and
# where and how a run trains and is evaluated
NOT_TUNING = ('ffn', 'seed', 'learning_rate', 'min_lr', 'device', 'eval_interval', 'eval_iters', 'log_interval',
              'always_save_checkpoint')


def tuning_key(cfg):
    """The settings a comparison's learning rates are tuned at, as 12 hex digits (of a SHA-256): every setting that
    makes a run what it is (identity) but those in NOT_TUNING, and min_lr's ratio to the rate. A sweep's summary
    names it as tuned_at; a comparison at other settings finds its tuned rates untuned."""
    settings = {k: v for k, v in identity(cfg, cfg['nproc_per_run']).items() if k not in NOT_TUNING}
    settings['min_lr_ratio'] = cfg['min_lr'] / cfg['learning_rate'] if cfg['learning_rate'] else None
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def make_run(cfg, variant, seed, lr=None):
    """The spec of one run of a comparison: cfg's settings with this variant (and the settings it carries), seed and
    its own rate (None: the shared learning_rate). With --wandb_log, the comparison's runs share a group and are named
    and tagged by variant and seed."""
    rate = [f'lr{lr:.3g}'] if lr is not None else []
    settings = {k: cfg[k] for k in DEFAULTS}
    settings.update(**variant_settings(variant), seed=seed,
                    out_dir=os.path.join(cfg['out_dir'], variant, *rate, f'seed{seed}'))
    if lr is not None:
        settings.update(at_rate(cfg, lr))
    if cfg['wandb_log']:
        wandb_name = '-'.join([variant, f'seed{seed}', *rate])
        settings.update(wandb_group=cfg['wandb_group'] or os.path.basename(os.path.abspath(cfg['out_dir'])),
                        wandb_run_name=f"{cfg['wandb_run_name']}-{wandb_name}" if cfg['wandb_run_name'] else wandb_name,
                        wandb_tags=','.join(split_list(cfg['wandb_tags']) + [variant, f'seed{seed}']))
    name = f"{variant} seed {seed}" + (f" lr {lr:.3g}" if lr is not None else '')  # as progress lines show it
    return dict(variant=variant, seed=seed, lr=lr, name=name, dir=settings['out_dir'], processes=cfg['nproc_per_run'],
                settings=settings)


@dataclass
class Run:
    """A run's spec and what its directory held when it was scanned. state, the one word for its outcome: 'done',
    'stopped' (it diverged: its outcome at these settings), 'resume' (a checkpoint to continue from), 'scratch'
    (nothing yet), 'retrain' (a checkpoint whose log lines are gone, so its results cannot be read) or 'mismatch'
    (trained with other settings)."""
    spec: dict
    state: str
    records: list  # log.jsonl's records
    damaged: list  # log.jsonl's lines that are not records, set aside
    checkpoint: dict | None  # ckpt.pt, memory-mapped (its tensors are read only if used), None if none is readable
    plan: dict  # compare.json, {} if none
    found: dict | None  # the identity the directory holds, None if it holds none

    variant = property(lambda self: self.spec['variant'])
    seed = property(lambda self: self.spec['seed'])
    lr = property(lambda self: self.spec['lr'])  # None: no sweep, the shared learning_rate
    name = property(lambda self: self.spec['name'])
    dir = property(lambda self: self.spec['dir'])
    settings = property(lambda self: self.spec['settings'])
    processes = property(lambda self: self.spec['processes'])

    def final(self, loss_of=lambda r: r.get('val_loss')):
        """The last evaluation's loss (loss_of: which one, e.g. a half of the windows) if the run is done, else None."""
        evals = [r for r in self.records if 'val_loss' in r]
        return loss_of(evals[-1]) if self.state == 'done' and evals else None

    def describe_mismatch(self):
        wanted = identity(self.settings, self.processes)
        keys = sorted(k for k in wanted if self.found.get(k) != wanted[k])
        shown = ', '.join(f"{k}={self.found.get(k)!r} (now {wanted[k]!r})" for k in keys[:4])
        return f"{self.dir} was trained with other settings: {shown}"


def scan(spec):
    """The Run of spec: its directory's log, checkpoint and compare.json, each read once, and the state they give. A
    checkpoint at iteration k always follows log line k, so a run is done when its checkpoint is at its last iteration
    and resumes from its checkpoint where the log has that evaluation; what a kill left (temporary files) goes."""
    d, wanted = spec['dir'], identity(spec['settings'], spec['processes'])
    remove_dead_temps(d)
    records, damaged = read_log_lines(os.path.join(d, LOG))
    hint = f"delete the run's directory {d} to train it again, or use another --out_dir"
    ckpt = load_checkpoint(d, None, mmap=True, hint=hint)  # its tensors stay on disk
    plan, plan_path = {}, os.path.join(d, PLAN)
    with reading(plan_path, hint):
        if os.path.exists(plan_path):
            with open(plan_path, encoding='utf-8') as f:
                plan = {**json.load(f)}
        found, saved = (identity(plan['settings'], plan['processes']) if plan and records else None), None
    if ckpt is not None:  # what it is, from its checkpoint once it has one
        with reading(os.path.join(d, CKPT), hint):
            found, saved = identity(ckpt['config'], ckpt['world_size']), ckpt['iter_num']
    evaluated = lambda it: any(r['iter'] == it and 'val_loss' in r for r in records)
    if found is not None and found != wanted:
        state = 'mismatch'
    elif saved == spec['settings']['max_iters'] and evaluated(saved):
        state = 'done'
    elif os.path.exists(os.path.join(d, STOPPED)):  # it diverged (train.py's note)
        state = 'stopped'
    elif saved is None:
        state = 'scratch'
    else:
        state = 'resume' if evaluated(saved) else 'retrain'
    return Run(spec, state, records, damaged, ckpt, plan, found)


def command_line(spec, mode):
    """A run's exact command: train.py with every setting explicit and absolute paths, so that it runs the same from
    anywhere, through torchrun for several processes. mode: 'scratch', 'resume' or 'overwrite' (what the dir holds)."""
    settings = {**spec['settings'], 'out_dir': os.path.abspath(spec['dir']),
                'data_dir': os.path.abspath(spec['settings']['data_dir']),
                'init_from': 'resume' if mode == 'resume' else 'scratch', 'overwrite': mode == 'overwrite'}
    n = spec['processes']
    launch = [sys.executable] + (['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={n}'] if n > 1 else [])
    return launch + [TRAIN_PY] + to_argv(settings)
