"""
Run a comparison: train FFN variants side by side on the same batches, N runs at a time, then write their report.

    python compare.py                                                       # = config/compare_shakespeare_char.py
    python compare.py --variants=gelu,polynorm --seeds=5                    # the default comparison, changed
    python compare.py config/compare_owt_dense.py                           # one GPU, OpenWebText
    python compare.py config/compare_ladder_shakespeare_char.py             # a scaling ladder (--sizes)
    python compare.py --help                                                # every key, as a bare run has it

Each run is a plain train.py run in its own directory (comparison/runs.py), read once per step (and again as it is
locked to train, and once trained). The steps: check, read the runs, train what is missing, extend a sweep where a best
rate is at an edge, train each variant at its best rate on fresh seeds (a sweep's verdict), report. The same command
again reuses finished and diverged runs, resumes cut-off ones and refuses runs of other settings, other code of
activations.py or model.py, or a dataset prepared again since, unless --overwrite=True. Writes summary.md, summary.json,
loss.png, acts.png and acts.json (a sweep also lr.png) into out_dir (a ladder: each size's in out_dir/<size>/, then its
own), the table on stdout.
"""
from machinery.cli import quiet_interrupt  # first of all: a Ctrl-C while torch imports ends as quietly as one later
quiet_interrupt(__name__)
import json
import math
import os
import signal
import subprocess
import sys
import time

import configurator
from configurator import TYPES, check, keys_that, schedule_note
from comparison import acts, ladder, placement, plots, report, stats
from machinery.cli import RunStopped, Terminated, UserError, parse_args, run_cli, split_arg, split_list
from machinery.checkpoint import CKPT
from machinery.device import resolve_device, resolve_dtype
from machinery.speed import compile_cache_dir
from machinery.files import check_writable, ctrl_c_held, remove_dead_temps, write_json
from machinery.fingerprint import IDEAS, OTHER_CODE, code_hash
from machinery.lock import HELD, LOCK, LOCK_FD_ENV, try_lock_run_dir
from machinery.progress import progress_bar
from machinery.run_log import DIVERGED_HINT, LOG, clear_diverged, parse_record
from comparison.runs import (FINISHED, INTENT, TRAIN_OUT, at_rate, check_variants, codes_of, command_line, make_run,
                             meta_model, scan, tuning_key, variant_rates, variant_settings)

COMPARE_DEFAULTS = dict(
    variants='gelu,swiglu',  # comma-separated ffn names (activations.VARIANTS); gelu@8e-3: a variant at its own rate
    tuned_lrs='',  # each variant's tuned rate (gelu@8e-3,...), taken where --variants gives none and tuned_at holds
    tuned_at='',  # the settings tuned_lrs were tuned at (a sweep's summary prints both lines); others: untuned
    tuned_by='',  # the config file of the sweep that tunes them, named to a variant that runs untuned
    seeds=1,  # number of seeds per variant: seed, seed+1, ...
    baseline='',  # the variant the others are compared with; '' = the first of variants
    smooth=0.9,  # EMA factor for the plotted training loss (per log line), 0 = raw
    jobs=0,  # runs at once; 0 = one per nproc_per_run GPUs (tiny models share one), else per --threads cores
    threads=0,  # OMP_NUM_THREADS for each run; 0 = leave the environment's setting
    sizes='',  # '' = one size (n_layer, n_embd, n_head as set); e.g. 2x64,3x96,4x128 (n_layer x n_embd [x n_head])
    tokens_per_param=0.0,  # 0 = max_iters at every size; K > 0: K tokens per non-embedding parameter of the baseline
    lr_rule='fixed',  # 'fixed': learning_rate at every size; 'width': learning_rate x first width / width
    lrs='',  # comma-separated rates to try, learning_rate among them (its answer is shown too); '' = learning_rate only
    lr_grid=0,  # K > 0: the rates learning_rate x 2^j for j = -K..K (instead of --lrs)
    lr_extend=False,  # a variant whose best rate is the smallest or largest tried also tries the next one beyond it
    nproc_per_run=1,  # processes per run: more than 1 launches each run with torchrun (DDP on that many GPUs)
    plan=False,  # print the command of every run still to do, one per line, for another scheduler; train nothing
    report=False,  # build the summary and pictures from finished run directories; train nothing
)
DEFAULTS = {**configurator.DEFAULTS, **COMPARE_DEFAULTS, 'out_dir': 'out-compare'}
DEFAULT_CONFIG = 'config/compare_shakespeare_char.py'  # what `python compare.py` alone runs
MAX_EXTEND = 3  # --lr_extend tries at most this many rates beyond each edge of the grid
MAX_GRID = 10  # --lr_grid=K spans learning_rate x 2^-K .. 2^K: past 2^10 either way is a typo, not a sweep
MAX_SEEDS = 100  # --seeds=K: K runs per variant and rate (a sweep's verdict K more); past 100 a typo, not a plan
START = dict(scratch='scratch', resume='resume', mismatch='overwrite', retrain='overwrite')  # a run to do, by state
REPORT_HALF_NOTE = 'final val loss: on the second half of the validation windows, which no choice of rate reads'


