"""The report's aggregate tables as data, built from a :class:`~vaco.report.scores.Report`: the
normalised final score's aggregates per (algorithm, K), the IQM against K, the probability of
improvement over a baseline, sample-efficiency curves and performance profiles. Nothing here
draws (:mod:`vaco.report.figures` does, from what these return)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from vaco.report import bootstrap
from vaco.report.runs import Run
from vaco.report.scores import (
    AGGREGATES,
    RANGE_BELOW,
    Estimate,
    Report,
    aggregate_estimates,
    common_grid,
    curve_iqm,
    iqm_estimates,
    performance_profiles,
)

__all__ = [
    "Profiles",
    "SampleEfficiency",
    "Scores",
    "aggregate_scores",
    "improvement_baseline",
    "iqm_against_k",
    "iqm_of",
    "probability_of_improvement",
    "profiles",
    "sample_efficiency",
]


@dataclasses.dataclass
class Scores:
    """Estimates per group (``"vaco K=4"``, ``"vaco delta=0.4 K=16"``), the metrics they hold, and
    notes on the groups that were cut or left out."""

    estimates: dict[str, Estimate]
    metrics: tuple[str, ...]
    notes: list[str]

    def frame(self):
        """One row per (group, metric): point, interval (NaN without one), runs per task, tasks."""
        import pandas as pd

        rows = []
        for group, e in self.estimates.items():
            for i, metric in enumerate(self.metrics):
                low, high = (e.interval[0, i], e.interval[1, i]) if e.interval is not None else (math.nan, math.nan)
                rows.append(
                    {
                        "group": group,
                        "metric": metric,
                        "point": float(e.point[i]),
                        "low": float(low),
                        "high": float(high),
                        "runs_per_task": e.runs_per_task,
                        "tasks": e.tasks,
                    }
                )
        return pd.DataFrame(rows, columns=["group", "metric", "point", "low", "high", "runs_per_task", "tasks"])


def groups_of(runs: Sequence[Run], key: Callable[[Run], object]) -> dict:
    out: dict = {}
    for r in runs:
        out.setdefault(key(r), []).append(r)
    return out


def main_groups(report: Report) -> dict[str, list[Run]]:
    """The main comparison's groups, ``"<algorithm> K=<K>"``, in the paper's algorithm order."""
    order = {a: i for i, a in enumerate(report.algorithms)}
    runs = sorted(report.main_runs(), key=lambda r: (order[r.algorithm], r.K))
    return groups_of(runs, lambda r: f"{r.algorithm} K={r.K}")


def aggregate_scores(report: Report) -> Scores:
    """Median, IQM, Mean and Optimality Gap of the normalised final score per (algorithm, K)."""
    matrices, _, notes = report.matrices(main_groups(report), lambda r: report.normalized[r.run_id])
    return Scores(aggregate_estimates(matrices, report.reps, report.seed, report.min_runs), AGGREGATES, notes)


def iqm_against_k(report: Report) -> Scores:
    """IQM of the normalised final score per (algorithm, K)."""
    matrices, _, notes = report.matrices(main_groups(report), lambda r: report.normalized[r.run_id])
    return Scores(iqm_estimates(matrices, report.reps, report.seed, report.min_runs), ("IQM",), notes)


def iqm_of(scores: Scores) -> Scores:
    """The IQM column of :func:`aggregate_scores`'s estimates (the same bootstrap, so the same
    interval wherever the IQM is shown)."""
    i = scores.metrics.index("IQM")
    return Scores(
        {
            k: Estimate(
                e.point[i : i + 1],
                None if e.interval is None else e.interval[:, i : i + 1],
                e.runs_per_task,
                e.tasks,
                e.kind,
            )
            for k, e in scores.estimates.items()
        },
        ("IQM",),
        scores.notes,
    )


def improvement_baseline(report: Report) -> str | None:
    """The algorithm others are compared with: the report's ``baseline``, else the paper's baseline
    where the runs hold it: PPO-clip for MuJoCo, GRPO for the LLM track (its VACO-GRPO question)."""
    if report.baseline is not None:
        return report.baseline
    return next((name for name in ("ppo_clip", "grpo") if name in report.algorithms), None)


def probability_of_improvement(report: Report, baseline: str | None = None) -> Scores:
    """rliable's probability of improvement P(X > Y) of each algorithm X over ``baseline`` Y at the
    same K, on the normalised final scores, with a 95% stratified-bootstrap interval: the chance
    that a run of X scores above a run of Y on a task drawn at random (Agarwal et al. 2021). 0.5
    means no difference. Groups: ``"vaco K=16 vs ppo_clip K=16"``."""
    from rliable import metrics

    baseline = baseline or improvement_baseline(report)
    matrices, _, notes = report.matrices(main_groups(report), lambda r: report.normalized[r.run_id])
    pairs = {}
    for group, scores in matrices.items():
        algo, k = group.rsplit(" ", 1)
        reference = f"{baseline} {k}"
        if algo != baseline and reference in matrices:
            pairs[f"{group} vs {reference}"] = (scores, matrices[reference])
    out: dict[str, Estimate] = {}
    # fewer than RANGE_BELOW runs a task: the point alone (a bootstrap of 3 runs is their range)
    needed = max(report.min_runs, RANGE_BELOW)
    enough = {key: pair for key, pair in pairs.items() if min(x.shape[0] for x in pair) >= needed}
    for key, (x, y) in pairs.items():
        if key not in enough:
            out[key] = Estimate(
                np.atleast_1d(metrics.probability_of_improvement(x, y)), None, min(x.shape[0], y.shape[0]), x.shape[1]
            )
    if enough:  # rliable's get_interval_estimates' numbers, every resample at once
        intervals = bootstrap.interval_estimates(enough, bootstrap.improvement, report.reps, report.seed)
        for key, (x, y) in enough.items():
            out[key] = Estimate(
                np.atleast_1d(metrics.probability_of_improvement(x, y)),
                intervals[key].reshape(2, 1),
                min(x.shape[0], y.shape[0]),
                x.shape[1],
            )
    return Scores({key: out[key] for key in pairs}, ("P(X > Y)",), notes)


def _curve_groups(report: Report, runs: Sequence[Run], key: Callable[[Run], str]):
    groups = groups_of(runs, key)
    grid = common_grid([r.score() for r in runs])
    matrices, _, notes = report.matrices(groups, lambda r: report.normalized_curve(r, grid)[1])
    return grid, matrices, notes


@dataclasses.dataclass
class SampleEfficiency:
    """Per K: the env steps of the curves and the IQM curve per algorithm; the IQM of each run's
    normalised AUC per (algorithm, K)."""

    curves: dict[int, tuple[np.ndarray, dict[str, Estimate]]]
    auc: Scores
    notes: list[str]

    def frame(self):
        """The IQM curves: one row per (K, algorithm, env step)."""
        import pandas as pd

        rows = []
        for K, (grid, est) in self.curves.items():
            for algo, e in est.items():
                for j, step in enumerate(grid):
                    low, high = (e.interval[0, j], e.interval[1, j]) if e.interval is not None else (math.nan, math.nan)
                    rows.append(
                        {
                            "K": K,
                            "algorithm": algo,
                            "step": float(step),
                            "iqm": float(e.point[j]),
                            "low": float(low),
                            "high": float(high),
                        }
                    )
        return pd.DataFrame(rows, columns=["K", "algorithm", "step", "iqm", "low", "high"])


def sample_efficiency(report: Report) -> SampleEfficiency:
    """rliable's sample-efficiency curves per K, and the IQM of the normalised AUC."""
    main = report.main_runs()
    notes, curves = [], {}
    for K in report.ks:
        grid, matrices, n = _curve_groups(report, [r for r in main if r.K == K], lambda r: r.algorithm)
        notes += [f"K={K}: {x}" for x in n]
        curves[K] = (grid, curve_iqm(matrices, report.reps, report.seed, report.min_runs))
    matrices, _, n = report.matrices(main_groups(report), lambda r: report.auc[r.run_id])
    auc = Scores(iqm_estimates(matrices, report.reps, report.seed, report.min_runs), ("IQM AUC",), [])
    return SampleEfficiency(curves, auc, notes + n)


@dataclasses.dataclass
class Profiles:
    """Per K: each algorithm's score distribution (fraction of runs above tau), its bootstrap band,
    and its run count per task."""

    taus: np.ndarray
    by_k: dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, int]]]
    notes: list[str]


def profiles(report: Report, taus: np.ndarray | None = None) -> Profiles:
    taus = np.linspace(0.0, 1.0, 51) if taus is None else taus
    main, out, notes = report.main_runs(), {}, []
    for K in report.ks:
        groups = groups_of([r for r in main if r.K == K], lambda r: r.algorithm)
        matrices, _, n = report.matrices(groups, lambda r: report.normalized[r.run_id])
        notes += [f"K={K}: {x}" for x in n]
        if not matrices:
            continue
        profile, cis = performance_profiles(matrices, taus, report.reps, report.seed)
        out[K] = (profile, cis, {a: m.shape[0] for a, m in matrices.items()})
    return Profiles(taus, out, notes)
