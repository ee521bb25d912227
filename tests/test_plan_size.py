"""Whether a study plan's first look holds its size: the rule's false-"differs" rate under the null,
computed by label swaps of committed runs with heavy tails (docs/data/confirm_k4.csv.gz: 12 seeds
of four arms on Hopper-v5 and HalfCheetah-v5 at K = 1 and 4, 3 Hopper seeds of PPO-clip collapsing
at K = 4). Each simulated study gives every (seed, task) unit a random permutation of the four arms'
(K = 1, K = 4) pairs, so every comparison of the confirmatory family (three arms against the one
labelled ppo_clip) is null and they keep their shared control, then judges the family by the
group-sequential Holm rule at the first of the looks [12, 24, 36] (Pocock, alpha 0.05).

The rule holds its size when (a) the family-wise rate and (b) the single comparisons' rate at the
first Holm step's level are each within the 99.9% binomial quantile of their nominal bound (the
family's: m times that level, Bonferroni). The report's percentile bootstrap does not (it is
expected to fail: ``xfail(strict=True)``, so the suite goes red if it ever passes); the plan's
randomisation test does. And the randomisation module against float64 loops written here.
"""

from __future__ import annotations

import itertools
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom, trim_mean

from vaco.report.robustness import iqm
from vaco.study import randomisation as Z
from vaco.study.sizing import (
    TESTS,
    equal_drop_null,
    first_look_rates,
    null_rates_by_test,
    plan_p,
    plan_ps,
    sequential_null_rates,
    units,
)

REPO = Path(__file__).resolve().parents[1]
ARMS = ("ppo_clip", "vaco", "vaco_delta01", "vaco_delta04")  # the first is the family's control
REFERENCES = {"Hopper-v5": (300.0, 1500.0), "HalfCheetah-v5": (-300.0, 1800.0)}  # the study's fixed references
LOOKS, ALPHA, M = [12, 24, 36], 0.05, 3


def _units(data_file: str, arms: tuple[str, ...]) -> np.ndarray:
    """(arm, K in (1, 4), seed, task) normalised final scores of a committed file's seeds every arm has
    (12 a cell, two tasks)."""
    from vaco.report.runs import read_runs

    data = units(read_runs(REPO / "docs/data" / data_file), arms, (1, 4), REFERENCES, "eval/return")
    assert data.shape == (len(arms), 2, 12, 2)
    return data


@cache
def committed_units() -> np.ndarray:
    return _units("confirm_k4.csv.gz", ARMS)


def _rates(test: str, studies: int, seed: int, shift: float = 0.0):
    return first_look_rates(committed_units(), test, LOOKS, ALPHA, studies, seed, shift)


def _within(hits: int, trials: int, rate: float) -> bool:
    return bool(hits <= binom.ppf(0.999, trials, rate))


@pytest.mark.slow
@pytest.mark.parametrize(
    "test",
    [
        "randomisation",
        pytest.param(
            "bootstrap",
            marks=pytest.mark.xfail(strict=True, reason="the percentile bootstrap is liberal at a 12-seed first look"),
        ),
    ],
)
def test_the_plans_first_look_holds_its_size_on_label_swapped_heavy_tailed_runs(test):
    studies = 3000
    family_hits, p, first = _rates(test, studies, seed=7)
    single = int((p <= first).sum())
    # the rule's nominal bounds at look 1 of [12, 24, 36]: the first Holm step's level (alpha/3's
    # Pocock boundary, 0.00693) per comparison, three times that for the family
    assert first == pytest.approx(0.00693, abs=5e-5)
    assert _within(family_hits, studies, M * first), (family_hits / studies, M * first)
    assert _within(single, p.size, first), (single / p.size, first)


