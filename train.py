"""
Train a GPT with a chosen feed-forward layer, in nanoGPT's style: one file, read top to bottom.

    python train.py config/shakespeare_char.py                          # a few minutes on a laptop CPU
    python train.py config/shakespeare_char.py --ffn=polynorm --out_dir=out-pn
    python train.py --out_dir=out-pn --init_from=resume --max_iters=4000 # continue exactly where it stopped
    torchrun --standalone --nproc_per_node=8 train.py config/owt.py     # DDP (nccl on GPUs, gloo on CPU)
    python train.py --help                                              # every key and its default

Settings: a config file (Python, exec'd) and then --key=value overrides, checked against the defaults below
(see configurator.py). Every field of model.GPTConfig is a key too.

Semantics worth knowing:
- batch_size is per micro-step per process and gradient_accumulation_steps is per process (unlike nanoGPT, it is
  not divided by the number of processes): one iteration sees
  batch_size * block_size * gradient_accumulation_steps * world_size tokens. With the loader's stream semantics,
  2 processes x 1 accumulation step see exactly the batches of 1 process x 2 accumulation steps.
- log.jsonl has one JSON object per logged iteration; `iter` counts optimizer steps completed. A line with
  `val_loss` is an evaluation line (its `val_hash` identifies the validation windows); the checkpoint written at
  iteration k comes after line k, and a resumed run drops any line past the checkpoint's iteration before
  appending, so the file never holds a step twice. A damaged line is moved to log.jsonl.damaged (with a warning),
  never dropped with the intact lines around it.
- init_from=resume takes the settings saved in out_dir/ckpt.pt and applies only what you pass explicitly on top;
  model keys and the data stream (dataset, batch_size, block_size, seed, number of processes) cannot change.
- A scratch run refuses to overwrite an out_dir that already holds a checkpoint (pass --overwrite=True).
- One run per out_dir: a run locks out_dir/.lock (holding its PID and host) before it writes anything there, and a
  second train.py on the same out_dir is refused, naming that PID. The kernel drops the lock when the process dies
  (kill -9 too), so a crashed run's folder is taken over without cleanup. On a network filesystem the lock may only
  exclude processes of the same machine.
- A run stops (exit status 3) when a training loss, the weights or the validation loss become non-finite; a
  checkpoint is only written from finite weights with a finite validation loss, so the last one is always usable.
- Debug hook: the environment variable NANOFFN_NAN_AT=k makes the loss of iteration k NaN (the k-th optimizer
  step, numbered as log.jsonl numbers them), to exercise the non-finite-loss stop. It has no other effect.
"""
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (COMPILE_MODES, autocast, compile_cache_dir, compile_model, compile_stats, cpp_compiler_found,
                    load_checkpoint, lock_run_dir, model_state, progress_bar, read_log_lines, resolve_device,
                    resolve_dtype, save_checkpoint)
from configurator import RunStopped, UserError, parse_args, run_cli
from activations import check_variant
from model import GPT, GPTConfig, make_activations

# -----------------------------------------------------------------------------
# default config values
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
    compile=None,  # None = auto: on for CUDA, and on a CPU for runs large enough to pay for it (see use_compile)
    compile_mode='regional',  # 'regional' (each Block compiled; one graph serves every layer) | 'whole' (the GPT)
    peak_flops=0.0,  # FLOP/s for MFU; 0 = from the GPU's name (H100/H200 989e12, A100 312e12), else MFU is null
    seed=1337,
    # Weights & Biases (nanoGPT's keys; wandb is imported only when wandb_log is on)
    wandb_log=False,  # log every log.jsonl record to wandb too (WANDB_MODE=offline works without network)
    wandb_project='nanoffn',
    wandb_run_name='',  # '' = the out_dir's name
    wandb_group='',  # runs that belong together (compare.py sets one per comparison)
    wandb_tags='',  # comma-separated
)
# every field of GPTConfig is a key too, with the dataclass's default; vocab_size comes from the dataset
MODEL_KEYS = [f.name for f in dataclasses.fields(GPTConfig)]
MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
MODEL_DEFAULTS['vocab_size'] = 0  # 0 = the dataset's vocabulary (meta.json); a larger value leaves unused ids
DEFAULTS = {**TRAIN_DEFAULTS, **MODEL_DEFAULTS}
TYPES = {'compile': bool}  # keys whose default (None = auto) does not tell their type

# keys that fix the stream of training batches: a resumed run cannot change them (nor the model keys)
STREAM_KEYS = ['dataset', 'batch_size', 'block_size', 'seed']
PEAK_FLOPS = [('H100', 989e12), ('H200', 989e12), ('A100', 312e12)]  # bf16 dense, per GPU
DIVERGED_HINT = 'lower learning_rate, set grad_clip, or use another dtype'
STOPPED = 'stopped.txt'  # in the run directory of a run that stopped (non-finite loss): why; a new try removes it
# -----------------------------------------------------------------------------


