"""A scaling ladder: the same comparison at several model sizes, and what the trend with size says. compare.py runs
each size as an ordinary comparison in <out_dir>/<n_layer>x<n_embd>/, reused like any: a new size extends a ladder."""
import math
import os
import sys

from comparison import stats
from comparison.runs import at_rate, meta_model
from machinery.cli import UserError, split_list
from machinery.files import write_text
from comparison.report import fmt, fmt_count, fmt_loss, seed_gaps, time_verdict

BOOTSTRAP_MIN_SEEDS = 5  # fewer values have too few distinct resamples for a percentile interval
EXTRAPOLATE = 10  # the compute multiplier is also given at this many times the largest size's compute
HEAD_SIZE = 32  # the head size n_head is chosen for when a size does not name it (kept within 16-64 and even)
MAX_ITERS = 10**8  # a budget past this is a mistake (a typo in --tokens_per_param), not a plan


def scale_counts(model):
    """The sizes a ladder is drawn against: N = non-embedding parameters (less the tied token embedding and any
    position embedding, Kaplan et al. 2020), total and active (an MoE), and the model's training FLOPs per token."""
    p = model.param_report()
    return {'non_embedding': p['total'] - p['embedding'], 'non_embedding_active': p['active'] - p['embedding'],
            'flops_per_token': model.flops_per_token()}


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


def size_settings(cfg, baseline):
    """Every size of --sizes with its settings, on top of the comparison's. Token budget: --max_iters at every size, or
    with --tokens_per_param=K, iterations = ceil(K·N / tokens per iteration), N the baseline's non-embedding parameters
    there (Hoffmann et al. 2022 find K ≈ 20 compute-optimal), warmup, decay and evaluation intervals scaled alike (the
    same schedule shape and number of evaluations). Learning rate: the same at every size (lr_rule=fixed), or lr·d₀/d,
    d the width, d₀ the first size's (lr_rule=width: muP's 1/width rule for hidden layers, Yang et al. 2022)."""
    if cfg['lr_rule'] not in ('fixed', 'width'):
        raise UserError(f"--lr_rule expects fixed or width, got '{cfg['lr_rule']}'.")
    if not 0 <= cfg['tokens_per_param'] < float('inf'):
        raise UserError(f"--tokens_per_param must be a finite number >= 0, got {cfg['tokens_per_param']}.")
    if cfg['tokens_per_param'] > 0 and cfg['max_iters'] < 1:
        raise UserError("--tokens_per_param scales the schedule of --max_iters; give --max_iters of at least 1.")
    out, all_sizes = [], sizes(cfg['sizes'])
    for size in all_sizes:
        s = dict(n_layer=size['n_layer'], n_embd=size['n_embd'], n_head=size['n_head'],
                 out_dir=os.path.join(cfg['out_dir'], size['name']))
        n_params = scale_counts(meta_model({**cfg, **s, 'ffn': baseline}, cfg['data_dir']))['non_embedding']
        if cfg['tokens_per_param'] > 0:
            # tokens per iteration, over all the run's processes (each DDP process trains on batches of its own)
            factors = [cfg[k] for k in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'nproc_per_run')]
            if min(factors) < 1:
                raise UserError(f"--batch_size, --block_size, --gradient_accumulation_steps and --nproc_per_run must "
                                f"each be at least 1, got {', '.join(map(str, factors))}.")
            per_iter = math.prod(factors)
            iters = cfg['tokens_per_param'] * n_params / per_iter
            if iters > MAX_ITERS:  # checked before rounding up: an overflowed budget is inf
                raise UserError(f"--tokens_per_param={cfg['tokens_per_param']:g} asks for {iters:.3g} iterations at "
                                f"size {size['name']}; give a budget of at most {MAX_ITERS:,} iterations.")
            iters = max(1, math.ceil(iters))
            f = iters / cfg['max_iters']
            s.update(max_iters=iters, warmup_iters=round(cfg['warmup_iters'] * f),
                     lr_decay_iters=round(cfg['lr_decay_iters'] * f), eval_interval=max(1, round(cfg['eval_interval'] * f)))
        if cfg['lr_rule'] == 'width':
            f = all_sizes[0]['n_embd'] / size['n_embd']
            s.update(at_rate(cfg, cfg['learning_rate'] * f))
            if cfg['lrs']:  # the listed rates scale with the learning_rate they must contain
                s['lrs'] = ','.join(repr(float(r) * f) for r in split_list(cfg['lrs']))
        print(f"compare: size {size['name']} (n_head {size['n_head']}, N = {n_params:,} non-embedding parameters, "
              f"{s.get('max_iters', cfg['max_iters'])} iterations, learning rate "
              f"{s.get('learning_rate', cfg['learning_rate']):.3g})", file=sys.stderr)
        out.append({**size, 'settings': s})
    return out


