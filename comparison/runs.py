"""
A comparison's runs as data: what each run is to be (a spec), what its directory holds (a Run, read once), and the
command that trains it.

A run is a plain train.py run in <out_dir>/<variant>[/lr<rate>]/seed<seed>, recognised by the settings its checkpoint
holds, or before its first checkpoint by the compare.json that compare.py writes when it starts or lists one (once
that try has logged something: a try that failed before, or a planned run not started yet, holds nothing).
"""
import functools
import hashlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass

import torch

from activations import VARIANTS, check_variant
from configurator import DEFAULTS, dataset_vocab, keys_that, model_config
from data.loader import open_loader
from machinery.checkpoint import CKPT, load_checkpoint
from machinery.cli import UserError, parse_args, reading, split_arg, split_list
from machinery.files import remove_dead_temps
from machinery.fingerprint import IDEAS, code_hash
from machinery.run_log import DIVERGED, LOG, read_log_lines
from model import GPT

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'train.py')  # the repo's
INTENT = 'compare.json'  # what compare.py meant a run to be as it started or listed it: its settings
TRAIN_OUT = 'train.out'  # the output of every try compare.py started, each after its `$ command` line
FINISHED = ('done', 'diverged')  # states that are results: reused, never trained again


def identity(settings, processes):
    """What a run is: its 'id' settings (train.py's defaults filling what it did not set) and processes."""
    return {**{k: settings.get(k, DEFAULTS[k]) for k in keys_that('id')}, 'processes': processes}


def at_rate(settings, lr):
    """The learning-rate settings of a run at peak rate lr instead of settings' own: min_lr keeps its ratio to it (at
    most lr, which a ratio of 1 may pass by a rounding)."""
    return {'learning_rate': lr, 'min_lr': min(lr, settings['min_lr'] * lr / settings['learning_rate']) if settings[
        'learning_rate'] else settings['min_lr']}


def meta_model(settings, data_dir):
    """A run's GPT on the meta device (shapes, no memory); vocab_size 0 is the dataset's (its meta.json)."""
    with torch.device('meta'):
        return GPT(model_config({**settings, 'vocab_size': settings['vocab_size'] or
                                 dataset_vocab(settings['dataset'], data_dir)}))


def data_now(settings):
    """(meta.json, val_hash) of a run's dataset as it is prepared now: a run trained on it holds that meta.json in its
    checkpoint (its token counts, shards, vocabulary) and logs that val_hash (DataLoader.val_hash)."""
    meta = os.path.join(settings['data_dir'], settings['dataset'], 'meta.json')  # a new preparation writes it anew
    stamp = os.stat(meta).st_mtime_ns if os.path.exists(meta) else None
    return _data_now(*(settings[k] for k in ('dataset', 'data_dir', 'block_size', 'batch_size', 'eval_iters')), stamp)


@functools.lru_cache(maxsize=None)
def _data_now(dataset, data_dir, block_size, batch_size, eval_iters, stamp):
    loader = open_loader(dataset, block_size, batch_size, 0, data_dir)
    return loader.meta, loader.val_hash(eval_iters)


def tuning_key(cfg):
    """The settings a comparison's learning rates are tuned at, as 12 hex digits (of a SHA-256): configurator's 'tune'
    keys, the processes per run, and min_lr's ratio to the rate. A sweep's summary names it as tuned_at; a comparison
    at other settings finds its tuned rates untuned."""
    settings = {**{k: cfg[k] for k in keys_that('tune')}, 'processes': cfg['nproc_per_run']}
    settings['min_lr_ratio'] = cfg['min_lr'] / cfg['learning_rate'] if cfg['learning_rate'] else None
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def check_variants(text):
    """The FFN variants named in a comma-separated setting (e.g. --variants), each checked by variant_settings."""
    labels = split_list(text)
    if not labels:
        raise UserError(f"no variant named; give comma-separated names of: {', '.join(VARIANTS)}.")
    for label in labels:
        variant_settings(label)
    if len(set(labels)) < len(labels):
        raise UserError(f"'{text}' names a variant twice; list each once.")
    return labels


