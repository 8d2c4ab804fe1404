"""The decisions a comparison makes, each asserted on its own, fast (no training): which rate the one-standard-error
rule picks, what the fingerprint behind tuned_at holds, the learning rate and min_lr every planned run gets, which
rates are refused, how many rounds --plan lists, when the live loss.png is redrawn, how runs are placed on 1 to 8
(fake) GPUs, which process state a resume loads, and which settings a run's checks accept or refuse, in which
sentence. Each would fail if a developer broke that decision."""
import math
import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compare  # noqa: E402
import configurator  # noqa: E402
import train  # noqa: E402
from activations import BASIS, VARIANTS  # noqa: E402
from comparison import placement, report, runs, stats  # noqa: E402
from machinery.cli import UserError  # noqa: E402


# ----------------------------------------------------------------------------------------------------------------------
# the one-standard-error rule

def seeds_of(mean, se, n=4):
    """n losses of exactly this mean whose standard error (std/√n) is se: mean ± se·√n·√((n−1)/n) alternately."""
    d = se * math.sqrt(n - 1)
    return [mean + d if i % 2 else mean - d for i in range(n)]


def test_a_staircase_of_means_steps_down_only_within_one_standard_error_of_the_lowest():
    """Means falling by 0.1 a rate: with the lowest's SE 0.15 the rule steps one rate down (0.1 ≤ 0.15), not two
    (0.2 > 0.15, measured from the lowest mean, never from the rate stepped to); with SE 0.05 it stays."""
    means = {1e-3: 2.3, 2e-3: 2.2, 4e-3: 2.1, 8e-3: 2.0}
    wide = {r: seeds_of(m, 0.15) for r, m in means.items()}
    choice = stats.choose_rate(wide)
    assert (choice['lowest'], choice['best'], choice['edge']) == (8e-3, 4e-3, 'high')
    assert choice['mean'] == {repr(r): pytest.approx(m) for r, m in means.items()}
    assert choice['se'][repr(8e-3)] == pytest.approx(0.15)
    narrow = {r: seeds_of(m, 0.05) for r, m in means.items()}
    choice = stats.choose_rate(narrow)
    assert (choice['lowest'], choice['best'], choice['edge']) == (8e-3, 8e-3, 'high')
    assert choice['margin'] == pytest.approx(0.1 / 0.05)  # the next best mean, in the choice's standard errors
    # the staircase the other way: the lowest mean at the smallest rate is the choice, an edge at the low end
    falling = {r: seeds_of(4.3 - m, 0.05) for r, m in means.items()}
    assert stats.choose_rate(falling)['best'] == 1e-3 and stats.choose_rate(falling)['edge'] == 'low'
    # a flat staircase: the lowest mean at the largest rate, every smaller one within its SE: both ends are edges
    flat = {r: seeds_of(2.0 + (8e-3 - r) * 10, 0.15) for r in means}
    choice = stats.choose_rate(flat)
    assert (choice['lowest'], choice['best'], choice['edge']) == (8e-3, 1e-3, 'low and high')
    # an interior optimum within reach of both neighbours: the smaller neighbour, never the larger
    u = {1e-3: seeds_of(2.5, 0.05), 2e-3: seeds_of(2.04, 0.05), 4e-3: seeds_of(2.0, 0.05), 8e-3: seeds_of(2.02, 0.05)}
    choice = stats.choose_rate(u)
    assert (choice['lowest'], choice['best'], choice['edge']) == (4e-3, 2e-3, None)
    assert choice['margin'] == pytest.approx((2.0 - 2.04) / 0.05)  # < 0: it won a tie


def test_a_mean_exactly_one_standard_error_above_the_lowest_is_within_it():
    low = seeds_of(2.0, 0.1)
    first = stats.choose_rate({4e-3: low})
    edge = first['mean'][repr(4e-3)] + first['se'][repr(4e-3)]
    assert stats.choose_rate({2e-3: [edge], 4e-3: low})['best'] == 2e-3  # one seed: its mean is exactly edge
    assert stats.choose_rate({2e-3: [math.nextafter(edge, 3.0)], 4e-3: low})['best'] == 4e-3


def test_tied_means_go_to_the_smaller_rate_and_a_single_rate_is_the_choice():
    tie = {2e-3: seeds_of(2.0, 0.0), 4e-3: seeds_of(2.0, 0.0), 8e-3: seeds_of(2.5, 0.0)}
    choice = stats.choose_rate(tie)
    assert choice['lowest'] == choice['best'] == 2e-3 and choice['edge'] == 'low'
    for losses in ({4e-3: seeds_of(2.0, 0.1)}, {4e-3: [2.0]}):
        choice = stats.choose_rate(losses)
        assert (choice['best'], choice['lowest'], choice['edge'], choice['margin']) == (4e-3, 4e-3, None, None)
    # one seed each: no standard error, so no step down from the lowest mean however close
    assert stats.choose_rate({2e-3: [2.0001], 4e-3: [2.0]})['best'] == 4e-3


@pytest.mark.parametrize('failure', [None, math.nan, math.inf])
def test_a_rate_with_a_diverged_seed_is_never_chosen_unless_every_rate_failed(failure):
    losses = {2e-3: seeds_of(2.2, 0.05), 4e-3: [1.5, failure, 1.5, 1.5], 8e-3: seeds_of(2.1, 0.05)}
    choice = stats.choose_rate(losses)
    assert choice['best'] == choice['lowest'] == 8e-3 and choice['edge'] == 'high'
    assert choice['mean'][repr(4e-3)] is None and choice['se'][repr(4e-3)] is None  # JSON has no Infinity
    assert choice['margin'] == pytest.approx((2.2 - 2.1) / 0.05)  # to the next best finished rate, not the failure
    # a failure within the SE of the lowest is not stepped to
    losses = {2e-3: [None], 4e-3: seeds_of(2.0, 0.1)}
    assert stats.choose_rate(losses)['best'] == 4e-3
    # every rate failed: the smallest, flagged at the low edge, with no margin
    choice = stats.choose_rate({2e-3: [failure], 4e-3: [], 8e-3: [1.0, failure]})
    assert (choice['best'], choice['edge'], choice['margin']) == (2e-3, 'low', None)
    assert choice['mean'] == dict.fromkeys(map(repr, (2e-3, 4e-3, 8e-3)))


def test_two_seeds_give_a_standard_error_and_two_rates_an_edge():
    choice = stats.choose_rate({2e-3: seeds_of(2.05, 0.1, n=2), 4e-3: seeds_of(2.0, 0.1, n=2)})
    # tied: the lowest mean at the larger rate, the choice the smaller, so both ends are edges
    assert choice['se'][repr(4e-3)] == pytest.approx(0.1) and (choice['best'], choice['edge']) == (2e-3, 'low and high')
    choice = stats.choose_rate({2e-3: seeds_of(2.2, 0.1, n=2), 4e-3: seeds_of(2.0, 0.1, n=2)})
    assert (choice['best'], choice['edge']) == (4e-3, 'high')


def test_the_choice_alone_at_finite_means_has_no_margin():
    """Nothing else finished: no next best to measure the margin against."""
    choice = stats.choose_rate({2e-3: [None, 1.0], 4e-3: seeds_of(2.0, 0.1)})
    assert choice['best'] == 4e-3 and choice['margin'] is None


