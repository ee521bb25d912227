"""vaco.report.bootstrap against rliable itself: the same resamples (numpy's global stream after the
same seed) and the same percentile intervals, for every statistic the report bootstraps, on groups
of several sizes, heavy tails, ties and curves (whose points rliable resamples independently)."""

from __future__ import annotations

import numpy as np
import pytest
from rliable import library, metrics

from vaco.report import bootstrap as B


def _rliable_aggregates(x):
    return np.array(
        [
            metrics.aggregate_median(x),
            metrics.aggregate_iqm(x),
            metrics.aggregate_mean(x),
            metrics.aggregate_optimality_gap(x),
        ]
    )


def _groups(rng):
    return {
        "heavy": rng.standard_t(2, size=(12, 2)),
        "three tasks": rng.uniform(-0.2, 1.3, size=(7, 3)),
        "ties": np.round(rng.normal(0.5, 0.3, size=(6, 2)), 1),
    }


def _same(ours: dict, theirs: dict) -> None:
    assert list(ours) == list(theirs)
    for key in theirs:
        np.testing.assert_allclose(ours[key], np.asarray(theirs[key]).reshape(ours[key].shape), rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 11])
def test_aggregates_and_iqm_intervals_are_rliables(seed):
    groups = _groups(np.random.default_rng(seed))
    np.random.seed(seed)
    _, theirs = library.get_interval_estimates(groups, _rliable_aggregates, reps=300)
    _same(B.interval_estimates(groups, B.aggregates, 300, seed), theirs)
    np.random.seed(seed)
    _, theirs = library.get_interval_estimates(groups, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=300)
    _same(B.interval_estimates(groups, B.iqm, 300, seed), theirs)


def test_curve_intervals_are_rliables_whose_points_are_resampled_apart():
    rng = np.random.default_rng(2)
    curves = {"a": rng.normal(size=(6, 2, 5)), "b": rng.standard_t(3, size=(8, 2, 5))}
    np.random.seed(4)
    _, theirs = library.get_interval_estimates(
        curves, lambda x: np.array([metrics.aggregate_iqm(x[..., j]) for j in range(x.shape[-1])]), reps=200
    )
    _same(B.interval_estimates(curves, B.curve_iqm, 200, 4), theirs)


def test_probability_of_improvement_intervals_are_rliables_with_unequal_groups_and_ties():
    rng = np.random.default_rng(5)
    groups = _groups(rng)
    pairs = {
        "heavy vs ties": (groups["heavy"][:, :2], groups["ties"]),
        "ties vs itself": (groups["ties"], groups["ties"]),
        "five vs nine": (np.round(rng.normal(size=(5, 2)), 1), np.round(rng.normal(size=(9, 2)), 1)),
    }
    np.random.seed(6)
    _, theirs = library.get_interval_estimates(pairs, metrics.probability_of_improvement, reps=300)
    _same(B.interval_estimates(pairs, B.improvement, 300, 6), theirs)
    for x, y in pairs.values():  # and the statistic itself on the data
        assert float(B.improvement(x, y)) == metrics.probability_of_improvement(x, y)


def test_profile_bands_are_rliables():
    groups = _groups(np.random.default_rng(7))
    taus = np.linspace(-0.5, 1.5, 21)
    np.random.seed(8)
    points, theirs = library.create_performance_profile(groups, taus, reps=200)
    _same(B.interval_estimates(groups, B.profile(taus), 200, 8), theirs)
    for key, x in groups.items():
        np.testing.assert_array_equal(B.profile(taus)(x), points[key])


def test_a_group_of_one_value_has_a_zero_width_interval_at_it_and_three_runs_give_their_range():
    """Three runs of one task: each alone is drawn three times with probability 1/27 > 2.5%, so the
    95% percentile interval of their mean is their range."""
    flat = {"a": np.full((6, 2), 0.3)}
    np.testing.assert_array_equal(B.interval_estimates(flat, B.aggregates, 100, 0)["a"][:, :3], np.full((2, 3), 0.3))
    three = {"a": np.array([[0.2], [0.5], [0.9]])}
    np.testing.assert_allclose(B.interval_estimates(three, B.aggregates, 2000, 0)["a"][:, 2], [0.2, 0.9], atol=1e-12)
