"""The report of one comparison: a function of its runs (runs.Run values, as compare.py read them) and their
models' shapes, so the same runs always give the same summary.json, summary.md and printed table."""
import math
import os
import statistics

from comparison import stats
from machinery.files import write_text
from machinery.run_log import LOG


WHOLE = lambda r: r.get('val_loss')  # an evaluation scored on every validation window (None: a record without it)


def run_metrics(run, loss_of):
    """Per-run numbers from its log records. loss_of: the validation loss an evaluation line is scored by."""
    log = run.records
    evals = [r for r in log if 'val_loss' in r]
    trains = [r for r in log if 'loss' in r and 'tokens' in r]
    # training time: each train line's ms is the mean step time since the previous line (evaluation excluded)
    t, prev_iter, times = 0.0, 0, {}
    for r in log:
        if 'ms' in r:
            t += r['ms'] / 1000.0 * (r['iter'] - prev_iter)
        prev_iter = r['iter']
        times[r['iter']] = t
    tok_s = [r['tok_s'] for r in trains if r.get('tok_s')]
    last = log[-1] if log else {}
    return {'iters': last.get('iter', 0), 'tokens': last.get('tokens', 0),
            'final_val_loss': run.final(loss_of),  # None unless done: a diverged run has no final evaluation
            'final_train_loss': trains[-1]['loss'] if trains else None, 'train_time_s': t,
            'tok_s': statistics.median(tok_s) if tok_s else None,  # steady state: the median over log lines
            'batch_hash': last.get('batch_hash'),
            'val_hash': next((r['val_hash'] for r in reversed(evals) if 'val_hash' in r), None),
            'act': next((r['act'] for r in reversed(log) if r.get('act')), None),
            'curve': {'val': [[r['iter'], r['tokens'], times[r['iter']], loss_of(r)] for r in evals
                              if 'tokens' in r and loss_of(r) is not None],
                      'train': [[r['iter'], r['tokens'], r['loss']] for r in trains]}}


