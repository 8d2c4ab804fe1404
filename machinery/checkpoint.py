"""
A run's checkpoint, ckpt.pt: everything an exact continuation needs (weights, optimizer, every process's RNG and data
stream), written by train.py at an evaluation and read back by a resume, sample.py, inspect_run.py and a comparison,
each through load_checkpoint.

A checkpoint holds tensors and plain Python values only, so torch.load(weights_only=True) reads it without running code.
What train.py wrote is trusted, but caught: its contents are used only inside `loading`, where each state's owner checks
it as it loads (load_state_dict(strict=True), the RNG setters, the data loader's load_state_dict) and any failure
becomes one sentence naming the file. Nothing on disk changes before a resume has loaded everything (open_for_try).
"""
import os
import random

import numpy as np
import torch
import torch.distributed as dist

from configurator import DEFAULTS, MODEL_KEYS, STREAM_KEYS, TYPES, min_params, model_config
from machinery import files
from machinery.cli import UserError, coerce
from machinery.run_log import LOG, clear_stopped, truncate_log
from model import GPT

CKPT = 'ckpt.pt'
HINT = 'train the run again, or point --out_dir at the right run directory'


def loading(path, hint=HINT):
    """The block that uses a checkpoint's contents: any failure there is one sentence naming path (files.reading)."""
    return files.reading(path, hint)


def damage_if_refused(read):
    """read(), where the checks of a person's settings (a UserError) find the checkpoint's own settings damaged."""
    try:
        return read()
    except UserError as e:
        raise ValueError(e) from None


def load_checkpoint(out_dir, missing_hint, mmap=False, hint=HINT):
    """The one reader of out_dir/ckpt.pt: the dict train.py saved, or a UserError where it cannot be read (hint: what
    to do then) or, with a missing_hint saying what to do, where there is none (None without one). mmap: its tensors
    stay on disk until used (a comparison reads many checkpoints for their plain fields)."""
    path = os.path.join(out_dir, CKPT)
    if not os.path.exists(path):
        if missing_hint is None:
            return None
        raise UserError(f"there is no checkpoint at {path}; {missing_hint}")
    with loading(path, hint):
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=mmap)
        return {**ckpt}  # a dict, or a failure here


def rng_state(device_type):
    # plain Python types and tensors only, so the checkpoint loads with torch.load(weights_only=True)
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {'python': random.getstate(), 'numpy': [name, keys.tolist(), pos, has_gauss, cached],
             'torch': torch.get_rng_state()}
    if device_type == 'cuda':
        state['cuda'] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state, device_type):
    random.setstate(tuple(v if not isinstance(v, list) else tuple(v) for v in state['python']))
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state['torch'])
    if device_type == 'cuda' and 'cuda' in state:
        torch.cuda.set_rng_state(state['cuda'])


def save_checkpoint(r, val_loss):
    """Write the checkpoint of train.py's run r at its current iteration (CHECKPOINT): its plain model's weights, its
    optimizer and loss scaler, its settings and counters, and every process's RNG and loader state (the master
    writes). A Ctrl-C waits for it, and a failed write leaves the previous checkpoint whole (write_checkpoint)."""
    states = [mine := {'rng': rng_state(r.hw.device_type), 'loader': r.loader.state_dict()}]
    if r.hw.ddp:
        states = [None] * r.hw.world_size
        dist.all_gather_object(states, mine)
    if r.master:
        write_checkpoint({
            'model': model_state(r.raw_model.state_dict()), 'optimizer': r.optimizer.state_dict(),
            'scaler': r.scaler.state_dict() if r.scaler.is_enabled() else None, 'model_args': r.model_args,
            'config': r.cfg, 'meta': r.loader.meta,  # meta: the tokenizer, to sample
            'iter_num': r.iter_num, 'best_val_loss': r.best_val_loss, 'val_loss': val_loss, 'tokens': r.tokens,
            'train_time': r.train_time, 'world_size': r.hw.world_size,
            'compiled': r.compiled,  # whether its times are compiled or eager times
            'rng': [s['rng'] for s in states], 'loader': [s['loader'] for s in states], 'log_lines': r.log_lines,
        }, r.out_dir)
    r.saved_iter = r.iter_num


def write_checkpoint(ckpt, out_dir):
    with files.ctrl_c_held():
        files.write_file(os.path.join(out_dir, CKPT), lambda f: _torch_save(ckpt, f), binary=True)


def open_for_try(out_dir, saved_iter):
    """out_dir made ready for a new try of its run (by the process that locked it, once everything the run needs has
    been checked): the note of an earlier stop and any half-written checkpoint go; a resumed run (saved_iter, its
    checkpoint's iteration) keeps the log lines up to its checkpoint, a new one starts an empty log and its old
    checkpoint goes now, so that a resume can never join it to the new log. Returns the log's lines."""
    clear_stopped(out_dir)
    files.remove_dead_temps(out_dir)  # a save killed mid-write
    lines = truncate_log(os.path.join(out_dir, LOG), -1 if saved_iter is None else saved_iter)
    if saved_iter is None and os.path.exists(os.path.join(out_dir, CKPT)):
        os.remove(os.path.join(out_dir, CKPT))
    return lines


