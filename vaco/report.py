"""``vaco report``: MLflow runs -> normalised scores -> rliable aggregates, PNG figures, a Markdown summary.

    vaco report --experiment vaco-laptop [--out reports/vaco-laptop] [--reps 2000]

The protocol follows the paper's Experiments section and Agarwal et al. (2021), computed with
rliable itself (``library.get_interval_estimates``, ``metrics.aggregate_*``,
``library.create_performance_profile``, ``plot_utils``):

* final score of a run: the mean of its last ``last_evals`` ``eval/return`` values (default 1:
  the return of the final policy, itself the mean over E evaluation episodes);
* normalised score: ``(return - min) / (max - min)``, with min and max over the final scores of
  every run of that task in the report (all algorithms, K and ablation values); curves use the
  same two numbers, so a curve can leave [0, 1];
* Median, IQM, Mean and Optimality Gap with 95% stratified-bootstrap intervals over runs x tasks,
  per algorithm and degree of asynchrony K; IQM of the normalised return over training and of
  its area under the curve (AUC: the curve's mean over its evaluation steps, trapezoid rule);
  performance profiles;
* TV of the policy after each iteration's epochs from the behaviour mixture (``lag/forward_tv``,
  the paper's "TV of the final policy") and the minibatch TV the filter tests (``train/tv``),
  each averaged over all iterations of a run, against ``delta / 2``;
* ``train/filter_fraction`` and ``train/clip_fraction`` per batch (one logged value per iteration);
* the delta ablation, the rho_bar ablation and realignment on/off.

The main comparison uses the runs at the reference delta and rho_bar (the value most runs use,
unless ``--reference-delta``/``--reference-rho-bar`` is given). A group enters an aggregate only
if it has runs on every task of that figure; its runs per task are cut to its smallest count. A
group with fewer than ``min_runs`` (default 3) runs per task gets a point estimate and no
interval, and the summary says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from vaco.tracking import PARENT_TAG, REPORT_TAG, search_all_runs, tracking_uri

__all__ = [
    "AGGREGATES",
    "SECTIONS",
    "FIGURES",
    "Run",
    "Estimate",
    "load_runs",
    "final_score",
    "normalization_bounds",
    "normalize",
    "score_matrix",
    "aggregate_estimates",
    "iqm_estimates",
    "curve_iqm",
    "area_under_curve",
    "performance_profiles",
    "Report",
    "build_report",
    "runs_frame",
    "ablations",
    "figure_aggregates",
    "figure_iqm_vs_k",
    "figure_returns",
    "figure_sample_efficiency",
    "figure_performance_profiles",
    "figure_tv",
    "figure_fractions",
    "figure_ablation",
    "write_report",
    "log_report",
    "main",
]

METRIC_KEYS = ("eval/return", "lag/forward_tv", "train/tv", "train/filter_fraction", "train/clip_fraction")
SECTIONS = (
    "Runs",
    "Normalisation",
    "Final scores",
    "IQM against the degree of asynchrony",
    "Returns over training",
    "Sample efficiency",
    "Performance profiles",
    "TV divergence against delta/2",
    "Filter and clip fractions",
    "Ablation: delta",
    "Ablation: rho_bar",
    "Ablation: realignment",
    "How this was computed",
)
FIGURES = (
    "aggregate_metrics.png",
    "iqm_vs_k.png",
    "returns.png",
    "sample_efficiency.png",
    "performance_profiles.png",
    "tv.png",
    "filter_clip_fractions.png",
    "ablation_delta.png",
    "ablation_rho_bar.png",
    "ablation_realign.png",
)
_PAPER_ORDER = ("vaco", "ppo_clip", "ppo_kl", "spo", "impala", "vaco_no_realign")
_MAX_CURVE_POINTS = 20


def _metrics():
    from rliable import metrics

    return metrics


AGGREGATES = ("Median", "IQM", "Mean", "Optimality Gap")


def _aggregates() -> dict[str, Callable[[np.ndarray], float]]:
    metrics = _metrics()
    return {
        "Median": metrics.aggregate_median,
        "IQM": metrics.aggregate_iqm,
        "Mean": metrics.aggregate_mean,
        "Optimality Gap": metrics.aggregate_optimality_gap,
    }


# ---------------------------------------------------------------------------------------- runs
@dataclasses.dataclass
class Run:
    """One finished training run: its coordinates and the metric histories the report needs."""

    run_id: str
    name: str
    status: str
    algorithm: str
    env: str
    K: int
    seed: int
    delta: float | None
    rho_bar: float | None
    realign: bool
    objective: str
    histories: dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (env steps, values), sorted by step
    start_time: int = 0

    def history(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        return self.histories.get(key, (np.zeros(0), np.zeros(0)))


def _number(text: str | None) -> float | None:
    if text in (None, "", "None", "null"):
        return None
    return float(text)


def load_runs(
    experiment: str, uri: str | None = None, include_unfinished: bool = False
) -> tuple[list[Run], list[str]]:
    """The training runs of an MLflow experiment (not the report's own run) and notes on what was left out.

    A run needs the params ``algorithm``, ``env``, ``K``, ``seed`` (``vaco fit`` logs them). Runs
    that did not FINISH are left out unless ``include_unfinished``; of runs with the same
    coordinates only the newest is kept.
    """
    import mlflow

    client = mlflow.MlflowClient(uri or tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(
            f"`--experiment`: no MLflow experiment named '{experiment}' in {uri or tracking_uri()}"
        )
    found = search_all_runs(client, [exp.experiment_id])
    notes: list[str] = []
    statuses = Counter()
    kept: dict[tuple, object] = {}
    duplicates = 0
    for r in found:
        p = r.data.params
        if r.data.tags.get(REPORT_TAG) or not all(k in p for k in ("algorithm", "env", "K", "seed")):
            continue
        statuses[r.info.status] += 1
        if r.info.status != "FINISHED" and not include_unfinished:
            continue
        key = (p["algorithm"], p["env"], p["K"], p["seed"], p.get("delta"), p.get("rho_bar"))
        if key in kept:
            duplicates += 1
            if r.info.start_time <= kept[key].info.start_time:
                continue
        kept[key] = r
    left_out = {s: n for s, n in statuses.items() if s != "FINISHED"}
    if left_out and not include_unfinished:
        notes.append(
            "left out runs that did not finish: "
            + ", ".join(f"{n} {s}" for s, n in sorted(left_out.items()))
            + " (an interrupted sweep: rerun `vaco sweep` to finish them)"
        )
    if duplicates:
        notes.append(f"{duplicates} run(s) repeated the coordinates of another; the newest of each was kept")
    runs = []
    for r in kept.values():
        p = r.data.params
        histories = {}
        for key in METRIC_KEYS:
            hist = sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, key))
            if hist:
                steps, values = np.array(hist, dtype=np.float64).T
                histories[key] = (steps, values)
        runs.append(
            Run(
                run_id=r.info.run_id,
                name=r.info.run_name or r.info.run_id,
                status=r.info.status,
                algorithm=p["algorithm"],
                env=p["env"],
                K=int(p["K"]),
                seed=int(p["seed"]),
                delta=_number(p.get("delta")),
                rho_bar=_number(p.get("rho_bar")),
                realign=p.get("advantage_estimator") == "VTrace",
                objective=p.get("objective", ""),
                histories=histories,
                start_time=r.info.start_time or 0,
            )
        )
    return runs, notes


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


@dataclasses.dataclass
class Estimate:
    """Point estimates of some aggregates and, when there were enough runs, their 95% intervals."""

    point: np.ndarray  # [metrics] or [points]
    interval: np.ndarray | None  # [2, metrics] or [2, points]; None: too few runs per task
    runs_per_task: int
    tasks: int

    def bounds(self) -> np.ndarray:
        """The interval, or the point twice (what a plot draws when there is no interval)."""
        return self.interval if self.interval is not None else np.stack([self.point, self.point])


def _estimates(score_dict, func, reps: int, seed: int, min_runs: int) -> dict[str, Estimate]:
    from rliable import library

    out, enough = {}, {}
    for key, scores in score_dict.items():
        if scores.shape[0] >= min_runs:
            enough[key] = scores
        else:
            out[key] = Estimate(np.atleast_1d(func(scores)), None, scores.shape[0], scores.shape[1])
    if enough:
        np.random.seed(seed)  # rliable's StratifiedBootstrap draws from the global numpy RNG
        points, intervals = library.get_interval_estimates(enough, func, reps=reps)
        for key, scores in enough.items():
            out[key] = Estimate(
                np.atleast_1d(points[key]), np.asarray(intervals[key]), scores.shape[0], scores.shape[1]
            )
    return {key: out[key] for key in score_dict}


def aggregate_estimates(
    score_dict: Mapping[str, np.ndarray], reps: int = 2000, seed: int = 0, min_runs: int = 3
) -> dict[str, Estimate]:
    """Median, IQM, Mean and Optimality Gap (in that order) of (runs x tasks) score matrices, with
    95% stratified-bootstrap intervals from ``rliable.library.get_interval_estimates``."""
    fns = _aggregates()

    def func(x):
        return np.array([fns[name](x) for name in AGGREGATES])

    return _estimates(dict(score_dict), func, reps, seed, min_runs)


def iqm_estimates(score_dict: Mapping[str, np.ndarray], reps: int = 2000, seed: int = 0, min_runs: int = 3):
    """IQM alone (``rliable.metrics.aggregate_iqm``) with its stratified-bootstrap interval."""
    iqm = _metrics().aggregate_iqm

    def func(x):
        return np.array([iqm(x)])

    return _estimates(dict(score_dict), func, reps, seed, min_runs)


def curve_iqm(curves: Mapping[str, np.ndarray], reps: int = 2000, seed: int = 0, min_runs: int = 3):
    """IQM at each point of (runs x tasks x points) curves, rliable's sample-efficiency recipe."""
    iqm = _metrics().aggregate_iqm

    def func(x):
        return np.array([iqm(x[..., j]) for j in range(x.shape[-1])])

    return _estimates(dict(curves), func, reps, seed, min_runs)


def area_under_curve(steps: Sequence[float], values: Sequence[float]) -> float:
    """The curve's mean over its step range (trapezoid rule); a single point is its own mean."""
    steps, values = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if steps.size == 0:
        return math.nan
    if steps.size == 1 or steps[-1] == steps[0]:
        return float(values.mean())
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy < 2 has only trapz
    return float(trapezoid(values, steps) / (steps[-1] - steps[0]))


def performance_profiles(
    score_dict: Mapping[str, np.ndarray], taus: np.ndarray, reps: int = 2000, seed: int = 0
):
    """Score distributions (fraction of runs above tau) with bootstrap bands, from rliable."""
    from rliable import library

    np.random.seed(seed)
    return library.create_performance_profile(dict(score_dict), taus, reps=reps)


def common_grid(
    histories: Sequence[tuple[np.ndarray, np.ndarray]], max_points: int = _MAX_CURVE_POINTS
) -> np.ndarray:
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
    """Everything the figures and the summary are drawn from."""

    experiment: str
    runs: list[Run]
    notes: list[str]
    bounds: dict[str, tuple[float, float]]
    final: dict[str, float]  # run_id -> final return
    normalized: dict[str, float]  # run_id -> normalised final score
    auc: dict[str, float]  # run_id -> normalised AUC
    ref_delta: float | None
    ref_rho_bar: float | None
    reps: int = 2000
    seed: int = 0
    min_runs: int = 3
    last_evals: int = 1

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
        return (run.delta is None or run.delta == self.ref_delta) and (
            run.rho_bar is None or run.rho_bar == self.ref_rho_bar
        )

    def main_runs(self) -> list[Run]:
        return [r for r in self.runs if self.is_reference(r)]

    def normalized_curve(self, run: Run, grid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        steps, values = run.history("eval/return")
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


def _most_common(values: list[float], paper: float) -> float | None:
    if not values:
        return None
    counts = Counter(values)
    top = max(counts.values())
    tied = sorted(v for v, n in counts.items() if n == top)
    return paper if paper in tied else tied[0]


def build_report(
    experiment: str,
    runs: list[Run],
    notes: list[str] | None = None,
    *,
    last_evals: int = 1,
    reference_delta: float | None = None,
    reference_rho_bar: float | None = None,
    reps: int = 2000,
    seed: int = 0,
    min_runs: int = 3,
) -> Report:
    """Final and normalised scores, AUCs and the reference ablation values of a set of runs."""
    notes = list(notes or [])
    usable = []
    for r in runs:
        if len(r.history("eval/return")[0]) == 0:
            notes.append(f"run {r.name} has no eval/return and is left out")
        else:
            usable.append(r)
    if not usable:
        raise ValueError(f"experiment '{experiment}' has no finished run with eval/return to report on")
    final = {r.run_id: final_score(r.history("eval/return")[1], last_evals) for r in usable}
    by_task = defaultdict(list)
    for r in usable:
        by_task[r.env].append(final[r.run_id])
    bounds = normalization_bounds(by_task)
    for task, (low, high) in bounds.items():
        if low == high:
            notes.append(f"{task}: every run scored {low:.1f}; its normalised scores are set to 1")
    ends = defaultdict(set)
    for r in usable:
        ends[r.env].add(int(r.history("eval/return")[0][-1]))
    for task, steps in ends.items():
        if len(steps) > 1:
            notes.append(
                f"{task}: runs end at different env steps {sorted(steps)}; their scores are not comparable"
            )
    ref_delta = (
        reference_delta
        if reference_delta is not None
        else _most_common([r.delta for r in usable if r.delta is not None], 0.2)
    )
    ref_rho = (
        reference_rho_bar
        if reference_rho_bar is not None
        else _most_common([r.rho_bar for r in usable if r.rho_bar is not None], 1.0)
    )
    report = Report(
        experiment, usable, notes, bounds, final, {}, {}, ref_delta, ref_rho, reps, seed, min_runs, last_evals
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
                "delta": r.delta,
                "rho_bar": r.rho_bar,
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


# ---------------------------------------------------------------------------------------- figures
def _plt():
    import matplotlib.pyplot as plt

    return plt


def _colors(keys: Sequence[str]) -> dict[str, tuple]:
    import seaborn as sns

    palette = sns.color_palette("colorblind", n_colors=max(len(keys), 1))
    return dict(zip(keys, palette))


def _algo_colors(report: Report) -> dict[str, tuple]:
    return _colors(report.algorithms)


def _no_interval_note(estimates: Mapping[str, Estimate], min_runs: int) -> str:
    few = sorted({e.runs_per_task for e in estimates.values() if e.interval is None})
    if not few:
        return ""
    return f"point estimates only where runs per task < {min_runs} ({', '.join(map(str, few))})"


def _groups(runs: Sequence[Run], key: Callable[[Run], str]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(key(r), []).append(r)
    return out


def _main_groups(report: Report) -> dict[str, list[Run]]:
    order = {a: i for i, a in enumerate(report.algorithms)}
    runs = sorted(report.main_runs(), key=lambda r: (order[r.algorithm], r.K))
    return _groups(runs, lambda r: f"{r.algorithm} K={r.K}")


def figure_aggregates(report: Report):
    """Median, IQM, Mean, Optimality Gap per (algorithm, K) with rliable's interval plot."""
    from rliable import plot_utils

    matrices, _, notes = report.matrices(_main_groups(report), lambda r: report.normalized[r.run_id])
    estimates = aggregate_estimates(matrices, report.reps, report.seed, report.min_runs)
    algo_colors = _algo_colors(report)
    keys = list(estimates)
    colors = {k: algo_colors[k.rsplit(" K=", 1)[0]] for k in keys}
    fig, axes = plot_utils.plot_interval_estimates(
        {k: e.point for k, e in estimates.items()},
        {k: e.bounds() for k, e in estimates.items()},
        metric_names=list(AGGREGATES),
        algorithms=keys,
        colors=colors,
        row_height=max(0.37, 2.0 / max(len(keys), 1)),
        xlabel="Normalised score",
        wspace=0.25,
    )
    for idx, ax in enumerate(np.atleast_1d(axes)):
        for row, key in enumerate(keys):  # a point estimate alone is a marker, not a bar
            if estimates[key].interval is None:
                ax.plot(estimates[key].point[idx], row, marker="D", color=colors[key], markersize=7, zorder=3)
        low, high = ax.get_xlim()
        pad = 0.05 * ((high - low) or 1.0)
        ax.set_xlim(low - pad, high + pad)
    note = _no_interval_note(estimates, report.min_runs)
    title = "Final normalised score, 95% stratified-bootstrap CIs" + (f"\n({note})" if note else "")
    fig.suptitle(title, y=1 + (0.75 + 0.25 * bool(note)) / fig.get_figheight(), fontsize="x-large")
    return fig, estimates, notes


def _jitter(ks: np.ndarray, i: int, n: int) -> np.ndarray:
    """Spread series a little along a log2 K axis so equal values do not hide each other."""
    return ks * 2.0 ** (0.08 * (i - (n - 1) / 2))


def _k_axis(ax, ks: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ks), [str(k) for k in ks])
    ax.minorticks_off()
    ax.set_xlim(min(ks) / 1.6, max(ks) * 1.6)


def _vs_k_axis(
    ax,
    estimates: Mapping[str, Estimate],
    series: Mapping[str, list[tuple[int, str]]],
    colors,
    ylabel: str,
    title: str,
):
    """Lines of an estimate against K; error bars where an interval exists."""
    for i, (name, points) in enumerate(series.items()):
        pts = [(k, estimates[key]) for k, key in points if key in estimates]
        if not pts:
            continue
        ks = _jitter(np.array([k for k, _ in pts], dtype=float), i, len(series))
        y = np.array([e.point[0] for _, e in pts])
        ax.plot(ks, y, marker="o", color=colors[name], label=name)
        for k, (_, e) in zip(ks, pts):
            if e.interval is not None:
                ax.vlines(k, e.interval[0, 0], e.interval[1, 0], color=colors[name], alpha=0.6, linewidth=3)
    all_k = sorted({k for pts in series.values() for k, _ in pts})
    _k_axis(ax, all_k)
    ax.set_xlabel("degree of asynchrony K")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.25)


def figure_iqm_vs_k(report: Report):
    plt = _plt()
    groups = _main_groups(report)
    matrices, _, notes = report.matrices(groups, lambda r: report.normalized[r.run_id])
    estimates = iqm_estimates(matrices, report.reps, report.seed, report.min_runs)
    series = defaultdict(list)
    for key, runs in groups.items():
        series[runs[0].algorithm].append((runs[0].K, key))
    fig, ax = plt.subplots(figsize=(6, 4))
    note = _no_interval_note(estimates, report.min_runs)
    _vs_k_axis(
        ax,
        estimates,
        series,
        _algo_colors(report),
        "IQM normalised final score",
        "Final score against K" + (f"\n({note})" if note else ""),
    )
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig, estimates, notes


def figure_returns(report: Report):
    """Raw eval/return over training per task and K: mean and standard deviation over seeds."""
    plt = _plt()
    tasks, ks = report.tasks, report.ks
    colors = _algo_colors(report)
    fig, axes = plt.subplots(len(tasks), len(ks), figsize=(3.2 * len(ks), 2.6 * len(tasks)), squeeze=False)
    main = report.main_runs()
    for i, task in enumerate(tasks):
        for j, K in enumerate(ks):
            ax = axes[i, j]
            for algo in report.algorithms:
                runs = [r for r in main if r.env == task and r.K == K and r.algorithm == algo]
                if not runs:
                    continue
                grid = common_grid([r.history("eval/return") for r in runs])
                ys = np.stack([resample(r.history("eval/return"), grid) for r in runs])
                mean, std = ys.mean(0), ys.std(0)
                ax.plot(grid, mean, color=colors[algo], label=f"{algo} (n={len(runs)})")
                ax.fill_between(grid, mean - std, mean + std, color=colors[algo], alpha=0.15)
            ax.set_title(f"{task}, K={K}", fontsize="medium")
            ax.grid(alpha=0.25)
            if i == len(tasks) - 1:
                ax.set_xlabel("env steps")
            if j == 0:
                ax.set_ylabel("eval/return")
    handles, labels = _legend_entries(axes)
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=min(len(labels), 6),
        bbox_to_anchor=(0.5, 1.0 + 0.12 / len(tasks)),
        fontsize="small",
    )
    fig.tight_layout()
    return fig


def _legend_entries(axes):
    seen = {}
    for ax in np.ravel(axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label.split(" (n=")[0], h)
    return list(seen.values()), list(seen)


def _curve_groups(report: Report, runs: Sequence[Run], key: Callable[[Run], str]):
    groups = _groups(runs, key)
    grid = common_grid([r.history("eval/return") for r in runs])
    matrices, tasks, notes = report.matrices(groups, lambda r: report.normalized_curve(r, grid)[1])
    return grid, matrices, notes


def figure_sample_efficiency(report: Report):
    """IQM of the normalised return over training per K (rliable), and the IQM of the AUC."""
    from rliable import plot_utils

    plt = _plt()
    ks, colors = report.ks, _algo_colors(report)
    main = report.main_runs()
    fig, axes = plt.subplots(1, len(ks) + 1, figsize=(4.2 * (len(ks) + 1), 3.6), squeeze=False)
    notes, curve_estimates = [], {}
    for j, K in enumerate(ks):
        runs = [r for r in main if r.K == K]
        grid, matrices, n = _curve_groups(report, runs, lambda r: r.algorithm)
        notes += [f"K={K}: {x}" for x in n]
        est = curve_iqm(matrices, report.reps, report.seed, report.min_runs)
        curve_estimates[K] = (grid, est)
        if est:
            plot_utils.plot_sample_efficiency_curve(
                grid,
                {a: e.point for a, e in est.items()},
                {a: e.bounds() for a, e in est.items()},
                algorithms=list(est),
                colors=colors,
                ax=axes[0, j],
                xlabel="env steps",
                ylabel="IQM normalised return" if j == 0 else "",
                labelsize="medium",
                ticklabelsize="small",
                marker="",
            )
        axes[0, j].set_title(f"K={K}")
    groups = _main_groups(report)
    matrices, _, n = report.matrices(groups, lambda r: report.auc[r.run_id])
    auc = iqm_estimates(matrices, report.reps, report.seed, report.min_runs)
    series = defaultdict(list)
    for key, runs in groups.items():
        series[runs[0].algorithm].append((runs[0].K, key))
    _vs_k_axis(axes[0, -1], auc, series, colors, "IQM of normalised AUC", "Area under the curve")
    handles, labels = axes[0, -1].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=min(len(labels), 6),
        bbox_to_anchor=(0.5, 1.08),
        fontsize="small",
    )
    note = _no_interval_note(
        {**auc, **{f"{k}{a}": e for k, (_, est) in curve_estimates.items() for a, e in est.items()}},
        report.min_runs,
    )
    if note:
        fig.suptitle(f"({note})", y=-0.02, fontsize="small")
    fig.tight_layout()
    return fig, curve_estimates, auc, notes + n


