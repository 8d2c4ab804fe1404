"""
A run's checkpoint, ckpt.pt: everything an exact continuation needs (weights, optimizer, every process's RNG and data
stream), written by train.py at an evaluation and read back by a resume, sample.py, inspect_run.py and a comparison,
each through load_checkpoint, which checks it against its schema (CHECKPOINT) before anything uses it.

A checkpoint holds tensors and plain Python values only, so torch.load(weights_only=True) reads it without running code.
"""
import os
import random

import numpy as np
import torch
import torch.distributed as dist

from configurator import DEFAULTS, MAX_SEED, MODEL_KEYS, STREAM_KEYS, TYPES, min_params, model_config
from machinery import files
from machinery.cli import UserError, coerce
from machinery.run_log import LOG, clear_stopped, truncate_log
from model import GPT

CKPT = 'ckpt.pt'


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
    for name in os.listdir(out_dir):
        if name.startswith(f'.{CKPT}.tmp'):  # a save killed mid-write
            os.remove(os.path.join(out_dir, name))
    lines = truncate_log(os.path.join(out_dir, LOG), -1 if saved_iter is None else saved_iter)
    if saved_iter is None and os.path.exists(os.path.join(out_dir, CKPT)):
        os.remove(os.path.join(out_dir, CKPT))
    return lines


def resumed_settings(cfg, given, ckpt):
    """A resumed run's settings: the checkpoint's, with only the keys given explicitly on top; its model keys and data
    stream cannot change."""
    saved = ckpt['config']
    for key in MODEL_KEYS + STREAM_KEYS:
        was = ckpt['model_args'].get(key) if key in MODEL_KEYS else saved.get(key)
        if key in given and cfg[key] != was and not (key == 'vocab_size' and cfg[key] == 0):
            raise UserError(f"--{key}={cfg[key]} differs from the checkpoint's {was!r}; a resumed run keeps its "
                            f"model and data stream, so drop --{key} or train a new run in another out_dir.")
    resumed = {**DEFAULTS, **{k: v for k, v in saved.items() if k in DEFAULTS}, **{k: cfg[k] for k in given}}
    return {**resumed, 'init_from': 'resume', 'out_dir': cfg['out_dir']}  # the run may have been moved since


def model_args(cfg, meta, ckpt):
    """The model keys of a run: its checkpoint's, or its settings' with vocab_size 0 as the dataset's (meta)."""
    if ckpt is not None:
        vocabulary = lambda m: [m.get(k) for k in ('tokenizer', 'vocab_size', 'itos')]
        if vocabulary(ckpt['meta']) != vocabulary(meta):
            raise UserError(f"{cfg['dataset']} has another vocabulary than this run trained on (prepared again?); "
                            f"resume with the data it trained on, or train a new run in another out_dir.")
        return dict(ckpt['model_args'])
    if 0 < cfg['vocab_size'] < meta['vocab_size']:
        raise UserError(f"--vocab_size={cfg['vocab_size']} is smaller than the dataset's {meta['vocab_size']} tokens; "
                        f"leave it at 0 to take the dataset's.")
    return {**{k: cfg[k] for k in MODEL_KEYS}, 'vocab_size': cfg['vocab_size'] or meta['vocab_size']}


def restore(ckpt, r):
    """A resume of train.py's run r from its checkpoint: the optimizer's moments (its settings, weight_decay and betas
    and the device's fused kernel, are this run's), the loss scaler, the counters, and this process's data stream and
    RNG, exactly when the run has as many processes as the one that saved it (else the stream continues, re-split,
    and dropout's RNG does not)."""
    saved = ckpt['optimizer']
    built = [{k: v for k, v in g.items() if k != 'params'} for g in r.optimizer.param_groups]
    if fault := optimizer_fault(saved, r.optimizer):
        raise unusable(r.ckpt_path, fault)
    # merged before loading, which places each state by its group's kernel
    r.optimizer.load_state_dict({**saved, 'param_groups': [{**s, **b} for s, b in zip(saved['param_groups'], built)]})
    if ckpt.get('scaler'):
        r.scaler.load_state_dict(ckpt['scaler'])
    r.iter_num, r.best_val_loss, r.tokens, r.train_time = (ckpt[k] for k in ('iter_num', 'best_val_loss', 'tokens',
                                                                             'train_time'))
    r.saved_iter = r.iter_num
    if ckpt['world_size'] == r.hw.world_size:
        r.loader.load_state_dict(ckpt['loader'][r.hw.rank])
        set_rng_state(ckpt['rng'][r.hw.rank], r.hw.device_type)  # after the model's init used the RNG
    else:
        r.loader.load_state_dict(ckpt['loader'][0])
        if r.master:
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


# what train.py writes into ckpt.pt that its readers use (a resume, sample.py, inspect_run.py), checked as it is read
CHECKPOINT = {'model': dict, 'optimizer': dict, 'model_args': dict, 'config': dict, 'meta': dict, 'iter_num': int,
              'best_val_loss': (int, float), 'tokens': int, 'train_time': (int, float), 'world_size': int,
              'rng': list, 'loader': list}
