"""The report's decision rule (vaco/report/decision.py): differs / equivalent / undecided, the sign-flip
and TOST p-values against loops written here, and the power estimate against a simulation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from vaco.report.decision import (
    decide,
    decide_by_intervals,
    decide_by_sign_flips,
    minimum_detectable,
    seeds_needed,
    sign_flip_p,
)


def loop_sign_flip(d, alternative, shift=0.0):
    """Every sign pattern, one at a time, in float64."""
    x = [float(v) - shift for v in d]
    observed = sum(x) / len(x)
    hits = total = 0
    for signs in itertools.product((1, -1), repeat=len(x)):
        mean = sum(s * v for s, v in zip(signs, x)) / len(x)
        total += 1
        if alternative == "two-sided":
            hits += abs(mean) >= abs(observed) - 1e-12
        elif alternative == "greater":
            hits += mean >= observed - 1e-12
        else:
            hits += mean <= observed + 1e-12
    return hits / total


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
@pytest.mark.parametrize("shift", [0.0, 0.05, -0.05])
def test_sign_flip_p_equals_the_loop(alternative, shift):
    rng = np.random.default_rng(3)
    d = rng.normal(0.04, 0.1, size=8)
    p, exact = sign_flip_p(d, alternative, shift=shift)
    assert exact and p == pytest.approx(loop_sign_flip(d, alternative, shift), abs=1e-12)


def test_six_paired_differences_all_one_sign_give_the_smallest_two_sided_p():
    p, _ = sign_flip_p([0.1, 0.2, 0.05, 0.3, 0.12, 0.07])
    assert p == pytest.approx(2 / 64)  # the two all-same-sign patterns of 64


def test_tost_by_sign_flips_equals_two_loops():
    rng = np.random.default_rng(5)
    d = rng.normal(0.0, 0.02, size=(4, 2))
    word, p_diff, p_eq, exact = decide_by_sign_flips(d, margin=0.05)
    low = loop_sign_flip(d.ravel(), "greater", shift=-0.05)
    high = loop_sign_flip(d.ravel(), "less", shift=0.05)
    assert (
        exact
        and p_eq == pytest.approx(max(low, high))
        and p_diff == pytest.approx(loop_sign_flip(d.ravel(), "two-sided"))
    )
    assert word == ("differs" if p_diff < 0.05 else "equivalent" if p_eq < 0.05 else "undecided")
    assert word == "equivalent"  # tight around 0 with a wide margin: the rule can say so


@pytest.mark.parametrize(
    "i95,i90,margin,word",
    [
        ((0.01, 0.3), (0.03, 0.28), 0.05, "differs"),
        ((-0.3, -0.01), (-0.28, -0.03), 0.05, "differs"),
        ((-0.04, 0.045), (-0.03, 0.04), 0.05, "equivalent"),
        ((-0.06, 0.045), (-0.049, 0.04), 0.05, "equivalent"),  # the 90% interval decides equivalence
        ((-0.14, 0.14), (-0.12, 0.12), 0.05, "undecided"),
        ((-0.14, 0.14), (-0.12, 0.12), 0.13, "equivalent"),  # a margin >= 0.12 would pass (issue 28)
    ],
)
def test_the_rule_on_intervals(i95, i90, margin, word):
    assert decide_by_intervals(i95, i90, margin) == word


def test_decide_uses_the_bootstrap_from_ten_seeds_and_sign_flips_below():
    rng = np.random.default_rng(0)
    paired = rng.normal(0.2, 0.05, size=(10, 2))
    samples = rng.normal(0.2, 0.02, size=2000)
    assert decide(0.2, paired, 0.05, samples).method == "bootstrap"
    few = decide(0.2, paired[:3], 0.05, samples)
    assert few.method == "sign-flip (exact)" and few.interval95 is None and few.p_differs == pytest.approx(2 / 64)


def test_undecided_says_how_many_seeds_and_decided_does_not():
    rng = np.random.default_rng(1)
    paired = rng.normal(0.08, 0.25, size=(10, 2))
    v = decide(float(paired.mean()), paired, 0.05, rng.normal(paired.mean(), 0.06, size=4000))
    assert v.word == "undecided" and v.seeds_needed > 10 and "seeds needed:" in v.text()
    clear = decide(0.5, np.full((10, 2), 0.5) + rng.normal(0, 0.01, (10, 2)), 0.05, rng.normal(0.5, 0.01, 4000))
    assert clear.word == "differs" and clear.seeds_needed is None


def _simulated_power(n, tasks, sd, true, margin, rule, sims=2000, seed=0):
    """Fraction of simulated studies (n seeds x tasks, normal paired differences) that decide: the
    normal-theory 95% / 90% intervals of the mean, as the power formula assumes."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        d = rng.normal(true, sd, size=(n, tasks))
        se = math.sqrt(np.mean(d.var(axis=0, ddof=1)) / (n * tasks))
        m = d.mean()
        if rule == "differs":
            hits += abs(m) > 1.959964 * se
        else:
            hits += -margin < m - 1.644854 * se and m + 1.644854 * se < margin
    return hits / sims


@pytest.mark.parametrize(
    "true,margin,rule",
    [(0.2, 0.05, "differs"), (0.1, 0.05, "differs"), (0.0, 0.1, "equivalent"), (0.02, 0.1, "equivalent")],
)
def test_seeds_needed_reach_80_percent_power_in_a_simulation(true, margin, rule):
    """The seeds the report asks for decide ~80% of simulated studies whose true difference is the
    observed one (a large pilot sets the spread, as the report's observed spread does)."""
    sd, tasks = 0.25, 2
    pilot = np.random.default_rng(9).normal(0, sd, size=(4000, tasks)) + true
    n = seeds_needed(pilot, true, margin)
    assert n is not None and n > 2
    power = _simulated_power(n, tasks, sd, true, margin, rule)
    assert 0.75 <= power <= 0.9, (n, power)
    assert _simulated_power(max(2, n // 3), tasks, sd, true, margin, rule) < 0.6  # fewer seeds: less power


def test_minimum_detectable_difference_matches_the_formula_loop():
    rng = np.random.default_rng(2)
    paired = rng.normal(0, 0.2, size=(10, 2))
    var = (
        sum(sum((paired[i, t] - paired[:, t].mean()) ** 2 for i in range(10)) / 9 for t in range(2)) / 2
    )  # mean over tasks of the per-task sample variance
    expected = (1.959964 + 0.841621) * math.sqrt(var / 20)
    assert minimum_detectable(paired) == pytest.approx(expected, rel=1e-5)
