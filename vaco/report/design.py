"""The 2x2 step-size design: objective {TV filter, clip} x step size {large, small}, on robustness.

Two step-size pairs (``vaco report --step-pairs FILTER=CLIP`` twice, e.g. ``vaco=ppo_clip_large_step``
and ``vaco_tv_matched=ppo_clip_small_step``), each a TV-filter arm and a clip arm calibrated to move as
far per iteration, make the four arms of a 2x2 design. Which pair is the *large* step is read from the
data: the one whose filter arm's realised ``lag/forward_tv`` at the reference K is the larger.

At each K above the reference, with ``drop(X) = IQM(X, K_ref) - IQM(X, K)`` of the declared score
(:meth:`vaco.report.scores.Report.study_scores`) and ``A(pair) = drop(clip) - drop(filter)`` (the
filter's advantage at that step: above 0 it loses less):

* ``filter vs clip, large step`` = A(large) and ``... small step`` = A(small);
* **objective** (main effect) = (A(large) + A(small)) / 2: does the TV filter lose less than clipping
  at equal step size, averaged over the two step sizes;
* **step size** (main effect) = (drop(filter_small) + drop(clip_small) - drop(filter_large) -
  drop(clip_large)) / 2: above 0 the larger step loses less, whichever the objective;
* **objective x step size** = A(large) - A(small): does the filter's advantage depend on the step.

Runs are paired by seed over the eight cells (four arms x two K; the seeds every cell has, per task),
the intervals come from one paired stratified bootstrap (:func:`vaco.report.robustness.paired_bootstrap`)
for all five contrasts, and each is decided by :func:`vaco.report.decision.decide` on the per-seed
contrasts (the same linear combination of per-seed drops; their mean, not the IQM, is what the
sign-flip tests and the seeds-needed estimate use). Nothing here draws.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from vaco.report.ablations import step_size_matching
from vaco.report.decision import Verdict, decide
from vaco.report.robustness import iqm, paired_bootstrap, paired_cells
from vaco.report.scores import Report

__all__ = ["CONTRASTS", "WEIGHTS", "Contrast", "Design", "design_cells", "two_by_two"]

#: the contrasts, in the order printed, with the coefficients of (filter_L, clip_L, filter_S, clip_S) drops
CONTRASTS: dict[str, tuple[float, float, float, float]] = {
    "filter vs clip, large step": (-1.0, 1.0, 0.0, 0.0),
    "filter vs clip, small step": (0.0, 0.0, -1.0, 1.0),
    "objective (main effect)": (-0.5, 0.5, -0.5, 0.5),
    "step size (main effect)": (-0.5, -0.5, 0.5, 0.5),
    "objective x step size": (-1.0, 1.0, 1.0, -1.0),
}


WEIGHTS = np.array(list(CONTRASTS.values()))  # contrasts x arms


def _combine(*cells: np.ndarray) -> np.ndarray:
    """The contrasts of the four arms' IQM drops; ``cells``: (arm, K_ref), (arm, K) for each arm."""
    drops = np.stack([iqm(cells[2 * i]) - iqm(cells[2 * i + 1]) for i in range(4)], axis=-1)
    return drops @ WEIGHTS.T  # (..., contrasts), for every leading (resample) index


@dataclasses.dataclass
class Contrast:
    name: str
    K: int
    estimate: float  # the combination of IQM drops
    interval: np.ndarray | None  # 95% paired bootstrap, [low, high]
    verdict: Verdict
    seeds: int  # paired seeds per task
    tasks: int


@dataclasses.dataclass
class Design:
    large: tuple[str, str]  # (filter arm, clip arm)
    small: tuple[str, str]
    k_ref: int
    contrasts: list[Contrast]
    notes: list[str]


def _filter_tv(report: Report, arm: str, K: int) -> float:
    tvs = [m.filter_tv for m in step_size_matching(report) if m.filter_arm == arm and m.K == K]
    return float(np.mean(tvs)) if tvs else math.nan


def design_cells(report: Report, design: Design, K: int) -> tuple[list[tuple[str, int]], list[str]]:
    """The eight (arm, K) cells of ``design``'s contrasts at ``K`` (filter_L, clip_L, filter_S, clip_S,
    each at the reference K then at ``K``) and the tasks that have runs in all of them."""
    return _cells([*design.large, *design.small], design.k_ref, K, report)


def _cells(arms: list[str], k_ref: int, K: int, report: Report) -> tuple[list[tuple[str, int]], list[str]]:
    cells = [(a, k) for a in arms for k in (k_ref, K)]
    have = {(r.algorithm, r.K, r.env) for r in report.main_runs()}
    return cells, [t for t in report.tasks if all((a, k, t) in have for a, k in cells)]


def two_by_two(report: Report) -> Design | None:
    """The 2x2 contrasts at each K, or None unless exactly two step pairs are declared."""
    if len(report.step_pairs) != 2:
        return None
    main = report.main_runs()
    ks = sorted({r.K for r in main})
    if len(ks) < 2:
        return None
    k_ref = ks[0]
    pairs = list(report.step_pairs.items())
    tvs = [_filter_tv(report, f, k_ref) for f, _ in pairs]
    notes: list[str] = []
    if any(math.isnan(t) for t in tvs):
        notes.append(f"no lag/forward_tv at K={k_ref} for a filter arm: the pairs are taken in the order declared")
        large, small = pairs
    else:
        large, small = pairs if tvs[0] >= tvs[1] else pairs[::-1]
    arms = [large[0], large[1], small[0], small[1]]
    contrasts = []
    for K in ks[1:]:
        cells, tasks = _cells(arms, k_ref, K, report)
        if not tasks:
            notes.append(f"K={K}: no task has runs of all four arms at K={k_ref} and K={K}")
            continue
        mats, counts = paired_cells(report, cells, tasks)
        n = mats[0].shape[0]
        if n == 0:
            notes.append(f"K={K}: no seed has runs in all eight cells")
            continue
        if len(set(counts)) > 1:
            notes.append(f"K={K}: paired seeds per task {dict(zip(tasks, counts))}; cut to {n}")
        point = _combine(*mats)
        per_seed = np.stack([mats[2 * i] - mats[2 * i + 1] for i in range(4)], axis=-1) @ WEIGHTS.T  # n x T x C
        samples = None
        if n >= report.min_runs:
            samples = paired_bootstrap(mats, _combine, report.reps, report.seed)
        for c, name in enumerate(CONTRASTS):
            verdict = decide(
                float(point[c]),
                per_seed[:, :, c],
                report.margin,
                None if samples is None else samples[:, c],
                report.seed,
            )
            interval = None if samples is None else np.percentile(samples[:, c], [2.5, 97.5])
            contrasts.append(Contrast(name, K, float(point[c]), interval, verdict, n, len(tasks)))
    return Design(large, small, k_ref, contrasts, notes)