# ----------------------------------------------------------------------------------------------------------------------
# what a run is (identity), and the settings its tuned rate holds for (tuning_key, tuned_at)

# the settings table's classification, pinned where a slip would go unseen: where a run lives, how it starts, its
# threads, compile and MFU's peak, and its experiment tracking are not what it is; a tuned rate holds whatever the
# variant, seed and rate (min_lr as its ratio) and how often a run is evaluated, but not across eval_iters, which
# splits the windows into the half a sweep chooses on and the half a comparison reports; what sets the global batch is
# tuned at
NOT_IDENTIFYING = {'out_dir', 'data_dir', 'init_from', 'overwrite', 'compile', 'compile_mode', 'peak_flops', 'threads'}
NOT_TUNED = {'ffn', 'seed', 'learning_rate', 'min_lr', 'device', 'eval_interval', 'log_interval',
             'always_save_checkpoint'}
GLOBAL_BATCH = ('gradient_accumulation_steps', 'batch_size', 'block_size')  # and nproc_per_run, compare.py's
IDENTIFYING, TUNED = configurator.keys_that('id'), configurator.keys_that('tune')


def another(value):
    """A different value of the same type."""
    if value is None or isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1
    return value + 'x'


def test_the_table_classifies_what_a_run_is_and_what_its_rate_is_tuned_at():
    assert set(configurator.DEFAULTS) - set(IDENTIFYING) == NOT_IDENTIFYING | {
        k for k in configurator.DEFAULTS if k.startswith('wandb_')}
    assert set(IDENTIFYING) - set(TUNED) == NOT_TUNED and set(TUNED) <= set(IDENTIFYING)
    assert set(GLOBAL_BATCH) <= set(TUNED)


@pytest.mark.parametrize('key', list(configurator.DEFAULTS))
def test_what_a_run_is_holds_every_setting_that_makes_it(key):
    cfg = dict(compare.DEFAULTS)
    changed = runs.identity({**cfg, key: another(cfg[key])}, 1) != runs.identity(cfg, 1)
    assert changed == (key in IDENTIFYING)


def test_what_a_run_is_holds_its_processes_and_train_pys_defaults():
    assert runs.identity({}, 2) == {**{k: configurator.DEFAULTS[k] for k in IDENTIFYING}, 'processes': 2}
    assert runs.identity({}, 2) != runs.identity({}, 1)


@pytest.mark.parametrize('key', list(compare.DEFAULTS))
def test_the_fingerprint_of_tuned_rates_changes_with_every_setting_they_were_tuned_at(key):
    """Each setting a tuned rate depends on changes the fingerprint (the global batch among them, nproc_per_run too);
    the variant, seed, where and how often a run is evaluated, and compare.py's other keys do not. learning_rate moved with
    min_lr at its ratio (at_rate) leaves it; either alone changes that ratio, which a schedule is tuned at."""
    cfg = dict(compare.DEFAULTS)
    here = runs.tuning_key(cfg)
    assert len(here) == 12 and int(here, 16) >= 0
    if key == 'learning_rate':
        assert runs.tuning_key({**cfg, **runs.at_rate(cfg, 3 * cfg[key])}) == here
    changed = runs.tuning_key({**cfg, key: another(cfg[key])}) != here
    assert changed == (key in TUNED or key in ('nproc_per_run', 'learning_rate', 'min_lr'))


def test_the_shipped_tuned_at_is_the_default_comparisons_fingerprint():
    cfg = compare.settings([])
    assert runs.tuning_key(cfg) == cfg['tuned_at']
    assert runs.tuning_key({**cfg, 'learning_rate': 0.0}) != cfg['tuned_at']  # no ratio at a rate of 0


# ----------------------------------------------------------------------------------------------------------------------
# the learning rate and min_lr of every planned run

def planned(tmp_path, data_dir, *argv):
    cfg = compare.settings([f'--out_dir={tmp_path}', f'--data_dir={data_dir}', '--min_lr=5e-4', *argv])
    return cfg, compare.check_comparison(cfg)


def assert_at(run, lr, cfg):
    assert run.settings['learning_rate'] == pytest.approx(lr, rel=1e-12)
    assert run.settings['min_lr'] == pytest.approx(lr * cfg['min_lr'] / cfg['learning_rate'], rel=1e-12)


def test_every_planned_run_at_a_tuned_rate_has_its_rate_and_min_lr_at_the_shared_ratio(tmp_path, shakespeare_char_dir):
    """learning_rate 2e-3 and min_lr 5e-4 (a ratio of 1/4): a variant's own rate, a tuned one where tuned_at holds,
    else the shared one; each run's min_lr a quarter of its rate, so that its schedule is the one its sweep tuned."""
    argv = ['--variants=gelu@3e-3,relu2,swiglu,la', '--tuned_lrs=relu2@4e-3,swiglu@6e-3,gelu@1e-2', '--seeds=2']
    cfg, _ = planned(tmp_path, shakespeare_char_dir, *argv)
    key = runs.tuning_key(cfg)
    cfg, comp = planned(tmp_path, shakespeare_char_dir, *argv, f'--tuned_at={key}')
    want = {'gelu': 3e-3, 'relu2': 4e-3, 'swiglu': 6e-3, 'la': None}
    assert comp['rates'] == want and 'la runs untuned' in comp['untuned']
    grid = compare.grid_runs(cfg, comp)
    assert sorted((r.variant, r.seed) for r in grid) == sorted((v, s) for v in want for s in (1340, 1341))
    for r in grid:
        assert_at(r, want[r.variant] or 2e-3, cfg)
        assert r.lr == want[r.variant] and r.settings['ffn'] == r.variant and r.settings['seed'] == r.seed
    # tuned at other settings: each variant without its own rate runs at the shared rate and min_lr
    cfg, comp = planned(tmp_path, shakespeare_char_dir, *argv, f'--tuned_at={key}', '--batch_size=8')
    assert comp['rates'] == {'gelu': 3e-3, 'relu2': None, 'swiglu': None, 'la': None}
    for r in compare.grid_runs(cfg, comp):
        assert_at(r, 3e-3 if r.variant == 'gelu' else 2e-3, cfg)