def figure_performance_profiles(report: Report):
    from rliable import plot_utils

    plt = _plt()
    ks, colors = report.ks, _algo_colors(report)
    taus = np.linspace(0.0, 1.0, 51)
    main = report.main_runs()
    fig, axes = plt.subplots(1, len(ks), figsize=(4.2 * len(ks), 3.6), squeeze=False)
    notes = []
    for j, K in enumerate(ks):
        groups = _groups([r for r in main if r.K == K], lambda r: r.algorithm)
        matrices, _, n = report.matrices(groups, lambda r: report.normalized[r.run_id])
        notes += [f"K={K}: {x}" for x in n]
        if not matrices:
            continue
        profiles, cis = performance_profiles(matrices, taus, report.reps, report.seed)
        enough = {a: cis[a] for a, m in matrices.items() if m.shape[0] >= report.min_runs}
        plot_utils.plot_performance_profiles(
            profiles,
            taus,
            performance_profile_cis=enough or None,
            colors=colors,
            ax=axes[0, j],
            xlabel=r"normalised score $\tau$",
            ylabel="fraction of runs > $\\tau$" if j == 0 else "",
            labelsize="medium",
            ticklabelsize="small",
        )
        axes[0, j].set_title(f"K={K}")
        axes[0, j].legend(fontsize="small")
    fig.tight_layout()
    return fig, notes


