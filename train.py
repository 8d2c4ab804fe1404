"""
Train a GPT with a chosen feed-forward layer, in nanoGPT's style: the set-up, then the loop, read top to bottom.

    python train.py config/shakespeare_char.py                          # a few minutes on a laptop CPU
    python train.py config/shakespeare_char.py --ffn=polynorm --out_dir=out-pn
    python train.py --out_dir=out-pn --init_from=resume --max_iters=3000 # continue exactly from its checkpoint
    torchrun --standalone --nproc_per_node=8 train.py config/owt.py --gradient_accumulation_steps=4  # DDP, as 1 GPU
    python train.py --help                                              # every key, its value and what it is

Settings: a config file and --key=value overrides of configurator.DEFAULTS (every field of GPTConfig is a key too).

Worth knowing:
- batch_size is per process, as nanoGPT's, and so is gradient_accumulation_steps (nanoGPT divides its among the
  processes): an iteration is batch_size * block_size * gradient_accumulation_steps * processes tokens.
- log.jsonl holds a record per logged iteration (`iter`: optimizer steps done); evaluation lines add the validation
  loss and its two halves, and what the activations learned (log_record, add_evaluation). A checkpoint at iteration k
  follows the log line of iteration k, and a resumed run drops the lines past its checkpoint.
- init_from=resume takes the settings saved in out_dir/ckpt.pt with only what you pass on top; the model keys, the
  data stream (dataset, batch_size, block_size, seed) and the validation windows (eval_iters) cannot change. One run
  per out_dir (a lock). A resume is exact on a CPU; on a GPU some kernels are not deterministic, so it matches to
  bf16's rounding.
- A run stops (exit status 3) when a loss, the gradient norm or the weights become non-finite (why:
  out_dir/diverged.txt) or a file cannot be written; a checkpoint only ever holds finite weights.
"""
from machinery.cli import quiet_interrupt  # first of all: a Ctrl-C while torch imports ends as quietly as one later
quiet_interrupt(__name__)
import json
import math
import os
import random
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import (DEFAULTS, NOTES, TYPES, check, check_memory, model_args, model_config,
                          resumed_settings, schedule_note)
from data.loader import open_loader
from machinery import checkpoint as ckpt_io, device, distributed, speed, wandb_log
from machinery.cli import UserError, parse_args, run_cli
from machinery.files import ctrl_c_held, write_file
from machinery.fingerprint import OTHER_CODE, code_hash
from machinery.lock import try_lock_run_dir
from machinery.progress import progress_bar
from machinery.run_log import (DIVERGED_HINT, LOG, Diverged, append_log, check_finite_steps, check_finite_weights,
                               environment, note_diverged, open_for_try)
from model import GPT, GPTConfig


def settings(argv):
    """The run's settings and, to resume, its checkpoint (whose settings it keeps, with only the keys given on top)."""
    cfg, given = parse_args(DEFAULTS, argv, types=TYPES, prog='train.py', doc=__doc__.split('\n\n')[1], notes=NOTES)
    checkpoint = None
    if cfg['init_from'] == 'resume':
        checkpoint = ckpt_io.load_checkpoint(cfg['out_dir'], "point --out_dir at an earlier run's directory or start "
                                                              "one with --init_from=scratch.")
        cfg = resumed_settings(cfg, given, checkpoint)
    check(cfg)
    return cfg, checkpoint


def get_lr(it, cfg):
    """Learning rate of iteration `it` (0-based): linear warmup, then learning_rate (constant), or a cosine decay or a
    stable-then-linear decay (wsd) down to min_lr at lr_decay_iters, and min_lr after that."""
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
    # wsd: stable at lr, then a linear ramp to min_lr over the last decay_frac of decay_iters (the run, by default)
    decay_start = max(warmup, decay_iters - int(round(cfg['decay_frac'] * decay_iters)))
    if it < decay_start:
        return lr
    return lr + (min_lr - lr) * (it - decay_start) / max(1, decay_iters - decay_start)