# On a CPU, compiling is the default once the training that shares one compile takes this many steps (forward-backward
# passes: max_iters x gradient_accumulation_steps): one run for train.py, one variant over all its seeds for compare.py.
# Measured on two 2-core CPUs (BENCHMARKS.md, "When compiling pays on a CPU"): compiling costs 10-32 s per variant whose
# graphs are not cached yet, 1.2-3.1 s per run when they are and ~1.6 s per run of importing Inductor, whatever the
# model's size, and saves 26-34 ms per step on average over the default comparison's 8 variants at its tiny size (2
# layers, d = 64), more at larger sizes (255-458 ms at 4 layers, d = 256). So it breaks even after ~700-940 steps on a
# fresh cache and ~300-380 with the graphs cached, and a machine compiles a graph once and then loads it in every rerun,
# added seed and comparison of the same shape. The fixed activations save least: GELU alone 4-12 ms per step at the tiny
# size, 0-6% at d = 256.
CPU_COMPILE_STEPS = 800

# A compiled run compiles its evaluation forward too (no_grad and eval mode make it a graph of its own), except on a CPU
# for a run that evaluates fewer batches than this (eval_iters x its evaluations): there evaluation runs eager
# (torch.compiler.set_stance("force_eager"): the same code, unfused). At the default comparison's size the evaluation
# graph takes 4.0 s (GELU) to 7.3 s (MoA-GLU) to compile and saves 2.4-13.7 ms per batch, so it pays after ~530-1,700
# batches; each run of that comparison evaluates 112 (BENCHMARKS.md, "When compiling pays on a CPU").
CPU_COMPILE_EVAL_BATCHES = 1000


def use_compile(device_type, steps):
    """--compile's default, and why, for training of `steps` steps that shares one compile (CPU_COMPILE_STEPS).
    On CUDA always: a GPU step is short and launch-bound, so fused kernels pay for the compile within the first
    steps of any real run. On a CPU from CPU_COMPILE_STEPS on: compiling costs a fixed number of seconds per variant
    and saves a share of every step, so short runs finish sooner eager. MPS support in Inductor is young: eager."""
    if device_type == 'cuda':
        return True, 'on CUDA'
    if device_type != 'cpu':
        return False, f'on {device_type}'
    if steps < CPU_COMPILE_STEPS:
        return False, (f'{steps} steps, under the {CPU_COMPILE_STEPS} from which compiling pays on a CPU; '
                       f'--compile=True compiles anyway')
    if not cpp_compiler_found():  # a fresh machine may have Python but no compiler: run eager rather than fail
        return False, (f'{steps} steps would pay for compiling, but torch.compile finds no C++ compiler to build CPU '
                       f'kernels with: install g++ (or clang++), or set $CXX, to compile')
    return True, f'{steps} steps, at least the {CPU_COMPILE_STEPS} from which compiling pays on a CPU'


def compile_evaluation(device_type, batches):
    """Whether a compiled run that evaluates `batches` batches in all compiles its evaluation forward as well: on a CPU
    from CPU_COMPILE_EVAL_BATCHES on, elsewhere always."""
    return device_type != 'cpu' or batches >= CPU_COMPILE_EVAL_BATCHES


def is_evaluation(it, cfg):
    """Whether a run evaluates (and checkpoints) at iteration `it`: at 0, every eval_interval, and at max_iters."""
    return it % cfg['eval_interval'] == 0 or it == cfg['max_iters']


def evaluations(cfg):
    """How many times a run evaluates over its iterations 0..max_iters."""
    return sum(is_evaluation(it, cfg) for it in range(cfg['max_iters'] + 1))


