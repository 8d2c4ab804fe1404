"""
What a run's activations became: the learned functions of its FFNs, evaluated on the inputs they actually see, and
their pictures (acts.png: inspect_run.py for one run, compare.py for a comparison's variants side by side).

h = W_up x (or g = W_gate x, u = W_up x) of each token's FFN input x on the run's first validation batch (in an MoE of
each (token, chosen expert) pair). φ is evaluated at the histogram's bin centres; where it depends on the token
(PolyNorm's norm, MoA's c(x_t)) as the median and 10-90% band over tokens. w_b = bin b's share of h; moved from init
= sqrt(Σ_b w_b (φ(h_b) − φ_init(h_b))²), 0 at init; init_rms = sqrt(Σ_b w_b φ_init(h_b)²) gives it a scale.
"""
import math
import os
import sys

import numpy as np
import torch

from activations import make_activations
from machinery.checkpoint import CKPT, RUN_DIRS, checkpoint_model, load_checkpoint, loading
from machinery.cli import UserError
from comparison.plots import figure, palette, save_figure
from comparison.runs import codes_of, data_now
from machinery.files import write_json
from machinery.fingerprint import code_hash
from machinery.run_log import LOG, read_log_lines
from model import GPT, GPTConfig, MoE

RANGE = (0.5, 99.5)  # percentiles of h that set the drawn range
BAND = (10, 50, 90)  # percentiles over tokens: band low, median, band high
MAX_BINS = 1000  # already more than a panel's 430 pixels; φ is evaluated at every bin for every token


def branch_rows(ffn, x):
    """({'act': h or g, 'act_up': u}, the FFN input of each row, tokens per expert or None) for one layer."""
    x = x.reshape(-1, x.shape[-1])
    if isinstance(ffn, MoE):
        _, _, experts, _ = ffn.route(x)
        _, token, counts, _ = ffn.dispatch(experts)  # the pairs sorted by expert, as the MoE's forward runs them
        groups = token.split(counts.tolist())
        project = lambda w: torch.cat([x[t] @ w[e] for e, t in enumerate(groups)])
        rows_x, usage = x[token], counts.tolist()
    else:
        project = lambda linear: linear(x)
        rows_x, usage = x, None
    weights = {'act': ffn.w_up} if ffn.act_up is None else {'act': ffn.w_gate, 'act_up': ffn.w_up}
    return {name: project(w) for name, w in weights.items()}, rows_x, usage


