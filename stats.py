"""
The statistics behind compare.py's verdicts, from scipy rather than hand-typed tables:

    paired(diffs)                  per-seed paired differences: mean, std, Student t test, t confidence interval
    bootstrap_ci(values)           a percentile bootstrap CI of the mean (scipy.stats.bootstrap), for skewed spreads
    gap_trend(log_n, gaps)         least-squares slope of a gap against log N, its CI, and 'grows'/'shrinks'/'flat'
    power_law_fit(n, loss)         L(N) = E + A·N^(−α) with scipy.optimize.curve_fit (Kaplan et al. 2020; Hoffmann
                                   et al. 2022 add the data term), with standard errors; only with >= 4 sizes
    reach(x, loss, target)         where a loss curve first reaches a target, linearly interpolated
    loss_at(x, loss, budget)       the loss of a curve at a budget (tokens, FLOPs or seconds), linearly interpolated
    choose_rate(losses)            the learning rate with the lowest mean loss over seeds, and whether it is at an edge
    compute_multiplier(...)        the compute a baseline needs for a variant's loss, over the variant's compute

Every function takes plain lists and returns plain JSON-able values (None where a number cannot be had).
"""
import math
import statistics

import numpy as np
from scipy import optimize, stats

CONFIDENCE = 0.95  # every interval and test here is two-sided at this level
MIN_FIT_SIZES = 4  # E, A and α are 3 parameters: fewer than 4 sizes leave no degree of freedom to judge the fit


def paired(diffs, confidence=CONFIDENCE):
    """Mean and std of per-seed paired differences d_i, the t statistic t = mean / (std / √n) with its two-sided p
    value (scipy.stats.ttest_1samp, Student's t with n−1 degrees of freedom), the CI mean ± t_{(1+c)/2, n−1}·std/√n,
    and `resolved`: whether the CI excludes 0 (equivalently p < 1 − confidence). One seed: no spread, no test."""
    d = [float(v) for v in diffs if v is not None and math.isfinite(v)]
    if not d:
        return None
    n, mean = len(d), float(np.mean(d))
    out = {'mean': mean, 'std': None, 'min': min(d), 'max': max(d), 'n': n, 't': None, 'p': None, 'ci': None,
           'resolved': False}
    if n < 2:
        return out
    std = float(np.std(d, ddof=1))
    out['std'] = std
    if std == 0:
        return out
    test = stats.ttest_1samp(d, 0.0)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
    out.update(t=float(test.statistic), p=float(test.pvalue), ci=[float(mean - half), float(mean + half)],
               resolved=bool(test.pvalue < 1 - confidence))
    return out