@pytest.mark.slow
def test_the_randomisation_test_holds_its_size_when_the_arms_differ_in_level_not_in_drop():
    """The plan's null is equal drops, not identical arms: three arms 0.3 above the control at both K
    (normalised units). Studentising keeps the swap test's size there, at 5% as at the first look's
    level (the unstudentised statistic is measured liberal there: docs/sweeps.md)."""
    studies = 1500
    family_hits, p, first = _rates("randomisation", studies, seed=11, shift=0.3)
    assert _within(int((p <= 0.05).sum()), p.size, 0.05), (p <= 0.05).mean()
    assert _within(int((p <= first).sum()), p.size, first), (p <= first).mean()
    assert _within(family_hits, studies, M * first)


# ------------------------------------------------------------------------------ the whole rule, heavy-tailed arms
#: the lag benchmark's arms whose runs are heavy-tailed or differ most from PPO-clip's in spread (12 seeds each)
HEAVY = ("ppo_clip", "cispo", "impala", "mis", "tis")


@cache
def lag_bench_units() -> np.ndarray:
    return _units("lag_bench_runs.csv.gz", HEAVY)


def test_the_equal_drop_null_keeps_each_arms_shape_and_gives_every_arm_the_controls_drop():
    data = lag_bench_units()
    null = equal_drop_null(data)
    drops = [_iqm64(null[a, 0]) - _iqm64(null[a, 1]) for a in range(len(HEAVY))]
    assert drops == pytest.approx([drops[0]] * len(HEAVY), abs=1e-12)
    assert np.array_equal(null[:, 0], data[:, 0]) and np.array_equal(null[0], data[0])
    moved = null[1:, 1] - data[1:, 1]  # one constant an arm: spreads and tails unchanged
    assert np.allclose(moved, moved[:, :1, :1])


#: what each test's rate at the smallest Holm level stays within, arm by arm (see the test's docstring)
WITHIN = {
    "randomisation": {"cispo": False, "impala": True, "mis": True, "tis": True},
    "randomisation+bootstrap-t": {"cispo": True, "impala": True, "mis": True, "tis": True},
}


@pytest.mark.slow
def test_the_whole_sequential_rule_where_the_arms_differ_in_shape():
    """Four corrections of the lag benchmark (CISPO, IMPALA, MIS, TIS: heavy tails, collapsing seeds,
    other spreads than PPO-clip's) each moved to PPO-clip's drop, every arm drawing its own committed
    seeds, the family of four judged at 12, 24 and 36 seeds by the group-sequential Holm rule.

    The family-wise rate of "differs" over every look is within the 99.9% binomial quantile of 5%. Each
    comparison's rate of p at or below the smallest level the rule uses (the first Holm step's, 0.00513
    at every Pocock look), pooled over the looks, is within that quantile of the level (0.87% at 4,500
    looks) for every arm by ``randomisation+bootstrap-t`` (measured: CISPO 0.58%, the others 0.24-0.40%,
    family 3.9%). By the randomisation test alone it is within for IMPALA, MIS and TIS and **above it
    for CISPO** (measured 1.0% at 999 and at 1,999 patterns a p), whose K = 4 runs are the most heavy-tailed: swapping its units with
    PPO-clip's mixes two differently skewed distributions, and the swap distribution, symmetric, does
    not see the skew. That excess is what docs/sweeps.md and the randomisation module state; a change
    that removes it makes this assertion fail, so the docs are revised with it. The report's percentile
    bootstrap, on the same null studies, is liberal for the family (measured 7.0-7.6%): asserted, so a
    change that makes it hold shows here too."""
    swaps = 999  # patterns a p (the combined test draws as many bootstrap-t resamples)
    tests = ("randomisation", "randomisation+bootstrap-t", "bootstrap")
    by_test = null_rates_by_test(lag_bench_units(), tests, LOOKS, ALPHA, 1500, seed=13, swaps=swaps)
    for test, rates in by_test.items():
        assert rates.first_levels == pytest.approx((0.00513,) * 3, abs=5e-6)
        family = _within(rates.family, rates.studies, ALPHA)
        assert family is (test != "bootstrap"), (test, rates.family / rates.studies)
        if test == "bootstrap":
            continue
        looks, level = len(LOOKS), rates.first_levels[0]
        within = {
            name: _within(int(rates.per_look[:, c].sum()), rates.studies * looks, level)
            for c, name in enumerate(HEAVY[1:])
        }
        assert within == WITHIN[test], (test, within, (rates.per_look.sum(axis=0) / (rates.studies * looks)).round(4))


