"""
Train a GPT with a chosen feed-forward layer, in nanoGPT's style: one file, read top to bottom.

    python train.py config/shakespeare_char.py                          # a few minutes on a laptop CPU
    python train.py config/shakespeare_char.py --ffn=polynorm --out_dir=out-pn
    python train.py --out_dir=out-pn --init_from=resume --max_iters=4000 # continue exactly where it stopped
    torchrun --standalone --nproc_per_node=8 train.py config/owt.py     # DDP (nccl on GPUs, gloo on CPU)
    python train.py --help                                              # every key and its default

Settings: a config file and --key=value overrides of configurator.DEFAULTS (every field of GPTConfig is a key too).

Worth knowing:
- batch_size and gradient_accumulation_steps are per process (unlike nanoGPT, accumulation is not divided by the
  number of processes): an iteration is batch_size * block_size * gradient_accumulation_steps * processes tokens.
- log.jsonl holds one JSON object per logged iteration; `iter` counts optimizer steps done. Evaluation lines add
  `val_loss` (and its two halves, `val_halves`: the first and the second half of the validation windows), `val_hash`
  (which windows) and `act` (what the activations learned, see model.GPT.learned). The checkpoint written at iteration
  k follows line k, and a resumed run drops any line past its checkpoint before appending.
- init_from=resume takes the settings saved in out_dir/ckpt.pt and applies only what you pass on top; the model keys
  and the data stream (dataset, batch_size, block_size, seed) cannot change. One run per out_dir (a lock).
- A run stops (exit status 3) when a loss or the weights become non-finite (its reason then in out_dir/stopped.txt)
  or a file cannot be written; a checkpoint only ever holds finite weights. NANOFFN_NAN_AT=k makes iteration k's
  loss NaN.
"""
from machinery.cli import quiet_interrupt  # first of all: a Ctrl-C while torch imports ends as quietly as one later
quiet_interrupt(__name__)
import hashlib
import json
import math
import os
import random
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import DEFAULTS, MODEL_KEYS, STREAM_KEYS, TYPES, check, check_memory, model_config
from machinery import device, wandb_log
from machinery.checkpoint import (CKPT, checkpoint_model, load_checkpoint, model_state, optimizer_fault, rng_state,
                                  save_checkpoint, set_rng_state, unusable)
from machinery.cli import RunStopped, UserError, parse_args, run_cli
from machinery.files import lock_run_dir, write_text
from machinery.progress import progress_bar
from machinery.run_log import LOG, STOPPED, append_log, truncate_log
from model import GPT

DIVERGED_HINT = 'lower learning_rate, set grad_clip, or use another dtype'


class Diverged(RunStopped):
    """A loss or the weights became non-finite: the run's outcome at these settings, kept in out_dir/stopped.txt."""


def settings(argv):
    """The run's settings and, to resume, its checkpoint. A resumed run takes the settings saved in the checkpoint
    with only the keys given explicitly on top; the model keys and the data stream cannot change."""
    cfg, given = parse_args(DEFAULTS, argv, types=TYPES, prog='train.py', doc=__doc__.split('\n\n')[1])
    if cfg['init_from'] != 'resume':
        check(cfg)
        return cfg, None
    checkpoint = load_checkpoint(cfg['out_dir'], "point --out_dir at an earlier run's directory or start one with "
                                                 "--init_from=scratch.")
    saved = checkpoint['config']
    for key in MODEL_KEYS + STREAM_KEYS:
        was = checkpoint['model_args'].get(key) if key in MODEL_KEYS else saved.get(key)
        if key in given and cfg[key] != was and not (key == 'vocab_size' and cfg[key] == 0):
            raise UserError(f"--{key}={cfg[key]} differs from the checkpoint's {was!r}; a resumed run keeps its "
                            f"model and data stream, so drop --{key} or train a new run in another out_dir.")
    out_dir = cfg['out_dir']  # the run may have been moved since
    cfg = {**DEFAULTS, **{k: v for k, v in saved.items() if k in DEFAULTS}, **{k: cfg[k] for k in given}}
    cfg.update(init_from='resume', out_dir=out_dir)
    check(cfg)  # only now: the model keys not given are the checkpoint's, not the defaults
    return cfg, checkpoint


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