@torch.no_grad()
def evaluate(model, val_batches, autocast, hw):
    """Mean cross-entropy over the fixed validation batches, split across processes, in eval mode, and the means over
    their first and second halves (so that one half can choose a setting and the other report it)."""
    model.eval()
    # the sums in float64, but MPS has none (float32 errs far below a loss's noise)
    n, dtype = len(val_batches), torch.float32 if hw.device_type == 'mps' else torch.float64
    total = torch.zeros(4, device=hw.device, dtype=dtype)  # [sum, count] of each half
    for i in range(hw.rank, n, hw.world_size):
        with autocast:
            _, loss, _ = model(*val_batches[i])
        half = 2 * int(i >= n // 2)
        total[half:half + 2] += torch.stack([loss.to(dtype), torch.ones_like(loss, dtype=dtype)])
    if hw.ddp:
        dist.all_reduce(total)
    model.train()
    halves = [(total[0] / total[1]).item(), (total[2] / total[3]).item()] if n >= 2 else None
    return ((total[0] + total[2]) / (total[1] + total[3])).item(), halves


def set_up(cfg, checkpoint):
    """Everything a run needs, in nanoGPT's order, as one namespace: the hardware, the data, the model and its optimizer
    (from the checkpoint when resuming), then the run directory, opened only once everything has been checked."""
    r = SimpleNamespace(cfg=cfg, out_dir=cfg['out_dir'], ckpt_path=os.path.join(cfg['out_dir'], ckpt_io.CKPT))
    r.hw = hw = distributed.setup(cfg['device'], cfg['dtype'])
    if cfg['compile']:
        speed.check_compile(hw.device_type)
    r.threads = device.set_threads(cfg['threads'])  # before compiling: Inductor's C++ kernels take the count then
    r.env = {**environment(hw), 'code': code_hash()}  # named in the first log line this process writes
    r.master, r.autocast = hw.rank == 0, device.autocast(hw.device_type, hw.dtype)  # only the master writes
    r.peak = speed.peak_flops(hw.device_type, hw.dtype, cfg['peak_flops'])  # for MFU
    if checkpoint is None and os.path.exists(r.ckpt_path) and not cfg['overwrite']:
        raise UserError(f"{r.ckpt_path} already exists; resume it with --init_from=resume, choose another --out_dir, "
                        f"or pass --overwrite=True to replace it.")
    # a new run deletes the acts.png there (open_for_try), a comparison's; a resume deletes nothing
    if checkpoint is None and os.path.exists(os.path.join(r.out_dir, 'summary.json')):
        raise UserError(f"{r.out_dir} holds a comparison (its summary.json), whose pictures a run there would replace; "
                        f"choose another --out_dir.")
    for seed in (random.seed, np.random.seed, torch.manual_seed):  # each rank its own (dropout); DDP broadcasts
        seed(cfg['seed'] + hw.rank)  # rank 0's initial weights
    # the data: this rank's stream of batches, and the validation windows every run on the dataset is scored on
    if hw.ddp and not r.master:  # rank 0 prepares a bundled dataset not prepared yet, the others wait for it
        dist.barrier()
    r.loader = open_loader(cfg['dataset'], cfg['block_size'], cfg['batch_size'], cfg['seed'], cfg['data_dir'],
                           hw.rank, hw.world_size, prepare=r.master)
    if hw.ddp and r.master:
        dist.barrier()
    r.val_hash = r.loader.val_hash(cfg['eval_iters'])  # logged: which windows every evaluation scores
    r.val_batches = [(X.to(hw.device), Y.to(hw.device)) for X, Y in r.loader.val_batches(cfg['eval_iters'])]
    r.accumulation = cfg['gradient_accumulation_steps']
    r.tokens_per_iter = r.accumulation * hw.world_size * cfg['batch_size'] * cfg['block_size']
    # the model: raw_model is the plain module (checkpoints, reports, MFU), model what trains (compiled, DDP)
    r.model_args = model_args(cfg, r.loader.meta, checkpoint)
    if hw.device_type == 'cuda':  # settings() checked the GPU's total memory; now what others left free
        check_memory(cfg, model_config(r.model_args), where=hw.device)
    r.raw_model = (ckpt_io.checkpoint_model(checkpoint, r.ckpt_path, lambda args: GPT(GPTConfig(**args)))
                   if checkpoint else GPT(model_config(r.model_args))).to(hw.device)
    r.optimizer = r.raw_model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                                   (cfg['beta1'], cfg['beta2']), hw.device_type)
    r.scaler = torch.amp.GradScaler(hw.device_type, enabled=hw.dtype == 'float16')  # float16 needs loss scaling
    r.compiled = speed.compile_default(hw.device_type) if cfg['compile'] is None else cfg['compile']
    r.model = speed.compile_model(r.raw_model, cfg['compile_mode']) if r.compiled else r.raw_model
    if hw.ddp:  # every parameter gets a gradient each step (an expert with no token gets zeros): no unused ones
        r.model = DDP(r.model, device_ids=[hw.local_rank] if hw.device_type == 'cuda' else None)
        r.model.broadcast_buffers = False  # the only buffers, RoPE's tables, never change: not re-sent every step
    r.eval_model = r.model.module if hw.ddp else r.model  # no DDP hooks in evaluation
    r.iter_num, r.best_val_loss, r.tokens, r.train_time, r.saved_iter, r.saved_lines = 0, float('inf'), 0, 0.0, None, 0
    if checkpoint is not None:  # optimizer, scaler, counters, and every rank's data stream and RNG, exactly
        restore(checkpoint, r)
    r.lock = r.wandb_run = None
    r.kept = lambda: (  # what a divergence leaves, and what to do: the end of its sentence
        (f"the last good checkpoint {r.ckpt_path} (iteration {r.saved_iter}) is kept" if r.saved_iter is not None
         else 'no checkpoint had been written yet') + f"; {DIVERGED_HINT}{', set grad_clip' * (cfg['grad_clip'] == 0)}"
        f", or use another dtype, then {'resume or ' * (r.saved_iter is not None)}start again")
    r.log_lines, r.has_learned = 0, r.master  # only the master logs, so only it pays for GPT.learned's pass
    if r.master:
        r.lock, owner = try_lock_run_dir(r.out_dir)  # held until the run ends; the kernel drops it if the process dies
        if r.lock is None:
            raise UserError(f"{r.out_dir} is in use by another run ({owner}); wait for it to finish or stop it, or "
                            f"choose another --out_dir.")
        if cfg['wandb_log']:  # before the old run is replaced: a wandb that cannot start leaves it as it was
            r.wandb_run = wandb_log.start(cfg, r.out_dir)
        r.log_lines = open_for_try(r.out_dir, r.saved_iter, r.saved_lines)
        # e.g. --max_iters on a config; a resume with nothing left to train has nothing to note
        if r.iter_num < cfg['max_iters'] and (note := schedule_note(cfg, resumed=checkpoint is not None)):
            print(note, file=sys.stderr)
        print(f"{cfg['dataset']} ({r.loader.meta.get('tokenizer')}, vocab {r.loader.meta['vocab_size']}): "
              f"{r.tokens_per_iter:,} tokens per iteration ({hw.world_size} process(es) x {r.accumulation} "
              f"accumulation steps x {cfg['batch_size']} x {cfg['block_size']})")
        print('parameters: ' + ', '.join(f"{k} {v:,}" for k, v in r.raw_model.param_report().items()))
        print(f"device {hw.device}, dtype {hw.dtype}, {r.threads}, compile {r.compiled}"
              + (f" ({cfg['compile_mode']}, cache {speed.compile_cache_dir()})" if r.compiled else '')
              + (f", resuming at iteration {r.iter_num}" if checkpoint else ''))
    return r