def test_plan_ps_gives_each_test_its_own_p_with_each_part_computed_once():
    """Each test's p from :func:`plan_ps` is its own function's on the same patterns and resamples; the
    combined test's is agreement_p's; plan_p gives the same."""
    rng = np.random.default_rng(3)
    cells = tuple(rng.standard_t(2, size=(12, 2)) for _ in range(4))
    for estimand in ("pooled", "task-mean"):
        ps = plan_ps(TESTS, cells, 0.05, 9, 199, 300, estimand)
        assert ps["randomisation+bootstrap-t"] == Z.agreement_p(cells, None, 199, 9, estimand=estimand)[0]
        assert ps == {
            "randomisation": Z.randomisation_p(cells, None, 199, 9, estimand=estimand)[0],
            "randomisation-raw": Z.randomisation_p(cells, None, 199, 9, studentise=False, estimand=estimand)[0],
            "bootstrap-t": Z.bootstrap_t_p(cells, None, 199, 9, estimand=estimand)[0],
            "bootstrap": Z.bootstrap_p(cells, 0.05, 300, 9, estimand=estimand)[0],
            "randomisation+bootstrap-t": ps["randomisation+bootstrap-t"],
        }
        assert (
            plan_p("randomisation+bootstrap-t", cells, 0.05, 9, 199, 300, estimand) == ps["randomisation+bootstrap-t"]
        )
    with pytest.raises(
        ValueError, match="test must be randomisation, randomisation\\+bootstrap-t or bootstrap, got 'x'"
    ):
        plan_ps(("randomisation", "x"), cells, 0.05, 9)


# ------------------------------------------------------------------------------ against loops written here
def _iqm64(values) -> float:
    v = sorted(float(x) for x in np.ravel(values))
    cut = int(0.25 * len(v))
    return math.fsum(v[cut : len(v) - cut]) / (len(v) - 2 * cut)


def _difference64(xr, xk, yr, yk) -> float:
    return (_iqm64(yr) - _iqm64(yk)) - (_iqm64(xr) - _iqm64(xk))


def _se64(xr, xk, yr, yk) -> float:
    """Yuen's winsorised SE of the paired trimmed-mean combination, by hand."""
    n = np.size(xr)
    g = int(0.25 * n)
    h = n - 2 * g

    def winsorised(c):
        v = sorted(float(x) for x in np.ravel(c))
        low, high = v[g], v[n - g - 1]
        return [min(max(float(x), low), high) for x in np.ravel(c)]

    z = [b - a - c + d for a, b, c, d in zip(*(winsorised(c) for c in (yk, yr, xr, xk)))]
    mean = math.fsum(z) / n
    return math.sqrt(math.fsum((u - mean) ** 2 for u in z) / (h * (h - 1)))


def _studentised64(xr, xk, yr, yk) -> float:
    return _difference64(xr, xk, yr, yk) / _se64(xr, xk, yr, yk)


def test_the_iqm_is_rliables_and_the_statistics_match_loops_written_here():
    rng = np.random.default_rng(3)
    for shape in [(12, 2), (36, 2), (5, 3), (7, 1)]:
        cells = [rng.standard_t(2, size=shape) for _ in range(4)]
        assert iqm(cells[0]) == pytest.approx(trim_mean(cells[0], 0.25, axis=None), abs=1e-13)
        assert Z.drop_difference(*cells) == pytest.approx(_difference64(*cells), abs=1e-12)
        assert Z.studentised_difference(*cells) == pytest.approx(_studentised64(*cells), rel=1e-10)