# ----------------------------------------------------------------------------------------------------------------------
# the ladder's summary


def summarize(cfg, sizes, summaries):
    """sizes: size_settings(cfg); summaries: report.summarize's, one per size. Per variant: its points (one per size),
    the gap's trend with ln N, the power law L(N) = E + A·N^(−α) and the effective compute multiplier. JSON-able."""
    first = summaries[0]
    variants, baseline = list(first['variants']), first['baseline']
    out = {'baseline': baseline, 'seeds': first['seeds'], 'dataset': first['dataset'],
           'token_rule': f"tokens_per_param={cfg['tokens_per_param']:g}" if cfg['tokens_per_param'] > 0
           else f"fixed max_iters={cfg['max_iters']}",
           'lr_rule': cfg['lr_rule'], 'sizes': [], 'variants': {}}
    for size, summ in zip(sizes, summaries):
        s = {**cfg, **size['settings']}  # the comparison's settings at this size
        out['sizes'].append({k: size[k] for k in ('name', 'n_layer', 'n_embd', 'n_head')} | {
            'max_iters': s['max_iters'], 'tokens': max(v['tokens'] for v in summ['variants'].values()),
            'learning_rate': s['learning_rate']})
    if not first.get('lr') and any(r != s['learning_rate'] for summ, s in zip(summaries, out['sizes'])
                                   for r in summ['rates'].values()):  # variants at rates of their own
        out['rates'] = {v: [summ['rates'][v] for summ in summaries] for v in variants}
    points = {v: [point(size, summ, v) for size, summ in zip(sizes, summaries)] for v in variants}
    meaningful = all(s['compiled'] == 'on' or on_gpu(s) for s in summaries)
    for v, ps in points.items():
        out['variants'][v] = {
            'points': ps,
            'trend': stats.gap_trend([math.log(p['N']) for p in ps for _ in p['seed_gaps']],
                                     [g for p in ps for g in p['seed_gaps']]) if v != baseline else None,
            'fit': stats.power_law_fit([p['N'] for p in ps for _ in p['seed_losses']],
                                       [x for p in ps for x in p['seed_losses']]),
            'multiplier': multiplier(points[baseline], ps, meaningful) if v != baseline else None,
        }
    return out


def point(size, summ, v):
    """Variant v at one size, from that size's summary (in a sweep: at v's best rate, on windows the choice skipped)."""
    sv = summ['variants'][v]
    gaps = seed_gaps(sv['runs'], summ['variants'][summ['baseline']]['runs'])
    return {'size': size['name'], 'N': sv['scale']['non_embedding'], 'n_embd': size['n_embd'],
            'best_lr': summ['lr'][v]['best'] if summ.get('lr') else None, 'tok_s': sv['tok_s'],
            'N_active': sv['scale']['non_embedding_active'], 'flops': sv['scale']['flops_per_token'] * sv['tokens'],
            'final_val_loss': sv['final_val_loss'], 'seed_losses': [r['final_val_loss'] for r in sv['runs']],
            'gap': sv['diff_to_baseline'], 'seed_gaps': gaps,
            'gap_bootstrap_ci': stats.bootstrap_ci(gaps) if len(gaps) >= BOOTSTRAP_MIN_SEEDS else None,
            'matched': sv['matched']}


def on_gpu(summary):
    """Whether a size's runs all ran on a GPU, as their logs name the device ('cpu x86_64', 'mps arm', or the GPU's
    name): --device=auto says nothing of it."""
    return bool(summary.get('ran_on')) and not any(e['device'].startswith(('cpu ', 'mps ')) for e in summary['ran_on'])


