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
  appending, so the file never holds a step twice.
- init_from=resume takes the settings saved in out_dir/ckpt.pt and applies only what you pass explicitly on top;
  model keys and the data stream (dataset, batch_size, block_size, seed, number of processes) cannot change.
- A scratch run refuses to overwrite an out_dir that already holds a checkpoint (pass --overwrite=True).
- Debug hook: the environment variable NANOFFN_NAN_AT=k makes the loss of iteration k NaN (the k-th optimizer
  step, numbered as log.jsonl numbers them), to exercise the non-finite-loss stop. It has no other effect.
"""
import dataclasses
import hashlib
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
from tqdm import tqdm

from configurator import RunStopped, UserError, parse_args, run_cli
from model import FFN_VARIANTS, GPT, GPTConfig

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
    compile=None,  # None = auto: on for CUDA, off elsewhere
    peak_flops=0.0,  # FLOP/s for MFU; 0 = from the GPU's name (H100/H200 989e12, A100 312e12), else MFU is null
    seed=1337,
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
# -----------------------------------------------------------------------------


def resolve_device(name):
    """'auto' picks cuda, then mps, then cpu; an explicit choice must exist on this machine."""
    if name == 'auto':
        if torch.cuda.is_available():
            return 'cuda'
        if getattr(torch.backends, 'mps', None) is not None and torch.backends.mps.is_available():
            return 'mps'
        return 'cpu'
    kind = name.split(':')[0]
    if kind not in ('cpu', 'cuda', 'mps'):
        raise UserError(f"--device expects auto, cpu, cuda, cuda:N or mps, got '{name}'.")
    if kind == 'cuda' and not torch.cuda.is_available():
        raise UserError("--device=cuda but no CUDA GPU is available here; use --device=cpu (or auto).")
    if kind == 'mps' and not (getattr(torch.backends, 'mps', None) and torch.backends.mps.is_available()):
        raise UserError("--device=mps but MPS is not available here; use --device=cpu (or auto).")
    return name


def resolve_dtype(name, device_type):
    if name == 'auto':
        if device_type == 'cuda' and torch.cuda.is_bf16_supported():
            return 'bfloat16'
        return 'float32'
    if name not in ('float32', 'bfloat16', 'float16'):
        raise UserError(f"--dtype expects auto, float32, bfloat16 or float16, got '{name}'.")
    if name == 'bfloat16' and device_type == 'cuda' and not torch.cuda.is_bf16_supported():
        raise UserError("this GPU does not support bfloat16; use --dtype=float16 (with loss scaling) or float32.")
    return name


def check_config(cfg):
    """Catch the mistakes a config can make before anything is built or written."""
    if cfg['init_from'] not in ('scratch', 'resume'):
        raise UserError(f"--init_from expects scratch or resume, got '{cfg['init_from']}'.")
    if cfg['schedule'] not in ('cosine', 'wsd', 'constant'):
        raise UserError(f"--schedule expects cosine, wsd or constant, got '{cfg['schedule']}'.")
    if cfg['ffn'] not in FFN_VARIANTS:
        raise UserError(f"unknown ffn '{cfg['ffn']}'; choose one of: {', '.join(FFN_VARIANTS)}.")
    for key in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters',
                'log_interval', 'n_layer', 'n_head', 'n_embd'):
        if cfg[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {cfg[key]}.")
    for key in ('max_iters', 'warmup_iters', 'lr_decay_iters'):
        if cfg[key] < 0:
            raise UserError(f"--{key} must not be negative, got {cfg[key]}.")
    if not 0.0 <= cfg['decay_frac'] <= 1.0:
        raise UserError(f"--decay_frac must be between 0 and 1, got {cfg['decay_frac']}.")


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


def strip_prefixes(state_dict):
    """A compiled model's state dict has '_orig_mod.' keys (and a DDP one 'module.'): strip them so any checkpoint
    loads into a plain GPT."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ('_orig_mod.', 'module.'):
            while k.startswith(prefix):
                k = k[len(prefix):]
        out[k] = v
    return out


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


