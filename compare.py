"""
Train FFN variants side by side and draw their loss curves: the one command behind the README's comparisons.

    python compare.py                                                       # = config/compare_shakespeare_char.py
    python compare.py config/compare_shakespeare_char.py                    # 8 variants x 3 seeds, 2-core CPU
    python compare.py config/compare_shakespeare_char.py --variants=gelu,polynorm --seeds=2 --max_iters=300
    python compare.py config/compare_owt_dense.py                           # one GPU, OpenWebText
    python compare.py config/compare_ladder_shakespeare_char.py             # a scaling ladder: 3 sizes, 2-core CPU
    python compare.py --help                                                # every key (train.py's + the ones below)

Every run is a plain train.py run in its own directory, <out_dir>/<variant>/seed<seed>, started as a subprocess with
the same settings except ffn and seed. So all variants of one seed see the same training batches (the loader's order
depends only on dataset, seed, batch_size, block_size), all runs are scored on the same validation windows, and all
share the token budget and learning-rate schedule (the logs' batch_hash and val_hash are checked). Seeds are seed,
seed+1, ..., seed+seeds-1. --jobs=N trains N runs at a time and --threads=T gives each T threads (OMP_NUM_THREADS):
on a CPU, tiny models train fastest as one single-threaded run per core.

On GPUs the runs are placed on the visible GPUs: each run's CUDA_VISIBLE_DEVICES names exactly its own GPU, dealt
round robin, so by default (--jobs=0) there is one run per GPU at a time, and --jobs=16 on 8 GPUs puts two small runs
on each. --nproc_per_run=N launches every run with torchrun as an N-process DDP run on N GPUs of its own (on a CPU:
N gloo processes).

Any scheduler can run them instead (a Slurm job array, GNU parallel, xargs -P, Ray, Kubernetes Jobs):

    python compare.py ... --plan > plan.txt            # the exact command of every run still to do, one per line
    xargs -d '\\n' -n 1 -P 4 sh -c < plan.txt           # or one Slurm array task per line, on a shared filesystem
    python compare.py ... --report                     # the summary and plots from the finished run directories

A plan line is train.py with every setting explicit and absolute paths, writing into the run's own directory. Such a
run is recognised afterwards by the settings in its checkpoint (train.py saves all of them), checked like a run
compare.py started itself; a plain rerun without --report also reuses it and trains whatever is still missing.

Re-running the same command reuses what is there: a run whose log reached max_iters with its final evaluation is
reused as it is, a cut-off run resumes from its checkpoint (init_from=resume), and a run that stopped on a non-finite
loss (train.py exit status 3) is reported as stopped rather than retried. Each run directory compare.py trained keeps
compare.json (the settings it was started with, and how it ended) and train.out (its output). A run's settings are
read from its checkpoint's config when it has one, else from compare.json; a directory whose run has other settings
(or a log that neither says) is refused; pass --overwrite=True to retrain those runs from scratch (to retry a stopped
run, delete its directory).

Writes into out_dir: loss.png (validation loss against tokens and against training time, mean over seeds with a
min-max band, and the smoothed training loss), summary.json and summary.md (per variant: parameters, final validation
loss mean ± std over seeds, the paired difference to the baseline with its std over seeds and a paired t-test,
tokens/s, training time, the compute- and time-matched verdicts, and what learnable activations learned, from the last
evaluation's `act` record); acts.png and acts.json (one row per variant, its first seed: the learned activation
functions over the pre-activations they see, against their init, and how far each moved; see inspect_run.py); and
prints the table on stdout (progress goes to stderr, so `python compare.py > summary.md` keeps just the results).
All numbers come from the runs' own log.jsonl files (acts.png: their checkpoints), so the same runs always give the
same summary.

Compiled runs (--compile=True, or by default on CUDA and for CPU runs large enough to pay for it: see train.py's
use_compile) share torch.compile's on-disk cache (common.compile_cache_dir(); clear it with
rm -rf ~/.cache/nanoffn/torchinductor): runs are started seed by seed, so the first seed compiles each variant's
graphs once and the other seeds load them from the cache. The summary then gives each variant's compile seconds
apart from its train time.

A scaling ladder (--sizes=2x64,3x96,4x128, n_layer x n_embd [x n_head]): the same comparison at every size, each an
ordinary comparison in <out_dir>/<size>/ (reused and resumed as above, so adding a size extends a ladder), with the
token budget fixed (max_iters) or --tokens_per_param=K, and the learning rate fixed or --lr_rule=width; then
out_dir/ladder.png, summary.md and summary.json: final loss against non-embedding parameters and training FLOPs, each
variant's gap to the baseline per size, its trend with size, and the power-law fit (see ladder.py).
"""
import os
import shlex
import signal
import subprocess
import sys
import time