def settings(argv):
    """The comparison's settings: config/compare_shakespeare_char.py unless a config file is given, then overrides. A
    sweep given on the command line (--lrs or --lr_grid) replaces the config file's."""
    if all(a.startswith('-') for a in argv):
        argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), DEFAULT_CONFIG)] + list(argv)
    cfg, given = parse_args(DEFAULTS, argv, types=TYPES, prog='compare.py', doc=__doc__.split('\n\n')[1],
                            notes=[*configurator.NOTES, __file__])
    if given.get('ffn') == '--':  # a config file's ffn (a training config it builds on) is the variants' to set
        raise UserError("compare.py trains each of --variants, so it does not read --ffn; give --variants=NAME,... "
                        "instead.")
    on_command_line = {split_arg(a)[0] for a in argv if a.startswith('--')}
    for key, other, cleared in (('lrs', 'lr_grid', 0), ('lr_grid', 'lrs', '')):
        if key in on_command_line and other not in on_command_line:
            cfg[other] = cleared
    return cfg


def tuned_rates(cfg, variants, own, overrides):
    """Each variant's rate without a sweep: its own (gelu@8e-3), else its tuned one (tuned_lrs) where tuned_at is
    these settings' runs.tuning_key, else None, the shared learning_rate. Returns the rates, and a line naming the
    variants that run untuned, why, and what tunes them (None where every variant has its rate). overrides: the
    --key=value arguments of a comparison started from the default config, which its sweep (tuned_by) repeats; None:
    another config, whose own command with a sweep tunes them."""
    tuned = variant_rates(cfg['tuned_lrs'], 'tuned_lrs')
    if missing := [v for v, r in tuned.items() if r is None]:
        raise UserError(f"--tuned_lrs: '{missing[0]}' carries no rate; write each variant as variant@rate, e.g. "
                        f"{missing[0]}@8e-3.")
    here = tuning_key(cfg)
    rates = {v: own[v] or (tuned.get(v) if cfg['tuned_at'] == here else None) for v in variants}
    untuned = [v for v in variants if rates[v] is None]
    if not untuned:
        return rates, None
    other = [v for v in untuned if v in tuned and cfg['tuned_at'] != here]
    why = []
    if other:
        why.append(f"rates tuned at other settings (tuned_at {cfg['tuned_at'] or 'empty'}, these settings {here})")
    if len(other) < len(untuned):  # no tuned rate at all: named where the others' are tuned elsewhere
        why.append('no tuned rate' + (f" for {', '.join(v for v in untuned if v not in other)}" if other else ''))
    why = '; '.join(why)
    # the sweep repeats what makes the runs what they are (and where their data is), not how this command runs them,
    # nor its seed: the sweep chooses on seeds of its own. At another learning_rate than its config's, it sweeps a
    # grid around it (the config's rates need not include it).
    key = lambda a: split_arg(a)[0]
    repeated = {'variants', 'baseline', 'data_dir', 'nproc_per_run', *keys_that('id')} - {'seed'}
    args = [f"--variants={','.join(variant_rates(split_arg(a)[2], 'variants'))}" if key(a) == 'variants' else a
            for a in overrides or [] if key(a) in repeated]
    args = list({key(a): a for a in args}.values())  # a key given twice: its last value, as the command reads it
    args += ['--lr_grid=2'] if any(key(a) == 'learning_rate' for a in args) else []
    sweep = (f"`python compare.py {cfg['tuned_by']}" + ''.join(f' {a}' for a in args) + '`'
             if cfg['tuned_by'] and overrides is not None else "the same command with a sweep (e.g. --lr_grid=2)")
    return rates, (f"{', '.join(untuned)} run{'s' * (len(untuned) == 1)} untuned, at the shared learning_rate "
                   f"{report.fmt_rate(cfg['learning_rate'])} ({why}); {sweep} tunes "
                   f"{'it' if len(untuned) == 1 else 'them'}.")


