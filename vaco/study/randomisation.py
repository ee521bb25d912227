"""The randomisation test a study plan's looks can be judged by (``plan.test: randomisation``), and
the report's percentile bootstrap p in the same vectorised form, so that a simulation can run either
thousands of times (``tests/test_plan_size.py``, ``scripts/plan_power.py``).

**The estimate** is the report's difference of drops, ``D = (IQM(y_ref) - IQM(y_K)) - (IQM(x_ref) -
IQM(x_K))`` for an arm ``x`` against ``y`` (positive: ``x`` loses less), each IQM over a cell's seeds x
tasks (rliable's ``aggregate_iqm``: scipy's 25% trimmed mean of the flattened scores).

**The exchangeable units** are the (seed, task) pairs. A seed starts every arm from the same initial
weights and environment seeds, so a unit holds two pairs of runs, ``(x_ref, x_K)`` and ``(y_ref,
y_K)``. Under the sharp null that the arm does not matter, swapping the two pairs in any set of units
leaves the data's distribution unchanged; the p-value is the share of swap patterns whose statistic is
at least as extreme as the observed one. That is exact whatever the scores' distribution (heavy tails,
seeds that collapse): with every pattern enumerated (``2^(seeds x tasks)`` at most :data:`ENUMERATE`),
or with ``reps`` patterns drawn at random and ``p = (1 + hits) / (1 + reps)`` (Phipson and Smyth
2010), ``P(p <= a) <= a`` for every ``a``.

**The statistic is studentised**: ``D`` over Yuen's (1974) winsorised standard error of the paired
trimmed means (:func:`studentised_difference`). Any statistic gives an exact test of the sharp null;
the studentised one also keeps its size when the null is the composite one the plan states (equal
drops) but the arms' levels differ, where swapping mixes two shifted distributions and the raw ``D``'s
swap distribution is too narrow (the studentised permutation tests of Janssen 1997 and Chung and
Romano 2013). That is asymptotic, not exact: where one arm's runs are far more heavy-tailed than the
other's, its p falls below a plan's smallest Holm level about twice as often as the level allows at
12-36 seeds (CISPO against PPO-clip, ``tests/test_plan_size.py``; docs/sweeps.md), while the family-wise
rate stays at 5%. The verdict's estimate is still ``D``; the studentisation only orders the patterns.

**Equivalence** (TOST against ``+-M``) inverts the same test: the arm's K-scores shifted by ``d``
shift ``D`` by exactly ``-d`` (the IQM is translation-equivariant), so ``H0: D = d`` is tested as
``D = 0`` on the shifted data, one-sided; the TOST p is the larger of the tests at ``-M`` (greater) and
``+M`` (less), as :func:`vaco.report.decision.decide_by_sign_flips` does for means.

**Where one arm is far more heavy-tailed or spread than the other** the swap distribution of the
studentised ``D`` is symmetric while the statistic's own small-sample distribution is skewed, and
the test rejects too often at the smallest levels a Holm plan uses. The **bootstrap-t**
(:func:`bootstrap_t_p`; Efron and Tibshirani 1993, ch. 12; Hall 1992) resamples the paired units
within each task, as the report's bootstrap does, and refers the studentised ``D`` to the resamples'
``(D* - D) / SE*``: it sees the skew and the heteroscedasticity but is not exact. ``test:
randomisation+bootstrap-t`` (:func:`agreement_p`) says "differs" only where both do: its p is the
larger of the two, so its size is at most the smaller of theirs under any null, the sharp null
included (where the randomisation p is exact). Measured in ``tests/test_plan_size.py`` on real arms
moved to equal drops (CISPO, IMPALA, MIS and TIS against PPO-clip, 12-36 seeds, the whole
group-sequential Holm rule): each arm's rate at the smallest Holm level within Monte Carlo error of
that level, where the randomisation test alone gives CISPO about twice it; docs/sweeps.md gives the
figures and the power it costs.

**Why not the percentile bootstrap**: with 12 seeds a cell and scores with heavy tails, its p falls
below a group-sequential Holm plan's first-look levels too often under the null
(``tests/test_plan_size.py``; docs/sweeps.md gives the measured rates). :func:`bootstrap_p` is the
report's paired stratified percentile bootstrap (:func:`vaco.report.robustness.paired_bootstrap`
judged by :func:`vaco.report.decision.bootstrap_p`), vectorised, so the size tests run the test the
report runs.
"""

