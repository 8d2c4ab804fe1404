"""
A scaling ladder: the same comparison at several model sizes, and what the trend with size says.

    size_settings(cfg)       --sizes '2x64,3x96,4x128' -> each size's settings: shape, token budget, learning rate
    summarize(...)           per variant and size: final loss over seeds, the paired gap to the baseline, N and FLOPs;
                             per variant: the gap's trend with ln N, the power-law fit L(N) = E + A·N^(−α), and (4+
                             sizes) the effective compute multiplier against the baseline's loss-vs-compute law
    write_markdown(...)      the ladder's summary.md (plots.ladder draws ladder.png)

With a learning-rate sweep (--lrs or --lr_grid) every size chooses each variant's own best rate, and every point of the
ladder is that variant at that rate (reported on the validation windows the choice did not read).

compare.py runs each size as an ordinary comparison in <out_dir>/<n_layer>x<n_embd>/ (reused and resumed like any),
so a ladder is extended by adding a size. N is the non-embedding parameter count (Kaplan et al. 2020); training FLOPs
are the model's own per-token count x tokens (model.GPT.flops_per_token).
"""
import math
import os
import sys

import stats
from configurator import UserError, split_list
from report import fmt_count, meta_model, scale_counts, time_verdict
from rundir import write_text

BOOTSTRAP_MIN_SEEDS = 5  # fewer values have too few distinct resamples for a percentile interval
EXTRAPOLATE = 10  # the compute multiplier is also given at this many times the largest size's compute
HEAD_SIZE = 32  # the head size n_head is chosen for when a size does not name it (kept within 16-64 and even)