import inspect_run
import ladder
import report
import train
from activations import check_variant
from common import (LOCK_FD_ENV, checkpoint_field, compile_cache_dir, progress_bar, read_json, read_log,
                    resolve_device, try_lock_run_dir, write_json)
from configurator import RunStopped, UserError, parse_args, run_cli
from report import PER_RUN_KEYS, fmt_value

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_PY = os.path.join(HERE, 'train.py')

COMPARE_DEFAULTS = dict(
    variants='gelu,swiglu',  # comma-separated ffn names (see activations.VARIANTS)
    seeds=1,  # number of seeds per variant: seed, seed+1, ...
    baseline='',  # the variant the others are compared with; '' = the first of variants
    smooth=0.9,  # EMA factor for the plotted training loss (per log line), 0 = raw
    jobs=0,  # runs trained at the same time; 0 = one per visible GPU (per nproc_per_run GPUs), 1 on a CPU
    threads=0,  # OMP_NUM_THREADS for each run; 0 = leave the environment's setting
    # a scaling ladder (ladder.py): the comparison at several sizes, each in <out_dir>/<n_layer>x<n_embd>/
    sizes='',  # '' = one size (n_layer, n_embd, n_head as set); e.g. 2x64,3x96,4x128 (n_layer x n_embd [x n_head])
    tokens_per_param=0.0,  # 0 = max_iters at every size; K > 0: K tokens per non-embedding parameter of the baseline
    lr_rule='fixed',  # 'fixed': learning_rate at every size; 'width': learning_rate x first width / width
    nproc_per_run=1,  # processes per run: more than 1 launches each run with torchrun (DDP on that many GPUs)
    plan=False,  # print the command of every run still to do, one per line, for another scheduler; train nothing
    report=False,  # build the summary and plots from finished run directories; train nothing
)
DEFAULTS = {**train.DEFAULTS, **COMPARE_DEFAULTS, 'out_dir': 'out-compare'}
RECORD = 'compare.json'  # in each run directory: the settings it was started with, and how it ended
WHERE_KEYS = ('out_dir', 'data_dir', 'init_from', 'overwrite')  # where a run lives and how it starts, not what it is
STOPPED_EXIT = 3  # train.py's exit status for a run that stopped (non-finite loss)


# ----------------------------------------------------------------------------------------------------------------------
# planning the runs


def plan(cfg, given):
    """The list of runs: dicts with variant, seed, dir and the train.py arguments (a key -> text dict)."""
    variants = [v.strip() for v in cfg['variants'].split(',') if v.strip()]
    if not variants:
        raise UserError("--variants is empty; give comma-separated ffn names, e.g. --variants=gelu,swiglu.")
    for v in variants:
        try:
            check_variant(v)
        except ValueError as e:
            raise UserError(f"--variants: {e}.") from None
    if len(set(variants)) != len(variants):
        raise UserError(f"--variants names a variant twice ({cfg['variants']}); list each once.")
    if cfg['seeds'] < 1:
        raise UserError(f"--seeds must be at least 1, got {cfg['seeds']}.")
    baseline = cfg['baseline'] or variants[0]
    if baseline not in variants:
        raise UserError(f"--baseline={baseline} is not one of --variants ({','.join(variants)}); add it or pick one of them.")
    if cfg['jobs'] < 0 or cfg['threads'] < 0 or cfg['nproc_per_run'] < 1:
        raise UserError(f"--jobs and --threads must be at least 0 and --nproc_per_run at least 1, got "
                        f"{cfg['jobs']}, {cfg['threads']} and {cfg['nproc_per_run']}.")
    if cfg['plan'] and cfg['report']:
        raise UserError("--plan lists the runs still to do and --report summarises finished ones; pass one of them.")
    if not 0.0 <= cfg['smooth'] < 1.0:
        raise UserError(f"--smooth must be in [0, 1), got {cfg['smooth']}.")
    if cfg['init_from'] != 'scratch':
        raise UserError("compare.py resumes cut-off runs by itself; drop --init_from.")
    for v in variants:
        train.check_config({**cfg, 'ffn': v})  # the mistakes train.py would report, before anything runs
    # the settings every run shares: what the config file and the command line chose, nothing else (train.py's
    # defaults fill the rest, as they would for a plain train.py run)
    shared = {k: fmt_value(cfg[k]) for k in sorted(given) if k in train.DEFAULTS and k not in PER_RUN_KEYS}
    if cfg['compile'] is None and not (cfg['plan'] and cfg['device'] == 'auto'):
        # decided here, once, so that every run of the comparison decides alike (a --plan for device=auto leaves it to
        # each run, on the machine it runs on, which need not be this one)
        shared['compile'] = fmt_value(resolve_compile(cfg)[0])
    seeds = [cfg['seed'] + i for i in range(cfg['seeds'])]
    runs = []
    for v in variants:
        for s in seeds:
            d = os.path.join(cfg['out_dir'], v, f'seed{s}')
            args = {**shared, 'ffn': v, 'seed': str(s), 'out_dir': d, **wandb_args(cfg, v, s)}
            runs.append(dict(variant=v, seed=s, dir=d, processes=cfg['nproc_per_run'], args=args))
    return variants, seeds, baseline, runs