CHECKPOINT_KEYS = {'config': STREAM_KEYS + ['data_dir'], 'model_args': MODEL_KEYS}  # the settings read from them
# each process's states, as their writers make them (checkpoint.rng_state, DataLoader.state_dict), so that a resume hands
# Python's random, numpy, torch and the loader nothing they would fail on deep inside
MT_WORDS = 624  # a Mersenne Twister's state: 624 32-bit words, and its position in them (Python's random, numpy's)
_int = lambda lo, hi=2**63 - 1: lambda v: type(v) is int and lo <= v <= hi
_words = lambda v: type(v) in (list, tuple) and len(v) == MT_WORDS and all(map(_int(0, 2**32 - 1), v))
_bytes = lambda v, n: isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and tuple(v.shape) == (n,)


def _python_rng(v):
    """random.getstate(): (version 3, the words and the position in them, the cached Gaussian or None)."""
    return (type(v) in (list, tuple) and len(v) == 3 and _int(3, 3)(v[0]) and type(v[1]) in (list, tuple)
            and _words(v[1][:-1]) and _int(0, MT_WORDS)(v[1][-1]) and (v[2] is None or type(v[2]) is float))


def _numpy_rng(v):
    """np.random.get_state() as a list: the generator's name, the words, the position, has_gauss, the cached
    Gaussian."""
    return (type(v) is list and len(v) == 5 and v[0] == 'MT19937' and _words(v[1]) and _int(0, MT_WORDS)(v[2])
            and _int(0, 1)(v[3]) and type(v[4]) is float)


RNG_STATE = {
    'python': _python_rng,
    'numpy': _numpy_rng,
    'torch': lambda v: _bytes(v, torch.get_rng_state().numel()),
    'cuda': lambda v: v is None or _bytes(v, 16),  # a GPU run's: the CUDA generator's seed and offset, 8 bytes each
}
LOADER_STATE = {'dataset': lambda v: type(v) is str, 'seed': _int(0, MAX_SEED), 'batch_size': _int(1),
                'block_size': _int(1), 'world_size': _int(1), 'step': _int(0),  # step: micro-batches returned
                'batch_hash': lambda v: type(v) is str and len(v) == 64 and set(v) <= set('0123456789abcdef')}
ADAMW_STATE = ('step', 'exp_avg', 'exp_avg_sq')  # what AdamW keeps per parameter: its steps (0-d) and two moments


def _states_fault(part, states, schema):
    """The first of a checkpoint's per-process states (its rng or loader) that is not as schema says, in words."""
    for rank, state in enumerate(states):
        if type(state) is not dict:
            return f"its {part}[{rank}] is a {type(state).__name__}"
        for key, valid in schema.items():
            if not valid(state.get(key)):
                shown = repr(state[key]) if key in state else 'missing'
                return f"its {part}[{rank}]['{key}'] is {shown if len(shown) <= 40 else 'not as train.py saves it'}"


def _optimizer_fault(optimizer):
    """The first part of a checkpoint's optimizer that is not as torch's Optimizer.state_dict writes it, in words:
    {'state': {id: {name: tensor}}, 'param_groups': [{'params': [id, ...], ...}, ...]}."""
    for key, kind in (('state', dict), ('param_groups', list)):
        if type(optimizer.get(key)) is not kind:
            return f"its optimizer's '{key}' is " + (f"a {type(optimizer[key]).__name__}" if key in optimizer
                                                     else 'missing')
    if not all(type(g) is dict and type(g.get('params')) is list and all(type(i) is int for i in g['params'])
               for g in optimizer['param_groups']):
        return "its optimizer's param_groups are not lists of parameter ids"
    ids = {i for g in optimizer['param_groups'] for i in g['params']}
    for i, state in optimizer['state'].items():
        if i not in ids or type(state) is not dict or not all(isinstance(t, torch.Tensor) for t in state.values()):
            return f"its optimizer's state[{i!r:.20}] is not the state of one of its parameters"


def checkpoint_fault(ckpt):
    """The first part of a loaded checkpoint that is not as CHECKPOINT says, in words; None if there is none. The
    settings in config and model_args are made the types of their keys, as a command line's are."""
    if not isinstance(ckpt, dict):
        return f"it holds a {type(ckpt).__name__}"
    for key, kind in CHECKPOINT.items():
        if not isinstance(ckpt.get(key), kind) or isinstance(ckpt[key], bool):
            return f"its '{key}' is " + (f"a {type(ckpt[key]).__name__}" if key in ckpt else 'missing')
    for part, needed in CHECKPOINT_KEYS.items():
        for key in dict.fromkeys(needed + [k for k in ckpt[part] if k in DEFAULTS]):
            if key not in ckpt[part]:
                return f"its {part} has no '{key}'"
            try:
                ckpt[part][key] = coerce(key, ckpt[part][key], TYPES.get(key, type(DEFAULTS[key])), DEFAULTS[key], '')
            except UserError:
                return f"its {part}['{key}'] is {ckpt[part][key]!r:.40}"
    if type(ckpt.get('compiled', False)) is not bool:  # read by a comparison's report (times compiled or eager)
        return f"its 'compiled' is a {type(ckpt['compiled']).__name__}"
    if not all(type(k) is str and isinstance(v, torch.Tensor) for k, v in ckpt['model'].items()):
        return "its 'model' holds more than named tensors"
    if not (type(ckpt['meta'].get('vocab_size')) is int and ckpt['meta']['vocab_size'] > 0):
        return "its meta has no vocab_size"
    if ckpt['iter_num'] < 0 or not len(ckpt['rng']) == len(ckpt['loader']) == ckpt['world_size'] > 0:
        return "its 'iter_num' is negative" if ckpt['iter_num'] < 0 else "its 'rng' and 'loader' are not per process"
    if fault := (_states_fault('rng', ckpt['rng'], RNG_STATE) or _states_fault('loader', ckpt['loader'], LOADER_STATE)
                 or _optimizer_fault(ckpt['optimizer'])):
        return fault
    try:
        model_config(ckpt['model_args'])
    except UserError as e:
        return f"its model_args describe no model ({str(e).rstrip('.')})"


