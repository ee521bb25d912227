"""Robustness to lag: each algorithm against its own K = 1, and the difference of drops.

The paper's claim is not that VACO scores higher but that it *loses less* as the behaviour data
gets staler. This module answers that question as data (nothing here draws):

* an algorithm's **drop** at K is ``IQM(K_ref) - IQM(K)`` of its normalised final scores
  (``K_ref``: the smallest K in the report, normally 1), and its **ratio** ``IQM(K) / IQM(K_ref)``;
* the **interaction** with a baseline at K is ``drop(baseline) - drop(algorithm)``: positive when
  the algorithm loses less than the baseline. Alongside it, ``P(drop smaller)``: rliable's
  probability of improvement on the per-seed drops, the chance that a run of the algorithm drops
  less than a run of the baseline on a task drawn at random (0.5: no difference);
* per task, the mean normalised score at ``K_ref`` and at K, the mean drop and the **sample**
  standard deviation (``ddof = 1``) of the per-seed drops.

Runs are **paired by seed**: a cell's seed s at K_ref and at K (and the baseline's seed s) start
from the same initial weights and environment seeds, so their drops are paired differences. The
intervals come from a *paired* stratified bootstrap: in each resample and within each task, one
draw of seed indices (with replacement) is applied to every cell of the comparison. rliable's
``StratifiedBootstrap`` cannot do that (it draws every (task, cell) column independently, which
treats the four cells as independent samples), so the resampling loop is written here; the
aggregates themselves are rliable's ``aggregate_iqm`` and ``probability_of_improvement``.

With n seeds a task has only ``C(2n - 1, n)`` distinct bootstrap resamples (10 for 3 seeds, 92,378
for 10): :func:`distinct_resamples` gives the number and :class:`Robustness` notes cells where it is
small, since a percentile interval from so few distinct values is optimistic.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from vaco.report.bootstrap import improvement, iqm
from vaco.report.decision import Verdict, decide
from vaco.report.scores import Report
from vaco.report.tables import improvement_baseline

__all__ = [
    "FEW_RESAMPLES",
    "FLOOR",
    "Drop",
    "Interaction",
    "Robustness",
    "TaskDrop",
    "distinct_resamples",
    "paired_bootstrap",
    "paired_cells",
    "robustness",
]

#: IQM (normalised units) below which an arm learned little: a ranking lists it apart at K_ref
#: (:mod:`vaco.report.ranking`), and no seed count is offered for a comparison whose arms are both
#: below it at K (the lag benchmark's plans judge such a comparison "at the floor: uninformative")
FLOOR = 0.1

FEW_RESAMPLES = 1000  # fewer distinct resamples per task than this: the summary warns


def distinct_resamples(n: int) -> int:
    """Distinct bootstrap resamples (multisets) of n items: ``C(2n - 1, n)``."""
    return math.comb(2 * n - 1, n) if n > 0 else 0


def _iqm(x: np.ndarray) -> float:
    return float(iqm(x))


def p_smaller(drop_x: np.ndarray, drop_y: np.ndarray) -> np.ndarray:
    """P(a run of X drops less than a run of Y): rliable's probability of improvement on ``-drop``
    (per task, the Mann-Whitney U of X's runs over Y's divided by their pairs, ties counting one
    half; averaged over tasks), over the last two axes (runs x tasks) for every leading index."""
    return improvement(-np.asarray(drop_x, dtype=np.float64), -np.asarray(drop_y, dtype=np.float64))


def _p_smaller(drop_x: np.ndarray, drop_y: np.ndarray) -> float:
    return float(p_smaller(drop_x, drop_y))


def paired_bootstrap(cells: Sequence[np.ndarray], func, reps: int, seed: int) -> np.ndarray:
    """``func(*cells)`` on ``reps`` paired stratified resamples: every cell is a (seeds x tasks)
    matrix with rows aligned by seed; per resample and task, one draw of row indices (with
    replacement) is applied to every cell. Returns the (reps x outputs) resampled statistics.

    ``func`` is called once, on cells of shape (reps x seeds x tasks): it computes its statistic
    over the last two axes for every leading index (:func:`iqm`, :func:`p_smaller`). The draws are
    one block of ``rng.integers``, the same stream as ``reps`` draws of (seeds x tasks) in turn."""
    n, tasks = cells[0].shape
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n, size=(reps, n, tasks))
    columns = np.arange(tasks)[None, None, :]
    out = np.asarray(func(*(c[rows, columns] for c in cells)), dtype=np.float64)
    return out.reshape(reps, -1)


def _interval(samples: np.ndarray) -> np.ndarray:
    """The 95% percentile interval of each column: (2 x outputs)."""
    return np.percentile(samples, [2.5, 97.5], axis=0)


@dataclasses.dataclass
class Drop:
    """An algorithm's loss from its own K_ref to K (IQM over seeds x tasks)."""

    algorithm: str
    K: int
    level_ref: float  # IQM at K_ref
    level: float  # IQM at K
    drop: float  # level_ref - level
    ratio: float  # level / level_ref (nan when level_ref <= 0)
    drop_interval: np.ndarray | None  # [low, high]
    ratio_interval: np.ndarray | None
    seeds: int  # seeds per task used (paired)
    tasks: int
    verdict: Verdict | None = None  # on the drop (vaco.report.decision)