def restore(ckpt, r):
    """A resume of the run r from its checkpoint (save_checkpoint wrote it): the optimizer's moments (its settings,
    weight_decay and betas and the device's fused kernel, are this run's), the loss scaler, the counters, and this
    process's data stream and RNG, exactly when the run has as many processes as the one that saved it (else the
    stream continues, re-split, and dropout's RNG does not). Each is checked by its owner as it loads."""
    with ckpt_io.loading(r.ckpt_path):
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
        decay_was = ckpt['config']['lr_decay_iters'] or ckpt['config']['max_iters']
        r.saved_lines = ckpt['log_lines']  # the log's lines up to it
        r.iter_num, r.best_val_loss, r.tokens, r.train_time = (ckpt[k] for k in ('iter_num', 'best_val_loss',
                                                                                 'tokens', 'train_time'))
        if not len(ckpt['loader']) == len(ckpt['rng']) == ckpt['world_size']:  # refused by every process, rank 0 too
            raise ValueError(f"it holds {len(ckpt['loader'])} data streams and {len(ckpt['rng'])} RNG states for "
                             f"{ckpt['world_size']} process(es)")
        same = ckpt['world_size'] == r.hw.world_size
        r.loader.load_state_dict(ckpt['loader'][r.hw.rank if same else 0], r.tokens)
        if same:
            set_rng_state(ckpt['rng'][r.hw.rank], r.hw.device_type)  # after the model's init used the RNG
    r.saved_iter = r.iter_num
    if ckpt.get('code') not in (None, code_hash()) and r.master:  # notes, like progress, on stderr
        print(f"note: the checkpoint was trained with {OTHER_CODE}; the run continues with the code as it is.",
              file=sys.stderr)
    moved = r.cfg['schedule'] != 'constant' and not r.cfg['lr_decay_iters'] and r.cfg['max_iters'] != decay_was
    if moved and r.master:  # lr_decay_iters=0 follows max_iters
        print(f"note: the learning rate now decays to min_lr at iteration {r.cfg['max_iters']}, not {decay_was}; "
              f"give --lr_decay_iters={decay_was} to keep the checkpoint's schedule.", file=sys.stderr)
    if r.iter_num >= r.cfg['max_iters'] and r.master:
        print(f"note: the checkpoint is at iteration {r.iter_num}, --max_iters={r.cfg['max_iters']}: nothing is left "
              f"to train; give a larger --max_iters to go on.", file=sys.stderr)
    if not same and r.master:
        print(f"note: the checkpoint was written by {ckpt['world_size']} process(es), this run has "
              f"{r.hw.world_size}; the data stream continues, dropout randomness does not.", file=sys.stderr)


