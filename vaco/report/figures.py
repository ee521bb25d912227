"""The report's figures, drawn from the statistics of :mod:`vaco.report.scores`.

Each ``figure_*`` takes the :class:`~vaco.report.scores.Report` and, optionally, the statistics
already computed for it (the summary computes them once); without them it computes them. Each
returns the matplotlib figure (and, for notebooks, the estimates it drew).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from vaco.report.ablations import Ablation, ablation_scores
from vaco.report.runs import Run
from vaco.report.scores import AGGREGATES, RANGE_BELOW, Estimate, Report, common_grid, resample
from vaco.report.tables import (
    Profiles,
    SampleEfficiency,
    Scores,
    aggregate_scores,
    improvement_baseline,
    iqm_against_k,
    main_groups,
    profiles,
    sample_efficiency,
)

__all__ = [
    "figure_ablation",
    "figure_aggregates",
    "figure_fractions",
    "figure_iqm_vs_k",
    "figure_performance_profiles",
    "figure_returns",
    "figure_robustness",
    "figure_sample_efficiency",
    "figure_tv",
]


def pyplot():
    import matplotlib.pyplot as plt

    return plt


def use_file_backend() -> None:
    """Draw into files (matplotlib's Agg backend): no display is needed or opened."""
    pyplot().switch_backend("Agg")


def _colors(keys: Sequence[str]) -> dict[str, tuple]:
    import seaborn as sns

    palette = sns.color_palette("colorblind", n_colors=max(len(keys), 1))
    return dict(zip(keys, palette))


def _algo_colors(report: Report) -> dict[str, tuple]:
    return _colors(report.algorithms)


#: one dash pattern per algorithm beside its colour: where algorithms' curves coincide (one seed, a
#: filter that never fired), the solid line lies lowest and each dashed one's gaps show those beneath
DASHES = ("-", (0, (6, 2)), (0, (2, 1.5)), (0, (6, 2, 1.5, 2)), (0, (10, 3)), (0, (1, 1)))


def _dash(axes, report: Report) -> None:
    """Each algorithm's lines in ``axes`` drawn in its dash pattern (a line's label names its
    algorithm, as ``"ppo_clip"``, ``"ppo_clip (n=4)"`` or ``"ppo_clip vs vaco"``). Call it before
    the legend is built, so that the legend shows the patterns too."""
    order = {a: i for i, a in enumerate(report.algorithms)}
    for ax in np.ravel(axes):
        for line in ax.get_lines():
            name = str(line.get_label()).split(" (n=")[0].split(" vs ")[0]
            if name in order:
                line.set_linestyle(DASHES[order[name] % len(DASHES)])
                line.set_zorder(2 + 0.01 * order[name])  # the solid first algorithm at the bottom


def _sample_sd(values: np.ndarray) -> np.ndarray:
    """The sample standard deviation over the first axis (ddof = 1); 0 for a single run."""
    values = np.asarray(values, dtype=np.float64)
    return values.std(0, ddof=1) if values.shape[0] > 1 else np.zeros(values.shape[1:])


def _no_interval_note(estimates: Mapping[str, Estimate], min_runs: int) -> str:
    few = sorted({e.runs_per_task for e in estimates.values() if e.interval is None})
    ranges = sorted({e.runs_per_task for e in estimates.values() if e.interval is not None and e.kind == "range"})
    notes = []
    if few:
        notes.append(f"point estimates only where runs per task < {min_runs} ({', '.join(map(str, few))})")
    if ranges:
        notes.append(
            f"bars are the runs' range, not a CI, where runs per task < {RANGE_BELOW} ({', '.join(map(str, ranges))})"
        )
    return "; ".join(notes)


def _scale_note(report: Report) -> str:
    """The text's warning, on the figure too, where a task's normalisation rests on a range seed noise
    could make (:attr:`Report.weak_scale`): there 0 and 1 mark the lowest and highest run."""
    tasks = [line.split(":", 1)[0] for line in report.weak_scale]
    if not tasks:
        return ""
    return (
        f"{', '.join(tasks)}: the normalising range cannot be told from seed noise, so 0 and 1 there mark the "
        "lowest and highest run, not the better algorithm"
    )


def _k_series(groups: Mapping[str, Sequence[Run]], name: Callable[[Run], str]) -> dict[str, list[tuple[int, str]]]:
    """Series name -> [(K, group key)]: one line per algorithm (or ablation variant) against K."""
    series = defaultdict(list)
    for key, runs in groups.items():
        series[name(runs[0])].append((runs[0].K, key))
    return series


def _legend_above(fig, handles, labels, columns: int, height: float) -> None:
    """One legend for the whole figure, centred above it, at most ``columns`` entries a row (none
    when nothing was drawn: runs without that metric)."""
    if not labels:
        return
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=min(len(labels), columns),
        bbox_to_anchor=(0.5, height),
        fontsize="small",
    )