def test_every_run_of_a_sweep_its_extension_and_its_verdict_keeps_the_min_lr_ratio(tmp_path, shakespeare_char_dir):
    cfg, comp = planned(tmp_path, shakespeare_char_dir, '--variants=gelu,relu2', '--lrs=1e-3,2e-3,4e-3', '--seeds=2')
    assert comp['grid'] == [1e-3, 2e-3, 4e-3] and comp['fresh_seeds'] == [1342, 1343]
    grid = compare.grid_runs(cfg, comp)
    assert sorted({(r.variant, r.lr) for r in grid}) == [(v, lr) for v in ('gelu', 'relu2') for lr in comp['grid']]
    for r in grid:
        assert_at(r, r.lr, cfg)
        assert r.dir == os.path.join(str(tmp_path), r.variant, f'lr{r.lr:.3g}', f'seed{r.seed}')
    verdict = compare.verdict_specs(cfg, comp, {'gelu': {'best': 4e-3}, 'relu2': {'best': 1e-3}})
    assert [(s['variant'], s['seed'], s['lr']) for s in verdict] == [
        ('gelu', 1342, 4e-3), ('gelu', 1343, 4e-3), ('relu2', 1342, 1e-3), ('relu2', 1343, 1e-3)]
    for s in verdict:
        assert s['settings']['min_lr'] == pytest.approx(s['lr'] / 4)
    # --lr_extend: gelu's lowest mean at the largest rate, relu2's at the smallest; one grid step beyond each
    finished = lambda r, loss: types.SimpleNamespace(variant=r.variant, lr=r.lr, state='done', final=lambda of: loss)
    done = [finished(r, 3 - r.lr * 100 if r.variant == 'gelu' else 2 + r.lr * 100 + 0.001 * r.seed) for r in grid]
    more = compare.beyond_edges(cfg, comp, done)
    assert sorted((r.variant, r.lr, r.seed) for r in more) == [('gelu', 8e-3, 1340), ('gelu', 8e-3, 1341),
                                                                ('relu2', 5e-4, 1340), ('relu2', 5e-4, 1341)]
    for r in more:
        assert_at(r, r.lr, cfg)
    # MAX_EXTEND steps beyond an edge already: no more
    far = [finished(types.SimpleNamespace(variant='gelu', lr=4e-3 * 2 ** k), 3 - k) for k in range(4)]
    assert compare.beyond_edges(cfg, {**comp, 'variants': ['gelu']}, far) == []
    # the rule stepped from the largest rate down to the smallest: a step beyond each end
    flat = [finished(r, 2 - r.lr / 10 + 0.01 * (r.seed - 1340)) for r in grid if r.variant == 'gelu']
    both = compare.beyond_edges(cfg, {**comp, 'variants': ['gelu']}, flat)
    assert sorted({r.lr for r in both}) == [5e-4, 8e-3]
    # a run of relu2 not finished: only gelu is extended
    pending = [*done[:-1], types.SimpleNamespace(**{**vars(done[-1]), 'state': 'resume'})]
    assert done[-1].variant == 'relu2' and {r.variant for r in compare.beyond_edges(cfg, comp, pending)} == {'gelu'}


def test_a_run_at_a_rate_is_named_by_it_and_one_at_the_shared_rate_keeps_the_settings():
    cfg = {**compare.DEFAULTS, 'learning_rate': 2e-3, 'min_lr': 5e-4, 'out_dir': 'o'}
    shared = runs.make_run(cfg, 'polyrelu:poly_order=2', 7)
    assert shared['settings'] == {**{k: cfg[k] for k in configurator.DEFAULTS}, 'ffn': 'polyrelu', 'poly_order': 2,
                                  'seed': 7, 'out_dir': os.path.join('o', 'polyrelu:poly_order=2', 'seed7')}
    assert (shared['lr'], shared['processes'], shared['name']) == (None, 1, 'polyrelu:poly_order=2 seed 7')
    at = runs.make_run({**cfg, 'nproc_per_run': 2}, 'gelu', 7, 4e-3)
    assert at['settings']['learning_rate'] == 4e-3 and at['settings']['min_lr'] == pytest.approx(1e-3)
    assert at['dir'] == os.path.join('o', 'gelu', 'lr0.004', 'seed7') and at['processes'] == 2
    assert at['name'] == 'gelu seed 7 lr 0.004'
    assert runs.at_rate({'learning_rate': 0.0, 'min_lr': 1e-4}, 4e-3) == {'learning_rate': 4e-3, 'min_lr': 1e-4}
    same = runs.at_rate({'learning_rate': 3e-3, 'min_lr': 3e-3}, 7e-4)  # 3e-3 * 7e-4 / 3e-3 rounds above 7e-4
    assert same == {'learning_rate': 7e-4, 'min_lr': 7e-4}  # not above the rate, which its run would refuse
    tracked = runs.make_run({**cfg, 'wandb_log': True, 'wandb_tags': 'a,b'}, 'gelu', 7, 4e-3)['settings']
    assert (tracked['wandb_group'], tracked['wandb_run_name'], tracked['wandb_tags']) == (
        'o', 'gelu-seed7-lr0.004', 'a,b,gelu,seed7')
    named = runs.make_run({**cfg, 'wandb_log': True, 'wandb_group': 'g', 'wandb_run_name': 'r'}, 'gelu', 7)['settings']
    assert (named['wandb_group'], named['wandb_run_name'], named['wandb_tags']) == ('g', 'r-gelu-seed7', 'gelu,seed7')


# ----------------------------------------------------------------------------------------------------------------------
# rates refused at their edges, each in one sentence

BAD_RATES = ['0', '-1e-3', '-0', 'inf', '-inf', 'nan', '', 'abc', '1e999']
REFUSED = ([(['--variants=gelu,relu2@' + r], "'relu2@" + r + "' carries no rate") for r in BAD_RATES]
           + [(['--tuned_lrs=gelu@8e-3,relu2@' + r], "'relu2@" + r + "' carries no rate") for r in BAD_RATES]
           + [(['--tuned_lrs=gelu@8e-3,relu2'], "'relu2' carries no rate"),
              (['--tuned_lrs=@8e-3'], "unknown ffn ''"), (['--variants=@8e-3'], "unknown ffn ''"),
              (['--variants=gelu@8e-3@1'], 'unknown'), (['--variants=gelu@8e-3,gelu@4e-3'], 'names gelu twice'),
              (['--tuned_lrs=gelu@8e-3,gelu@4e-3'], 'names gelu twice')]
           + [([f'--lrs={r},2e-3', '--learning_rate=2e-3'], 'finite and above 0') for r in ('0', '-1e-3', 'inf', 'nan')]
           + [(['--lrs=abc,2e-3'], 'comma-separated numbers'), (['--lrs=1e-3,4e-3'], 'must include learning_rate'),
              (['--lr_grid=-1'], 'between 0 and 10'), ([f'--lr_grid={compare.MAX_GRID + 1}'], 'between 0 and 10'),
              (['--lr_grid=2', '--learning_rate=0'], 'finite and above 0'),
              (['--lr_grid=2', '--learning_rate=1e308'], 'finite and above 0'),
              (['--lr_grid=2', '--lrs=2e-3'], 'give one of them'),
              # the seeds after --seed: a sweep's fresh ones too
              (['--seeds=2', '--seed=2147483647'], 'no room for the 2 seeds from it this comparison runs; give '
                                                     '--seed of at most 2147483646.'),
              (['--seed=2147483647', '--lr_grid=1'], 'no room for the 2 seeds from it this sweep runs; give --seed of '
                                                     'at most 2147483646.')])


@pytest.mark.parametrize('argv, words', REFUSED, ids=[' '.join(a) for a, _ in REFUSED])
def test_a_rate_no_run_can_take_is_refused_in_one_sentence(argv, words):
    with pytest.raises(UserError) as e:
        compare.check_comparison(compare.settings(['--seeds=1', *argv]))
    message = str(e.value)
    assert words in message and message.endswith('.') and '\n' not in message


def test_the_edges_a_run_can_take_are_accepted():
    assert runs.variant_rates('gelu@1e-300,relu2, swiglu@8e-3', 'variants') == {
        'gelu': 1e-300, 'relu2': None, 'swiglu': 8e-3}
    assert runs.variant_rates('', 'tuned_lrs') == {}
    assert compare.learning_rates({**compare.DEFAULTS, 'lr_grid': compare.MAX_GRID, 'learning_rate': 1.0}) == [
        2.0 ** j for j in range(-compare.MAX_GRID, compare.MAX_GRID + 1)]
    assert compare.learning_rates({**compare.DEFAULTS, 'lrs': '4e-3, 6e-4,6e-4', 'learning_rate': 6e-4}) == [6e-4, 4e-3]
    assert compare.learning_rates(compare.DEFAULTS) == []