def rng_state(device_type):
    """This process's RNG states (Python's, numpy's, torch's, and a GPU's own, which its dropout draws from), for a
    checkpoint: plain Python types and tensors only, so that torch.load(weights_only=True) reads it."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {'python': random.getstate(), 'numpy': [name, keys.tolist(), pos, has_gauss, cached],
             'torch': torch.get_rng_state()}
    if device_type in ('cuda', 'mps'):
        state[device_type] = getattr(torch, device_type).get_rng_state()
    return state


def set_rng_state(state, device_type):
    """Puts back what rng_state saved: each generator's setter checks its own state."""
    random.setstate(tuple(v if not isinstance(v, list) else tuple(v) for v in state['python']))
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state['torch'])
    if device_type in ('cuda', 'mps') and device_type in state:  # a run moved from a CPU has none
        getattr(torch, device_type).set_rng_state(state[device_type])


def step(r, lr):
    """One optimizer step over gradient_accumulation_steps micro-batches: forward, backward, clip, step. Returns the
    [total loss, cross-entropy, aux, z] averaged over micro-steps and the gradient norm (0 unclipped), on the device
    (no sync)."""
    for group in r.optimizer.param_groups:
        group['lr'] = lr
    losses = torch.zeros(5, device=r.hw.device)  # and the gradient norm last: 0 where unclipped
    for micro_step in range(r.accumulation):
        X, Y = (t.pin_memory().to(r.hw.device, non_blocking=True) if r.hw.device_type == 'cuda' else t.to(r.hw.device)
                for t in r.loader.next_batch())
        if r.hw.ddp:  # sync gradients across processes on the last micro-step only (nanoGPT's no_sync)
            r.model.require_backward_grad_sync = micro_step == r.accumulation - 1
        with r.autocast:
            _, loss, terms = r.model(X, Y)
        losses[:4] += torch.stack([loss.detach().float(), terms['ce'], terms['aux'], terms['z']]) / r.accumulation
        r.scaler.scale(loss / r.accumulation).backward()
    if r.cfg['grad_clip'] > 0:
        r.scaler.unscale_(r.optimizer)
        losses[4] = torch.nn.utils.clip_grad_norm_(r.model.parameters(), r.cfg['grad_clip'])
    r.scaler.step(r.optimizer)
    r.scaler.update()
    r.optimizer.zero_grad(set_to_none=True)
    r.iter_num, r.tokens = r.iter_num + 1, r.tokens + r.tokens_per_iter
    return losses


def window_losses(window, hw):
    """The per-step losses and gradient norms since the last log line, averaged over processes, on the host: the
    window's one sync, so every step of it has run on the device when this returns."""
    losses = torch.stack(window)  # (steps in window, 5)
    if hw.ddp:
        dist.all_reduce(losses)  # gloo has no AVG: sum, then divide
        losses /= hw.world_size
    return losses.cpu()


