"""The statistics behind the verdicts of compare.py and ladder.py, from scipy rather than hand-typed tables. Every
function takes plain lists and returns plain JSON-able values (None where a number cannot be had)."""
import math
import statistics

import numpy as np
from scipy import optimize, stats

CONFIDENCE = 0.95  # c: every interval and test here is two-sided at this level
MIN_FIT_SIZES = 4  # E, A and α are 3 parameters: fewer than 4 sizes leave no degree of freedom to judge the fit


def t_quantile(dof):
    """t_{(1+c)/2, dof}: the half-width of a two-sided t interval, in standard errors."""
    return stats.t.ppf(0.5 + CONFIDENCE / 2, dof)


def paired(diffs):
    """Mean and std of per-seed paired differences d_i; t = mean / (std / √n) and its two-sided p (Student's t, n−1
    dof: scipy.stats.ttest_1samp); the CI mean ± t_{(1+c)/2, n−1}·std/√n; `resolved`: the CI excludes 0 (p < 1 − c)."""
    d = [float(v) for v in diffs if v is not None and math.isfinite(v)]
    if not d:
        return None
    n, mean = len(d), float(np.mean(d))
    spread = max(d) > min(d)  # equal values have a std of float rounding, which no test should read
    std = (float(np.std(d, ddof=1)) if spread else 0.0) if n > 1 else None
    out = dict(mean=mean, std=std, min=min(d), max=max(d), n=n, t=None, p=None, ci=None, resolved=False)
    if not spread:  # one seed, or no spread: nothing to test
        return out
    test = stats.ttest_1samp(d, 0.0)
    half = t_quantile(n - 1) * std / math.sqrt(n)
    out.update(t=float(test.statistic), p=float(test.pvalue), ci=[float(mean - half), float(mean + half)],
               resolved=bool(test.pvalue < 1 - CONFIDENCE))
    return out


def holm(p_values):
    """Holm's step-down correction (Holm 1979) of p-values tested together: the k-th smallest of m times (m − k + 1),
    never below a smaller one's, at most 1; None (no test) stays None. An adjusted p below 1 − c holds with the whole
    family at once: the chance of any false 'resolved' among them is at most 1 − c, not 1 − c for each."""
    ranked = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    out, running = [None] * len(p_values), 0.0
    for k, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - k) * p))
        out[i] = running
    return out


