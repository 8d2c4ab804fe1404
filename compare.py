"""
Train FFN variants side by side and draw their loss curves: the one command behind the README's comparisons.

    python compare.py                                                       # = config/compare_shakespeare_char.py
    python compare.py config/compare_shakespeare_char.py                    # 8 variants x 3 seeds, 2-core CPU
    python compare.py config/compare_shakespeare_char.py --variants=gelu,polynorm --seeds=2 --max_iters=300
    python compare.py config/compare_owt_dense.py                           # one GPU, OpenWebText
    python compare.py --help                                                # every key (train.py's + the ones below)

Every run is a plain train.py run in its own directory, <out_dir>/<variant>/seed<seed>, started as a subprocess with
the same settings except ffn and seed. So all variants of one seed see the same training batches (the loader's order
depends only on dataset, seed, batch_size, block_size), all runs are scored on the same validation windows, and all
share the token budget and learning-rate schedule (the logs' batch_hash and val_hash are checked). Seeds are seed,
seed+1, ..., seed+seeds-1. --jobs=N trains N runs at a time and --threads=T gives each T threads (OMP_NUM_THREADS):
on a CPU, tiny models train fastest as one single-threaded run per core.

Re-running the same command reuses what is there: a run whose log reached max_iters with its final evaluation is
reused as it is, a cut-off run resumes from its checkpoint (init_from=resume), and a run that stopped on a non-finite
loss (train.py exit status 3) is reported as stopped rather than retried. Each run directory keeps compare.json (the
settings it was started with) and train.out (its quietened output). A directory whose runs were started with other
settings is refused; pass --overwrite=True to retrain those runs from scratch (to retry a stopped run, delete
its directory).

Writes into out_dir: loss.png (validation loss against tokens and against training time, mean over seeds with a
min-max band, and the smoothed training loss), summary.json and summary.md (per variant: parameters, final validation
loss mean ± std over seeds, the paired difference to the baseline with its std over seeds and a paired t-test,
tokens/s, training time, and what learnable activations learned, from the last evaluation's `act` record); and
prints the table.
All numbers come from the runs' own log.jsonl files, so the same runs always give the same summary.
"""
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time

from tqdm import tqdm

import train
from configurator import RunStopped, UserError, parse_args, run_cli
from model import FFN_VARIANTS

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_PY = os.path.join(HERE, 'train.py')

COMPARE_DEFAULTS = dict(
    variants='gelu,swiglu',  # comma-separated ffn names (see model.FFN_VARIANTS)
    seeds=1,  # number of seeds per variant: seed, seed+1, ...
    baseline='',  # the variant the others are compared with; '' = the first of variants
    smooth=0.9,  # EMA factor for the plotted training loss (per log line), 0 = raw
    jobs=1,  # runs trained at the same time (CPU: up to the number of cores, with threads=1)
    threads=0,  # OMP_NUM_THREADS for each run; 0 = leave the environment's setting
)
DEFAULTS = {**train.DEFAULTS, **COMPARE_DEFAULTS, 'out_dir': 'out-compare'}
# set per run by compare.py, never passed through from the comparison's settings
PER_RUN_KEYS = ('out_dir', 'ffn', 'seed', 'init_from', 'overwrite')
# two-sided 95% critical values of Student's t for 1..10 degrees of freedom (then ~2): is a paired difference
# resolved by n seeds?
T_CRIT = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23]
SHOWN_KEYS = ('dataset', 'n_layer', 'n_head', 'n_embd', 'block_size', 'batch_size', 'gradient_accumulation_steps',
              'max_iters', 'learning_rate', 'schedule', 'warmup_iters', 'min_lr', 'eval_interval', 'eval_iters',
              'n_expert', 'top_k', 'device', 'dtype', 'compile')
RECORD = 'compare.json'  # in each run directory: the settings it was started with, and how it ended
STOPPED_EXIT = 3  # train.py's exit status for a run that stopped (non-finite loss)