def _tv_table(report: Report):
    """Per (algorithm, K): mean and std over runs of each run's mean lag/forward_tv and train/tv."""
    rows = {}
    for (algo, K), runs in sorted(
        _groups(report.main_runs(), lambda r: (r.algorithm, r.K)).items(),
        key=lambda x: (report.algorithms.index(x[0][0]), x[0][1]),
    ):
        fwd = [r.history("lag/forward_tv")[1].mean() for r in runs if len(r.history("lag/forward_tv")[1])]
        trn = [r.history("train/tv")[1].mean() for r in runs if len(r.history("train/tv")[1])]
        delta = runs[0].delta
        rows[(algo, K)] = (fwd, trn, delta)
    return rows


def figure_tv(report: Report):
    """Per task: each run's mean TV over its iterations against K, mean +- std over seeds; delta/2 dashed."""
    plt = _plt()
    tasks, colors = report.tasks, _algo_colors(report)
    main = report.main_runs()
    fig, axes = plt.subplots(2, len(tasks), figsize=(4.2 * len(tasks), 6.4), squeeze=False)
    for row, (key, label) in enumerate(
        (
            ("lag/forward_tv", "TV(pi after epochs, beta)\nlag/forward_tv"),
            ("train/tv", "minibatch TV in the epochs\ntrain/tv"),
        )
    ):
        for j, task in enumerate(tasks):
            ax = axes[row, j]
            for i, algo in enumerate(report.algorithms):
                pts = []
                for K in report.ks:
                    vals = [
                        r.history(key)[1].mean()
                        for r in main
                        if r.env == task and r.K == K and r.algorithm == algo and len(r.history(key)[1])
                    ]
                    if vals:
                        pts.append((K, np.mean(vals), np.std(vals)))
                if pts:
                    k, m, s = map(np.array, zip(*pts))
                    k = _jitter(k.astype(float), i, len(report.algorithms))
                    ax.plot(k, m, marker="o", color=colors[algo], label=algo)
                    ax.fill_between(k, m - s, m + s, color=colors[algo], alpha=0.15)
            if report.ref_delta is not None:
                ax.axhline(
                    report.ref_delta / 2,
                    color="k",
                    linestyle="--",
                    linewidth=1,
                    label=f"delta/2 = {report.ref_delta / 2:g}",
                )
            _k_axis(ax, report.ks)
            ax.set_title(task if row == 0 else "", fontsize="medium")
            ax.set_xlabel("degree of asynchrony K")
            if j == 0:
                ax.set_ylabel(label)
            ax.grid(alpha=0.25)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=min(len(labels), 7),
        bbox_to_anchor=(0.5, 1.05),
        fontsize="small",
    )
    fig.tight_layout()
    return fig


