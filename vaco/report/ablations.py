"""What the lag telemetry and the ablations say, as data: the TV and filter/clip-fraction tables
(per algorithm and K), and one :class:`Ablation` per sweep axis and for realignment, with their
IQM scores. Drawn by :mod:`~vaco.report.figures`, written by :mod:`~vaco.report.summary`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from vaco.report.runs import Run
from vaco.report.scores import Report, iqm_estimates
from vaco.report.tables import Scores, groups_of

__all__ = [
    "PHASES",
    "STEP_TOLERANCE",
    "StepMatch",
    "StepPhase",
    "phase_means",
    "step_size_by_phase",
    "step_size_matching",
    "Ablation",
    "ablation_scores",
    "ablations",
    "fraction_table",
    "tv_table",
]


def tv_table(report: Report, by_task: bool = False) -> dict[tuple, tuple[list[float], list[float], float | None]]:
    """Per (algorithm, K), or per (task, algorithm, K) with ``by_task``: each run's mean
    lag/forward_tv and mean train/tv, and its delta."""
    rows = {}
    key = (lambda r: (r.env, r.algorithm, r.K)) if by_task else (lambda r: (r.algorithm, r.K))
    for group, runs in sorted(
        groups_of(report.main_runs(), key).items(),
        key=lambda x: (*x[0][:-2], report.algorithms.index(x[0][-2]), x[0][-1]),
    ):
        fwd = [r.history("lag/forward_tv")[1].mean() for r in runs if len(r.history("lag/forward_tv")[1])]
        trn = [r.history("train/tv")[1].mean() for r in runs if len(r.history("train/tv")[1])]
        rows[group] = (fwd, trn, runs[0].axes.get("delta"))
    return rows


#: the largest relative difference of realised step size (lag/forward_tv) two partner arms may
#: show at a K and still count as one step size (beyond it, calibrate the pair per K)
STEP_TOLERANCE = 0.10


class _StepRatio:
    """The clip arm's realised TV against the filter arm's (``filter_tv``, ``clip_tv``)."""

    filter_tv: float
    clip_tv: float

    @property
    def ratio(self) -> float:
        """clip arm's TV / filter arm's TV."""
        return self.clip_tv / self.filter_tv if self.filter_tv > 0 else math.nan

    @property
    def drifts(self) -> bool:
        """More than :data:`STEP_TOLERANCE` apart: the pair does not hold step size at this K."""
        return not abs(self.ratio - 1.0) <= STEP_TOLERANCE


@dataclasses.dataclass(frozen=True)
class StepMatch(_StepRatio):
    """One (task, K) of a step-size pair: each arm's realised ``lag/forward_tv`` (the mean over its
    runs of each run's mean over iterations) and how far the clip arm is from the filter arm."""

    task: str
    K: int
    filter_arm: str
    clip_arm: str
    filter_tv: float
    clip_tv: float
    filter_runs: int
    clip_runs: int


def step_size_matching(report: Report) -> list[StepMatch]:
    """For each declared pair (``report.step_pairs``, filter arm -> clip arm) and each (task, K)
    where both arms have runs with ``lag/forward_tv``: the two arms' realised step sizes side by
    side. Every run of an arm counts (the arms of a 2x2 design differ in their axis values on
    purpose, so the main comparison's reference values do not filter them)."""

    out = []
    for filter_arm, clip_arm, task, K in _pair_cells(report):
        f = [float(tv.mean()) for tv in _arm_tv(report, filter_arm, task, K).values()]
        c = [float(tv.mean()) for tv in _arm_tv(report, clip_arm, task, K).values()]
        if f and c:
            out.append(StepMatch(task, K, filter_arm, clip_arm, float(np.mean(f)), float(np.mean(c)), len(f), len(c)))
    return out


def _pair_cells(report: Report):
    """Each declared step pair at each task and K: (filter arm, clip arm, task, K)."""
    for filter_arm, clip_arm in report.step_pairs.items():
        for task in report.tasks:
            for K in report.ks:
                yield filter_arm, clip_arm, task, K


def _arm_tv(report: Report, algorithm: str, task: str, K: int) -> dict[int, np.ndarray]:
    """seed -> the ``lag/forward_tv`` history of each of an arm's runs at (task, K) that logged it."""
    return {
        r.seed: r.history("lag/forward_tv")[1]
        for r in report.runs
        if r.algorithm == algorithm and r.env == task and r.K == K and len(r.history("lag/forward_tv")[1])
    }


#: the parts of a run the step-size check looks at apart (thirds: early, middle, late)
PHASES = ("first third", "middle third", "last third")


@dataclasses.dataclass(frozen=True)
class StepPhase(_StepRatio):
    """One phase of one (task, K) of a step-size pair: each arm's ``lag/forward_tv`` over that part
    of its runs (per run, the mean over the phase's iterations; per arm, the mean over runs), and the
    spread across seeds of the per-seed ratio (the seeds both arms ran)."""

    task: str
    K: int
    filter_arm: str
    clip_arm: str
    phase: str
    filter_tv: float
    clip_tv: float
    ratio_sd: float  # sample SD (ddof 1) of clip / filter over the paired seeds; NaN below 2
    seeds: int


