"""
Settings: every key a training run takes, with its default and type, and the checks a run's settings pass before
anything is built or written. The model's keys are the fields of model.GPTConfig; how a command line and config
files set them is cli.py.
"""
import dataclasses
import math
import os
from decimal import Decimal

import torch

import device
from activations import VARIANTS, check_variant, make_activations
from cli import UserError, coerce, parse_args, split_list
from model import GPT, GPTConfig
from rundir import CKPT, model_state, read_json

TRAIN_DEFAULTS = dict(
    # I/O
    out_dir='out',
    init_from='scratch',  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
    overwrite=False,  # allow a scratch run to replace an existing out_dir/ckpt.pt
    always_save_checkpoint=True,  # if False, only save when val loss improves
    eval_interval=250,  # iterations between evaluations (+ checkpoints); the last iteration is always evaluated
    eval_iters=20,  # validation batches per evaluation (fixed windows: the same tokens for every run)
    log_interval=10,  # iterations between log lines
    # data
    dataset='shakespeare_char',
    data_dir='data',  # prepared datasets live in data_dir/dataset/ (train_*.bin, val_*.bin, meta.json)
    batch_size=12,  # per micro-step, per process
    gradient_accumulation_steps=1,  # per process
    # AdamW
    learning_rate=6e-4,
    max_iters=5000,
    weight_decay=1e-1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,  # clip gradients at this norm, 0 disables
    # learning-rate schedule
    schedule='cosine',  # 'cosine' | 'wsd' (warmup-stable-decay) | 'constant' (after warmup)
    warmup_iters=100,
    lr_decay_iters=0,  # where the schedule reaches min_lr; 0 means max_iters
    decay_frac=0.2,  # wsd: linear decay over this last fraction of lr_decay_iters
    min_lr=6e-5,
    # system
    device='auto',  # 'auto' (cuda, then mps, then cpu) | 'cpu' | 'cuda' | 'cuda:N' | 'mps'
    dtype='auto',  # 'auto' (bfloat16 where supported, else float32) | 'float32' | 'bfloat16' | 'float16'
    compile=None,  # None = auto: on for CUDA, off elsewhere (--compile=True compiles on a CPU too)
    compile_mode='regional',  # 'regional' (each Block compiled; one graph serves every layer) | 'whole' (the GPT)
    peak_flops=0.0,  # FLOP/s for MFU; 0 = the GPU's dense peak for the dtype, by its name (device.PEAK_FLOPS), else null
    seed=1337,
    # Weights & Biases (nanoGPT's keys; wandb is imported only when wandb_log is on)
    wandb_log=False,  # log every log.jsonl record to wandb too (WANDB_MODE=offline works without network)
    wandb_project='nanoffn',
    wandb_run_name='',  # '' = the out_dir's name
    wandb_group='',  # runs that belong together (compare.py sets one per comparison)
    wandb_tags='',  # comma-separated
)
MODEL_KEYS = [f.name for f in dataclasses.fields(GPTConfig)]
# every field of GPTConfig is a key too; vocab_size 0 = the dataset's vocabulary (meta.json)
DEFAULTS = {**TRAIN_DEFAULTS, **{f.name: f.default for f in dataclasses.fields(GPTConfig)}, 'vocab_size': 0}
TYPES = {'compile': bool}  # keys whose default (None = auto) does not tell their type
STREAM_KEYS = ['dataset', 'batch_size', 'block_size', 'seed']  # what fixes the training batches: a resume keeps them
MAX_SEED = 2**31 - 1  # numpy seeds take 32 bits; DDP ranks add their rank to the seed


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


def variant_settings(label):
    """The settings a variant of a comparison stands for: a name of activations.VARIANTS, optionally carrying model
    settings of its own, so that one comparison can vary them: 'polyrelu:poly_order=2' -> {'ffn': 'polyrelu',
    'poly_order': 2}."""
    name, *own = label.split(':')
    try:
        check_variant(name)
    except ValueError as e:
        raise UserError(f"{e}.") from None
    keys = {k: DEFAULTS[k] for k in MODEL_KEYS if k != 'ffn'}
    try:
        cfg, given = parse_args(keys, [f'--{item}' for item in own], prog='compare.py')
    except UserError as e:
        raise UserError(f"variant '{label}': {str(e).rstrip('.')} (a variant carries model settings as "
                        f"name:key=value, e.g. polyrelu:poly_order=2).") from None
    return {'ffn': name, **{k: cfg[k] for k in given}}


def model_config(settings):
    """The GPTConfig of a run's settings (a dict with every model key), or the UserError of its first bad value."""
    try:
        return GPTConfig(**{k: settings[k] for k in MODEL_KEYS})
    except ValueError as e:
        raise UserError(f"{str(e).rstrip('.')}.") from None