def resolve_compile(cfg):
    """--compile for the runs, and why: as given, or train.py's rule (use_compile) applied to the training that
    shares one compile, a variant over all its seeds (the first seed compiles its graphs, the others load them)."""
    if cfg['compile'] is not None:
        return cfg['compile'], f"--compile={cfg['compile']}"
    steps = cfg['seeds'] * cfg['max_iters'] * cfg['gradient_accumulation_steps']
    device_type = (resolve_device('auto') if cfg['device'] == 'auto' else cfg['device']).split(':')[0]
    on, why = train.use_compile(device_type, steps)
    return on, (f"a variant's {cfg['seeds']} seed(s): " + why) if device_type == 'cpu' else why


def wandb_args(cfg, variant, seed):
    """With --wandb_log=True, the runs of one comparison share a wandb group (--wandb_group, or the out_dir's name)
    and each run is named and tagged by its variant and seed, so the dashboard can group, filter and average them."""
    if not cfg['wandb_log']:
        return {}
    tags = [t.strip() for t in cfg['wandb_tags'].split(',') if t.strip()] + [variant, f'seed{seed}']
    name = f"{variant}-seed{seed}"
    return {'wandb_group': cfg['wandb_group'] or os.path.basename(os.path.abspath(cfg['out_dir'])),
            'wandb_run_name': f"{cfg['wandb_run_name']}-{name}" if cfg['wandb_run_name'] else name,
            'wandb_tags': ','.join(tags)}


def record_args(run):
    """The settings a run is identified by: its train.py arguments except where things are (out_dir, data_dir): a
    comparison or its data may be moved. The logs' batch_hash and val_hash still show whether the data is the same."""
    # a key passed at its default value identifies the same run as the key left out
    return {k: v for k, v in run['args'].items() if identifies(k) and v != train.DEFAULTS.get(k)}


def identifies(key):
    """Whether a train.py key is part of what a run is: not where it lives or how it starts (WHERE_KEYS), nor its
    experiment tracking (wandb_*), nor whether it was compiled (compile, compile_mode: the same training, with final
    losses within 5e-4 of each other, far inside seed noise): a run trained without them is reused with them and the
    other way round. So adding a seed, which can tip the compile rule, keeps the finished runs; the summary says when a
    comparison's runs differ in compilation, as their times then do not compare."""
    return key not in WHERE_KEYS and not key.startswith('wandb_') and key not in ('compile', 'compile_mode')


def full_settings(args, processes=1):
    """A run's complete settings, typed: train.py's defaults with its arguments (text, as on a command line) on top,
    and its number of processes, the keys that identify it only. None if they no longer parse (a key this code does not know)."""
    try:
        cfg, _ = parse_args(train.DEFAULTS, [f'--{k}={v}' for k, v in args.items()], types=train.TYPES)
    except UserError:
        return None
    return {**{k: v for k, v in cfg.items() if identifies(k)}, 'processes': processes}