# ----------------------------------------------------------------------------------------------------------------------
# planning the runs


def fmt_value(value):
    """A value as train.py's --key=value parser reads it back."""
    if value is None:
        return 'auto'
    return value if isinstance(value, str) else repr(value)


def plan(cfg, given):
    """The list of runs: dicts with variant, seed, dir and the train.py arguments (a key -> text dict)."""
    variants = [v.strip() for v in cfg['variants'].split(',') if v.strip()]
    if not variants:
        raise UserError("--variants is empty; give comma-separated ffn names, e.g. --variants=gelu,swiglu.")
    unknown = [v for v in variants if v not in FFN_VARIANTS]
    if unknown:
        raise UserError(f"unknown variant '{unknown[0]}' in --variants; choose among: {', '.join(FFN_VARIANTS)}.")
    if len(set(variants)) != len(variants):
        raise UserError(f"--variants names a variant twice ({cfg['variants']}); list each once.")
    if cfg['seeds'] < 1:
        raise UserError(f"--seeds must be at least 1, got {cfg['seeds']}.")
    baseline = cfg['baseline'] or variants[0]
    if baseline not in variants:
        raise UserError(f"--baseline={baseline} is not one of --variants ({','.join(variants)}); add it or pick one of them.")
    if cfg['jobs'] < 1 or cfg['threads'] < 0:
        raise UserError(f"--jobs must be at least 1 and --threads at least 0, got {cfg['jobs']} and {cfg['threads']}.")
    if not 0.0 <= cfg['smooth'] < 1.0:
        raise UserError(f"--smooth must be in [0, 1), got {cfg['smooth']}.")
    if cfg['init_from'] != 'scratch':
        raise UserError("compare.py resumes cut-off runs by itself; drop --init_from.")
    for v in variants:
        train.check_config({**cfg, 'ffn': v})  # the mistakes train.py would report, before anything runs
    # the settings every run shares: what the config file and the command line chose, nothing else (train.py's
    # defaults fill the rest, as they would for a plain train.py run)
    shared = {k: fmt_value(cfg[k]) for k in sorted(given) if k in train.DEFAULTS and k not in PER_RUN_KEYS}
    seeds = [cfg['seed'] + i for i in range(cfg['seeds'])]
    runs = []
    for v in variants:
        for s in seeds:
            d = os.path.join(cfg['out_dir'], v, f'seed{s}')
            runs.append(dict(variant=v, seed=s, dir=d, args={**shared, 'ffn': v, 'seed': str(s), 'out_dir': d}))
    return variants, seeds, baseline, runs


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def write_json(path, obj):
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(obj, f, indent=1)
        f.write('\n')
    os.replace(tmp, path)


def record_args(run):
    """The settings a run is identified by: its train.py arguments except where things are (out_dir, data_dir): a
    comparison or its data may be moved. The logs' batch_hash and val_hash still show whether the data is the same."""
    # a key passed at its default value identifies the same run as the key left out
    return {k: v for k, v in run['args'].items() if k not in ('out_dir', 'data_dir') and v != train.DEFAULTS.get(k)}


def run_state(run, max_iters):
    """'done' | 'stopped' | 'resume' | 'scratch' | 'mismatch' for a planned run, from what its directory holds."""
    d = run['dir']
    record = read_json(os.path.join(d, RECORD))
    log = train.read_log(os.path.join(d, 'log.jsonl'))
    has_ckpt = os.path.exists(os.path.join(d, 'ckpt.pt'))
    if record is None:
        return 'mismatch' if (log or has_ckpt) else 'scratch'  # a directory compare.py did not start
    if record.get('args') != record_args(run):
        return 'mismatch'
    if log and log[-1].get('iter') == max_iters and 'val_loss' in log[-1]:
        return 'done'
    if record.get('status') == 'stopped':
        return 'stopped'
    return 'resume' if has_ckpt else 'scratch'