# ----------------------------------------------------------------------------------------------------------------------
# --plan's rounds: the grid, each step beyond an edge, the verdict

def test_plan_rounds_count_the_grid_the_extension_steps_and_the_verdict():
    assert compare.plan_rounds(compare.DEFAULTS, {'grid': []}) == 1
    assert compare.plan_rounds({**compare.DEFAULTS, 'lr_extend': True}, {'grid': []}) == 1
    assert compare.plan_rounds(compare.DEFAULTS, {'grid': [1e-3, 2e-3]}) == 2  # the grid, then its verdict
    assert compare.plan_rounds({**compare.DEFAULTS, 'lr_extend': True}, {'grid': [1e-3, 2e-3]}) == (
        2 + 2 * compare.MAX_EXTEND)  # each edge at most MAX_EXTEND steps, one round each


# ----------------------------------------------------------------------------------------------------------------------
# the live curves

@pytest.fixture
def curves(monkeypatch, tmp_path):
    """A Curves on a clock of our own, drawing into a record: (make(comp, one_rate), clock, record)."""
    clock, record = [1000.0], types.SimpleNamespace(heads=[], pictures=[], drawn=[], lines=[], scored=[])

    def summarize(head, done, shapes, loss_of):
        assert shapes == ('shapes', [(r.variant, r.lr) for r in done], head['variants'])
        record.heads.append((head, [(r.variant, r.lr) for r in done]))
        record.scored.append(loss_of)
        return 'summary', 'by_variant'

    cfg = {**compare.DEFAULTS, 'out_dir': str(tmp_path), 'learning_rate': 2e-3, 'smooth': 0.5}
    monkeypatch.setattr(compare, 'time', types.SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(compare, 'shapes_of', lambda c, done, variants: c is cfg and (
        'shapes', [(r.variant, r.lr) for r in done], variants))
    monkeypatch.setattr(compare.report, 'summarize', summarize)
    monkeypatch.setattr(compare.report, 'table', lambda summary: f'THE TABLE of {summary}')
    monkeypatch.setattr(compare.plots, 'loss', lambda *a: record.pictures.append(a[0]) or record.drawn.append(a))
    pbar = types.SimpleNamespace(write=lambda line, file=None: record.lines.append(line if file is sys.stderr else
                                                                                  ('not on stderr', line)))
    comp = {'variants': ['gelu', 'relu2'], 'baseline': 'relu2', 'grid': [], 'rates': {'gelu': None, 'relu2': None}}

    def make(reused=(), one_rate=False, **changes):
        return compare.Curves(cfg, {**comp, **changes}, list(reused), pbar, one_rate)
    return make, clock, record


def run(variant, lr=None, state='done', seed=1):
    return types.SimpleNamespace(variant=variant, lr=lr, state=state, seed=seed)


def test_the_curves_are_drawn_at_the_first_finished_run_then_at_most_every_EVERY_seconds(curves, tmp_path):
    make, clock, record = curves
    c = make(reused=[run('gelu', state='stopped')])
    c.draw([])  # nothing finished: nothing to draw
    c.draw([run('relu2', state='resume')])
    assert record.pictures == [] and record.lines == []
    c.draw([run('gelu')])  # the first finished run: drawn at once
    assert record.pictures == [os.path.join(str(tmp_path), 'loss.png')]
    assert record.heads[0][0]['baseline'] == 'gelu' and record.heads[0][0]['rates'] == {'gelu': 2e-3}
    assert record.heads[0][0]['dataset'] == compare.DEFAULTS['dataset']
    assert record.heads[0][0]['settings'] == {'learning_rate': 2e-3}  # the shared rate, which the table tells from theirs
    assert record.drawn == [(os.path.join(str(tmp_path), 'loss.png'), 'summary', 'by_variant', 0.5)]
    assert 'THE TABLE of summary' in record.lines[0] and '1 finished run(s)' in record.lines[0]
    assert record.scored == [report.WHOLE]
    clock[0] += compare.Curves.EVERY - 0.001
    c.draw([run('gelu'), run('relu2')])
    assert len(record.pictures) == 1  # throttled
    clock[0] += 0.001
    c.draw([run('gelu'), run('relu2')])
    assert len(record.pictures) == 2 and record.heads[1][0]['baseline'] == 'relu2'
    assert record.heads[1][0]['variants'] == ['gelu', 'relu2'] and record.heads[1][0]['seeds'] == [1]


def test_a_sweeps_curves_draw_the_shared_rate_and_are_scored_on_the_report_half(curves):
    make, clock, record = curves
    c = make(one_rate=True, grid=[1e-3, 2e-3])
    c.draw([run('gelu', 1e-3), run('relu2', 1e-3)])
    assert record.pictures == []  # none at the shared rate yet
    c.draw([run('gelu', 1e-3), run('relu2', 2e-3), run('gelu', 2e-3)])
    assert [done for _, done in record.heads] == [[('relu2', 2e-3), ('gelu', 2e-3)]]
    assert record.heads[0][0]['rates'] == {'gelu': 2e-3, 'relu2': 2e-3}
    assert record.heads[0][0]['variants'] == ['gelu', 'relu2'] and record.scored == [report.REPORT_HALF]
    # at tuned rates, each variant at its own: scored on the report half too, each curve at its run's rate
    c = make(rates={'gelu': 4e-3, 'relu2': None})
    clock[0] += 1e6
    c.draw([run('gelu', 4e-3)])
    assert record.scored[-1] is report.REPORT_HALF and record.heads[-1][0]['rates'] == {'gelu': 4e-3}


def test_a_drawing_failure_says_one_line_and_never_stops_the_runs(curves, monkeypatch):
    make, clock, record = curves

    def broken(path, *a):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(compare.plots, 'loss', broken)
    c = make()
    assert c.draw([run('gelu')]) is None
    assert len(record.lines) == 1 and '\n' not in record.lines[0]
    assert record.lines[0].startswith('compare: could not draw the curves so far (OSError: ')
    clock[0] += 1e9
    c.draw([run('gelu'), run('relu2')])  # not tried again: the report draws them at the end
    assert len(record.heads) == 1 and len(record.lines) == 1


# ----------------------------------------------------------------------------------------------------------------------
# placement on 1 to 8 GPUs (fake ones: tests/fake_gpu.py)

@pytest.fixture
def cores(monkeypatch):
    def set_cores(n):
        monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(n)), raising=False)
    return set_cores


SMALL_STEP = placement.SHARE_BELOW_FLOPS / 10