def dataset_vocab(dataset, data_dir):
    """The vocab_size in a prepared dataset's meta.json; 0 where it cannot be read (the loader says why)."""
    vocab = (read_json(os.path.join(data_dir, dataset, 'meta.json')) or {}).get('vocab_size')
    return vocab if type(vocab) is int and vocab > 0 else 0


def meta_model(settings, data_dir):
    """A run's GPT on the meta device (shapes, no memory); vocab_size 0 is the dataset's (its meta.json)."""
    with torch.device('meta'):
        return GPT(model_config({**settings, 'vocab_size': settings['vocab_size'] or
                                 dataset_vocab(settings['dataset'], data_dir)}))


def min_params(c):
    """A lower bound of GPT(c)'s parameters from its settings alone: the token embedding (tied to the output layer),
    a learned position table, each block's attention (4d²) and FFN matrices (2dm, gated 3dm; an MoE layer's E experts
    of width moe_hidden and its router); norms, biases and activation extras are left out."""
    d, L, mats = c.n_embd, c.n_layer, 3 if VARIANTS[c.ffn].gated else 2
    moe = len(range(0, L, c.moe_every)) if c.n_expert else 0
    return (d * (c.padded_vocab_size + c.block_size * (c.pos == 'learned')) + 4 * d * d * L
            + (L - moe) * mats * d * c.ffn_hidden + moe * c.n_expert * d * (mats * c.moe_hidden + 1))