def figure_aggregates(report: Report, scores: Scores | None = None):
    """Median, IQM, Mean, Optimality Gap per (algorithm, K) with rliable's interval plot; returns
    the figure, the estimates and the notes (``scores`` from :func:`aggregate_scores`, else computed)."""
    from rliable import plot_utils

    scores = scores or aggregate_scores(report)
    estimates, notes = scores.estimates, scores.notes
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
    note = "; ".join(n for n in (_no_interval_note(estimates, report.min_runs), _scale_note(report)) if n)
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
    place: tuple[int, int] | None = None,
    linestyle: str = "-",
):
    """Lines of an estimate against K; error bars where an interval exists. Series are spread a little
    along K (``place``: this call's (index, count) among the calls sharing the axes), so that equal
    values stay visible side by side."""
    for i, (name, points) in enumerate(series.items()):
        pts = [(k, estimates[key]) for k, key in points if key in estimates]
        if not pts:
            continue
        index, count = place or (i, len(series))
        ks = _jitter(np.array([k for k, _ in pts], dtype=float), index, count)
        y = np.array([e.point[0] for _, e in pts])
        ax.plot(ks, y, marker="o", color=colors[name], label=name, linestyle=linestyle)
        for k, (_, e) in zip(ks, pts):
            if e.interval is not None:
                ax.vlines(k, e.interval[0, 0], e.interval[1, 0], color=colors[name], alpha=0.6, linewidth=3)
    all_k = sorted({k for pts in series.values() for k, _ in pts})
    _k_axis(ax, all_k)
    ax.set_xlabel("degree of asynchrony K")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.25)


#: more algorithms than this and the score-against-K figure draws one panel each (12 lines in one
#: axes hide each other's intervals)
PANELS_ABOVE = 6


def score_name(report: Report) -> str:
    """The report's score in a few words, for an axis: the final score, the mean of the last n
    evaluations, or the AUC (what ``--score`` chose; the figures draw that score, so they say it)."""
    return {"final": "final score", "last-n": f"mean of the last {report.last_evals} evaluations", "auc": "AUC"}[
        report.score
    ]


def figure_iqm_vs_k(report: Report, scores: Scores | None = None):
    """IQM of the report's normalised score (:func:`score_name`) against K, one line per algorithm; with more than
    :data:`PANELS_ABOVE` algorithms, one panel per algorithm on a shared axis, the baseline
    (:func:`vaco.report.tables.improvement_baseline`) drawn in grey in every other panel."""
    plt = pyplot()
    scores = scores or iqm_against_k(report)
    estimates, notes = scores.estimates, scores.notes
    series = _k_series(main_groups(report), lambda r: r.algorithm)
    note = "; ".join(n for n in (_no_interval_note(estimates, report.min_runs), _scale_note(report)) if n)
    name = score_name(report)
    title = f"{name[0].upper()}{name[1:]} against K" + (f" ({note})" if note else "")
    if len(series) > PANELS_ABOVE:
        return _iqm_vs_k_panels(report, estimates, series, title), estimates, notes
    fig, ax = plt.subplots(figsize=(6, 4))
    _vs_k_axis(ax, estimates, series, _algo_colors(report), f"IQM normalised {name}", title.replace(" (", "\n(", 1))
    _dash(ax, report)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig, estimates, notes