def found_settings(d):
    """The settings the run in directory d was trained with, whoever started it (compare.py here, or a --plan line
    under another scheduler): its checkpoint's config, which train.py saves complete, else the compare.json that
    compare.py writes before it starts a run; None if neither is there."""
    config = checkpoint_field(d, 'config')
    if config is not None:
        full = {**train.DEFAULTS, **{k: v for k, v in config.items() if k in train.DEFAULTS}}
        return {**{k: v for k, v in full.items() if identifies(k)},
                'processes': checkpoint_field(d, 'world_size') or 1}
    record = read_json(os.path.join(d, RECORD))
    return full_settings(record.get('args', {}), record.get('processes', 1)) if record else None


def run_state(run, max_iters):
    """'done' | 'stopped' | 'resume' | 'scratch' | 'mismatch' for a planned run, from what its directory holds."""
    d = run['dir']
    log = read_log(os.path.join(d, 'log.jsonl'))
    found, wanted = found_settings(d), full_settings(run['args'], run['processes'])
    if found is None:
        return 'mismatch' if log else 'scratch'  # a log that does not say how it was made: not ours to replace
    if found != wanted:
        return 'mismatch'
    if log and log[-1].get('iter') == max_iters and 'val_loss' in log[-1]:
        return 'done'
    if os.path.exists(os.path.join(d, train.STOPPED)):  # train.py's own note: it stopped (e.g. a run of --plan's)
        return 'stopped'
    record = read_json(os.path.join(d, RECORD)) or {}  # or the record of the compare.py that ran it
    recorded = full_settings(record.get('args', {}), record.get('processes', 1))
    if record.get('status') == 'stopped' and recorded == wanted:
        return 'stopped'
    return 'resume' if os.path.exists(os.path.join(d, 'ckpt.pt')) else 'scratch'


def describe_mismatch(run):
    found = found_settings(run['dir'])
    if found is None:
        return f"{run['dir']} holds a log.jsonl but no checkpoint or {RECORD} that says how it was trained"
    wanted = full_settings(run['args'], run['processes'])
    keys = sorted(k for k in wanted if found.get(k) != wanted[k])
    shown = ', '.join(f"{k}={fmt_value(found.get(k))} (now {fmt_value(wanted[k])})" for k in keys[:4])
    return f"{run['dir']} was trained with other settings: {shown}"


def train_command(run, mode):
    """The exact command of one run: train.py with every setting explicit (so it does not depend on the defaults of
    the code that runs it) and absolute paths (so it may run from any directory), through torchrun for several
    processes. mode: 'scratch', 'resume' (from its checkpoint) or 'overwrite' (a run with other settings)."""
    args = {**{k: fmt_value(v) for k, v in train.DEFAULTS.items()}, **run['args']}
    args.update(out_dir=os.path.abspath(run['dir']), data_dir=os.path.abspath(args['data_dir']),
                init_from='resume' if mode == 'resume' else 'scratch', overwrite=str(mode == 'overwrite'))
    n = run['processes']
    launch = [sys.executable] + (['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={n}']
                                 if n > 1 else [])
    return launch + [TRAIN_PY] + [f'--{k}={v}' for k, v in args.items()]


def plan_line(run, mode, threads):
    """A run's command as one shell line, with its thread count in front when --threads is set."""
    prefix = f"OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} " if threads else ''
    return prefix + shlex.join(train_command(run, mode))


# ----------------------------------------------------------------------------------------------------------------------
# where runs go: the visible GPUs


def visible_gpus():
    """The GPUs this process may use, by the names a child's CUDA_VISIBLE_DEVICES must give them: the entries of our
    own CUDA_VISIBLE_DEVICES (indices, UUIDs or MIG ids) when it is set, else 0..n-1."""
    import torch
    n = torch.cuda.device_count()  # counts only the usable entries of CUDA_VISIBLE_DEVICES
    env = os.environ.get('CUDA_VISIBLE_DEVICES')
    names = [d.strip() for d in env.split(',')] if env is not None else [str(i) for i in range(n)]
    return names[:n]


def placement(slots, gpus, nproc):
    """The GPUs of each of `slots` runs trained at the same time: the GPUs cut into groups of nproc (one GPU per DDP
    process), dealt round robin, so 8 runs on 4 GPUs are 2 per GPU. None per slot when there are no GPUs to place on."""
    if not gpus:
        return [None] * slots
    groups = [gpus[i:i + nproc] for i in range(0, len(gpus) - nproc + 1, nproc)]
    return [groups[s % len(groups)] for s in range(slots)]


