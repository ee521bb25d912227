"""A ranking of the algorithms by their drop from their own K_ref at each K, with how sure it is.

A benchmark of many corrections asks which loses least as the data grows stale. The drops and
their intervals (:mod:`vaco.report.robustness`) answer it one algorithm at a time; a ranking says
how they order, and the bootstrap says how firmly. At each K:

* the algorithms that have runs at ``K_ref`` and at K on every task of the ranking, paired by seed
  across *all* of them (per task the seeds every such cell has; lowest seeds first), so that one
  resample draws the same seeds for every algorithm and the ranks within it are comparable;
* the point **rank**: 1 for the smallest drop (``IQM(K_ref) - IQM(K)`` of the report's score);
* the **rank interval**: the 2.5th and 97.5th percentiles of each algorithm's rank over the paired
  stratified bootstrap (:func:`vaco.report.robustness.paired_bootstrap`, the report's resamples and
  seed: with the same seeds it draws the same resamples as the drop intervals);
* **P(first)**: the share of resamples in which the algorithm has the smallest drop.

Ties share the lowest rank (``scipy.stats.rankdata``'s ``"min"``). A ranking is exploratory: it
is not a test, and a plan's declared family is judged elsewhere (:mod:`vaco.study.judge`).

**The floor**: an algorithm whose IQM at K_ref is below ``floor`` (normalised units; the lag
benchmark's plans use 0.1) learned little before any lag, so it has little to lose and a small drop
would flatter it. It is not ranked: it is listed apart (:attr:`Ranking.apart`), with its drop and
levels, and the others are ranked among themselves.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vaco.report.robustness import FLOOR, Robustness, iqm, paired_bootstrap, paired_cells
from vaco.report.scores import Report

__all__ = ["Rank", "Ranking", "rankings"]


@dataclasses.dataclass
class Rank:
    """One algorithm's place at K: its drop (on the ranking's common seeds), its rank, where the
    bootstrap puts the rank, and how often it comes first."""

    algorithm: str
    K: int
    rank: int  # 1: the smallest drop
    drop: float
    drop_interval: np.ndarray | None  # 95% percentile interval, paired stratified bootstrap
    level_ref: float  # IQM at K_ref
    level: float  # IQM at K
    rank_interval: tuple[int, int] | None  # 2.5th and 97.5th percentiles of the bootstrap ranks
    p_first: float  # share of resamples with the smallest drop (nan without a bootstrap)


@dataclasses.dataclass
class Ranking:
    K: int
    k_ref: int
    ranks: list[Rank]  # in rank order
    seeds: int  # paired seeds per task, common to every algorithm ranked
    tasks: tuple[str, ...]
    notes: list[str]
    #: the algorithms below the floor at K_ref (same seeds), not ranked: rank 0, no interval
    apart: list[Rank] = dataclasses.field(default_factory=list)
    floor: float | None = None


def _ranks(drops: np.ndarray) -> np.ndarray:
    """Ranks along the last axis, 1 for the smallest, ties at their lowest rank."""
    from scipy.stats import rankdata

    return rankdata(drops, method="min", axis=-1).astype(int)


def rankings(report: Report, data: Robustness, floor: float | None = FLOOR) -> list[Ranking]:
    """One ranking per K above ``data.k_ref`` where three or more algorithms have a drop (with two,
    the difference of drops is the comparison); those below ``floor`` at K_ref listed apart (None:
    rank every one)."""
    main = report.main_runs()
    out = []
    for K in sorted({K for _, K in data.drops}):
        algos = [a for (a, k) in data.drops if k == K]
        if len(algos) < 3:
            continue
        notes: list[str] = []
        tasks = [t for t in report.tasks if all(data.seeds.get((a, k, t)) for a in algos for k in (data.k_ref, K))]
        dropped = sorted(set(report.tasks) - set(tasks))
        if not tasks:
            notes.append(f"K={K}: no task has runs of every algorithm at K={data.k_ref} and K={K}; no ranking")
            out.append(Ranking(K, data.k_ref, [], 0, (), notes))
            continue
        if dropped:
            notes.append(f"K={K}: ranked on {', '.join(tasks)} (not every algorithm ran {', '.join(dropped)})")
        cells = [(a, k) for a in algos for k in (data.k_ref, K)]
        mats, counts = paired_cells(report, cells, tasks, runs=main)
        n = mats[0].shape[0]
        if n == 0:
            notes.append(f"K={K}: no seed has runs of every algorithm at K={data.k_ref} and K={K}; no ranking")
            out.append(Ranking(K, data.k_ref, [], 0, tuple(tasks), notes))
            continue
        if len(set(counts)) > 1:
            notes.append(f"K={K}: seeds every algorithm has per task {dict(zip(tasks, counts))}; cut to {n}")

        def drops(*cells):  # (algorithm at K_ref, algorithm at K) in turn -> each algorithm's drop
            return np.stack([iqm(ref) - iqm(cur) for ref, cur in zip(cells[::2], cells[1::2])], axis=-1)

        point = drops(*mats)
        low = [i for i in range(len(algos)) if floor is not None and iqm(mats[2 * i]) < floor]
        ranked = [i for i in range(len(algos)) if i not in low]
        rank = np.zeros(len(algos), dtype=int)
        rank[ranked] = _ranks(point[ranked])
        interval = p_first = low_high = None
        if n >= report.min_runs:
            samples = paired_bootstrap(mats, drops, report.reps, report.seed)
            low_high = np.percentile(samples, [2.5, 97.5], axis=0)
            ranks = _ranks(samples[:, ranked])
            interval = np.zeros((2, len(algos)), dtype=int)
            interval[:, ranked] = np.percentile(
                ranks, [2.5, 97.5], axis=0, method="inverted_cdf"
            )  # ranks that occurred
            p_first = np.full(len(algos), np.nan)
            p_first[ranked] = (ranks == 1).mean(axis=0)
        rows = [
            Rank(
                a,
                K,
                int(rank[i]),
                float(point[i]),
                None if low_high is None else low_high[:, i],
                float(iqm(mats[2 * i])),
                float(iqm(mats[2 * i + 1])),
                None if interval is None or i in low else (int(interval[0, i]), int(interval[1, i])),
                float("nan") if p_first is None else float(p_first[i]),
            )
            for i, a in enumerate(algos)
        ]
        rows.sort(key=lambda r: (r.rank, r.drop, algos.index(r.algorithm)))
        apart = [r for r in rows if r.rank == 0]
        ranking = Ranking(K, data.k_ref, [r for r in rows if r.rank > 0], n, tuple(tasks), notes, apart, floor)
        out.append(ranking)
    return out