@dataclasses.dataclass
class Interaction:
    """drop(baseline) - drop(algorithm) at K (positive: the algorithm loses less), and P(its drop
    is the smaller one)."""

    algorithm: str
    baseline: str
    K: int
    difference: float
    difference_interval: np.ndarray | None
    p_smaller: float
    p_interval: np.ndarray | None
    seeds: int
    tasks: int
    verdict: Verdict | None = None  # on the difference of drops (vaco.report.decision)
    mean_difference: float = math.nan  # the same contrast with untrimmed means (beside the IQM one)
    # IQM of the four cells (algorithm at K_ref, algorithm at K, baseline at K_ref, baseline at K):
    # difference = (levels[1] - levels[3]) + (levels[2] - levels[0]), the gap at K plus the K_ref gap
    levels: tuple[float, float, float, float] | None = None
    # the same contrast on each task alone, (task, IQM, untrimmed mean): what the pooled one rests on
    per_task: tuple[tuple[str, float, float], ...] = ()
    # the four paired (seeds x tasks) matrices it was computed from, in the order of ``levels``
    cells: tuple[np.ndarray, ...] | None = dataclasses.field(default=None, repr=False)

    @property
    def gap_at_k(self) -> float:
        """IQM(algorithm at K) - IQM(baseline at K): the part of the difference of drops seen at K."""
        return math.nan if self.levels is None else self.levels[1] - self.levels[3]

    @property
    def gap_at_ref(self) -> float:
        """IQM(baseline at K_ref) - IQM(algorithm at K_ref): the part that was there before any lag."""
        return math.nan if self.levels is None else self.levels[2] - self.levels[0]


@dataclasses.dataclass
class TaskDrop:
    """One task: mean normalised score at K_ref and K, the mean per-seed drop and its sample SD."""

    task: str
    algorithm: str
    K: int
    mean_ref: float
    mean: float
    drop: float
    drop_sd: float  # sample standard deviation (ddof = 1) of the per-seed drops; nan for one seed
    seeds: int


@dataclasses.dataclass
class Robustness:
    k_ref: int
    baseline: str | None
    drops: dict[tuple[str, int], Drop]
    interactions: dict[tuple[str, int], Interaction]
    per_task: list[TaskDrop]
    seeds: dict[tuple[str, int, str], int]  # (algorithm, K, task) -> runs in the cell
    notes: list[str]

    def frame(self):
        """One row per (algorithm, K): level at K_ref and K, drop, ratio, and, against the
        baseline, the difference of drops and P(drop smaller), each with its interval."""
        import pandas as pd

        def ends(x):
            return (math.nan, math.nan) if x is None else (float(x[0]), float(x[1]))

        rows = []
        for (algo, K), d in self.drops.items():
            i = self.interactions.get((algo, K))
            rows.append(
                {
                    "algorithm": algo,
                    "K": K,
                    "iqm_ref": d.level_ref,
                    "iqm": d.level,
                    "drop": d.drop,
                    "drop_low": ends(d.drop_interval)[0],
                    "drop_high": ends(d.drop_interval)[1],
                    "ratio": d.ratio,
                    "ratio_low": ends(d.ratio_interval)[0],
                    "ratio_high": ends(d.ratio_interval)[1],
                    "difference": i.difference if i else math.nan,
                    "difference_low": ends(i.difference_interval)[0] if i else math.nan,
                    "difference_high": ends(i.difference_interval)[1] if i else math.nan,
                    "p_smaller": i.p_smaller if i else math.nan,
                    "p_low": ends(i.p_interval)[0] if i else math.nan,
                    "p_high": ends(i.p_interval)[1] if i else math.nan,
                    "drop_verdict": d.verdict.word if d.verdict else "",
                    "difference_verdict": i.verdict.word if i and i.verdict else "",
                    "seeds_needed": i.verdict.seeds_needed if i and i.verdict else None,
                    "seeds": d.seeds,
                    "tasks": d.tasks,
                }
            )
        return pd.DataFrame(rows)