def describe_mismatch(run):
    record = read_json(os.path.join(run['dir'], RECORD))
    if record is None:
        return f"{run['dir']} already holds a run that compare.py did not start"
    old, new = record.get('args', {}), record_args(run)
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    shown = ', '.join(f"{k}={old.get(k, 'default')} (now {new.get(k, 'default')})" for k in keys[:4])
    return f"{run['dir']} was trained with other settings: {shown}"


# ----------------------------------------------------------------------------------------------------------------------
# running train.py


class Job:
    """One train.py run as a subprocess, its output appended to run_dir/train.out."""

    def __init__(self, run, mode, threads):
        self.run, self.mode, self.t0 = run, mode, time.time()
        d = run['dir']
        os.makedirs(d, exist_ok=True)
        self.log_path, self.out_path = os.path.join(d, 'log.jsonl'), os.path.join(d, 'train.out')
        self.resumed_from = checkpoint_field(d, 'iter_num') if mode == 'resume' else None
        args = dict(run['args'])
        if mode == 'resume':
            args['init_from'] = 'resume'
        else:
            args['overwrite'] = 'True'  # scratch: a run with other settings (--overwrite=True) or with no checkpoint
        self.record = {'args': record_args(run), 'status': 'running'}
        write_json(os.path.join(d, RECORD), self.record)
        cmd = [sys.executable, TRAIN_PY] + [f'--{k}={v}' for k, v in args.items()]
        env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
        if threads > 0:  # small CPU models: one thread per run, runs side by side, beats threads fighting for cores
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        with open(self.out_path, 'a') as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    @property
    def name(self):
        return f"{self.run['variant']} seed {self.run['seed']}"

    def progress(self):
        """'iter k' and the last training loss, from the run's log.jsonl."""
        log = train.read_log(self.log_path)
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
        val = next((r['val_loss'] for r in reversed(train.read_log(self.log_path)) if 'val_loss' in r), None)
        return line + (f", final val loss {val:.4f}" if val is not None else '')


def train_all(todo, jobs, threads, statuses, pbar):
    """Run the (run, mode) pairs in todo, at most `jobs` at a time, and fill statuses."""
    pending, active = list(todo), []
    try:
        while pending or active:
            while pending and len(active) < jobs:
                run, mode = pending.pop(0)
                active.append(Job(run, mode, threads))
            time.sleep(0.5)
            for job in [j for j in active if j.proc.poll() is not None]:
                active.remove(job)
                statuses[(job.run['variant'], job.run['seed'])] = job.finish()
                pbar.write(job.report())
                pbar.update(1)
            if active:
                pbar.set_description(', '.join(j.name for j in active))
                pbar.set_postfix_str('iter ' + ', '.join(j.progress() for j in active))
    except BaseException as e:  # a failure or Ctrl-C: stop the other runs cleanly (they resume next time)
        for job in active:
            job.interrupt(signalled=isinstance(e, KeyboardInterrupt))
        raise


def last_error_line(path):
    try:
        with open(path, errors='replace') as f:
            lines = [l.strip() for l in f.read().splitlines() if l.strip()]
    except OSError:
        return ''
    for line in reversed(lines):
        if line.startswith(('error:', 'stopped:')):
            return line
    return lines[-1] if lines else ''


# ----------------------------------------------------------------------------------------------------------------------
# summarising: everything from the runs' log.jsonl (and the model's shape), so the same runs give the same summary