def memory_needs(cfg, c):
    """A run's memory in bytes, before anything is allocated: (model, batch) parts of a lower bound, and an estimate
    of its peak. The bound: 16 bytes a parameter (fp32 weights, gradients and AdamW's two moments; min_params), RoPE's
    fp32 tables (cos and sin, block_size x head size / 2, in every layer), and what a batch certainly holds, its fp32
    logits and the int64 validation windows (inputs and targets). The estimate adds the activations kept for
    backward, about 34·d bytes a token and layer in 16-bit, twice that in fp32 (Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", with flash attention's memory)."""
    model = 16 * min_params(c) + (4 * c.n_layer * c.block_size * (c.n_embd // c.n_head) if c.pos == 'rope' else 0)
    batch = cfg['batch_size'] * cfg['block_size'] * (4 * c.padded_vocab_size + 16 * cfg['eval_iters'])
    activations = cfg['batch_size'] * cfg['block_size'] * c.n_layer * 34 * c.n_embd * (
        2 if cfg['dtype'] == 'float32' else 1)
    return model, batch, model + batch + activations


def check_memory(cfg, c, where=None):
    """Refuse a run that cannot fit in its device's memory (memory_needs' lower bound) before anything is allocated:
    against the device's total memory, or, given the device a run has set up (`where`), against what is free there
    now."""
    free = where is not None
    try:
        have = device.memory_bytes(where, free) if free else device.memory_bytes(
            where := device.resolve_device(cfg['device']))
    except UserError:  # not a device of this machine (compare.py --plan for another): the run says so where it runs
        return
    model, batch, _ = memory_needs(cfg, c)
    if model + batch > have:
        gb = lambda n: f"{Decimal(n) / 10**9:.3g} GB"  # Decimal: the sizes can be ints beyond any float
        lower = ('n_layer, n_embd, ffn_mult, n_expert or vocab_size' if model > batch else
                 'batch_size, block_size or eval_iters')
        holder = 'this machine' if where in ('cpu', 'mps') else 'the GPU ' + where
        raise UserError(f"this run needs at least {gb(model + batch)} of memory: {gb(model)} for a model of at least "
                        f"{Decimal(min_params(c)):.3g} parameters (16 bytes each: fp32 weights, gradients and AdamW's "
                        f"two moments) and RoPE's tables, {gb(batch)} for a batch's logits and the validation windows; "
                        f"{holder} has {gb(have)}{' free' if free else ''}, so lower {lower}.")


def scale_counts(model):
    """The sizes a ladder is drawn against: N = non-embedding parameters (less the tied token embedding and any
    position embedding, Kaplan et al. 2020), total and active (an MoE), and the model's training FLOPs per token."""
    p = model.param_report()
    return {'non_embedding': p['total'] - p['embedding'], 'non_embedding_active': p['active'] - p['embedding'],
            'flops_per_token': model.flops_per_token()}


def check(cfg):
    """Catch the mistakes a run's settings can make, before anything is built or written."""
    for key, choices in (('init_from', ('scratch', 'resume')), ('schedule', ('cosine', 'wsd', 'constant')),
                         ('compile_mode', ('regional', 'whole'))):
        if cfg[key] not in choices:
            raise UserError(f"--{key} expects {' or '.join(choices)}, got '{cfg[key]}'.")
    if not cfg['out_dir'].strip():
        raise UserError("--out_dir is empty; give the run's directory, e.g. --out_dir=out-gelu.")
    if os.path.exists(cfg['out_dir']) and not os.path.isdir(cfg['out_dir']):
        raise UserError(f"--out_dir={cfg['out_dir']} is a file, not a directory; choose another --out_dir.")
    for key in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters',
                'log_interval', 'n_layer', 'n_head', 'n_embd'):
        if cfg[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {cfg[key]}.")
    for key in ('max_iters', 'warmup_iters', 'lr_decay_iters', 'vocab_size'):
        if cfg[key] < 0:
            raise UserError(f"--{key} must not be negative, got {cfg[key]}.")
    if not 0.0 <= cfg['decay_frac'] <= 1.0:
        raise UserError(f"--decay_frac must be between 0 and 1, got {cfg['decay_frac']}.")
    for key in ('learning_rate', 'min_lr', 'weight_decay', 'grad_clip', 'peak_flops', 'aux_loss_weight',
                'z_loss_weight'):
        if not (math.isfinite(cfg[key]) and cfg[key] >= 0):  # `not >=` also catches NaN
            raise UserError(f"--{key} must be a finite number >= 0, got {cfg[key]}.")
    for key in ('beta1', 'beta2'):  # AdamW's moment decay rates (Loshchilov & Hutter 2019) lie in [0, 1)
        if not 0.0 <= cfg[key] < 1.0:
            raise UserError(f"--{key} must be in [0, 1), got {cfg[key]}.")
    if not 0 <= cfg['seed'] <= MAX_SEED:
        raise UserError(f"--seed must be between 0 and {MAX_SEED}, got {cfg['seed']}.")
    config = model_config({**cfg, 'vocab_size': cfg['vocab_size'] or dataset_vocab(cfg['dataset'], cfg['data_dir'])})
    check_memory(cfg, config)
    try:  # the activation's settings (poly_order, act_dict, la_init, moa_gate) are checked as it is built
        make_activations(config)
    except ValueError as e:
        raise UserError(f"{str(e).rstrip('.')}.") from None
    if cfg['wandb_log']:  # imported now, before a run replaces anything, and only when asked for
        try:
            import wandb  # noqa: F401
        except Exception as e:
            raise UserError(f"--wandb_log=True needs the wandb package, which cannot be imported here "
                            f"({type(e).__name__}: {e}); pip install wandb, or drop --wandb_log.") from None


# what train.py writes into ckpt.pt that its readers use (a resume, sample.py, inspect_run.py), checked as it is read
CHECKPOINT = {'model': dict, 'optimizer': dict, 'model_args': dict, 'config': dict, 'meta': dict, 'iter_num': int,
              'best_val_loss': (int, float), 'tokens': int, 'train_time': (int, float), 'world_size': int,
              'rng': list, 'loader': list}
CHECKPOINT_KEYS = {'config': STREAM_KEYS + ['data_dir'], 'model_args': MODEL_KEYS}  # the settings read from them
# each process's states, as their writers make them (train.rng_state, DataLoader.state_dict), so that a resume hands
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


def load_checkpoint(out_dir, missing_hint):
    """out_dir/ckpt.pt as written by train.py (checkpoint_fault; its weights are checked by checkpoint_model), or a
    UserError: `missing_hint` says what to do if there is none.
    weights_only: a checkpoint holds tensors and plain Python values only, so loading one cannot run code."""
    path = os.path.join(out_dir, CKPT)
    if not os.path.exists(path):
        raise UserError(f"there is no checkpoint at {path}; {missing_hint}")
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        raise UserError(f"cannot read the checkpoint {path} ({type(e).__name__}); it is not a train.py checkpoint or "
                        f"it is damaged, so train the run again.") from None
    if fault := checkpoint_fault(ckpt):
        raise unusable(path, fault)
    if not all(bool(v.isfinite().all()) for v in ckpt['model'].values() if v.is_floating_point()):
        raise UserError(f"the checkpoint {path} (iteration {ckpt['iter_num']}) holds non-finite weights, so it "
                        f"cannot be used; train the run again with a lower learning_rate.")
    return ckpt


def unusable(path, fault):
    """The refusal of a checkpoint that is not as train.py writes it: fault says where, in words."""
    return UserError(f"cannot use the checkpoint {path}: {fault}, so it is not a train.py checkpoint or it is damaged; "
                     f"train the run again, or point --out_dir at the right run directory.")


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