def test_the_randomisation_p_enumerates_every_swap_when_it_can_and_counts_as_a_loop_does():
    """3 seeds x 2 tasks: all 64 swap patterns, p by a loop over them written here (two-sided and the
    TOST's two one-sided tests on shifted data); the identity pattern and its complement are among them."""
    rng = np.random.default_rng(5)
    xr, xk, yr, yk = (rng.normal(size=(3, 2)) for _ in range(4))
    xk -= 0.4  # x loses more
    margin = 0.3

    def stats(shift):
        out = []
        for swap in itertools.product((False, True), repeat=6):
            s = np.array(swap).reshape(3, 2)
            cells = (np.where(s, yr, xr), np.where(s, yk, xk - shift), np.where(s, xr, yr), np.where(s, xk - shift, yk))
            out.append(_studentised64(*cells))
        return np.array(out), _studentised64(xr, xk - shift, yr, yk)

    null, obs = stats(0.0)
    p_two = np.mean(np.abs(null) >= abs(obs) - 1e-12)
    low_null, low_obs = stats(-margin)
    high_null, high_obs = stats(margin)
    p_tost = max(np.mean(low_null >= low_obs - 1e-12), np.mean(high_null <= high_obs + 1e-12))
    p, tost, exact = Z.randomisation_p((xr, xk, yr, yk), margin)
    assert exact and p == pytest.approx(p_two, abs=1e-15) and tost == pytest.approx(p_tost, abs=1e-15)
    assert p >= 2 / 64  # the observed pattern and its complement give |statistic| as large


def test_the_randomisation_p_draws_patterns_with_the_plus_one_rule_and_rejects_a_real_difference():
    rng = np.random.default_rng(9)
    xr, yr, yk = (rng.normal(size=(12, 2)) for _ in range(3))
    xk = xr - 0.05 * rng.normal(size=(12, 2))  # x barely drops
    yk = yr - 1.0 + 0.05 * rng.normal(size=(12, 2))  # y drops by 1
    p, tost, exact = Z.randomisation_p((xr, xk, yr, yk), 0.05, reps=999, seed=0)
    assert not exact and p == pytest.approx(1 / 1000)  # no drawn pattern is as extreme: (1 + 0) / (1 + 999)
    assert tost > 0.5  # a difference of 1 is far outside +-0.05: not equivalent


def _bootstrap_t64(cells, margin, reps, seed):
    """The symmetric bootstrap-t by loops: per resample and task, ``seeds`` rows drawn with replacement
    (the stream of ``integers(0, n, size=(reps, n, tasks))``) for all four cells; ``t* = (D* - D) /
    SE*``; p's with the +1 rule, a resample with SE* = 0 counted as extreme."""
    xr, xk, yr, yk = (np.asarray(c, dtype=np.float64) for c in cells)
    n, tasks = xr.shape
    d, se = _difference64(xr, xk, yr, yk), _se64(xr, xk, yr, yk)
    rows = np.random.default_rng(seed).integers(0, n, size=(reps, n, tasks))
    t_star = []
    for b in range(reps):
        drawn = [np.array([[c[rows[b, i, t], t] for t in range(tasks)] for i in range(n)]) for c in (xr, xk, yr, yk)]
        se_b = _se64(*drawn)
        t_star.append((_difference64(*drawn) - d) / se_b if se_b > 0 else math.inf)
    t_star = np.array(t_star)
    extreme = np.isinf(t_star)
    two = (1 + np.sum(extreme | (np.abs(t_star) >= abs(d / se)))) / (1 + reps)
    greater = (1 + np.sum(extreme | (t_star >= (d + margin) / se))) / (1 + reps)
    less = (1 + np.sum(extreme | (t_star <= (d - margin) / se))) / (1 + reps)
    return two, max(greater, less)


