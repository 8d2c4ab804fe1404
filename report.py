"""
The report of a comparison: everything compare.py writes after the runs, computed from the runs' own log.jsonl files
(and the model's shape), so the same runs always give the same summary.

    summarize(...)        per-run metrics from the logs, per-variant statistics over seeds, the paired differences
    write_markdown(...)   summary.md: settings, the table, seed noise, what the learnable activations learned
    plot(...)             loss.png: validation loss against tokens and against training time, smoothed training loss
"""
import math
import os
import statistics

import stats
import train
from common import checkpoint_field, read_log, read_json

# the settings that shape a comparison, shown in its summary whether chosen or left at train.py's defaults
SHOWN_KEYS = ('dataset', 'n_layer', 'n_head', 'n_embd', 'block_size', 'batch_size', 'gradient_accumulation_steps',
              'max_iters', 'learning_rate', 'schedule', 'warmup_iters', 'min_lr', 'eval_interval', 'eval_iters',
              'n_expert', 'top_k', 'device', 'dtype', 'compile')
# set per run by compare.py
PER_RUN_KEYS = ('out_dir', 'ffn', 'seed', 'init_from', 'overwrite', 'wandb_run_name', 'wandb_tags')


def fmt_value(value):
    """A value as train.py's --key=value parser reads it back."""
    if value is None:
        return 'auto'
    return value if isinstance(value, str) else repr(value)


# ----------------------------------------------------------------------------------------------------------------------
# summarising: everything from the runs' log.jsonl (and the model's shape), so the same runs give the same summary


def run_metrics(log):
    """Per-run numbers recomputed from its log records."""
    evals = [r for r in log if 'val_loss' in r]
    trains = [r for r in log if 'loss' in r]
    # training time: each train line's ms is the mean step time since the previous line (evaluation and compiling
    # excluded)
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
        'compile_s': next((r['compile_s'] for r in reversed(log) if 'compile_s' in r), None),  # compiled runs only
        'tok_s': statistics.median(tok_s) if tok_s else None,  # steady state: the median over log lines
        'batch_hash': last.get('batch_hash'),
        'val_hash': next((r['val_hash'] for r in reversed(log) if 'val_hash' in r), None),
        'act': acts[-1] if acts else None,
        'curve': {
            'val': [[r['iter'], r['tokens'], times[r['iter']], r['val_loss']] for r in evals],
            'train': [[r['iter'], r['tokens'], r['loss']] for r in trains],
        },
    }