@pytest.mark.parametrize('n_gpus', range(1, 9))
def test_runs_per_gpu_are_what_their_memory_with_its_cuda_context_allows(fake_gpu, cores, n_gpus):
    """90% of a GPU's memory over (a run's estimate + its CUDA context), at most MAX_SHARE, at least a core each."""
    fake_gpu(n=n_gpus, total_gib=80)
    cores(64)
    names = [str(i) for i in range(n_gpus)]
    cfg = {**compare.DEFAULTS, 'device': 'cuda'}
    total = 80 * 2**30
    for fit in (2, 5, 6, 7):
        need = 0.9 * total / (fit + 0.5) - placement.CONTEXT_BYTES
        gpus, jobs, threads, why = placement.resolve_jobs(cfg, 99, SMALL_STEP, need)
        assert (gpus, jobs, threads) == (names, fit * n_gpus, max(1, 64 // (fit * n_gpus)))
        assert f'up to {fit} per GPU' in why
    need = 0.9 * total / 1.5 - placement.CONTEXT_BYTES  # one fits: a GPU each, the environment's threads
    assert placement.resolve_jobs(cfg, 99, SMALL_STEP, need)[:3] == (names, n_gpus, 0)
    assert placement.resolve_jobs(cfg, 99, SMALL_STEP, 1)[1] == placement.MAX_SHARE * n_gpus
    assert placement.resolve_jobs({**cfg, 'threads': 3}, 99, SMALL_STEP, 1)[2] == 3  # --threads as given
    cores(2 * n_gpus)  # a core per run at least
    assert placement.resolve_jobs(cfg, 99, SMALL_STEP, 1)[1:3] == (2 * n_gpus, 1)
    cores(64)
    assert placement.resolve_jobs(cfg, 99, placement.SHARE_BELOW_FLOPS, 1)[1] == n_gpus  # a step that fills a GPU
    assert placement.resolve_jobs({**cfg, 'jobs': 5}, 99, SMALL_STEP, 1)[:3] == (names, 5, 0)


def test_the_memory_a_run_is_placed_by_is_its_estimated_peak_not_its_weights(fake_gpu, cores, monkeypatch):
    """A run of 4 layers x 256 wide, batch 32 x 512 in fp32: its activations dwarf its weights. On a GPU that holds 6
    of them by their estimate (with a CUDA context each), 6 share it, not the 8 its weights alone would allow."""
    cfg = {**compare.DEFAULTS, 'device': 'cuda', 'n_layer': 4, 'n_head': 4, 'n_embd': 256, 'batch_size': 32,
           'block_size': 512, 'dtype': 'float32', 'vocab_size': 65}
    plans = [types.SimpleNamespace(**runs.make_run(cfg, v, 1)) for v in ('gelu', 'swiglu')]
    step, need = compare.run_size(cfg, plans)
    configs = [(p.settings, runs.meta_model(p.settings, 'data').config) for p in plans]
    need_bound = max(sum(configurator.memory_needs(*c)) for c in configs)  # the weights' and the batch's
    assert need == max(placement.peak_memory(*c) for c in configs) and need > 4 * need_bound
    assert step == max(runs.meta_model(p.settings, 'data').flops_per_token() for p in plans) * 32 * 512
    fake_gpu(n=2, total_gib=(need + placement.CONTEXT_BYTES) * 6.5 / 0.9 / 2**30)
    cores(64)
    assert placement.resolve_jobs(cfg, 99, 1, need)[1] == 12


@pytest.mark.parametrize('n_gpus', range(1, 9))
def test_ddp_runs_get_disjoint_groups_of_their_processes_gpus(fake_gpu, cores, monkeypatch, n_gpus):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', ','.join(str(10 + i) for i in range(n_gpus)))
    fake_gpu(n=n_gpus)
    cores(64)
    names = [str(10 + i) for i in range(n_gpus)]
    for nproc in range(1, 9):
        cfg = {**compare.DEFAULTS, 'device': 'auto', 'nproc_per_run': nproc}
        if nproc > n_gpus:
            with pytest.raises(UserError, match=f'needs {nproc} GPUs per run but {n_gpus} are visible'):
                placement.resolve_jobs(cfg, 99, SMALL_STEP, 1)
            continue
        # a DDP run's GPUs are its own even when its step is small; one-process runs of a large step, a GPU each
        step = SMALL_STEP if nproc > 1 else placement.SHARE_BELOW_FLOPS
        gpus, jobs, threads, why = placement.resolve_jobs(cfg, 99, step, 1)
        assert (gpus, jobs, threads) == (names, n_gpus // nproc, 0)
        assert why == f"{n_gpus // nproc} at a time on GPU{'s' * (n_gpus > 1)} {','.join(names)}"
        slots = placement.slots(2 * jobs, gpus, nproc)
        assert all(len(g) == len(set(g)) == nproc for g in slots)  # one GPU per process
        round_one = [g for s in slots[:jobs] for g in s]
        assert len(round_one) == len(set(round_one)) == jobs * nproc  # no GPU given twice at once
        assert slots[jobs:] == slots[:jobs]  # dealt round robin
        assert [placement.gpu_env(g)['CUDA_VISIBLE_DEVICES'] for g in slots[:jobs]] == [
            ','.join(names[i * nproc:(i + 1) * nproc]) for i in range(jobs)]
    assert placement.slots(3, [], 2) == [None] * 3


def test_a_named_gpu_and_a_cpu_place_nothing(fake_gpu, cores):
    fake_gpu(n=4, total_gib=80)
    cores(16)
    gpus, jobs, _, why = placement.resolve_jobs({**compare.DEFAULTS, 'device': 'cuda:3'}, 99, SMALL_STEP, 1)
    assert (gpus, jobs) == ([], placement.MAX_SHARE) and 'GPU 3' in why
    for threads, nproc, jobs in ((0, 1, 1), (1, 1, 16), (2, 1, 8), (3, 2, 2), (32, 1, 1)):
        cfg = {**compare.DEFAULTS, 'device': 'cpu', 'threads': threads, 'nproc_per_run': nproc}
        assert placement.resolve_jobs(cfg, 5, SMALL_STEP, 1) == ([], jobs, threads, f'{min(jobs, 5)} at a time')
    assert placement.resolve_jobs({**compare.DEFAULTS, 'device': 'cpu', 'jobs': 3}, 2, SMALL_STEP, 1)[1] == 3


@pytest.mark.parametrize('n_gpus', range(1, 9))
def test_runs_per_gpu_are_whole_runs_of_a_core_each_at_least(fake_gpu, cores, n_gpus):
    """A core per GPU: no sharing, a GPU each. 2n + 1 cores on n GPUs: (2n + 1) // n whole runs per GPU (an int; on
    2 GPUs or more an odd core is left over), a thread each."""
    fake_gpu(n=n_gpus, total_gib=80)
    names = [str(i) for i in range(n_gpus)]
    cfg = {**compare.DEFAULTS, 'device': 'cuda'}
    cores(n_gpus)
    assert placement.resolve_jobs(cfg, 99, SMALL_STEP, 1)[:3] == (names, n_gpus, 0)
    cores(2 * n_gpus + 1)
    per_gpu = 3 if n_gpus == 1 else 2
    _, jobs, threads, why = placement.resolve_jobs(cfg, 99, SMALL_STEP, 1)
    assert (jobs, threads) == (per_gpu * n_gpus, 1) and type(jobs) is int and type(threads) is int
    assert why.startswith(f"{per_gpu * n_gpus} at a time on GPU{'s' * (n_gpus > 1)} {','.join(names)}, "
                          f"up to {per_gpu} per GPU, 1 CPU thread(s) each: ")


def test_a_run_a_hair_over_a_share_of_the_memory_makes_one_fewer_share_it(fake_gpu, cores):
    """Six runs whose estimate (with its CUDA context) is the float nearest a sixth of 90% of an 11 GiB GPU, which is
    just above it: their sum is over it, so five share the GPU, though the rounded quotient 0.9·total / need is 6.0."""
    from fractions import Fraction
    fake_gpu(n=1, total_gib=11)
    cores(64)
    usable = 0.9 * (11 * 2**30)
    each = usable / 6
    need = each - placement.CONTEXT_BYTES
    assert need + placement.CONTEXT_BYTES == each and usable / each == 6.0 and 6 * Fraction(each) > Fraction(usable)
    assert placement.resolve_jobs({**compare.DEFAULTS, 'device': 'cuda'}, 99, SMALL_STEP, need)[1] == 5
    below = math.nextafter(each, 0)  # the float before it: six fit
    assert 6 * Fraction(below) <= Fraction(usable)
    assert placement.resolve_jobs({**compare.DEFAULTS, 'device': 'cuda'}, 99, SMALL_STEP,
                                  below - placement.CONTEXT_BYTES)[1] == 6


def test_the_line_saying_how_runs_share_gpus_holds_the_numbers_they_were_placed_by(fake_gpu, cores):
    """2 GPUs of 80 GiB, runs of 10 GiB with their context: 7 per GPU (7.2 fit), 14 at a time, 64 // 14 = 4 threads."""
    fake_gpu(n=2, total_gib=80)
    cores(64)
    need = 10 * 2**30 - placement.CONTEXT_BYTES
    tail = ("up to 7 per GPU, 4 CPU thread(s) each: a micro-step of 1e+11 FLOPs is too small to fill a GPU, and each "
            "run needs about 10 GiB of its 80 GiB (an estimate, with its CUDA context); --jobs sets the number")
    cfg = {**compare.DEFAULTS, 'device': 'cuda'}
    assert placement.resolve_jobs(cfg, 99, 1e11, need) == (['0', '1'], 14, 4, f"14 at a time on GPUs 0,1, {tail}")
    assert placement.resolve_jobs(cfg, 5, 1e11, need)[3] == f"5 at a time on GPUs 0,1, {tail}"


def test_a_named_gpu_shares_by_its_own_memory_not_the_first_gpus(fake_gpu, cores):
    """--device=cuda:3 on a 16 GiB GPU beside 80 GiB ones: runs of 4 GiB, 3 at a time there (3.6 fit), not 8."""
    from fake_gpu import FAKE
    fake_gpu(n=4, total_gib=80)
    FAKE.props[3].total_memory = 16 * 2**30
    cores(16)
    need = 4 * 2**30 - placement.CONTEXT_BYTES
    gpus, jobs, threads, why = placement.resolve_jobs({**compare.DEFAULTS, 'device': 'cuda:3'}, 99, SMALL_STEP, need)
    assert (gpus, jobs, threads) == ([], 3, 16 // 3)
    assert why.startswith('3 at a time on GPU 3, up to 3 per GPU, ') and 'about 4 GiB of its 16 GiB' in why

# ----------------------------------------------------------------------------------------------------------------------
# a checkpoint's per-process states: each process resumes its own, and a list that is not one per process is refused

class Loader:
    def __init__(self):
        self.loaded = []

    def load_state_dict(self, state, tokens):
        self.loaded.append((state, tokens))


def resumed(world_size, rank, saved_world, n_states, monkeypatch, capsys, device_type='cpu', step=None):
    """restore() of a checkpoint written at iteration 4 by saved_world processes holding n_states per-process states,
    in process `rank` of world_size on device_type: (the loader state it loaded, the RNG states it set with their
    device types, what it printed). step: its AdamW state's steps instead of 1."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones(3)
    opt.step()
    if step is not None:
        opt.state[p]['step'] = torch.tensor(float(step))
    ckpt = {'optimizer': opt.state_dict(), 'scaler': None, 'iter_num': 4, 'best_val_loss': 2.0, 'tokens': 64,
            'train_time': 1.0, 'world_size': saved_world, 'loader': [f'loader{i}' for i in range(n_states)],
            'rng': [f'rng{i}' for i in range(n_states)], 'log_lines': 3,
            'config': {'lr_decay_iters': 0, 'max_iters': 8, 'schedule': 'cosine'}}  # 4 of 8 done
    rngs = []
    monkeypatch.setattr(train, 'set_rng_state', lambda state, device_type: rngs.append((state, device_type)))
    r = types.SimpleNamespace(optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))]), scaler=None,
                              loader=Loader(), hw=types.SimpleNamespace(world_size=world_size, rank=rank,
                                                                        device_type=device_type),
                              master=rank == 0, ckpt_path='run/ckpt.pt', cfg=ckpt['config'])
    train.restore(ckpt, r)
    assert (r.iter_num, r.tokens, r.saved_iter) == (4, 64, 4)
    return r.loader.loaded, rngs, capsys.readouterr().err  # a note is on stderr


@pytest.mark.parametrize('device_type', ['cpu', 'cuda'])
@pytest.mark.parametrize('world_size', [1, 2, 4])
def test_each_process_resumes_its_own_data_stream_and_rng(world_size, device_type, monkeypatch, capsys):
    """The RNG states set are those of the process's device type: a CUDA run's include its GPU's."""
    for rank in range(world_size):
        loaded, rngs, out = resumed(world_size, rank, world_size, world_size, monkeypatch, capsys, device_type)
        assert loaded == [(f'loader{rank}', 64)] and rngs == [(f'rng{rank}', device_type)] and out == ''


def test_another_world_size_continues_rank_0s_stream_without_its_rng(monkeypatch, capsys):
    loaded, rngs, out = resumed(2, 1, 4, 4, monkeypatch, capsys)
    assert loaded == [('loader0', 64)] and rngs == [] and out == ''
    loaded, rngs, out = resumed(2, 0, 1, 1, monkeypatch, capsys)
    assert loaded == [('loader0', 64)] and rngs == []
    assert out == ('note: the checkpoint was written by 1 process(es), this run has 2; the data stream continues, '
                   'dropout randomness does not.\n')


@pytest.mark.parametrize('world_size, rank, saved_world, n_states', [(2, 0, 2, 1), (2, 1, 2, 1), (4, 3, 4, 3),
                                                                     (1, 0, 2, 1), (2, 0, 2, 3), (1, 0, 1, 0)])
def test_per_process_states_not_one_per_saved_process_are_refused_in_a_sentence(world_size, rank, saved_world,
                                                                                  n_states, monkeypatch, capsys):
    """Every process refuses, rank 0 too (a list one short still holds rank 0's state): none trains on alone."""
    with pytest.raises(UserError) as e:
        resumed(world_size, rank, saved_world, n_states, monkeypatch, capsys)
    message = str(e.value)
    assert message.startswith(f'cannot use run/ckpt.pt (ValueError: it holds {n_states} data streams and {n_states} '
                              f'RNG states for {saved_world} process(es)), ')
    assert '\n' not in message and message.endswith('.')


@pytest.mark.parametrize('step, accepted', [(0, True), (1, True), (4, True), (-1, False), (5, False)])
def test_an_adamw_state_of_0_to_the_checkpoints_steps_is_accepted(step, accepted, monkeypatch, capsys):
    """A checkpoint of iteration 4: a parameter's AdamW state of 0 steps (as AdamW starts one) to 4 is resumed; one of
    -1 or 5 steps is refused in a sentence, by every process."""
    if accepted:
        assert resumed(1, 0, 1, 1, monkeypatch, capsys, step=step)[0] == [('loader0', 64)]
        return
    with pytest.raises(UserError) as e:
        resumed(1, 0, 1, 1, monkeypatch, capsys, step=step)
    assert str(e.value).startswith("cannot use run/ckpt.pt (ValueError: its optimizer's state is not that of AdamW on "
                                   "this model after its steps), ")


# ----------------------------------------------------------------------------------------------------------------------
# the settings checks: each edge a run's settings are accepted or refused at, and the sentence that refuses them

@pytest.fixture
def run_settings(tmp_path):
    """settings(**changes): a run's settings that configurator.check accepts (a 65-token vocabulary given, so that no
    dataset is read), with changes on top."""
    base = {**configurator.DEFAULTS, 'out_dir': str(tmp_path / 'out'), 'data_dir': str(tmp_path), 'vocab_size': 65}
    return lambda **changes: {**base, **changes}


BELOW_1 = math.nextafter(1.0, 0.0)
ACCEPTED = ([dict(init_from=v) for v in ('scratch', 'resume')]
            + [dict(schedule=v) for v in ('cosine', 'wsd', 'constant')]
            + [dict(compile_mode=v) for v in ('regional', 'whole')]
            + [{k: 1} for k in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval',
                                'eval_iters', 'log_interval', 'n_layer')]
            + [{k: 0} for k in ('max_iters', 'warmup_iters', 'lr_decay_iters', 'threads')]
            + [dict(decay_frac=0.0), dict(decay_frac=1.0)]
            + [{k: 0.0} for k in ('min_lr', 'weight_decay', 'grad_clip', 'peak_flops', 'aux_loss_weight',
                                  'z_loss_weight')]
            + [dict(learning_rate=0.0, min_lr=0.0), dict(min_lr=configurator.DEFAULTS['learning_rate'])]
            + [{k: v} for k in ('beta1', 'beta2') for v in (0.0, BELOW_1)]
            + [dict(seed=0), dict(seed=configurator.MAX_SEED)]
            + [dict(n_expert=0, top_k=0)]  # top_k is a dense model's to ignore, in every check
            + [dict(ffn='la_glu', la_init='mean/onehot:relu'), dict(ffn='la', la_init='onehot:gelu/sum')]
            # la_init=onehot's entries are a dictionary variant's own: a variant that reads none needs none of them
            + [dict(ffn='gelu', act_dict='relu,tanh'), dict(ffn='swiglu', act_dict='gelu,relu')])


@pytest.mark.parametrize('changes', ACCEPTED, ids=[repr(c) for c in ACCEPTED])
def test_the_edges_of_a_runs_settings_are_accepted(run_settings, changes):
    configurator.check(run_settings(**changes))


REFUSED_SETTINGS = [
    (dict(init_from='resum'), "--init_from expects scratch or resume, got 'resum'."),
    (dict(schedule='linear'), "--schedule expects cosine or wsd or constant, got 'linear'."),
    (dict(compile_mode='all'), "--compile_mode expects regional or whole, got 'all'."),
    (dict(out_dir=' '), "--out_dir is empty; give the run's directory, e.g. --out_dir=out-gelu."),
    (dict(dataset=''), "--dataset is empty; name a prepared dataset, e.g. --dataset=shakespeare_char."),
    (dict(batch_size=0), "--batch_size must be at least 1, got 0."),
    (dict(n_embd=0), "--n_embd must be at least 1, got 0."),
    (dict(max_iters=-1), "--max_iters must not be negative, got -1."),
    (dict(vocab_size=-1), "--vocab_size must not be negative, got -1."),
    (dict(decay_frac=-0.1), "--decay_frac must be between 0 and 1, got -0.1."),
    (dict(decay_frac=math.nextafter(1.0, 2.0)), "--decay_frac must be between 0 and 1, got 1.0000000000000002."),
    (dict(decay_frac=1.5), "--decay_frac must be between 0 and 1, got 1.5."),
    (dict(learning_rate=math.inf), "--learning_rate must be a finite number >= 0, got inf."),
    (dict(min_lr=-math.inf), "--min_lr must be a finite number >= 0, got -inf."),
    (dict(grad_clip=math.nan), "--grad_clip must be a finite number >= 0, got nan."),
    (dict(weight_decay=-1e-3), "--weight_decay must be a finite number >= 0, got -0.001."),
    (dict(min_lr=1e-3), "--min_lr=0.001 is above --learning_rate=0.0006; give a min_lr at most the learning rate."),
    (dict(beta1=1.0), "--beta1 must be in [0, 1), got 1.0."),
    (dict(beta2=1.5), "--beta2 must be in [0, 1), got 1.5."),
    (dict(beta1=-0.1), "--beta1 must be in [0, 1), got -0.1."),
    (dict(beta2=math.nan), "--beta2 must be in [0, 1), got nan."),
    (dict(seed=-1), f"--seed must be between 0 and {configurator.MAX_SEED}, got -1."),
    (dict(seed=configurator.MAX_SEED + 1), "--seed must be between 0 and 2147483647, got 2147483648."),
    (dict(ffn='polyrelu', poly_order=9), "--poly_order must be 2, 3 or 4, got 9."),  # the activation's, as a flag
    *((dict(ffn=ffn, la_init=v), f"--la_init must be onehot, mean, sum or onehot:NAME with NAME one of identity, relu, "
                                 f"relu2, gelu, silu, tanh, or A/B, each of mean, sum or onehot:NAME (gate/up branch); "
                                 f"got {got!r}.")
      for ffn, v, got in [('la_glu', 'onehot/mean', 'onehot/mean'),  # bare onehot is a whole variant's init
                          ('la_glu', 'mean/sum/onehot:relu', 'mean/sum/onehot:relu'),  # two branches, two parts
                          ('la', 'mean/bad', 'bad'), ('moa', 'onehot:tanhh', 'onehot:tanhh')]),  # B, read or not
    (dict(norm='batchnorm'), "--norm must be rmsnorm or layernorm, --pos rope or learned."),  # model_config's
    # an activation key the chosen variant does not read is checked all the same, as the variants that read it do
    (dict(ffn='gelu', poly_order=9), "--poly_order must be 2, 3 or 4, got 9."),
    # the dictionary named from BASIS: an entry a learner adds (README's softplus) is listed too
    (dict(ffn='gelu', act_dict='foo'), f"--act_dict must be a comma-separated list of {', '.join(BASIS)}; got 'foo'."),
    (dict(ffn='polynorm', la_init='bogus'), "--la_init must be onehot, mean, sum or onehot:NAME with NAME one of "
                                            "identity, relu, relu2, gelu, silu, tanh, or A/B, each of mean, sum or "
                                            "onehot:NAME (gate/up branch); got 'bogus'."),
    (dict(ffn='la', moa_gate='nope'), "--moa_gate must be one of sigmoid, softmax, tanh, plain_sigmoid; got 'nope'."),
]


@pytest.mark.parametrize('changes, sentence', REFUSED_SETTINGS, ids=[repr(c) for c, _ in REFUSED_SETTINGS])
def test_settings_beyond_an_edge_are_refused_in_their_sentence(run_settings, changes, sentence):
    with pytest.raises(UserError) as e:
        configurator.check(run_settings(**changes))
    assert str(e.value) == sentence


def test_an_out_dir_that_is_a_file_is_refused_and_one_that_is_a_directory_is_not(run_settings, tmp_path):
    (tmp_path / 'f').write_text('')
    with pytest.raises(UserError) as e:
        configurator.check(run_settings(out_dir=str(tmp_path / 'f')))
    assert str(e.value) == f"--out_dir={tmp_path / 'f'} is a file, not a directory; choose another --out_dir."
    configurator.check(run_settings(out_dir=str(tmp_path)))


def test_the_model_checked_has_the_datasets_vocabulary_unless_vocab_size_is_given(run_settings, tmp_path, monkeypatch):
    """vocab_size 0 is the dataset's (its meta.json: 77 here); a vocab_size given is that, whatever the dataset's."""
    (tmp_path / 'shakespeare_char').mkdir()
    (tmp_path / 'shakespeare_char' / 'meta.json').write_text('{"vocab_size": 77}')
    checked = []
    monkeypatch.setattr(configurator, 'check_memory', lambda cfg, config: checked.append(config.vocab_size))
    configurator.check(run_settings(vocab_size=0))
    configurator.check(run_settings(vocab_size=100))
    assert checked == [77, 100]
    # one too few for the dataset's tokens: refused before anything is built or written (a resume keeps its model)
    said = "--vocab_size=76 is smaller than the dataset's 77 tokens; leave it at 0 to take the dataset's."
    with pytest.raises(UserError) as e:
        configurator.check(run_settings(vocab_size=76))
    assert str(e.value) == said
    configurator.check(run_settings(vocab_size=76, init_from='resume'))
    with pytest.raises(UserError) as e:  # where the dataset was prepared only as the run started
        configurator.model_args(run_settings(vocab_size=76), {'vocab_size': 77}, None)
    assert str(e.value) == said


def test_an_activations_refusal_is_one_sentence_with_one_full_stop(run_settings, monkeypatch):
    def refuse(config):
        raise ValueError('la_init names no activation.')
    monkeypatch.setattr(configurator, 'make_activations', refuse)
    with pytest.raises(UserError) as e:
        configurator.check(run_settings())
    assert str(e.value) == '--la_init names no activation.'  # the key it names first, as the flag that sets it


def test_wandb_that_cannot_be_imported_is_refused_only_when_asked_for(run_settings, monkeypatch):
    monkeypatch.setitem(sys.modules, 'wandb', None)  # import wandb raises ModuleNotFoundError
    configurator.check(run_settings(wandb_log=False))
    with pytest.raises(UserError) as e:
        configurator.check(run_settings(wandb_log=True))
    assert str(e.value) == ("--wandb_log=True needs the wandb package, which cannot be imported here "
                            "(ModuleNotFoundError: import of wandb halted; None in sys.modules); pip install wandb, "
                            "or drop --wandb_log.")


def model_settings(**changes):
    return {**{k: configurator.DEFAULTS[k] for k in configurator.keys_that('model')}, 'vocab_size': 65, **changes}


MODEL_ACCEPTED = [dict(norm='layernorm'), dict(pos='learned'), dict(norm='layernorm', pos='learned'),
                  dict(n_embd=6, n_head=2, pos='learned'),  # an odd head size: only RoPE needs it even
                  dict(n_embd=8, n_head=2), dict(ffn_mult=1.0), dict(ffn_mult=0.5),
                  dict(n_embd=64, n_head=2, ffn_mult=1 / 64),  # an FFN 1 unit wide
                  dict(n_embd=64, n_head=2, ffn_mult=math.nextafter(2.0**57, 0)),  # just under 2**63 units
                  dict(dropout=0.0), dict(dropout=BELOW_1), dict(moe_every=1, expert_hidden=0, n_expert=0),
                  dict(n_expert=4, top_k=1), dict(n_expert=4, top_k=2), dict(n_expert=4, top_k=4),
                  dict(n_expert=0, top_k=0)]  # top_k is a dense model's to ignore


@pytest.mark.parametrize('changes', MODEL_ACCEPTED, ids=[repr(c) for c in MODEL_ACCEPTED])
def test_the_edges_of_a_models_settings_are_accepted(changes):
    c = configurator.model_config(model_settings(**changes))
    assert {k: getattr(c, k) for k in changes} == changes


FFN_WIDTH = "must be positive and give an FFN 1 to 2**63 - 1 units wide."
MODEL_REFUSED = [
    (dict(ffn='nope'), f"unknown ffn 'nope'; choose one of: {', '.join(VARIANTS)}."),
    (dict(ffn='PolyNorm'), f"unknown ffn 'PolyNorm' (did you mean 'polynorm'?); choose one of: {', '.join(VARIANTS)}."),
    (dict(norm='batchnorm'), "--norm must be rmsnorm or layernorm, --pos rope or learned."),
    (dict(pos='alibi'), "--norm must be rmsnorm or layernorm, --pos rope or learned."),
    (dict(n_embd=64, n_head=3), "--n_embd=64 must be divisible by --n_head=3."),
    (dict(n_embd=6, n_head=2), "RoPE needs an even head size, but n_embd/n_head = 6/2 = 3; change n_embd or n_head, "
                               "or use --pos=learned."),
    # a head size beyond a float's 53 bits: odd, though n_embd / n_head as a float is even
    (dict(n_embd=2**60 + 2, n_head=2), f"RoPE needs an even head size, but n_embd/n_head = {2**60 + 2}/2 = "
                                       f"{2**59 + 1}; change n_embd or n_head, or use --pos=learned."),
    (dict(ffn_mult=0.0), f"--ffn_mult=0.0 {FFN_WIDTH}"), (dict(ffn_mult=-1.0), f"--ffn_mult=-1.0 {FFN_WIDTH}"),
    (dict(ffn_mult=math.nan), f"--ffn_mult=nan {FFN_WIDTH}"),
    (dict(n_embd=64, n_head=2, ffn_mult=0.5 / 64), f"--ffn_mult=0.0078125 {FFN_WIDTH}"),  # half a unit
    (dict(n_embd=64, n_head=2, ffn_mult=2.0**57), f"--ffn_mult={2.0**57} {FFN_WIDTH}"),  # exactly 2**63 units
    (dict(dropout=1.0), "--dropout=1.0 must be in [0, 1)."), (dict(dropout=1.5), "--dropout=1.5 must be in [0, 1)."),
    (dict(dropout=-0.1), "--dropout=-0.1 must be in [0, 1)."),
    *[({k: v}, "--n_expert and --expert_hidden must be >= 0 and --moe_every >= 1.")
      for k, v in (('n_expert', -1), ('moe_every', 0), ('expert_hidden', -1))],
    (dict(n_expert=4, top_k=0), "--top_k=0 must be between 1 and --n_expert=4."),
    (dict(n_expert=4, top_k=5), "--top_k=5 must be between 1 and --n_expert=4."),
]


@pytest.mark.parametrize('changes, sentence', MODEL_REFUSED, ids=[repr(c) for c, _ in MODEL_REFUSED])
def test_a_models_settings_beyond_an_edge_are_refused_in_a_sentence(changes, sentence):
    with pytest.raises(UserError) as e:
        configurator.model_config(model_settings(**changes))
    assert str(e.value) == sentence