def check_config(cfg):
    """Catch the mistakes a config can make before anything is built or written."""
    if cfg['compile_mode'] not in COMPILE_MODES:
        raise UserError(f"--compile_mode expects {' or '.join(COMPILE_MODES)}, got '{cfg['compile_mode']}'.")
    out_dir = cfg['out_dir']
    if not out_dir.strip():
        raise UserError("--out_dir is empty; give the run's directory, e.g. --out_dir=out-gelu.")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out_dir={out_dir} is a file, not a directory; choose another --out_dir.")
    if cfg['init_from'] not in ('scratch', 'resume'):
        raise UserError(f"--init_from expects scratch or resume, got '{cfg['init_from']}'.")
    if cfg['schedule'] not in ('cosine', 'wsd', 'constant'):
        raise UserError(f"--schedule expects cosine, wsd or constant, got '{cfg['schedule']}'.")
    try:
        check_variant(cfg['ffn'])
    except ValueError as e:
        raise UserError(f"{e}.") from None
    for key in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters',
                'log_interval', 'n_layer', 'n_head', 'n_embd'):
        if cfg[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {cfg[key]}.")
    for key in ('max_iters', 'warmup_iters', 'lr_decay_iters'):
        if cfg[key] < 0:
            raise UserError(f"--{key} must not be negative, got {cfg[key]}.")
    if cfg['wandb_log'] and importlib.util.find_spec('wandb') is None:  # found without importing it
        raise UserError("--wandb_log=True needs the wandb package; pip install wandb, or drop --wandb_log.")
    if not 0.0 <= cfg['decay_frac'] <= 1.0:
        raise UserError(f"--decay_frac must be between 0 and 1, got {cfg['decay_frac']}.")
    for key in ('learning_rate', 'min_lr', 'weight_decay', 'grad_clip', 'peak_flops'):
        if not (math.isfinite(cfg[key]) and cfg[key] >= 0):  # `not >=` also catches NaN
            raise UserError(f"--{key} must be a finite number >= 0, got {cfg[key]}.")
    for key in ('beta1', 'beta2'):  # AdamW's moment decay rates (Loshchilov & Hutter 2019) lie in [0, 1)
        if not 0.0 <= cfg[key] < 1.0:
            raise UserError(f"--{key} must be in [0, 1), got {cfg[key]}.")
    if cfg['seed'] < 0:
        raise UserError(f"--seed must be >= 0, got {cfg['seed']}.")
    try:  # the model's own checks (e.g. RoPE's even head size); vocab_size 0 = the dataset's, known later
        # and the activation's (poly_order, act_dict, la_init, moa_gate), which building it checks: a few small modules
        make_activations(GPTConfig(**{k: cfg[k] for k in MODEL_KEYS if k != 'vocab_size'}))
    except ValueError as e:
        raise UserError(f"invalid model settings: {str(e).rstrip('.')}.") from None


def get_lr(it, cfg):
    """Learning rate of iteration `it` (0-based): linear warmup, then cosine decay, or stable-then-linear decay
    (wsd), down to min_lr at lr_decay_iters, and min_lr after that."""
    lr, min_lr, warmup = cfg['learning_rate'], cfg['min_lr'], cfg['warmup_iters']
    decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if cfg['schedule'] == 'constant':
        return lr
    if it >= decay_iters:
        return min_lr
    if cfg['schedule'] == 'cosine':
        ratio = (it - warmup) / max(1, decay_iters - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
    # wsd: stable at lr, then a linear ramp to min_lr over the last decay_frac of the run
    decay_start = max(warmup, decay_iters - int(round(cfg['decay_frac'] * decay_iters)))
    if it < decay_start:
        return lr
    return lr + (min_lr - lr) * (it - decay_start) / max(1, decay_iters - decay_start)


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


def truncate_log(path, iter_num):
    """Keep every intact line up to the checkpoint's iteration: the resumed run writes the later ones again. A damaged
    line is never dropped silently: it is appended to log.jsonl.damaged, with a warning."""
    records, damaged = read_log_lines(path)
    records = [r for r in records if r.get('iter', 0) <= iter_num]
    if damaged:
        with open(path + '.damaged', 'a', encoding='utf-8') as f:
            f.writelines(damaged)
        print(f"warning: {len(damaged)} damaged line(s) of {path} moved to {path}.damaged; the intact lines are kept.",
              file=sys.stderr)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        for r in records:
            f.write(json.dumps(r) + '\n')
    os.replace(tmp, path)
    return len(records)


def wandb_fields(record, prefix=''):
    """A log record as wandb charts it: nested dicts and lists become '/'-joined keys of scalars, so
    {'act': {'layers': [{'poly': [a0, a1]}]}} logs act/layers/0/poly/0 and act/layers/0/poly/1."""
    items = record.items() if isinstance(record, dict) else enumerate(record)
    out = {}
    for key, value in items:
        if isinstance(value, (dict, list)):
            out.update(wandb_fields(value, f'{prefix}{key}/'))
        else:
            out[f'{prefix}{key}'] = value
    return out


def peak_flops_for(device_type, override):
    if override > 0:
        return override
    if device_type == 'cuda':
        name = torch.cuda.get_device_name()
        for key, flops in PEAK_FLOPS:
            if key in name:
                return flops
    return None  # unknown hardware (or CPU): MFU is reported as null unless --peak_flops is given


def resume_settings(cfg, given):
    """init_from=resume: the checkpoint, and the run's saved settings with only the explicitly given keys on top.
    Model keys and the data stream cannot change. Scratch: (None, cfg)."""
    if cfg['init_from'] != 'resume':
        return None, cfg
    out_dir = cfg['out_dir']
    checkpoint = load_checkpoint(out_dir, "point --out_dir at an earlier run's directory or start one with "
                                          "--init_from=scratch.")
    saved = checkpoint['config']
    for key in MODEL_KEYS + STREAM_KEYS:
        was = checkpoint['model_args'].get(key, saved.get(key)) if key in MODEL_KEYS else saved.get(key)
        if key in given and cfg[key] != was and not (key == 'vocab_size' and cfg[key] == 0):
            raise UserError(f"--{key}={cfg[key]} differs from the checkpoint's {was!r}; a resumed run keeps its "
                            f"model and data stream, so drop --{key} or train a new run in another out_dir.")
    cfg = {**DEFAULTS, **{k: v for k, v in saved.items() if k in DEFAULTS}, **{k: cfg[k] for k in given}}
    cfg['init_from'], cfg['out_dir'] = 'resume', out_dir  # the run may have been moved since
    return checkpoint, cfg


class Trainer:
    """One training run, in the order it happens: setup (system, data, model, log) in __init__, then train(), which
    runs the loop of train_step()s and, at log lines, evaluate(), learned() and save_checkpoint()."""

    def __init__(self, cfg, checkpoint):
        self.cfg = cfg
        self.out_dir = cfg['out_dir']
        self.ckpt_path = os.path.join(self.out_dir, 'ckpt.pt')
        self.log_path = os.path.join(self.out_dir, 'log.jsonl')
        self.setup_system()
        self.setup_data()
        self.setup_model(checkpoint)
        self.open_log()

    # ---- setup ---------------------------------------------------------------------------------------------------

    def setup_system(self):
        """Device, processes (DDP under torchrun), precision, compilation, seeds."""
        cfg = self.cfg
        device = resolve_device(cfg['device'])
        self.ddp = int(os.environ.get('RANK', -1)) != -1  # launched by torchrun?
        if self.ddp:
            self.rank, self.local_rank = int(os.environ['RANK']), int(os.environ['LOCAL_RANK'])
            self.world_size = int(os.environ['WORLD_SIZE'])
            if device.startswith('cuda'):
                device = f'cuda:{self.local_rank}'
            dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo')
        else:
            self.rank, self.local_rank, self.world_size = 0, 0, 1
        if device.startswith('cuda'):  # so RNG state, bf16 support and the peak-FLOPs lookup refer to this GPU
            torch.cuda.set_device(device)
        self.device, self.device_type = device, device.split(':')[0]
        self.master = self.rank == 0  # only the master process logs and writes checkpoints
        self.dtype = resolve_dtype(cfg['dtype'], self.device_type)
        if cfg['init_from'] == 'scratch' and os.path.exists(self.ckpt_path) and not cfg['overwrite']:
            raise UserError(f"{self.ckpt_path} already exists; resume it with --init_from=resume, choose another "
                            f"--out_dir, or pass --overwrite=True to replace it.")
        self.gas = cfg['gradient_accumulation_steps']
        self.tokens_per_iter = self.gas * self.world_size * cfg['batch_size'] * cfg['block_size']
        # every rank seeds differently (dropout), DDP broadcasts rank 0's initial weights so the model starts identical
        random.seed(cfg['seed'] + self.rank)
        np.random.seed(cfg['seed'] + self.rank)
        torch.manual_seed(cfg['seed'] + self.rank)
        if self.device_type == 'cuda':
            torch.set_float32_matmul_precision('high')  # allow tf32 matmuls for float32 work
        self.autocast = autocast(self.device_type, self.dtype)

    def setup_data(self):
        """The loader (a UserError naming the prepare command if the dataset is missing) and the fixed validation
        batches: every run on the dataset is evaluated on the same windows, identified by val_hash in the log."""
        from data.loader import DataLoader
        cfg = self.cfg
        self.loader = DataLoader(cfg['dataset'], cfg['block_size'], cfg['batch_size'], cfg['seed'], rank=self.rank,
                                 world_size=self.world_size, data_dir=cfg['data_dir'])
        self.meta = self.loader.meta
        self.val_batches = self.loader.val_batches(cfg['eval_iters'])
        self.val_hash = hashlib.sha256(b''.join(X.numpy().tobytes() + Y.numpy().tobytes()
                                                for X, Y in self.val_batches)).hexdigest()

    def setup_model(self, checkpoint):
        """The GPT, its optimizer and loss scaler, restored from the checkpoint when resuming; compiled and wrapped in
        DDP as asked. self.raw_model is the plain module (checkpoints, reports, loss_parts, MFU)."""
        cfg = self.cfg
        if checkpoint is not None:
            self.model_args = dict(checkpoint['model_args'])
        else:
            self.model_args = {k: cfg[k] for k in MODEL_KEYS}
            if cfg['vocab_size'] == 0:
                self.model_args['vocab_size'] = self.meta['vocab_size']
            elif cfg['vocab_size'] < self.meta['vocab_size']:
                raise UserError(f"--vocab_size={cfg['vocab_size']} is smaller than the dataset's "
                                f"{self.meta['vocab_size']} tokens; leave it at 0 to take the dataset's.")
        try:
            model = GPT(GPTConfig(**self.model_args))
        except ValueError as e:  # GPTConfig validates its fields: a bad combination is the user's to fix
            raise UserError(f"invalid model settings: {str(e).rstrip('.')}.") from None
        if checkpoint is not None:
            model.load_state_dict(model_state(checkpoint['model']))
        model.to(self.device)
        self.raw_model = model
        self.optimizer = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                                    (cfg['beta1'], cfg['beta2']), self.device_type)
        # fp16 needs loss scaling to keep small gradients from underflowing; a no-op otherwise
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=(self.dtype == 'float16'))
        self.iter_num, self.best_val_loss, self.tokens, self.train_time, self.log_lines = 0, float('inf'), 0, 0.0, 0
        self.saved_iter = None  # iteration of the checkpoint on disk (None: none written by this run's lineage)
        self.compile_before = 0.0  # seconds spent compiling by the earlier processes of a resumed run
        if checkpoint is not None:
            self.restore(checkpoint)
        # decided by the run's whole length, resumed or not, so that a resumed run takes the code path it started on
        # (compiled and eager numerics differ slightly); its earlier process left the compiled graphs in the cache
        self.use_compile, self.compile_reason = ((cfg['compile'], f"--compile={cfg['compile']}")
                                                 if cfg['compile'] is not None else
                                                 use_compile(self.device_type, cfg['max_iters'] * self.gas))
        eval_batches = cfg['eval_iters'] * evaluations(cfg)
        self.compile_eval = self.use_compile and compile_evaluation(self.device_type, eval_batches)
        if self.use_compile and not self.compile_eval:
            self.compile_reason += (f"; evaluation eager: {eval_batches} batches, under the "
                                    f"{CPU_COMPILE_EVAL_BATCHES} from which compiling it pays on a CPU")
        if self.use_compile:
            if self.master:
                print(f"compiling ({cfg['compile_mode']}) on first use; compiled code is cached in "
                      f"{compile_cache_dir()}")
            model = compile_model(model, cfg['compile_mode'])  # regional: the blocks of self.raw_model, in place
        if self.ddp:
            # every parameter gets a gradient each step (MoE experts are one (E, d, m) tensor: an expert that got no
            # token gets a zero gradient), so DDP needs no find_unused_parameters traversal
            model = DDP(model, device_ids=[self.local_rank] if self.device_type == 'cuda' else None)
        self.model = model
        self.eval_model = model.module if self.ddp else model  # compiled if compiling; no DDP hooks in evaluation

    def restore(self, checkpoint):
        """Optimizer, scaler, counters, and every rank's data stream and RNG, from the checkpoint."""
        self.optimizer.load_state_dict(checkpoint['optimizer'])
        if checkpoint.get('scaler'):
            self.scaler.load_state_dict(checkpoint['scaler'])
        self.iter_num, self.best_val_loss = checkpoint['iter_num'], checkpoint['best_val_loss']
        self.tokens, self.train_time = checkpoint.get('tokens', 0), checkpoint.get('train_time', 0.0)
        self.compile_before = checkpoint.get('compile_time', 0.0)
        if checkpoint['world_size'] == self.world_size:  # every rank continues its own stream and RNG exactly
            self.loader.load_state_dict(checkpoint['loader'][self.rank])
            set_rng_state(checkpoint['rng'][self.rank], self.device_type)  # after the model's init used the RNG
        else:  # the stream continues (the loader re-splits it), but the run is no longer bit-for-bit the same
            self.loader.load_state_dict(checkpoint['loader'][0])
            if self.master:
                print(f"note: the checkpoint was written by {checkpoint['world_size']} process(es), this run has "
                      f"{self.world_size}; the data stream continues, dropout randomness does not.")
        self.saved_iter = self.iter_num

    def open_log(self):
        """The run directory and log.jsonl: a resumed run first drops the lines past its checkpoint. The directory is
        locked before anything in it changes, so a second run on it is refused (see common.try_lock_run_dir)."""
        cfg, resumed = self.cfg, self.saved_iter is not None
        self.has_learned = self.master  # only the master logs, so only it pays for learned()'s extra forward pass
        self.lock = None
        self.wandb_run = None
        if not self.master:
            return
        self.lock = lock_run_dir(self.out_dir)  # held until train() ends; the kernel drops it if the process dies
        for name in os.listdir(self.out_dir):  # a checkpoint write killed mid-way leaves its temporary file behind,
            if name.startswith('.ckpt.pt.tmp') or name == STOPPED:  # a stopped run its stop: this run is a new try
                os.remove(os.path.join(self.out_dir, name))
        if resumed and os.path.exists(self.log_path):
            self.log_lines = truncate_log(self.log_path, self.saved_iter)
        if not resumed and os.path.exists(self.ckpt_path):  # --overwrite=True: the old run goes now, not at the
            os.remove(self.ckpt_path)  # first save, so a resume can never join the old checkpoint to the new log
        self.log_file = open(self.log_path, 'a' if resumed else 'w')
        report = self.raw_model.param_report()
        print(f"{cfg['dataset']} ({self.meta.get('tokenizer')}, vocab {self.meta['vocab_size']}): "
              f"{self.tokens_per_iter:,} tokens per iteration ({self.world_size} process(es) x {self.gas} accumulation "
              f"steps x {cfg['batch_size']} x {cfg['block_size']})")
        print('parameters: ' + ', '.join(f"{k} {v:,}" for k, v in report.items()))
        print(f"device {self.device}, dtype {self.dtype}, compile {self.use_compile} ({self.compile_reason})"
              + (f", resuming at iteration {self.iter_num}" if resumed else ''))
        self.wandb_run = self.start_wandb() if cfg['wandb_log'] else None

    def start_wandb(self):
        """A wandb run for this process (the master only), with every setting as its config. A resumed train.py
        starts a new wandb run of the same name and group, whose history begins at the checkpoint's iteration."""
        import wandb  # check_config made sure it is installed
        cfg = self.cfg
        tags = [t.strip() for t in cfg['wandb_tags'].split(',') if t.strip()]
        return wandb.init(project=cfg['wandb_project'], name=cfg['wandb_run_name'] or os.path.basename(
            os.path.abspath(self.out_dir)), group=cfg['wandb_group'] or None, tags=tags or None, config=cfg)

    # ---- what happens at log lines ---------------------------------------------------------------------------------

    def compile_time(self):
        """Seconds this run has spent compiling, earlier processes of a resumed run included: Dynamo's own count of
        tracing and building every graph, or of loading it from the compile cache."""
        return self.compile_before + (compile_stats()['compile_s'] if self.use_compile else 0.0)

    def write_log(self, record):
        if self.use_compile:
            record['compile_s'] = round(self.compile_time(), 2)
        if self.master:
            self.log_file.write(json.dumps(record) + '\n')
            self.log_file.flush()
            self.log_lines += 1
            if self.wandb_run is not None:  # the same record, at the same iteration
                self.wandb_run.log(wandb_fields(record), step=record['iter'])

    @torch.no_grad()
    def evaluate(self):
        """Mean cross-entropy over the fixed validation batches (split across processes), in eval mode; compiled only
        if the run compiles its evaluation (compile_evaluation), else eager even where the blocks are compiled."""
        self.eval_model.eval()
        total = torch.zeros(2, device=self.device, dtype=torch.float64)  # [sum of losses, number of batches]
        with nullcontext() if self.compile_eval else torch.compiler.set_stance("force_eager"):
            for X, Y in self.val_batches[self.rank::self.world_size]:
                with self.autocast:
                    _, loss = self.eval_model(X.to(self.device), Y.to(self.device))
                total += torch.stack([loss.double(), torch.ones((), device=self.device, dtype=torch.float64)])
        if self.ddp:
            dist.all_reduce(total)
        self.eval_model.train()
        return (total[0] / total[1]).item()

    def learned(self):
        """What the activations learned (GPT.learned) on the first validation batch: an extra eager forward pass, on
        evaluation lines only. None for fixed activations, which are then not asked again."""
        if not self.has_learned:
            return None
        report = self.raw_model.learned(self.val_batches[0][0].to(self.device))
        self.has_learned = any(report['layers'])
        return report if self.has_learned else None

    def save_checkpoint(self, val_loss):
        """Everything needed to continue exactly: weights, optimizer, RNG and loader state of every process."""
        states = [{'rng': rng_state(self.device_type), 'loader': self.loader.state_dict()}]
        if self.ddp:
            gathered = [None] * self.world_size
            dist.all_gather_object(gathered, states[0])
            states = gathered
        if self.master:
            save_checkpoint({
                'model': model_state(self.raw_model.state_dict()),
                'optimizer': self.optimizer.state_dict(),
                'scaler': self.scaler.state_dict() if self.scaler.is_enabled() else None,
                'model_args': self.model_args,
                'iter_num': self.iter_num,
                'best_val_loss': self.best_val_loss,
                'val_loss': val_loss,
                'config': self.cfg,
                'tokens': self.tokens,
                'train_time': self.train_time,
                'compile_time': self.compile_time(),
                'world_size': self.world_size,
                'rng': [s['rng'] for s in states],
                'loader': [s['loader'] for s in states],
                'meta': self.meta,  # the tokenizer (char vocabulary) that sample.py decodes with
                'log_lines': self.log_lines,
            }, self.out_dir)
        self.saved_iter = self.iter_num

    def check_finite(self, val_loss):
        """Stop before a checkpoint could hold a diverged model. The training loss of a step is computed before its
        update, so it cannot see the update that broke the weights: the weights and the validation loss computed from
        them can. The same on every process (the weights are equal and val_loss is all-reduced)."""
        finite = math.isfinite(val_loss) and bool(torch.stack([p.isfinite().all()
                                                                for p in self.raw_model.parameters()]).all())
        if not finite:
            raise RunStopped(f"the weights became non-finite at iteration {self.iter_num} (validation loss {val_loss}),"
                             f" so the run stopped and {self.last_checkpoint()}; {DIVERGED_HINT}, then resume or start "
                             f"again.")

    def last_checkpoint(self):
        if self.saved_iter is not None:
            return f"the last good checkpoint {self.ckpt_path} (iteration {self.saved_iter}) is kept"
        return 'no checkpoint had been written yet'

    # ---- the loop --------------------------------------------------------------------------------------------------

    def train_step(self, lr, nan_at):
        """One optimizer step over gradient_accumulation_steps micro-batches. Returns the detached
        [total loss, cross-entropy, aux, z], averaged over micro-steps, on the device (no sync)."""
        for group in self.optimizer.param_groups:
            group['lr'] = lr
        parts = torch.zeros(4, device=self.device)
        for micro_step in range(self.gas):
            X, Y = self.loader.next_batch()
            if self.device_type == 'cuda':
                X, Y = X.pin_memory().to(self.device, non_blocking=True), Y.pin_memory().to(self.device, non_blocking=True)
            else:
                X, Y = X.to(self.device), Y.to(self.device)
            if self.ddp:
                # sync gradients across processes only on the last micro-step (nanoGPT's no_sync, without the
                # context manager)
                self.model.require_backward_grad_sync = micro_step == self.gas - 1
            with self.autocast:
                _, loss = self.model(X, Y)
            if self.iter_num + 1 == nan_at:  # this step completes iteration iter_num + 1
                loss = loss * float('nan')
            lp = self.raw_model.loss_parts  # ce, aux, z: detached scalars of this forward
            parts += torch.stack([loss.detach().float(), lp['ce'], lp['aux'], lp['z']]) / self.gas
            self.scaler.scale(loss / self.gas).backward()
        grad_norm = None
        if self.cfg['grad_clip'] > 0:
            self.scaler.unscale_(self.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg['grad_clip'])
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1
        self.tokens += self.tokens_per_iter
        return parts, grad_norm

    def log_line(self, window, dt, lr, grad_norm):
        """The record of a log line from the window of per-step losses since the last one: averaged over processes,
        and a RunStopped naming the first step whose loss was not finite."""
        losses = torch.stack(window)  # (steps in window, 4)
        if self.ddp:
            dist.all_reduce(losses)  # gloo has no AVG: sum, then divide
            losses /= self.world_size
        losses = losses.cpu()
        bad = (~torch.isfinite(losses[:, :2])).any(1).nonzero()
        if len(bad):
            k = self.iter_num - len(window) + int(bad[0]) + 1  # the iteration this step completed, as in the log
            raise RunStopped(f"the training loss became non-finite ({losses[int(bad[0]), 0].item()}) at iteration "
                             f"{k}, so the run stopped and {self.last_checkpoint()}; {DIVERGED_HINT}, then resume or "
                             f"start again.")
        total, ce, aux, z = losses[-1].tolist()
        peak = self.peak_flops
        mfu = self.raw_model.estimate_mfu(self.cfg['batch_size'] * self.gas, dt, peak) if peak else None
        record = {'iter': self.iter_num, 'tokens': self.tokens, 'lr': lr, 'loss': ce, 'ms': dt * 1000.0,
                  'tok_s': self.tokens_per_iter / dt, 'mfu': mfu, 'batch_hash': self.loader.batch_hash}
        if self.raw_model.config.n_expert > 0:
            record.update(loss_total=total, aux=aux, z=z)
        if grad_norm is not None:
            record['grad_norm'] = grad_norm.item()
        return record

    def evaluation(self, record):
        """Adds the validation loss (and what the activations learned) to a log line's record."""
        record['val_loss'] = self.evaluate()
        record['val_hash'] = self.val_hash
        learned = self.learned()
        if learned:
            record['act'] = learned
        return record['val_loss']

    def train(self):
        cfg = self.cfg
        self.peak_flops = peak_flops_for(self.device_type, cfg['peak_flops'])
        nan_at = int(os.environ.get('NANOFFN_NAN_AT', -1))  # debug hook, see the docstring
        # the bar on stderr (plain lines in a log file); evaluation lines and the summary on stdout
        pbar = progress_bar(cfg['max_iters'], 'train', initial=self.iter_num, disable=not self.master)
        try:
            if self.iter_num == 0:  # the untrained model's validation loss starts every curve
                record = {'iter': 0, 'tokens': 0, 'lr': get_lr(0, cfg), 'batch_hash': self.loader.batch_hash}
                val_loss = self.evaluation(record)
                self.write_log(record)
                if self.master:  # tqdm.write ignores the bar's disable flag
                    pbar.write(f"iter 0: val loss {val_loss:.4f}")
            # per-step losses since the last log line, kept on the device: checking them only at log lines avoids a
            # CPU-GPU sync every step, yet still names the first step that went non-finite
            window, t_window, c_window = [], time.time(), self.compile_time()
            while self.iter_num < cfg['max_iters']:
                lr = get_lr(self.iter_num, cfg)
                parts, grad_norm = self.train_step(lr, nan_at)
                window.append(parts)
                pbar.update(1)
                is_eval = is_evaluation(self.iter_num, cfg)
                if not (is_eval or self.iter_num % cfg['log_interval'] == 0):
                    continue
                # one sync point per log line. Compiling is not step time: a compiled run's first step traces and
                # builds its graph (seconds to minutes, once per run), and it is logged on its own, as compile_s
                dt = (time.time() - t_window - (self.compile_time() - c_window)) / len(window)
                self.train_time += dt * len(window)
                record = self.log_line(window, dt, lr, grad_norm)
                pbar.set_postfix(loss=f"{record['loss']:.4f}", lr=f'{lr:.2e}', ms=f'{dt * 1000:.0f}',
                                 **({'mfu': f"{record['mfu'] * 100:.1f}%"} if record['mfu'] is not None else {}))
                if is_eval:
                    val_loss = self.evaluation(record)
                    self.check_finite(val_loss)
                    if self.master:
                        pbar.write(f"iter {self.iter_num}: train loss {record['loss']:.4f}, val loss {val_loss:.4f}")
                self.write_log(record)  # before the checkpoint: the checkpoint at iteration k always follows line k
                if is_eval and (val_loss < self.best_val_loss or cfg['always_save_checkpoint']):
                    self.best_val_loss = min(self.best_val_loss, val_loss)
                    self.save_checkpoint(val_loss)
                window, t_window, c_window = [], time.time(), self.compile_time()  # nor evaluation, checkpoints
        except BaseException as e:
            pbar.leave = False  # a run that stops says one sentence on stderr: the bar makes way for it
            if isinstance(e, RunStopped) and self.master:  # and leaves it in its directory, for compare.py to read
                with open(os.path.join(self.out_dir, STOPPED), 'w') as f:
                    f.write(f"{e}\n")
            raise
        finally:
            pbar.close()
            if self.master:
                self.log_file.close()
                if self.wandb_run is not None:
                    self.wandb_run.finish()
                self.lock.close()
            if self.ddp:
                # every rank reaches this point before any tears its gloo/nccl threads down: a rank that destroys the
                # group while another is still in a collective aborts the process ("terminate called ...")
                try:
                    dist.barrier()
                except Exception:  # a peer already gone (this run is stopping anyway)
                    pass
                dist.destroy_process_group()
        if self.master:
            print(f"done: {self.iter_num} iterations, {self.tokens:,} tokens, best val loss {self.best_val_loss:.4f}, "
                  f"checkpoint {self.ckpt_path}")
            if self.use_compile:  # a graph for training, one for evaluation if compiled; hits: what was reused
                print('compile: ' + json.dumps(compile_stats()))


def main(argv):
    cfg, given = parse_args(DEFAULTS, argv, types=TYPES, prog='train.py', doc=__doc__.split('\n\n')[1])
    check_config(cfg)  # as given, before resume_settings reads out_dir; and once more merged with the checkpoint's
    checkpoint, cfg = resume_settings(cfg, given)
    check_config(cfg)
    Trainer(cfg, checkpoint).train()


if __name__ == '__main__':
    run_cli(main)
