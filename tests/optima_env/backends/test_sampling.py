"""The transformers engine's sampler: exact inverse-CDF draws from per-row generators, and top-p
from candidates that equals the full sort.

The distribution tests are chi-square tests at a fixed seed (so they are deterministic) with a
critical value at significance 0.001; each also checks that the same draws are rejected against a
slightly wrong distribution (the temperature 0.7 read as 0.75), so the tolerance is tight enough to
catch a sampler that draws from the wrong distribution.
"""

from __future__ import annotations

import math
import statistics

import pytest

from optima_env.policy import SamplingParams

torch = pytest.importorskip("torch")

from optima_env.backends._tokens import sample_next, top_p_candidates  # noqa: E402

VOCAB = 8192
ROWS = 400
ROUNDS = 50  # 20,000 draws
ALPHA = 0.001


def _logits(seed: int = 0):
    """One row of logits whose softmax at T=0.7 spreads over some hundred tokens and a long tail."""
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2.0


def _draw(logits, sampling: SamplingParams, sampler: str):
    """ROWS x ROUNDS tokens: every row the same distribution, each row its own seeded generator."""
    generators = [torch.Generator().manual_seed(1000 + r) for r in range(ROWS)]
    drawn = [
        sample_next(logits.expand(ROWS, -1).clone(), sampling, generators, None, sampler)
        for _ in range(ROUNDS)
    ]
    return torch.cat(drawn)


def _critical(dof: int) -> float:
    """Chi-square critical value at ``ALPHA`` (Wilson-Hilferty; accurate for tens of dof and up)."""
    z = statistics.NormalDist().inv_cdf(1 - ALPHA)
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def _goodness_of_fit(tokens, probs) -> tuple[float, float]:
    """(chi-square statistic, critical value) of ``tokens`` against ``probs``; tokens expected
    fewer than 5 times are pooled in one bin."""
    n = len(tokens)
    counts = torch.bincount(tokens, minlength=len(probs)).double()
    expected = probs.double() * n
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    if observed[-1] == 0 and wanted[-1] == 0:  # nothing pooled (a nucleus of common tokens only)
        observed, wanted = observed[:-1], wanted[:-1]
    stat = float(((observed - wanted) ** 2 / wanted).sum())  # a token of probability 0 drawn: inf
    return stat, _critical(len(wanted) - 1)


def _homogeneity(a, b, probs) -> tuple[float, float]:
    """(chi-square statistic, critical value) that two equal-sized samples share one distribution."""
    big = probs.double() * len(a) >= 5
    ca = torch.bincount(a, minlength=len(probs)).double()
    cb = torch.bincount(b, minlength=len(probs)).double()
    ca = torch.cat([ca[big], ca[~big].sum()[None]])
    cb = torch.cat([cb[big], cb[~big].sum()[None]])
    both = ca + cb
    keep = both > 0
    stat = float(((ca - cb)[keep] ** 2 / both[keep]).sum())
    return stat, _critical(int(keep.sum()) - 1)


def test_inverse_cdf_draws_the_softmax_distribution_and_a_wrong_one_is_rejected() -> None:
    logits = _logits()
    sampling = SamplingParams(temperature=0.7, seed=0)
    tokens = _draw(logits, sampling, "cdf")
    stat, critical = _goodness_of_fit(tokens, (logits / 0.7).softmax(-1))
    assert stat < critical
    wrong, critical_wrong = _goodness_of_fit(tokens, (logits / 0.75).softmax(-1))
    assert wrong > critical_wrong


def test_inverse_cdf_matches_the_full_vocabulary_multinomial_draw() -> None:
    logits = _logits(1)
    sampling = SamplingParams(temperature=0.7, seed=0)
    probs = (logits / 0.7).softmax(-1)
    ours = _draw(logits, sampling, "cdf")
    draws = dict(num_samples=ROWS * ROUNDS, replacement=True)
    full = torch.multinomial(probs, **draws, generator=torch.Generator().manual_seed(7))
    stat, critical = _homogeneity(ours, full, probs)
    assert stat < critical
    off = torch.multinomial((logits / 0.75).softmax(-1), **draws, generator=torch.Generator().manual_seed(7))
    wrong, critical_wrong = _homogeneity(ours, off, probs)
    assert wrong > critical_wrong


def test_top_p_draws_the_renormalized_nucleus() -> None:
    logits = _logits(2)
    sampling = SamplingParams(temperature=0.7, top_p=0.8, seed=0)
    tokens = _draw(logits, sampling, "cdf")
    probs = (logits / 0.7).softmax(-1)
    ordered, index = probs.sort(descending=True)
    keep = (ordered.cumsum(-1) - ordered) <= 0.8
    nucleus = torch.zeros_like(probs).scatter_(0, index[keep], ordered[keep])
    assert set(tokens.tolist()) <= set(index[keep].tolist())
    stat, critical = _goodness_of_fit(tokens, nucleus / nucleus.sum())
    assert stat < critical
    wrong, critical_wrong = _goodness_of_fit(tokens, probs)  # the distribution before the cut
    assert wrong > critical_wrong


@pytest.mark.parametrize("scale", [0.3, 2.0, 8.0])
@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_top_p_candidates_keep_what_the_full_sort_keeps(scale: float, top_p: float) -> None:
    # scale 0.3 is a flat distribution: the first candidates never cover top_p and must widen
    logits = torch.randn(16, 49152, generator=torch.Generator().manual_seed(3)) * scale
    probs = logits.softmax(-1)
    values, index = top_p_candidates(probs, top_p)
    ordered, full_index = probs.sort(-1, descending=True)
    full_keep = (ordered.cumsum(-1) - ordered) <= top_p
    for row in range(len(probs)):
        kept = index[row][values[row] > 0]
        expected = full_index[row][full_keep[row]]
        assert sorted(kept.tolist()) == sorted(expected.tolist())  # tied tokens may swap places
        assert torch.equal(values[row][values[row] > 0], ordered[row][full_keep[row]])


def test_the_same_seeds_draw_the_same_tokens_and_other_seeds_others() -> None:
    logits = _logits(4).expand(8, -1).clone()
    sampling = SamplingParams(temperature=0.7, top_p=0.9, seed=0)

    def draw(seeds):
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        return [sample_next(logits.clone(), sampling, generators, None).tolist() for _ in range(20)]

    assert draw(range(8)) == draw(range(8))
    assert draw(range(8)) != draw(range(8, 16))


def test_suppressed_tokens_are_never_drawn() -> None:
    logits = torch.zeros(64, 10)
    logits[:, 3] = 5.0
    generators = [torch.Generator().manual_seed(s) for s in range(64)]
    tokens = sample_next(logits, SamplingParams(temperature=1.0, seed=0), generators, [3, 4])
    assert not set(tokens.tolist()) & {3, 4}