from __future__ import annotations

import itertools

import numpy as np

from vaco.report.robustness import iqm

__all__ = [
    "ENUMERATE",
    "ESTIMANDS",
    "SWAPS",
    "agreement_p",
    "bootstrap_p",
    "bootstrap_samples",
    "bootstrap_t_p",
    "drop_difference",
    "estimate",
    "randomisation_p",
    "studentised_difference",
    "swap_patterns",
]

SWAPS = 20_000  # random swap patterns a plan's p is computed from (its Monte Carlo SD at p = 0.007 is 0.0006)
ENUMERATE = 2**14  # at most this many patterns: all of them, exactly
_CHUNK = 4096  # patterns per vectorised block (memory: chunk x seeds x tasks x 4 floats)
#: what a comparison estimates: ``pooled``, the difference of drops of IQMs over every (seed, task)
#: unit of a cell (stage 1's); ``task-mean``, the mean over tasks of each task's own difference of
#: drops (each IQM over that task's seeds), so that every task weighs alike whatever the arms' levels
ESTIMANDS = ("pooled", "task-mean")


def drop_difference(
    xr: np.ndarray, xk: np.ndarray, yr: np.ndarray, yk: np.ndarray, estimand: str = "pooled"
) -> np.ndarray:
    """``drop(y) - drop(x)`` with drops of IQMs (positive: ``x`` loses less), over the last two axes
    (seeds, tasks): pooled over both, or (``task-mean``) per task over the seeds, then averaged."""
    if estimand == "task-mean":
        xr, xk, yr, yk = (_by_task(c)[..., None] for c in (xr, xk, yr, yk))  # IQMs over each task's seeds
        return ((iqm(yr) - iqm(yk)) - (iqm(xr) - iqm(xk))).mean(axis=-1)
    return (iqm(yr) - iqm(yk)) - (iqm(xr) - iqm(xk))


def studentised_difference(
    xr: np.ndarray, xk: np.ndarray, yr: np.ndarray, yk: np.ndarray, estimand: str = "pooled"
) -> np.ndarray:
    """:func:`drop_difference` over its standard error: Yuen's (1974) winsorised variance of a trimmed
    mean, for the paired combination of the four cells. Each cell (flattened seeds x tasks, ``N``
    units) is winsorised at the cut its IQM trims (``g = int(N / 4)`` each side); with ``z_u =
    w_yr - w_yk - w_xr + w_xk`` per unit, ``SE^2 = sum_u (z_u - mean z)^2 / (h (h - 1))``, ``h = N - 2g``.
    ``task-mean``: the task-mean difference over the same pooled SE (see :func:`estimate`)."""
    d, se = estimate(xr, xk, yr, yk, estimand)
    return d / np.maximum(se, 1e-12)


def estimate(xr, xk, yr, yk, estimand: str = "pooled") -> tuple[np.ndarray, np.ndarray]:
    """(:func:`drop_difference` for ``estimand``, the scale it is studentised by) over the last two axes.

    The scale is Yuen's SE of the pooled difference (every unit's winsorised contrast) for both
    estimands. For the task-mean one, each task's own Yuen SE (``sqrt(sum_t SE_t^2) / T``, 6 kept seeds
    a task at 12) is the textbook choice but too noisy a studentiser: with it the combined test's rate at
    a plan's smallest Holm level was 1.7x that level for IMPALA against PPO-clip (0.89% at 0.513%, 1,500
    null studies), where the pooled scale keeps every arm within it (``tests/test_plan_size.py``;
    docs/sweeps.md). Any scale keeps the swap test exact under the sharp null; this one also spans the
    tasks' spread between each other, so the test is conservative where the tasks differ."""
    if estimand not in ESTIMANDS:
        raise ValueError(f"estimand must be one of {', '.join(ESTIMANDS)}, got {estimand!r}")
    d, se = _yuen(xr, xk, yr, yk)
    if estimand == "task-mean":
        d = drop_difference(xr, xk, yr, yk, estimand)
    return d, se


def _by_task(c: np.ndarray) -> np.ndarray:
    """(..., seeds, tasks) -> (..., tasks, seeds): each task's seeds on the last axis."""
    return np.swapaxes(np.asarray(c), -1, -2)