def figure_fractions(report: Report):
    """train/filter_fraction (TV-filter objectives) and train/clip_fraction (the others) per
    iteration, averaged over the runs of each (algorithm, K)."""
    plt = _plt()
    ks, colors = report.ks, _algo_colors(report)
    main = report.main_runs()
    fig, axes = plt.subplots(2, len(ks), figsize=(4.0 * len(ks), 5.6), squeeze=False, sharey="row")
    for j, K in enumerate(ks):
        for algo in report.algorithms:
            runs = [r for r in main if r.K == K and r.algorithm == algo]
            if not runs:
                continue
            row, key = (
                (0, "train/filter_fraction")
                if runs[0].objective == "TVFilter"
                else (1, "train/clip_fraction")
            )
            hist = [r.history(key) for r in runs if len(r.history(key)[0])]
            if not hist:
                continue
            grid = common_grid(hist, max_points=200)
            ys = np.stack([resample(h, grid) for h in hist])
            axes[row, j].plot(grid, ys.mean(0), color=colors[algo], label=algo)
        axes[0, j].set_title(f"K={K}")
        axes[1, j].set_xlabel("env steps")
    axes[0, 0].set_ylabel("filter fraction\n(TV-filter objectives)")
    axes[1, 0].set_ylabel("clip fraction\n(other objectives)")
    for ax in axes.ravel():
        ax.grid(alpha=0.25)
    handles, labels = _legend_entries(axes)
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=min(len(labels), 6),
        bbox_to_anchor=(0.5, 1.05),
        fontsize="small",
    )
    fig.tight_layout()
    return fig