def test_the_bootstrap_t_counts_as_a_loop_does_and_the_combined_test_takes_the_larger_p():
    rng = np.random.default_rng(11)
    cells = [rng.standard_t(3, size=(9, 2)) for _ in range(4)]
    cells[1] = cells[1] - 0.3  # x loses more: both p's well inside (0, 1)
    p, tost = Z.bootstrap_t_p(cells, 0.2, reps=400, seed=6)
    p64, tost64 = _bootstrap_t64(cells, 0.2, reps=400, seed=6)
    assert (p, tost) == pytest.approx((p64, tost64), abs=1e-15)
    assert 1 / 401 < p < 1 and 1 / 401 < tost < 1
    p_r, tost_r, exact = Z.randomisation_p(cells, 0.2, reps=400, seed=6)
    assert Z.agreement_p(cells, 0.2, reps=400, seed=6) == (max(p_r, p), max(tost_r, tost), exact)


def test_the_vectorised_bootstrap_p_is_the_reports():
    """``bootstrap_p`` draws the resamples of the report's ``paired_bootstrap`` (same stream) and
    judges them with the report's percentile p."""
    from vaco.report.decision import bootstrap_p as percentile_p
    from vaco.report.robustness import paired_bootstrap

    cells = [c for c in committed_units()[:2].reshape(4, 12, 2)]
    batched = lambda *c: np.array([_difference64(*(x[i] for x in c)) for i in range(c[0].shape[0])])  # noqa: E731
    samples = paired_bootstrap(cells, batched, reps=300, seed=4)[:, 0]
    assert Z.bootstrap_p(cells, 0.05, reps=300, seed=4) == pytest.approx(percentile_p(samples, 0.05), abs=1e-15)


def test_the_sizing_simulates_the_declared_test_and_the_pilots_uncertainty_costs_power():
    """A pilot of 6 seeds whose arm loses 0.25 less on average, with a heavy-tailed spread: drawing a
    world from the pilot before the study's seeds (its uncertainty) gives less power than the plug-in
    world; an effect far beyond the spread is decided at the first look every time, and an arm equal
    to its control by construction (its cells are the control's) is never declared to differ."""
    from vaco.study.sizing import Pilot, simulate_plan

    rng = np.random.default_rng(2)
    yr = rng.normal(1.0, 0.2, size=(6, 2))
    yk = yr - 0.4 + 0.3 * rng.standard_t(3, size=(6, 2))
    xr = yr + 0.1 * rng.normal(size=(6, 2))
    xk = xr - 0.15 + 0.3 * rng.standard_t(3, size=(6, 2))
    modest = Pilot("modest", np.stack([xr, xk, yr, yk]))
    looks = [8, 16]
    kwargs = dict(looks=looks, studies=80, swaps=199, seed=1)
    plug_in = simulate_plan([modest], uncertainty=False, **kwargs)
    predictive = simulate_plan([modest], uncertainty=True, **kwargs)
    assert predictive.differs[0] < plug_in.differs[0]
    assert np.all(np.diff(plug_in.differs_at, axis=0) >= 0)  # decided by look k: never undone

    huge = Pilot("huge", np.stack([yr, yr - 0.01, yr, yr - 3.0]))
    same = Pilot("same", np.stack([yr, yk, yr, yk]))
    unpaired = Pilot("unpaired", np.stack([yr, yr - 0.01]), control=np.stack([yr[:3], yr[:3] - 3.0]))
    assert unpaired.draw(np.random.default_rng(0), 8, True).shape == (4, 8, 2)
    both = simulate_plan([huge, same, unpaired], uncertainty=True, **kwargs)
    assert both.differs_at[0, 0] == 1.0 and both.differs[1] == 0.0 and both.differs_at[0, 2] == 1.0
    assert both.mean_stop == looks[-1]  # "same" never decides, so every study runs to the last look