def run_metrics(log):
    """Per-run numbers recomputed from its log records."""
    evals = [r for r in log if 'val_loss' in r]
    trains = [r for r in log if 'loss' in r]
    # training time: each train line's ms is the mean step time since the previous line (eval time excluded)
    t, prev_iter, times = 0.0, 0, {}
    for r in log:
        if 'ms' in r:
            t += r['ms'] / 1000.0 * (r['iter'] - prev_iter)
        prev_iter = r['iter']
        times[r['iter']] = t
    acts = [r['act'] for r in log if r.get('act')]
    tok_s = [r['tok_s'] for r in trains if r.get('tok_s')]
    last = log[-1] if log else {}
    return {
        'iters': last.get('iter', 0),
        'tokens': last.get('tokens', 0),
        'final_val_loss': evals[-1]['val_loss'] if evals else None,
        'final_train_loss': trains[-1]['loss'] if trains else None,
        'train_time_s': t,
        'tok_s': statistics.median(tok_s) if tok_s else None,  # steady state: the median over log lines
        'batch_hash': last.get('batch_hash'),
        'val_hash': next((r['val_hash'] for r in reversed(log) if 'val_hash' in r), None),
        'act': acts[-1] if acts else None,
        'curve': {
            'val': [[r['iter'], r['tokens'], times[r['iter']], r['val_loss']] for r in evals],
            'train': [[r['iter'], r['tokens'], r['loss']] for r in trains],
        },
    }


