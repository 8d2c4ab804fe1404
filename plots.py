"""
The pictures of a comparison, drawn from its summary: loss.png (curves side by side) and, for a ladder, ladder.png.

acts.png, what the activations became, is inspect_run.py's.
"""
import numpy as np

from rundir import save_figure


def pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def ema(values, beta):
    out, avg = [], 0.0
    for i, v in enumerate(values):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** (i + 1)))  # bias-corrected, so the first points are not pulled to 0
    return out


def padded(rows):
    """Curves of different lengths (a stopped run is shorter) as one array, NaN past each curve's end."""
    out = np.full((len(rows), max(len(r) for r in rows)), np.nan)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def loss(path, summary, by_variant, smooth):
    """Validation loss against tokens and against training time (mean over seeds, min-max band), and the smoothed
    training loss, one colour per variant."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 5), dpi=110)
    colors = plt.get_cmap('tab10' if len(by_variant) <= 10 else 'tab20').colors
    for i, (v, ms) in enumerate(by_variant.items()):
        c = colors[i % len(colors)]
        done = [m for m in ms if m['curve']['val']]
        if not done:
            continue
        # evaluations at the same iterations for every seed; a stopped run adds the points it has
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
            curve = padded([ema([p[2] for p in t], smooth) for t in trains])
            x = np.array(max(trains, key=len))[:, 1]
            axes[2].plot(x, np.nanmean(curve, 0), color=c, label=v)
            if len(trains) > 1:
                axes[2].fill_between(x, np.nanmin(curve, 0), np.nanmax(curve, 0), color=c, alpha=0.2, linewidth=0)
    kind = {'on': 'compiled', 'off': 'eager'}.get(summary['compiled'], 'compiled and eager mixed')
    axes[0].set(xlabel='training tokens', ylabel='validation loss', title='validation loss (mean, band: min–max over seeds)')
    axes[1].set(xlabel=f'training time (s, {kind}, evaluation excluded)', ylabel='validation loss',
                title=f'validation loss against {kind} time')
    axes[2].set(xlabel='training tokens', ylabel='training loss (EMA)', title=f"training loss (EMA {smooth})")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{summary['dataset']}: {len(summary['variants'])} FFN variants x {len(summary['seeds'])} seed(s)")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def ladder(path, lad):
    """Final loss against non-embedding parameters and against training FLOPs, each variant's gap to the baseline
    against N with its 95% interval, and (with a sweep) each variant's best learning rate against the width."""
    plt = pyplot()
    from matplotlib.ticker import FormatStrFormatter, NullFormatter
    sweep = any(p['best_lr'] for lv in lad['variants'].values() for p in lv['points'])
    fig, axes = plt.subplots(1, 4 if sweep else 3, figsize=(22 if sweep else 17, 5), dpi=110)
    colors = plt.get_cmap('tab10').colors
    for i, (v, lv) in enumerate(lad['variants'].items()):
        c, pts = colors[i % len(colors)], [p for p in lv['points'] if p['final_val_loss']]
        if not pts:
            continue
        y = np.array([p['final_val_loss']['mean'] for p in pts])
        err = np.array([p['final_val_loss']['std'] or 0.0 for p in pts])
        for ax, key in ((axes[0], 'N'), (axes[1], 'flops')):
            ax.errorbar([p[key] for p in pts], y, yerr=err, color=c, marker='o', capsize=3, label=v)
        gaps = [(p['N'], p['gap']) for p in pts if p['gap']]
        if gaps:
            x = np.array([n for n, _ in gaps]) * (1 + 0.02 * i)  # nudged apart so error bars do not overlap
            mean = np.array([g['mean'] for _, g in gaps])
            lo = np.array([g['mean'] - g['ci'][0] if g.get('ci') else 0.0 for _, g in gaps])
            hi = np.array([g['ci'][1] - g['mean'] if g.get('ci') else 0.0 for _, g in gaps])
            t = lv['trend']
            axes[2].errorbar(x, mean, yerr=[lo, hi], color=c, marker='o', capsize=3,
                             label=v + (f" ({t['verdict']})" if t else ''))
        if sweep:
            axes[3].plot([p['n_embd'] for p in pts], [p['best_lr'] for p in pts], color=c, marker='o', label=v)
    if sweep:
        axes[3].set(xscale='log', yscale='log', xlabel='width n_embd', ylabel='best peak learning rate',
                    title='each variant\'s best rate per size')
    axes[2].axhline(0.0, color='k', linewidth=0.8)
    axes[0].set(xscale='log', yscale='log', xlabel='non-embedding parameters N', ylabel='final validation loss',
                title='loss vs N (mean ± std over seeds)')
    axes[1].set(xscale='log', yscale='log', xlabel='training FLOPs (model count x tokens)',
                ylabel='final validation loss', title='loss vs training compute')
    axes[2].set(xscale='log', xlabel='non-embedding parameters N', ylabel=f"Δ = L − L_{lad['baseline']}",
                title=f"gap to {lad['baseline']} (paired over seeds, 95% t interval)")
    for ax in axes[:2]:  # losses span a narrow range: plain decimals on the log axis, not powers of ten
        ax.yaxis.set_major_formatter(FormatStrFormatter('%.2f'))
        ax.yaxis.set_minor_formatter(FormatStrFormatter('%.2f'))
    for ax in axes:
        ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels on a log axis overlap
        ax.grid(alpha=0.3, which='both')
        ax.legend(fontsize=8)
    fig.suptitle(f"{lad['dataset']}: {len(lad['variants'])} FFN variants x {len(lad['seeds'])} seed(s) x "
                 f"{len(lad['sizes'])} sizes ({lad['token_rule']}, lr {lad['lr_rule']})")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def lr(path, summary):
    """A learning-rate sweep: each variant's final validation loss (report half, mean over seeds, min-max band) against
    the rate, its best rate (chosen on the other half) starred, the shared rate dashed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    colors = plt.get_cmap('tab10' if len(summary['lr']) <= 10 else 'tab20').colors
    for i, (v, x) in enumerate(summary['lr'].items()):
        pts = [(r, x['report'][repr(r)]) for r in x['rates'] if x['report'][repr(r)]]
        if not pts:
            continue
        rates = [r for r, _ in pts]
        c = colors[i % len(colors)]
        ax.plot(rates, [s['mean'] for _, s in pts], color=c, marker='.', label=v)
        ax.fill_between(rates, [s['min'] for _, s in pts], [s['max'] for _, s in pts], color=c, alpha=0.15, linewidth=0)
        best = x['report'][repr(x['best'])]
        if best:
            ax.plot([x['best']], [best['mean']], marker='*', markersize=14, color=c, markeredgecolor='k')
    ax.axvline(summary['shared_lr'], color='0.4', linestyle='--', linewidth=1, label=f"shared rate {summary['shared_lr']:.3g}")
    ax.set(xscale='log', xlabel='peak learning rate', ylabel='final validation loss (second half of the windows)',
           title='loss against learning rate; ★ best rate, chosen on the first half')
    ax.grid(alpha=0.3, which='both')
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