def pick_heads(n_embd):
    """The number of heads whose head size is even, within 16-64 and nearest HEAD_SIZE (RoPE rotates pairs)."""
    fits = [h for h in range(1, n_embd + 1) if n_embd % h == 0 and (n_embd // h) % 2 == 0 and 16 <= n_embd // h <= 64]
    if not fits:
        raise UserError(f"no head size in 16-64 divides n_embd={n_embd} evenly; use a multiple of 16 or name the "
                        f"heads as LxDxH, e.g. 2x{n_embd}x1.")
    return min(fits, key=lambda h: (abs(n_embd // h - HEAD_SIZE), h))


def sizes(text):
    """Parse --sizes: comma-separated n_layer x n_embd, optionally x n_head. Returns dicts with name and shape."""
    out = []
    for part in split_list(text):
        try:
            dims = [int(x) for x in part.lower().split('x')]
        except ValueError:
            dims = []
        if len(dims) not in (2, 3) or min(dims) < 1:
            raise UserError(f"--sizes entry '{part}' is not n_layer x n_embd (e.g. 2x64) or n_layer x n_embd x n_head.")
        n_layer, n_embd = dims[:2]
        n_head = dims[2] if len(dims) == 3 else pick_heads(n_embd)
        if n_embd % n_head or (n_embd // n_head) % 2:
            raise UserError(f"--sizes entry '{part}': n_embd {n_embd} must split into {n_head} heads of even size.")
        out.append(dict(name=f'{n_layer}x{n_embd}', n_layer=n_layer, n_embd=n_embd, n_head=n_head))
    if not out:
        raise UserError("--sizes is empty; give e.g. --sizes=2x64,3x96,4x128.")
    if len({s['name'] for s in out}) != len(out):
        raise UserError(f"--sizes names a size twice ({text}); list each once.")
    return out


MAX_ITERS = 10**8  # a budget past this is a mistake (a typo in --tokens_per_param), not a plan


def size_settings(cfg):
    """Every size of --sizes with its settings, on top of the comparison's. Token budget: --max_iters at every size,
    or with --tokens_per_param=K, iterations = ceil(K·N / tokens per iteration), N the baseline's non-embedding
    parameters at that size (Hoffmann et al. 2022 find K ≈ 20 compute-optimal); warmup, decay and evaluation
    intervals then scale with the iterations, so every size has the same schedule shape and number of evaluations.
    Learning rate: the same at every size (lr_rule=fixed), or lr·d₀/d with d the width and d₀ the first size's
    (lr_rule=width: the 1/width rule of muP's hidden layers, Yang et al. 2022, applied to the one global rate)."""
    if cfg['lr_rule'] not in ('fixed', 'width'):
        raise UserError(f"--lr_rule expects fixed or width, got '{cfg['lr_rule']}'.")
    if not 0 <= cfg['tokens_per_param'] < float('inf'):
        raise UserError(f"--tokens_per_param must be a finite number >= 0, got {cfg['tokens_per_param']}.")
    if cfg['tokens_per_param'] > 0 and cfg['max_iters'] < 1:
        raise UserError("--tokens_per_param scales the schedule of --max_iters; give --max_iters of at least 1.")
    out, all_sizes = [], sizes(cfg['sizes'])
    baseline = cfg['baseline'] or split_list(cfg['variants'])[0]
    for size in all_sizes:
        s = dict(n_layer=size['n_layer'], n_embd=size['n_embd'], n_head=size['n_head'],
                 out_dir=os.path.join(cfg['out_dir'], size['name']))
        n_params = scale_counts(meta_model({**cfg, **s, 'ffn': baseline}, cfg['data_dir']))['non_embedding']
        if cfg['tokens_per_param'] > 0:
            # tokens per iteration, over all the run's processes (each DDP process trains on batches of its own)
            per_iter = cfg['batch_size'] * cfg['block_size'] * cfg['gradient_accumulation_steps'] * cfg['nproc_per_run']
            iters = max(1, math.ceil(cfg['tokens_per_param'] * n_params / per_iter))
            if iters > MAX_ITERS:
                raise UserError(f"--tokens_per_param={cfg['tokens_per_param']:g} asks for {iters:,} iterations at size "
                                f"{size['name']}; give a budget of at most {MAX_ITERS:,} iterations.")
            f = iters / cfg['max_iters']
            s.update(max_iters=iters, warmup_iters=round(cfg['warmup_iters'] * f),
                     lr_decay_iters=round(cfg['lr_decay_iters'] * f), eval_interval=max(1, round(cfg['eval_interval'] * f)))
        if cfg['lr_rule'] == 'width':
            f = all_sizes[0]['n_embd'] / size['n_embd']
            s.update(learning_rate=cfg['learning_rate'] * f, min_lr=cfg['min_lr'] * f)
        print(f"compare: size {size['name']} (n_head {size['n_head']}, N = {n_params:,} non-embedding parameters, "
              f"{s.get('max_iters', cfg['max_iters'])} iterations, learning rate "
              f"{s.get('learning_rate', cfg['learning_rate']):.3g})", file=sys.stderr)
        out.append({**size, 'settings': s})
    return out


# ----------------------------------------------------------------------------------------------------------------------
# the ladder's summary


def summarize(cfg, sizes, summaries):
    """sizes: size_settings(cfg); summaries: one comparison summary per size (report.summarize). JSON-able."""
    first = summaries[0]
    variants, baseline = list(first['variants']), first['baseline']
    out = {'baseline': baseline, 'seeds': first['seeds'], 'dataset': first['dataset'],
           'token_rule': f"tokens_per_param={cfg['tokens_per_param']:g}" if cfg['tokens_per_param'] > 0
           else f"fixed max_iters={cfg['max_iters']}",
           'lr_rule': cfg['lr_rule'], 'sizes': [], 'variants': {}}
    for size, summ in zip(sizes, summaries):
        s = size['settings']
        out['sizes'].append({k: size[k] for k in ('name', 'n_layer', 'n_embd', 'n_head')}
                            | {'max_iters': s.get('max_iters', cfg['max_iters']),
                               'tokens': summ['variants'][baseline]['tokens'],
                               'learning_rate': s.get('learning_rate', cfg['learning_rate'])})
    for v in variants:
        points = []
        for size, summ in zip(sizes, summaries):
            sv, sb = summ['variants'][v], summ['variants'][baseline]
            gaps = seed_gaps(sv, sb)
            points.append({'size': size['name'], 'N': sv['scale']['non_embedding'], 'n_embd': size['n_embd'],
                           'best_lr': summ['lr'][v]['best'] if summ.get('lr') else None, 'tok_s': sv['tok_s'],
                           'N_active': sv['scale']['non_embedding_active'],
                           'flops': sv['scale']['flops_per_token'] * sv['tokens'],
                           'final_val_loss': sv['final_val_loss'], 'seed_losses': [r['final_val_loss'] for r in sv['runs']],
                           'gap': sv['diff_to_baseline'], 'seed_gaps': gaps,
                           'gap_bootstrap_ci': stats.bootstrap_ci(gaps) if len(gaps) >= BOOTSTRAP_MIN_SEEDS else None,
                           'matched': sv['matched']})
        out['variants'][v] = {
            'points': points,
            'trend': stats.gap_trend([math.log(p['N']) for p in points for _ in p['seed_gaps']],
                                     [g for p in points for g in p['seed_gaps']]) if v != baseline else None,
            'fit': stats.power_law_fit([p['N'] for p in points for _ in p['seed_losses']],
                                       [x for p in points for x in p['seed_losses']]),
        }
    base = out['variants'][baseline]['points']
    meaningful = all(s['compiled'] == 'on' or str(s['settings']['device']).startswith('cuda') for s in summaries)
    for v in variants:
        out['variants'][v]['multiplier'] = None if v == baseline else multiplier(base, out['variants'][v]['points'],
                                                                                  meaningful)
    return out


def multiplier(base, points, times_meaningful):
    """The effective compute multiplier of a variant per size and at EXTRAPOLATE x the largest compute
    (stats.compute_multiplier), and, where times mean something (compiled or on a GPU), the effective speedup:
    the multiplier times the variant's tokens/s over the baseline's."""
    done = lambda ps: [(p['flops'], p['seed_losses']) for p in ps]
    if any(None in p['seed_losses'] for p in base + points):  # a stopped seed: no loss to fit
        return None
    m = stats.compute_multiplier(done(base), done(points), EXTRAPOLATE * max(p['flops'] for p in base))
    if m is None:
        return None
    for p, b, mp in zip(points, base, m['per_size']):
        speed = p['tok_s'] / b['tok_s'] if p['tok_s'] and b['tok_s'] else None
        mp['speedup'] = mp['multiplier'] * speed if speed and mp['multiplier'] else None
    m['times'] = 'compiled or GPU' if times_meaningful else 'eager (CPU): the speedup is an eager one'
    return m


def seed_gaps(sv, sb):
    """The per-seed gaps L_v − L_baseline of one size (same seed, so same batches)."""
    base = {r['seed']: r['final_val_loss'] for r in sb['runs']}
    return [r['final_val_loss'] - base[r['seed']] for r in sv['runs']
            if r['final_val_loss'] is not None and base.get(r['seed']) is not None]


def fmt_gap(g):
    if g is None:
        return '–'
    return f"{g['mean']:+.4f}" + (f" [{g['ci'][0]:+.4f}, {g['ci'][1]:+.4f}]" if g.get('ci') else ' (no CI)')


def fmt_fit(f):
    if not f['identifiable']:
        return f"not identifiable ({f['why']})"
    return (f"E = {f['E']:.3f} ± {f['E_se']:.3f}, A = {f['A']:.3g} ± {f['A_se']:.2g}, "
            f"α = {f['alpha']:.3f} ± {f['alpha_se']:.3f}")


def fmt_matched(m):
    if not m:
        return '–'
    reach = (f"not reached ({m['reached']} of {m['seeds']})" if m['seconds_ratio'] is None else
             f"{m['seconds_ratio']:.2f}x s, {m['flops_ratio']:.2f}x FLOPs")
    return f'{reach}; {time_verdict(m)}'


def fmt_x(point):
    if point is None or point['multiplier'] is None:
        return '–'
    ci = point.get('ci')
    return f"{point['multiplier']:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and None not in ci else '')


def multiplier_section(lad):
    rows = [(v, lv['multiplier']) for v, lv in lad['variants'].items() if lv.get('multiplier')]
    if not rows:
        return ['', '## Effective compute multiplier', '', "Needs at least 4 sizes (a 3-parameter law for the "
                "baseline's loss against compute) and every seed finished."]
    sz = lad['sizes']
    return (['', '## Effective compute multiplier', '',
             f"The baseline's final loss against training compute is fitted as L(C) = E + A·C^(−α); a variant that reaches "
             f"loss L with compute C is worth C_{lad['baseline']}(L) / C: the compute {lad['baseline']} would need for that "
             f"loss, over what the variant used (> 1: worth more compute). Per size from the variant's mean loss, and at "
             f"{EXTRAPOLATE}x the largest size's compute from the variant's own fitted law. [95% interval: a bootstrap "
             f"over seeds widened to a t interval.] Speedup: the multiplier times the variant's tokens/s over the "
             f"baseline's, {rows[0][1]['times']}.", '',
             '| variant | ' + ' | '.join(s['name'] for s in sz) + f" | at {EXTRAPOLATE}x compute | speedup per size |",
             '|---|' + '---:|' * (len(sz) + 2)]
            + [f"| {v} | " + ' | '.join(fmt_x(p) for p in m['per_size']) + f" | {fmt_x(m['at_budget'])} | "
               + ', '.join('–' if p['speedup'] is None else f"{p['speedup']:.2f}x" for p in m['per_size']) + ' |'
               for v, m in rows])


def write_markdown(path, lad):
    base, sz = lad['baseline'], lad['sizes']
    head = '| variant | ' + ' | '.join(s['name'] for s in sz) + ' |'
    rule = '|---|' + '---:|' * len(sz)
    lines = [f"# FFN scaling ladder on {lad['dataset']}", '',
             f"{len(lad['variants'])} variants x {len(lad['seeds'])} seed(s) x {len(sz)} sizes. Token budget: "
             f"{lad['token_rule']}; learning rate: {lad['lr_rule']}"
             + (" (lr·d₀/d, d the width, d₀ the first size's)" if lad['lr_rule'] == 'width' else ' (the same for every size)')
             + ". Each size is an ordinary comparison in its own directory (its summary.md has the full table).", '',
             f'| size | n_layer | n_embd | n_head | iterations | tokens | learning rate | N (non-embedding, {base}) |',
             '|---|---:|---:|---:|---:|---:|---:|---:|']
    lines += [f"| {s['name']} | {s['n_layer']} | {s['n_embd']} | {s['n_head']} | {s['max_iters']} | {s['tokens']:,} | "
              f"{s['learning_rate']:.3g} | {fmt_count(lad['variants'][base]['points'][i]['N'])} |" for i, s in enumerate(sz)]
    lines += ['', '## Final validation loss (mean ± std over seeds)', '', head, rule]
    for v, lv in lad['variants'].items():
        cells = ['–' if p['final_val_loss'] is None else f"{p['final_val_loss']['mean']:.4f}" +
                 (f" ± {p['final_val_loss']['std']:.4f}" if p['final_val_loss']['std'] is not None else '')
                 for p in lv['points']]
        last = lv['points'][-1]
        active = f", {fmt_count(last['N_active'])} active" if last['N_active'] != last['N'] else ''  # an MoE
        lines.append(f"| {v} (N {fmt_count(last['N'])}{active} at {sz[-1]['name']}) | " + ' | '.join(cells) + ' |')
    lines += ['', f'## Gap to {base} and its trend with size', '',
              f"Gap Δ = L_variant − L_{base}, paired over seeds: mean [95% t interval]. Trend: the least-squares slope of "
              f"Δ against ln N over every seed's gap, with its 95% CI; 'grows' (Δ rises with N: the variant loses ground "
              f"to {base} as models grow), 'shrinks' (it gains ground), or 'flat within noise' (the CI covers 0). With "
              f"{BOOTSTRAP_MIN_SEEDS} or more seeds summary.json adds a percentile bootstrap CI of each gap.", '',
              head + ' trend: slope per ln N [95% CI] |', rule + ':---|']
    for v, lv in lad['variants'].items():
        if v != base:
            t = lv['trend']
            trend = '– (needs 2 sizes, 3 gaps)' if t is None else (
                f"**{t['verdict']}**: {t['slope_per_ln_n']:+.4f} [{t['ci'][0]:+.4f}, {t['ci'][1]:+.4f}]")
            lines.append(f"| {v} | " + ' | '.join(fmt_gap(p['gap']) for p in lv['points']) + f' | {trend} |')
    lines += ['', '## Power law L(N) = E + A·N^(−α) per variant', '',
              "Least-squares fit (scipy.optimize.curve_fit) to every seed's final loss, ± one standard error; only with "
              "at least 4 sizes (3 parameters).", '']
    lines += [f"- {v}: {fmt_fit(lv['fit'])}" for v, lv in lad['variants'].items()]
    lines += multiplier_section(lad)
    lines += ['', '## Compute- and time-matched, per size', '',
              f"Seconds (and FLOPs) to reach {base}'s final loss as a multiple of {base}'s, and which way the "
              f"time-matched comparison goes (see each size's summary.md).", '', head, rule]
    lines += [f'| {v} | ' + ' | '.join(fmt_matched(p['matched']) for p in lv['points']) + ' |'
              for v, lv in lad['variants'].items() if v != base]
    lines += ['', '![ladder](ladder.png)', '']
    write_text(path, '\n'.join(lines))