def mean_std(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    return {'mean': statistics.fmean(values), 'std': statistics.stdev(values) if len(values) > 1 else None,
            'min': min(values), 'max': max(values), 'n': len(values)}


def paired(diffs):
    """mean_std of the per-seed differences, plus a paired t statistic and whether it is resolved at 95%
    (|t| above Student's critical value for n-1 degrees of freedom; never with one seed)."""
    d = mean_std(diffs)
    if d is None:
        return None
    d['t'], d['resolved'] = None, False
    if d['n'] > 1 and d['std'] > 0:
        d['t'] = d['mean'] / (d['std'] / math.sqrt(d['n']))
        d['resolved'] = abs(d['t']) > (T_CRIT[d['n'] - 2] if d['n'] - 2 < len(T_CRIT) else 2.0)
    return d


def checkpoint_field(run_dir, key):
    """One plain field of run_dir/ckpt.pt (iter_num, model_args), read by memory map: the tensors are not loaded."""
    import torch
    try:
        return torch.load(os.path.join(run_dir, 'ckpt.pt'), map_location='cpu', weights_only=True, mmap=True)[key]
    except Exception:  # no checkpoint, or an unreadable one: train.py itself reports the latter
        return None


def param_report(run_dir, args, data_dir, dataset):
    """model.param_report() of the run's model: its model_args from the checkpoint (read lazily), else rebuilt from
    the run's settings, built on the meta device (no memory, no init time)."""
    import torch
    from model import GPT, GPTConfig
    model_args = checkpoint_field(run_dir, 'model_args')
    if model_args is None:
        model_args = {k: args[k] for k in train.MODEL_KEYS}
        if not model_args['vocab_size']:
            meta = read_json(os.path.join(data_dir, dataset, 'meta.json')) or {}
            model_args['vocab_size'] = meta.get('vocab_size', 0)
    with torch.device('meta'):
        return GPT(GPTConfig(**model_args)).param_report()


def mean_lists(items):
    """Elementwise mean of equal-length lists (the learned coefficients over seeds)."""
    items = [i for i in items if i is not None]
    if not items:
        return None
    return [statistics.fmean(col) for col in zip(*items)]


def learned_mean(acts):
    """The per-layer activation statistics averaged over seeds (lists elementwise, scalars plainly)."""
    acts = [a for a in acts if a]
    if not acts:
        return None
    layers = []
    for per_seed in zip(*[a['layers'] for a in acts]):
        keys = [k for k in per_seed[0] if all(k in p for p in per_seed)]
        layers.append({k: (mean_lists([p[k] for p in per_seed]) if isinstance(per_seed[0][k], list)
                           else statistics.fmean(p[k] for p in per_seed)) for k in keys})
    return {'layers': layers}


def summarize(cfg, variants, seeds, baseline, runs, statuses):
    by_variant = {}
    for run in runs:
        log = train.read_log(os.path.join(run['dir'], 'log.jsonl'))
        m = run_metrics(log)
        m.update(seed=run['seed'], dir=run['dir'], status=statuses[(run['variant'], run['seed'])])
        if m['status'] != 'done':
            m['final_val_loss'] = None  # a stopped run has no final evaluation to compare
        by_variant.setdefault(run['variant'], []).append(m)
    full = {**train.DEFAULTS, **cfg}
    out = {'baseline': baseline, 'seeds': seeds, 'dataset': cfg['dataset'], 'settings': {}, 'variants': {}}
    # the settings that shape the comparison, whether chosen or left at train.py's defaults, then every other choice
    shown = {k: fmt_value(full[k]) for k in SHOWN_KEYS}
    out['settings'] = {**shown, **{k: v for k, v in runs[0]['args'].items() if k not in PER_RUN_KEYS and k not in shown}}
    base_vals = {m['seed']: m['final_val_loss'] for m in by_variant[baseline]}
    for v in variants:
        ms = by_variant[v]
        run0 = next(r for r in runs if r['variant'] == v)
        params = param_report(run0['dir'], {**full, 'ffn': v}, cfg['data_dir'], cfg['dataset'])
        diffs = [m['final_val_loss'] - base_vals[m['seed']] for m in ms
                 if m['final_val_loss'] is not None and base_vals.get(m['seed']) is not None]
        out['variants'][v] = {
            'params': params,
            'status': 'done' if all(m['status'] == 'done' for m in ms) else 'stopped',
            'final_val_loss': mean_std([m['final_val_loss'] for m in ms]),
            'diff_to_baseline': paired(diffs) if v != baseline else None,
            'tok_s': statistics.fmean(m['tok_s'] for m in ms if m['tok_s']) if any(m['tok_s'] for m in ms) else None,
            'train_time_s': statistics.fmean(m['train_time_s'] for m in ms),
            'tokens': max(m['tokens'] for m in ms),
            'learned': learned_mean([m['act'] for m in ms]),
            'runs': [{k: m[k] for k in ('seed', 'dir', 'status', 'iters', 'tokens', 'final_val_loss', 'final_train_loss',
                                        'train_time_s', 'tok_s', 'batch_hash', 'val_hash', 'act')} for m in ms],
        }
    # seed noise: the std over seeds of the final validation loss, pooled over variants (root mean variance), and
    # of the paired differences to the baseline (smaller: a seed fixes the batches every variant sees)
    var = [s['final_val_loss']['std'] ** 2 for s in out['variants'].values()
           if s['final_val_loss'] and s['final_val_loss']['std'] is not None]
    dvar = [s['diff_to_baseline']['std'] ** 2 for s in out['variants'].values()
            if s['diff_to_baseline'] and s['diff_to_baseline']['std'] is not None]
    out['seed_std'] = math.sqrt(statistics.fmean(var)) if var else None
    out['paired_diff_std'] = math.sqrt(statistics.fmean(dvar)) if dvar else None
    # same batches per seed and the same validation windows: the logs say so (or say otherwise, and we show it)
    for s in seeds:
        hashes = {m['batch_hash'] for v in variants for m in by_variant[v] if m['seed'] == s and m['status'] == 'done'}
        out.setdefault('same_batches', {})[str(s)] = len(hashes) <= 1
    val_hashes = {m['val_hash'] for v in variants for m in by_variant[v]}
    out['same_val_windows'] = (len(val_hashes) == 1) if None not in val_hashes else None
    return out, by_variant


# ----------------------------------------------------------------------------------------------------------------------
# the report: summary.md and the printed table


def _f(x, digits=4, signed=False):
    if x is None:
        return '–'
    return f'{x:+.{digits}f}' if signed else f'{x:.{digits}f}'


def _count(n):
    return f'{n / 1e6:.2f}M' if n >= 1e6 else f'{n / 1e3:.1f}k' if n >= 1e3 else str(n)


def table(summary):
    base = summary['baseline']
    rows = ['| variant | params | FFN | extras | final val loss (mean ± std) | Δ vs ' + base +
            ' (± std) | resolved? | tok/s | train time |',
            '|---|---:|---:|---:|---:|---:|:---:|---:|---:|']
    for v, s in summary['variants'].items():
        p, fv, d = s['params'], s['final_val_loss'], s['diff_to_baseline']
        val = '–' if fv is None else f"{fv['mean']:.4f}" + (f" ± {fv['std']:.4f}" if fv['std'] is not None else '')
        if s['status'] != 'done':
            val += ' (stopped)'
        diff = 'baseline' if v == base else '–' if d is None else (
            f"{d['mean']:+.4f}" + (f" ± {d['std']:.4f}" if d['std'] is not None else ''))
        res = '' if d is None else ('no (1 seed)' if d['t'] is None and d['n'] < 2 else
                                    f"{'yes' if d['resolved'] else 'no'}" + (f" (t={d['t']:.1f})" if d['t'] is not None else ''))
        total = _count(p['total']) + (f" ({_count(p['active'])} active)" if p.get('active', p['total']) != p['total'] else '')
        rows.append(f"| {v} | {total} | {_count(p['ffn'])} | {p['extras']:,} | {val} | {diff} | {res} | "
                    f"{'–' if s['tok_s'] is None else format(s['tok_s'], ',.0f')} | {s['train_time_s']:.1f} s |")
    return '\n'.join(rows)


def learned_section(summary, act_names):
    """Per variant and layer: PolyCom coefficients, LA/MoA α, MoA coefficient c_k(x) mean and cross-token std, MoE
    load; for gated variants with two mixtures, one line per branch."""
    def branch(layer, prefix):
        parts = []
        if prefix + 'poly' in layer:
            parts.append(f"PolyCom [a0..a{len(layer[prefix + 'poly']) - 1}] = " +
                         ', '.join(f'{a:.3f}' for a in layer[prefix + 'poly']))
        if prefix + 'alpha' in layer:
            parts.append('α = ' + ', '.join(f'{n} {a:.3f}' for n, a in zip(act_names, layer[prefix + 'alpha'])))
        if prefix + 'gate_mean' in layer:
            parts.append('c(x) mean (std over tokens) = ' + ', '.join(
                f'{n} {m:.3f} ({sd:.3f})' for n, m, sd in zip(act_names, layer[prefix + 'gate_mean'], layer[prefix + 'gate_std'])))
        return '; '.join(parts)

    lines = []
    for v, s in summary['variants'].items():
        if not s['learned']:
            continue
        n = len([r for r in s['runs'] if r['act']])
        lines += [f"**{v}** (mean over {n} seed{'s' if n > 1 else ''}):", '']
        for i, layer in enumerate(s['learned']['layers']):
            gate, up = branch(layer, ''), branch(layer, 'up_')
            moe = (f"expert load max/mean {layer['moe_load_max_over_mean']:.2f}, entropy {layer['moe_load_entropy']:.3f} nats"
                   if 'moe_load_max_over_mean' in layer else '')
            if up:  # two learned branches (la_glu, moa_glu)
                lines += [f'- layer {i}:' + (f' {moe}' if moe else ''), f'  - gate branch: {gate}', f'  - up branch: {up}']
            elif gate or moe:
                lines.append(f'- layer {i}: ' + '; '.join(p for p in (gate, moe) if p))
        lines.append('')
    return lines


def write_markdown(path, summary, cfg):
    s0 = next(iter(summary['variants'].values()))
    tokens = s0['tokens']
    n = len(summary['seeds'])
    lines = [f"# FFN comparison on {summary['dataset']}", '',
             f"{len(summary['variants'])} variants x {n} seed(s) ({', '.join(map(str, summary['seeds']))}), "
             f"{tokens:,} training tokens per run." + (" Checked from the logs: every variant saw the same training "
             "batches per seed (batch_hash) and all runs the same validation windows (val_hash)."
             if all(summary['same_batches'].values()) and summary['same_val_windows'] else ''),
             '', 'Settings: ' + ', '.join(f'{k}={v}' for k, v in summary['settings'].items()), '',
             table(summary), '']
    notes = [f"Final val loss: the last evaluation, mean ± std over seeds. Δ: the per-seed paired difference to "
             f"{summary['baseline']} (same seed, so same batches), mean ± its std over seeds; resolved: a paired t-test at "
             f"95% (|t| above Student's critical value for n-1 degrees of freedom). tok/s: median over log "
             f"lines; train time: optimizer steps only (evaluation excluded{', compilation included' if cfg['compile'] else ''})"
             + (f", measured with {cfg['jobs']} runs at a time" if cfg['jobs'] > 1 else '') + ". params: total (tied embedding counted "
             "once); FFN: W_up/W_gate/W_down (all experts); extras: learned activation coefficients and MoA gates."]
    if summary['seed_std'] is not None:
        notes.append(f"Seed noise: std over seeds of the final val loss {summary['seed_std']:.4f} (pooled over "
                     f"variants); std of the paired differences {_f(summary['paired_diff_std'])} (pooled).")
    else:
        notes.append("One seed: no estimate of seed noise (use --seeds=3).")
    checks = []
    if not all(summary['same_batches'].values()):
        checks.append('WARNING: runs of the same seed saw different training batches (batch_hash differs).')
    if summary['same_val_windows'] is False:
        checks.append('WARNING: runs were evaluated on different validation windows (val_hash differs).')
    stopped = [(v, r) for v, s in summary['variants'].items() for r in s['runs'] if r['status'] != 'done']
    for v, r in stopped:
        checks.append(f"{v} seed {r['seed']} stopped at iteration {r['iters']} (see {r['dir']}/train.out).")
    lines += notes + [''] + checks + ([''] if checks else [])
    learned = learned_section(summary, [a.strip() for a in cfg['act_dict'].split(',')])
    if learned:
        lines += ['## What the learnable activations learned', '',
                  'From the last evaluation of each run, averaged over seeds. PolyCom coefficients in the order '
                  '[a0, a1, ..., ar] (a_i multiplies the i-th power); LA/MoA α per dictionary entry; MoA coefficient '
                  'c_k(x) = α_k·gate_k(x): its mean and its std across the tokens of the first validation batch (how '
                  'token-adaptive the mixture became); MoE: expert load (max/mean, entropy) on that batch.', ''] + learned
    lines += ['![loss curves](loss.png)', '']
    with open(path, 'w') as f:
        f.write('\n'.join(lines))


# ----------------------------------------------------------------------------------------------------------------------
# the plot


def ema(values, beta):
    out, avg = [], 0.0
    for i, v in enumerate(values):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** (i + 1)))  # bias-corrected, so the first points are not pulled to 0
    return out