def phase_means(values: np.ndarray, phases: int = len(PHASES)) -> list[float]:
    """The mean of each of ``phases`` consecutive, nearly equal parts of a run's history (the
    first ``len % phases`` parts one iteration longer), NaN for an empty part."""
    return [float(part.mean()) if len(part) else math.nan for part in np.array_split(values, phases)]


def step_size_by_phase(report: Report) -> list[StepPhase]:
    """:func:`step_size_matching` per third of the run: an arm that moves further early and less
    late can match on the run average and still not hold the step. Every run of an arm counts."""

    out = []
    for filter_arm, clip_arm, task, K in _pair_cells(report):
        f = {seed: phase_means(tv) for seed, tv in _arm_tv(report, filter_arm, task, K).items()}
        c = {seed: phase_means(tv) for seed, tv in _arm_tv(report, clip_arm, task, K).items()}
        if not (f and c):
            continue
        seeds = sorted(set(f) & set(c))
        for i, phase in enumerate(PHASES):
            ratios = [c[s][i] / f[s][i] for s in seeds if f[s][i] > 0]
            out.append(
                StepPhase(
                    task,
                    K,
                    filter_arm,
                    clip_arm,
                    phase,
                    float(np.mean([v[i] for v in f.values()])),
                    float(np.mean([v[i] for v in c.values()])),
                    float(np.std(ratios, ddof=1)) if len(ratios) >= 2 else math.nan,
                    len(seeds),
                )
            )
    return out


def fraction_table(report: Report) -> dict[tuple[str, int], tuple[float, float, str]]:
    """Per (algorithm, K): the mean filter fraction, the mean clip fraction, and the objective."""
    rows = {}
    for (algo, K), runs in groups_of(report.main_runs(), lambda r: (r.algorithm, r.K)).items():
        f = [r.history("train/filter_fraction")[1].mean() for r in runs if len(r.history("train/filter_fraction")[1])]
        c = [r.history("train/clip_fraction")[1].mean() for r in runs if len(r.history("train/clip_fraction")[1])]
        rows[(algo, K)] = (np.mean(f) if f else math.nan, np.mean(c) if c else math.nan, runs[0].objective)
    return rows


@dataclasses.dataclass
class Ablation:
    name: str
    title: str
    runs: list[Run]
    variant: Callable[[Run], str]
    reason: str  # why it is not available, when runs is empty

    def groups(self) -> dict[str, list[Run]]:
        """``"<variant> K=<K>"`` -> runs, sorted by variant and K."""
        return groups_of(
            sorted(self.runs, key=lambda r: (self.variant(r), r.K)), lambda r: f"{self.variant(r)} K={r.K}"
        )


def ablations(report: Report) -> dict[str, Ablation]:
    """The runs of each ablation: one per axis (delta, rho_bar, and any other axis an objective
    declares) for the algorithms run with >= 2 of its values while the other axes are at their
    reference; and realignment (objectives run both with V-trace and with GAE, at the reference)."""

    def varied(axis: str) -> Ablation:
        candidates = [
            r
            for r in report.runs
            if r.axes.get(axis) is not None
            and all(r.axes.get(a) in (None, v) for a, v in report.reference.items() if a != axis)
        ]
        by_algo = groups_of(candidates, lambda r: r.algorithm)
        runs = [r for rs in by_algo.values() if len({r.axes[axis] for r in rs}) > 1 for r in rs]
        return Ablation(
            axis,
            f"{axis} ablation",
            runs,
            lambda r: f"{r.algorithm} {axis}={r.axes[axis]:g}",
            f"needs runs of an algorithm that takes {axis} with at least two values of it",
        )

    out = {axis: varied(axis) for axis, value in report.reference.items() if value is not None}  # no run has it: none
    by_obj = groups_of(report.main_runs(), lambda r: r.objective)
    runs = [r for rs in by_obj.values() if len({r.realign for r in rs}) > 1 for r in rs]
    out["realign"] = Ablation(
        "realign",
        "realignment on/off",
        runs,
        lambda r: f"{r.algorithm} ({'V-trace' if r.realign else 'GAE'})",
        "needs runs of one objective both with V-trace realignment and with GAE",
    )
    return out


def ablation_scores(report: Report, ablation: Ablation) -> tuple[Scores, Scores]:
    """IQM of the normalised final score and of the AUC per (variant, K)."""
    groups = ablation.groups()
    final, _, notes = report.matrices(groups, lambda r: report.normalized[r.run_id])
    auc, _, _ = report.matrices(groups, lambda r: report.auc[r.run_id])
    return (
        Scores(iqm_estimates(final, report.reps, report.seed, report.min_runs), ("IQM",), notes),
        Scores(iqm_estimates(auc, report.reps, report.seed, report.min_runs), ("IQM AUC",), []),
    )
