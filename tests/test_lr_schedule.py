"""The learning-rate schedule, value by value from its formulas: linear warmup to the peak, then cosine decay (Loshchilov
& Hutter 2017, "SGDR"; nanoGPT's form), warmup-stable-decay (Hu et al. 2024, "MiniCPM") or constant, reaching min_lr
exactly at lr_decay_iters and staying there."""
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configurator import DEFAULTS  # noqa: E402
from train import get_lr  # noqa: E402

LR, MIN_LR, WARMUP, MAX_ITERS = 1e-2, 1e-3, 10, 110


def schedule(**settings):
    cfg = {**DEFAULTS, 'learning_rate': LR, 'min_lr': MIN_LR, 'warmup_iters': WARMUP, 'max_iters': MAX_ITERS,
           'lr_decay_iters': 0, **settings}
    return lambda it: get_lr(it, cfg)


@pytest.mark.parametrize('kind', ['cosine', 'wsd', 'constant'])
def test_warmup_rises_linearly_to_the_peak(kind):
    lr = schedule(schedule=kind)
    assert [lr(it) for it in range(WARMUP)] == pytest.approx([LR * (it + 1) / (WARMUP + 1) for it in range(WARMUP)])
    assert lr(WARMUP) == pytest.approx(LR)  # the first step after warmup is at the peak


def test_cosine_falls_from_the_peak_to_min_lr_over_the_decay():
    lr = schedule(schedule='cosine')
    span = MAX_ITERS - WARMUP  # lr_decay_iters 0: the decay ends at max_iters
    for it in range(WARMUP, MAX_ITERS):
        assert lr(it) == pytest.approx(MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * (it - WARMUP) / span)) / 2)
    assert lr(WARMUP + span // 2) == pytest.approx((LR + MIN_LR) / 2)  # half way down at half the decay
    assert lr(MAX_ITERS) == MIN_LR and lr(MAX_ITERS + 50) == MIN_LR  # min_lr reached, exactly, and kept


def test_a_decay_shorter_than_the_run_reaches_min_lr_early_and_stays():
    lr = schedule(schedule='cosine', lr_decay_iters=60)
    assert lr(35) == pytest.approx((LR + MIN_LR) / 2)  # half way from 10 to 60
    assert lr(59) > MIN_LR and all(lr(it) == MIN_LR for it in range(60, MAX_ITERS + 1))


def test_wsd_holds_the_peak_then_falls_linearly_over_its_last_fraction():
    lr = schedule(schedule='wsd', decay_frac=0.2)  # the ramp: the last 22 of 110 iterations, from 88
    assert all(lr(it) == LR for it in range(WARMUP, 89))
    assert [lr(it) for it in range(88, MAX_ITERS)] == pytest.approx(
        [LR + (MIN_LR - LR) * (it - 88) / 22 for it in range(88, MAX_ITERS)])
    assert lr(99) == pytest.approx((LR + MIN_LR) / 2) and lr(MAX_ITERS) == MIN_LR


def test_wsd_with_the_whole_run_as_its_ramp_decays_right_after_warmup():
    lr = schedule(schedule='wsd', decay_frac=1.0)
    assert lr(WARMUP) == LR and lr(60) == pytest.approx((LR + MIN_LR) / 2) and lr(MAX_ITERS) == MIN_LR


def test_constant_keeps_the_peak_after_warmup_whatever_the_decay():
    lr = schedule(schedule='constant', lr_decay_iters=50)
    assert all(lr(it) == LR for it in range(WARMUP, 2 * MAX_ITERS))