def save_checkpoint(ckpt, out_dir, name='ckpt.pt'):
    """Write atomically: torch.save into a temporary file in out_dir, fsync, then os.replace over the old file.
    A kill at any moment leaves either the previous checkpoint or the new one, never a torn file."""
    path = os.path.join(out_dir, name)
    tmp = os.path.join(out_dir, f'.{name}.tmp{os.getpid()}')
    try:
        with open(tmp, 'wb') as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # disk full, permissions: stop cleanly, the previous checkpoint is untouched
        raise RunStopped(f"could not write the checkpoint {path} ({e.strerror or e}); the previous one is kept, "
                         f"free some space and resume with --init_from=resume.") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def load_checkpoint(path):
    # weights_only: a checkpoint holds tensors and plain Python values only, so loading one cannot run code
    return torch.load(path, map_location='cpu', weights_only=True)


def read_log(path):
    """The records of a log.jsonl; a torn last line (a kill mid-write) is dropped."""
    records = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    return records


def truncate_log(path, iter_num):
    """Keep only the lines up to the checkpoint's iteration: the resumed run writes the later ones again."""
    records = [r for r in read_log(path) if r.get('iter', 0) <= iter_num]
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        for r in records:
            f.write(json.dumps(r) + '\n')
    os.replace(tmp, path)
    return len(records)


def peak_flops_for(device_type, override):
    if override > 0:
        return override
    if device_type == 'cuda':
        name = torch.cuda.get_device_name()
        for key, flops in PEAK_FLOPS:
            if key in name:
                return flops
    return None  # unknown hardware (or CPU): MFU is reported as null unless --peak_flops is given