def _fraction_table(report: Report):
    rows = {}
    for (algo, K), runs in _groups(report.main_runs(), lambda r: (r.algorithm, r.K)).items():
        f = [
            r.history("train/filter_fraction")[1].mean()
            for r in runs
            if len(r.history("train/filter_fraction")[1])
        ]
        c = [
            r.history("train/clip_fraction")[1].mean()
            for r in runs
            if len(r.history("train/clip_fraction")[1])
        ]
        rows[(algo, K)] = (np.mean(f) if f else math.nan, np.mean(c) if c else math.nan, runs[0].objective)
    return rows


@dataclasses.dataclass
class Ablation:
    name: str
    title: str
    runs: list[Run]
    variant: Callable[[Run], str]
    reason: str  # why it is not available, when runs is empty


def ablations(report: Report) -> dict[str, Ablation]:
    """The runs of each ablation: delta (TV-filter algorithms with >= 2 deltas, at the reference
    rho_bar), rho_bar (V-trace algorithms with >= 2 values, at the reference delta), realignment
    (objectives run both with V-trace and with GAE, at the reference delta and rho_bar)."""
    def varied(axis: str, other: str, kind: str) -> Ablation:
        """Runs of each algorithm run with >= 2 values of ``axis``, where ``other`` (if it applies)
        is at its reference value."""
        reference = getattr(report, f"ref_{other}")
        candidates = [
            r for r in report.runs
            if getattr(r, axis) is not None and getattr(r, other) in (None, reference)
        ]
        by_algo = _groups(candidates, lambda r: r.algorithm)
        runs = [r for rs in by_algo.values() if len({getattr(r, axis) for r in rs}) > 1 for r in rs]
        return Ablation(
            axis,
            f"{axis} ablation",
            runs,
            lambda r: f"{r.algorithm} {axis}={getattr(r, axis):g}",
            f"needs runs of a {kind} algorithm with at least two values of {axis}",
        )

    out = {"delta": varied("delta", "rho_bar", "TV-filter"), "rho_bar": varied("rho_bar", "delta", "V-trace")}
    by_obj = _groups(report.main_runs(), lambda r: r.objective)
    runs = [r for rs in by_obj.values() if len({r.realign for r in rs}) > 1 for r in rs]
    out["realign"] = Ablation(
        "realign",
        "realignment on/off",
        runs,
        lambda r: f"{r.algorithm} ({'V-trace' if r.realign else 'GAE'})",
        "needs runs of one objective both with V-trace realignment and with GAE",
    )
    return out