def job_env(gpus, threads):
    """A run's environment: CUDA_VISIBLE_DEVICES names exactly its GPUs (which it then sees as cuda:0, cuda:1, ...),
    and the number of CPU threads when one is set. With --compile=True every run loads what an earlier one compiled
    from the one on-disk cache: a second seed of a variant traces the same graphs, so it is served from the cache
    (seconds) instead of compiling again."""
    env = {**os.environ, 'PYTHONUNBUFFERED': '1', 'TORCHINDUCTOR_CACHE_DIR': compile_cache_dir()}
    if gpus is not None:
        env['CUDA_VISIBLE_DEVICES'] = ','.join(gpus)
    if threads > 0:  # small CPU models: one thread per run, runs side by side, beats threads fighting for cores
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def resolve_jobs(cfg):
    """The GPUs to place runs on (none for CPU runs, or for a device named explicitly, e.g. cuda:1) and the number of
    runs at a time: --jobs, or with --jobs=0 one per group of nproc_per_run GPUs (1 without GPUs)."""
    gpus = visible_gpus() if cfg['device'] in ('auto', 'cuda') else []
    nproc = cfg['nproc_per_run']
    if gpus and nproc > len(gpus):
        raise UserError(f"--nproc_per_run={nproc} needs {nproc} GPUs per run but {len(gpus)} are visible; lower it.")
    return gpus, cfg['jobs'] or (len(gpus) // nproc if gpus else 1)


# ----------------------------------------------------------------------------------------------------------------------
# running train.py


class Job:
    """One train.py run as a subprocess on its GPUs (None: wherever --device says), output appended to
    run_dir/train.out. `lock` is the run directory's lock (common.try_lock_run_dir), taken by compare.py and handed to
    the child, so no other process can slip in between."""

    def __init__(self, run, mode, threads, lock, slot, gpus, at_once):
        self.run, self.mode, self.slot, self.gpus, self.t0 = run, mode, slot, gpus, time.time()
        d = run['dir']
        self.log_path, self.out_path = os.path.join(d, 'log.jsonl'), os.path.join(d, 'train.out')
        self.resumed_from = checkpoint_field(d, 'iter_num') if mode == 'resume' else None
        # at_once: how many runs this compare.py trains side by side, which the run's tok/s and times depend on
        self.record = {'args': record_args(run), 'processes': run['processes'], 'status': 'running',
                       'at_once': at_once}
        write_json(os.path.join(d, RECORD), self.record)
        cmd, env, fds = train_command(run, mode), job_env(gpus, threads), ()
        if run['processes'] == 1:
            env[LOCK_FD_ENV], fds = str(lock.fileno()), (lock.fileno(),)
        else:  # torchrun does not hand descriptors on to its workers: rank 0 takes the lock itself, a moment later
            lock.close()
        with open(self.out_path, 'a') as out:
            out.write(f"$ {shlex.join(cmd)}\n")
            out.flush()
            try:
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, pass_fds=fds)
            finally:
                lock.close()  # the child holds the lock now (one lock, shared), released when it exits

    @property
    def name(self):
        return f"{self.run['variant']} seed {self.run['seed']}" + (f" (GPU {','.join(self.gpus)})" if self.gpus else '')

    def progress(self):
        """'iter k' and the last training loss, from the run's log.jsonl."""
        log = read_log(self.log_path)
        if not log:
            return 'starting'
        losses = [r['loss'] for r in log if 'loss' in r]
        return f"{log[-1].get('iter', 0)}" + (f" ({losses[-1]:.3f})" if losses else '')

    def interrupt(self, signalled):
        """Stop the child and wait; its last checkpoint is written atomically, so the run resumes later. After a Ctrl-C
        the terminal has already sent it SIGINT: give it a moment to stop by itself before sending another."""
        if signalled:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def finish(self):
        """After the child exited: record how it ended; raise for anything but success or a stop."""
        rc, run = self.proc.returncode, self.run
        tail = last_error_line(self.out_path)
        if rc == 0:
            self.record['status'] = 'done'
        elif rc == STOPPED_EXIT:
            self.record.update(status='stopped', message=tail)
        else:
            self.record.update(status='failed', returncode=rc)
        write_json(os.path.join(run['dir'], RECORD), self.record)
        if rc == 2:  # a user mistake in the settings: train.py said what to do
            raise UserError(f"{tail.removeprefix('error: ').rstrip('.')} (the {run['variant']} run, seed {run['seed']}).")
        if rc in (130, -signal.SIGINT):
            raise KeyboardInterrupt
        if rc not in (0, STOPPED_EXIT):
            raise RunStopped(f"training {run['variant']} (seed {run['seed']}) failed with exit status {rc}: {tail}; "
                             f"see {self.out_path}, fix it and run the same command again to continue.")
        return self.record['status']

    def report(self):
        how = f"resumed from iteration {self.resumed_from}" if self.resumed_from is not None else 'trained'
        line = f"{self.name}: {how} in {time.time() - self.t0:.0f} s"
        if self.record['status'] != 'done':
            return line + f", STOPPED: {self.record.get('message', '')}"
        val = next((r['val_loss'] for r in reversed(read_log(self.log_path)) if 'val_loss' in r), None)
        return line + (f", final val loss {val:.4f}" if val is not None else '')