def check_comparison(cfg, overrides=None):
    """The comparison's settings checked, before anything runs: its variants and their rates, seeds, baseline and
    sweep grid. overrides: see tuned_rates."""
    own = variant_rates(cfg['variants'], 'variants')
    variants = check_variants(','.join(own))
    baseline = cfg['baseline'] or variants[0]
    if baseline not in variants:
        raise UserError(f"--baseline={baseline} is not one of --variants ({','.join(variants)}); add it or pick one of them.")
    if not 1 <= cfg['seeds'] <= MAX_SEEDS:
        raise UserError(f"--seeds must be between 1 and {MAX_SEEDS}, got {cfg['seeds']}.")
    if cfg['jobs'] < 0 or cfg['threads'] < 0 or cfg['nproc_per_run'] < 1:
        raise UserError(f"--jobs and --threads must be at least 0 and --nproc_per_run at least 1, got "
                        f"{cfg['jobs']}, {cfg['threads']} and {cfg['nproc_per_run']}.")
    if cfg['plan'] and cfg['report']:
        raise UserError("--plan lists the runs still to do and --report summarises finished ones; pass one of them.")
    if not 0.0 <= cfg['smooth'] < 1.0:
        raise UserError(f"--smooth must be in [0, 1), got {cfg['smooth']}.")
    if cfg['init_from'] != 'scratch':
        raise UserError("compare.py resumes cut-off runs by itself; drop --init_from.")
    if cfg['max_iters'] < 1:
        raise UserError(f"--max_iters must be at least 1 in a comparison, got {cfg['max_iters']}.")
    if not cfg['always_save_checkpoint']:  # a single run's config file may set it False
        raise UserError("a comparison's run is done once its checkpoint is at max_iters, so it needs "
                        "always_save_checkpoint=True; give a comparison's config file, or "
                        "--always_save_checkpoint=True.")
    if not (cfg['plan'] or cfg['report']):  # the runs train on this machine: a device it lacks is said now, and a
        resolve_device(cfg['device'])  # dtype name (bfloat16 support is each run's to check, on its own GPU)
        resolve_dtype(cfg['dtype'], 'cpu')
    grid = learning_rates(cfg)
    if grid and (given := [v for v, r in own.items() if r is not None]):
        raise UserError(f"a sweep tries each of its rates for every variant, so {given[0]} cannot carry its own; drop "
                        f"its @rate, or the sweep (--lrs= empty).")
    rates, untuned = tuned_rates(cfg, variants, own, overrides) if not grid else (dict.fromkeys(variants), None)
    if (grid or any(rates.values())) and cfg['eval_iters'] < 2:
        raise UserError("a sweep chooses rates on half of the validation batches, and a comparison at chosen rates is "
                        "scored on the other half; give --eval_iters of at least 2.")
    seeds = [cfg['seed'] + i for i in range(cfg['seeds'])]
    fresh = [seeds[-1] + 1 + i for i in range(cfg['seeds'])] if grid else []  # a sweep's verdict: the seeds after
    n = len(seeds + fresh)
    if cfg['seed'] + n - 1 > configurator.MAX_SEED:
        what = 'sweep' if grid else 'comparison'
        raise UserError(f"--seed={cfg['seed']} leaves no room for the {n} seeds from it this {what} runs; give --seed "
                        f"of at most {configurator.MAX_SEED + 1 - n}.")
    for v in variants:  # what train.py would refuse, said now, at each rate the variant runs at
        for lr in grid or [rates[v]]:
            try:
                check({**cfg, **variant_settings(v), **(at_rate(cfg, lr) if lr is not None else {}),
                       'seed': (fresh or seeds)[-1]})
            except UserError as e:  # a setting the variant carries (polyrelu:poly_order=9) is said as the variant's
                if any(f'--{k}' in str(e) for k in variant_settings(v) if k != 'ffn'):
                    raise UserError(f"--variants: variant '{v}': {e}") from None
                raise
    return dict(variants=variants, seeds=seeds, fresh_seeds=fresh, baseline=baseline, grid=grid, rates=rates,
                untuned=untuned)


def learning_rates(cfg):
    """The rates of a sweep (sorted), or [] without one; the shared learning_rate is always among them."""
    if cfg['lrs'] and cfg['lr_grid']:
        raise UserError("--lrs lists the rates and --lr_grid makes them around learning_rate; give one of them.")
    if not 0 <= cfg['lr_grid'] <= MAX_GRID:
        raise UserError(f"--lr_grid must be between 0 and {MAX_GRID}, got {cfg['lr_grid']}.")
    try:
        rates = sorted({float(r) for r in split_list(cfg['lrs'])})
    except ValueError:
        raise UserError(f"--lrs expects comma-separated numbers, e.g. 1e-3,2e-3,4e-3; got '{cfg['lrs']}'.") from None
    if rates and cfg['learning_rate'] not in rates:
        raise UserError(f"--lrs must include learning_rate={cfg['learning_rate']:g}, whose answer the sweep is compared "
                        f"with; add it or set --learning_rate to one of them.")
    if cfg['lr_grid']:
        rates = [cfg['learning_rate'] * 2.0 ** j for j in range(-cfg['lr_grid'], cfg['lr_grid'] + 1)]
    if not all(0 < r < float('inf') for r in rates):
        given = f"--lrs='{cfg['lrs']}'" if cfg['lrs'] else f"--lr_grid around learning_rate={cfg['learning_rate']:g}"
        raise UserError(f"a sweep's rates must be finite and above 0, but {given} gives {min(rates):g} to "
                        f"{max(rates):g}.")
    return rates


def specs(cfg, comp, rates, seeds=None):
    """The runs of each variant at its rates ({variant: [rate, ...]}, None: the shared learning_rate), seed by seed
    (the sweep's seeds unless given)."""
    out = [make_run(cfg, v, s, lr) for v, lrs in rates.items() for lr in lrs for s in seeds or comp['seeds']]
    if len({r['dir'] for r in out}) < len(out):  # a run's directory names its rate to 3 significant digits
        raise UserError("two of the sweep's rates agree to 3 significant digits, so they would share a run directory; "
                        "give rates that differ within their first 3 digits.")
    return out


def grid_runs(cfg, comp):
    """Every run of the comparison's grid (a sweep's, or each variant at its rate), read from its directory."""
    return [scan(s) for s in specs(cfg, comp, {v: comp['grid'] or [comp['rates'][v]] for v in comp['variants']})]