def paired_cells(
    report: Report,
    cells: Sequence[tuple[str, int]],
    tasks: Sequence[str],
    values: Mapping[str, float] | None = None,
    runs: Sequence | None = None,
) -> tuple[list[np.ndarray], list[int]]:
    """(seeds x tasks) matrices of the runs' ``values`` (run_id -> score; default the report's
    declared score, :meth:`Report.study_scores`), one per (algorithm, K) cell, with rows aligned by
    seed: per task the seeds every cell has, cut to the smallest such count over the tasks (lowest
    seeds first). Returns the matrices and the seeds kept per task's count. ``runs``: the runs to
    pair (default the main comparison's, :meth:`Report.main_runs`; a study plan's arms may be controls)."""
    values = report.study_scores() if values is None else values
    by_cell: dict[tuple[str, int, str], dict[int, float]] = defaultdict(dict)
    for r in report.main_runs() if runs is None else runs:
        by_cell[(r.algorithm, r.K, r.env)][r.seed] = values[r.run_id]
    common = {}
    for t in tasks:
        seeds = None
        for a, K in cells:
            have = set(by_cell.get((a, K, t), {}))
            seeds = have if seeds is None else seeds & have
        common[t] = sorted(seeds or ())
    n = min(len(s) for s in common.values()) if common else 0
    mats = [
        np.array(
            [[by_cell[(a, K, t)][s] for t in tasks for s in [common[t][i]]] for i in range(n)], dtype=np.float64
        ).reshape(n, len(tasks))
        for a, K in cells
    ]
    return mats, [len(common[t]) for t in tasks]


def robustness(report: Report, baseline: str | None = None) -> Robustness:
    """Drops, ratios and the interaction with ``baseline`` (the report's, else PPO-clip) at each K."""
    baseline = baseline or improvement_baseline(report)
    main = report.main_runs()
    ks = sorted({r.K for r in main})
    notes: list[str] = []
    seeds: dict[tuple[str, int, str], int] = defaultdict(int)
    for r in main:
        seeds[(r.algorithm, r.K, r.env)] += 1
    if len(ks) < 2:
        return Robustness(ks[0] if ks else 1, baseline, {}, {}, [], dict(seeds), ["needs runs at two or more K"])
    k_ref = ks[0]
    algos = [a for a in report.algorithms if any(r.algorithm == a for r in main)]
    drops, interactions, per_task = {}, {}, []
    small: set[int] = set()
    for algo in algos:
        for K in ks[1:]:
            drop = _drop(report, main, algo, k_ref, K, seeds, notes, small, per_task)
            if drop is not None:
                drops[(algo, K)] = drop
    if baseline is not None:
        for algo in algos:
            for K in ks[1:]:
                if algo != baseline and (algo, K) in drops and (baseline, K) in drops:
                    found = difference_of_drops(report, algo, baseline, k_ref, K, seeds, notes)
                    if found is not None:
                        interactions[(algo, K)] = found
    if small:
        notes.append(
            "few distinct bootstrap resamples: "
            + ", ".join(f"{n} seeds per task give {distinct_resamples(n)}" for n in sorted(small))
            + f" per task (under {FEW_RESAMPLES}); those intervals are optimistic"
        )
    few = sorted({n for d in drops.values() for n in [d.seeds] if n < report.min_runs})
    if few:
        notes.append(
            f"no interval where a cell has fewer than {report.min_runs} paired seeds ({', '.join(map(str, few))})"
        )
    return Robustness(k_ref, baseline, drops, interactions, per_task, dict(seeds), notes)