def figure_ablation(report: Report, ablation: Ablation):
    """IQM of the final normalised score and of the AUC against K, one line per ablation value."""
    plt = _plt()
    groups = _groups(
        sorted(ablation.runs, key=lambda r: (ablation.variant(r), r.K)),
        lambda r: f"{ablation.variant(r)} K={r.K}",
    )
    final, _, notes = report.matrices(groups, lambda r: report.normalized[r.run_id])
    auc, _, _ = report.matrices(groups, lambda r: report.auc[r.run_id])
    final_est = iqm_estimates(final, report.reps, report.seed, report.min_runs)
    auc_est = iqm_estimates(auc, report.reps, report.seed, report.min_runs)
    series = defaultdict(list)
    for key, runs in groups.items():
        series[ablation.variant(runs[0])].append((runs[0].K, key))
    colors = _colors(list(series))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    _vs_k_axis(
        axes[0], final_est, series, colors, "IQM normalised final score", f"{ablation.title}: final score"
    )
    _vs_k_axis(
        axes[1], auc_est, series, colors, "IQM of normalised AUC", f"{ablation.title}: sample efficiency"
    )
    axes[1].legend(fontsize="small")
    note = _no_interval_note(final_est, report.min_runs)
    if note:
        fig.suptitle(f"({note})", y=-0.02, fontsize="small")
    fig.tight_layout()
    return fig, final_est, auc_est, notes


# ---------------------------------------------------------------------------------------- summary
def _ci(e: Estimate | None, i: int = 0) -> str:
    if e is None:
        return "-"
    if e.interval is None:
        return f"{e.point[i]:.3f} (no CI)"
    return f"{e.point[i]:.3f} [{e.interval[0, i]:.3f}, {e.interval[1, i]:.3f}]"


def _table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _interval_sentence(estimates: Mapping[str, Estimate], min_runs: int) -> str:
    few = {k: e.runs_per_task for k, e in estimates.items() if e.interval is None}
    if not few:
        return "Every group has enough runs for a 95% interval."
    return (
        f"Too few runs for an interval in {len(few)} of {len(estimates)} groups "
        f"({', '.join(f'{k}: {n} run(s) per task' for k, n in list(few.items())[:8])}"
        f"{', ...' if len(few) > 8 else ''}); those show point estimates only, and an interval needs "
        f"at least {min_runs} runs per task."
    )