def multiplier(base, points, times_meaningful):
    """The effective compute multiplier of a variant per size and at EXTRAPOLATE x the largest compute (stats), and the
    effective speedup: the multiplier times the variant's tokens/s over the baseline's (eager unless compiled/GPU)."""
    if any(None in p['seed_losses'] for p in base + points):  # a diverged seed: no loss to fit
        return None
    done = lambda ps: [(p['flops'], p['seed_losses']) for p in ps]
    m = stats.compute_multiplier(done(base), done(points), EXTRAPOLATE * max(p['flops'] for p in base))
    if m is None:
        return None
    for p, b, mp in zip(points, base, m['per_size']):
        speed = p['tok_s'] / b['tok_s'] if p['tok_s'] and b['tok_s'] else None
        mp['speedup'] = mp['multiplier'] * speed if speed and mp['multiplier'] else None
    m['times'] = 'compiled or GPU' if times_meaningful else 'eager (CPU): the speedup is an eager one'
    return m


def multiplier_section(lad):
    rows = [(v, lv['multiplier']) for v, lv in lad['variants'].items() if lv.get('multiplier')]
    if not rows:
        return ['', '## Effective compute multiplier', '', "Needs at least 4 sizes (a 3-parameter law for the "
                "baseline's loss against compute) and every seed finished."]
    base, sz = lad['baseline'], lad['sizes']
    x = lambda p: fmt(p['multiplier'], '.2f', 'x', p.get('ci'))
    return (['', '## Effective compute multiplier', '',
             f"{base}'s final loss against training compute is fitted as L(C) = E + A·C^(−α); a variant reaching loss "
             f"L with compute C is worth C_{base}(L) / C (> 1: worth more compute): per size with L the law's value "
             f"at {base}'s compute there plus the paired gap (so the law's miss of {base}'s mean cancels), at "
             f"{EXTRAPOLATE}x the largest size's compute from its own fitted law. [95% interval: per size, the "
             f"paired gap's t interval through the law; at {EXTRAPOLATE}x, a bootstrap over seeds widened to a t "
             f"interval.] Speedup: the multiplier x the tokens/s ratio, {rows[0][1]['times']}.",
             '',
             '| variant | ' + ' | '.join(s['name'] for s in sz) + f" | at {EXTRAPOLATE}x compute | speedup per size |",
             '|---|' + '---:|' * (len(sz) + 2)]
            + [f"| {v} | " + ' | '.join(map(x, m['per_size'])) + f" | {x(m['at_budget'])} | "
               + ', '.join(fmt(p['speedup'], '.2f', 'x') for p in m['per_size']) + ' |' for v, m in rows])