def best_rates(runs):
    """Per variant of a sweep: its best rate, chosen on the selection half only (stats.choose_rate); a run that did
    not finish (a diverged one) counts as a failure at its rate."""
    losses = {}
    for r in runs:
        losses.setdefault(r.variant, {}).setdefault(r.lr, []).append(r.final(report.SELECT_HALF))
    return {v: stats.choose_rate(by_lr) for v, by_lr in losses.items()}


def beyond_edges(cfg, comp, runs):
    """With --lr_extend: for each variant whose runs are all finished and whose best rate is the smallest or largest
    tried, the runs a grid step beyond it (at most MAX_EXTEND steps past each edge of the grid)."""
    grid, out = comp['grid'], []
    chosen = best_rates(runs)
    for v in comp['variants']:
        mine = [r for r in runs if r.variant == v]
        rates = sorted({r.lr for r in mine})
        if any(r.state not in FINISHED for r in mine):
            continue
        step = grid[1] / grid[0] if len(grid) > 1 else 2.0
        edge = chosen[v]['edge'] or ''  # 'low', 'high' or 'low and high'
        if 'low' in edge and sum(r < grid[0] for r in rates) < MAX_EXTEND:
            out += specs(cfg, comp, {v: [min(rates) / step]})
        if 'high' in edge and sum(r > grid[-1] for r in rates) < MAX_EXTEND:
            out += specs(cfg, comp, {v: [max(rates) * step]})
    return [scan(s) for s in out]


def verdict_specs(cfg, comp, chosen):
    """A sweep's verdict: each variant at its chosen rate on fresh seeds, which the choice never saw (the seed luck
    that made a rate win stays behind with the sweep's runs)."""
    return specs(cfg, comp, {v: [chosen[v]['best']] for v in comp['variants']}, comp['fresh_seeds'])


def plan_rounds(cfg, comp):
    """How many times --plan lists runs at most, each round once the runs before it are done: the grid's runs; with a
    sweep, each step beyond an edge of the grid (--lr_extend, at most 2 * MAX_EXTEND), then the verdict's fresh
    seeds."""
    return 1 + (1 + (2 * MAX_EXTEND if cfg['lr_extend'] else 0) if comp['grid'] else 0)


def check_dataset(cfg):
    """Report a missing dataset now, before any run starts; prepare a bundled one instead of refusing."""
    from data.loader import open_loader
    open_loader(cfg['dataset'], cfg['block_size'], cfg['batch_size'], cfg['seed'], cfg['data_dir'])


def settings_differ(bad):
    """The refusal of runs trained with other settings or on data prepared again since (without --overwrite): before
    any run trains, and again for each run once it is locked, since another comparison may have trained it
    meanwhile."""
    return UserError(f"{bad[0].describe_mismatch()}; use another --out_dir, or pass --overwrite=True to retrain the "
                     f"runs that differ ({len(bad)} at this step).")


def to_do(cfg, runs):
    """The runs to train, seed by seed so that each variant compiles once; a UserError for another run's directory
    (unless --overwrite) or, with --report, for any run not finished."""
    bad = [r for r in runs if r.state == 'mismatch']
    if bad and not cfg['overwrite']:
        raise settings_differ(bad)
    todo = sorted((r for r in runs if r.state not in FINISHED), key=lambda r: r.seed)
    if todo and cfg['report']:
        where = f"is at iteration {todo[0].records[-1]['iter']}" if todo[0].records else 'has not started'
        raise UserError(f"--report: {len(todo)} of {len(runs)} runs are not finished ({todo[0].dir} {where}); "
                        f"run the commands --plan prints, or drop --report to train them here.")
    return todo