def plot(path, summary, by_variant, cfg):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    colors = plt.get_cmap('tab10' if len(by_variant) <= 10 else 'tab20').colors
    for i, (v, ms) in enumerate(by_variant.items()):
        c = colors[i % len(colors)]
        done = [m for m in ms if m['curve']['val']]
        if not done:
            continue
        # evaluations at the same iterations for every seed; a stopped run contributes the points it has
        n = min(len(m['curve']['val']) for m in done)
        val = np.array([[p[3] for p in m['curve']['val'][:n]] for m in done])
        tok = np.array(done[0]['curve']['val'][:n])[:, 1]
        secs = np.array([[p[2] for p in m['curve']['val'][:n]] for m in done]).mean(0)
        keep = tok > 0  # the untrained model's loss (ln vocab) would squash the interesting part...
        if keep.sum() < 2:  # ...unless it is needed to draw a line at all
            keep[:] = True
        label = f'{v} ({len(done)} seed{"s" if len(done) > 1 else ""})'
        for ax, x in ((axes[0], tok), (axes[1], secs)):
            ax.plot(x[keep], val.mean(0)[keep], color=c, marker='.', label=label)
            if len(done) > 1:
                ax.fill_between(x[keep], val.min(0)[keep], val.max(0)[keep], color=c, alpha=0.2, linewidth=0)
        trains = [m['curve']['train'] for m in ms if m['curve']['train']]
        if trains:
            n = min(len(t) for t in trains)
            loss = np.array([ema([p[2] for p in t[:n]], cfg['smooth']) for t in trains])
            x = np.array(trains[0][:n])[:, 1]
            axes[2].plot(x, loss.mean(0), color=c, label=v)
            if len(trains) > 1:
                axes[2].fill_between(x, loss.min(0), loss.max(0), color=c, alpha=0.2, linewidth=0)
    axes[0].set(xlabel='training tokens', ylabel='validation loss', title='validation loss (mean, band: min–max over seeds)')
    axes[1].set(xlabel='training time (s, evaluation excluded' + (', compilation included)' if cfg['compile'] else ')'), ylabel='validation loss', title='validation loss against time')
    axes[2].set(xlabel='training tokens', ylabel='training loss (EMA)', title=f"training loss (EMA {cfg['smooth']})")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{summary['dataset']}: {len(summary['variants'])} FFN variants x {len(summary['seeds'])} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        print(f"compare: preparing the bundled dataset {cfg['dataset']} into {out} (once, seconds)")
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run([sys.executable, os.path.join(here, 'data', cfg['dataset'], 'prepare.py'), f'--out_dir={out}'],
                       check=True, stdout=subprocess.DEVNULL)
        open_loader()