def bootstrap_ci(values):
    """A percentile bootstrap CI of the mean (scipy.stats.bootstrap, Efron 1979); None with fewer than 2 values or
    no spread. Seeded, so the same values always give the same interval."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) < 2 or np.ptp(v) == 0:
        return None
    res = stats.bootstrap((v,), np.mean, confidence_level=CONFIDENCE, n_resamples=2000, method='percentile',
                          rng=np.random.default_rng(0))
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def gap_trend(log_n, gaps):
    """The trend of a gap Δ with size: the least-squares line Δ = a + b·ln N (scipy.stats.linregress), the slope's CI
    b ± t_{(1+c)/2, m−2}·SE(b) from the scatter of its m points about the line. With 3+ sizes the points are the
    sizes' mean gaps (ln N_j, Δ̄_j): a size's seeds share whatever the line misses there, so as points of their own
    they would narrow the CI (a gap that steps with size would read as a trend). With 2 sizes the line meets both
    means, and every seed's gap (ln N_j, Δ_ij) is a point: the seeds' spread is the noise. 'rises' when the whole CI is
    above 0 (Δ rises with N), 'falls' when below, else 'flat within noise'. Needs 2 sizes and 3 points; else None."""
    pts = [(float(x), float(g)) for x, g in zip(log_n, gaps) if g is not None and math.isfinite(g)]
    by_size = {}
    for x, g in pts:
        by_size.setdefault(x, []).append(g)
    if len(by_size) < 2 or len(pts) < 3:
        return None
    if len(by_size) >= 3:
        pts = [(x, statistics.fmean(g)) for x, g in by_size.items()]
    fit = stats.linregress(*np.array(pts).T)
    half = t_quantile(len(pts) - 2) * fit.stderr
    lo, hi = fit.slope - half, fit.slope + half
    verdict = 'rises' if lo > 0 else 'falls' if hi < 0 else 'flat within noise'
    return {'slope_per_ln_n': float(fit.slope), 'ci': [float(lo), float(hi)], 'stderr': float(fit.stderr),
            'points': len(pts), 'verdict': verdict}


def power_law(n, e, a, alpha):
    return e + a * np.power(n, -alpha)


def fit_without_e(x, y, a1, alpha):
    """The least-squares A'·x^(−α) (E = 0) from (a1, alpha): ((A', α), its covariance), or None where it fails."""
    try:
        q, cov = optimize.curve_fit(lambda t, a, b: power_law(t, 0.0, a, b), x, y, p0=[a1, alpha],
                                    bounds=([0, 0], [np.inf, 5]), maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    return ((float(q[0]), float(q[1])), cov) if np.all(np.isfinite(cov)) else None


def power_law_fit(n, loss):
    """Fit L(N) = E + A·N^(−α) (Kaplan et al. 2020; Hoffmann et al. 2022 add the irreducible E) by least squares
    (scipy.optimize.curve_fit) to every (N, loss) point, seeds included, as E + A'·(N/N₀)^(−α) with N₀ the sizes'
    geometric mean (well conditioned), then A = A'·N₀^α; standard errors from the fit's covariance, A's by the delta
    method. Where E lands on its bound 0 (the sizes show no irreducible loss), that covariance, which assumes an inner
    optimum, is none: E has no standard error (None), and A's and α's are those given E = 0, of the two-parameter
    fit A·N^(−α) (Kaplan et al.'s form).
    {'identifiable': False, 'why'} with fewer than MIN_FIT_SIZES sizes or no converged, determined fit."""
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
    sse = lambda *q: float(np.sum((power_law(x / n0, *q) - y) ** 2))
    # E on its bound 0, or held just above it by the solver (trf stays inside its bounds) while the squared error still
    # falls towards it (the residuals' sum is half its slope in E): where A·N^(−α) fits as well, that is the law, and
    # its covariance the one that means something (E: no standard error)
    if ((e <= 1e-9 * y.min() or np.sum(power_law(x / n0, *p) - y) > 0)
            and (law := fit_without_e(x / n0, y, a1, alpha)) and sse(0.0, *law[0]) <= sse(*p) * (1 + 1e-9)):
        e, (a1, alpha), cov = 0.0, law[0], np.pad(law[1], ((1, 0), (1, 0)), constant_values=np.nan)
    a = a1 * n0 ** alpha
    # delta method for A = A'·N₀^α: dA/dA' = N₀^α, dA/dα = A·ln N₀
    grad = np.array([n0 ** alpha, a * math.log(n0)])
    return {'identifiable': True, 'E': e, 'A': a, 'alpha': alpha, 'E_se': None if np.isnan(cov[0, 0]) else
            float(math.sqrt(cov[0, 0])),
            'A_se': float(math.sqrt(grad @ cov[1:, 1:] @ grad)), 'alpha_se': float(math.sqrt(cov[2, 2])),
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
    return float(loss[-1]) if budget >= x[-1] else float(np.interp(budget, x, loss))


def choose_rate(losses):
    """losses: {rate: [final loss per seed, None for a run that failed]}. The one-standard-error rule (Breiman et al.
    1984, "Classification and Regression Trees"): find the rate of lowest mean over seeds, then step down to smaller
    rates while their mean stays within one standard error of that lowest mean (SE = std/√n over its seeds), stopping at
    the first that is not (glmnet's lambda.1se takes the furthest within, past any outside): rates within the seed noise
    of each other are tied, and the tie goes to the smaller, more stable one. A rate with a failed seed is a failure,
    never a choice unless every rate failed. Returns 'best' (the chosen rate); 'lowest' (the rate of lowest mean);
    'edge': 'low' when the choice is the smallest rate tried, 'high' when the lowest mean is at the largest (the optimum
    may lie beyond), 'low and high' when the rule stepped from the largest to the smallest, else None; 'margin': how
    decisive the choice was, the gap from its mean to the next best rate's in the rule's unit, the lowest mean's
    standard errors (> 0: it won outright; −1 to 0: it won a tie); and 'mean' and 'se' per rate, None for a failure."""
    ok = lambda v: v and None not in v and all(map(math.isfinite, v))
    mean = {r: statistics.fmean(v) if ok(v) else math.inf for r, v in losses.items()}
    se = {r: statistics.stdev(v) / math.sqrt(len(v)) if ok(v) and len(v) > 1 else None for r, v in losses.items()}
    rates = sorted(mean)
    lowest = min(rates, key=lambda r: (mean[r], r))
    best = lowest
    while (i := rates.index(best)) > 0 and se[lowest] is not None and mean[rates[i - 1]] <= mean[lowest] + se[lowest]:
        best = rates[i - 1]
    edge = ' and '.join(e for e, at in (('low', best == rates[0]), ('high', lowest == rates[-1])) if at) or None
    edge = edge if len(rates) > 1 else None
    others = [mean[r] for r in rates if r != best and mean[r] < math.inf]
    margin = (min(others) - mean[best]) / se[lowest] if others and se[lowest] and mean[best] < math.inf else None
    return {'best': best, 'lowest': lowest, 'edge': edge, 'margin': margin,
            'mean': {repr(r): m if m < math.inf else None for r, m in mean.items()}, 'se': {repr(r): se[r] for r in rates}}


def compute_for_loss(fit, loss):
    """The training compute at which a fitted law L(C) = E + A·C^(−α) reaches `loss`: (A / (loss − E))^(1/α), or
    inf where loss is at or below its floor E."""
    try:
        return (fit['A'] / (loss - fit['E'])) ** (1 / fit['alpha']) if loss > fit['E'] else math.inf
    except OverflowError:  # a nearly flat law: beyond any float
        return math.inf


def compute_multiplier(base_points, var_points, budget, n_boot=1000):
    """The effective compute multiplier of a variant (Marin's "effective speedup" before time): with the baseline's
    law L_b(C) = E + A·C^(−α) fitted over its sizes, a variant reaching loss L_v with compute C_v is worth
    C_b(L_v) / C_v (> 1: worth that much more compute). Per size, L_v = L_b(C_b) + the mean paired gap L_v − L_b
    there: the law gives the rate at which compute buys loss, the runs the gap, so the law's miss of the baseline's own
    mean at a size cancels (the baseline against itself is exactly 1), and its interval is the gap's t interval (paired)
    through the law, so it leaves out 1 where the paired test resolves the gap. At `budget`, from the variant's own
    fitted law, L_v(budget). Points: [(compute, [loss per seed])] per size, seed i the same batches for both; None
    where a fit is not identifiable."""
    def fits(pick):  # both laws, fitted to the mean losses of the seeds `pick`
        b, v = ([(c, statistics.fmean([ls[i] for i in pick])) for c, ls in points]
                for points in (base_points, var_points))
        fb, fv = power_law_fit(*zip(*b)), power_law_fit(*zip(*v))
        return (fb, fv) if fb['identifiable'] and fv['identifiable'] else None

    worth = lambda fb, loss, c: compute_for_loss(fb, loss) / c
    n_seeds = min(len(ls) for _, ls in base_points + var_points)
    if (laws := fits(range(n_seeds))) is None:
        return None
    fb, fv = laws
    finite = lambda x: float(x) if math.isfinite(x) else None  # inf: a loss below the baseline's floor E
    per_size = []
    for (cb, lb), (cv, lv) in zip(base_points, var_points):
        on_law, gap = power_law(cb, fb['E'], fb['A'], fb['alpha']), paired([v - b for v, b in zip(lv, lb)][:n_seeds])
        # the gap's interval through the law: its larger end is the smaller multiplier
        ends = [float(worth(fb, on_law + g, cv)) for g in reversed(gap['ci'])] if gap['ci'] else []
        per_size.append({'multiplier': finite(worth(fb, on_law + gap['mean'], cv)),
                         'ci': ends if ends and all(map(math.isfinite, ends)) else None})
    # at the budget: ln(multiplier)'s spread over seed resamples paired across sizes and variants (a bootstrap, Efron
    # 1979) as a standard error, widened to a t interval with n_seeds − 1 dof (a percentile one of 2-4 seeds is narrow)
    at = lambda fb, fv: worth(fb, power_law(budget, fv['E'], fv['A'], fv['alpha']), budget)
    m, rng = at(fb, fv), np.random.default_rng(0)
    boots = np.log([at(*f) for f in (fits(list(rng.integers(0, n_seeds, n_seeds))) for _ in range(n_boot)) if f])
    boots = boots[np.isfinite(boots)]
    ci = None
    if len(boots) > 1 and n_seeds > 1 and math.isfinite(m):
        half = t_quantile(n_seeds - 1) * boots.std(ddof=1) * math.sqrt(n_seeds / (n_seeds - 1))
        ci = [math.exp(math.log(m) - half), math.exp(math.log(m) + half)]
    return {'per_size': per_size, 'at_budget': {'multiplier': finite(m), 'ci': ci, 'compute': budget},
            'seeds': n_seeds, 'bootstrap': len(boots)}