def write_report(report: Report, out: str | os.PathLike, dpi: int = 110) -> Path:
    """Draw every figure into ``out`` and write ``out/summary.md``; returns the summary's path."""
    plt = _plt()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    def save(fig, name: str) -> str:
        from matplotlib.ticker import EngFormatter

        for ax in fig.axes:  # 50k, 100k, ... instead of colliding 50000100000 tick labels
            if ax.get_xlabel() == "env steps":
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        fig.savefig(out / name, dpi=dpi, bbox_inches="tight")
        plt.close(fig)
        return name

    s: list[str] = [f"# Report: {report.experiment}", ""]
    # -- runs
    s += ["## Runs", ""]
    main = report.main_runs()
    s.append(
        f"{len(report.runs)} finished runs on {len(report.tasks)} task(s) ({', '.join(report.tasks)}); "
        f"algorithms {', '.join(report.algorithms)}; K in {report.ks}. Main comparison: {len(main)} runs at "
        f"delta = {report.ref_delta} and rho_bar = {report.ref_rho_bar} (where they apply)."
    )
    counts = Counter((r.algorithm, r.K, r.env) for r in main)
    s += [
        "",
        _table(
            ["algorithm", "K", "runs per task"],
            [
                (a, K, ", ".join(f"{t}: {counts[(a, K, t)]}" for t in report.tasks))
                for a in report.algorithms
                for K in report.ks
                if any(counts[(a, K, t)] for t in report.tasks)
            ],
        ),
    ]
    if report.notes:
        s += ["", "Notes:", ""] + [f"- {n}" for n in report.notes]
    # -- normalisation
    s += [
        "",
        "## Normalisation",
        "",
        "Final score = mean of the last "
        f"{report.last_evals} eval/return value(s) of a run; normalised = (return - min) / (max - min) per task, "
        "min and max over every run of the task in this report.",
        "",
    ]
    s.append(
        _table(
            ["task", "min", "max"],
            [(t, f"{lo:.1f}", f"{hi:.1f}") for t, (lo, hi) in sorted(report.bounds.items())],
        )
    )
    # -- aggregates
    fig, agg, notes = figure_aggregates(report)
    s += [
        "",
        "## Final scores",
        "",
        f"![aggregate metrics]({save(fig, 'aggregate_metrics.png')})",
        "",
        "Median, IQM and Mean: higher is better; Optimality Gap: lower is better. "
        + _interval_sentence(agg, report.min_runs),
        "",
    ]
    s.append(
        _table(
            ["group", "runs/task", "tasks", *AGGREGATES],
            [
                (k, e.runs_per_task, e.tasks, *(_ci(e, i) for i in range(len(AGGREGATES))))
                for k, e in agg.items()
            ],
        )
    )
    s += [f"- {n}" for n in notes]
    final_returns = defaultdict(list)
    for r in main:
        final_returns[(r.env, r.algorithm, r.K)].append(report.final[r.run_id])
    s += ["", "Final eval/return (raw), mean +- std over seeds:", ""]
    s.append(
        _table(
            ["task", "algorithm", "K", "return", "runs"],
            [
                (t, a, K, f"{np.mean(v):.1f} +- {np.std(v):.1f}", len(v))
                for (t, a, K), v in sorted(
                    final_returns.items(), key=lambda x: (x[0][0], report.algorithms.index(x[0][1]), x[0][2])
                )
            ],
        )
    )
    # -- IQM vs K
    fig, iqm, _ = figure_iqm_vs_k(report)
    s += [
        "",
        "## IQM against the degree of asynchrony",
        "",
        f"![IQM vs K]({save(fig, 'iqm_vs_k.png')})",
        "",
        "Does an algorithm keep its final score as K grows? " + _interval_sentence(iqm, report.min_runs),
        "",
    ]
    s.append(
        _table(
            ["algorithm", *[f"K={k}" for k in report.ks]],
            [
                (a, *(_ci(iqm.get(f"{a} K={k}")) for k in report.ks))
                for a in report.algorithms
                if any(f"{a} K={k}" in iqm for k in report.ks)
            ],
        )
    )
    # -- returns
    s += [
        "",
        "## Returns over training",
        "",
        f"![returns]({save(figure_returns(report), 'returns.png')})",
        "",
        "Raw eval/return per task and K; lines are means over seeds, bands one standard deviation.",
    ]
    # -- sample efficiency
    fig, _, auc, notes = figure_sample_efficiency(report)
    s += [
        "",
        "## Sample efficiency",
        "",
        f"![sample efficiency]({save(fig, 'sample_efficiency.png')})",
        "",
        "IQM of the normalised eval/return at common env steps (bands: 95% CIs), and the IQM of each run's "
        "normalised area under the curve (its mean normalised return over training). "
        + _interval_sentence(auc, report.min_runs),
        "",
    ]
    s.append(
        _table(
            ["algorithm", *[f"AUC K={k}" for k in report.ks]],
            [
                (a, *(_ci(auc.get(f"{a} K={k}")) for k in report.ks))
                for a in report.algorithms
                if any(f"{a} K={k}" in auc for k in report.ks)
            ],
        )
    )
    s += [f"- {n}" for n in notes]
    # -- performance profiles
    fig, notes = figure_performance_profiles(report)
    s += [
        "",
        "## Performance profiles",
        "",
        f"![performance profiles]({save(fig, 'performance_profiles.png')})",
        "",
        "Fraction of runs (over all tasks) whose normalised final score exceeds tau; bands are 95% "
        f"bootstrap CIs, drawn only for groups with at least {report.min_runs} runs per task.",
    ]
    s += [f"- {n}" for n in notes]
    # -- TV
    s += [
        "",
        "## TV divergence against delta/2",
        "",
        f"![TV]({save(figure_tv(report), 'tv.png')})",
        "",
        "Top: `lag/forward_tv`, the TV between the behaviour mixture and the policy after the iteration's "
        "epochs, on the whole batch (the paper's 'TV of the final policy'). Bottom: `train/tv`, the minibatch "
        "TV the filter tests, averaged over the epochs. Each run contributes its mean over all iterations; "
        "lines are means over runs, bands one standard deviation; the dashed line is delta/2.",
        "",
    ]
    s.append(
        _table(
            ["algorithm", "K", "lag/forward_tv", "train/tv", "delta/2"],
            [
                (
                    a,
                    K,
                    f"{np.mean(f):.4f} +- {np.std(f):.4f}" if f else "-",
                    f"{np.mean(t):.4f} +- {np.std(t):.4f}" if t else "-",
                    f"{d / 2:g}" if d is not None else "-",
                )
                for (a, K), (f, t, d) in _tv_table(report).items()
            ],
        )
    )
    # -- fractions
    s += [
        "",
        "## Filter and clip fractions",
        "",
        f"![fractions]({save(figure_fractions(report), 'filter_clip_fractions.png')})",
        "",
        "Per batch (one value per iteration, the mean over its minibatches): `train/filter_fraction` for "
        "TV-filter objectives, `train/clip_fraction` for the others; averaged over runs.",
        "",
    ]
    s.append(
        _table(
            ["algorithm", "K", "objective", "filter fraction", "clip fraction"],
            [
                (a, K, o, f"{f:.4f}", f"{c:.4f}")
                for (a, K), (f, c, o) in sorted(
                    _fraction_table(report).items(), key=lambda x: (report.algorithms.index(x[0][0]), x[0][1])
                )
            ],
        )
    )
    # -- ablations
    for name, ablation in ablations(report).items():
        heading = {
            "delta": "Ablation: delta",
            "rho_bar": "Ablation: rho_bar",
            "realign": "Ablation: realignment",
        }[name]
        s += ["", f"## {heading}", ""]
        if not ablation.runs:
            s.append(f"Not in this experiment: it {ablation.reason}.")
            continue
        fig, final_est, auc_est, notes = figure_ablation(report, ablation)
        s += [
            f"![{ablation.title}]({save(fig, f'ablation_{name}.png')})",
            "",
            _interval_sentence(final_est, report.min_runs),
            "",
        ]
        s.append(
            _table(
                ["variant and K", "IQM final", "IQM AUC"],
                [(k, _ci(e), _ci(auc_est.get(k))) for k, e in final_est.items()],
            )
        )
        s += [f"- {n}" for n in notes]
    # -- method
    s += [
        "",
        "## How this was computed",
        "",
        f"rliable {_rliable_version()}: `library.get_interval_estimates` (stratified bootstrap over runs within "
        f"each task, percentile method, {report.reps} resamples, numpy seed {report.seed}) around "
        "`metrics.aggregate_median/iqm/mean/optimality_gap`; `library.create_performance_profile`; "
        "`plot_utils.plot_interval_estimates`, `plot_sample_efficiency_curve`, `plot_performance_profiles`. "
        f"Intervals need at least {report.min_runs} runs per task. Curves are compared at the env steps all "
        f"runs of a figure evaluated at (at most {_MAX_CURVE_POINTS}), else interpolated onto a shared range. "
        f"Reference values: delta = {report.ref_delta}, rho_bar = {report.ref_rho_bar}.",
        "",
    ]
    path = out / "summary.md"
    path.write_text("\n".join(s) + "\n")
    return path