def train_all(todo, slots, threads, statuses, pbar, max_iters):
    """Run the (run, mode) pairs in todo, one per slot at a time (slots: the GPUs of each, see placement), and fill
    statuses; a finished run's slot, and so its GPUs, goes to the next run. A run whose directory another process
    owns (a second compare.py on the same out_dir, or a train.py) is left to it and taken up once that process is
    done: reused if it finished, resumed if not. So two compare.py on one out_dir share the work."""
    pending, active, waiting, free = list(todo), [], set(), list(range(len(slots)))
    try:
        while pending or active:
            for run, mode in list(pending):
                if not free:
                    break
                lock, owner = try_lock_run_dir(run['dir'])
                if lock is None:
                    if run['dir'] not in waiting:
                        waiting.add(run['dir'])
                        pbar.write(f"{run['variant']} seed {run['seed']}: {run['dir']} is in use by {owner}; "
                                   f"waiting for it", file=sys.stderr)
                    continue
                pending.remove((run, mode))
                state = run_state(run, max_iters)  # another process may have trained it meanwhile
                if state in ('done', 'stopped'):
                    lock.close()
                    statuses[(run['variant'], run['seed'])] = state
                    pbar.write(f"{run['variant']} seed {run['seed']}: reused ({state} by another process)",
                               file=sys.stderr)
                    pbar.update(1)
                    continue
                slot = free.pop(0)
                active.append(Job(run, state if state in ('resume', 'scratch') else mode, threads, lock, slot,
                                  slots[slot], len(slots)))
            time.sleep(0.5)
            for job in [j for j in active if j.proc.poll() is not None]:
                active.remove(job)
                free = sorted(free + [job.slot])
                statuses[(job.run['variant'], job.run['seed'])] = job.finish()
                pbar.write(job.report(), file=sys.stderr)
                pbar.update(1)
            pbar.set_description(', '.join(j.name for j in active) or 'runs')
            pbar.set_postfix_str('iter ' + ', '.join(j.progress() for j in active) if active else '')
    except BaseException as e:  # a failure or Ctrl-C: stop the other runs cleanly (they resume next time)
        for job in active:
            job.interrupt(signalled=isinstance(e, KeyboardInterrupt))
        raise


def last_error_line(path):
    """The reason the last attempt in train.out (appended to by every attempt, each after its `$ command` line)
    stopped: its one-sentence error, else its last line."""
    try:
        with open(path, errors='replace') as f:
            lines = [l.strip() for l in f.read().splitlines() if l.strip()]
    except OSError:
        return ''
    starts = [i for i, l in enumerate(lines) if l.startswith('$ ')]
    lines = lines[starts[-1] + 1:] if starts else lines  # earlier attempts' messages are not this one's
    for line in reversed(lines):
        if line.startswith(('error:', 'stopped:')):
            return line
    return lines[-1] if lines else ''


# ----------------------------------------------------------------------------------------------------------------------


DEFAULT_CONFIG = 'config/compare_shakespeare_char.py'  # what `python compare.py` alone runs
BUNDLED = ('shakespeare_char', 'shakespeare')  # built from the corpus in the repo in seconds, so prepared on demand