def write_markdown(path, lad):
    base, sz = lad['baseline'], lad['sizes']
    head, rule = '| variant | ' + ' | '.join(s['name'] for s in sz) + ' |', '|---|' + '---:|' * len(sz)
    lines = [f"# FFN scaling ladder on {lad['dataset']}", '',
             f"{len(lad['variants'])} variants x {len(lad['seeds'])} seed(s) x {len(sz)} sizes. Token budget: "
             f"{lad['token_rule']}; learning rate: {lad['lr_rule']}"
             + (" (lr·d₀/d, d the width, d₀ the first size's)" if lad['lr_rule'] == 'width' else ' (the same for every size)')
             + ". Each size is an ordinary comparison in its own directory (its summary.md has the full table).", '',
             f'| size | n_layer | n_embd | n_head | iterations | tokens | learning rate | N (non-embedding, {base}) |',
             '|---|---:|---:|---:|---:|---:|---:|---:|']
    lines += [f"| {s['name']} | {s['n_layer']} | {s['n_embd']} | {s['n_head']} | {s['max_iters']} | {s['tokens']:,} | "
              f"{s['learning_rate']:.3g} | {fmt_count(p['N'])} |" for s, p in zip(sz, lad['variants'][base]['points'])]
    lines += ['', '## Final validation loss (mean ± std over seeds)', '', head, rule]
    n = lambda p: fmt_count(p['N']) + (f", {fmt_count(p['N_active'])} active" if p['N_active'] != p['N'] else '')  # MoE
    for v, lv in lad['variants'].items():
        cells = ' | '.join(fmt_loss(p['final_val_loss']) for p in lv['points'])
        lines.append(f"| {v} (N {n(lv['points'][-1])} at {sz[-1]['name']}) | {cells} |")
    if lad['variants'][base]['points'][0]['best_lr'] is not None:  # a sweep: the rate each point is at
        lines += ['', "## Best learning rate (chosen on the first half of the validation windows)", '',
                  "The grid at each size is centred on the learning rate above, widened where a best was at its edge.",
                  '', head, rule]
        lines += [f"| {v} | " + ' | '.join(f"{p['best_lr']:.3g}" for p in lv['points']) + ' |'
                  for v, lv in lad['variants'].items()]
    if lad.get('rates'):
        lines += ['', '## Learning rate of each variant', '', "Where a variant runs at a rate of its own, not the "
                  "learning rate above.", '', head, rule]
        lines += [f"| {v} | " + ' | '.join(f"{r:.3g}" for r in rates) + ' |' for v, rates in lad['rates'].items()]
    lines += ['', f'## Gap to {base} and its trend with size', '',
              f"Gap Δ = L_variant − L_{base}, paired over seeds: mean [95% t interval]. Trend: the least-squares slope "
              f"of Δ against ln N, through each size's mean Δ (with 2 sizes, every seed's) [95% CI]: 'rises' (the "
              f"variant loses ground to {base} as models grow), 'falls' (it gains), or 'flat within noise'. "
              f"{BOOTSTRAP_MIN_SEEDS}+ seeds: summary.json adds a bootstrap CI.", '',
              head + ' trend: slope per ln N [95% CI] |', rule + ':---|']
    gap = lambda g: '–' if g is None else fmt(g['mean'], '+.4f', ci=g.get('ci')) + ('' if g.get('ci') else ' (no CI)')
    trend = lambda t: '– (needs 2+ sizes and 3+ gaps in all, e.g. 2 sizes x 2 seeds)' if t is None else (
        f"**{t['verdict']}**: " + fmt(t['slope_per_ln_n'], '+.4f', ci=t['ci']))
    lines += [f"| {v} | " + ' | '.join(gap(p['gap']) for p in lv['points']) + f" | {trend(lv['trend'])} |"
              for v, lv in lad['variants'].items() if v != base]
    lines += ['', '## Power law L(N) = E + A·N^(−α) per variant', '',
              "A least-squares fit to every seed's final loss, ± one standard error; only with 4+ sizes. Where E lands "
              "on its bound 0 (no irreducible loss shows at these sizes), A's and α's errors are those of A·N^(−α), "
              "Kaplan et al. 2020's law, given E = 0.", '']
    e = lambda f: f"E = {f['E']:.3f} ± {f['E_se']:.3f}" if f['E_se'] is not None else "E = 0 (at its bound)"
    fit = lambda f: (f"{e(f)}, A = {f['A']:.3g} ± {f['A_se']:.2g}, α = {f['alpha']:.3f} ± {f['alpha_se']:.3f}"
                     if f['identifiable'] else f"not identifiable ({f['why']})")
    lines += [f"- {v}: {fit(lv['fit'])}" for v, lv in lad['variants'].items()] + multiplier_section(lad)
    lines += ['', '## Compute- and time-matched, per size', '',
              f"Seconds (and FLOPs) to reach {base}'s final loss as a multiple of {base}'s, and which way the "
              f"time-matched comparison goes (see each size's summary.md).", '', head, rule]
    reached = lambda m: (f"not reached ({m['reached']} of {m['seeds']})" if m['seconds_ratio'] is None else
                         f"{m['seconds_ratio']:.2f}x s, {m['flops_ratio']:.2f}x FLOPs")
    matched = lambda m: f'{reached(m)}; {time_verdict(m)}' if m else '–'
    lines += [f'| {v} | ' + ' | '.join(matched(p['matched']) for p in lv['points']) + ' |'
              for v, lv in lad['variants'].items() if v != base]
    lines += ['', '![ladder](ladder.png)', '']
    write_text(path, '\n'.join(lines))