def _iqm_vs_k_panels(report: Report, estimates, series, title: str):
    plt = pyplot()
    baseline = improvement_baseline(report)
    # one algorithm a panel: one colour for it (the palette's tenth is grey, the baseline's here)
    own = dict.fromkeys(series, _colors(["x"])["x"])
    columns = 4
    rows = -(-len(series) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.6 * rows + 0.6), sharex=True, sharey=True)
    axes = np.ravel(axes)
    for ax, name in zip(axes, series):
        beside = baseline in series and name != baseline
        if beside:  # the baseline dashed and set a little to the left: a panel equal to it still shows both
            grey = dict.fromkeys(series, (0.6, 0.6, 0.6))
            _vs_k_axis(ax, estimates, {baseline: series[baseline]}, grey, "", "", place=(0, 2), linestyle="--")
        _vs_k_axis(ax, estimates, {name: series[name]}, own, "", name, place=(1, 2) if beside else None)
        ax.set_xlabel("")
    for ax in axes[len(series) :]:
        ax.set_visible(False)
    for ax in axes[::columns]:
        ax.set_ylabel(f"IQM normalised {score_name(report)}")
    for ax in axes[columns * (rows - 1) :]:
        ax.set_xlabel("degree of asynchrony K")
    words = f"; grey, dashed: {baseline}" if baseline in series else ""
    fig.suptitle(f"{title}{words}", fontsize="medium")
    fig.tight_layout()
    return fig


def figure_returns(report: Report):
    """The raw score (eval/return) over training per task and K: mean and standard deviation over seeds."""
    plt = pyplot()
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
                grid = common_grid([r.score() for r in runs])
                ys = np.stack([resample(r.score(), grid) for r in runs])
                mean, std = ys.mean(0), _sample_sd(ys)
                ax.plot(grid, mean, color=colors[algo], label=f"{algo} (n={len(runs)})")
                ax.fill_between(grid, mean - std, mean + std, color=colors[algo], alpha=0.15)
            ax.set_title(f"{task}, K={K}", fontsize="medium")
            ax.grid(alpha=0.25)
            if i == len(tasks) - 1:
                ax.set_xlabel("env steps")
            if j == 0:
                ax.set_ylabel(report.score_metric)
    _dash(axes, report)
    handles, labels = _legend_entries(axes)
    _legend_above(fig, handles, labels, columns=6, height=1.0 + 0.12 / len(tasks))
    fig.tight_layout()
    return fig


def _legend_entries(axes):
    seen = {}
    for ax in np.ravel(axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label.split(" (n=")[0], h)
    return list(seen.values()), list(seen)


def figure_sample_efficiency(report: Report, efficiency: SampleEfficiency | None = None):
    """IQM of the normalised return over training per K (rliable), and the IQM of the AUC;
    returns the figure, the curves per K, the AUC estimates and the notes."""
    from rliable import plot_utils

    plt = pyplot()
    ks, colors = report.ks, _algo_colors(report)
    efficiency = efficiency or sample_efficiency(report)
    curve_estimates, auc = efficiency.curves, efficiency.auc.estimates
    fig, axes = plt.subplots(1, len(ks) + 1, figsize=(4.2 * (len(ks) + 1), 3.6), squeeze=False)
    for j, K in enumerate(ks):
        grid, est = curve_estimates[K]
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
    series = _k_series(main_groups(report), lambda r: r.algorithm)
    _vs_k_axis(
        axes[0, -1],
        auc,
        series,
        colors,
        "IQM of mean normalised value over training",
        "Area under the curve (normalised)",
    )
    _dash(axes, report)
    handles, labels = axes[0, -1].get_legend_handles_labels()
    _legend_above(fig, handles, labels, columns=6, height=1.08)
    note = _no_interval_note(
        {**auc, **{f"{k}{a}": e for k, (_, est) in curve_estimates.items() for a, e in est.items()}},
        report.min_runs,
    )
    if note:
        fig.suptitle(f"({note})", y=-0.02, fontsize="small")
    fig.tight_layout()
    return fig, curve_estimates, auc, efficiency.notes