def check_dataset(cfg):
    """Report a missing dataset now, before any run starts; prepare a bundled one instead of refusing."""
    from data.loader import DataLoader, DatasetNotPrepared
    open_loader = lambda: DataLoader(cfg['dataset'], cfg['block_size'], cfg['batch_size'], cfg['seed'],
                                     data_dir=cfg['data_dir'])
    try:
        open_loader()
    except DatasetNotPrepared:
        if cfg['dataset'] not in BUNDLED:
            raise
        out = os.path.join(cfg['data_dir'], cfg['dataset'])
        print(f"compare: preparing the bundled dataset {cfg['dataset']} into {out} (once, seconds)", file=sys.stderr)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', cfg['dataset'], 'prepare.py')
        if subprocess.run([sys.executable, script, f'--out_dir={out}'], stdout=subprocess.DEVNULL).returncode != 0:
            raise UserError(f"could not prepare {cfg['dataset']} into {out} (the reason is above); point --data_dir "
                            f"at a folder you can write to.")
        open_loader()


def main(argv):
    if not any(not a.startswith('-') for a in argv):  # no config file given: the default comparison
        argv = [DEFAULT_CONFIG] + list(argv)
    cfg, given = parse_args(DEFAULTS, argv, types=train.TYPES, prog='compare.py', doc=__doc__.split('\n\n')[1])
    if cfg['sizes']:
        return run_ladder(cfg, given)
    if cfg['tokens_per_param'] or cfg['lr_rule'] != 'fixed':
        raise UserError("--tokens_per_param and --lr_rule set the budget and learning rate per size of a ladder; "
                        "add --sizes (e.g. --sizes=2x64,3x96,4x128) or drop them.")
    run_comparison(cfg, given)


def run_ladder(cfg, given):
    """The comparison at every size of --sizes, each an ordinary comparison in out_dir/<size>/, then the ladder's
    summary.md, summary.json and ladder.png in out_dir."""
    ladder.check(cfg)
    size_list = ladder.sizes(cfg['sizes'])
    plan(cfg, given)  # the settings' mistakes, once, before anything runs
    check_dataset(cfg)
    settings, summaries = [], []
    for size in size_list:
        shape = {**train.DEFAULTS, **cfg, 'n_layer': size['n_layer'], 'n_embd': size['n_embd'],
                 'n_head': size['n_head'], 'ffn': cfg['baseline'] or cfg['variants'].split(',')[0].strip()}
        n_params = report.scale_counts(report.meta_model(None, shape, cfg['data_dir'], cfg['dataset']))['non_embedding']
        s = ladder.size_settings(cfg, size, size_list[0], n_params)
        settings.append(s)
        print(f"compare: size {size['name']} (n_head {size['n_head']}, N = {n_params:,} non-embedding parameters, "
              f"{s.get('max_iters', cfg['max_iters'])} iterations, learning rate "
              f"{s.get('learning_rate', cfg['learning_rate']):.3g})", file=sys.stderr)
        out_dir = os.path.join(cfg['out_dir'], size['name'])
        summaries.append(run_comparison({**cfg, **s, 'out_dir': out_dir}, set(given) | set(s)))
    if cfg['plan']:  # the runs of every size are listed; the ladder's report waits for them
        return
    lad = ladder.summarize(cfg, size_list, settings, summaries)
    write_json(os.path.join(cfg['out_dir'], 'summary.json'), lad)
    ladder.write_markdown(os.path.join(cfg['out_dir'], 'summary.md'), lad)
    ladder.plot(os.path.join(cfg['out_dir'], 'ladder.png'), lad)
    print(f"wrote {cfg['out_dir']}/summary.md, summary.json, ladder.png (the ladder; each size's own in its directory)",
          file=sys.stderr)