def mean_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def mean_std(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    return {'mean': statistics.fmean(values), 'std': statistics.stdev(values) if len(values) > 1 else None,
            'min': min(values), 'max': max(values), 'n': len(values)}


def meta_model(run_dir, args, data_dir, dataset):
    """The run's model, built on the meta device (no memory, no init time): its model_args from the checkpoint (read
    lazily), else rebuilt from the run's settings (run_dir None: a run not started yet)."""
    import torch
    from model import GPT, GPTConfig
    model_args = checkpoint_field(run_dir, 'model_args') if run_dir else None
    if model_args is None:
        model_args = {k: args[k] for k in train.MODEL_KEYS}
        if not model_args['vocab_size']:
            meta = read_json(os.path.join(data_dir, dataset, 'meta.json')) or {}
            model_args['vocab_size'] = meta.get('vocab_size', 0)
    with torch.device('meta'):
        return GPT(GPTConfig(**model_args))


def scale_counts(model):
    """The sizes a scaling ladder is drawn against. N = non-embedding parameters: all of them less the token embedding
    (tied with the output head) and any position embedding (Kaplan et al. 2020); an MoE's total N and its active N
    (top_k of n_expert experts per token). flops_per_token: the model's own count, the one model.estimate_mfu uses
    (PaLM, Chowdhery et al. 2022, appendix B): 6·N' + 12·L·H·Q·T for a forward and backward pass, N' the active
    parameters less the position embedding (the tied token embedding stays: it is the output head's matmul)."""
    p, c = model.param_report(), model.config
    wpe = model.transformer.wpe.weight.numel() if model.transformer.wpe is not None else 0
    attention = 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size
    return {'non_embedding': p['total'] - p['embedding'], 'non_embedding_active': p['active'] - p['embedding'],
            'flops_per_token': 6 * (p['active'] - wpe) + attention}


def mean_over_seeds(values):
    """The mean of one learned quantity over seeds: numbers plainly, lists elementwise, dicts per key."""
    first = values[0]
    if isinstance(first, dict):
        return {k: mean_over_seeds([v[k] for v in values]) for k in first if all(k in v for v in values)}
    if isinstance(first, list):
        return [statistics.fmean(col) for col in zip(*values)]
    return statistics.fmean(values)


def learned_mean(acts):
    """What the activations learned (the logs' `act` records, one per seed) averaged over seeds, layer by layer."""
    acts = [a for a in acts if a]
    if not acts:
        return None
    return {'layers': [mean_over_seeds(list(per_seed)) for per_seed in zip(*[a['layers'] for a in acts])]}


def summarize(cfg, variants, seeds, baseline, runs, statuses):
    by_variant = {}
    for run in runs:
        log = read_log(os.path.join(run['dir'], 'log.jsonl'))
        m = run_metrics(log)
        m.update(seed=run['seed'], dir=run['dir'], status=statuses[(run['variant'], run['seed'])])
        if m['status'] != 'done':
            m['final_val_loss'] = None  # a stopped run has no final evaluation to compare
        by_variant.setdefault(run['variant'], []).append(m)
    full = {**train.DEFAULTS, **cfg}
    out = {'baseline': baseline, 'seeds': seeds, 'dataset': cfg['dataset'], 'settings': {}, 'variants': {}}
    # the settings that shape the comparison, whether chosen or left at train.py's defaults, then every other choice
    shown = {k: fmt_value(full[k]) for k in SHOWN_KEYS}
    # what the runs did (compiled runs log compile_s), which reused runs may not share with this command's setting
    compiled = [m['compile_s'] is not None for ms in by_variant.values() for m in ms]
    shown['compile'] = ('on' if all(compiled) else 'off' if not any(compiled) else
                        f"mixed ({sum(compiled)} of {len(compiled)} runs compiled, so their times do not compare)")
    if full['compile'] is None:
        shown['compile'] += ' (auto)'
    out['settings'] = {**shown, **{k: v for k, v in runs[0]['args'].items() if k not in PER_RUN_KEYS and k not in shown}}
    base_vals = {m['seed']: m['final_val_loss'] for m in by_variant[baseline]}
    for v in variants:
        ms = by_variant[v]
        run0 = next(r for r in runs if r['variant'] == v)
        model = meta_model(run0['dir'], {**full, 'ffn': v}, cfg['data_dir'], cfg['dataset'])
        diffs = [m['final_val_loss'] - base_vals[m['seed']] for m in ms
                 if m['final_val_loss'] is not None and base_vals.get(m['seed']) is not None]
        out['variants'][v] = {
            'params': model.param_report(),
            'scale': scale_counts(model),
            'status': 'done' if all(m['status'] == 'done' for m in ms) else 'stopped',
            'final_val_loss': mean_std([m['final_val_loss'] for m in ms]),
            'diff_to_baseline': stats.paired(diffs) if v != baseline else None,
            'tok_s': statistics.fmean(m['tok_s'] for m in ms if m['tok_s']) if any(m['tok_s'] for m in ms) else None,
            # over the finished runs (a stopped run's partial time is not a run's time), or all where none finished
            'train_time_s': statistics.fmean(m['train_time_s']
                                             for m in ([m for m in ms if m['status'] == 'done'] or ms)),
            'compile_s': mean_or_none([m['compile_s'] for m in ms]),
            'tokens': max(m['tokens'] for m in ms),
            'learned': learned_mean([m['act'] for m in ms]),
            'runs': [{k: m[k] for k in ('seed', 'dir', 'status', 'iters', 'tokens', 'final_val_loss', 'final_train_loss',
                                        'train_time_s', 'compile_s', 'tok_s', 'batch_hash', 'val_hash', 'act')}
                     for m in ms],
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
    for v in variants:
        out['variants'][v]['matched'] = matched(by_variant[v], by_variant[baseline], out['variants'][v]['scale'],
                                                out['variants'][baseline]['scale']) if v != baseline else None
    return out, by_variant


def matched(runs, base_runs, scale, base_scale):
    """Compute- and time-matched verdicts of a variant against the baseline, seed by seed (same batches): the tokens,
    FLOPs and seconds of training the variant needs to reach the baseline's final validation loss (linearly
    interpolated on its evaluation curve; None = not reached), as ratios to what the baseline itself needed to first
    reach that loss (its whole run when its curve only falls; earlier if it dipped below its final loss and came
    back, so that a variant equal to the baseline scores 1), and the loss the variant had reached when the
    baseline's training time ran out (the paired difference to the baseline's final loss). A variant that is slower
    per step must win by more than it costs to win on time."""
    base = {m['seed']: m for m in base_runs if m['status'] == 'done' and m['curve']['val']}
    ratios = {'tokens': [], 'flops': [], 'seconds': []}
    at_budget, reached, n = [], 0, 0
    for m in runs:
        b = base.get(m['seed'])
        if b is None or m['status'] != 'done' or not m['curve']['val']:
            continue
        n += 1
        _, b_toks, b_secs, b_loss = zip(*b['curve']['val'])
        b_sec, target = b_secs[-1], b_loss[-1]
        b_tok, b_sec_reach = stats.reach(b_toks, b_loss, target), stats.reach(b_secs, b_loss, target)
        _, tok, sec, loss = zip(*m['curve']['val'])
        at_budget.append(stats.loss_at(sec, loss, b_sec) - target)
        t_reach, s_reach = stats.reach(tok, loss, target), stats.reach(sec, loss, target)
        if t_reach is None:
            continue
        reached += 1
        # None where the baseline was there before it trained (a run of 0 iterations): no ratio to take
        ratios['tokens'].append(t_reach / b_tok if b_tok > 0 else None)
        ratios['flops'].append(t_reach * scale['flops_per_token'] / (b_tok * base_scale['flops_per_token'])
                               if b_tok > 0 else None)
        ratios['seconds'].append(s_reach / b_sec_reach if b_sec_reach > 0 else None)
    if n == 0:
        return None
    mean = lambda xs: statistics.fmean(xs) if xs and None not in xs and len(xs) == n else None
    return {'seeds': n, 'reached': reached, **{f'{k}_ratio': mean(xs) for k, xs in ratios.items()},
            'loss_at_base_time': stats.paired(at_budget)}


# ----------------------------------------------------------------------------------------------------------------------
# the report: summary.md and the printed table


def measured_together(at_once):
    """What the times and tok/s were measured beside: at_once is how many runs trained side by side (from the runs'
    compare.json), 'mixed' where runs differ or some do not say, None where none says."""
    if at_once == 'mixed':
        return ", measured with different (or unrecorded) numbers of runs at a time"
    return f", measured with {at_once} runs at a time" if isinstance(at_once, int) and at_once > 1 else ''


def fmt_loss(x, digits=4, signed=False):
    if x is None:
        return '–'
    return f'{x:+.{digits}f}' if signed else f'{x:.{digits}f}'


def _count(n):
    return f'{n / 1e6:.2f}M' if n >= 1e6 else f'{n / 1e3:.1f}k' if n >= 1e3 else str(n)


def any_compiled(summary):
    """Whether any variant's runs were compiled (they log their compile seconds)."""
    return any(s.get('compile_s') is not None for s in summary['variants'].values())


def table(summary):
    base = summary['baseline']
    compiled = any_compiled(summary)
    rows = ['| variant | params | FFN | extras | final val loss (mean ± std) | Δ vs ' + base +
            ' (± std) | resolved? | tok/s | train time |' + (' compile |' if compiled else ''),
            '|---|---:|---:|---:|---:|---:|:---:|---:|---:|' + ('---:|' if compiled else '')]
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
                    f"{'–' if s['tok_s'] is None else format(s['tok_s'], ',.0f')} | {s['train_time_s']:.1f} s |"
                    + (f" {'–' if s.get('compile_s') is None else format(s['compile_s'], '.1f') + ' s'} |"
                       if compiled else ''))
    return '\n'.join(rows)


def time_verdict(m):
    """Which way the time-matched comparison goes: the variant's loss when the baseline's training time ran out
    against the baseline's final loss, paired over seeds (resolved by the t-test, else a tie within noise)."""
    d = m and m['loss_at_base_time']
    if not d:
        return '–'
    if d['n'] < 2:
        return ('ahead' if d['mean'] < 0 else 'behind') + ' (1 seed, untested)'
    if not d['resolved']:
        return 'tie within noise'
    return 'wins on time' if d['mean'] < 0 else 'loses on time'


def matched_section(summary):
    """summary.md's compute- and time-matched verdicts: a table, one row per variant but the baseline."""
    base = summary['baseline']
    ratio = lambda x: '–' if x is None else f'{x:.2f}x'
    rows = []
    for v, s in summary['variants'].items():
        m = s.get('matched')
        if v == base or not m:
            continue
        d = m['loss_at_base_time']
        at = '–' if not d else fmt_loss(d['mean'], signed=True) + (f" ± {d['std']:.4f}" if d['std'] is not None else '')
        rows.append(f"| {v} | {m['reached']} of {m['seeds']} | {ratio(m['tokens_ratio'])} | {ratio(m['flops_ratio'])} "
                    f"| {ratio(m['seconds_ratio'])} | {at} | {time_verdict(m)} |")
    if not rows:
        return []
    return ['## Compute- and time-matched', '',
            f"Target: {base}'s final validation loss, seed by seed. Reached: in how many seeds the variant's validation "
            f"curve gets there (linear interpolation between evaluations); tokens, FLOPs and seconds: what it needs to "
            f"get there as a multiple of what {base} needed to first get there itself (mean over seeds, only when every "
            f"seed reached it; FLOPs from each model's own per-token count); at {base}'s time: the variant's loss when "
            f"{base}'s training time ran out, minus {base}'s final loss (mean ± std over seeds; a variant that ends "
            f"sooner keeps its final loss), and which way that goes (paired t-test at 95%).", '',
            f'| variant | reached | tokens | FLOPs | seconds | loss at {base}\'s time − {base} | on time |',
            '|---|:---:|---:|---:|---:|---:|:---:|'] + rows + ['']


# how the keys of an activation's learned() report read in summary.md; any other key is shown by its own name
LEARNED_LABELS = {'poly': 'PolyCom [a0..ar]', 'alpha': 'α', 'gate_mean': 'c(x) mean over tokens',
                  'gate_std': 'c(x) std over tokens', 'alpha_p': 'α_p', 'alpha_n': 'α_n',
                  'moe_load_max_over_mean': 'expert load max/mean', 'moe_load_entropy': 'expert load entropy (nats)'}


def fmt_learned(value):
    """One learned quantity: a number, a list of numbers, or named numbers (an LA/MoA dictionary's entries)."""
    if isinstance(value, dict):
        return ', '.join(f'{k} {v:.3f}' for k, v in value.items())
    if isinstance(value, list):
        return ', '.join(f'{v:.3f}' for v in value)
    return f'{value:.3f}'


def learned_section(summary):
    """Per variant and layer, every quantity the activation reported about itself (activations.py's `learned`),
    the up branch of a gated variant on a line of its own."""
    lines = []
    for v, s in summary['variants'].items():
        if not s['learned']:
            continue
        n = len([r for r in s['runs'] if r['act']])
        lines += [f"**{v}** (mean over {n} seed{'s' if n > 1 else ''}):", '']
        for i, layer in enumerate(s['learned']['layers']):
            parts = {'': [], 'up_': []}
            for key, value in layer.items():
                prefix = 'up_' if key.startswith('up_') else ''
                name = key[len(prefix):]
                parts[prefix].append(f'{LEARNED_LABELS.get(name, name)} = {fmt_learned(value)}')
            if parts['up_']:
                lines += [f'- layer {i}:', f"  - gate branch: {'; '.join(parts[''])}",
                          f"  - up branch: {'; '.join(parts['up_'])}"]
            elif parts['']:
                lines.append(f"- layer {i}: {'; '.join(parts[''])}")
        lines.append('')
    return lines


def fmt_moved(branch):
    rel = f" ({branch['moved'] / branch['init_rms']:.0%})" if branch['init_rms'] > 0 else ''
    return f"{branch['moved']:.3f}{rel}"


def acts_section(summary):
    """acts.png, and per learnable variant and layer how far the function moved from its init (inspect_run.py)."""
    acts = {v: a for v, a in (summary.get('acts') or {}).items() if a is not None}
    if not acts:
        return []
    rows = []
    for v, a in acts.items():
        cells = []
        for i, layer in enumerate(a['layers']):
            moved = {name: b for name, b in layer.items() if b['learnable']}
            names = {'act': 'gate ' if 'act_up' in layer else '', 'act_up': 'up '}
            if moved:
                cells.append(f'layer {i} ' + ', '.join(names[n] + fmt_moved(b) for n, b in moved.items()))
        if cells:
            rows.append(f"- **{v}**: " + '; '.join(cells))
    lines = ['## What the activation functions became', '',
             "![learned activation functions](acts.png)", '',
             "acts.png: per variant (its first seed), per layer, the learned function φ(h) (solid; the median and the "
             "10-90% band over tokens where φ depends on the token: PolyNorm, MoA) against the function it started "
             "from (dashed), over the histogram of the layer's pre-activations h on the first validation batch "
             "(python inspect_run.py --out_dir=RUN draws every panel of one run, into the run's directory).", '']
    if rows:
        lines += ["Moved from init, per layer: sqrt(Σ_b w_b (φ_learned(h_b) − φ_init(h_b))²) over the bins b of that "
                  "histogram, w_b the bin's share of the mass (φ the median over tokens where it depends on the "
                  "token); in brackets, relative to the init function's rms over the same mass. 0 = unchanged.", '']
        lines += rows + ['']
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
             f"95% (scipy.stats, Student's t with n-1 degrees of freedom). tok/s: median over log "
             f"lines; train time: optimizer steps only (evaluation and compilation excluded)"
             + measured_together(cfg.get('at_once'))
             + ("; compile: seconds each run spent compiling its graphs or loading them from the compile cache, mean "
                "over seeds" if any_compiled(summary) else '')
             + ". params: total (tied embedding counted once); FFN: W_up/W_gate/W_down (all experts); extras: learned "
             "activation coefficients and MoA gates."]
    if summary['seed_std'] is not None:
        notes.append(f"Seed noise: std over seeds of the final val loss {summary['seed_std']:.4f} (pooled over "
                     f"variants); std of the paired differences {fmt_loss(summary['paired_diff_std'])} (pooled).")
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
    lines += matched_section(summary)
    learned = learned_section(summary)
    if learned:
        lines += ['## What the learnable activations learned', '',
                  'From the last evaluation of each run, averaged over seeds. PolyCom coefficients in the order '
                  '[a0, a1, ..., ar] (a_i multiplies the i-th power); LA/MoA α per dictionary entry; MoA coefficient '
                  'c_k(x) = α_k·gate_k(x): its mean and its std across the tokens of the first validation batch (how '
                  'token-adaptive the mixture became); MoE: expert load (max/mean, entropy) on that batch.', ''] + learned
    lines += ['![loss curves](loss.png)', '']
    lines += acts_section(summary)
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


