"""
Settings: every key a training run takes, with its default and type, and the checks a run's settings pass before
anything is built or written. The model's keys are the fields of model.GPTConfig; how a command line and config
files set them is machinery/cli.py.
"""
import dataclasses
import math
import os
from decimal import Decimal

import torch

from activations import VARIANTS, check_variant, make_activations
from machinery import device
from machinery.checkpoint import CKPT, loading, model_state
from machinery.cli import UserError, coerce, parse_args, split_list
from machinery.files import read_json
from model import GPT, GPTConfig

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
    dtype='auto',  # 'auto' (CUDA: bfloat16 at compute capability 8.0+, else float16; float32 elsewhere) | 'float32' |
    # 'bfloat16' | 'float16'
    compile=None,  # None = auto: on for CUDA, off elsewhere (--compile=True compiles on a CPU too)
    compile_mode='regional',  # 'regional' (each Block compiled; one graph serves every layer) | 'whole' (the GPT)
    peak_flops=0.0,  # FLOP/s for MFU; 0 = the GPU's dense peak for the dtype, by its name (device.PEAK_FLOPS), else null
    threads=0,  # torch's CPU threads; 0 = OMP_NUM_THREADS where set, else half the cores (device.set_threads)
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


def variant_rates(text, key):
    """{label: its rate, None where it carries none} of a comma-separated list of variants (--variants, --tuned_lrs),
    each perhaps carrying a learning rate after '@' (gelu@8e-3, polyrelu:poly_order=2@8e-3); each label checked by
    variant_settings, once."""
    out = {}
    for item in split_list(text):
        label, at, rate = item.rpartition('@') if '@' in item else (item, '', '')
        variant_settings(label)
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


def at_rate(settings, lr):
    """The learning-rate settings of a run at peak rate lr instead of settings' own: min_lr keeps its ratio to it."""
    return {'learning_rate': lr, 'min_lr': settings['min_lr'] * lr / settings['learning_rate'] if settings[
        'learning_rate'] else settings['min_lr']}


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
    backward: 34·d bytes a token and layer in 16-bit (Korthikanti et al. 2022, "Reducing Activation Recomputation in
    Large Transformer Models", with flash attention's memory), less its two 1-byte dropout masks, plus 4·d as the two
    norms' inputs are the fp32 residual stream under autocast: 36·d; in fp32, 64·d (32·d of 16-bit values, doubled).
    At GPT-2 small's shape (bench.py, batch 16 x 1024, bf16) that is 9.98 GiB against a measured peak of 10.55 GiB
    (BENCHMARKS.md, GPU); other shapes are not measured."""
    model = 16 * min_params(c) + (4 * c.n_layer * c.block_size * (c.n_embd // c.n_head) if c.pos == 'rope' else 0)
    batch = cfg['batch_size'] * cfg['block_size'] * (4 * c.padded_vocab_size + 16 * cfg['eval_iters'])
    activations = cfg['batch_size'] * cfg['block_size'] * c.n_layer * c.n_embd * (
        64 if cfg['dtype'] == 'float32' else 36)
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
    for key in ('max_iters', 'warmup_iters', 'lr_decay_iters', 'vocab_size', 'threads'):
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


# ----------------------------------------------------------------------------------------------------------------------
# a run's settings and model from its checkpoint (read by machinery/checkpoint.py)


def damage_if_refused(read):
    """read(), where the checks of a person's settings (a UserError) find the checkpoint's own settings damaged."""
    try:
        return read()
    except UserError as e:
        raise ValueError(e) from None


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
