"""The pictures of a comparison, drawn from its summary: loss.png, lr.png, ladder.png (acts.png: acts.py); and the
figure and colours every picture is drawn with, and its safe save."""
import textwrap

import numpy as np

from machinery.files import write_file


def save_figure(fig, path):
    """A matplotlib figure as a PNG, atomically (a full disk must not truncate the previous picture)."""
    write_file(path, lambda f: fig.savefig(f, format='png', dpi=fig.dpi), binary=True)


def figure(nrows, ncols, width, row_height, title='', **kw):
    """A figure (made off pyplot: nothing to close) of nrows x ncols axes (always a 2-D array) under the title,
    wrapped to its width."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, row_height * nrows + 0.6 * bool(title)), dpi=100, layout='constrained')
    if title:
        fig.suptitle(textwrap.fill(title, int(width * 12)), fontsize=10)
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


def palette(n):
    """n colours told apart: tab10's (up to 10), tab20's (up to 20), else n spaced evenly along turbo."""
    from matplotlib import colormaps
    if n > 20:
        return [colormaps['turbo'](j / (n - 1)) for j in range(n)]
    return [colormaps['tab10' if n <= 10 else 'tab20'](j) for j in range(n)]


def ema(values, beta):
    out, avg = [], 0.0
    for i, v in enumerate(values):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** (i + 1)))  # bias-corrected, so the first points are not pulled to 0
    return out


def padded(rows):
    """Curves of different lengths (a diverged run is shorter) as one array, NaN past each curve's end."""
    out = np.full((len(rows), max(len(r) for r in rows)), np.nan)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def mean_band(ax, x, curves, color, **kw):
    """The mean over seeds (rows of curves) and the min-max band (of no width, so not drawn, for one seed)."""
    ax.plot(x, np.nanmean(curves, 0), color=color, **kw)
    ax.fill_between(x, np.nanmin(curves, 0), np.nanmax(curves, 0), color=color, alpha=0.2, linewidth=0)


def loss(path, summary, by_variant, smooth):
    """Validation loss against tokens and against training time, and the smoothed training loss."""
    fig, (axes,) = figure(1, 3, 17, 5)
    for c, (v, ms) in zip(palette(len(by_variant)), by_variant.items()):
        done = [m for m in ms if m['curve']['val']]
        if not done:
            continue
        # evaluations at the same iterations for every seed; a diverged run adds the points it has
        val = padded([[p[3] for p in m['curve']['val']] for m in done])
        tok = np.array(max((m['curve']['val'] for m in done), key=len))[:, 1]
        secs = np.nanmean(padded([[p[2] for p in m['curve']['val']] for m in done]), 0)
        keep = tok > 0  # the untrained model's loss (ln vocab) would squash the interesting part...
        if keep.sum() < 2:  # ...unless it is needed to draw a line at all
            keep[:] = True
        label = f'{v} ({len(done)} seed{"s" if len(done) > 1 else ""})'
        for ax, x in ((axes[0], tok), (axes[1], secs)):
            mean_band(ax, x[keep], val[:, keep], c, marker='.', label=label)
        trains = [m['curve']['train'] for m in ms if m['curve']['train']]
        if trains:
            x = np.array(max(trains, key=len))[:, 1]
            mean_band(axes[2], x, padded([ema([p[2] for p in t], smooth) for t in trains]), c, label=v)
    kind = {'on': 'compiled', 'off': 'eager'}.get(summary['compiled'], 'compiled and eager mixed')
    axes[0].set(xlabel='training tokens', ylabel='validation loss', title='validation loss (mean, band: min–max over seeds)')
    axes[1].set(xlabel=f'training time (s, {kind}, evaluation excluded)', ylabel='validation loss',
                title=f'validation loss against {kind} time')
    axes[2].set(xlabel='training tokens', ylabel='training loss (EMA)', title=f"training loss (EMA {smooth})")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{summary['dataset']}: {len(summary['variants'])} FFN variants x {len(summary['seeds'])} seed(s)")
    save_figure(fig, path)