def padded(rows):
    """Curves of different lengths (a stopped run is shorter) as one array, NaN past each curve's end."""
    import numpy as np
    out = np.full((len(rows), max(len(r) for r in rows)), np.nan)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
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
        # evaluations at the same iterations for every seed; a stopped run contributes the points it has, so each
        # point is the mean (and band) over the seeds that reached it
        val = padded([[p[3] for p in m['curve']['val']] for m in done])
        tok = np.array(max((m['curve']['val'] for m in done), key=len))[:, 1]
        secs = np.nanmean(padded([[p[2] for p in m['curve']['val']] for m in done]), 0)
        keep = tok > 0  # the untrained model's loss (ln vocab) would squash the interesting part...
        if keep.sum() < 2:  # ...unless it is needed to draw a line at all
            keep[:] = True
        label = f'{v} ({len(done)} seed{"s" if len(done) > 1 else ""})'
        for ax, x in ((axes[0], tok), (axes[1], secs)):
            ax.plot(x[keep], np.nanmean(val, 0)[keep], color=c, marker='.', label=label)
            if len(done) > 1:
                ax.fill_between(x[keep], np.nanmin(val, 0)[keep], np.nanmax(val, 0)[keep], color=c, alpha=0.2,
                                linewidth=0)
        trains = [m['curve']['train'] for m in ms if m['curve']['train']]
        if trains:
            loss = padded([ema([p[2] for p in t], cfg['smooth']) for t in trains])
            x = np.array(max(trains, key=len))[:, 1]
            axes[2].plot(x, np.nanmean(loss, 0), color=c, label=v)
            if len(trains) > 1:
                axes[2].fill_between(x, np.nanmin(loss, 0), np.nanmax(loss, 0), color=c, alpha=0.2, linewidth=0)
    axes[0].set(xlabel='training tokens', ylabel='validation loss', title='validation loss (mean, band: min–max over seeds)')
    axes[1].set(xlabel='training time (s, evaluation and compilation excluded)', ylabel='validation loss',
                title='validation loss against time')
    axes[2].set(xlabel='training tokens', ylabel='training loss (EMA)', title=f"training loss (EMA {cfg['smooth']})")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{summary['dataset']}: {len(summary['variants'])} FFN variants x {len(summary['seeds'])} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


