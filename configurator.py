"""
Settings: every key a training run takes, with its default, type and what it is to a run (SETTINGS, the one table),
and the checks a run's settings pass before anything is built or written. The model's keys are the fields of
model.GPTConfig; how a command line and config files set them is machinery/cli.py.
"""
import math
import os
import re
from collections import namedtuple
from dataclasses import replace
from decimal import Decimal

from activations import VARIANTS, check_variant, make_activations
from machinery import device
from machinery.checkpoint import CKPT, loading
from machinery.cli import UserError, coerce
from machinery.files import read_json
from model import GPTConfig

Key = namedtuple('Key', 'default what type', defaults=('', None))  # type None: its default's
M = GPTConfig()  # the model's keys are GPTConfig's fields, and keep its defaults but vocab_size's (0: the dataset's)
# Every key a run takes: its default, and what it is (words): model (a field of GPTConfig), stream (it fixes the
# training batches or the validation windows: a resume keeps it), id (part of what a run is; where it lives, how it
# starts and runs, its threads, whether it is compiled, MFU's FLOP/s and the experiment tracking are not), tune (what a
# comparison's tuned rates depend on: what a run is but its variant, seed, the rate, its device, and how often it
# evaluates, logs and saves; eval_iters is in, as it splits the windows into the half a sweep chooses on and the half a
# comparison reports), shown (in a comparison's summary)
SETTINGS = dict(
    # I/O
    out_dir=Key('out'),
    init_from=Key('scratch'),  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
    overwrite=Key(False),  # allow a scratch run to replace an existing out_dir/ckpt.pt
    always_save_checkpoint=Key(True, 'id'),  # if False, only save when val loss improves
    eval_interval=Key(250, 'id shown'),  # iterations between evaluations (+ checkpoints); the last is always evaluated
    eval_iters=Key(20, 'stream id tune shown'),  # validation batches per evaluation (fixed windows, alike in every run)
    log_interval=Key(10, 'id'),  # iterations between log lines
    # data
    dataset=Key('shakespeare_char', 'stream id tune shown'),
    data_dir=Key('data'),  # prepared datasets live in data_dir/dataset/ (train_*.bin, val_*.bin, meta.json)
    batch_size=Key(12, 'stream id tune shown'),  # per micro-step, per process
    gradient_accumulation_steps=Key(1, 'id tune shown'),  # per process
    # AdamW
    learning_rate=Key(6e-4, 'id shown'),  # the peak rate, reached after warmup_iters
    max_iters=Key(5000, 'id tune shown'),  # optimizer steps in all
    weight_decay=Key(1e-1, 'id tune'),
    beta1=Key(0.9, 'id tune'),
    beta2=Key(0.95, 'id tune'),
    grad_clip=Key(1.0, 'id tune'),  # clip gradients at this norm, 0 disables
    # learning-rate schedule
    schedule=Key('cosine', 'id tune shown'),  # 'cosine' | 'wsd' (warmup-stable-decay) | 'constant' (after warmup)
    warmup_iters=Key(100, 'id tune shown'),  # a linear warmup to learning_rate
    lr_decay_iters=Key(0, 'id tune'),  # where the schedule reaches min_lr; 0 means max_iters
    decay_frac=Key(0.2, 'id tune'),  # wsd: linear decay over this last fraction of lr_decay_iters
    min_lr=Key(6e-5, 'id shown'),  # a comparison's tuning keeps its ratio to learning_rate instead
    # system
    device=Key('auto', 'id shown'),  # 'auto' (cuda, then mps, then cpu) | 'cpu' | 'cuda' | 'cuda:N' | 'mps'
    dtype=Key('auto', 'id tune shown'),  # auto: bfloat16 at compute capability 8.0+, float16 below, float32 off CUDA
    compile=Key(None, type=bool),  # auto (None): on for CUDA of capability 7.0+ (Triton's), else off (True: a CPU too)
    compile_mode=Key('regional'),  # 'regional' (each Block compiled; one graph serves every layer) | 'whole' (the GPT)
    peak_flops=Key(0.0),  # FLOP/s for MFU; 0 = the GPU's dense peak in the dtype by name (speed.PEAK_FLOPS), else null
    threads=Key(0),  # torch's CPU threads; 0 = OMP_NUM_THREADS where set, else half the cores (device.set_threads)
    seed=Key(1337, 'stream id'),  # of the batches' order, the init and dropout (each DDP rank adds its rank)
    # Weights & Biases (nanoGPT's keys; wandb is imported only when wandb_log is on)
    wandb_log=Key(False),  # log every log.jsonl record to wandb too (WANDB_MODE=offline works without network)
    wandb_project=Key('nanoffn'),
    wandb_run_name=Key(''),  # '' = the out_dir's name
    wandb_group=Key(''),  # runs that belong together (compare.py sets one per comparison)
    wandb_tags=Key(''),  # comma-separated
    # the model (model.GPTConfig)
    block_size=Key(M.block_size, 'model stream id tune shown'),
    vocab_size=Key(0, 'model id tune'),  # 0 = the dataset's vocabulary (its meta.json)
    n_layer=Key(M.n_layer, 'model id tune shown'),
    n_head=Key(M.n_head, 'model id tune shown'),
    n_embd=Key(M.n_embd, 'model id tune shown'),
    dropout=Key(M.dropout, 'model id tune'),
    bias=Key(M.bias, 'model id tune'),
    norm=Key(M.norm, 'model id tune'),
    pos=Key(M.pos, 'model id tune'),
    ffn=Key(M.ffn, 'model id'),  # a name in activations.VARIANTS (README's table); a comparison tunes a rate for each
    ffn_mult=Key(M.ffn_mult, 'model id tune'),
    poly_order=Key(M.poly_order, 'model id tune'),
    act_dict=Key(M.act_dict, 'model id tune'),
    la_init=Key(M.la_init, 'model id tune'),
    moa_gate=Key(M.moa_gate, 'model id tune'),
    n_expert=Key(M.n_expert, 'model id tune shown'),
    top_k=Key(M.top_k, 'model id tune shown'),
    moe_every=Key(M.moe_every, 'model id tune'),
    expert_hidden=Key(M.expert_hidden, 'model id tune'),
    aux_loss_weight=Key(M.aux_loss_weight, 'model id tune'),
    z_loss_weight=Key(M.z_loss_weight, 'model id tune'),
)
DEFAULTS = {k: key.default for k, key in SETTINGS.items()}
NOTES = (os.path.join(os.path.dirname(os.path.abspath(__file__)), 'model.py'), __file__)  # what each key is (--help)
TYPES = {k: key.type or type(key.default) for k, key in SETTINGS.items()}