def log_record(r, steps, dt, lr):
    """A log line's record from the window's per-step losses and gradient norms (a non-finite one stops the run)."""
    # the losses, and the gradient norms where no scaler skips the step of a bad one (float16's does): clipping by an
    # infinite norm zeroes the update (a silent no-op), or turns an infinite gradient to NaN
    norms = r.cfg['grad_clip'] > 0 and not r.scaler.is_enabled()
    check_finite_steps(steps[:, [0, 1, 4] if norms else [0, 1]], r.iter_num, ['the training loss'] * 2
                       + ['the gradient norm, by which clipping scales the update,'], r.kept())
    total, ce, aux, z, norm = steps[-1].tolist()
    record = {'iter': r.iter_num, 'tokens': r.tokens, 'lr': lr, 'loss': ce, 'ms': dt * 1000.0,
              'tok_s': r.tokens_per_iter / dt, 'batch_hash': r.loader.batch_hash,
              'mfu': r.raw_model.estimate_mfu(r.tokens_per_iter // r.hw.world_size, dt, r.peak) if r.peak else None}
    if r.raw_model.config.n_expert > 0:  # 'loss' is the cross-entropy; aux and z are summed over the MoE layers
        record.update(loss_total=total, aux=aux, z=z)
    if r.cfg['grad_clip'] > 0:  # not finite where float16's loss scaler skipped the step (and lowered its scale)
        record['grad_norm'] = norm if math.isfinite(norm) else None
    return record


def add_evaluation(r, record):
    """Adds the validation loss, its halves and what the activations learned to a log line's record."""
    record['val_loss'], halves = evaluate(r.eval_model, r.val_batches, r.autocast, r.hw)
    if halves is not None:
        record['val_halves'] = halves
    record['val_hash'] = r.val_hash
    if r.has_learned:
        # eagerly: hooks and eval mode must not send compiled blocks into a recompile
        with torch.compiler.set_stance('force_eager'):
            learned = r.raw_model.learned(r.val_batches[0][0])
        r.has_learned = any(learned['layers'])  # a fixed activation learns nothing: not asked again
        if r.has_learned:
            record['act'] = learned
    return record['val_loss']


def write_log(r, record):
    if r.master:
        if r.env:
            record['env'], r.env = r.env, None
        append_log(os.path.join(r.out_dir, LOG), record)
        r.log_lines += 1
        if r.wandb_run is not None:  # the same record, at the same iteration
            r.wandb_run.log(wandb_log.fields(record), step=record['iter'])


def save_checkpoint(r, val_loss):
    """ckpt.pt at the run's current iteration, everything an exact continuation needs: the plain model's weights, the
    optimizer and loss scaler, the settings and counters, and every process's RNG and loader state (the master
    writes). A Ctrl-C waits for it, and a failed write leaves the previous checkpoint whole (write_checkpoint)."""
    states = [mine := {'rng': rng_state(r.hw.device_type), 'loader': r.loader.state_dict()}]
    if r.hw.ddp:
        states = [None] * r.hw.world_size
        dist.all_gather_object(states, mine)
    if r.master:
        write_checkpoint({
            'model': r.raw_model.state_dict(), 'optimizer': r.optimizer.state_dict(),
            'scaler': r.scaler.state_dict() if r.scaler.is_enabled() else None, 'model_args': r.model_args,
            'config': r.cfg, 'meta': r.loader.meta,  # meta: the tokenizer, to sample
            'iter_num': r.iter_num, 'best_val_loss': r.best_val_loss, 'val_loss': val_loss, 'tokens': r.tokens,
            'train_time': r.train_time, 'world_size': r.hw.world_size,
            'compiled': r.compiled,  # whether its times are compiled or eager times
            'code': code_hash(),  # of activations.py and model.py: a resume says when they changed since
            'rng': [s['rng'] for s in states], 'loader': [s['loader'] for s in states], 'log_lines': r.log_lines,
        }, r.ckpt_path)
    r.saved_iter = r.iter_num


def write_checkpoint(ckpt, path):
    """torch.save(ckpt) as path, atomically (files.write_file: a failed write leaves the previous file whole), with a
    Ctrl-C waiting for it."""
    def save(f):
        try:
            torch.save(ckpt, f)
        except RuntimeError as e:  # torch's writer reports a failed write (a full disk) as a RuntimeError
            raise OSError(getattr(e.__context__, 'errno', None), getattr(e.__context__, 'strerror', None) or
                          'the write failed, e.g. the disk is full') from None
    with ctrl_c_held():
        write_file(path, save, binary=True)


def train(r):
    """The loop: optimizer steps, a log line every log_interval, an evaluation and a checkpoint every eval_interval."""
    cfg = r.cfg
    pbar = progress_bar(cfg['max_iters'], 'train', initial=r.iter_num,  # no bar where no step is left to take
                        disable=not r.master or r.iter_num >= cfg['max_iters'])
    compiling = speed.compile_seconds if r.compiled else (lambda: 0.0)
    failed = True
    try:
        if r.iter_num == 0:  # the untrained model's validation loss starts every curve
            record = {'iter': 0, 'tokens': 0, 'lr': get_lr(0, cfg), 'batch_hash': r.loader.batch_hash}
            try:
                check_finite_weights(r.raw_model, add_evaluation(r, record), 0, r.kept())
            except Diverged:  # logged without its numbers (NaN is no JSON): the try, its settings and code are known
                write_log(r, {k: record[k] for k in ('iter', 'tokens', 'lr', 'batch_hash')})
                raise
            write_log(r, record)
            if r.master:
                pbar.write(f"iter 0: val loss {record['val_loss']:.4f}")
        # per-step losses since the last log line stay on the device: one sync per log line, not per step
        window, t_window, c_window = [], time.time(), compiling()
        while r.iter_num < cfg['max_iters']:
            lr = get_lr(r.iter_num, cfg)
            window.append(step(r, lr))
            pbar.update(1)
            is_eval = r.iter_num % cfg['eval_interval'] == 0 or r.iter_num == cfg['max_iters']
            if not (is_eval or r.iter_num % cfg['log_interval'] == 0):
                continue
            steps = window_losses(window, r.hw)  # first: a GPU runs the steps after the loop has queued them
            # step time leaves out compiling (a compiled run's first steps trace and build their graphs)
            dt = (time.time() - t_window - (compiling() - c_window)) / len(window)
            r.train_time += dt * len(window)
            record = log_record(r, steps, dt, lr)
            pbar.set_postfix(loss=f"{record['loss']:.4f}", lr=f'{lr:.2e}', ms=f'{dt * 1000:.0f}')
            if is_eval:
                val_loss = add_evaluation(r, record)
                check_finite_weights(r.raw_model, val_loss, r.iter_num, r.kept())
                if r.master:
                    pbar.write(f"iter {r.iter_num}: train loss {record['loss']:.4f}, val loss {val_loss:.4f}")
            write_log(r, record)  # before the checkpoint: a checkpoint always follows its iteration's line
            if is_eval and (val_loss < r.best_val_loss or cfg['always_save_checkpoint']):
                r.best_val_loss = min(r.best_val_loss, val_loss)
                save_checkpoint(r, val_loss)
            window, t_window, c_window = [], time.time(), compiling()  # evaluation and checkpoints left out
        failed = False
    except BaseException as e:
        pbar.leave = False  # a run that stops says one sentence on stderr: the bar makes way for it
        if isinstance(e, Diverged) and r.master:  # the run's outcome: why it stopped stays in its directory
            note_diverged(r.out_dir, e)
        raise
    finally:  # however the run ends
        pbar.close()
        if r.wandb_run is not None:
            r.wandb_run.finish()
        if r.lock is not None:
            r.lock.close()
        r.model = None  # under DDP its reducer must be freed before its process group is destroyed (teardown)
        distributed.teardown(r.hw, failed)


def main(argv):
    cfg, checkpoint = settings(argv)
    r = set_up(cfg, checkpoint)
    train(r)
    if r.master:
        print(f"done: {r.iter_num} iterations, {r.tokens:,} tokens, " + (
            f"best val loss {r.best_val_loss:.4f}, checkpoint {r.ckpt_path} (iteration {r.saved_iter})"
            if r.saved_iter is not None
            else "no checkpoint (max_iters=0 evaluates the untrained model only)"))
        if r.compiled:  # graphs built, and what the on-disk cache served
            print('compile: ' + json.dumps(speed.compile_stats()))


if __name__ == '__main__':
    run_cli(main)