class Trainer:
    """One training run, in the order it happens: setup (system, data, model, resume, run directory) in __init__,
    then train(): the loop of train_step()s, with evaluate() and save_checkpoint() at evaluation lines."""

    def __init__(self, cfg, checkpoint):
        self.cfg, self.out_dir = cfg, cfg['out_dir']
        self.ckpt_path = os.path.join(self.out_dir, CKPT)
        self.log_path = os.path.join(self.out_dir, LOG)
        self.setup_system()
        self.setup_data()
        self.setup_model(checkpoint)
        if checkpoint is not None:
            self.resume(checkpoint)
        self.open_run_dir(resumed=checkpoint is not None)

    # ---- setup ---------------------------------------------------------------------------------------------------

    def setup_system(self):
        """Device, processes (DDP under torchrun), precision (device.setup), seeds."""
        cfg = self.cfg
        hw = device.setup(cfg['device'], cfg['dtype'])
        self.device, self.device_type, self.dtype = hw.device, hw.device_type, hw.dtype
        self.ddp, self.rank, self.local_rank, self.world_size = hw.ddp, hw.rank, hw.local_rank, hw.world_size
        self.master = self.rank == 0  # only the master process logs and writes checkpoints
        self.autocast = device.autocast(self.device_type, self.dtype)
        if cfg['init_from'] == 'scratch' and os.path.exists(self.ckpt_path) and not cfg['overwrite']:
            raise UserError(f"{self.ckpt_path} already exists; resume it with --init_from=resume, choose another "
                            f"--out_dir, or pass --overwrite=True to replace it.")
        self.gas = cfg['gradient_accumulation_steps']
        self.tokens_per_iter = self.gas * self.world_size * cfg['batch_size'] * cfg['block_size']
        # every rank seeds differently (dropout); DDP broadcasts rank 0's initial weights
        random.seed(cfg['seed'] + self.rank)
        np.random.seed(cfg['seed'] + self.rank)
        torch.manual_seed(cfg['seed'] + self.rank)

    def setup_data(self):
        """The loader and the fixed validation batches: every run on the dataset is evaluated on the same windows,
        identified by val_hash in the log."""
        from data.loader import DataLoader
        cfg = self.cfg
        self.loader = DataLoader(cfg['dataset'], cfg['block_size'], cfg['batch_size'], cfg['seed'], rank=self.rank,
                                 world_size=self.world_size, data_dir=cfg['data_dir'])
        self.meta = self.loader.meta
        val_batches = self.loader.val_batches(cfg['eval_iters'])
        self.val_hash = hashlib.sha256(b''.join(X.numpy().tobytes() + Y.numpy().tobytes()
                                                for X, Y in val_batches)).hexdigest()
        # on the device once: every evaluation reads the same windows
        self.val_batches = [(X.to(self.device), Y.to(self.device)) for X, Y in val_batches]

    def setup_model(self, checkpoint):
        """The GPT (with the checkpoint's weights when resuming), its optimizer and loss scaler, compiled and wrapped in
        DDP as asked. self.raw_model is the plain module (checkpoints, reports, MFU)."""
        cfg = self.cfg
        self.model_args = dict(checkpoint['model_args']) if checkpoint else {k: cfg[k] for k in MODEL_KEYS}
        if checkpoint is None and cfg['vocab_size'] == 0:
            self.model_args['vocab_size'] = self.meta['vocab_size']
        elif checkpoint is None and cfg['vocab_size'] < self.meta['vocab_size']:
            raise UserError(f"--vocab_size={cfg['vocab_size']} is smaller than the dataset's "
                            f"{self.meta['vocab_size']} tokens; leave it at 0 to take the dataset's.")
        vocabulary = lambda meta: [meta.get(k) for k in ('tokenizer', 'vocab_size', 'itos')]
        if checkpoint is not None and vocabulary(checkpoint['meta']) != vocabulary(self.meta):
            raise UserError(f"{cfg['dataset']} has another vocabulary than this run trained on (prepared again?); "
                            f"resume with the data it trained on, or train a new run in another out_dir.")
        if self.device_type == 'cuda':  # settings() checked the GPU's total memory; now what others left free
            check_memory(cfg, model_config(self.model_args), where=self.device)
        model = checkpoint_model(checkpoint, self.ckpt_path) if checkpoint else GPT(model_config(self.model_args))
        self.raw_model = model.to(self.device)
        self.optimizer = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                                    (cfg['beta1'], cfg['beta2']), self.device_type)
        # fp16 needs loss scaling to keep small gradients from underflowing; a no-op otherwise
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=(self.dtype == 'float16'))
        self.iter_num, self.best_val_loss, self.tokens, self.train_time, self.log_lines = 0, float('inf'), 0, 0.0, 0
        self.saved_iter = None  # iteration of the checkpoint on disk (None: none written in this run's lineage)
        self.use_compile = device.compile_default(self.device_type) if cfg['compile'] is None else cfg['compile']
        if self.use_compile:
            model = device.compile_model(model, cfg['compile_mode'])  # regional: the blocks of raw_model, in place
        if self.ddp:
            # every parameter gets a gradient each step (an expert that got no token gets zeros): no unused-parameter
            # search needed
            model = DDP(model, device_ids=[self.local_rank] if self.device_type == 'cuda' else None)
            model.broadcast_buffers = False  # the only buffers, RoPE's tables, never change: not re-sent every step
        self.model = model
        self.eval_model = model.module if self.ddp else model  # no DDP hooks in evaluation

    def resume(self, checkpoint):
        """Optimizer, scaler, counters, and every rank's data stream and RNG, from the checkpoint."""
        # the checkpoint brings the moments; weight_decay, betas and the device's fused kernel are this run's (merged
        # before loading, which places each state by its group's kernel)
        saved, built = checkpoint['optimizer'], [{k: v for k, v in g.items() if k != 'params'}
                                                 for g in self.optimizer.param_groups]
        if fault := optimizer_fault(saved, self.optimizer):
            raise unusable(self.ckpt_path, fault)
        self.optimizer.load_state_dict({**saved, 'param_groups': [{**s, **b} for s, b in zip(saved['param_groups'],
                                                                                            built)]})
        if checkpoint.get('scaler'):
            self.scaler.load_state_dict(checkpoint['scaler'])
        self.iter_num, self.best_val_loss = checkpoint['iter_num'], checkpoint['best_val_loss']
        self.tokens, self.train_time = checkpoint['tokens'], checkpoint['train_time']
        if checkpoint['world_size'] == self.world_size:  # every rank continues its own stream and RNG exactly
            self.loader.load_state_dict(checkpoint['loader'][self.rank])
            set_rng_state(checkpoint['rng'][self.rank], self.device_type)  # after the model's init used the RNG
        else:  # the stream continues (the loader re-splits it), but dropout's randomness does not
            self.loader.load_state_dict(checkpoint['loader'][0])
            if self.master:
                print(f"note: the checkpoint was written by {checkpoint['world_size']} process(es), this run has "
                      f"{self.world_size}; the data stream continues, dropout randomness does not.")
        self.saved_iter = self.iter_num

    def open_run_dir(self, resumed):
        """Lock out_dir, then change it: a resumed run drops the log lines past its checkpoint, a new one replaces
        an old run (--overwrite=True) only now that everything it needs has been checked."""
        cfg = self.cfg
        self.lock = self.wandb_run = None
        self.has_learned = self.master  # only the master logs, so only it pays for learned()'s extra pass
        if not self.master:
            return
        self.lock = lock_run_dir(self.out_dir)  # held until train() ends; the kernel drops it if the process dies
        if cfg['wandb_log']:  # before the old run is replaced: a wandb that cannot start leaves it as it was
            self.wandb_run = wandb_log.start(cfg, self.out_dir)
        for name in os.listdir(self.out_dir):  # a new try of a run that stopped, or that was killed mid-save
            if name == STOPPED or name.startswith('.ckpt.pt.tmp'):
                os.remove(os.path.join(self.out_dir, name))
        # a new run's log is emptied now: a folder that cannot take it stops the run before it trains, and the old
        # run's log cannot outlive its checkpoint
        self.log_lines = truncate_log(self.log_path, self.saved_iter if resumed else -1)
        if not resumed and os.path.exists(self.ckpt_path):  # the old run goes now, not at the first save, so a
            os.remove(self.ckpt_path)  # resume can never join the old checkpoint to the new log
        print(f"{cfg['dataset']} ({self.meta.get('tokenizer')}, vocab {self.meta['vocab_size']}): "
              f"{self.tokens_per_iter:,} tokens per iteration ({self.world_size} process(es) x {self.gas} accumulation "
              f"steps x {cfg['batch_size']} x {cfg['block_size']})")
        print('parameters: ' + ', '.join(f"{k} {v:,}" for k, v in self.raw_model.param_report().items()))
        print(f"device {self.device}, dtype {self.dtype}, compile {self.use_compile}"
              + (f" ({cfg['compile_mode']}, cache {device.compile_cache_dir()})" if self.use_compile else '')
              + (f", resuming at iteration {self.iter_num}" if resumed else ''))

    # ---- evaluation and checkpoints ------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self):
        """Mean cross-entropy over the fixed validation batches, split across processes, in eval mode; and the means
        over their first and second halves (so one half can choose a setting and the other report it)."""
        self.eval_model.eval()
        n = len(self.val_batches)
        total = torch.zeros(4, device=self.device, dtype=torch.float64)  # [sum, count] of each half
        for i in range(self.rank, n, self.world_size):
            X, Y = self.val_batches[i]
            with self.autocast:
                _, loss, _ = self.eval_model(X, Y)
            half = 2 * int(i >= n // 2)
            total[half:half + 2] += torch.stack([loss.double(), torch.ones_like(loss, dtype=torch.float64)])
        if self.ddp:
            dist.all_reduce(total)
        self.eval_model.train()
        halves = [(total[0] / total[1]).item(), (total[2] / total[3]).item()] if n >= 2 else None
        return ((total[0] + total[2]) / (total[1] + total[3])).item(), halves

    def learned(self):
        """What the activations learned (GPT.learned) on the first validation batch: an extra eager pass, on
        evaluation lines only. None for fixed activations, which are then not asked again."""
        if not self.has_learned:
            return None
        with device.eager():  # hooks and eval mode must not send compiled blocks into a recompile
            report = self.raw_model.learned(self.val_batches[0][0])
        self.has_learned = any(report['layers'])
        return report if self.has_learned else None

    def check_finite(self, val_loss):
        """Stop before a checkpoint could hold a diverged model. A step's training loss is computed before its update,
        so it cannot see the update that broke the weights: the weights and the validation loss can."""
        finite = math.isfinite(val_loss) and all(bool(p.isfinite().all()) for p in self.raw_model.parameters())
        if not finite:
            raise Diverged(f"the weights became non-finite at iteration {self.iter_num} (validation loss {val_loss}), "
                           f"so the run stopped and {self.last_checkpoint()}; {DIVERGED_HINT}, then resume or start "
                           f"again.")

    def last_checkpoint(self):
        if self.saved_iter is not None:
            return f"the last good checkpoint {self.ckpt_path} (iteration {self.saved_iter}) is kept"
        return 'no checkpoint had been written yet'

    def save_checkpoint(self, val_loss):
        """Everything an exact continuation needs: weights, optimizer, RNG and loader state of every process."""
        states = [{'rng': rng_state(self.device_type), 'loader': self.loader.state_dict()}]
        if self.ddp:
            states = [None] * self.world_size
            dist.all_gather_object(states, {'rng': rng_state(self.device_type), 'loader': self.loader.state_dict()})
        if self.master:
            save_checkpoint({
                'model': model_state(self.raw_model.state_dict()), 'optimizer': self.optimizer.state_dict(),
                'scaler': self.scaler.state_dict() if self.scaler.is_enabled() else None,
                'model_args': self.model_args, 'config': self.cfg, 'meta': self.meta,  # meta: the tokenizer, to sample
                'iter_num': self.iter_num, 'best_val_loss': self.best_val_loss, 'val_loss': val_loss,
                'tokens': self.tokens, 'train_time': self.train_time, 'world_size': self.world_size,
                'compiled': self.use_compile,  # whether its times are compiled or eager times
                'rng': [s['rng'] for s in states], 'loader': [s['loader'] for s in states], 'log_lines': self.log_lines,
            }, self.out_dir)
        self.saved_iter = self.iter_num

    def write_log(self, record):
        if self.master:
            append_log(self.log_path, record)
            self.log_lines += 1
            if self.wandb_run is not None:  # the same record, at the same iteration
                self.wandb_run.log(wandb_log.fields(record), step=record['iter'])

    # ---- the loop ------------------------------------------------------------------------------------------------

    def train_step(self, lr, nan_at):
        """One optimizer step over gradient_accumulation_steps micro-batches. Returns the detached
        [total loss, cross-entropy, aux, z], averaged over micro-steps, on the device (no sync), and the grad norm."""
        for group in self.optimizer.param_groups:
            group['lr'] = lr
        parts = torch.zeros(4, device=self.device)
        for micro_step in range(self.gas):
            X, Y = self.loader.next_batch()
            pin = self.device_type == 'cuda'
            X, Y = (X.pin_memory() if pin else X).to(self.device, non_blocking=pin), \
                (Y.pin_memory() if pin else Y).to(self.device, non_blocking=pin)
            if self.ddp:  # sync gradients across processes on the last micro-step only (nanoGPT's no_sync)
                self.model.require_backward_grad_sync = micro_step == self.gas - 1
            with self.autocast:
                _, loss, pieces = self.model(X, Y)
            if self.iter_num + 1 == nan_at:  # this step completes iteration iter_num + 1
                loss = loss * float('nan')
            parts += torch.stack([loss.detach().float(), pieces['ce'], pieces['aux'], pieces['z']]) / self.gas
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

    def window_losses(self, window):
        """The per-step losses since the last log line, averaged over processes, on the host: the window's one sync,
        so every step of it has run on the device when this returns."""
        losses = torch.stack(window)  # (steps in window, 4)
        if self.ddp:
            dist.all_reduce(losses)  # gloo has no AVG: sum, then divide
            losses /= self.world_size
        return losses.cpu()

    def log_record(self, losses, dt, lr, grad_norm):
        """A log line's record from the window's per-step losses; Diverged naming the first step whose loss was not
        finite."""
        bad = (~torch.isfinite(losses[:, :2])).any(1).nonzero()
        if len(bad):
            k = self.iter_num - len(losses) + int(bad[0]) + 1  # the iteration this step completed, as in the log
            raise Diverged(f"the training loss became non-finite ({losses[int(bad[0]), 0].item()}) at iteration "
                           f"{k}, so the run stopped and {self.last_checkpoint()}; {DIVERGED_HINT}, then resume or "
                           f"start again.")
        total, ce, aux, z = losses[-1].tolist()
        peak = device.peak_flops(self.device_type, self.dtype, self.cfg['peak_flops'])
        record = {'iter': self.iter_num, 'tokens': self.tokens, 'lr': lr, 'loss': ce, 'ms': dt * 1000.0,
                  'tok_s': self.tokens_per_iter / dt, 'batch_hash': self.loader.batch_hash,
                  'mfu': self.raw_model.estimate_mfu(self.tokens_per_iter // self.world_size, dt, peak) if peak else None}
        if self.raw_model.config.n_expert > 0:
            record.update(loss_total=total, aux=aux, z=z)
        if grad_norm is not None:  # not finite where float16's loss scaler skips a step (and lowers its scale)
            record['grad_norm'] = norm if math.isfinite(norm := grad_norm.item()) else None
        return record

    def evaluation(self, record):
        """Adds the validation loss, its halves and what the activations learned to a log line's record."""
        record['val_loss'], halves = self.evaluate()
        if halves is not None:
            record['val_halves'] = halves
        record['val_hash'] = self.val_hash
        if (learned := self.learned()) is not None:
            record['act'] = learned
        return record['val_loss']

    def train(self):
        cfg, nan_at = self.cfg, int(os.environ.get('NANOFFN_NAN_AT', -1))
        pbar = progress_bar(cfg['max_iters'], 'train', initial=self.iter_num, disable=not self.master)
        compiling = device.compile_seconds if self.use_compile else (lambda: 0.0)
        failed = True
        try:
            if self.iter_num == 0:  # the untrained model's validation loss starts every curve
                record = {'iter': 0, 'tokens': 0, 'lr': get_lr(0, cfg), 'batch_hash': self.loader.batch_hash}
                self.evaluation(record)
                self.write_log(record)
                if self.master:
                    pbar.write(f"iter 0: val loss {record['val_loss']:.4f}")
            # per-step losses since the last log line stay on the device: one sync per log line, not per step
            window, t_window, c_window = [], time.time(), compiling()
            while self.iter_num < cfg['max_iters']:
                lr = get_lr(self.iter_num, cfg)
                parts, grad_norm = self.train_step(lr, nan_at)
                window.append(parts)
                pbar.update(1)
                is_eval = self.iter_num % cfg['eval_interval'] == 0 or self.iter_num == cfg['max_iters']
                if not (is_eval or self.iter_num % cfg['log_interval'] == 0):
                    continue
                losses = self.window_losses(window)  # first: a GPU runs the steps after the loop has queued them
                # step time leaves out compiling (a compiled run's first steps trace and build their graphs)
                dt = (time.time() - t_window - (compiling() - c_window)) / len(window)
                self.train_time += dt * len(window)
                record = self.log_record(losses, dt, lr, grad_norm)
                pbar.set_postfix(loss=f"{record['loss']:.4f}", lr=f'{lr:.2e}', ms=f'{dt * 1000:.0f}')
                if is_eval:
                    val_loss = self.evaluation(record)
                    self.check_finite(val_loss)
                    if self.master:
                        pbar.write(f"iter {self.iter_num}: train loss {record['loss']:.4f}, val loss {val_loss:.4f}")
                self.write_log(record)  # before the checkpoint: the checkpoint at iteration k always follows line k
                if is_eval and (val_loss < self.best_val_loss or cfg['always_save_checkpoint']):
                    self.best_val_loss = min(self.best_val_loss, val_loss)
                    self.save_checkpoint(val_loss)
                window, t_window, c_window = [], time.time(), compiling()  # evaluation and checkpoints left out
            failed = False
        except BaseException as e:
            pbar.leave = False  # a run that stops says one sentence on stderr: the bar makes way for it
            # a diverged run leaves why in its directory: compare.py counts it as a result, never to retrain; any other
            # stop (a failed write) is not one, so the same command again continues the run
            if isinstance(e, Diverged) and self.master:
                try:
                    write_text(os.path.join(self.out_dir, STOPPED), f"{e}\n")
                except RunStopped:
                    pass
            raise
        finally:
            self.close(pbar, failed)
        if self.master:
            print(f"done: {self.iter_num} iterations, {self.tokens:,} tokens, " + (
                f"best val loss {self.best_val_loss:.4f}, checkpoint {self.ckpt_path}" if self.saved_iter is not None
                else "no checkpoint (max_iters=0 evaluates the untrained model only)"))
            if self.use_compile:  # graphs built, and what the on-disk cache served
                print('compile: ' + json.dumps(device.compile_stats()))

    def close(self, pbar, failed):
        pbar.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if self.lock is not None:
            self.lock.close()
        if self.ddp:
            # after a clean end every rank meets here before any tears its process group down (a rank that destroys
            # the group while another is still in a collective aborts the process); after a failure the other ranks
            # may wait in a collective this rank never joins, so it leaves at once and torchrun stops them
            if not failed:
                try:
                    dist.barrier()
                except Exception:  # a peer already gone (it failed; torchrun stops this run anyway)
                    pass
            dist.destroy_process_group()


def main(argv):
    cfg, checkpoint = settings(argv)
    Trainer(cfg, checkpoint).train()


if __name__ == '__main__':
    run_cli(main)
