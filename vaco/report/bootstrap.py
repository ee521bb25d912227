"""rliable's stratified-bootstrap intervals, with the statistic computed on every resample at once.

``rliable.library.get_interval_estimates`` (and ``create_performance_profile``, which calls it)
resamples through ``arch``: one Python call of the statistic per resample, each through scipy's
argument handling (``trim_mean``, ``mannwhitneyu``), 2,000 a group. On the lag benchmark's 960 runs
that loop was nine tenths of ``vaco report``. Here the resamples are rliable's own: drawn as its
``StratifiedBootstrap`` and ``StratifiedIndependentBootstrap`` draw them (``np.random.choice`` on
numpy's global stream, one call a resample and array, arrays and groups in the same order, after
the same ``np.random.seed``), the statistic is evaluated on all of them in one vectorised call, and
the interval is arch's percentile interval (``np.percentile`` of each output at 2.5 and 97.5). The
numbers are rliable's to rounding (``tests/test_bootstrap.py`` calls rliable itself beside them).

The vectorised statistics take arrays with a leading resample axis and return (resamples x outputs):
:func:`iqm` (rliable's ``aggregate_iqm``), :func:`aggregates` (Median, IQM, Mean, Optimality Gap),
:func:`curve_iqm`, :func:`improvement` (``probability_of_improvement``) and :func:`profile`
(``score_distributions``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np


def iqm(x: np.ndarray) -> np.ndarray:
    """rliable's ``aggregate_iqm`` (scipy's ``trim_mean(x, 0.25, axis=None)``) over the last two axes
    (seeds x tasks), for every leading index at once: the sorted values with ``int(0.25 N)`` cut
    from each end (scipy's ``lowercut``), averaged."""
    flat = np.asarray(x, dtype=np.float64)
    flat = flat.reshape(*flat.shape[:-2], -1)
    n = flat.shape[-1]
    cut = int(0.25 * n)
    return np.sort(flat, axis=-1)[..., cut : n - cut].mean(axis=-1)


def aggregates(x: np.ndarray) -> np.ndarray:
    """rliable's Median, IQM, Mean and Optimality Gap (gamma 1) of (... x runs x tasks) scores, in
    that order on the last axis: the median and mean of the task means, the IQM of all runs, and
    1 minus the mean of the scores clipped at 1."""
    task_means = np.mean(x, axis=-2)
    flat = np.minimum(x, 1).reshape(*x.shape[:-2], -1)
    return np.stack(
        [np.median(task_means, axis=-1), iqm(x), np.mean(task_means, axis=-1), 1 - np.mean(flat, axis=-1)],
        axis=-1,
    )


def curve_iqm(x: np.ndarray) -> np.ndarray:
    """The IQM at each point of (... x runs x tasks x points) curves: (... x points)."""
    return iqm(np.moveaxis(x, -1, -3))


def improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """rliable's ``probability_of_improvement`` of X over Y, (... x runs x tasks) each: per task the
    Mann-Whitney U of X's runs over Y's (pairs with X above, ties one half) over the pairs, averaged
    over the tasks."""
    a, b = x[..., :, None, :], y[..., None, :, :]
    u = (a > b).sum(axis=(-3, -2)) + 0.5 * (a == b).sum(axis=(-3, -2))
    return np.mean(u / (x.shape[-2] * y.shape[-2]), axis=-1)


def profile(taus: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """rliable's ``score_distributions``: the fraction of all runs and tasks above each tau."""

    def fraction_above(x: np.ndarray) -> np.ndarray:
        flat = x.reshape(*x.shape[:-2], -1)
        return np.mean(flat[..., None] > np.asarray(taus), axis=-2)

    return fraction_above


def resample(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``x`` resampled by rliable's stratified indices: ``rows`` (resamples x ``x.shape``) picks each
    entry's run; every other axis keeps its place."""
    grid = np.ogrid[tuple(slice(n) for n in x.shape)][1:]
    return x[(rows, *(g[None] for g in grid))]


def interval_estimates(
    score_dict: Mapping[str, np.ndarray | Sequence[np.ndarray]],
    stat: Callable[..., np.ndarray],
    reps: int,
    seed: int,
    size: float = 0.95,
) -> dict[str, np.ndarray]:
    """Each group's percentile interval (2 x outputs) of ``stat`` over ``reps`` stratified resamples,
    the numbers of ``np.random.seed(seed); rliable.library.get_interval_estimates(score_dict, func,
    reps=reps)`` where ``stat`` is ``func`` for every leading index. A group is an array (runs x
    tasks [x ...], rliable's ``StratifiedBootstrap``) or a sequence of arrays each resampled on its
    own (``StratifiedIndependentBootstrap``)."""
    np.random.seed(seed)  # rliable's bootstraps draw from numpy's global stream
    alpha = (1.0 - size) / 2
    percentiles = [100 * p for p in (alpha, 1.0 - alpha)]  # arch's, to the bit
    out = {}
    for key, scores in score_dict.items():
        arrays = [scores] if isinstance(scores, np.ndarray) else [np.asarray(s) for s in scores]
        rows = [np.empty((reps, *a.shape), dtype=np.int64) for a in arrays]
        for r in range(reps):
            for a, array in enumerate(arrays):
                rows[a][r] = np.random.choice(array.shape[0], array.shape, replace=True)
        samples = np.asarray(stat(*(resample(a, i) for a, i in zip(arrays, rows))), dtype=np.float64)
        out[key] = np.percentile(samples.reshape(reps, -1), percentiles, axis=0)
    return out
