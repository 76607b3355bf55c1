"""``benchmarks.reports.stats``: bootstrap intervals on cases that can be checked by hand."""

from __future__ import annotations

import dataclasses
import doctest
import math

import numpy as np
import pytest

from benchmarks.reports import stats
from benchmarks.reports.stats import (
    Interval,
    bootstrap_difference,
    bootstrap_mean,
    bootstrap_ratio,
    wilson_interval,
)
from optima_env.errors import DataError, TaskContractError


def test_the_doctests_pass() -> None:
    assert doctest.testmod(stats).failed == 0


def test_constant_values_give_a_zero_width_interval() -> None:
    interval = bootstrap_mean([3.0] * 50)
    assert (interval.estimate, interval.low, interval.high, interval.width) == (3.0, 3.0, 3.0, 0.0)
    assert (interval.level, interval.n, interval.n_boot, interval.method) == (0.95, 50, 2000, "percentile")
    assert interval.dropped == 0 and interval.reason is None
    one = bootstrap_mean([7])
    assert (one.low, one.high, one.n) == (7.0, 7.0, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        interval.low = 0.0  # type: ignore[misc]
    assert interval.to_dict()["method"] == "percentile"


def test_a_normal_sample_gives_about_the_mean_plus_minus_1_96_standard_errors() -> None:
    x = np.random.default_rng(1).normal(10.0, 2.0, size=400)
    interval = bootstrap_mean(x, n_boot=4000)
    half = 1.96 * x.std(ddof=1) / math.sqrt(len(x))  # about 0.196
    assert interval.estimate == pytest.approx(x.mean())
    assert interval.low == pytest.approx(x.mean() - half, abs=0.1 * half)
    assert interval.high == pytest.approx(x.mean() + half, abs=0.1 * half)
    narrower = bootstrap_mean(x, n_boot=4000, level=0.5)  # 0.674 standard errors
    assert narrower.width == pytest.approx(2 * 0.674 * half / 1.96, rel=0.15)


def test_a_0_1_column_gives_the_binomial_interval() -> None:
    scores = [1.0] * 30 + [0.0] * 70  # p = 0.3, standard error sqrt(0.3 * 0.7 / 100) = 0.0458
    interval = bootstrap_mean(scores, n_boot=4000)
    assert interval.estimate == pytest.approx(0.3)
    assert interval.low == pytest.approx(0.3 - 1.96 * 0.0458, abs=0.012)
    assert interval.high == pytest.approx(0.3 + 1.96 * 0.0458, abs=0.012)


def test_a_paired_ratio_keeps_the_correlation_an_independent_one_does_not() -> None:
    den = np.random.default_rng(2).uniform(50, 150, size=200)
    num = 2.0 * den  # every instance has a ratio of exactly 2
    paired = bootstrap_ratio(num, den)
    assert (paired.estimate, paired.low, paired.high) == (2.0, 2.0, 2.0)
    independent = bootstrap_ratio(num, den, paired=False)
    assert independent.estimate == 2.0 and independent.low < 1.95 and independent.high > 2.05
    shorter = bootstrap_ratio([1.0, 2.0, 3.0], [2.0, 4.0], paired=False)  # lengths may differ
    assert shorter.estimate == pytest.approx(2.0 / 3.0) and shorter.n == 3


def test_zero_denominators_are_dropped_and_counted() -> None:
    num, den = [1.0] * 20, [0.0] * 19 + [1.0]  # a resample misses the one non-zero: (19/20)^20 = 0.358
    unstable = bootstrap_ratio(num, den)
    assert unstable.estimate == pytest.approx(20.0) and unstable.low is None and unstable.high is None
    assert 0.3 * 2000 < unstable.dropped < 0.42 * 2000 and "more than 5%" in unstable.reason
    den = [0.0] + [1.0] * 59  # a resample's mean is 0 only if it draws the one zero 60 times
    kept = bootstrap_ratio([1.0] * 60, den)
    assert kept.dropped == 0 and kept.low is not None and kept.reason is None
    undefined = bootstrap_ratio([1.0, 2.0], [0.0, 0.0])
    assert (
        undefined.estimate is None
        and undefined.low is None
        and "mean over the sample is 0" in undefined.reason
    )


def test_the_same_seed_gives_the_same_interval() -> None:
    x = np.random.default_rng(3).exponential(size=300)
    assert bootstrap_mean(x, seed=5) == bootstrap_mean(x, seed=5)
    assert bootstrap_mean(x, seed=5) != bootstrap_mean(x, seed=6)
    y = x + np.random.default_rng(4).exponential(size=300)
    assert bootstrap_ratio(x, y, seed=1) == bootstrap_ratio(x, y, seed=1)
    assert bootstrap_ratio(x, y, seed=1, paired=False) == bootstrap_ratio(x, y, seed=1, paired=False)


def test_a_paired_difference_resamples_both_columns_with_the_same_instances() -> None:
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 1, 200)
    values = base + rng.normal(0.05, 0.02, 200)  # a small, consistent gain over a wide spread
    paired = bootstrap_difference(values, base)
    assert paired.estimate == pytest.approx(values.mean() - base.mean())
    # one index draw for both columns: the difference of the resampled means, computed here
    index = np.random.default_rng(0).integers(0, 200, size=(2000, 200))
    low, high = np.quantile(values[index].mean(axis=1) - base[index].mean(axis=1), [0.025, 0.975])
    assert (paired.low, paired.high) == pytest.approx((low, high))
    assert paired.low > 0  # the gain shows; resampling each column on its own would drown it
    index2 = np.random.default_rng(1).integers(0, 200, size=(2000, 200))
    unpaired = values[index].mean(axis=1) - base[index2].mean(axis=1)
    assert np.quantile(unpaired, 0.025) < 0 < paired.low


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: bootstrap_mean([]), DataError, "values: expected at least one value, got none"),
        (
            lambda: bootstrap_mean([1.0, float("nan")]),
            DataError,
            "expected finite numbers, got nan at index 1",
        ),
        (lambda: bootstrap_mean([1.0, math.inf]), DataError, "got inf at index 1"),
        (lambda: bootstrap_mean(["a"]), DataError, "values: expected a sequence of numbers"),
        (lambda: bootstrap_mean([[1.0], [2.0]]), DataError, r"flat sequence .* shape \(2, 1\)"),
        (lambda: bootstrap_ratio([1.0, 2.0], [1.0]), DataError, "got 2 and 1 values; pass equal lengths"),
        (lambda: bootstrap_ratio([1.0], []), DataError, "den_values: expected at least one value"),
        (lambda: bootstrap_difference([1.0, 2.0], [1.0]), DataError, "got 2 and 1 values; evaluate both"),
        (lambda: bootstrap_difference([1.0], [math.nan]), DataError, "base_values: expected finite numbers"),
        (lambda: bootstrap_mean([1.0], n_boot=0), TaskContractError, "n_boot must be an int >= 1, got 0"),
        (lambda: bootstrap_mean([1.0], level=95), TaskContractError, r"level must be a number in \(0, 1\)"),
    ],
)
def test_bad_inputs_get_clear_errors(call, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        call()


def test_an_interval_is_a_frozen_record() -> None:
    fields = [f.name for f in dataclasses.fields(Interval)]
    assert fields[:7] == ["estimate", "low", "high", "level", "n", "n_boot", "method"]


def test_wilson_interval_matches_the_formula_and_stays_in_0_1() -> None:
    low, high = wilson_interval(7, 10)  # by hand: centre 0.6445, half-width 0.2477
    assert (round(low, 4), round(high, 4)) == (0.3968, 0.8922)
    assert wilson_interval(0, 11)[0] == 0.0 and wilson_interval(11, 11)[1] == 1.0
    assert 0.0 < wilson_interval(0, 11)[1] < 0.3 and wilson_interval(11, 11)[0] > 0.7
    narrow, wide = wilson_interval(70, 100), wilson_interval(7, 10)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]  # more pairs, a narrower interval
    for bad in ((11, 10), (-1, 10), (0, 0)):
        with pytest.raises(TaskContractError, match="successes"):
            wilson_interval(*bad)
    with pytest.raises(TaskContractError, match="level"):
        wilson_interval(1, 2, level=1.5)