def _yuen(xr, xk, yr, yk) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`drop_difference`, Yuen's standard error of it) over the last two axes."""
    cells = [c.reshape(*c.shape[:-2], -1) for c in (xr, xk, yr, yk)]
    n = cells[0].shape[-1]
    cut = int(0.25 * n)
    h = n - 2 * cut
    means, wins = [], []
    for c in cells:
        ordered = np.sort(c, axis=-1)
        means.append(ordered[..., cut : n - cut].mean(axis=-1))
        # winsorised at the cut: np.clip's value, without its wrapper's cost (a third of a size test)
        wins.append(np.minimum(np.maximum(c, ordered[..., cut : cut + 1]), ordered[..., n - cut - 1 : n - cut]))
    d = (means[2] - means[3]) - (means[0] - means[1])
    z = wins[2] - wins[3]
    z -= wins[0]
    z += wins[1]
    z -= z.mean(axis=-1, keepdims=True)
    se = np.sqrt((z * z).sum(axis=-1) / max(h * (h - 1), 1))
    return d, se


def swap_patterns(units: int, reps: int, seed: int) -> tuple[np.ndarray, bool]:
    """Which units are swapped in each pattern, (patterns x units) booleans: every pattern when there
    are at most :data:`ENUMERATE`, else ``reps`` drawn uniformly. Returns (patterns, exact)."""
    if 2**units <= ENUMERATE:
        return np.array(list(itertools.product((False, True), repeat=units)), dtype=bool).reshape(-1, units), True
    return np.random.default_rng(seed).integers(0, 2, size=(reps, units)).astype(bool), False


def _swapped_statistics(cells, patterns: np.ndarray, statistic) -> np.ndarray:
    xr, xk, yr, yk = (np.asarray(c, dtype=np.float64) for c in cells)
    shape = xr.shape
    out = np.empty(len(patterns))
    for start in range(0, len(patterns), _CHUNK):
        swap = patterns[start : start + _CHUNK].reshape(-1, *shape)
        out[start : start + len(swap)] = statistic(
            np.where(swap, yr, xr), np.where(swap, yk, xk), np.where(swap, xr, yr), np.where(swap, xk, yk)
        )
    return out


def randomisation_p(
    cells,
    margin: float | None = None,
    reps: int = SWAPS,
    seed: int = 0,
    studentise: bool = True,
    estimand: str = "pooled",
) -> tuple[float, float | None, bool]:
    """The randomisation test of "no difference of drops" on ``cells = (x_ref, x_K, y_ref, y_K)``
    (each seeds x tasks, rows paired by seed): the two-sided p, the TOST p against ``+-margin``
    (None without a margin), and whether every pattern was enumerated. The same patterns serve
    every test; ``studentise=False`` orders them by the raw ``D`` (for comparison only). The
    ``task-mean`` estimand shifts by ``d`` exactly as the pooled one does (each task's IQM moves by
    ``d``), so the same inversion gives its TOST."""
    xr, xk, yr, yk = (np.asarray(c, dtype=np.float64) for c in cells)
    patterns, exact = swap_patterns(xr.size, reps, seed)
    tol = 1e-12

    def p_of(hits: np.ndarray) -> float:
        count = float(hits.sum())
        return count / len(hits) if exact else (1.0 + count) / (1.0 + len(hits))

    def test(shift: float, side: str) -> float:
        shifted = (xr, xk - shift, yr, yk)  # D(shifted) = D - shift
        function = studentised_difference if studentise else drop_difference

        def statistic(*c):
            return function(*c, estimand=estimand)

        observed = float(statistic(*shifted))
        null = _swapped_statistics(shifted, patterns, statistic)
        scale = tol * max(1.0, abs(observed))
        if side == "two-sided":
            return p_of(np.abs(null) >= abs(observed) - scale)
        if side == "greater":
            return p_of(null >= observed - scale)
        return p_of(null <= observed + scale)

    p_differs = test(0.0, "two-sided")
    if margin is None:
        return p_differs, None, exact
    p_equivalent = max(test(-margin, "greater"), test(margin, "less"))
    return p_differs, p_equivalent, exact