def ladder(path, lad):
    """Final loss against N and against training FLOPs, the gap to the baseline against N, the best rate per size."""
    from matplotlib.ticker import FormatStrFormatter, NullFormatter
    sweep = any(p['best_lr'] for lv in lad['variants'].values() for p in lv['points'])
    fig, (axes,) = figure(1, 4 if sweep else 3, 22 if sweep else 17, 5)
    for i, (c, (v, lv)) in enumerate(zip(palette(len(lad['variants'])), lad['variants'].items())):
        pts = [p for p in lv['points'] if p['final_val_loss']]
        if not pts:
            continue
        for ax, key in ((axes[0], 'N'), (axes[1], 'flops')):
            ax.errorbar([p[key] for p in pts], [p['final_val_loss']['mean'] for p in pts],
                        yerr=[p['final_val_loss']['std'] or 0.0 for p in pts], color=c, marker='o', capsize=3, label=v)
        gaps = [p for p in pts if p['gap']]
        if gaps:
            x = np.array([p['N'] for p in gaps]) * (1 + 0.02 * i)  # nudged apart so error bars do not overlap
            mean = np.array([p['gap']['mean'] for p in gaps])
            ci = np.array([p['gap'].get('ci') or [p['gap']['mean']] * 2 for p in gaps])  # no interval: no bar
            axes[2].errorbar(x, mean, yerr=[mean - ci[:, 0], ci[:, 1] - mean], color=c, marker='o', capsize=3,
                             label=v + (f" ({lv['trend']['verdict']})" if lv['trend'] else ''))
        if sweep:
            # against N, not width: ladder sizes may share a width and differ in depth
            axes[3].plot([p['N'] * (1 + 0.02 * i) for p in pts], [p['best_lr'] for p in pts], color=c, marker='o', label=v)
    if sweep:
        axes[3].set(xscale='log', yscale='log', xlabel='non-embedding parameters N', ylabel='best peak learning rate',
                    title='each variant\'s best rate per size')
    axes[2].axhline(0.0, color='k', linewidth=0.8)
    axes[2].set(xscale='log', xlabel='non-embedding parameters N', ylabel=f"Δ = L − L_{lad['baseline']}",
                title=f"gap to {lad['baseline']} (paired over seeds, 95% t interval)")
    for ax, xlabel, title in ((axes[0], 'non-embedding parameters N', 'loss vs N (mean ± std over seeds)'),
                              (axes[1], 'training FLOPs (model count x tokens)', 'loss vs training compute')):
        ax.set(xscale='log', yscale='log', xlabel=xlabel, ylabel='final validation loss', title=title)
        # losses span a narrow range: plain decimals on the log axis, not powers of ten
        ax.yaxis.set_major_formatter(FormatStrFormatter('%.2f'))
        ax.yaxis.set_minor_formatter(FormatStrFormatter('%.2f'))
    for ax in axes:
        ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels on a log axis overlap
        ax.grid(alpha=0.3, which='both')
        ax.legend(fontsize=8)
    fig.suptitle(f"{lad['dataset']}: {len(lad['variants'])} FFN variants x {len(lad['seeds'])} seed(s) x "
                 f"{len(lad['sizes'])} sizes ({lad['token_rule']}, lr {lad['lr_rule']})")
    save_figure(fig, path)


def lr(path, summary):
    """A learning-rate sweep: each variant's final validation loss (mean over seeds, min-max band) against the rate."""
    fig, ((ax,),) = figure(1, 1, 8, 5)
    for c, (v, x) in zip(palette(len(summary['lr'])), summary['lr'].items()):
        pts = [(r, x['report'][repr(r)]) for r in x['rates'] if x['report'][repr(r)]]
        if not pts:
            continue
        rates = [r for r, _ in pts]
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
    save_figure(fig, path)