def keys_that(what):
    """The keys whose SETTINGS entry says `what` (model, stream, id, tune or shown), in the table's order."""
    return [k for k, key in SETTINGS.items() if what in key.what.split()]


def refusal(e):
    """activations.py's ValueError as a command line's sentence: a key it names first is the flag that sets it."""
    text = str(e).rstrip('.')
    key = re.match(r'\w*', text)[0]  # poly_order must be ..., la_init=onehot starts ...
    return UserError(f"--{text}." if key in SETTINGS else f"{text}.")


MAX_SEED = 2**31 - 1  # numpy seeds take 32 bits; DDP ranks add their rank to the seed


def model_config(settings):
    """The GPTConfig of a run's settings (a dict with every model key), checked here, where a person's settings arrive
    (model.py trusts its config): the UserError of its first bad value."""
    c = GPTConfig(**{k: settings[k] for k in keys_that('model')})
    try:
        check_variant(c.ffn)
    except ValueError as e:
        raise refusal(e) from None
    if c.norm not in ("rmsnorm", "layernorm") or c.pos not in ("rope", "learned"):
        raise UserError("--norm must be rmsnorm or layernorm, --pos rope or learned.")
    if c.n_embd % c.n_head:
        raise UserError(f"--n_embd={c.n_embd} must be divisible by --n_head={c.n_head}.")
    if c.pos == "rope" and (c.n_embd // c.n_head) % 2:  # RoPE rotates channel pairs (i, i + head/2)
        raise UserError(f"RoPE needs an even head size, but n_embd/n_head = {c.n_embd}/{c.n_head} = "
                        f"{c.n_embd // c.n_head}; change n_embd or n_head, or use --pos=learned.")
    if not (c.ffn_mult > 0 and 1 <= c.ffn_mult * c.n_embd < 2**63):  # a width is an int64 dimension
        raise UserError(f"--ffn_mult={c.ffn_mult} must be positive and give an FFN 1 to 2**63 - 1 units wide.")
    if not 0.0 <= c.dropout < 1.0:
        raise UserError(f"--dropout={c.dropout} must be in [0, 1).")
    if c.n_expert < 0 or c.moe_every < 1 or c.expert_hidden < 0:
        raise UserError("--n_expert and --expert_hidden must be >= 0 and --moe_every >= 1.")
    if c.n_expert and not 1 <= c.top_k <= c.n_expert:
        raise UserError(f"--top_k={c.top_k} must be between 1 and --n_expert={c.n_expert}.")
    return c


def dataset_vocab(dataset, data_dir):
    """The vocab_size in a prepared dataset's meta.json; 0 where it cannot be read (the loader says why)."""
    vocab = (read_json(os.path.join(data_dir, dataset, 'meta.json')) or {}).get('vocab_size')
    return vocab if type(vocab) is int and vocab > 0 else 0


def check_vocab_size(cfg, vocab):
    """A new run's vocab_size must hold the dataset's vocabulary of vocab tokens (0: not known yet, not checked)."""
    if cfg['init_from'] == 'scratch' and 0 < cfg['vocab_size'] < vocab:
        raise UserError(f"--vocab_size={cfg['vocab_size']} is smaller than the dataset's {vocab} tokens; leave it at 0 "
                        f"to take the dataset's.")


def min_params(c):
    """A lower bound of GPT(c)'s parameters from its settings alone: the token embedding (tied to the output layer),
    a learned position table, each block's attention (4d²) and FFN matrices (2dm, gated 3dm; an MoE layer's E experts
    of width moe_hidden and its router); norms, biases and activation extras are left out."""
    d, L, mats = c.n_embd, c.n_layer, 3 if VARIANTS[c.ffn].gated else 2
    moe = len(range(0, L, c.moe_every)) if c.n_expert else 0
    experts = moe * c.n_expert * d * (mats * c.moe_hidden + 1) if moe else 0  # a dense model's top_k may be 0
    return (d * (c.padded_vocab_size + c.block_size * (c.pos == 'learned')) + 4 * d * d * L
            + (L - moe) * mats * d * c.ffn_hidden + experts)


def memory_needs(cfg, c):
    """A lower bound of a run's memory in bytes, before anything is allocated, in two parts: (model, batch). The model:
    16 bytes a parameter (fp32 weights, gradients and AdamW's two moments; min_params) and RoPE's fp32 tables (cos and
    sin, block_size x head size / 2, in every layer); the batch: what it certainly holds, its fp32 logits and the int64
    validation windows (inputs and targets)."""
    model = 16 * min_params(c) + (4 * c.n_layer * c.block_size * (c.n_embd // c.n_head) if c.pos == 'rope' else 0)
    batch = cfg['batch_size'] * cfg['block_size'] * (4 * c.padded_vocab_size + 16 * cfg['eval_iters'])
    return model, batch


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
    model, batch = memory_needs(cfg, c)
    if model + batch > have:
        gb = lambda n: f"{Decimal(n) / 10**9:.3g} GB"  # Decimal: the sizes can be ints beyond any float
        lower = ('n_layer, n_embd, ffn_mult, n_expert or vocab_size' if model > batch else
                 'batch_size, block_size or eval_iters')
        holder = 'this machine' if where in ('cpu', 'mps') else 'the GPU ' + where
        raise UserError(f"this run needs at least {gb(model + batch)} of memory: {gb(model)} for a model of at least "
                        f"{Decimal(min_params(c)):.3g} parameters (16 bytes each: fp32 weights, gradients and AdamW's "
                        f"two moments) and RoPE's tables, {gb(batch)} for a batch's logits and the validation windows; "
                        f"{holder} has {gb(have)}{' free' if free else ''}, so lower {lower}.")


def check(cfg):
    """Catch the mistakes a run's settings can make, before anything is built or written."""
    for key, choices in (('init_from', ('scratch', 'resume')), ('schedule', ('cosine', 'wsd', 'constant')),
                         ('compile_mode', ('regional', 'whole'))):
        if cfg[key] not in choices:
            raise UserError(f"--{key} expects {' or '.join(choices)}, got '{cfg[key]}'.")
    if not cfg['out_dir'].strip():
        raise UserError("--out_dir is empty; give the run's directory, e.g. --out_dir=out-gelu.")
    if not cfg['dataset'].strip():
        raise UserError("--dataset is empty; name a prepared dataset, e.g. --dataset=shakespeare_char.")
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
    if cfg['min_lr'] > cfg['learning_rate']:  # the schedule ends at min_lr: it would rise to it
        raise UserError(f"--min_lr={cfg['min_lr']} is above --learning_rate={cfg['learning_rate']}; give a min_lr at "
                        f"most the learning rate.")
    for key in ('beta1', 'beta2'):  # AdamW's moment decay rates (Loshchilov & Hutter 2019) lie in [0, 1)
        if not 0.0 <= cfg[key] < 1.0:
            raise UserError(f"--{key} must be in [0, 1), got {cfg[key]}.")
    if not 0 <= cfg['seed'] <= MAX_SEED:
        raise UserError(f"--seed must be between 0 and {MAX_SEED}, got {cfg['seed']}.")
    vocab = dataset_vocab(cfg['dataset'], cfg['data_dir'])
    check_vocab_size(cfg, vocab)  # where the dataset is prepared already: before a comparison writes anything
    config = model_config({**cfg, 'vocab_size': cfg['vocab_size'] or vocab})
    check_memory(cfg, config)
    # the activation keys (poly_order, act_dict, la_init, moa_gate) are checked as activations are built: the chosen
    # variant's, and the ones that read the keys it does not (la_init=onehot needs entries that differ by variant)
    probe = replace(config, la_init='mean' if config.la_init == 'onehot' else config.la_init)
    try:
        for c in (config, *(replace(probe, ffn=v) for v in ('polynorm', 'la_glu', 'moa'))):
            make_activations(c)
    except ValueError as e:
        raise refusal(e) from None
    if cfg['wandb_log']:  # imported now, before a run replaces anything, and only when asked for
        try:
            import wandb  # noqa: F401
        except Exception as e:
            raise UserError(f"--wandb_log=True needs the wandb package, which cannot be imported here "
                            f"({type(e).__name__}: {e}); pip install wandb, or drop --wandb_log.") from None


def schedule_note(cfg, resumed=False):
    """A note where the schedule and the run end apart, as where --max_iters changes a config's run and its
    lr_decay_iters stays: past max_iters the rate never decays to min_lr, before it the last iterations train at
    min_lr; else None. A resume is told --lr_decay_iters=max_iters, not 0: at 0 its schedule moves from the
    checkpoint's, and train.py's note of that would send it back to lr_decay_iters."""
    decay, end = cfg['lr_decay_iters'], cfg['max_iters']
    if cfg['schedule'] == 'constant' or decay in (0, end):
        return None
    said = (f"lies past max_iters={end}, so the rate never decays to min_lr" if decay > end else
            f"ends before max_iters={end}, so the run's last {end - decay} iterations train at min_lr")
    fix = end if resumed else 0
    return f"note: lr_decay_iters={decay} {said}; --lr_decay_iters={fix} ends the schedule with the run."


# ----------------------------------------------------------------------------------------------------------------------
# a resumed run's settings and model keys, from its checkpoint (machinery/checkpoint.py reads it)


def resumed_settings(cfg, given, ckpt):
    """A resumed run's settings: the checkpoint's, with only the keys given explicitly on top; its model keys, data
    stream and validation windows cannot change."""
    with loading(os.path.join(cfg['out_dir'], CKPT)):  # its settings read as a command line's are
        try:
            saved = {k: coerce(k, v, TYPES[k], DEFAULTS[k], 'its config: ') for k, v in ckpt['config'].items()
                     if k in DEFAULTS}
        except UserError as e:  # the checks of a person's settings find the checkpoint's own settings damaged
            raise ValueError(e) from None
        kept = {**{k: saved[k] for k in keys_that('stream')}, **{k: ckpt['model_args'][k] for k in keys_that('model')}}
    for key, was in kept.items():
        if key in given and cfg[key] != was and not (key == 'vocab_size' and cfg[key] == 0):
            by, fix = ((f"--{key}={cfg[key]}", f"drop --{key}") if given[key] == '--' else  # or its config file
                       (f"{given[key]} sets {key}={cfg[key]!r}, which", f"resume without {given[key]}"))
            raise UserError(f"{by} differs from the checkpoint's {was!r}; a resumed run keeps its model, data "
                            f"stream and validation windows, so {fix} or train a new run in another out_dir.")
    resumed = {**DEFAULTS, **saved, **{k: cfg[k] for k in given}}
    return {**resumed, 'init_from': 'resume', 'out_dir': cfg['out_dir']}  # the run may have been moved since


def model_args(cfg, meta, ckpt):
    """The model keys of a run: its checkpoint's, or its settings' with vocab_size 0 as the dataset's (meta)."""
    if ckpt is not None:
        with loading(os.path.join(cfg['out_dir'], CKPT)):
            saved, args = ckpt['meta'], dict(ckpt['model_args'])
            differ = sorted(k for k in {**saved, **meta} if saved.get(k) != meta.get(k))
        if differ:  # another vocabulary, other tokens: the data are not the run's
            raise UserError(f"{cfg['dataset']}'s meta.json differs from the one this run trained on in "
                            f"{', '.join(differ)} (prepared again?); resume with the data it trained on, or train a "
                            f"new run in another out_dir.")
        return args
    check_vocab_size(cfg, meta['vocab_size'])
    return {**{k: cfg[k] for k in keys_that('model')}, 'vocab_size': cfg['vocab_size'] or meta['vocab_size']}