def main(argv):
    if not any(not a.startswith('-') for a in argv):  # no config file given: the default comparison
        argv = [DEFAULT_CONFIG] + list(argv)
    cfg, given = parse_args(DEFAULTS, argv, types=train.TYPES, prog='compare.py', doc=__doc__.split('\n\n')[1])
    variants, seeds, baseline, runs = plan(cfg, given)
    check_dataset(cfg)
    os.makedirs(cfg['out_dir'], exist_ok=True)
    max_iters = cfg['max_iters']
    states = {id(r): run_state(r, max_iters) for r in runs}
    bad = [r for r in runs if states[id(r)] == 'mismatch']
    if bad and not cfg['overwrite']:
        raise UserError(f"{describe_mismatch(bad[0])}; use another --out_dir, or pass --overwrite=True to retrain "
                        f"the {len(bad)} run(s) whose settings differ.")
    todo = sum(states[id(r)] not in ('done', 'stopped') for r in runs)
    print(f"compare: {len(variants)} variants x {len(seeds)} seed(s) = {len(runs)} runs into {cfg['out_dir']} "
          f"({len(runs) - todo} to reuse, {todo} to train)")
    statuses = {}
    t0 = time.time()
    pbar = tqdm(total=len(runs), desc='runs', unit='run', dynamic_ncols=True, file=sys.stdout)
    for run in runs:
        if states[id(run)] in ('done', 'stopped'):
            statuses[(run['variant'], run['seed'])] = states[id(run)]
            pbar.write(f"{run['variant']} seed {run['seed']}: reused "
                       f"({'finished' if states[id(run)] == 'done' else 'stopped: see its train.out'})")
            pbar.update(1)
    todo = [(r, 'scratch' if states[id(r)] == 'mismatch' else states[id(r)]) for r in runs
            if states[id(r)] not in ('done', 'stopped')]
    train_all(todo, cfg['jobs'], cfg['threads'], statuses, pbar)
    pbar.close()

    summary, by_variant = summarize(cfg, variants, seeds, baseline, runs, statuses)
    write_json(os.path.join(cfg['out_dir'], 'summary.json'), summary)
    write_markdown(os.path.join(cfg['out_dir'], 'summary.md'), summary, cfg)
    plot(os.path.join(cfg['out_dir'], 'loss.png'), summary, by_variant, cfg)
    print()
    print(table(summary))
    if summary['seed_std'] is not None:
        print(f"seed std of the final val loss {summary['seed_std']:.4f}, of the paired differences "
              f"{_f(summary['paired_diff_std'])}")
    print(f"wrote {cfg['out_dir']}/summary.md, summary.json, loss.png ({time.time() - t0:.0f} s)")


if __name__ == '__main__':
    run_cli(main)