def bootstrap_p(cells, margin: float, reps: int = 2000, seed: int = 0, estimand: str = "pooled") -> tuple[float, float]:
    """The report's percentile bootstrap p-values of the difference of drops (two-sided, TOST): the
    resamples :func:`vaco.report.robustness.paired_bootstrap` draws (per resample and task, one draw
    of seed rows for every cell; the same random stream), judged by
    :func:`vaco.report.decision.bootstrap_p`."""
    from vaco.report.decision import bootstrap_p as percentile_p

    return percentile_p(bootstrap_samples(cells, reps, seed, estimand), margin)


def bootstrap_samples(cells, reps: int = 2000, seed: int = 0, estimand: str = "pooled") -> np.ndarray:
    """``reps`` paired, task-stratified resamples of the difference of drops (the report's stream)."""
    xr, xk, yr, yk = (np.asarray(c, dtype=np.float64) for c in cells)
    n, tasks = xr.shape
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n, size=(reps, n, tasks))  # the same stream as reps draws of (n, tasks)
    columns = np.arange(tasks)[None, None, :]
    return drop_difference(*(c[rows, columns] for c in (xr, xk, yr, yk)), estimand=estimand)


def bootstrap_t_p(
    cells, margin: float | None = None, reps: int = SWAPS, seed: int = 0, estimand: str = "pooled"
) -> tuple[float, float | None]:
    """The symmetric bootstrap-t p of "no difference of drops" on ``cells = (x_ref, x_K, y_ref, y_K)``
    (each seeds x tasks, rows paired by seed), and its TOST p against ``+-margin`` (None without one).

    Each resample draws, per task, ``seeds`` rows with replacement, one draw for all four cells (the
    report's paired stratified resampling); ``t* = (D* - D) / SE*`` with ``SE`` Yuen's
    (:func:`studentised_difference`). Two-sided: ``p = (1 + #{|t*| >= |t|}) / (1 + reps)`` with ``t =
    D / SE``. TOST: one-sided tests of ``D = -margin`` (greater) and ``D = +margin`` (less) with ``t =
    (D -+ margin) / SE`` against the same ``t*``, the larger p. A resample whose SE is 0 counts as
    extreme, which can only raise p."""
    xr, xk, yr, yk = (np.asarray(c, dtype=np.float64) for c in cells)
    n, tasks = xr.shape
    d, se = (float(v) for v in estimate(xr, xk, yr, yk, estimand))
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n, size=(reps, n, tasks))
    at = rows * tasks + np.arange(tasks)  # c[rows, task] as flat positions: one gather a cell
    resampled = [np.take(c.ravel(), at) for c in (xr, xk, yr, yk)]
    d_star, se_star = estimate(*resampled, estimand=estimand)
    degenerate = ~(se_star > 0)  # every resampled unit alike: counted as extreme, which can only raise p
    t_star = (d_star - d) / np.where(degenerate, 1.0, se_star)
    if not se > 0:  # every unit alike: no spread to studentise by
        return 1.0, (None if margin is None else 1.0)

    def p_of(hits: np.ndarray) -> float:
        return (1.0 + float((hits | degenerate).sum())) / (1.0 + reps)

    t = d / se
    p_differs = p_of(np.abs(t_star) >= abs(t) * (1 - 1e-12))
    if margin is None:
        return p_differs, None
    above = (d + margin) / se  # H0: D = -margin, against D > -margin
    below = (d - margin) / se  # H0: D = +margin, against D < +margin
    p_equivalent = max(p_of(t_star >= above - 1e-12 * abs(above)), p_of(t_star <= below + 1e-12 * abs(below)))
    return p_differs, p_equivalent


def agreement_p(
    cells, margin: float | None = None, reps: int = SWAPS, seed: int = 0, estimand: str = "pooled"
) -> tuple[float, float | None, bool]:
    """``test: randomisation+bootstrap-t``: the larger of :func:`randomisation_p`'s and
    :func:`bootstrap_t_p`'s p (and TOST p) on the same cells, so "differs" (or "equivalent") needs
    both. Returns (p, TOST p, whether the swap patterns were enumerated)."""
    p_r, tost_r, exact = randomisation_p(cells, margin, reps, seed, estimand=estimand)
    p_t, tost_t = bootstrap_t_p(cells, margin, reps, seed, estimand=estimand)
    tost = None if margin is None else max(tost_r, tost_t)
    return max(p_r, p_t), tost, exact