def bootstrap_ci(values, confidence=CONFIDENCE, n_resamples=2000, seed=0):
    """A percentile bootstrap CI of the mean (scipy.stats.bootstrap, Efron 1979); None with fewer than 2 values or
    no spread. Seeded, so the same values always give the same interval."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) < 2 or np.ptp(v) == 0:
        return None
    res = stats.bootstrap((v,), np.mean, confidence_level=confidence, n_resamples=n_resamples, method='percentile',
                          rng=np.random.default_rng(seed))
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def gap_trend(log_n, gaps, confidence=CONFIDENCE):
    """The trend of a gap Δ with size: the least-squares line Δ = a + b·ln N through every seed-level point
    (ln N_j, Δ_ij), so the CI of the slope b comes from the seed-level spread around the line:
    b ± t_{(1+c)/2, m−2}·SE(b) with m points (scipy.stats.linregress). 'grows' when the whole CI is above 0 (Δ rises
    with N), 'shrinks' when below, else 'flat within noise'. Needs 2 sizes and 3 points; else None."""
    pts = [(float(x), float(g)) for x, g in zip(log_n, gaps) if g is not None and math.isfinite(g)]
    if len({x for x, _ in pts}) < 2 or len(pts) < 3:
        return None
    x, y = np.array(pts).T
    fit = stats.linregress(x, y)
    half = stats.t.ppf(0.5 + confidence / 2, len(pts) - 2) * fit.stderr
    lo, hi = fit.slope - half, fit.slope + half
    verdict = 'grows' if lo > 0 else 'shrinks' if hi < 0 else 'flat within noise'
    return {'slope_per_ln_n': float(fit.slope), 'ci': [float(lo), float(hi)], 'stderr': float(fit.stderr),
            'points': len(pts), 'verdict': verdict}


def power_law(n, e, a, alpha):
    return e + a * np.power(n, -alpha)


def power_law_fit(n, loss):
    """Fit L(N) = E + A·N^(−α) by least squares (scipy.optimize.curve_fit) to every (N, loss) point, seeds included.
    Fitted as E + A'·(N/N₀)^(−α) with N₀ the geometric mean of the sizes (well conditioned), then A = A'·N₀^α; the
    standard errors come from curve_fit's covariance, A's by the delta method. With fewer than MIN_FIT_SIZES distinct
    sizes (or a fit that does not converge or has an undefined covariance) returns {'identifiable': False, 'why'}."""
    pts = [(float(a), float(b)) for a, b in zip(n, loss) if b is not None and math.isfinite(b)]
    sizes = sorted({a for a, _ in pts})
    if len(sizes) < MIN_FIT_SIZES:
        return {'identifiable': False, 'why': f'{len(sizes)} sizes; a 3-parameter fit needs at least {MIN_FIT_SIZES}'}
    x, y = np.array(pts).T
    n0 = float(np.exp(np.mean(np.log(sizes))))
    p0 = [0.9 * y.min(), max(y.max() - 0.9 * y.min(), 1e-3), 0.3]
    try:
        p, cov = optimize.curve_fit(power_law, x / n0, y, p0=p0, bounds=([0, 0, 0], [np.inf, np.inf, 5]),
                                    maxfev=20000)
    except (RuntimeError, ValueError) as e:
        return {'identifiable': False, 'why': f'the fit did not converge ({e})'}
    if not np.all(np.isfinite(cov)):
        return {'identifiable': False, 'why': 'the fit leaves its parameters undetermined (infinite covariance)'}
    e, a1, alpha = (float(v) for v in p)
    a = a1 * n0 ** alpha
    # delta method for A = A'·N₀^α: dA/dA' = N₀^α, dA/dα = A·ln N₀
    grad = np.array([n0 ** alpha, a * math.log(n0)])
    sub = cov[np.ix_([1, 2], [1, 2])]
    return {'identifiable': True, 'E': e, 'A': a, 'alpha': alpha, 'E_se': float(math.sqrt(cov[0, 0])),
            'A_se': float(math.sqrt(grad @ sub @ grad)), 'alpha_se': float(math.sqrt(cov[2, 2])),
            'sizes': len(sizes), 'points': len(pts)}


def reach(x, loss, target):
    """The x (tokens, FLOPs or seconds) at which a curve of points (x_i, loss_i), x increasing, first reaches
    loss <= target: between the last point above and the first at or below, linearly interpolated,
    x = x_{i−1} + (x_i − x_{i−1})·(loss_{i−1} − target)/(loss_{i−1} − loss_i). None if it never does."""
    for i, (xi, li) in enumerate(zip(x, loss)):
        if li <= target:
            if i == 0:
                return float(xi)
            x0, l0 = x[i - 1], loss[i - 1]
            return float(x0 + (xi - x0) * (l0 - target) / (l0 - li))
    return None


def loss_at(x, loss, budget):
    """The loss of a curve at x = budget, linearly interpolated between its points; past its last point, its last
    loss (the run ended before the budget: it cannot be credited with training it did not do)."""
    if budget >= x[-1]:
        return float(loss[-1])
    return float(np.interp(budget, x, loss))


def choose_rate(losses):
    """losses: {rate: [final loss per seed, None for a run that failed]}. The rate whose mean over seeds is lowest (a
    rate with a failed seed counts as a failure, never a choice unless every rate failed); 'edge': 'low' or 'high'
    when that is the smallest or largest rate tried (the optimum may lie beyond), else None."""
    mean = {r: statistics.fmean(v) if v and None not in v and all(map(math.isfinite, v)) else math.inf
            for r, v in losses.items()}
    rates = sorted(mean)
    best = min(rates, key=lambda r: (mean[r], r))
    edge = None if len(rates) < 2 else 'low' if best == rates[0] else 'high' if best == rates[-1] else None
    return {'best': best, 'edge': edge, 'mean': {repr(r): m for r, m in mean.items()}}


def compute_for_loss(fit, loss):
    """The training compute at which a fitted law L(C) = E + A·C^(−α) reaches `loss`: (A / (loss − E))^(1/α), or
    inf where loss is at or below its floor E."""
    return (fit['A'] / (loss - fit['E'])) ** (1 / fit['alpha']) if loss > fit['E'] else math.inf


def compute_multiplier(base_points, var_points, budget, n_boot=1000, seed=0):
    """The effective compute multiplier of a variant (Marin's "effective speedup" before time): with the baseline's
    loss-vs-compute law L_b(C) = E + A·C^(−α) fitted over its sizes, a variant that reaches loss L_v with compute C_v
    is worth C_b(L_v) / C_v, the compute the baseline needs for that loss over what the variant used (> 1: the
    variant is worth that much more compute). Per size, from the variant's mean loss; and at `budget` (a compute past
    the ladder), from the variant's own fitted law L_v(budget). Points: [(compute, [loss per seed])] per size, seeds
    in the same order for both (seed i trained on the same batches). The intervals resample seeds, paired across
    sizes and variants (a bootstrap, Efron 1979), widened to a t interval (so 2 seeds give a wide one, honestly).
    None where a fit is not identifiable."""
    def multipliers(pick):
        b = [(c, statistics.fmean([ls[i] for i in pick])) for c, ls in base_points]
        v = [(c, statistics.fmean([ls[i] for i in pick])) for c, ls in var_points]
        fb, fv = power_law_fit(*zip(*b)), power_law_fit(*zip(*v))
        if not (fb['identifiable'] and fv['identifiable']):
            return None
        at = [compute_for_loss(fb, loss) / c for c, loss in v]
        return at + [compute_for_loss(fb, power_law(budget, fv['E'], fv['A'], fv['alpha'])) / budget]

    n_seeds = min(len(ls) for _, ls in base_points + var_points)
    point = multipliers(list(range(n_seeds)))
    if point is None:
        return None
    # the interval: the spread of ln(multiplier) over seed resamples, as a standard error, widened to a t interval
    # with n_seeds − 1 degrees of freedom (a plain percentile bootstrap of 2-4 seeds covers far less than 95%)
    rng = np.random.default_rng(seed)
    boots = np.log([m for m in (multipliers(list(rng.integers(0, n_seeds, n_seeds))) for _ in range(n_boot)) if m])
    finite = lambda x: float(x) if x is not None and math.isfinite(x) else None  # inf: below the baseline's floor
    out = []
    for k, m in enumerate(point):
        col = boots[:, k] if len(boots) > 1 and n_seeds > 1 else np.array([])
        col = col[np.isfinite(col)]
        if len(col) < 2 or not math.isfinite(m):
            out.append({'multiplier': finite(m), 'ci': None})
            continue
        half = stats.t.ppf(0.5 + CONFIDENCE / 2, n_seeds - 1) * col.std(ddof=1) * math.sqrt(n_seeds / (n_seeds - 1))
        out.append({'multiplier': finite(m), 'ci': [math.exp(math.log(m) - half), math.exp(math.log(m) + half)]})
    return {'per_size': out[:-1], 'at_budget': {**out[-1], 'compute': budget}, 'seeds': n_seeds, 'bootstrap': len(boots)}