@pytest.mark.slow
def test_a_randomisation_plan_is_judged_by_its_test_and_shows_the_bootstrap_beside_it():
    """The confirmatory data judged by the same family declared with ``test: randomisation``: each
    comparison's p is ``randomisation_p`` on its paired cells (20,000 patterns, the report's seed),
    the method says so, and the bootstrap's p is shown as sensitivity; the plan's identity changes."""
    from vaco import report as R
    from vaco.report.robustness import paired_cells
    from vaco.study.judge import judge_plan, plan_lines
    from vaco.study.plan import load_plan

    runs = [r for r in R.read_runs(REPO / "docs/data/confirm_k4.csv.gz") if r.seed <= 2012]
    raw = {
        "family": [{"arm": a, "against": "ppo_clip", "K": 4} for a in ARMS[1:]],
        "looks": LOOKS,
        "spending": "pocock",
        "floor": 0.1,
        "references": {t: list(b) for t, b in REFERENCES.items()},
    }
    declared = load_plan({**raw, "test": "bootstrap"}, list(ARMS), [1, 4], 36)
    plan = load_plan({**raw, "test": "randomisation"}, list(ARMS), [1, 4], 36)
    assert declared.digest == "f3c18032baed" and plan.digest != declared.digest
    report = R.build_report("size", runs, reps=100, fixed_bounds=REFERENCES)
    judged = judge_plan(plan, report, declared=None)
    assert judged.look == 0 and len(judged.verdicts) == 3
    for v in judged.verdicts:
        c = v.comparison
        cells, _ = paired_cells(
            report, [(c.arm, 1), (c.arm, 4), (c.against, 1), (c.against, 4)], report.tasks, runs=report.runs
        )
        p, tost, exact = Z.randomisation_p(tuple(cells), plan.margin, Z.SWAPS, report.seed)
        assert (v.p_differs, v.p_equivalent) == (p, tost) and not exact
        assert v.method == "randomisation (20000 random swap patterns, studentised)"
        others = {name: (p_o, tost_o) for name, p_o, tost_o in v.other_tests}
        assert set(others) == {"bootstrap", "randomisation+bootstrap-t"} and others["bootstrap"][0] != p
        p_t, tost_t = Z.bootstrap_t_p(tuple(cells), plan.margin, Z.SWAPS, report.seed)
        assert others["randomisation+bootstrap-t"] == (max(p, p_t), max(tost, tost_t))
    text = "\n".join(plan_lines(judged))
    assert (
        "randomisation test" in text
        and text.count("sensitivity, not verdicts: the other tests give randomisation+bootstrap-t p") == 3
    )


# ------------------------------------------------------------------------------ the task-mean estimand
def _task_mean64(cells) -> tuple[float, float]:
    """The task-mean estimand by loops: the mean of each task's difference of drops (its IQMs over its
    own seeds), and the scale it is studentised by: Yuen's SE of the pooled difference."""
    tasks = np.shape(cells[0])[1]
    d = [_difference64(*(np.asarray(c)[:, [t]] for c in cells)) for t in range(tasks)]
    return math.fsum(d) / tasks, _se64(*cells)