def mean_std(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return {'mean': statistics.fmean(values), 'std': statistics.stdev(values) if len(values) > 1 else None,
            'min': min(values), 'max': max(values), 'n': len(values)} if values else None


def mean_over_seeds(values):
    """The mean of what the activations learned (the logs' `act` records, one per seed), key by key: each key every
    seed has in the same shape (a quantity is a number or named numbers, and damaged logs may disagree)."""
    if isinstance(values[0], dict):
        same = lambda k: all(k in v and isinstance(v[k], dict) == isinstance(values[0][k], dict) for v in values)
        return {k: mean_over_seeds([v[k] for v in values]) for k in values[0] if same(k)}
    if isinstance(values[0], list):
        return [mean_over_seeds(list(per_seed)) for per_seed in zip(*values)]
    return statistics.fmean(values)


def summarize(head, runs, shapes, loss_of=WHOLE):
    """The comparison's summary (JSON-able) and the per-run metrics by variant (for the pictures). head: baseline,
    seeds, variants, dataset and the settings shown, and without a sweep each variant's rate and the line on those
    that run untuned; shapes: per variant its model's param_report and scale_counts. loss_of: how an evaluation is
    scored (WHOLE, or a half of the windows)."""
    by_variant, damaged, baseline = {}, {}, head['baseline']
    for run in runs:
        if run.damaged:
            damaged[os.path.join(run.dir, LOG)] = len(run.damaged)
        m = {'seed': run.seed, 'dir': run.dir, 'status': run.state, **run_metrics(run, loss_of)}
        by_variant.setdefault(run.variant, []).append(m)
    # the times depend on whether the runs were compiled and how many trained side by side
    compiled = {(r.checkpoint or {}).get('compiled') for r in runs} - {None}  # None: no checkpoint to say
    at_once = {r.intent.get('at_once') for r in runs}
    out = {'baseline': baseline, 'seeds': head['seeds'], 'dataset': head['dataset'],
           'compiled': 'mixed' if len(compiled) > 1 else 'on' if compiled == {True} else 'off',
           'at_once': at_once.pop() if len(at_once) == 1 else 'mixed', 'settings': head['settings'],
           'damaged_lines': damaged, 'variants': {}, 'scored_on': 'report half' if loss_of is REPORT_HALF else 'all',
           **{k: head[k] for k in ('rates', 'untuned', 'untuned_note') if k in head}}
    for v in head['variants']:
        ms, scale = by_variant[v], shapes[v]['scale']
        done = [m for m in ms if m['status'] == 'done']
        out['variants'][v] = {
            'params': shapes[v]['params'], 'scale': scale,
            'status': 'done' if len(done) == len(ms) else 'diverged',
            'final_val_loss': mean_std([m['final_val_loss'] for m in ms]),
            'diff_to_baseline': stats.paired(seed_gaps(ms, by_variant[baseline])) if v != baseline else None,
            'tok_s': statistics.fmean(m['tok_s'] for m in ms if m['tok_s']) if any(m['tok_s'] for m in ms) else None,
            # over the finished runs (a diverged run's partial time is not a run's time), or all where none finished
            'train_time_s': statistics.fmean(m['train_time_s'] for m in (done or ms)),
            'tokens': max(m['tokens'] for m in ms),
            'learned': mean_over_seeds(acts) if (acts := [m['act'] for m in ms if m['act']]) else None,
            'runs': [{k: x for k, x in m.items() if k != 'curve'} for m in ms],
            'matched': matched(ms, by_variant[baseline], scale, shapes[baseline]['scale']) if v != baseline else None,
        }
    # every pair, row minus column, paired by seed: what a claim between two variants that are not the baseline reads
    out['pairs'] = {a: {b: stats.paired(seed_gaps(by_variant[a], by_variant[b])) for b in head['variants'] if b != a}
                    for a in head['variants']}
    # seed noise, pooled over variants (the root mean square of their stds)
    for key, name in (('final_val_loss', 'seed_std'), ('diff_to_baseline', 'paired_diff_std')):
        var = [s[key]['std'] ** 2 for s in out['variants'].values() if s[key] and s[key]['std'] is not None]
        out[name] = math.sqrt(statistics.fmean(var)) if var else None
    out['same_batches'] = {str(s): len({m['batch_hash'] for v in head['variants'] for m in by_variant[v]
                                        if m['seed'] == s and m['status'] == 'done'}) <= 1 for s in head['seeds']}
    val_hashes = {m['val_hash'] for v in head['variants'] for m in by_variant[v]}
    out['same_val_windows'] = (len(val_hashes) == 1) if None not in val_hashes else None
    return out, by_variant


def seed_gaps(runs, base_runs):
    """Per seed: a run's final validation loss minus the baseline's (the same seed, so the same batches). None at all
    where a seed of either diverged: the seeds that survived would flatter it (a diverged seed is a failure, as in the
    choice of a rate, not a seed to skip)."""
    if any(r['final_val_loss'] is None for r in runs + base_runs):
        return []
    base = {r['seed']: r['final_val_loss'] for r in base_runs}
    return [r['final_val_loss'] - base[r['seed']] for r in runs if r['seed'] in base]


def matched(runs, base_runs, scale, base_scale):
    """Compute- and time-matched verdicts, seed by seed: the tokens, FLOPs and seconds a variant needs to reach the
    baseline's final loss over what the baseline first needed, and its loss at the baseline's last second minus that."""
    if any(m['status'] != 'done' for m in runs + base_runs):  # a diverged seed: no verdict, as in seed_gaps
        return None
    base = {m['seed']: m for m in base_runs if m['curve']['val']}
    pairs = [(m, base[m['seed']]) for m in runs if m['seed'] in base and m['curve']['val']]
    if not pairs:
        return None
    ratios, at_budget = {'tokens': [], 'flops': [], 'seconds': []}, []
    # None where the baseline was there before it trained (a run of 0 iterations): no ratio to take
    ratio = lambda x, b: x / b if b > 0 else None
    for m, b in pairs:
        _, b_toks, b_secs, b_loss = zip(*b['curve']['val'])
        _, tok, sec, loss = zip(*m['curve']['val'])
        target = b_loss[-1]
        at_budget.append(stats.loss_at(sec, loss, b_secs[-1]) - target)
        t_reach, s_reach = stats.reach(tok, loss, target), stats.reach(sec, loss, target)
        if t_reach is None:
            continue
        b_tok, b_sec = stats.reach(b_toks, b_loss, target), stats.reach(b_secs, b_loss, target)
        ratios['tokens'].append(ratio(t_reach, b_tok))
        ratios['flops'].append(ratio(t_reach * scale['flops_per_token'], b_tok * base_scale['flops_per_token']))
        ratios['seconds'].append(ratio(s_reach, b_sec))
    mean = lambda xs: statistics.fmean(xs) if xs and None not in xs and len(xs) == len(pairs) else None
    return {'seeds': len(pairs), 'reached': len(ratios['tokens']),
            **{f'{k}_ratio': mean(xs) for k, xs in ratios.items()}, 'loss_at_base_time': stats.paired(at_budget)}


# ----------------------------------------------------------------------------------------------------------------------
# a learning-rate sweep (compare.py --lrs or --lr_grid): each variant's rate is chosen on the sweep's seeds and the
# first half of the validation windows (train.py logs both halves, `val_halves`); its report reads only the second
# half, which the choice never reads, and measures the verdict at the chosen rates on fresh seeds. A record without
# its halves is no evaluation on them: a run whose last evaluation lacks them has no result there
SELECT_HALF = lambda r: (r.get('val_halves') or (None, None))[0]
REPORT_HALF = lambda r: (r.get('val_halves') or (None, None))[1]


def summarize_sweep(head, runs, fresh, shapes, chosen, shared_lr):
    """The comparison at each variant's own best rate (chosen: per variant, stats.choose_rate's answer), measured on
    the fresh seeds' runs (head['seeds']) alone; at the shared rate on the sweep's runs; and per variant what the sweep
    found: its report half's loss at every rate, the choice, and how sensitive the loss is to it. All on the report
    half."""
    sweep_seeds = sorted({r.seed for r in runs})
    summary, by_variant = summarize(head, fresh, shapes, REPORT_HALF)
    shared, _ = summarize({**head, 'seeds': sweep_seeds}, [r for r in runs if r.lr == shared_lr], shapes, REPORT_HALF)
    summary['sweep_seeds'] = sweep_seeds  # the seeds that chose the rates; summary['seeds'] measured the verdict
    summary['shared'] = {v: {k: s[k] for k in ('final_val_loss', 'diff_to_baseline', 'status')}
                         for v, s in shared['variants'].items()}
    summary['lr'] = {}
    for v in head['variants']:
        mine = [r for r in runs if r.variant == v]
        rates, best = sorted({r.lr for r in mine}), chosen[v]['best']
        reported = {lr: [r.final(REPORT_HALF) for r in mine if r.lr == lr] for lr in rates}
        # a rate where a seed diverged is a failure there, as in the choice: no mean of the seeds that survived
        loss = {lr: None if None in reported[lr] else mean_std(reported[lr]) for lr in rates}
        near = lambda f: next((loss[r]['mean'] - loss[best]['mean'] for r in rates if math.isclose(r, f * best)
                               and loss[r] and loss[best]), None)
        summary['lr'][v] = {'rates': rates, 'best': best, 'lowest': chosen[v]['lowest'], 'edge': chosen[v]['edge'],
                            'margin': chosen[v]['margin'], 'select_mean': chosen[v]['mean'],
                            'select_se': chosen[v]['se'], 'report': {repr(r): loss[r] for r in rates},
                            'sensitivity': {'half': near(0.5), 'double': near(2)}}
    summary['shared_lr'], summary['tuned_at'] = shared_lr, head.get('tuned_at')
    return summary, by_variant


# ----------------------------------------------------------------------------------------------------------------------
# summary.md and the printed table


def fmt_count(n):
    return f'{n / 1e6:.2f}M' if n >= 1e6 else f'{n / 1e3:.1f}k' if n >= 1e3 else str(n)


def fmt(x, spec, unit='', ci=None):
    """x in the format `spec` (and its unit), then its interval [lo, hi] where it has one; – for no x."""
    if x is None:
        return '–'
    return f'{x:{spec}}{unit}' + (f' [{ci[0]:{spec}}, {ci[1]:{spec}}]' if ci and None not in ci else '')


def fmt_loss(x, signed=False):
    """A loss (signed: a difference of losses) to 4 decimals; a mean_std or stats.paired dict as mean ± std; None: –."""
    spec = '+.4f' if signed else '.4f'
    if isinstance(x, dict):
        return fmt(x['mean'], spec) + (f" ± {x['std']:.4f}" if x['std'] is not None else '')
    return fmt(x, spec)


def times_note(summary):
    """What the times and tok/s are: eager or compiled, and how many runs trained side by side."""
    kind = {'on': 'compiled', 'off': 'eager', 'mixed': 'some runs compiled and some eager, so they do not compare'}
    at_once = summary['at_once']
    beside = (f", {at_once} runs at a time" if isinstance(at_once, int) and at_once > 1 else
              ", with different (or unrecorded) numbers of runs at a time" if at_once == 'mixed' else '')
    return f"{kind[summary['compiled']]} times{beside}"


def fmt_rate(r):
    """A learning rate as a config file writes it, to 3 significant digits: 8e-3, 1.6e-2."""
    mantissa, exponent = f'{r:.2e}'.split('e')
    return f"{float(mantissa):g}e{int(exponent)}" if r else '0'


def table(summary):
    base = summary['baseline']
    # each variant's rate: a sweep's chosen one, or its own (tuned, or the shared rate where it has none), shown
    # unless every run is at the shared learning_rate the settings name
    shared = {summary['settings'].get('learning_rate')}
    rate = ({v: fmt_rate(x['best']) for v, x in summary['lr'].items()} if summary.get('lr') else
            {v: fmt_rate(r) for v, r in summary['rates'].items()} if set(summary.get('rates', {}).values()) - shared
            else None)
    rows = [f"| variant |{' lr |' if rate else ''} params | FFN | extras per model | final val loss (mean ± std) | "
            f"Δ vs {base} (± std) | resolved? | tok/s | train time |",
            '|---|' + '---:|' * bool(rate) + '---:|---:|---:|---:|---:|:---:|---:|---:|']
    for v, s in summary['variants'].items():
        p, d = s['params'], s['diff_to_baseline']
        val = fmt_loss(s['final_val_loss']) + ('' if s['status'] == 'done' else ' (diverged)')
        diff = 'baseline' if v == base else fmt_loss(d, signed=True)
        res = '' if v == base else '– (a seed diverged)' if d is None else 'no (1 seed)' if d['n'] < 2 else (
            f"{'yes' if d['resolved'] else 'no'}" + (f" (t={d['t']:.1f})" if d['t'] is not None else ''))
        total = fmt_count(p['total']) + (f" ({fmt_count(p['active'])} active)" if p['active'] != p['total'] else '')
        tok_s = fmt(s['tok_s'], ',.0f')
        name = f"{v} | {rate[v]}" + ' (untuned)' * (v in summary.get('untuned', [])) if rate else v
        rows.append(f"| {name} | {total} | {fmt_count(p['ffn'])} | {p['extras']:,} | {val} | {diff} | {res} | {tok_s} | "
                    f"{s['train_time_s']:.1f} s |")
    return '\n'.join(rows)


def tuned_lines(summary):
    """A sweep's chosen rates as the lines a config file takes: the same comparison, run at them without the sweep."""
    rates = ','.join(f"{v}@{fmt_rate(x['best'])}" for v, x in summary['lr'].items())
    return f"tuned_lrs = '{rates}'\ntuned_at = '{summary['tuned_at']}'"


def lr_section(summary):
    base, shared = summary['baseline'], summary['shared']
    rows = []
    for v, x in summary['lr'].items():
        best = f"**{fmt_rate(x['best'])}**" + (f" ({x['edge']} edge)" if x['edge'] else '')
        margin = fmt(x['margin'], '+.1f', ' SE') + (f" (lowest mean: {fmt_rate(x['lowest'])})"
                                                    if x['lowest'] != x['best'] else '')
        half, double = (fmt_loss(x['sensitivity'][k], signed=True) for k in ('half', 'double'))
        diff = 'baseline' if v == base else fmt_loss(shared[v]['diff_to_baseline'], signed=True)
        rates = ', '.join(fmt_rate(r) + '†' * (x['report'][repr(r)] is None) for r in x['rates'])
        at_shared = fmt_loss(shared[v]['final_val_loss']) + ('' if shared[v]['status'] == 'done' else ' (diverged)')
        rows.append(f"| {v} | {rates} | {best} | {margin} | {half} | {double} | {at_shared} | {diff} |")
    failed = any(None in x['report'].values() for x in summary['lr'].values())
    return ['## Learning rates', '',
            f"Best: the rate chosen by the one-standard-error rule on the sweep's seeds "
            f"({', '.join(map(str, summary['sweep_seeds']))}) and the first half of the validation windows: from the "
            "rate of lowest mean, step down to each smaller rate while its mean is within one standard error of that "
            "lowest mean (rates within the noise are tied, and the tie goes to the smaller, more stable one). Margin: "
            "the next best rate's mean minus the chosen one's, in those standard errors (−1 to 0: it won a tie). "
            "Every loss here is on the "
            "second half of the windows, which the choice never reads, and the table above is measured at the best "
            "rate on fresh seeds, so the seed luck that made a rate win is not in it. min_lr keeps its ratio to the "
            "rate. Edge: the choice is the smallest rate tried, or the lowest mean the largest (--lr_extend=True tries "
            f"beyond). ½x, 2x: the loss there minus at the best. Shared: all at {fmt_rate(summary['shared_lr'])}, as "
            "without a sweep."
            + (" †: a seed diverged at that rate, a failure there (no loss)." if failed else ''), '',
            '![loss against learning rate](lr.png)', '',
            f'| variant | rates tried | best | margin | ½x best | 2x best | at the shared rate | Δ vs {base} at the '
            'shared rate |', '|---|---|---|---|---:|---:|---:|---:|'] + rows + ['',
            'The same comparison at these rates, without the sweep: these two lines in its config file (tuned_at: the '
            'settings they were tuned at, checked against the comparison\'s own).', '', '```python',
            tuned_lines(summary), '```', '']


def time_verdict(m):
    """Which way matched()'s loss_at_base_time goes: resolved by its paired t-test, else a tie within noise."""
    d = m and m['loss_at_base_time']
    if not d:
        return '–'
    if d['n'] < 2:
        return ('ahead' if d['mean'] < 0 else 'behind') + ' (1 seed, untested)'
    return 'tie within noise' if not d['resolved'] else 'wins on time' if d['mean'] < 0 else 'loses on time'


def matched_section(summary):
    base = summary['baseline']
    ratio = lambda x: fmt(x, '.2f', 'x')
    rows = [f"| {v} | {m['reached']} of {m['seeds']} | {ratio(m['tokens_ratio'])} | {ratio(m['flops_ratio'])} | "
            f"{ratio(m['seconds_ratio'])} | {fmt_loss(m['loss_at_base_time'], signed=True)} | {time_verdict(m)} |"
            for v, s in summary['variants'].items() if v != base and (m := s.get('matched'))]
    if not rows:
        return []
    return ['## Compute- and time-matched', '',
            f"Target: {base}'s final validation loss, seed by seed. Reached: in how many seeds the variant gets there; "
            f"tokens, FLOPs, seconds: what that takes over what {base} took (mean over seeds, if all got there). At "
            f"{base}'s time: the variant's loss when {base}'s training time ran out, minus {base}'s final (paired "
            f"t-test). Seconds: {times_note(summary)}.", '',
            f'| variant | reached | tokens | FLOPs | seconds | loss at {base}\'s time − {base} | on time |',
            '|---|:---:|---:|---:|---:|---:|:---:|'] + rows + ['']


def holm_note(tests, family):
    """tests: {name: a stats.paired result or None}. One sentence: which of the resolved verdicts Holm's correction
    keeps over the family (a test at 95% on its own calls about 1 in 20 of the differences that are not there
    resolved); '' for a family of fewer than 2 tests, or none resolved."""
    names = [n for n, d in tests.items() if d and d['p'] is not None]
    resolved = [n for n in names if tests[n]['resolved']]
    if len(names) < 2 or not resolved:
        return ''
    kept = [n for n, p in zip(names, stats.holm([tests[n]['p'] for n in names])) if p < 1 - stats.CONFIDENCE]
    return (f"Each test is at 95% on its own; over the {len(names)} {family}, Holm's correction (Holm 1979) keeps "
            f"{len(kept)} of the {len(resolved)} resolved" + (': ' * bool(kept)) + ', '.join(kept) + '.')


def pairs_section(summary):
    """Every pair of variants, row minus column, paired by seed; bold where the paired t-test resolves it."""
    names = list(summary['pairs'])
    if len(names) < 3:  # two variants: the main table says it
        return []
    cell = lambda d: '–' if d is None else (f"**{d['mean']:+.4f}**" if d['resolved'] else f"{d['mean']:+.4f}")
    return ['## Every pair', '',
            "Δ = the row's final val loss minus the column's, paired by seed (mean over seeds); bold: resolved by a "
            "paired t-test at 95%. summary.json has each pair's std, t and interval. " + holm_note(
                {f'{a} − {b}': summary['pairs'][a][b] for i, a in enumerate(names) for b in names[i + 1:]},
                'pairs'), '',  # 3+ variants: 3+ pairs
            '| row − column | ' + ' | '.join(names) + ' |', '|---|' + '---:|' * len(names)] + [
            f"| {a} | " + ' | '.join('' if a == b else cell(summary['pairs'][a][b]) for b in names) + ' |'
            for a in names] + ['']


def learned_section(summary):
    """Per variant and layer, every quantity each part of the layer reported about itself (model.GPT.learned)."""
    # a quantity is a number, or named numbers (e.g. an LA/MoA dictionary's entries)
    number = lambda x: ', '.join(f'{k} {y:.3f}' for k, y in x.items()) if isinstance(x, dict) else f'{x:.3f}'
    part = lambda name, quantities: f"{name}: " + '; '.join(f'{q} = {number(x)}' for q, x in quantities.items())
    lines = []
    for v, s in summary['variants'].items():
        if not s['learned']:
            continue
        n = len([r for r in s['runs'] if r['act']])
        lines += [f"**{v}** (mean over {n} seed{'s' if n > 1 else ''}):", '']
        lines += [f"- layer {i}: " + ' | '.join(part(*p) for p in layer.items())
                  for i, layer in enumerate(s['learned']['layers']) if layer] + ['']
    if not lines:
        return []
    return ['## What the learnable activations learned', '',
            "At each run's last evaluation, averaged over seeds: per layer `act` is the activation (a GLU's gate "
            "branch), `act_up` a GLU's up branch, `moe` the expert load on the first validation batch.", ''] + lines


def acts_section(summary):
    """acts.png, and per learnable variant and layer how far the function moved from its init (acts.py)."""
    acts = {v: a for v, a in (summary.get('acts') or {}).items() if a is not None}
    if not acts:
        return []
    moved = lambda name, b: f"{name} {b['moved']:.3f}" + (
        f" ({b['moved'] / b['init_rms']:.0%})" if b['init_rms'] > 0 else '')  # and relative to the init's rms
    rows = []
    for v, a in acts.items():
        cells = [f'layer {i} ' + ', '.join(moved(name, b) for name, b in layer.items() if b['learnable'])
                 for i, layer in enumerate(a['layers']) if any(b['learnable'] for b in layer.values())]
        if cells:
            rows.append(f"- **{v}**: " + '; '.join(cells))
    lines = ['## What the activation functions became', '', "![learned activation functions](acts.png)", '',
             "Per variant (its first seed) and layer: the learned φ(h) (solid; median and 10-90% band where φ depends "
             "on the token) and its init (dashed), over the histogram of the first validation batch's pre-activations "
             "h (inspect_run.py --out_dir=RUN draws one run in full).", '']
    if rows:
        lines += ["Moved from init: sqrt(Σ_b w_b (φ_learned(h_b) − φ_init(h_b))²) over the histogram's bins, w_b a "
                  "bin's share of h; in brackets, relative to the init's rms. 0 = unchanged.", ''] + rows + ['']
    return lines


def damaged_note(summary):
    return "damaged log lines set aside (not JSON records as train.py writes them): " + ', '.join(
        f"{n} in {path}" for path, n in summary['damaged_lines'].items())


def write_markdown(path, summary):
    tokens = max(s['tokens'] for s in summary['variants'].values())  # a diverged run logged fewer
    same = all(summary['same_batches'].values()) and summary['same_val_windows']
    lines = [f"# FFN comparison on {summary['dataset']}", '',
             f"{len(summary['variants'])} variants x {len(summary['seeds'])} seed(s) "
             f"({', '.join(map(str, summary['seeds']))}), {tokens:,} training tokens per run."
             + (f" Each variant at its own best learning rate, chosen on the sweep's seeds "
                f"({', '.join(map(str, summary['sweep_seeds']))}) and measured on these fresh ones (see Learning "
                f"rates)." if summary.get('lr') else '')
             + (" Each variant at its own learning rate (lr), scored on the second half of the validation windows, "
                "the half a sweep never chooses on." if summary.get('scored_on') == 'report half' and not summary.get('lr')
                else '')
             + (f" Untuned: {summary['untuned_note']}" if summary.get('untuned_note') else '')
             + (" Logs: the same batches per seed (batch_hash), the same validation windows (val_hash)." if same else ''),
             '', 'Settings: ' + ', '.join(f'{k}={v}' for k, v in summary['settings'].items()), '',
             'Ran on: ' + ('; '.join(', '.join(f'{k} {v}' for k, v in e.items() if v is not None)
                                     for e in summary.get('ran_on', [])) or 'not recorded')
             + ('' if not any('code' in e for e in summary.get('ran_on', [])) else
                ' (code: a fingerprint of activations.py and model.py, comments and docstrings aside).'),
             '', table(summary), '',
             f"Final val loss: the last evaluation's. Δ: the difference to {summary['baseline']}, paired by seed (same "
             f"batches); resolved: a paired t-test at 95% (Student's t, n−1 dof). tok/s: each run's median over its "
             f"log lines, averaged over seeds; train time: optimizer steps only, {times_note(summary)}. params: total "
             f"(tied embedding once)"
             + ("; active: those a token computes with (its top_k experts)" * any(
                 s['params']['active'] != s['params']['total'] for s in summary['variants'].values()))
             + "; FFN: W_up/W_gate/W_down (all experts); extras: learned activation coefficients and MoA gates, all "
             "layers.",
             *filter(None, [holm_note({v: s['diff_to_baseline'] for v, s in summary['variants'].items()},
                                      f"tests against {summary['baseline']}")]),
             f"Seed noise (pooled over variants): std of the final val loss {summary['seed_std']:.4f}, of the paired "
             f"differences {fmt_loss(summary['paired_diff_std'])}." if summary['seed_std'] is not None
             else "One seed: no estimate of seed noise (use --seeds=3).", '']
    if not all(summary['same_batches'].values()):
        lines += ['WARNING: runs of the same seed saw different training batches (batch_hash differs).', '']
    if summary['same_val_windows'] is False:
        lines += ['WARNING: runs were evaluated on different validation windows (val_hash differs).', '']
    if summary['damaged_lines']:  # the curves and times go without them
        lines += [f"WARNING: {damaged_note(summary)}.", '']
    lines += [f"{v} seed {r['seed']} diverged after its last logged iteration, {r['iters']} (see "
              f"{r['dir']}/diverged.txt).\n"
              for v, s in summary['variants'].items() for r in s['runs'] if r['status'] != 'done']
    lines += (lr_section(summary) if summary.get('lr') else []) + pairs_section(summary) + matched_section(summary)
    lines += learned_section(summary)
    lines += ['![loss curves](loss.png)', ''] + acts_section(summary)
    write_text(path, '\n'.join(lines))
