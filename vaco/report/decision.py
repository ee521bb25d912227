"""What a comparison can decide: differs, equivalent within a declared margin, or undecided.

A rule stated before the data (``vaco report --margin M``, normalised units; default
:data:`DEFAULT_MARGIN`). For a difference ``D`` (a drop, a difference of drops, a ratio minus 1):

* **differs**: its 95% interval excludes 0 (a two-sided test at 5%);
* **equivalent**: its 90% interval lies inside ``(-M, M)`` (two one-sided tests at 5%, TOST;
  Schuirmann 1987), so a difference as large as the margin is ruled out;
* **undecided**: neither. It then says how many seeds per task would decide it at 80% power:
  :func:`seeds_needed`, from the observed paired spread.

With at least :data:`PERMUTATION_BELOW` seeds per task the intervals are the paired stratified
bootstrap's (:mod:`vaco.report.robustness`). With fewer, a bootstrap has a handful of distinct
resamples (10 for 3 seeds), so the tests are exact **sign-flip permutation tests** on the per-seed
paired differences instead (:func:`sign_flip_p`; their mean is the statistic, not the IQM): every
one of the ``2^m`` sign patterns of the ``m`` differences (seeds x tasks) when ``2^m`` is at most
:data:`EXACT_PATTERNS`, else that many random patterns.

The power calculation is the normal approximation for a mean of paired differences over T tasks
with per-task SDs ``s_t``: ``SE(n) = sqrt(mean_t s_t^2 / (n T))``. The power to show ``differs``
when the true difference is the observed ``d`` is ``Phi(d/SE - z_.975) + Phi(-d/SE - z_.975)``; to
show ``equivalent`` (``|d| < M``), ``Phi((M - d)/SE - z_.95) + Phi((M + d)/SE - z_.95) - 1``. The
seeds needed are the smallest n at which either reaches 80%. The minimum detectable difference at the current
n is ``(z_.975 + z_.8) SE(n)``. ``tests/test_decision.py`` checks both against a simulation.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import norm

__all__ = [
    "DEFAULT_MARGIN",
    "PERMUTATION_BELOW",
    "EXACT_PATTERNS",
    "Verdict",
    "decide",
    "bootstrap_p",
    "decide_by_intervals",
    "decide_by_sign_flips",
    "holm",
    "minimum_detectable",
    "seeds_needed",
    "sign_flip_p",
]

DEFAULT_MARGIN = 0.05  # normalised score units: the smallest difference that matters
PERMUTATION_BELOW = 10  # fewer seeds per task than this: exact sign-flip tests, not the bootstrap
EXACT_PATTERNS = 2**20  # at most this many sign patterns are enumerated; beyond, as many are drawn
ALPHA = 0.05
POWER = 0.8


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The decision on one difference, and what it rests on."""

    word: str  # "differs" | "equivalent" | "undecided"
    margin: float
    method: str  # "bootstrap" | "sign-flip (exact)" | "sign-flip (random)"
    interval95: tuple[float, float] | None
    interval90: tuple[float, float] | None
    p_differs: float | None  # two-sided p of "no difference" (sign-flip, or the bootstrap's percentile p)
    p_equivalent: float | None  # the larger TOST p
    seeds_needed: int | None  # per task, to decide at 80% power (undecided only)
    mdd: float | None  # minimum detectable difference at the current seeds, 80% power

    def text(self) -> str:
        """``differs`` / ``equivalent (+-M)`` / ``undecided (seeds needed: N)``."""
        if self.word == "equivalent":
            return f"equivalent (+-{self.margin:g})"
        if self.word == "undecided":
            return "undecided" + (f" (seeds needed: {self.seeds_needed})" if self.seeds_needed else "")
        return self.word


def _task_sd2(paired: np.ndarray) -> float:
    """mean over tasks of the sample variance (ddof 1) of the per-seed paired differences."""
    if paired.shape[0] < 2:
        return math.nan
    return float(np.mean(paired.var(axis=0, ddof=1)))