def figure_performance_profiles(report: Report, data: Profiles | None = None):
    """Score distributions per K (rliable); returns the figure and the notes."""
    from rliable import plot_utils

    plt = pyplot()
    ks, colors = report.ks, _algo_colors(report)
    data = data or profiles(report)
    fig, axes = plt.subplots(1, len(ks), figsize=(4.2 * len(ks), 3.6), squeeze=False)
    for j, K in enumerate(ks):
        if K not in data.by_k:
            continue
        profile, cis, counts = data.by_k[K]
        enough = {a: cis[a] for a, n in counts.items() if n >= report.min_runs and a in cis}
        plot_utils.plot_performance_profiles(
            profile,
            data.taus,
            performance_profile_cis=enough or None,
            colors=colors,
            ax=axes[0, j],
            xlabel=r"normalised score $\tau$",
            ylabel="fraction of runs > $\\tau$" if j == 0 else "",
            labelsize="medium",
            ticklabelsize="small",
        )
        axes[0, j].set_title(f"K={K}")
        _dash(axes[0, j], report)
        axes[0, j].legend(fontsize="small")
    fig.tight_layout()
    return fig, data.notes


def figure_tv(report: Report):
    """Per task: each run's mean TV over its iterations against K, mean +- std over seeds; delta/2 dashed."""
    plt = pyplot()
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
                        pts.append((K, np.mean(vals), float(_sample_sd(np.asarray(vals)))))
                if pts:
                    k, m, s = map(np.array, zip(*pts))
                    k = _jitter(k.astype(float), i, len(report.algorithms))
                    ax.plot(k, m, marker="o", color=colors[algo], label=algo)
                    ax.fill_between(k, m - s, m + s, color=colors[algo], alpha=0.15)
            delta = report.reference.get("delta")
            if delta is not None:
                ax.axhline(delta / 2, color="k", linestyle="--", linewidth=1, label=f"delta/2 = {delta / 2:g}")
            _k_axis(ax, report.ks)
            ax.set_title(task if row == 0 else "", fontsize="medium")
            ax.set_xlabel("degree of asynchrony K")
            if j == 0:
                ax.set_ylabel(label)
            ax.grid(alpha=0.25)
    _dash(axes, report)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    _legend_above(fig, handles, labels, columns=7, height=1.05)
    fig.tight_layout()
    return fig


def figure_fractions(report: Report):
    """train/filter_fraction (TV-filter objectives) and train/clip_fraction (the others) per
    iteration, averaged over the runs of each (algorithm, K)."""
    plt = pyplot()
    ks, colors = report.ks, _algo_colors(report)
    main = report.main_runs()
    fig, axes = plt.subplots(2, len(ks), figsize=(4.0 * len(ks), 5.6), squeeze=False, sharey="row")
    for j, K in enumerate(ks):
        for algo in report.algorithms:
            runs = [r for r in main if r.K == K and r.algorithm == algo]
            if not runs:
                continue
            key = runs[0].fraction_metric or "train/clip_fraction"  # what the objective declares
            row = 0 if key == "train/filter_fraction" else 1
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
    _dash(axes, report)
    handles, labels = _legend_entries(axes)
    _legend_above(fig, handles, labels, columns=6, height=1.05)
    fig.tight_layout()
    return fig


def figure_ablation(report: Report, ablation: Ablation, scores: tuple[Scores, Scores] | None = None):
    """IQM of the final normalised score and of the AUC against K, one line per ablation value;
    returns the figure, the two sets of estimates and the notes."""
    plt = pyplot()
    final, auc = scores or ablation_scores(report, ablation)
    final_est, auc_est, notes = final.estimates, auc.estimates, final.notes
    series = _k_series(ablation.groups(), ablation.variant)
    colors = _colors(list(series))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    _vs_k_axis(axes[0], final_est, series, colors, "IQM normalised final score", f"{ablation.title}: final score")
    _vs_k_axis(axes[1], auc_est, series, colors, "IQM of normalised AUC", f"{ablation.title}: sample efficiency")
    axes[1].legend(fontsize="small")
    note = _no_interval_note(final_est, report.min_runs)
    if note:
        fig.suptitle(f"({note})", y=-0.02, fontsize="small")
    fig.tight_layout()
    return fig, final_est, auc_est, notes