def _drop(report: Report, main, algo: str, k_ref: int, K: int, seeds, notes, small, per_task) -> Drop | None:
    """``algo``'s drop from K = ``k_ref`` to ``K`` over the tasks with paired seeds (appends its
    per-task rows to ``per_task`` and what it had to leave out to ``notes``)."""
    tasks = sorted({r.env for r in main if r.algorithm == algo and r.K in (k_ref, K)})
    tasks = [t for t in tasks if seeds.get((algo, k_ref, t)) and seeds.get((algo, K, t))]
    if not tasks:
        return None
    missing = sorted(set(report.tasks) - set(tasks))
    if missing:
        notes.append(f"{algo} K={K}: no paired runs on {', '.join(missing)}; its drop is over {', '.join(tasks)}")
    (ref, cur), counts = paired_cells(report, [(algo, k_ref), (algo, K)], tasks)
    n = ref.shape[0]
    if n == 0:
        notes.append(f"{algo} K={K}: no seed has runs at both K={k_ref} and K={K}")
        return None
    if len(set(counts)) > 1:
        notes.append(f"{algo} K={K}: paired seeds per task {dict(zip(tasks, counts))}; cut to {n}")
    if distinct_resamples(n) < FEW_RESAMPLES:
        small.add(n)
    for j, t in enumerate(tasks):
        d = ref[:, j] - cur[:, j]
        per_task.append(
            TaskDrop(
                t,
                algo,
                K,
                float(ref[:, j].mean()),
                float(cur[:, j].mean()),
                float(d.mean()),
                float(d.std(ddof=1)) if n > 1 else math.nan,
                n,
            )
        )

    def drop_ratio(a, b):
        lo, hi = iqm(a), iqm(b)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.stack([lo - hi, np.where(lo > 0, hi / np.where(lo > 0, lo, 1.0), math.nan)], axis=-1)

    point = drop_ratio(ref, cur)
    interval = samples = None
    if n >= report.min_runs:
        samples = paired_bootstrap([ref, cur], drop_ratio, report.reps, report.seed)
        interval = _interval(samples)
    verdict = decide(float(point[0]), ref - cur, report.margin, None if samples is None else samples[:, 0], report.seed)
    return Drop(
        algo,
        K,
        _iqm(ref),
        _iqm(cur),
        float(point[0]),
        float(point[1]),
        None if interval is None else interval[:, 0],
        None if interval is None else interval[:, 1],
        n,
        len(tasks),
        verdict,
    )


def difference_of_drops(
    report: Report, algo: str, baseline: str, k_ref: int, K: int, seeds, notes, runs: Sequence | None = None
) -> Interaction | None:
    """The difference of drops of ``algo`` and ``baseline`` (and P(drop smaller)) on the seeds with
    runs in all four cells."""
    cells = [(algo, k_ref), (algo, K), (baseline, k_ref), (baseline, K)]
    tasks = [t for t in report.tasks if all(seeds.get((a, k, t)) for a, k in cells)]
    mats, counts = paired_cells(report, cells, tasks, runs=runs)
    n = mats[0].shape[0]
    if n == 0:
        notes.append(f"{algo} vs {baseline} K={K}: no seed has runs in all four cells")
        return None

    def interaction(xr, xk, yr, yk):
        return np.stack([(iqm(yr) - iqm(yk)) - (iqm(xr) - iqm(xk)), p_smaller(xr - xk, yr - yk)], axis=-1)

    point = interaction(*mats)
    interval = samples = None
    if n >= report.min_runs:
        samples = paired_bootstrap(mats, interaction, report.reps, report.seed)
        interval = _interval(samples)
    xr, xk, yr, yk = mats
    verdict = decide(
        float(point[0]), (yr - yk) - (xr - xk), report.margin, None if samples is None else samples[:, 0], report.seed
    )
    if verdict.seeds_needed is not None and max(_iqm(xk), _iqm(yk)) < FLOOR:
        # both arms near the floor at K: more seeds would measure two collapses, not which loses less
        verdict = dataclasses.replace(verdict, seeds_needed=None)
    return Interaction(
        algo,
        baseline,
        K,
        float(point[0]),
        None if interval is None else interval[:, 0],
        float(point[1]),
        None if interval is None else interval[:, 1],
        n,
        len(tasks),
        verdict,
        float(((yr - yk) - (xr - xk)).mean()),
        (_iqm(xr), _iqm(xk), _iqm(yr), _iqm(yk)),
        tuple(
            (
                task,
                float(interaction(*(m[:, [t]] for m in mats))[0]),
                float(((yr - yk) - (xr - xk))[:, t].mean()),
            )
            for t, task in enumerate(tasks)
        ),
        tuple(mats),
    )