def _rliable_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rliable")
    except PackageNotFoundError:
        return "(unknown version)"


def log_report(experiment: str, out: str | os.PathLike, uri: str | None = None) -> str:
    """Log the folder as artifacts ``report/`` of the sweep's parent run, beside the runs it
    summarises; an experiment without one (runs made by hand) gets a ``report`` run, made once."""
    import mlflow

    client = mlflow.MlflowClient(uri or tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    parent = client.search_runs([exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1)
    if parent:
        run_id = parent[0].info.run_id
        status = parent[0].info.status
        client.log_artifacts(run_id, str(out), artifact_path="report")
        if status == "RUNNING":  # a sweep still running keeps its parent open
            return run_id
        client.set_terminated(run_id, status)
        return run_id
    found = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`{REPORT_TAG}` = 'true'", max_results=1
    )
    run_id = (
        found[0].info.run_id
        if found
        else client.create_run(exp.experiment_id, run_name="report", tags={REPORT_TAG: "true"}).info.run_id
    )
    client.log_artifacts(run_id, str(out), artifact_path="report")
    client.set_terminated(run_id, "FINISHED")
    return run_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vaco report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiment", required=True, help="MLflow experiment name (a sweep's `experiment`)")
    parser.add_argument("--out", default=None, help="output folder (default: reports/<experiment>)")
    parser.add_argument(
        "--reps", type=int, default=2000, help="bootstrap resamples (rliable suggests 50000 for a paper)"
    )
    parser.add_argument("--seed", type=int, default=0, help="numpy seed of the bootstrap")
    parser.add_argument(
        "--min-runs", type=int, default=3, help="runs per task below which no interval is drawn"
    )
    parser.add_argument(
        "--last-evals", type=int, default=1, help="final score = mean of this many last eval/return values"
    )
    parser.add_argument(
        "--reference-delta",
        type=float,
        default=None,
        help="delta of the main comparison (default: the most used)",
    )
    parser.add_argument(
        "--reference-rho-bar",
        type=float,
        default=None,
        help="rho_bar of the main comparison (default: the most used)",
    )
    parser.add_argument("--include-unfinished", action="store_true", help="also use runs that did not FINISH")
    parser.add_argument("--no-mlflow", action="store_true", help="do not log the report as MLflow artifacts")
    args = parser.parse_args(argv)
    for name in ("reps", "min_runs", "last_evals"):
        if getattr(args, name) < 1:
            print(f"vaco report: `--{name.replace('_', '-')}` must be >= 1", file=sys.stderr)
            return 2
    _plt().switch_backend("Agg")
    uri = tracking_uri()
    try:
        runs, notes = load_runs(args.experiment, uri, args.include_unfinished)
        report = build_report(
            args.experiment,
            runs,
            notes,
            last_evals=args.last_evals,
            reference_delta=args.reference_delta,
            reference_rho_bar=args.reference_rho_bar,
            reps=args.reps,
            seed=args.seed,
            min_runs=args.min_runs,
        )
    except ValueError as err:
        print(f"vaco report: {err}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("reports") / args.experiment)
    summary = write_report(report, out)
    print(
        f"vaco report: {len(report.runs)} runs -> {summary} and {len(list(out.glob('*.png')))} figures in {out}"
    )
    if not args.no_mlflow:
        run_id = log_report(args.experiment, out, uri)
        print(
            f"  logged as artifacts report/ of MLflow run {run_id} (the sweep's parent run, or a 'report' run) in experiment '{args.experiment}'"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