class Job:
    """One train.py run as a subprocess on its GPUs (None: as --device says), holding the lock compare.py took."""

    def __init__(self, run, threads, lock, slot, gpus, at_once):
        self.run, self.slot, self.t0 = run, slot, time.time()
        self.name = run.name + (f" (GPU {','.join(gpus)})" if gpus else '')
        d = run.dir
        self.log_path, self.out_path = os.path.join(d, LOG), os.path.join(d, TRAIN_OUT)
        self.resumed_from = run.checkpoint['iter_num'] if run.state == 'resume' else None
        clear_diverged(d)  # even if this try fails before train.py opens the directory
        # at_once: the runs trained side by side, which this run's tok/s and times depend on
        write_json(os.path.join(d, INTENT), dict(settings=run.settings, processes=run.processes, at_once=at_once))
        cmd = command_line(run.spec, START[run.state])
        env = dict(os.environ, PYTHONUNBUFFERED='1', TORCHINDUCTOR_CACHE_DIR=compile_cache_dir(),
                   **placement.gpu_env(gpus), **placement.thread_env(threads))
        # the child shares the lock (one open file); torchrun holds it for its workers, whom it passes no descriptor
        held = HELD + os.path.abspath(os.path.join(d, LOCK))
        env[LOCK_FD_ENV] = str(lock.fileno()) if run.processes == 1 else held
        try:
            with open(self.out_path, 'a') as out:
                print(f"$ {' '.join(cmd)}", file=out, flush=True)
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, pass_fds=(lock.fileno(),))
        except OSError as e:
            raise RunStopped(f"could not start the {run.variant} run in {d} ({e.strerror or e}).") from None
        finally:
            lock.close()  # the child holds the lock now, released when it exits

    def progress(self):
        """The iteration of the log's last line, read from the file's end only (the bar is redrawn twice a second)."""
        try:
            with open(self.log_path, 'rb') as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = f.read().decode(errors='replace').splitlines()
        except OSError:
            lines = []
        record = next((r for r in map(parse_record, reversed(lines)) if r), None)
        return f"{record['iter']}" if record else 'starting'

    def interrupt(self, signalled):
        """Stop the child (it resumes later from its last checkpoint); after a Ctrl-C it has had SIGINT already.
        torchrun gets SIGTERM, which ends its workers with it (after SIGINT they may outlive it), and so does a child
        that ignores SIGINT as this process does (inherited: a background job of a script)."""
        try:
            self.proc.wait(timeout=5 if signalled else 0)
        except subprocess.TimeoutExpired:
            ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            self.proc.send_signal(signal.SIGINT if self.run.processes == 1 and not ignored else signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def finish(self):
        """Once the child exited: the run read again, whose state is its outcome, and a line saying so. A divergence
        (train.py leaves diverged.txt) is the run's outcome, as is a finished run killed before it exited; any other
        failure, a full disk included, raises."""
        rc, run = self.proc.returncode, scan(self.run.spec)
        tail = last_error_line(self.out_path)
        if rc == 2:  # a user mistake in the settings: train.py said what to do
            raise UserError(f"{tail.removeprefix('error: ').rstrip('.')} (the {run.variant} run, seed {run.seed}).")
        if rc in (130, -signal.SIGINT):
            raise KeyboardInterrupt
        # torchrun exits 1 when a process of its run exits 3: the run's own state says whether it diverged, or
        # finished (its last checkpoint and log line written) before a kill
        if rc != 0 and run.state not in FINISHED:
            raise RunStopped(f"training {run.variant} (seed {run.seed}) failed with exit status {rc}: {tail}; "
                             f"see {self.out_path}, fix it and run the same command again to continue.")
        if run.state == 'mismatch':  # trained to its end, on a dataset prepared again or code edited meanwhile
            raise UserError(f"{run.describe_mismatch()}; that changed while the run trained, so train it again with "
                            f"--overwrite=True.")
        how = f"resumed from iteration {self.resumed_from}" if self.resumed_from is not None else 'trained'
        line = f"{self.name}: {how} in {time.time() - self.t0:.0f} s"
        if run.state == 'diverged':  # why, but not train.py's advice to resume: it is the rate's result here
            why, hint, _ = tail.removeprefix('stopped: ').partition('; ' + DIVERGED_HINT)
            return run, line + f", DIVERGED: {why}" + (' (its result at this rate)' if hint else '')
        val = run.final()
        return run, line + (f", final val loss {val:.4f} (all windows)" if val is not None else '')


def last_error_line(path):
    """Why the last attempt in train.out (each begins with `$ command`) stopped: its error, else its last line."""
    try:
        with open(path, errors='replace') as f:
            lines = [l.strip() for l in f.read().splitlines() if l.strip()]
    except OSError:
        return ''
    starts = [i for i, l in enumerate(lines) if l.startswith('$ ')]
    lines = lines[starts[-1] + 1:] if starts else lines
    return next((l for l in reversed(lines) if l.startswith(('error:', 'stopped:'))), lines[-1] if lines else '')


def train_all(todo, slots, threads, overwrite, pbar, finished=lambda runs: None):
    """Train the runs of todo, one per slot (its GPUs: placement.slots) at a time; returns them read again. A run
    whose directory another process holds (a second compare.py) is left to it, then reused or resumed, or refused if
    it trained it with other settings (unless overwrite). finished(runs done so far) is called as each one ends."""
    pending, active, waiting, free, done = list(todo), [], set(), list(range(len(slots))), {}
    try:
        while pending or active:
            for run in list(pending):
                if not free:
                    break
                lock, owner = try_lock_run_dir(run.dir)
                if lock is None:
                    if run.dir not in waiting:
                        waiting.add(run.dir)
                        pbar.write(f"{run.name}: {run.dir} is in use by {owner}; waiting for it", file=sys.stderr)
                    continue
                pending.remove(run)
                if code_hash.__wrapped__() != run.spec['code']:  # read anew: an edit would mix code in the results
                    lock.close()
                    raise UserError(f"{' or '.join(IDEAS)} changed while this comparison ran; run the same command "
                                    f"again, with --overwrite=True to train again the runs of the code before.")
                now = scan(run.spec)  # another process may have trained it meanwhile
                if now.state == 'mismatch' and not overwrite:
                    lock.close()
                    raise settings_differ([now])
                if now.state in FINISHED:
                    lock.close()
                    done[run.dir] = now
                    pbar.write(f"{run.name}: reused ({now.state} by another process)", file=sys.stderr)
                    pbar.update(1)
                    continue
                slot = free.pop(0)
                active.append(Job(now, threads, lock, slot, slots[slot], min(len(slots), len(todo))))
            time.sleep(0.5)
            for job in [j for j in active if j.proc.poll() is not None]:
                active.remove(job)
                free = sorted(free + [job.slot])
                done[job.run.dir], line = job.finish()
                pbar.write(line, file=sys.stderr)
                pbar.update(1)
                finished(list(done.values()))
            pbar.set_description(', '.join(j.name for j in active) or 'runs')
            pbar.set_postfix_str('iter ' + ', '.join(j.progress() for j in active) if active else '')
    except BaseException as e:  # a failure or Ctrl-C: stop the other runs cleanly (they resume next time)
        for job in active:
            job.interrupt(signalled=isinstance(e, KeyboardInterrupt))
        raise
    return [done[r.dir] for r in todo]


def shapes_of(cfg, runs, variants):
    """Per variant its model's parameter counts and scale (from its first run's settings, on the meta device)."""
    models = {v: meta_model(next(r for r in runs if r.variant == v).settings, cfg['data_dir']) for v in variants}
    return {v: {'params': m.param_report(), 'scale': ladder.scale_counts(m)} for v, m in models.items()}


def scored_by(comp):
    """How a comparison scores an evaluation: a sweep, and a comparison at chosen rates, on the half of the validation
    windows no choice reads (report.REPORT_HALF); else on all of them."""
    return report.REPORT_HALF if comp['grid'] or any(comp['rates'].values()) else report.WHOLE


class Curves:
    """The curves while a comparison trains: loss.png redrawn from the runs finished so far (written whole, as every
    file, at most every EVERY seconds) and their partial table on stderr. A sweep's grid step draws each variant at
    the shared rate (one_rate), so that a curve is one rate's; the final report draws over them."""
    EVERY = 20.0

    def __init__(self, cfg, comp, reused, pbar, one_rate):
        self.cfg, self.comp, self.reused, self.pbar, self.one_rate, self.last = cfg, comp, reused, pbar, one_rate, 0.0

    def draw(self, trained):
        try:
            self._draw(trained)
        except Exception as e:  # a picture mid-run is worth less than the runs: say so, go on without it
            self.last = math.inf
            self.pbar.write(f"compare: could not draw the curves so far ({type(e).__name__}: {e}); the report draws "
                            f"them at the end", file=sys.stderr)

    def _draw(self, trained):
        done = [r for r in self.reused + trained if r.state == 'done' and
                (not self.one_rate or r.lr == self.cfg['learning_rate'])]
        variants = [v for v in self.comp['variants'] if any(r.variant == v for r in done)]
        if not variants or time.time() - self.last < self.EVERY:
            return
        self.last = time.time()
        base = self.comp['baseline'] if self.comp['baseline'] in variants else variants[0]
        shared = self.cfg['learning_rate']  # the table shows each variant's rate where it is not this one
        head = dict(baseline=base, seeds=sorted({r.seed for r in done}), variants=variants, dataset=self.cfg['dataset'],
                    settings={'learning_rate': shared},
                    rates={v: next(r.lr or shared for r in done if r.variant == v) for v in variants})
        summary, by_variant = report.summarize(head, done, shapes_of(self.cfg, done, variants), scored_by(self.comp))
        plots.loss(os.path.join(self.cfg['out_dir'], 'loss.png'), summary, by_variant, self.cfg['smooth'])
        at = ' at the shared rate' if self.one_rate else ''
        half = '\n' + REPORT_HALF_NOTE if scored_by(self.comp) is report.REPORT_HALF else ''  # as the final table
        self.pbar.write(f"compare: so far, {len(done)} finished run(s){at} (loss.png drawn; the report follows at the "
                        f"end):\n{report.table(summary)}{half}", file=sys.stderr)


def run_size(cfg, runs):
    """What placing these runs needs to know: the largest one's FLOPs per micro-step and estimated memory."""
    sizes = []
    for r in {r.variant: r for r in runs}.values():  # the runs of a variant differ in seed and rate only
        model = meta_model(r.settings, cfg['data_dir'])
        tokens = r.settings['batch_size'] * r.settings['block_size']  # a micro-step's: it sets the kernels' sizes
        sizes.append((model.flops_per_token() * tokens, placement.peak_memory(r.settings, model.config)))
    return max(sizes)


def train_missing(cfg, comp, runs, why=''):
    """Reuse the finished runs and train the others, N at a time; returns every run as it is now. --plan prints the
    commands of the runs to do instead (and returns None); --report refuses to go on without them. why: what a round
    after the first is for, in words."""
    todo = to_do(cfg, runs)
    if cfg['plan']:
        if not todo:  # nothing to do at this step: the next one may have some
            return runs
        for run in todo:  # each listed run's settings recorded: one that stops before its first checkpoint is known
            if run.state != 'mismatch':  # a mismatch's compare.json still says what its directory holds
                check_writable(run.dir, create=True)
                write_json(os.path.join(run.dir, INTENT), dict(settings=run.settings, processes=run.processes))
        placement.print_plan([command_line(r.spec, START[r.state]) for r in todo], len(runs), cfg['threads'],
                           plan_rounds(cfg, comp))
        return None
    gpus, jobs, threads, at_once = (placement.resolve_jobs(cfg, len(todo), *run_size(cfg, todo)) if todo else
                                    ([], cfg['jobs'], cfg['threads'], ''))
    check_writable(cfg['out_dir'], create=True)
    per = sorted({len({r.lr for r in runs if r.variant == v}) for v in {r.variant for r in runs}})  # rates per variant
    rates = f" x {per[0]}{'' if len(per) == 1 else f'-{per[-1]}'} rates" if per[-1] > 1 else ''
    print(f"compare: {why}{len({r.variant for r in runs})} variant(s) x {len(comp['seeds'])} seed(s){rates}"
          + f" = {len(runs)} runs into {cfg['out_dir']} ({len(runs) - len(todo)} to reuse, {len(todo)} to train"
          + (f", {at_once}" if todo else '') + ')', file=sys.stderr)
    pbar = progress_bar(len(runs), 'runs', unit='run')
    for run in runs:
        if run.state in FINISHED:
            how = 'finished' if run.state == 'done' else 'diverged: see its diverged.txt'
            pbar.write(f"{run.name}: reused ({how})", file=sys.stderr)
            pbar.update(1)
        elif run.state == 'retrain':
            pbar.write(f"{run.name}: to train again: its log has no intact record of its checkpoint's evaluation",
                       file=sys.stderr)
    curves = Curves(cfg, comp, [r for r in runs if r.state in FINISHED], pbar,
                    one_rate=len({r.lr for r in runs if r.variant == runs[0].variant}) > 1)
    try:
        trained = {r.dir: r for r in train_all(todo, placement.slots(jobs, gpus, cfg['nproc_per_run']), threads,
                                               cfg['overwrite'], pbar, curves.draw)}
    except BaseException:
        pbar.leave = False  # the command's one sentence is the last thing on stderr
        raise
    finally:
        pbar.close()
    return [trained.get(r.dir, r) for r in runs]


def run_comparison(cfg, comp, runs):
    """One comparison, as its steps: train the grid's missing runs, extend the sweep where a variant's best rate is at
    an edge (--lr_extend), train each variant at its best rate on fresh seeds (a sweep's verdict), report.
    comp: check_comparison(cfg); runs: grid_runs(cfg, comp). Returns the summary (None after --plan)."""
    t0 = time.time()
    check_dataset(cfg)
    remove_dead_temps(cfg['out_dir'])  # a picture whose redraw a kill cut off
    if comp['untuned'] and not cfg['report']:
        print(f"compare: {comp['untuned']}", file=sys.stderr)
    if (runs := train_missing(cfg, comp, runs)) is None:
        return None
    for _ in range(2 * MAX_EXTEND if cfg['lr_extend'] and comp['grid'] else 0):  # each edge at most MAX_EXTEND steps
        if not (more := beyond_edges(cfg, comp, runs)):
            break
        if (more := train_missing(cfg, comp, more, "the next rate beyond a best rate at the grid's edge: ")) is None:
            return None
        runs += more
    fresh = [scan(s) for s in verdict_specs(cfg, comp, best_rates(runs))] if comp['grid'] else []
    verdict = "the verdict, each variant at its chosen rate on fresh seeds: "
    if fresh and (fresh := train_missing(cfg, comp, fresh, verdict)) is None:
        return None
    if cfg['plan']:
        return placement.print_plan([], len(runs) + len(fresh), cfg['threads'], plan_rounds(cfg, comp))
    summary = write_report(cfg, comp, runs, fresh)
    print(f"wrote {cfg['out_dir']}/summary.md, summary.json and the pictures ({time.time() - t0:.0f} s)",
          file=sys.stderr)
    return summary


def write_report(cfg, comp, runs, fresh):
    """summary.json, summary.md, loss.png, acts.png and acts.json (a sweep also lr.png) into out_dir; the table (the
    results) on stdout."""
    codes = set().union(*(codes_of(r.records) for r in runs + fresh)) - {None}  # only --report can read several
    if len(codes) > 1:
        raise UserError(f"the runs of {cfg['out_dir']} trained with {len(codes)} versions of {' or '.join(IDEAS)}, "
                        f"which a table would pair as one; run the same command without --report and with "
                        f"--overwrite=True to train again those not of the code as it is now.")
    if codes and code_hash() not in codes:
        print(f"compare: note: these runs trained with {OTHER_CODE}; "
              f"acts.png draws them with the code as it is now.", file=sys.stderr)
    shown = {k: cfg[k] for k in keys_that('shown')}  # whether chosen or left at train.py's defaults
    chosen = {k: cfg[k] for k in keys_that('id') if cfg[k] != configurator.DEFAULTS[k]
              and k not in shown and k not in ('ffn', 'seed')}  # those two are set per run
    head = dict(baseline=comp['baseline'], seeds=comp['fresh_seeds'] or comp['seeds'], variants=comp['variants'],
                dataset=cfg['dataset'], settings={**shown, **chosen})
    shapes = shapes_of(cfg, runs, comp['variants'])
    if comp['grid']:
        head['tuned_at'] = tuning_key(cfg)
        summary, by_variant = report.summarize_sweep(head, runs, fresh, shapes, best_rates(runs), cfg['learning_rate'])
    else:  # each variant's rate, and a line on those without a tuned one
        head.update(rates={v: r or cfg['learning_rate'] for v, r in comp['rates'].items()},
                    untuned=[v for v, r in comp['rates'].items() if r is None], untuned_note=comp['untuned'])
        summary, by_variant = report.summarize(head, runs, shapes, scored_by(comp))
    if summary['damaged_lines']:
        print(f"compare: {report.damaged_note(summary)}", file=sys.stderr)
    with ctrl_c_held():  # the report's files land together: a Ctrl-C waits for the last of them
        if comp['grid']:
            plots.lr(os.path.join(cfg['out_dir'], 'lr.png'), summary)
        plots.loss(os.path.join(cfg['out_dir'], 'loss.png'), summary, by_variant, cfg['smooth'])
        # what each variant's activation became (its first seed, at its best rate): acts.png, and how far it moved
        by_dir = {r.dir: r for r in runs + fresh}
        first_seed = {v: by_dir[s['runs'][0]['dir']] for v, s in summary['variants'].items()}
        summary['acts'] = acts.compare_acts(cfg['out_dir'], first_seed, cfg['data_dir'])
        # what the runs ran on, as each try's first log line names it (torch, CUDA, cuDNN, the device)
        summary['ran_on'] = [json.loads(e) for e in sorted({json.dumps(x['env']) for r in runs + fresh
                                                            for x in r.records if 'env' in x})]
        write_json(os.path.join(cfg['out_dir'], 'summary.json'), summary)
        report.write_markdown(os.path.join(cfg['out_dir'], 'summary.md'), summary)
    print('\n' + report.table(summary))
    if summary['scored_on'] == 'report half':  # a run's own last line scores it on every window
        print(REPORT_HALF_NOTE)
    if summary['seed_std'] is not None:
        print(f"seed std of the final val loss {summary['seed_std']:.4f}, of the paired differences "
              f"{report.fmt_loss(summary['paired_diff_std'])}")
    if comp['grid']:  # a copy and paste runs each variant at its chosen rate without the sweep
        print('\n' + report.tuned_lines(summary))
    return summary


def run_ladder(cfg):
    """--sizes: a comparison at every size in out_dir/<size>/, then the ladder's summary and ladder.png in out_dir."""
    learning_rates(cfg)  # the sweep's settings, checked before each size scales them
    own = variant_rates(cfg['variants'], 'variants')
    if cfg['lr_rule'] == 'width' and any(own.values()):
        raise UserError("--lr_rule=width scales learning_rate per size, which a variant's own @rate would not follow; "
                        "drop the @rate, or use --lr_rule=fixed.")
    sizes = ladder.size_settings(cfg, cfg['baseline'] or next(iter(own)))
    steps = []
    for s in sizes:  # every size checked and read (with --report: finished) before any trains
        size_cfg = {**cfg, **s['settings']}
        refuse_a_runs_folder(size_cfg['out_dir'])
        comp = check_comparison(size_cfg)
        runs = grid_runs(size_cfg, comp)
        to_do(size_cfg, runs)
        steps.append((size_cfg, comp, runs))
    summaries = []
    for size, step in zip(sizes, steps):
        if not cfg['plan']:  # each size's table on stdout, under its name
            print(f"\n## size {size['name']}")
        summaries.append(run_comparison(*step))
    if cfg['plan']:  # the runs of every size are listed; the ladder's report waits for them
        return
    lad = ladder.summarize(cfg, sizes, summaries)
    with ctrl_c_held():
        write_json(os.path.join(cfg['out_dir'], 'summary.json'), lad)
        ladder.write_markdown(os.path.join(cfg['out_dir'], 'summary.md'), lad)
        plots.ladder(os.path.join(cfg['out_dir'], 'ladder.png'), lad)
    print(f"wrote the ladder's summary.md, summary.json and ladder.png into {cfg['out_dir']}", file=sys.stderr)


def refuse_a_runs_folder(out_dir):
    """A comparison's out_dir (a ladder's, and each size's) that holds a run: its acts.png would be the comparison's."""
    if os.path.exists(os.path.join(out_dir, CKPT)):
        raise UserError(f"{out_dir} holds a run (its {CKPT}), whose pictures a comparison there would replace; "
                        f"choose another --out_dir.")


def raise_terminated(signum, frame):
    """SIGTERM's handler: compare.py and its runs stop cleanly on it, as on Ctrl-C (cli.Terminated, status 143)."""
    raise Terminated


def main(argv):
    cfg = settings(argv)
    refuse_a_runs_folder(cfg['out_dir'])
    if cfg['sizes']:
        return run_ladder(cfg)
    if cfg['tokens_per_param'] or cfg['lr_rule'] != 'fixed':
        raise UserError("--tokens_per_param and --lr_rule set the budget and learning rate per size of a ladder; "
                        "add --sizes (e.g. --sizes=2x64,3x96,4x128) or drop them.")
    from_default = all(a.startswith('-') for a in argv)  # settings() began with the default config, whose sweep tunes
    comp = check_comparison(cfg, [a for a in argv if a.startswith('--')] if from_default else None)
    if not cfg['report'] and (note := schedule_note(cfg)):
        print(f"compare: {note}", file=sys.stderr)
    run_comparison(cfg, comp, grid_runs(cfg, comp))


if __name__ == '__main__':
    signal.signal(signal.SIGTERM, raise_terminated)  # `kill`, `timeout`: the runs stop cleanly, as on Ctrl-C
    run_cli(main)