def figure_robustness(report: Report, data=None):
    """Left: each algorithm's IQM at K relative to its own K_ref (the ratio; 1 = no loss). Right: the
    difference of drops against the baseline (drop(baseline) - drop(algorithm); above 0: the
    algorithm loses less), 95% paired stratified-bootstrap intervals. ``data`` from
    :func:`vaco.report.robustness.robustness`, else computed."""
    from vaco.report.robustness import robustness

    plt = pyplot()
    data = data or robustness(report)
    if len({a for a, _ in data.drops}) > PANELS_ABOVE:
        return _drops_ranked(report, data)
    colors = _algo_colors(report)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    algos = list(dict.fromkeys(a for a, _ in data.drops))
    ks = sorted({data.k_ref, *(K for _, K in data.drops)})
    for i, algo in enumerate(algos):
        pts = [(data.k_ref, 1.0, None)] + [
            (K, d.ratio, d.ratio_interval) for (a, K), d in data.drops.items() if a == algo
        ]
        x = _jitter(np.array([p[0] for p in pts], dtype=float), i, len(algos))
        left.plot(x, [p[1] for p in pts], marker="o", color=colors[algo], label=algo)
        for xi, (_, _, ci) in zip(x, pts):
            if ci is not None:
                left.vlines(xi, ci[0], ci[1], color=colors[algo], alpha=0.6, linewidth=3)
    left.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    _k_axis(left, ks)
    left.set_xlabel("degree of asynchrony K")
    left.set_ylabel(f"IQM(K) / IQM(K={data.k_ref})")
    left.set_title(f"Score relative to the algorithm's own K={data.k_ref}")
    left.grid(alpha=0.25)
    _dash(left, report)
    left.legend(fontsize="small")
    others = list(dict.fromkeys(a for a, _ in data.interactions))
    for i, algo in enumerate(others):
        pts = [(K, x.difference, x.difference_interval) for (a, K), x in data.interactions.items() if a == algo]
        x = _jitter(np.array([p[0] for p in pts], dtype=float), i, len(others))
        right.plot(x, [p[1] for p in pts], marker="o", color=colors[algo], label=f"{algo} vs {data.baseline}")
        for xi, (_, _, ci) in zip(x, pts):
            if ci is not None:
                right.vlines(xi, ci[0], ci[1], color=colors[algo], alpha=0.6, linewidth=3)
    right.axhline(0.0, color="grey", linewidth=0.8, linestyle="--")
    if len(ks) > 1:
        _k_axis(right, ks[1:] if len(ks) > 2 else ks)
    right.set_xlabel("degree of asynchrony K")
    right.set_ylabel(f"drop({data.baseline}) - drop(algorithm)")
    right.set_title("Difference of drops (> 0: loses less than the baseline)")
    right.grid(alpha=0.25)
    if others:
        _dash(right, report)
        right.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _drops_ranked(report: Report, data):
    """Many algorithms: one panel per K, each algorithm's drop from its own K_ref with its 95% paired
    interval, smallest drop at the top (the ranking's order, :mod:`vaco.report.ranking`), the
    baseline's drop as a grey line."""
    plt = pyplot()
    ks = sorted({K for _, K in data.drops})
    rows = max(sum(1 for _, k in data.drops if k == K) for K in ks)
    fig, axes = plt.subplots(1, len(ks), figsize=(5 * len(ks), 0.32 * rows + 1.6), sharex=True, squeeze=False)
    for ax, K in zip(axes[0], ks):
        drops = sorted((d for (_, k), d in data.drops.items() if k == K), key=lambda d: d.drop)
        y = np.arange(len(drops))[::-1]
        for yi, d in zip(y, drops):
            color = (0.45, 0.45, 0.45) if d.algorithm == data.baseline else _colors(["x"])["x"]
            ax.plot([d.drop], [yi], marker="o", color=color)
            if d.drop_interval is not None:
                ax.hlines(yi, d.drop_interval[0], d.drop_interval[1], color=color, alpha=0.6, linewidth=3)
            if d.algorithm == data.baseline:
                ax.axvline(d.drop, color=color, linewidth=0.8, linestyle="--")
        ax.set_yticks(y, [d.algorithm for d in drops])
        ax.axvline(0.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel(f"drop: IQM(K={data.k_ref}) - IQM(K={K})")
        ax.set_title(f"K = {K} (smallest drop at the top)")
        ax.grid(alpha=0.25, axis="x")
    fig.suptitle(
        "Each algorithm's loss from its own K="
        + str(data.k_ref)
        + (f"; dashed: {data.baseline}'s" if data.baseline else "")
        + "; 95% paired intervals",
        fontsize="medium",
    )
    fig.tight_layout()
    return fig