def variant_rates(text, key):
    """{label: its rate, None where it carries none} of a comma-separated list of variants (--variants, --tuned_lrs),
    each perhaps carrying a learning rate after '@' (gelu@8e-3, polyrelu:poly_order=2@8e-3); each label checked by
    variant_settings, once."""
    out = {}
    for item in split_list(text):
        label, at, rate = item.rpartition('@') if '@' in item else (item, '', '')
        try:
            variant_settings(label)
        except UserError as e:  # said as the setting that names it
            raise UserError(f"--{key}: {e}") from None
        if label in out:
            raise UserError(f"--{key}='{text}' names {label} twice; list each variant once.")
        try:
            out[label] = float(rate) if at else None
        except ValueError:
            out[label] = math.nan
        if at and not 0 < out[label] < math.inf:
            raise UserError(f"--{key}: '{item}' carries no rate a run can take after '@'; give a number above 0, e.g. "
                            f"{label}@8e-3.")
    return out


def variant_settings(label):
    """The settings a variant of a comparison stands for: a name of activations.VARIANTS, optionally carrying model
    settings of its own, so that one comparison can vary them: 'polyrelu:poly_order=2' -> {'ffn': 'polyrelu',
    'poly_order': 2}; a dictionary's entries are joined by '+', as a comma ends the variant (la:act_dict=gelu+relu)."""
    name, *own = re.split(r':(?=[\w-]+=)', label)  # la:la_init=onehot:relu: a ':' before key= starts a setting
    if ':' in name:  # polyrelu:poly_order, a setting without its value
        raise UserError(f"variant '{label}': a variant carries model settings as name:key=value, e.g. "
                        f"polyrelu:poly_order=2.")
    try:
        check_variant(name)
    except ValueError as e:
        raise UserError(f"{e}.") from None
    keys = {k: DEFAULTS[k] for k in keys_that('model') if k != 'ffn'}
    try:
        cfg, given = parse_args(keys, [f'--{item}'.replace('+', ',') if split_arg(f'--{item}')[0] == 'act_dict'
                                       else f'--{item}' for item in own], prog='compare.py')
    except UserError as e:
        raise UserError(f"variant '{label}': {str(e).rstrip('.')} (a variant carries model settings as "
                        f"name:key=value, e.g. polyrelu:poly_order=2).") from None
    if 'act_dict' in given and ',' not in cfg['act_dict']:  # la:act_dict=gelu,relu read as la of gelu alone, and relu
        raise UserError(f"variant '{label}' carries a dictionary of one entry, as a comma ends a variant; join its "
                        f"entries with '+', e.g. la:act_dict=gelu+relu (one entry: la:act_dict=gelu+).")
    if stream := [k for k in keys_that('stream') if k in given]:  # block_size
        raise UserError(f"variant '{label}' sets {stream[0]}, which fixes the batches and validation windows every "
                        f"variant is paired on; give --{stream[0]} to all of them instead.")
    return {'ffn': name, **{k: cfg[k] for k in given}}


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
    # the code it is to train with (fingerprint.code_hash); a report reads what the runs measured, whatever their code
    code = None if cfg['report'] else code_hash()
    return dict(variant=variant, seed=seed, lr=lr, name=name, dir=settings['out_dir'], processes=cfg['nproc_per_run'],
                settings=settings, code=code)


def codes_of(records):
    """The codes (fingerprint.code_hash) a run's tries trained with, as each try's first log line names it (None: not
    named)."""
    return {r['env'].get('code') for r in records if isinstance(r.get('env'), dict)}