def phi_curves(act, grid, h, x):
    """φ on the grid as each token sees it (Activation.curves). Checked first: the first token's curve at a part of its
    own pre-activations is what the FFN computes there, or φ depends on the token in a way curves does not draw and
    its picture would be wrong."""
    k = max(1, h.shape[-1] // 4)  # a part of the row: a φ that normalises over the row gives other values there
    computed = act(h, act.token_gates(x))[:1, :k]  # over every row, as the FFN computes it
    if not torch.allclose(act.curves(h[0, :k], h[:1], x[:1]), computed, rtol=1e-4, atol=1e-5):
        raise UserError(f"cannot draw {type(act).__name__}: its curves give another φ than its forward at a token's "
                        f"own pre-activations; make curves compute forward's formula, and where φ at a point depends "
                        f"on more of the token than token_gates(x) gives it, override Activation.curves(grid, h, x) to "
                        f"draw it per token, as Poly does for PolyNorm's norm.")
    return act.curves(grid, h, x)


def branch_report(act, init_act, h, x, bins):
    """The function panel's numbers for one branch of one layer."""
    hv = h.flatten().cpu().double().numpy()  # float64 on the host: MPS has none
    lo, hi = np.percentile(hv, RANGE)
    edges = np.linspace(lo, max(hi, lo + 1e-6), bins + 1)
    counts = np.histogram(hv, edges)[0]
    grid = torch.tensor((edges[:-1] + edges[1:]) / 2, dtype=h.dtype, device=h.device)
    learned = phi_curves(act, grid, h, x).cpu().double().numpy()
    init = phi_curves(init_act.to(h.device), grid, h, x).cpu().double().numpy()
    low, median, high = np.percentile(learned, BAND, axis=0)
    init_median = np.percentile(init, 50, axis=0)
    w = counts / max(counts.sum(), 1)
    token_dependent = len(learned) > 1
    return {'kind': repr(act), 'learnable': any(True for _ in act.parameters()), 'token_dependent': token_dependent,
            'grid': grid.tolist(), 'edges': edges.tolist(), 'counts': counts.tolist(), 'median': median.tolist(),
            'band': [low.tolist(), high.tolist()] if token_dependent else None, 'init': init_median.tolist(),
            'moved': math.sqrt(float((w * (median - init_median) ** 2).sum())),
            'init_rms': math.sqrt(float((w * init_median ** 2).sum()))}


def gate_report(c, names):
    """Per-token coefficients c (N, K), MoA's c_k(x): each over tokens; entropy (nats, ≤ log K) of |c|/Σ|c| per token
    and of the mean |c| (a shared α)."""
    c = c.cpu().double()
    p = c.abs() / c.abs().sum(-1, keepdim=True).clamp_min(1e-12)
    entropy = -(p * p.clamp_min(1e-12).log()).sum(-1).numpy()
    pm = c.abs().mean(0) / c.abs().mean(0).sum().clamp_min(1e-12)
    quantiles = np.percentile(c.numpy(), [5, 25, 50, 75, 95], axis=0)
    edges = np.linspace(0.0, math.log(c.shape[-1]), 31)
    return {'names': [str(n) for n in names], 'quantiles': quantiles.T.tolist(), 'mean': c.mean(0).tolist(),
            'std': c.std(0).tolist(), 'entropy_mean': float(entropy.mean()), 'entropy_std': float(entropy.std()),
            'entropy_edges': edges.tolist(), 'entropy_counts': np.histogram(entropy, edges)[0].tolist(),
            'entropy_of_mean': float(-(pm * pm.clamp_min(1e-12).log()).sum())}


def history(log, n_layer):
    """Per layer and part (act, act_up, moe): {label: [value at each evaluation that logged `act`, None if absent]}."""
    evals = [r for r in log if r.get('act')]
    layers = [{} for _ in range(n_layer)]
    for j, r in enumerate(evals):
        for parts, logged in zip(layers, r['act']['layers']):
            for part, quantities in logged.items():
                for q, value in quantities.items():
                    for name, v in (value.items() if isinstance(value, dict) else [('', value)]):
                        series = parts.setdefault(part, {}).setdefault(f'{q} {name}'.strip(), [None] * len(evals))
                        series[j] = v
    return {'iters': [r['iter'] for r in evals], 'layers': layers}


@torch.no_grad()
def inspect(out_dir, data_dir='', bins=100, device='cpu', ckpt=None, log=None):
    """The numbers behind a run's acts.png (the content of acts.json), from its checkpoint and its log (read here
    unless given: compare.py has read them already, as (records, damaged lines) for the log)."""
    from data.loader import DataLoader
    if not 2 <= bins <= MAX_BINS:
        raise UserError(f"--bins must be between 2 and {MAX_BINS}, got {bins}.")
    if ckpt is None:
        hint = ("no run has started there; give the --out_dir of a run" if os.path.isdir(out_dir) else
                "no such folder; give the --out_dir of a run")
        ckpt = load_checkpoint(out_dir, f"{hint} ({RUN_DIRS}).")
    path = os.path.join(out_dir, CKPT)
    model = checkpoint_model(ckpt, path, lambda args: GPT(GPTConfig(**args))).to(device).eval()
    log, damaged = log or read_log_lines(os.path.join(out_dir, LOG))
    with loading(path):  # its data stream's settings; a UserError (the data moved) passes as it is
        cfg, iter_num = ckpt['config'], ckpt['iter_num']
        data_dir = data_dir or cfg['data_dir']
        meta, val_hash = data_now({**cfg, 'data_dir': data_dir})  # as a comparison reads it (its scan's, cached)
        # the windows its checkpoint's evaluation scored, as logged at its iteration (a later line is a later try's)
        logged = next((r['val_hash'] for r in log if r['iter'] == iter_num and 'val_hash' in r), None)
        if ckpt['meta'] != meta or logged not in (None, val_hash):
            raise UserError(f"{os.path.join(data_dir, cfg['dataset'])} holds other data than {out_dir} trained on "
                            f"(prepared again since?), so its inputs are not the run's; prepare the data it trained "
                            f"on, or point --data_dir at them.")
        idx = DataLoader(cfg['dataset'], cfg['block_size'], cfg['batch_size'], cfg['seed'],
                         data_dir=data_dir).val_batches(1)[0][0].to(device)
    init_acts = make_activations(model.config)
    layers = []
    for block, x in zip(model.transformer.h, model.ffn_inputs(idx)):
        rows, x_rows, usage = branch_rows(block.ffn, x)
        acts = {name: getattr(block.ffn, name) for name in rows}  # act, and act_up for a GLU
        branches = {n: branch_report(acts[n], init, rows[n], x_rows, bins) for n, init in zip(rows, init_acts)}
        # the gate panels: each activation with per-token coefficients, named by its dictionary (MoA) or numbered;
        # of each token once (an MoE's experts share them), not of each (token, expert) pair
        tokens = x.reshape(-1, x.shape[-1])
        gates = {n: gate_report(c, getattr(a, 'names', range(c.shape[-1]))) for n, a in acts.items()
                 if (c := a.token_gates(tokens)) is not None}
        layer = {'moe': usage is not None, 'branches': branches, 'gates': gates}
        if usage is not None:
            layer['expert_tokens'] = usage
        layers.append(layer)
    return {'run': out_dir, 'damaged_lines': len(damaged), 'ffn': model.config.ffn, 'iter': iter_num,
            'n_layer': model.config.n_layer, 'batch': {'dataset': cfg['dataset'], 'batch_size': cfg['batch_size'],
                                                       'block_size': cfg['block_size'], 'tokens': idx.numel()},
            'layers': layers, 'history': history(log, model.config.n_layer)}


# ----------------------------------------------------------------------------------------------------------------------
# the pictures


def by_quantity(series):
    """A part's logged series as small multiples: {quantity: {entry: values}} for named numbers (alpha of each
    dictionary entry, ...), every plain number (alpha_p, ...) under '' by its own name."""
    groups = {}
    for label, values in series.items():
        quantity, _, entry = label.partition(' ')
        groups.setdefault(quantity if entry else '', {})[entry or quantity] = values
    return groups


def short_label(name, branches):
    """A branch's name in a line of text: φ, or for a GLU φ(g), the gate branch, and φ_up(h), the up branch."""
    return 'φ' if 'act_up' not in branches else 'φ(g) (gate branch)' if name == 'act' else 'φ_up(h) (up branch)'


def branch_label(name, branches):
    """A function panel's name: φ, or for a GLU the gate branch φ(g), which multiplies h or φ_up(h), and φ_up(h)."""
    if 'act_up' not in branches:
        return 'φ'
    if name == 'act_up':
        return 'φ_up(h), the up branch'
    up = 'h' if branches['act_up']['kind'] == 'Fixed(identity)' else 'φ_up(h)'  # a plain GLU's up branch: h itself
    return f"φ(g), the gate branch, multiplied by {up}"


def mixture_weights(report, i):
    """Layer i's dictionary weights per mixture branch, {branch: (entries, weight, low, high)}: MoA's c_k(x), median
    and 5-95% over the batch's tokens; LA's α as logged at the checkpoint's iteration."""
    weights = {}
    for part, g in report['layers'][i]['gates'].items():
        q = np.array(g['quantiles'])  # per entry: 5, 25, 50, 75, 95%
        weights[part] = (g['names'], q[:, 2], q[:, 0], q[:, 4])
    hist = report['history']
    j = hist['iters'].index(report['iter']) if report['iter'] in hist['iters'] else -1
    for part, series in hist['layers'][i].items():
        alpha = by_quantity(series).get('alpha', {})
        if part not in weights and alpha and None not in [v[j] for v in alpha.values()]:
            weights[part] = (list(alpha), np.array([v[j] for v in alpha.values()]), None, None)
    return weights


def draw_weights(ax, weights):
    """A mixture's dictionary weights, one bar per entry (a GLU's gate and up branches side by side, as their curves'
    colours), MoA's with its 5-95% range over tokens."""
    for j, (part, (names, w, lo, hi)) in enumerate(weights.items()):
        y = np.arange(len(names)) + (0.2 * (2 * j - 1) if len(weights) > 1 else 0.0)
        err = None if lo is None else np.maximum(0, [w - lo, hi - w])
        ax.barh(y, w, height=0.8 / len(weights), xerr=err, color=f'C{j}', error_kw=dict(lw=0.8, capsize=1.5),
                label={'act': 'gate', 'act_up': 'up'}[part] if len(weights) > 1 else None)
        ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()  # the dictionary's order, top down
    ax.axvline(0, color='0.6', linewidth=0.5)
    ax.set_xlabel('weight', fontsize=8)
    if len(weights) > 1:
        ax.legend(fontsize=6)
    ax.grid(alpha=0.3, axis='x')


def draw_function(ax, branch, color='C0', label='learned', hist=True):
    """φ learned (median, band) over the histogram of h, the init dashed."""
    grid = branch['grid']
    if hist:
        ax2 = ax.twinx()
        ax2.bar(grid, branch['counts'], width=branch['edges'][1] - branch['edges'][0], color='0.85', linewidth=0)
        ax2.set_yticks([])
        ax.set_zorder(ax2.get_zorder() + 1)  # the curves above the histogram
        ax.patch.set_visible(False)
    ax.plot(grid, branch['init'], color=color, linestyle='--', linewidth=1, alpha=0.7)
    ax.plot(grid, branch['median'], color=color, label=label)
    if branch['band']:
        ax.fill_between(grid, *branch['band'], color=color, alpha=0.25, linewidth=0)
    ax.grid(alpha=0.3)


def draw_gates(ax, gates, entropy):
    """MoA: box per c_k (5-25-50-75-95% over tokens), or the histogram of the per-token mixture entropy."""
    for j, (name, g) in enumerate(gates.items()):
        prefix = 'up ' if name == 'act_up' else ''
        if entropy:
            ax.stairs(g['entropy_counts'], g['entropy_edges'], label=f"{prefix}per token", color=f'C{j}')
            ax.axvline(g['entropy_of_mean'], color=f'C{j}', linestyle=':', label=f'{prefix}entropy of mean |c|')
            continue
        stats = [dict(whislo=q[0], q1=q[1], med=q[2], q3=q[3], whishi=q[4], label=prefix + n)
                 for n, q in zip(g['names'], g['quantiles'])]
        ax.bxp(stats, positions=[j * (len(stats) + 1) + k for k in range(len(stats))], showfliers=False)
        ax.tick_params(axis='x', labelrotation=60, labelsize=7)
    if entropy:
        ax.set(xlabel='entropy of |c|/Σ|c| (nats)')
        ax.legend(fontsize=6)
    else:
        ax.axhline(0, color='0.6', linewidth=0.5)
    ax.grid(alpha=0.3)


def draw_series(ax, series, iters):
    """One logged quantity over training: a line per entry, each its own colour (the same entry, the same colour in
    every panel of the quantities it logs)."""
    for color, (label, values) in zip(palette(len(series)), series.items()):
        pts = [(i, v) for i, v in zip(iters, values) if v is not None]
        if pts:
            ax.plot(*zip(*pts), marker='.', label=label, color=color)
    ax.set(xlabel='iteration')
    ax.legend(fontsize=6, ncol=2 if len(series) > 8 else 1)
    ax.grid(alpha=0.3)


def write(out_dir, report):
    """A run's acts.json, and acts.png: one row per layer; its columns the functions, each quantity each part logged
    over training (small multiples: alpha, c_std, ... apart), MoA's gates and their entropy, an MoE's tokens per
    expert."""
    write_json(os.path.join(out_dir, 'acts.json'), report)
    layers, hist = report['layers'], report['history']
    cols = list(layers[0]['branches'])
    cols += list(dict.fromkeys((part, q) for logged in hist['layers'] for part, series in logged.items()
                               for q in by_quantity(series)))  # (part, quantity): a history panel
    if any(l['gates'] for l in layers):
        cols += ['gates', 'entropy']
    if any('expert_tokens' in l for l in layers):
        cols.append('experts')
    title = (f"{report['ffn']} at iteration {report['iter']} ({report['run']}): learned φ solid, init dashed, "
             f"histogram of h on the first validation batch ({report['batch']['tokens']:,} tokens) behind")
    fig, axes = figure(len(layers), len(cols), 4.3 * len(cols), 3.0, title)
    titles = {'gates': 'MoA c_k(x) over tokens', 'entropy': 'MoA mixture entropy per token',
              'experts': 'validation tokens per expert (top_k each)'}
    for i, (layer, logged) in enumerate(zip(layers, hist['layers'])):
        for ax, col in zip(axes[i], cols):
            if col in layer['branches']:
                branch = layer['branches'][col]
                draw_function(ax, branch)
                band = 'median, 10-90% over tokens; ' if branch['token_dependent'] else ''
                moved = f"moved from init {branch['moved']:.3g}" if branch['learnable'] else 'fixed'
                ax.set_title(f"layer {i}: {branch_label(col, layer['branches'])}\n{band}{moved}", fontsize=9)
                ax.set_xlabel('g (pre-activation)' if col == 'act' and 'act_up' in layer['branches'] else
                              'h (pre-activation)')
                continue
            if isinstance(col, tuple):  # one quantity a part logged over training
                series = by_quantity(logged.get(col[0], {})).get(col[1])
                ax.set_title(f"layer {i}: {' '.join(filter(None, col))} over training", fontsize=9)
                if series:
                    draw_series(ax, series, hist['iters'])
                else:
                    ax.set_axis_off()
                continue
            ax.set_title(f'layer {i}: ' + titles[col], fontsize=9)
            if col in ('gates', 'entropy') and layer['gates']:
                draw_gates(ax, layer['gates'], col == 'entropy')
            elif col == 'experts' and 'expert_tokens' in layer:
                ax.bar(range(len(layer['expert_tokens'])), layer['expert_tokens'], color='C2')
                ax.set(xlabel='expert', ylabel='tokens', xticks=range(len(layer['expert_tokens'])))
            else:
                ax.set_axis_off()
    save_figure(fig, os.path.join(out_dir, 'acts.png'))


def compare_acts(out_dir, runs, data_dir):
    """For compare.py: inspect and write each variant's run (runs: {variant: its first seed's runs.Run, whose files
    are read already}, its acts.png and acts.json where it trained with this code) and draw out_dir/acts.png. Returns
    the moved-from-init numbers per variant, layer and branch (None: no checkpoint)."""
    reports = {}
    for v, run in runs.items():
        try:
            if run.checkpoint is None:
                raise UserError(f"{run.dir} holds no readable checkpoint")
            reports[v] = inspect(run.dir, data_dir, ckpt=run.checkpoint, log=(run.records, run.damaged))
            if codes_of(run.records) == {code_hash()}:  # a run of other code (--report) keeps the pictures it has
                write(run.dir, reports[v])
        except UserError as e:  # a run that never wrote a checkpoint (or whose data moved): no row for it
            print(f"compare: no acts.png row for {v}: {e}", file=sys.stderr)
            reports[v] = None
    drawn = {v: r for v, r in reports.items() if r is not None}
    if drawn:
        draw_comparison(os.path.join(out_dir, 'acts.png'), drawn)
        write_json(os.path.join(out_dir, 'acts.json'), {'variants': drawn})
    return {v: None if r is None else {'run': r['run'], 'layers': [
        {name: {k: b[k] for k in ('moved', 'init_rms', 'learnable')} for name, b in l['branches'].items()}
        for l in r['layers']]} for v, r in reports.items()}


def draw_comparison(path, reports):
    """One row per variant; per layer a column of φ (for a GLU the gate's, and the up branch's where learned) and, where
    a variant mixes a dictionary (LA, MoA), a column of its dictionary weights."""
    n_layer = max(r['n_layer'] for r in reports.values())
    weights = {v: [mixture_weights(r, i) for i in range(r['n_layer'])] for v, r in reports.items()}
    per_layer = 2 if any(any(w) for w in weights.values()) else 1
    width = max((4.5 + 2.3 * (per_layer - 1)) * n_layer, 8)
    title = ("learned φ at each run's checkpoint (solid; median and 10-90% band over tokens where it depends on the "
             "token), init dashed, histogram of h on the first validation batch behind; the first seed of each "
             "variant; moved: distance from init over the histogram's mass. A GLU's panel is its gate branch φ(g), "
             "which multiplies h (or φ_up(h), drawn too where learned). Dictionary weights: LA's α_k; MoA's c_k(x), "
             "median and 5-95% over the batch's tokens")
    fig, axes = figure(len(reports), n_layer * per_layer, width, 2.6, title,
                       gridspec_kw=dict(width_ratios=[4.5, 2.3][:per_layer] * n_layer))
    for col in range(0, n_layer * per_layer, per_layer):  # h shared down a layer's column; y not: PolyNorm normalises
        for ax in axes[1:, col]:
            ax.sharex(axes[0, col])
    for row, (v, r) in zip(axes, reports.items()):
        for i in range(n_layer):
            ax = row[i * per_layer]
            if i >= r['n_layer']:
                for a in row[i * per_layer:(i + 1) * per_layer]:
                    a.set_axis_off()
                continue
            branches = r['layers'][i]['branches']
            glu = 'act_up' in branches
            draw_function(ax, branches['act'], label='φ_gate(g)' if glu else 'φ')
            if branches.get('act_up', {}).get('learnable'):
                draw_function(ax, branches['act_up'], color='C1', label='φ_up(h)', hist=False)
                ax.legend(fontsize=7, loc='upper left')
            names = {'act': 'gate ' if glu else '', 'act_up': 'up '}
            moved = ', '.join(f"{names[n]}{b['moved']:.3g}" for n, b in branches.items() if b['learnable'])
            what = f"\n{branch_label('act', branches)}" if glu else ''
            ax.set_title(f"{v}, layer {i}" + (f": moved {moved}" if moved else ' (fixed)') + what, fontsize=9)
            if per_layer > 1:
                if weights[v][i]:
                    draw_weights(row[i * per_layer + 1], weights[v][i])
                    row[i * per_layer + 1].set_title("dictionary weights", fontsize=9)
                else:
                    row[i * per_layer + 1].set_axis_off()
        row[0].set_ylabel(f"{v}, iteration {r['iter']}")  # each run's checkpoint: its last or its best evaluation
    for ax in axes[-1, ::per_layer]:
        ax.set_xlabel('h (pre-activation; g for a GLU\'s gate)')
    save_figure(fig, path)