def read_checkpoint(path, mmap=False):
    """The one reader of a ckpt.pt: (checkpoint, None) once it is read and found as CHECKPOINT says (checkpoint_fault),
    (None, why in words) where it cannot be read or is not, (None, None) where there is none. mmap: its tensors stay
    on disk until used (a comparison reads many checkpoints for their plain fields)."""
    if not os.path.exists(path):
        return None, None
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=mmap)
    except Exception as e:
        return None, f"it cannot be read ({type(e).__name__})"
    return (None, fault) if (fault := checkpoint_fault(ckpt)) else (ckpt, None)


def load_checkpoint(out_dir, missing_hint):
    """out_dir/ckpt.pt, read and checked (read_checkpoint), with finite weights (checkpoint_model checks their
    shapes), or a UserError: `missing_hint` says what to do if there is none."""
    path = os.path.join(out_dir, CKPT)
    ckpt, fault = read_checkpoint(path)
    if fault:
        raise unusable(path, fault)
    if ckpt is None:
        raise UserError(f"there is no checkpoint at {path}; {missing_hint}")
    if not all(bool(v.isfinite().all()) for v in ckpt['model'].values() if v.is_floating_point()):
        raise UserError(f"the checkpoint {path} (iteration {ckpt['iter_num']}) holds non-finite weights, so it "
                        f"cannot be used; train the run again with a lower learning_rate.")
    return ckpt


def unusable(path, fault, hint='train the run again, or point --out_dir at the right run directory'):
    """The refusal of a checkpoint that is not as train.py writes it: fault says where, in words, hint what to do."""
    return UserError(f"cannot use the checkpoint {path}: {fault}, so it is not a train.py checkpoint or it is damaged; "
                     f"{hint}.")


def optimizer_fault(saved, optimizer):
    """Where a checkpoint's optimizer state (checkpoint_fault checked its form) does not fit optimizer, the AdamW a
    resume built for its model, in words; None if it fits. torch checks the groups' sizes deep inside, and the
    moments' shapes not at all: a moment of another shape would fail the first step."""
    sizes = lambda groups: [len(g['params']) for g in groups]
    if sizes(saved['param_groups']) != sizes(optimizer.param_groups):
        return (f"its optimizer's param_groups hold {sizes(saved['param_groups'])} parameters where the model's "
                f"optimizer holds {sizes(optimizer.param_groups)}")
    params = dict(zip((i for g in saved['param_groups'] for i in g['params']),
                      (p for g in optimizer.param_groups for p in g['params'])))
    for i, state in saved['state'].items():
        shapes, want = ({k: list(t.shape) for k, t in state.items()},
                        dict(zip(ADAMW_STATE, ([], list(params[i].shape), list(params[i].shape)))))
        if shapes != want:
            return f"its optimizer's state[{i}] holds {shapes}, where AdamW keeps {want} for that parameter"


def checkpoint_model(ckpt, path):
    """The GPT a checkpoint from load_checkpoint describes (its model_args), holding its weights; a UserError naming
    the first tensor that does not fit it (another run's weights, one missing), before any is loaded."""
    config, weights = model_config(ckpt['model_args']), model_state(ckpt['model'])
    unfit = lambda why: UserError(
        f"the weights in {path} do not fit the model its model_args describe (n_layer {config.n_layer}, n_embd "
        f"{config.n_embd}, ffn {config.ffn}): {why}; they are another run's or were changed since, so train the run "
        f"again, or point --out_dir at the right run directory.")
    if sum(v.numel() for v in weights.values()) < min_params(config):  # refused before building a model that big
        raise unfit(f"they hold fewer values than its {min_params(config):,} parameters")
    model = GPT(config)
    wanted = model.state_dict()
    for name in [*wanted, *(k for k in weights if k not in wanted)]:
        got, want = (list(d[name].shape) if name in d else None for d in (weights, wanted))
        if got != want:
            raise unfit(f"{name} is {'missing' if got is None else got} there and "
                        f"{'not a weight' if want is None else want} in the model")
    model.load_state_dict(weights)
    return model