@dataclass
class Run:
    """A run's spec and what its directory held when it was scanned. state, the one word for its outcome: 'done',
    'diverged' (its outcome at these settings), 'resume' (a checkpoint to continue from), 'scratch'
    (nothing yet), 'retrain' (a checkpoint whose log lines are gone, so its results cannot be read) or 'mismatch'
    (trained with other settings, with other code of activations.py or model.py, or on its dataset before it was
    prepared again)."""
    spec: dict
    state: str
    records: list  # log.jsonl's records
    damaged: list  # log.jsonl's lines that are not records, set aside
    checkpoint: dict | None  # ckpt.pt, memory-mapped (its tensors are read only if used), None if none is readable
    intent: dict  # compare.json, {} if none
    found: dict | None  # the identity the directory holds, None if it holds none
    other_data: bool = False  # trained on its dataset before it was prepared again (data_now)
    other_code: bool = False  # a try of it trained with other code than the spec's (fingerprint.code_hash)

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
        if self.other_data:
            return (f"{self.dir} was trained on other data: its checkpoint's meta.json or its validation windows are "
                    f"not those of {self.settings['dataset']} as it is prepared now")
        if self.other_code:  # None: a try that logged no code (before runs logged it)
            return (f"{self.dir} was trained with other code of {' or '.join(IDEAS)} than this comparison's"
                    if codes_of(self.records) - {None, self.spec['code']} else
                    f"{self.dir} does not say which code of {' or '.join(IDEAS)} it was trained with")
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
    intent, intent_path = {}, os.path.join(d, INTENT)
    with reading(intent_path, hint):
        if os.path.exists(intent_path):
            with open(intent_path, encoding='utf-8') as f:
                intent = {**json.load(f)}
        found, saved = (identity(intent['settings'], intent['processes']) if intent and records else None), None
    if ckpt is not None:  # what it is, from its checkpoint once it has one
        with reading(os.path.join(d, CKPT), hint):
            found, saved = identity(ckpt['config'], ckpt['world_size']), ckpt['iter_num']
    evaluated = lambda it: any(r['iter'] == it and 'val_loss' in r for r in records)
    logged, other_data = next((r['val_hash'] for r in reversed(records) if 'val_hash' in r), None), False
    if found == wanted and (logged is not None or ckpt is not None):
        meta, val_hash = data_now(spec['settings'])
        other_data = (ckpt is not None and ckpt.get('meta') != meta) or logged not in (None, val_hash)
    other_code = spec['code'] is not None and found == wanted and bool(records) and codes_of(records) != {spec['code']}
    if found is not None and found != wanted or other_data or other_code:
        state = 'mismatch'
    elif saved == spec['settings']['max_iters'] and evaluated(saved):
        state = 'done'
    elif os.path.exists(os.path.join(d, DIVERGED)):  # train.py's note
        state = 'diverged'
    elif saved is None:
        state = 'scratch'
    else:
        state = 'resume' if evaluated(saved) else 'retrain'
    return Run(spec, state, records, damaged, ckpt, intent, found, other_data, other_code)


def command_line(spec, mode):
    """A run's exact command: train.py with every setting explicit and absolute paths, so that it runs the same from
    anywhere, through torchrun for several processes. mode: 'scratch', 'resume' or 'overwrite' (what the dir holds)."""
    settings = {**spec['settings'], 'out_dir': os.path.abspath(spec['dir']),
                'data_dir': os.path.abspath(spec['settings']['data_dir']),
                'init_from': 'resume' if mode == 'resume' else 'scratch', 'overwrite': mode == 'overwrite'}
    n = spec['processes']
    launch = [sys.executable] + (['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={n}'] if n > 1 else [])
    return launch + [TRAIN_PY] + to_argv(settings)


def to_argv(settings):
    """Settings as --key=value arguments that cli.parse_args reads back as the same values: the one way a settings dict
    becomes a command line."""
    text = lambda v: 'auto' if v is None else v if isinstance(v, str) else repr(v)
    return [f'--{k}={text(v)}' for k, v in settings.items()]
