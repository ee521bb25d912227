"""Statistics as data: final and normalised scores, rliable aggregates with stratified-bootstrap
intervals, curves and performance profiles, and the :class:`Report` that holds a report's runs and
scores (the tables built from it are in :mod:`vaco.report.tables`, the TV and fraction tables and
the ablations in :mod:`vaco.report.ablations`, the drops in :mod:`vaco.report.robustness`). Nothing here draws; the figures
(:mod:`vaco.report.figures`) and the summary (:mod:`vaco.report.summary`) are made from what these
functions return, and a notebook gets every number without drawing a figure.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from vaco.report import bootstrap
from vaco.report.decision import DEFAULT_MARGIN
from vaco.report.runs import Run
from vaco.tracking import PAPER_AXES

ACCURACY = "eval/accuracy"  # the LLM track's score: an accuracy, normalised by nothing

__all__ = [
    "AGGREGATES",
    "Estimate",
    "Report",
    "SCORES",
    "aggregate_estimates",
    "area_under_curve",
    "build_report",
    "common_grid",
    "curve_iqm",
    "final_score",
    "iqm_estimates",
    "is_variant",
    "normalization_bounds",
    "normalize",
    "performance_profiles",
    "resample",
    "runs_frame",
    "score_matrix",
]

#: The paper's algorithm names in the order of its figures (names as runs log them, not classes):
#: the report lists these first and any other algorithm after them, alphabetically.
_PAPER_ORDER = (
    "vaco",
    "ppo_clip",
    "ppo_kl",
    "spo",
    "impala",
    "vaco_no_realign",
    "ppo_clip_tv_matched",
    "vaco_tv_matched",
)
#: Algorithm names that are variants of another (an ablation or a control), not main algorithms:
#: the paper's normalisation leaves them out of a task's min and max. Runs now say so themselves
#: (the ``variant_of`` param, see :func:`is_variant`); this list serves data logged before they did
#: (the committed docs/data files). A run whose label carries a dotted-key value
#: (``vaco[normalize_advantage=false]``) or a realignment switch (``ppo_clip+realign``) is a variant too.
VARIANTS = ("vaco_no_realign", "ppo_clip_tv_matched", "vaco_tv_matched")
NORMALIZATIONS = ("main", "all")
#: the scores a study may declare (``vaco report --score``): the last evaluation, the mean of the last
#: n (``--last-evals n``), or the normalised curve's area (its mean over training)
SCORES = ("final", "last-n", "auc")
_PAPER_REFERENCE = {"delta": 0.2, "rho_bar": 1.0}  # the paper's values win a tie for "most used"
MAX_CURVE_POINTS = 20
AGGREGATES = ("Median", "IQM", "Mean", "Optimality Gap")


def _metrics():
    from rliable import metrics

    return metrics


def _aggregates() -> dict[str, Callable[[np.ndarray], float]]:
    metrics = _metrics()
    return {
        "Median": metrics.aggregate_median,
        "IQM": metrics.aggregate_iqm,
        "Mean": metrics.aggregate_mean,
        "Optimality Gap": metrics.aggregate_optimality_gap,
    }


def is_variant(algorithm: str, variant_of: str | None = None) -> bool:
    """An ablation or control variant, not one of the main algorithms: a run that says so (its
    ``variant_of`` param, which an objective's ``variants`` or ``model.variant_of`` sets), a sweep
    label with a dotted-key value or a realignment switch, or (data logged before runs said so)
    a name in :data:`VARIANTS`."""
    return (
        variant_of is not None
        or algorithm in VARIANTS
        or "[" in algorithm
        or algorithm.endswith(("+realign", "-realign"))
    )


# ---------------------------------------------------------------------------------------- math
def final_score(values: Sequence[float], last: int = 1) -> float:
    """Mean of the last ``last`` evaluation returns (values ordered by env step)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return math.nan
    return float(values[-last:].mean())


def normalization_bounds(scores_by_task: Mapping[str, Sequence[float]]) -> dict[str, tuple[float, float]]:
    """Per task (min, max) over all the given final scores (all algorithms and settings)."""
    return {task: (float(np.min(s)), float(np.max(s))) for task, s in scores_by_task.items() if len(s)}


def normalize(value, bounds: tuple[float, float]):
    """``(value - min) / (max - min)``; a task whose runs all scored the same maps to 1."""
    low, high = bounds
    value = np.asarray(value, dtype=np.float64)
    if high == low:
        return np.ones_like(value)
    return (value - low) / (high - low)


def score_matrix(values_by_task: Mapping[str, Sequence], tasks: Sequence[str]) -> np.ndarray:
    """A (runs x tasks [x points]) matrix; each task's runs are cut to the smallest count."""
    n = min(len(values_by_task[t]) for t in tasks)
    return np.stack([np.asarray(list(values_by_task[t])[:n], dtype=np.float64) for t in tasks], axis=1)


#: runs per task below which an interval is the runs' range, not a bootstrap interval. With n runs a
#: task a stratified bootstrap has C(2n - 1, n) distinct resamples a task (10 at n = 3, 35 at n = 4):
#: at n = 3 its 95% percentile interval is the range of the single-run values (each run alone is
#: drawn three times with probability 1/27 > 2.5%), so it is shown, and called, the range.
RANGE_BELOW = 5


@dataclasses.dataclass
class Estimate:
    """Point estimates of some aggregates and, when there were enough runs, their intervals: a 95%
    bootstrap interval (``kind`` "bootstrap"), or with fewer than :data:`RANGE_BELOW` runs per
    task the range of the aggregate over the runs taken one at a time (``kind`` "range")."""

    point: np.ndarray  # [metrics] or [points]
    interval: np.ndarray | None  # [2, metrics] or [2, points]; None: too few runs per task
    runs_per_task: int
    tasks: int
    kind: str = "bootstrap"

    def bounds(self) -> np.ndarray:
        """The interval, or the point twice (what a plot draws when there is no interval)."""
        return self.interval if self.interval is not None else np.stack([self.point, self.point])


def _estimates(score_dict, func, stat, reps: int, seed: int, min_runs: int) -> dict[str, Estimate]:
    """``func`` (rliable's statistic) gives the points, ``stat`` (it, for every resample at once) the
    intervals: :func:`vaco.report.bootstrap.interval_estimates`, rliable's resamples and numbers."""
    out, enough = {}, {}
    for key, scores in score_dict.items():
        n = scores.shape[0]
        if n >= max(min_runs, RANGE_BELOW):
            enough[key] = scores
        elif n >= min_runs:  # too few for a bootstrap: the runs' range, called so
            single = np.stack([np.atleast_1d(func(scores[i : i + 1])) for i in range(n)])
            interval = np.stack([single.min(0), single.max(0)])
            out[key] = Estimate(np.atleast_1d(func(scores)), interval, n, scores.shape[1], "range")
        else:
            out[key] = Estimate(np.atleast_1d(func(scores)), None, n, scores.shape[1])
    if enough:
        intervals = bootstrap.interval_estimates(enough, stat, reps, seed)
        for key, scores in enough.items():
            out[key] = Estimate(np.atleast_1d(func(scores)), intervals[key], scores.shape[0], scores.shape[1])
    return {key: out[key] for key in score_dict}


def aggregate_estimates(
    score_dict: Mapping[str, np.ndarray], reps: int = 2000, seed: int = 0, min_runs: int = 3
) -> dict[str, Estimate]:
    """Median, IQM, Mean and Optimality Gap (in that order) of (runs x tasks) score matrices, with
    95% stratified-bootstrap intervals: ``rliable.library.get_interval_estimates``'s numbers."""
    fns = _aggregates()

    def func(x):
        return np.array([fns[name](x) for name in AGGREGATES])

    return _estimates(dict(score_dict), func, bootstrap.aggregates, reps, seed, min_runs)


def iqm_estimates(score_dict: Mapping[str, np.ndarray], reps: int = 2000, seed: int = 0, min_runs: int = 3):
    """IQM alone (``rliable.metrics.aggregate_iqm``) with its stratified-bootstrap interval."""
    iqm = _metrics().aggregate_iqm

    def func(x):
        return np.array([iqm(x)])

    return _estimates(dict(score_dict), func, bootstrap.iqm, reps, seed, min_runs)


def curve_iqm(curves: Mapping[str, np.ndarray], reps: int = 2000, seed: int = 0, min_runs: int = 3):
    """IQM at each point of (runs x tasks x points) curves, rliable's sample-efficiency recipe."""
    iqm = _metrics().aggregate_iqm

    def func(x):
        return np.array([iqm(x[..., j]) for j in range(x.shape[-1])])

    return _estimates(dict(curves), func, bootstrap.curve_iqm, reps, seed, min_runs)


def area_under_curve(steps: Sequence[float], values: Sequence[float]) -> float:
    """The curve's mean over its step range (trapezoid rule); a single point is its own mean."""
    steps, values = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if steps.size == 0:
        return math.nan
    if steps.size == 1 or steps[-1] == steps[0]:
        return float(values.mean())
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy < 2 has only trapz
    return float(trapezoid(values, steps) / (steps[-1] - steps[0]))


def performance_profiles(score_dict: Mapping[str, np.ndarray], taus: np.ndarray, reps: int = 2000, seed: int = 0):
    """Score distributions (fraction of runs above tau, averaged over tasks) with rliable's
    bootstrap bands (``create_performance_profile``'s numbers); a group with fewer than
    :data:`RANGE_BELOW` runs a task gets its profile and no band (``cis`` holds only the others)."""
    from rliable import library

    enough = {k: v for k, v in score_dict.items() if v.shape[0] >= RANGE_BELOW}
    cis = bootstrap.interval_estimates(enough, bootstrap.profile(taus), reps, seed) if enough else {}
    profiles = {}
    for key, scores in score_dict.items():
        if key in enough:
            profiles[key] = library.score_distributions(scores, taus)
        else:  # rliable's point: per tau, the mean over tasks of the fraction of runs above it
            profiles[key] = np.array([(scores > tau).mean(axis=0).mean() for tau in taus])
    return {key: profiles[key] for key in score_dict}, cis


def common_grid(histories: Sequence[tuple[np.ndarray, np.ndarray]], max_points: int = MAX_CURVE_POINTS) -> np.ndarray:
    """Env steps shared by all curves (at most ``max_points`` of them, evenly picked); if fewer
    than two are shared, ``max_points`` steps spanning the range every curve covers."""
    histories = [h for h in histories if len(h[0])]
    if not histories:
        return np.zeros(0)
    shared = set(histories[0][0].tolist())
    for steps, _ in histories[1:]:
        shared &= set(steps.tolist())
    grid = np.array(sorted(shared))
    if grid.size < 2:
        low = max(float(s[0]) for s, _ in histories)
        high = min(float(s[-1]) for s, _ in histories)
        grid = np.array([low]) if high <= low else np.linspace(low, high, max_points)
    if grid.size > max_points:
        grid = grid[np.unique(np.linspace(0, grid.size - 1, max_points).round().astype(int))]
    return grid


def resample(history: tuple[np.ndarray, np.ndarray], grid: np.ndarray) -> np.ndarray:
    steps, values = history
    return np.interp(grid, steps, values)


# ---------------------------------------------------------------------------------------- report data
@dataclasses.dataclass
class Report:
    """The runs, their final and normalised scores, and the reference axis values of the main
    comparison: what every statistic below is computed from."""

    experiment: str
    runs: list[Run]
    notes: list[str]
    bounds: dict[str, tuple[float, float]]
    final: dict[str, float]  # run_id -> final return
    normalized: dict[str, float]  # run_id -> normalised final score
    auc: dict[str, float]  # run_id -> normalised AUC
    reference: dict[str, float | None]  # axis -> its value in the main comparison (delta, rho_bar, ...)
    reps: int = 2000
    seed: int = 0
    min_runs: int = 3
    last_evals: int = 1
    # the score the verdicts are decided on, declared before the data (SCORES): "final" and
    # "last-n" are ``normalized`` (the mean of the last ``last_evals`` evaluations), "auc" is ``auc``
    score: str = "final"
    baseline: str | None = None  # what probability_of_improvement compares against (None: ppo_clip if present)
    normalization: str = "main"  # "main": min/max over the main algorithms' runs; "all": over every run
    margin: float = DEFAULT_MARGIN  # the smallest difference that matters (vaco.report.decision)
    # the 2x2 design's step-size partners, filter arm -> clip arm (``--step-pairs``): the report
    # checks that each pair moves as far per iteration at every K (ablations.step_size_matching)
    step_pairs: dict[str, str] = dataclasses.field(default_factory=dict)
    # runs left out because their scored metric holds a NaN or an infinity (run name -> why)
    excluded: dict[str, str] = dataclasses.field(default_factory=dict)
    # tasks whose min-max range cannot be told from seed noise (one line each; the summary leads with them)
    weak_scale: list[str] = dataclasses.field(default_factory=list)
    # how ``bounds`` were set: "runs" (min and max over the runs, the paper's), "fixed" (a study
    # plan's references) or "as is" (an accuracy, already in [0, 1]); every scoring of the
    # sensitivity table scales by fixed bounds where they are fixed
    scale: str = "runs"
    _arms: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def units(self) -> str:
        """What a score difference is measured in (the margin's units)."""
        return "accuracy" if self.scale == "as is" else "normalised"

    def study_scores(self) -> dict[str, float]:
        """run_id -> the declared score, normalised: what the robustness verdicts decide on."""
        return self.auc if self.score == "auc" else self.normalized

    @property
    def score_metric(self) -> str:
        """The metric the runs are scored by (``eval/return``; ``eval/accuracy`` for the LLM track)."""
        return self.runs[0].score_metric

    @property
    def tasks(self) -> list[str]:
        return sorted({r.env for r in self.runs})

    @property
    def algorithms(self) -> list[str]:
        names = {r.algorithm for r in self.runs}
        return [a for a in _PAPER_ORDER if a in names] + sorted(names - set(_PAPER_ORDER))

    @property
    def ks(self) -> list[int]:
        return sorted({r.K for r in self.runs})

    def is_reference(self, run: Run) -> bool:
        """In the main comparison: each axis at its reference value, or, for an arm of a declared
        step pair run at one value of an axis (``vaco_tv_matched``: delta 0.1 only), at that value:
        the 2x2 design's arms differ in their axis values on purpose."""
        own = self._arm_values(run.algorithm)
        return all(run.axes.get(axis) in (None, own.get(axis, value)) for axis, value in self.reference.items())

    def _arm_values(self, algorithm: str) -> dict[str, float]:
        if algorithm not in self._arms:
            values: dict[str, float] = {}
            if any(algorithm in pair for pair in self.step_pairs.items()):
                runs = [r for r in self.runs if r.algorithm == algorithm]
                for axis in self.reference:
                    seen = {r.axes.get(axis) for r in runs} - {None}
                    if len(seen) == 1:
                        values[axis] = seen.pop()
            self._arms[algorithm] = values
        return self._arms[algorithm]

    def main_runs(self) -> list[Run]:
        return [r for r in self.runs if self.is_reference(r)]

    def normalized_curve(self, run: Run, grid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        steps, values = run.score()
        values = normalize(values, self.bounds[run.env])
        if grid is None:
            return steps, values
        return grid, np.interp(grid, steps, values)

    def matrices(self, groups: Mapping[str, Sequence[Run]], value: Callable[[Run], object]):
        """(runs x tasks) matrices per group over the tasks all groups cover, plus notes on what
        was dropped. ``value`` maps a run to a number or an array (curves)."""
        tasks = sorted({r.env for rs in groups.values() for r in rs})
        out, notes = {}, []
        for key, runs in groups.items():
            by_task = defaultdict(list)
            for r in sorted(runs, key=lambda r: r.seed):
                by_task[r.env].append(value(r))
            missing = [t for t in tasks if not by_task.get(t)]
            if missing:
                notes.append(f"`{key}` left out: no finished run on {', '.join(missing)}")
                continue
            counts = {t: len(by_task[t]) for t in tasks}
            if len(set(counts.values())) > 1:
                notes.append(f"`{key}`: runs per task {counts}; cut to {min(counts.values())} per task")
            out[key] = score_matrix(by_task, tasks)
        return out, tasks, notes


def _most_common(values: list[float], paper: float | None) -> float | None:
    if not values:
        return None
    counts = Counter(values)
    top = max(counts.values())
    tied = sorted(v for v, n in counts.items() if n == top)
    return paper if paper in tied else tied[0]


def _reference_values(runs: list[Run], given: Mapping[str, float]) -> dict[str, float | None]:
    """Each axis's value in the main comparison: the given one, else the one the main algorithms'
    runs use most (the paper's delta 0.2 and rho_bar 1 win a tie): an ablation variant run at another
    value with more seeds (a study whose later looks ran only that arm) does not move it."""
    axes = list(dict.fromkeys([*PAPER_AXES, *(a for r in runs for a in r.axes)]))
    main = [r for r in runs if not is_variant(r.algorithm, r.variant_of)]

    def values(axis: str) -> list[float]:
        of = [r.axes[axis] for r in main if r.axes.get(axis) is not None]
        return of or [r.axes[axis] for r in runs if r.axes.get(axis) is not None]

    return {
        axis: given[axis] if given.get(axis) is not None else _most_common(values(axis), _PAPER_REFERENCE.get(axis))
        for axis in axes
    }


def _normalizing_scores(runs, final, chosen, normalization: str, notes: list[str]) -> dict[str, list[float]]:
    """Per task, the final scores its min and max are taken over (see :func:`build_report`)."""
    by_task, everything = defaultdict(list), defaultdict(list)
    for r in runs:
        everything[r.env].append(final[r.run_id])
        reference_run = all(r.axes.get(axis) in (None, value) for axis, value in chosen.items())
        if normalization == "all" or (reference_run and not is_variant(r.algorithm, r.variant_of)):
            by_task[r.env].append(final[r.run_id])
    for task in everything:
        if not by_task.get(task):
            notes.append(f"{task}: no main-algorithm run to normalise by; min and max over all its runs")
            by_task[task] = everything[task]
    return by_task


#: a task's min-max range under this many pooled within-cell SDs is flagged: normalised gaps there
#: are mostly seed noise (two runs of one cell differ by ~1.4 SDs on average)
NOISE_RANGE = 4.0


def weak_scales(runs, final, bounds: Mapping[str, tuple[float, float]]) -> list[str]:
    """One line for each task whose runs' own min-max range cannot be told from seed noise: every
    cell has one seed (the spread is unknown), or the range is under :data:`NOISE_RANGE` pooled
    within-cell SDs (cells: algorithm, K and sweep axes)."""
    out = []
    for task, (low, high) in bounds.items():
        cells = defaultdict(list)
        for r in runs:
            if r.env == task:
                cells[(r.algorithm, r.K, tuple(sorted(r.axes.items())))].append(final[r.run_id])
        groups = [np.asarray(v) for v in cells.values() if len(v) > 1]
        span = f"{low:.1f} to {high:.1f}"
        if not groups:
            out.append(
                f"{task}: one seed a cell, so the min-max range ({span}) cannot be told from seed noise: a normalised "
                "0 or 1 says which run scored lowest or highest, not which algorithm is better (run 3+ seeds a cell)"
            )
            continue
        dof = sum(len(g) - 1 for g in groups)
        sd = math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / dof)
        if high - low < NOISE_RANGE * sd:
            out.append(
                f"{task}: the min-max range ({span}, {high - low:.1f} wide) is under {NOISE_RANGE:g} times the seeds' "
                f"own spread (pooled SD {sd:.1f}): normalised gaps there are mostly seed noise"
            )
    return out


def build_report(
    experiment: str,
    runs: list[Run],
    notes: list[str] | None = None,
    *,
    last_evals: int = 1,
    score: str | None = None,
    reference: Mapping[str, float] | None = None,
    reps: int = 2000,
    seed: int = 0,
    min_runs: int = 3,
    baseline: str | None = None,
    normalization: str = "main",
    margin: float = DEFAULT_MARGIN,
    step_pairs: Mapping[str, str] | None = None,
    fixed_bounds: Mapping[str, tuple[float, float]] | None = None,
) -> Report:
    """Final and normalised scores, AUCs and the reference value of each axis (given, else the
    most used; the paper's delta 0.2 and rho_bar 1 win a tie) of a set of runs.

    ``normalization``: ``"main"`` (the paper's) takes each task's min and max over the runs of the
    main comparison (every axis at its reference value) of the main algorithms, leaving out
    ablation and control variants (:func:`is_variant`); ``"all"`` over every run in the report.
    ``fixed_bounds`` (a study plan's references: task -> (min, max), numbers that do not move as
    runs are added) replace that rule for the tasks they name; the report notes each.
    """
    if not (isinstance(margin, (int, float)) and 0 < margin and math.isfinite(margin)):
        raise ValueError(f"`--margin` must be a positive number (in the scores' units), got {margin!r}")
    score = score or ("last-n" if last_evals > 1 else "final")
    if score not in SCORES:
        raise ValueError(f"`--score` must be one of {', '.join(SCORES)}, got {score!r}")
    if score == "final" and last_evals != 1:
        raise ValueError(
            f"`--last-evals` is the n of `--score last-n`; `--score final` is the last evaluation, got {last_evals}"
        )
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"`--normalize-over` must be one of {', '.join(NORMALIZATIONS)}, got {normalization!r}")
    notes = list(notes or [])
    scored_by = sorted({r.score_metric for r in runs})
    if len(scored_by) > 1:
        raise ValueError(f"experiment '{experiment}' mixes runs scored by {' and '.join(scored_by)}; report them apart")
    usable, excluded = [], {}
    for r in runs:
        steps, values = r.score()
        if len(steps) == 0:
            notes.append(f"run {r.name} has no {r.score_metric} and is left out")
        elif not np.all(np.isfinite(values)):
            # a NaN or inf cannot be ranked, trimmed or averaged: it would make every statistic NaN
            bad = int(np.flatnonzero(~np.isfinite(values))[0])
            excluded[r.name] = f"{r.score_metric} is {values[bad]} at step {int(steps[bad])}"
        else:
            usable.append(r)
    if excluded:
        notes.append(
            f"{len(excluded)} run{'s' if len(excluded) > 1 else ''} left out for a non-finite score (the rule: a run "
            "whose scored metric holds a NaN or an infinity is not scored, and its seed drops out of every paired "
            "comparison it was in): " + "; ".join(f"{name}: {why}" for name, why in sorted(excluded.items()))
        )
    if not usable:
        metric = scored_by[0] if scored_by else "eval/return"
        nonfinite = f" ({len(excluded)} left out for a non-finite {metric})" if excluded else ""
        raise ValueError(f"experiment '{experiment}' has no finished run with {metric} to report on{nonfinite}")
    final = {r.run_id: final_score(r.score()[1], last_evals) for r in usable}
    ends = defaultdict(set)
    for r in usable:
        ends[r.env].add(int(r.score()[0][-1]))
    for task, steps in ends.items():
        if len(steps) > 1:
            notes.append(f"{task}: runs end at different env steps {sorted(steps)}; their scores are not comparable")
    chosen = _reference_values(usable, dict(reference or {}))
    bounds = normalization_bounds(_normalizing_scores(usable, final, chosen, normalization, notes))
    scale = "fixed" if fixed_bounds else "runs"
    if scored_by == [ACCURACY] and not fixed_bounds:  # already a score in [0, 1]: no min-max stretch
        fixed_bounds = {task: (0.0, 1.0) for task in bounds}
        scale = "as is"
        notes.append(f"{ACCURACY} is scored as it is (an accuracy in [0, 1]): no min-max normalisation")
    for task, (low, high) in (fixed_bounds or {}).items():
        if task in bounds and scale == "as is":
            bounds[task] = (0.0, 1.0)
        elif task in bounds:
            notes.append(
                f"{task}: normalised by the plan's fixed references [{low:g}, {high:g}] (the runs' own rule gives "
                f"[{bounds[task][0]:.1f}, {bounds[task][1]:.1f}])"
            )
            bounds[task] = (float(low), float(high))
        else:
            notes.append(f"the plan's fixed references name {task}, which none of these runs is on")
    for task, (low, high) in bounds.items():
        if low == high:
            notes.append(f"{task}: every run scored {low:.1f}; its normalised scores are set to 1")
    weak = weak_scales(usable, final, {t: b for t, b in bounds.items() if scale == "runs"})
    notes += weak
    report = Report(
        experiment=experiment,
        runs=usable,
        notes=notes,
        bounds=bounds,
        final=final,
        normalized={},
        auc={},
        reference=chosen,
        reps=reps,
        seed=seed,
        min_runs=min_runs,
        last_evals=last_evals,
        score=score,
        baseline=baseline,
        normalization=normalization,
        margin=margin,
        step_pairs=dict(step_pairs or {}),
        excluded=excluded,
        scale=scale,
        weak_scale=weak,
    )
    for r in usable:
        report.normalized[r.run_id] = float(normalize(final[r.run_id], bounds[r.env]))
        report.auc[r.run_id] = area_under_curve(*report.normalized_curve(r))
    return report


def runs_frame(report: Report):
    """One row per run: coordinates, final and normalised score, AUC, mean TVs (a pandas DataFrame)."""
    import pandas as pd

    def mean(r: Run, key: str) -> float:
        values = r.history(key)[1]
        return float(values.mean()) if len(values) else math.nan

    return pd.DataFrame(
        [
            {
                "run": r.name,
                "algorithm": r.algorithm,
                "env": r.env,
                "K": r.K,
                "seed": r.seed,
                **{axis: r.axes.get(axis) for axis in report.reference},
                "realign": r.realign,
                "reference": report.is_reference(r),
                "final_return": report.final[r.run_id],
                "normalized": report.normalized[r.run_id],
                "auc": report.auc[r.run_id],
                "forward_tv": mean(r, "lag/forward_tv"),
                "train_tv": mean(r, "train/tv"),
                "run_id": r.run_id,
            }
            for r in report.runs
        ]
    )