def resumed_settings(cfg, given, ckpt):
    """A resumed run's settings: the checkpoint's, with only the keys given explicitly on top; its model keys and data
    stream cannot change."""
    with loading(os.path.join(cfg['out_dir'], CKPT)):  # its settings read as a command line's are
        saved = damage_if_refused(lambda: {k: coerce(k, v, TYPES.get(k, type(DEFAULTS[k])), DEFAULTS[k], 'its config: ')
                                           for k, v in ckpt['config'].items() if k in DEFAULTS})
        kept = {**{k: saved[k] for k in STREAM_KEYS}, **{k: ckpt['model_args'][k] for k in MODEL_KEYS}}
    for key, was in kept.items():
        if key in given and cfg[key] != was and not (key == 'vocab_size' and cfg[key] == 0):
            raise UserError(f"--{key}={cfg[key]} differs from the checkpoint's {was!r}; a resumed run keeps its "
                            f"model and data stream, so drop --{key} or train a new run in another out_dir.")
    resumed = {**DEFAULTS, **saved, **{k: cfg[k] for k in given}}
    return {**resumed, 'init_from': 'resume', 'out_dir': cfg['out_dir']}  # the run may have been moved since


def model_args(cfg, meta, ckpt):
    """The model keys of a run: its checkpoint's, or its settings' with vocab_size 0 as the dataset's (meta)."""
    if ckpt is not None:
        vocabulary = lambda m: [m.get(k) for k in ('tokenizer', 'vocab_size', 'itos')]
        with loading(os.path.join(cfg['out_dir'], CKPT)):
            same, args = vocabulary(ckpt['meta']) == vocabulary(meta), dict(ckpt['model_args'])
        if not same:
            raise UserError(f"{cfg['dataset']} has another vocabulary than this run trained on (prepared again?); "
                            f"resume with the data it trained on, or train a new run in another out_dir.")
        return args
    if 0 < cfg['vocab_size'] < meta['vocab_size']:
        raise UserError(f"--vocab_size={cfg['vocab_size']} is smaller than the dataset's {meta['vocab_size']} tokens; "
                        f"leave it at 0 to take the dataset's.")
    return {**{k: cfg[k] for k in MODEL_KEYS}, 'vocab_size': cfg['vocab_size'] or meta['vocab_size']}


def restore(ckpt, r):
    """A resume of train.py's run r from its checkpoint: the optimizer's moments (its settings, weight_decay and betas
    and the device's fused kernel, are this run's), the loss scaler, the counters, and this process's data stream and
    RNG, exactly when the run has as many processes as the one that saved it (else the stream continues, re-split,
    and dropout's RNG does not). Each is checked by its owner as it loads."""
    with loading(r.ckpt_path):
        saved = ckpt['optimizer']
        built = [{k: v for k, v in g.items() if k != 'params'} for g in r.optimizer.param_groups]
        # merged before loading, which places each state by its group's kernel
        r.optimizer.load_state_dict({**saved, 'param_groups': [{**s, **b} for s, b in zip(saved['param_groups'],
                                                                                           built)]})
        for p, state in r.optimizer.state.items():  # torch checks neither a moment's shape nor the steps taken
            if not (sorted(state) == ['exp_avg', 'exp_avg_sq', 'step'] and state['exp_avg'].shape == p.shape
                    and state['exp_avg_sq'].shape == p.shape and 0 <= state['step'] <= ckpt['iter_num']):
                raise ValueError("its optimizer's state is not that of AdamW on this model after its steps")
        if ckpt.get('scaler'):
            r.scaler.load_state_dict(ckpt['scaler'])
        r.iter_num, r.best_val_loss, r.tokens, r.train_time = (ckpt[k] for k in ('iter_num', 'best_val_loss',
                                                                                 'tokens', 'train_time'))
        same = ckpt['world_size'] == r.hw.world_size
        r.loader.load_state_dict(ckpt['loader'][r.hw.rank if same else 0], r.tokens)
        if same:
            set_rng_state(ckpt['rng'][r.hw.rank], r.hw.device_type)  # after the model's init used the RNG
    r.saved_iter = r.iter_num
    if not same and r.master:
        print(f"note: the checkpoint was written by {ckpt['world_size']} process(es), this run has "
              f"{r.hw.world_size}; the data stream continues, dropout randomness does not.")


def _torch_save(obj, f):
    try:
        torch.save(obj, f)
    except RuntimeError as e:  # torch.save's writer reports a failed write (a full disk) as a RuntimeError
        raise OSError(getattr(e.__context__, 'errno', None), getattr(e.__context__, 'strerror', None) or
                      'the write failed, e.g. the disk is full') from None


def model_state(state_dict):
    """A checkpoint's weights as a plain GPT's state dict: a compiled model's keys carry '_orig_mod.' and a DDP one's
    'module.', at the start or (regional compilation) inside."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ('_orig_mod.', 'module.'):
            while k.startswith(prefix):
                k = k[len(prefix):]
            k = k.replace('.' + prefix, '.')
        out[k] = v
    return out


def checkpoint_model(ckpt, path):
    """The GPT a checkpoint describes (its model_args), holding its weights: load_state_dict(strict=True) checks that
    they fit it, and a checkpoint only ever holds finite weights."""
    with loading(path):
        config, weights = damage_if_refused(lambda: model_config(ckpt['model_args'])), model_state(ckpt['model'])
        if sum(v.numel() for v in weights.values()) < min_params(config):  # refused before building a model that big
            raise ValueError(f"its weights hold fewer values than the {min_params(config):,} parameters of the model "
                             f"its model_args describe")
        model = GPT(config)
        model.load_state_dict(weights)
    if not all(bool(p.isfinite().all()) for p in model.parameters()):
        raise UserError(f"the checkpoint {path} (iteration {ckpt['iter_num']}) holds non-finite weights, so it cannot "
                        f"be used; train the run again with a lower learning_rate.")
    return model