def test_the_task_mean_estimand_is_the_mean_of_each_tasks_difference_and_is_tested_as_a_loop_does():
    """Against loops written here: the estimate, its scale and studentised statistic; every swap pattern of
    3 seeds x 2 tasks counted by hand; the bootstrap-t on the task-mean statistic; on one task it is the
    pooled estimand; and it differs from the pooled one where the tasks' levels differ."""
    rng = np.random.default_rng(21)
    for shape in [(12, 3), (7, 2), (5, 1)]:
        cells = [rng.standard_t(2, size=shape) + rng.normal(size=shape[1]) * 3 for _ in range(4)]
        d64, se64 = _task_mean64(cells)
        d, se = Z.estimate(*cells, estimand="task-mean")
        assert (float(d), float(se)) == pytest.approx((d64, se64), rel=1e-12)
        assert Z.drop_difference(*cells, estimand="task-mean") == pytest.approx(d64, rel=1e-12)
        if shape[1] == 1:
            assert float(d) == pytest.approx(float(Z.drop_difference(*cells)), abs=1e-13)
    # three tasks at levels 0, 5 and 10, x dropping by 1 on the lowest only: one IQM over every unit keeps
    # 3 of that task's 12 seeds (drop 1/6), the task mean weighs it as a third (drop 1/3)
    levels = np.tile([0.0, 5.0, 10.0], (12, 1))
    cells = [levels, levels - [1.0, 0.0, 0.0], levels, levels]
    assert float(Z.drop_difference(*cells)) == pytest.approx(-1 / 6, abs=1e-12)
    assert float(Z.drop_difference(*cells, estimand="task-mean")) == pytest.approx(-1 / 3, abs=1e-12)

    xr, xk, yr, yk = (rng.normal(size=(3, 2)) for _ in range(4))
    xk = xk - 0.4
    null = []
    for swap in itertools.product((False, True), repeat=6):
        s = np.array(swap).reshape(3, 2)
        swapped = (np.where(s, yr, xr), np.where(s, yk, xk), np.where(s, xr, yr), np.where(s, xk, yk))
        d, se = _task_mean64(swapped)
        null.append(d / se)
    d, se = _task_mean64((xr, xk, yr, yk))
    p64 = np.mean(np.abs(null) >= abs(d / se) - 1e-12)
    p, _, exact = Z.randomisation_p((xr, xk, yr, yk), None, estimand="task-mean")
    assert exact and p == pytest.approx(p64, abs=1e-15)

    cells = [rng.standard_t(3, size=(6, 2)) for _ in range(4)]
    cells[1] = cells[1] - 0.5
    d, se = _task_mean64(cells)
    rows = np.random.default_rng(2).integers(0, 6, size=(200, 6, 2))
    t_star = []
    for b in range(200):
        drawn = [np.array([[c[rows[b, i, t], t] for t in range(2)] for i in range(6)]) for c in cells]
        d_b, se_b = _task_mean64(drawn)
        t_star.append((d_b - d) / se_b if se_b > 0 else math.inf)
    p64 = (1 + np.sum(np.isinf(t_star) | (np.abs(t_star) >= abs(d / se)))) / 201
    assert Z.bootstrap_t_p(cells, None, reps=200, seed=2, estimand="task-mean")[0] == pytest.approx(p64, abs=1e-15)


def test_the_task_mean_null_gives_each_task_the_controls_drop():
    data = lag_bench_units()
    null = equal_drop_null(data, "task-mean")
    for t in range(data.shape[-1]):
        drops = [_iqm64(null[a, 0, :, t]) - _iqm64(null[a, 1, :, t]) for a in range(len(HEAVY))]
        assert drops == pytest.approx([drops[0]] * len(HEAVY), abs=1e-12)
    moved = null[1:, 1] - data[1:, 1]  # one constant an arm and task
    assert np.allclose(moved, moved[:, :1, :]) and not np.allclose(moved, moved[:, :1, :1])


@pytest.mark.slow
def test_the_whole_sequential_rule_holds_its_size_for_the_task_mean_estimand():
    """As :func:`test_the_whole_sequential_rule_where_the_arms_differ_in_shape`, for a plan declaring
    ``estimand: task-mean`` and ``test: randomisation+bootstrap-t``: each heavy-tailed arm moved to
    PPO-clip's drop on each task, drawing its own seeds; the family-wise rate within the 99.9% binomial
    quantile of 5%, and each arm's rate at the smallest Holm level within that quantile of it."""
    rates = sequential_null_rates(
        lag_bench_units(), "randomisation+bootstrap-t", LOOKS, ALPHA, 1500, seed=17, swaps=499, estimand="task-mean"
    )  # measured at 499 draws a p: family 1.3%; CISPO 0.33%, IMPALA 0.00%, MIS 0.18%, TIS 0.04% (at 999: 2.1%;
    # 0.38 / 0.02 / 0.36 / 0.07%; with each task's own SE as the studentiser, IMPALA 0.89%, outside)
    assert _within(rates.family, rates.studies, ALPHA), rates.family / rates.studies
    looks, level = len(LOOKS), rates.first_levels[0]
    within = {
        name: _within(int(rates.per_look[:, c].sum()), rates.studies * looks, level) for c, name in enumerate(HEAVY[1:])
    }
    assert all(within.values()), (within, (rates.per_look.sum(axis=0) / (rates.studies * looks)).round(4))
