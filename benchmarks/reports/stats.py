"""Bootstrap confidence intervals for benchmark rows (numpy only, vectorised).

A row's score is the mean over its instances, and its tokens per correct answer a ratio of two
means over the same instances. :func:`bootstrap_mean` and :func:`bootstrap_ratio` resample the
instances with replacement ``n_boot`` times (one ``(n_boot, n)`` index draw, no Python loop) and
return the percentile interval (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993,
ch. 13): the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the resampled statistic.

:func:`bootstrap_difference` is the paired difference of two columns over the same instances
(a trained system against its starting model): the mean of the per-instance differences, resampled
like :func:`bootstrap_mean`, which is the difference of the two means over one shared resample.

A ratio is *paired* by default: numerator and denominator are resampled with the same instance
indices, which keeps their correlation (the usual case: two columns of one run). ``paired=False``
resamples each on its own (two independent samples, lengths may differ). A resample whose
denominator mean is 0 has no ratio: it is dropped and counted; when more than
:data:`MAX_DROPPED` of them are dropped the interval has no bounds (``low = high = None``) and
``reason`` says why. 1000 instances and 2000 resamples take a few tens of milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from optima_env.errors import DataError, TaskContractError

__all__ = [
    "MAX_DROPPED",
    "METHOD",
    "Interval",
    "bootstrap_difference",
    "bootstrap_mean",
    "bootstrap_ratio",
    "wilson_interval",
]

METHOD = "percentile"
"""The interval method (the bootstrap percentile interval)."""
MAX_DROPPED = 0.05
"""Largest share of ratio resamples with a zero denominator mean that still gives an interval."""
_CHUNK = 4_000_000
"""Resampled values held at once (rows of ``n`` indices per chunk: ``_CHUNK // n``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """A point estimate and its bootstrap confidence interval."""

    estimate: float | None
    """The statistic on the full sample (``None``: a ratio whose denominator mean is 0)."""
    low: float | None
    """Lower bound (``None`` when there is no interval, see ``reason``)."""
    high: float | None
    """Upper bound (``None`` when there is no interval)."""
    level: float
    """Confidence level, e.g. 0.95."""
    n: int
    """Instances (for an unpaired ratio, the numerator's)."""
    n_boot: int
    """Resamples drawn."""
    method: str = METHOD
    """How the bounds were computed."""
    dropped: int = 0
    """Resamples without a value (a ratio's zero denominator mean)."""
    reason: str | None = None
    """Why the bounds are ``None``; ``None`` when they are set."""

    @property
    def width(self) -> float | None:
        """``high - low``, or None without bounds."""
        return None if self.low is None or self.high is None else self.high - self.low

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def bootstrap_mean(
    values: Sequence[float] | np.ndarray, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> Interval:
    """The mean of ``values`` with its percentile bootstrap interval.

    Args:
        values: one finite number per instance (a score, a token count, ...).
        n_boot: resamples drawn.
        level: the confidence level, in (0, 1).
        seed: seed of numpy's generator; the same seed and values give the same interval.

    >>> interval = bootstrap_mean([2.0, 2.0, 2.0])
    >>> interval.estimate, interval.low, interval.high, interval.method
    (2.0, 2.0, 2.0, 'percentile')
    """
    x = _values(values, "values")
    _check(n_boot, level)
    rng = np.random.default_rng(seed)
    means = _resampled_means(rng, [x], n_boot)[0]
    low, high = _bounds(means, level)
    return Interval(estimate=float(x.mean()), low=low, high=high, level=level, n=len(x), n_boot=n_boot)


def bootstrap_difference(
    values: Sequence[float] | np.ndarray,
    base_values: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """``mean(values) - mean(base_values)`` over the same instances, with its paired percentile
    bootstrap interval (one resample draws the same instances for both).

    Args:
        values, base_values: per-instance values, entry ``i`` of both from instance ``i``.
        n_boot, level, seed: as :func:`bootstrap_mean`.

    >>> interval = bootstrap_difference([0.5, 0.7, 0.9], [0.4, 0.6, 0.8])
    >>> round(interval.estimate, 6), round(interval.low, 6), round(interval.high, 6)
    (0.1, 0.1, 0.1)
    """
    x = _values(values, "values")
    base = _values(base_values, "base_values")
    if len(x) != len(base):
        raise DataError(
            f"a paired difference needs one value and one base value per instance, got {len(x)} and "
            f"{len(base)} values; evaluate both on the same instances"
        )
    return bootstrap_mean(x - base, n_boot=n_boot, level=level, seed=seed)


def bootstrap_ratio(
    num_values: Sequence[float] | np.ndarray,
    den_values: Sequence[float] | np.ndarray,
    *,
    paired: bool = True,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """``mean(num_values) / mean(den_values)`` with its percentile bootstrap interval.

    Args:
        num_values, den_values: per-instance values; with ``paired`` (the default), entry ``i``
            of both belongs to instance ``i`` (equal lengths) and both are resampled with the same
            indices; without it each is resampled on its own.
        n_boot, level, seed: as :func:`bootstrap_mean`.

    >>> bootstrap_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]).width
    0.0
    """
    num = _values(num_values, "num_values")
    den = _values(den_values, "den_values")
    if paired and len(num) != len(den):
        raise DataError(
            f"a paired ratio needs one numerator and one denominator value per instance, got "
            f"{len(num)} and {len(den)} values; pass equal lengths, or paired=False for independent samples"
        )
    _check(n_boot, level)
    rng = np.random.default_rng(seed)
    if paired:
        nums, dens = _resampled_means(rng, [num, den], n_boot)
    else:
        nums, dens = (_resampled_means(rng, [column], n_boot)[0] for column in (num, den))
    keep = dens != 0
    dropped = int(n_boot - keep.sum())
    whole = float(den.mean())
    estimate = float(num.mean()) / whole if whole != 0 else None
    common = dict(estimate=estimate, level=level, n=len(num), n_boot=n_boot, dropped=dropped)
    if estimate is None:
        reason = "the denominator's mean over the sample is 0, so the ratio is undefined"
        return Interval(low=None, high=None, reason=reason, **common)
    if dropped > MAX_DROPPED * n_boot:
        reason = (
            f"{dropped} of {n_boot} resamples ({dropped / n_boot:.1%}) had a denominator mean of 0, more "
            f"than {MAX_DROPPED:.0%}; the ratio is too unstable for a bootstrap interval"
        )
        return Interval(low=None, high=None, reason=reason, **common)
    low, high = _bounds(nums[keep] / dens[keep], level)
    return Interval(low=low, high=high, **common)


def wilson_interval(successes: int, n: int, *, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``successes / n`` (Wilson, JASA 1927): the share
    of a few held-out preference pairs ranked right, where a bootstrap of 11 to 23 zeros and ones
    has too few distinct resamples and the normal approximation leaves [0, 1].

    >>> tuple(round(b, 4) for b in wilson_interval(7, 10))
    (0.3968, 0.8922)

    Raises:
        TaskContractError: ``n`` below 1, ``successes`` outside ``[0, n]``, or ``level`` outside (0, 1).
    """
    if n < 1 or not 0 <= successes <= n:
        raise TaskContractError(
            f"wilson_interval: expected 0 <= successes <= n and n >= 1, got successes={successes}, n={n}"
        )
    _check(1, level)
    z = NormalDist().inv_cdf((1 + level) / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))


def _values(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{name}: expected a sequence of numbers, got {values!r:.80} ({exc})") from exc
    if x.ndim != 1:
        raise DataError(f"{name}: expected a flat sequence of numbers, got an array of shape {x.shape}")
    if x.size == 0:
        raise DataError(f"{name}: expected at least one value, got none (a row without instances?)")
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        raise DataError(
            f"{name}: expected finite numbers, got {x[bad[0]]} at index {int(bad[0])} ({bad.size} non-finite "
            "in all); drop or score those instances first"
        )
    return x


def _check(n_boot: int, level: float) -> None:
    if not isinstance(n_boot, (int, np.integer)) or isinstance(n_boot, bool) or n_boot < 1:
        raise TaskContractError(f"n_boot must be an int >= 1, got {n_boot!r}")
    if not isinstance(level, (float, int)) or not 0 < level < 1:
        raise TaskContractError(f"level must be a number in (0, 1), e.g. 0.95, got {level!r}")


def _resampled_means(rng: np.random.Generator, columns: list[np.ndarray], n_boot: int) -> list[np.ndarray]:
    """The means of ``columns`` (equal lengths) over ``n_boot`` resamples of shared indices."""
    n = len(columns[0])
    rows = max(1, _CHUNK // n)
    out = [np.empty(n_boot) for _ in columns]
    for start in range(0, n_boot, rows):
        stop = min(start + rows, n_boot)
        index = rng.integers(0, n, size=(stop - start, n))
        for column, means in zip(columns, out):
            means[start:stop] = column[index].mean(axis=1)
    return out


def _bounds(stats: np.ndarray, level: float) -> tuple[float, float]:
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