def run_comparison(cfg, given):
    """One comparison: plan the runs, reuse/resume/train them, write its report into out_dir; returns the summary."""
    variants, seeds, baseline, runs = plan(cfg, given)
    check_dataset(cfg)
    states = {id(r): run_state(r, cfg['max_iters']) for r in runs}
    bad = [r for r in runs if states[id(r)] == 'mismatch']
    if bad and not cfg['overwrite']:
        raise UserError(f"{describe_mismatch(bad[0])}; use another --out_dir, or pass --overwrite=True to retrain "
                        f"the {len(bad)} run(s) whose settings differ.")
    todo = [(r, 'overwrite' if states[id(r)] == 'mismatch' else states[id(r)]) for r in runs
            if states[id(r)] not in ('done', 'stopped')]
    if cfg['plan']:
        return print_plan(todo, len(runs), cfg)
    if cfg['report'] and todo:
        raise UserError(f"--report: {len(todo)} of {len(runs)} runs are not finished "
                        f"({describe_progress(todo[0][0])}); run the commands --plan prints, or drop --report to "
                        f"train them here.")
    gpus, cfg['jobs'] = resolve_jobs(cfg) if todo else ([], cfg['jobs'])
    os.makedirs(cfg['out_dir'], exist_ok=True)
    print(f"compare: {len(variants)} variants x {len(seeds)} seed(s) = {len(runs)} runs into {cfg['out_dir']} "
          f"({len(runs) - len(todo)} to reuse, {len(todo)} to train"
          + (f", {cfg['jobs']} at a time on GPUs {','.join(gpus)}" if gpus and todo else '') + ')', file=sys.stderr)
    if todo:
        on, why = resolve_compile(cfg)
        print(f"compile {'on' if on else 'off'} ({why})", file=sys.stderr)
    statuses = {}
    t0 = time.time()
    pbar = progress_bar(len(runs), 'runs', unit='run')
    for run in runs:
        if states[id(run)] in ('done', 'stopped'):
            statuses[(run['variant'], run['seed'])] = states[id(run)]
            how = 'finished' if states[id(run)] == 'done' else 'stopped: see its train.out'
            pbar.write(f"{run['variant']} seed {run['seed']}: reused ({how})", file=sys.stderr)
            pbar.update(1)
    # seed by seed: the runs side by side are different variants, so under --compile=True no two processes compile the
    # same graph at once, and every later seed finds its variant's graphs in the shared compile cache
    todo.sort(key=lambda job: job[0]['seed'])
    train_all(todo, placement(cfg['jobs'], gpus, cfg['nproc_per_run']), cfg['threads'], statuses, pbar,
              cfg['max_iters'])
    pbar.close()
    summary = write_report(cfg, variants, seeds, baseline, runs, statuses)
    print(f"wrote {cfg['out_dir']}/summary.md, summary.json, loss.png, acts.png ({time.time() - t0:.0f} s)",
          file=sys.stderr)
    return summary


def describe_progress(run):
    log = read_log(os.path.join(run['dir'], 'log.jsonl'))
    return f"{run['dir']} is at iteration {log[-1].get('iter', 0)}" if log else f"{run['dir']} has not started"


def print_plan(todo, n_runs, cfg):
    """--plan: the command of every run still to do on stdout, one per line; what to do next on stderr."""
    for run, mode in todo:
        print(plan_line(run, mode, cfg['threads']))
    print(f"compare: {len(todo)} of {n_runs} runs to do" + (
        "; run these lines anywhere that sees this filesystem, then the same command with --report instead of --plan "
        "builds the summary" if todo else ", all finished: --report instead of --plan builds the summary"),
        file=sys.stderr)


def write_report(cfg, variants, seeds, baseline, runs, statuses):
    """summary.json, summary.md and loss.png into out_dir; the table (the results) on stdout."""
    # how many runs trained side by side, from each run's record (not this command's --jobs: a run may have been
    # trained by an earlier command, or by a --plan line); None where no record says, 'mixed' where they differ
    at_once = {(read_json(os.path.join(r['dir'], RECORD)) or {}).get('at_once') for r in runs}
    cfg = {**cfg, 'at_once': at_once.pop() if len(at_once) == 1 else 'mixed'}
    summary, by_variant = report.summarize(cfg, variants, seeds, baseline, runs, statuses)
    report.plot(os.path.join(cfg['out_dir'], 'loss.png'), summary, by_variant, cfg)
    # what each variant's activation became (its first seed): acts.png, and how far it moved, for summary.md
    first_seed = {v: next(r['dir'] for r in runs if r['variant'] == v) for v in variants}
    summary['acts'] = inspect_run.compare(cfg['out_dir'], first_seed, cfg['data_dir'])
    write_json(os.path.join(cfg['out_dir'], 'summary.json'), summary)
    report.write_markdown(os.path.join(cfg['out_dir'], 'summary.md'), summary, cfg)
    print()
    print(report.table(summary))
    if summary['seed_std'] is not None:
        print(f"seed std of the final val loss {summary['seed_std']:.4f}, of the paired differences "
              f"{report.fmt_loss(summary['paired_diff_std'])}")
    return summary


if __name__ == '__main__':
    run_cli(main)