def minimum_detectable(paired: np.ndarray, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true difference a two-sided test at ``alpha`` detects with ``power`` at the
    current seeds: ``(z_{1-alpha/2} + z_power) sqrt(mean_t s_t^2 / (n T))``."""
    n, tasks = paired.shape
    return float((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * math.sqrt(_task_sd2(paired) / (n * tasks)))


def _power_differs(se: float, d: float, alpha: float) -> float:
    z = norm.ppf(1 - alpha / 2)
    return float(norm.cdf(d / se - z) + norm.cdf(-d / se - z))


def _power_equivalent(se: float, d: float, margin: float, alpha: float) -> float:
    z = norm.ppf(1 - alpha)
    return float(max(0.0, norm.cdf((margin - d) / se - z) + norm.cdf((margin + d) / se - z) - 1))


def seeds_needed(
    paired: np.ndarray, difference: float, margin: float, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """Seeds per task that would decide the comparison with ``power`` if the true difference were
    the observed ``difference``: the fewer of what ``differs`` and what ``equivalent`` would need
    (normal approximation, solved for n; ``paired`` is seeds x tasks). None when the spread is
    unknown (one seed) or no number of seeds up to 100,000 would do."""
    sd2 = _task_sd2(paired)
    tasks = paired.shape[1]
    if not math.isfinite(sd2):
        return None
    if sd2 == 0:
        return paired.shape[0]
    d = abs(difference)

    def decides(n: int) -> bool:
        se = math.sqrt(sd2 / (n * tasks))
        return (d > 0 and _power_differs(se, d, alpha) >= power) or (
            d < margin and _power_equivalent(se, d, margin, alpha) >= power
        )

    low, high = 2, 100_000
    if not decides(high):
        return None
    while low < high:  # power grows with n
        mid = (low + high) // 2
        if decides(mid):
            high = mid
        else:
            low = mid + 1
    return low


def _patterns(m: int, seed: int):
    """All 2^m sign patterns (exact) or EXACT_PATTERNS random ones, as a (patterns x m) array."""
    if 2**m <= EXACT_PATTERNS:
        return np.array(list(itertools.product((1.0, -1.0), repeat=m))), True
    rng = np.random.default_rng(seed)
    return rng.choice((1.0, -1.0), size=(EXACT_PATTERNS, m)), False


def sign_flip_p(
    differences: Sequence[float], alternative: str = "two-sided", shift: float = 0.0, seed: int = 0
) -> tuple[float, bool]:
    """The sign-flip permutation p-value of the mean of ``differences - shift`` (paired units).

    ``alternative``: ``"two-sided"`` (|mean| as large), ``"greater"`` (mean as large), ``"less"``.
    Returns ``(p, exact)``; the observed pattern is one of the patterns, so ``p >= 1 / 2^m``.
    """
    x = np.asarray(differences, dtype=np.float64).ravel() - shift
    flips, exact = _patterns(x.size, seed)
    means = flips @ x / x.size
    observed = x.mean()
    tol = 1e-12 * max(1.0, abs(observed))
    if alternative == "two-sided":
        hits = np.abs(means) >= abs(observed) - tol
    elif alternative == "greater":
        hits = means >= observed - tol
    elif alternative == "less":
        hits = means <= observed + tol
    else:
        raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")
    return float(hits.mean()), exact


def bootstrap_p(samples: np.ndarray, margin: float) -> tuple[float, float]:
    """The percentile bootstrap's p-values, consistent with its intervals: two-sided for "no
    difference" (``2 min(P*(D <= 0), P*(D >= 0))``) and the larger TOST p against ``+-margin``
    (``max(P*(D <= -M), P*(D >= M))``), each with the ``(count + 1) / (B + 1)`` correction."""
    s = np.asarray(samples, dtype=np.float64)
    b = len(s)

    def tail(count) -> float:
        return (float(count) + 1.0) / (b + 1.0)

    p_diff = min(1.0, 2.0 * min(tail((s <= 0).sum()), tail((s >= 0).sum())))
    p_eq = max(tail((s <= -margin).sum()), tail((s >= margin).sum()))
    return p_diff, p_eq


def decide_by_intervals(interval95, interval90, margin: float, null: float = 0.0) -> str:
    """``differs`` if the 95% interval excludes ``null``; ``equivalent`` if the 90% interval lies in
    ``null +- margin``; else ``undecided``."""
    low, high = interval95
    if low > null or high < null:
        return "differs"
    low, high = interval90
    if null - margin < low and high < null + margin:
        return "equivalent"
    return "undecided"


def decide_by_sign_flips(paired: np.ndarray, margin: float, seed: int = 0) -> tuple[str, float, float, bool]:
    """Exact (or random) sign-flip tests on the per-seed paired differences: ``differs`` at two-sided
    p < 0.05, ``equivalent`` when both one-sided tests against -M and +M reject at 0.05 (TOST).
    Returns (word, p_differs, p_equivalent, exact)."""
    d = np.asarray(paired, dtype=np.float64).ravel()
    p_diff, exact = sign_flip_p(d, "two-sided", seed=seed)
    p_low, _ = sign_flip_p(d, "greater", shift=-margin, seed=seed)  # H0: mean <= -M
    p_high, _ = sign_flip_p(d, "less", shift=margin, seed=seed)  # H0: mean >= +M
    p_eq = max(p_low, p_high)
    word = "differs" if p_diff < ALPHA else "equivalent" if p_eq < ALPHA else "undecided"
    return word, p_diff, p_eq, exact


def decide(
    point: float,
    paired: np.ndarray,
    margin: float,
    samples: np.ndarray | None = None,
    seed: int = 0,
) -> Verdict:
    """The verdict on a difference whose estimate is ``point``.

    Args:
        point: the difference as reported (e.g. a difference of IQMs).
        paired: the per-seed paired differences, seeds x tasks (their spread sizes the study).
        margin: the smallest difference that matters (normalised units).
        samples: the bootstrap distribution of ``point`` (used with >= PERMUTATION_BELOW seeds).
        seed: the random patterns' seed when there are too many to enumerate.
    """
    n = paired.shape[0]
    mdd = minimum_detectable(paired) if n > 1 else None
    if n < PERMUTATION_BELOW or samples is None:
        word, p_diff, p_eq, exact = decide_by_sign_flips(paired, margin, seed)
        i95 = i90 = None
        method = "sign-flip (exact)" if exact else "sign-flip (random)"
    else:
        i95 = tuple(float(v) for v in np.percentile(samples, [2.5, 97.5]))
        i90 = tuple(float(v) for v in np.percentile(samples, [5, 95]))
        word, method = decide_by_intervals(i95, i90, margin), "bootstrap"
        p_diff, p_eq = bootstrap_p(samples, margin)
    needed = None
    if word == "undecided":
        needed = seeds_needed(paired, point, margin)
        if needed is not None:
            # undecided at n: at least one seed more, and enough pairs for a sign-flip test to reach p < 0.05
            needed = max(needed, n + 1, math.ceil(6 / paired.shape[1]))
    return Verdict(word, margin, method, i95, i90, p_diff, p_eq, needed, mdd)


def holm(pvalues: Sequence[float], alpha: float) -> tuple[list[bool], list[float]]:
    """Holm's step-down test of a family at family-wise level ``alpha``: which hypotheses are
    rejected, and the adjusted p-values (``max_{j <= i} min(1, (m - j + 1) p_(j))`` in sorted order).

    The same numbers as statsmodels' ``multipletests(method="holm")`` (a test checks it), written
    here because that function runs ``gc.collect()`` on every call: seconds a call in a process
    that holds torch and MLflow, and the report calls this once per table row. (The
    group-sequential form, :func:`sequential_holm`, is not in statsmodels.)"""
    p = np.asarray(pvalues, dtype=np.float64)
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled) if m else scaled
    return [bool(a <= alpha) for a in adjusted], [float(a) for a in adjusted]