def main(argv):
    cfg, given = parse_args(DEFAULTS, argv, types=TYPES, prog='train.py', doc=__doc__.split('\n\n')[1])
    out_dir = cfg['out_dir']
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    log_path = os.path.join(out_dir, 'log.jsonl')

    # -------------------------------------------------------------------------
    # resume: the run's saved settings, with only the explicitly given keys on top
    checkpoint = None
    if cfg['init_from'] == 'resume':
        if not os.path.exists(ckpt_path):
            raise UserError(f"init_from=resume but there is no checkpoint at {ckpt_path}; point --out_dir at an "
                            f"earlier run's directory or start one with --init_from=scratch.")
        try:
            checkpoint = load_checkpoint(ckpt_path)
        except Exception as e:
            raise UserError(f"cannot read the checkpoint {ckpt_path} ({type(e).__name__}); it is not a train.py "
                            f"checkpoint or it is damaged, so start again with --init_from=scratch.") from None
        saved = checkpoint['config']
        for key in MODEL_KEYS + STREAM_KEYS:
            was = checkpoint['model_args'].get(key, saved.get(key)) if key in MODEL_KEYS else saved.get(key)
            if key in given and cfg[key] != was and not (key == 'vocab_size' and cfg[key] == 0):
                raise UserError(f"--{key}={cfg[key]} differs from the checkpoint's {was!r}; a resumed run keeps its "
                                f"model and data stream, so drop --{key} or train a new run in another out_dir.")
        cfg = {**DEFAULTS, **{k: v for k, v in saved.items() if k in DEFAULTS}, **{k: cfg[k] for k in given}}
        cfg['init_from'], cfg['out_dir'] = 'resume', out_dir  # the run may have been moved since
    check_config(cfg)

    # -------------------------------------------------------------------------
    # system: device, processes, precision
    device = resolve_device(cfg['device'])
    ddp = int(os.environ.get('RANK', -1)) != -1  # launched by torchrun?
    if ddp:
        rank, local_rank, world_size = int(os.environ['RANK']), int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE'])
        if device.startswith('cuda'):
            device = f'cuda:{local_rank}'
        dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo')
    else:
        rank, local_rank, world_size = 0, 0, 1
    if device.startswith('cuda'):  # so RNG state, bf16 support and the peak-FLOPs lookup refer to this GPU
        torch.cuda.set_device(device)
    master = rank == 0  # only the master process logs and writes checkpoints
    device_type = device.split(':')[0]
    dtype = resolve_dtype(cfg['dtype'], device_type)
    use_compile = cfg['compile'] if cfg['compile'] is not None else device_type == 'cuda'
    if cfg['init_from'] == 'scratch' and os.path.exists(ckpt_path) and not cfg['overwrite']:
        raise UserError(f"{ckpt_path} already exists; resume it with --init_from=resume, choose another --out_dir, "
                        f"or pass --overwrite=True to replace it.")
    gas = cfg['gradient_accumulation_steps']
    tokens_per_iter = gas * world_size * cfg['batch_size'] * cfg['block_size']

    # every rank seeds differently (dropout), DDP broadcasts rank 0's initial weights so the model starts identical
    random.seed(cfg['seed'] + rank)
    np.random.seed(cfg['seed'] + rank)
    torch.manual_seed(cfg['seed'] + rank)
    if device_type == 'cuda':
        torch.set_float32_matmul_precision('high')  # allow tf32 matmuls for float32 work
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
    ctx = nullcontext() if dtype == 'float32' else torch.autocast(device_type=device_type, dtype=ptdtype)

    # -------------------------------------------------------------------------
    # data: the loader raises a UserError naming the prepare command if the dataset is missing
    from data.loader import DataLoader
    loader = DataLoader(cfg['dataset'], cfg['block_size'], cfg['batch_size'], cfg['seed'], rank=rank,
                        world_size=world_size, data_dir=cfg['data_dir'])
    meta = loader.meta
    val_batches = loader.val_batches(cfg['eval_iters'])  # fixed windows: every run is evaluated on the same tokens
    # a hash of those windows, logged on evaluation lines, so a comparison can check every run saw the same tokens
    val_hash = hashlib.sha256(b''.join(X.numpy().tobytes() + Y.numpy().tobytes() for X, Y in val_batches)).hexdigest()

    # -------------------------------------------------------------------------
    # model
    if checkpoint is not None:
        model_args = dict(checkpoint['model_args'])
    else:
        model_args = {k: cfg[k] for k in MODEL_KEYS}
        if cfg['vocab_size'] == 0:
            model_args['vocab_size'] = meta['vocab_size']
        elif cfg['vocab_size'] < meta['vocab_size']:
            raise UserError(f"--vocab_size={cfg['vocab_size']} is smaller than the dataset's {meta['vocab_size']} "
                            f"tokens; leave it at 0 to take the dataset's.")
    try:
        model = GPT(GPTConfig(**model_args))
    except ValueError as e:  # GPTConfig validates its fields: a bad combination is the user's to fix
        raise UserError(f"invalid model settings: {str(e).rstrip('.')}.") from None
    if checkpoint is not None:
        model.load_state_dict(strip_prefixes(checkpoint['model']))
    model.to(device)
    raw_model = model  # the plain module: checkpoints, evaluation statistics, loss_parts, MFU
    optimizer = raw_model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                               (cfg['beta1'], cfg['beta2']), device_type)
    # fp16 needs loss scaling to keep small gradients from underflowing; a no-op otherwise
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
    iter_num, best_val_loss, tokens, train_time, log_lines = 0, float('inf'), 0, 0.0, 0
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint['optimizer'])
        if checkpoint.get('scaler'):
            scaler.load_state_dict(checkpoint['scaler'])
        iter_num, best_val_loss = checkpoint['iter_num'], checkpoint['best_val_loss']
        tokens, train_time = checkpoint.get('tokens', 0), checkpoint.get('train_time', 0.0)
        if checkpoint['world_size'] == world_size:  # every rank continues its own stream and RNG exactly
            loader.load_state_dict(checkpoint['loader'][rank])
            set_rng_state(checkpoint['rng'][rank], device_type)  # after the model's init consumed random numbers
        else:  # the stream continues (the loader re-splits it), but the run is no longer bit-for-bit the same
            loader.load_state_dict(checkpoint['loader'][0])
            if master:
                print(f"note: the checkpoint was written by {checkpoint['world_size']} process(es), this run has "
                      f"{world_size}; the data stream continues, dropout randomness does not.")
        ckpt_iter = iter_num
        checkpoint = None  # free the memory
    else:
        ckpt_iter = None
    if use_compile:
        if master:
            print('compiling the model... (takes a ~minute)')
        model = torch.compile(model)
    if ddp:
        # every parameter gets a gradient each step (MoE experts are one (E, d, m) tensor: an expert that got no
        # token gets a zero gradient), so DDP needs no find_unused_parameters traversal
        model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None)
    eval_model = model.module if ddp else model  # compiled if compiling; no DDP hooks during evaluation

    # -------------------------------------------------------------------------
    # logging
    if master:
        os.makedirs(out_dir, exist_ok=True)
        for name in os.listdir(out_dir):  # a checkpoint write killed mid-way leaves its temporary file behind
            if name.startswith('.ckpt.pt.tmp'):
                os.remove(os.path.join(out_dir, name))
        if ckpt_iter is not None and os.path.exists(log_path):
            log_lines = truncate_log(log_path, ckpt_iter)
        if ckpt_iter is None and os.path.exists(ckpt_path):  # --overwrite=True: the old run goes now, not at the
            os.remove(ckpt_path)  # first save, so a resume can never join the old checkpoint to the new log
        log_file = open(log_path, 'a' if ckpt_iter is not None else 'w')
        report = raw_model.param_report()
        print(f"{cfg['dataset']} ({meta.get('tokenizer')}, vocab {meta['vocab_size']}): "
              f"{tokens_per_iter:,} tokens per iteration ({world_size} process(es) x {gas} accumulation steps x "
              f"{cfg['batch_size']} x {cfg['block_size']})")
        print('parameters: ' + ', '.join(f"{k} {v:,}" for k, v in report.items()))
        print(f"device {device}, dtype {dtype}, compile {use_compile}"
              + (f", resuming at iteration {iter_num}" if ckpt_iter is not None else ''))
    peak_flops = peak_flops_for(device_type, cfg['peak_flops'])
    moe = raw_model.config.n_expert > 0

    def write_log(record):
        nonlocal log_lines
        if master:
            log_file.write(json.dumps(record) + '\n')
            log_file.flush()
            log_lines += 1

    @torch.no_grad()
    def evaluate():
        """Mean cross-entropy over the fixed validation batches (split across processes), in eval mode."""
        eval_model.eval()
        total = torch.zeros(2, device=device, dtype=torch.float64)  # [sum of losses, number of batches]
        for X, Y in val_batches[rank::world_size]:
            with ctx:
                _, loss = eval_model(X.to(device), Y.to(device))
            total += torch.stack([loss.double(), torch.ones((), device=device, dtype=torch.float64)])
        if ddp:
            dist.all_reduce(total)
        eval_model.train()
        return (total[0] / total[1]).item()

    has_stats = [master]  # only the master logs, so only it pays for the extra forward pass

    def activation_stats():
        """Learned activation coefficients, MoA gate statistics and MoE load, on the first validation batch
        (an extra eager forward pass: done on evaluation lines only). None for fixed activations."""
        if not has_stats[0]:
            return None
        stats = raw_model.activation_stats(val_batches[0][0].to(device))
        has_stats[0] = any(stats.get('layers', []))  # a fixed activation has nothing to report: stop asking
        return stats if has_stats[0] else None

    saved_iter = [ckpt_iter]  # iteration of the checkpoint on disk (None: none written by this run's lineage)

    def checkpoint_now(val_loss):
        """Everything needed to continue exactly: weights, optimizer, RNG and loader state of every process."""
        states = [{'rng': rng_state(device_type), 'loader': loader.state_dict()}]
        if ddp:
            gathered = [None] * world_size
            dist.all_gather_object(gathered, states[0])
            states = gathered
        if master:
            save_checkpoint({
                'model': strip_prefixes(raw_model.state_dict()),
                'optimizer': optimizer.state_dict(),
                'scaler': scaler.state_dict() if scaler.is_enabled() else None,
                'model_args': model_args,
                'iter_num': iter_num,
                'best_val_loss': best_val_loss,
                'val_loss': val_loss,
                'config': cfg,
                'tokens': tokens,
                'train_time': train_time,
                'world_size': world_size,
                'rng': [s['rng'] for s in states],
                'loader': [s['loader'] for s in states],
                'meta': meta,  # the tokenizer (char vocabulary) that sample.py decodes with
                'log_lines': log_lines,
            }, out_dir)
        saved_iter[0] = iter_num

    def last_checkpoint():
        if saved_iter[0] is not None:
            return f"the last good checkpoint {ckpt_path} (iteration {saved_iter[0]}) is kept"
        return 'no checkpoint had been written yet'

    # -------------------------------------------------------------------------
    # training loop
    nan_at = int(os.environ.get('NANOFFN_NAN_AT', -1))  # debug hook, see the docstring
    pbar = tqdm(total=cfg['max_iters'], initial=iter_num, disable=not master, file=sys.stdout,
                dynamic_ncols=True, desc='train')
    try:
        if iter_num == 0:  # the untrained model's validation loss starts every curve
            val_loss = evaluate()
            record = {'iter': 0, 'tokens': 0, 'lr': get_lr(0, cfg), 'val_loss': val_loss, 'val_hash': val_hash,
                      'batch_hash': loader.batch_hash}
            act = activation_stats()
            if act:
                record['act'] = act
            write_log(record)
            if master:  # tqdm.write ignores the bar's disable flag
                pbar.write(f"iter 0: val loss {val_loss:.4f}")
        # per-step losses since the last log line, kept on the device: checking them only at log lines avoids a
        # CPU-GPU sync every step, yet still names the first step that went non-finite
        window, grad_norm = [], None
        t_window = time.time()
        while iter_num < cfg['max_iters']:
            lr = get_lr(iter_num, cfg)
            for group in optimizer.param_groups:
                group['lr'] = lr
            parts = torch.zeros(4, device=device)  # [total loss, cross-entropy, aux, z], mean over micro-steps
            for micro_step in range(gas):
                X, Y = loader.next_batch()
                if device_type == 'cuda':
                    X, Y = X.pin_memory().to(device, non_blocking=True), Y.pin_memory().to(device, non_blocking=True)
                else:
                    X, Y = X.to(device), Y.to(device)
                if ddp:
                    # sync gradients across processes only on the last micro-step (nanoGPT's no_sync, without the
                    # context manager)
                    model.require_backward_grad_sync = micro_step == gas - 1
                with ctx:
                    _, loss = model(X, Y)
                if iter_num + 1 == nan_at:  # this step completes iteration iter_num + 1
                    loss = loss * float('nan')
                lp = raw_model.loss_parts  # ce, aux, z: detached scalars of this forward
                parts += torch.stack([loss.detach().float(), lp['ce'], lp['aux'], lp['z']]) / gas
                scaler.scale(loss / gas).backward()
            if cfg['grad_clip'] > 0:
                scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg['grad_clip'])
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            window.append(parts)
            iter_num += 1
            tokens += tokens_per_iter
            pbar.update(1)

            is_eval = iter_num % cfg['eval_interval'] == 0 or iter_num == cfg['max_iters']
            if not (is_eval or iter_num % cfg['log_interval'] == 0):
                continue
            # ---- a log line: one sync point. Average the losses over processes, and stop on a non-finite one
            losses = torch.stack(window)  # (steps in window, 4)
            if ddp:
                dist.all_reduce(losses)  # gloo has no AVG: sum, then divide
                losses /= world_size
            losses = losses.cpu()
            dt = (time.time() - t_window) / len(window)
            train_time += dt * len(window)
            bad = (~torch.isfinite(losses[:, :2])).any(1).nonzero()
            if len(bad):
                k = iter_num - len(window) + int(bad[0]) + 1  # the iteration this step completed, as in the log
                raise RunStopped(f"the training loss became non-finite ({losses[int(bad[0]), 0].item()}) at iteration "
                                 f"{k}, so the run stopped and {last_checkpoint()}; {DIVERGED_HINT}, then resume or "
                                 f"start again.")
            total, ce, aux, z = losses[-1].tolist()
            mfu = raw_model.estimate_mfu(cfg['batch_size'] * gas, dt, peak_flops) if peak_flops else None
            record = {'iter': iter_num, 'tokens': tokens, 'lr': lr, 'loss': ce, 'ms': dt * 1000.0,
                      'tok_s': tokens_per_iter / dt, 'mfu': mfu, 'batch_hash': loader.batch_hash}
            if moe:
                record.update(loss_total=total, aux=aux, z=z)
            if grad_norm is not None:
                record['grad_norm'] = grad_norm.item()
            pbar.set_postfix(loss=f'{ce:.4f}', lr=f'{lr:.2e}', ms=f'{dt * 1000:.0f}',
                             **({'mfu': f'{mfu * 100:.1f}%'} if mfu is not None else {}))
            if is_eval:
                val_loss = evaluate()
                record['val_loss'] = val_loss
                record['val_hash'] = val_hash
                act = activation_stats()
                if act:
                    record['act'] = act
                if master:
                    pbar.write(f"iter {iter_num}: train loss {ce:.4f}, val loss {val_loss:.4f}")
            write_log(record)  # before the checkpoint: the checkpoint at iteration k always follows line k
            if is_eval and (val_loss < best_val_loss or cfg['always_save_checkpoint']):
                best_val_loss = min(best_val_loss, val_loss)
                checkpoint_now(val_loss)
            window = []
            t_window = time.time()  # evaluation and checkpoint time is not step time
    finally:
        pbar.close()
        if master:
            log_file.close()
        if ddp:
            dist.destroy_process_group()
    if master:
        print(f"done: {iter_num} iterations, {tokens:,} tokens, best val loss {best_val_loss:.4f}, "
              f"checkpoint {ckpt_path}")


if __name__ == '__main__':
    run_cli(main)
