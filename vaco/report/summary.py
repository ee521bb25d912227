"""``summary.md``: the report's Markdown, with every figure written beside it.

The numbers in its tables are the statistics of :mod:`vaco.report.scores`, computed once and
handed to the figure functions; the text only formats them.
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from vaco.report.ablations import (
    STEP_TOLERANCE,
    ablation_scores,
    ablations,
    fraction_table,
    step_size_by_phase,
    step_size_matching,
    tv_table,
)
from vaco.report.design import Design, two_by_two
from vaco.report.figures import (
    figure_ablation,
    figure_aggregates,
    figure_fractions,
    figure_iqm_vs_k,
    figure_performance_profiles,
    figure_returns,
    figure_robustness,
    figure_sample_efficiency,
    figure_tv,
    pyplot,
)
from vaco.report.markdown import ci_text, markdown_table, mean_sd_text
from vaco.report.robustness import FEW_RESAMPLES, Robustness, distinct_resamples, robustness
from vaco.report.robustness_summary import design_section, robustness_section
from vaco.report.scores import AGGREGATES, MAX_CURVE_POINTS, RANGE_BELOW, Estimate, Report, is_variant
from vaco.report.sensitivity import Sensitivity, sensitivity
from vaco.report.tables import (
    aggregate_scores,
    improvement_baseline,
    iqm_of,
    probability_of_improvement,
    profiles,
    sample_efficiency,
)

__all__ = ["FIGURES", "SECTIONS", "write_report"]

SECTIONS = (
    "Runs",
    "Normalisation",
    "Robustness to lag",
    "Final scores",
    "IQM against the degree of asynchrony",
    "Probability of improvement",
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
    "robustness.png",
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


def _interval_sentence(estimates: Mapping[str, Estimate], min_runs: int) -> str:
    few = {k: e.runs_per_task for k, e in estimates.items() if e.interval is None}
    ranged = {k: e.runs_per_task for k, e in estimates.items() if e.interval is not None and e.kind == "range"}
    sentences = []
    if not few and not ranged:
        return "Every group has enough runs for a 95% interval."
    if few:
        sentences.append(
            f"Too few runs for an interval in {len(few)} of {len(estimates)} groups "
            f"({', '.join(f'{k}: {n} run(s) per task' for k, n in list(few.items())[:8])}"
            f"{', ...' if len(few) > 8 else ''}); those show point estimates only, and an interval needs "
            f"at least {min_runs} runs per task."
        )
    if ranged:
        counts = sorted(set(ranged.values()))
        sentences.append(
            f"Too few runs for a bootstrap in {len(ranged)} of {len(estimates)} groups "
            f"({', '.join(map(str, counts))} run(s) per task): their brackets are the range of the statistic over "
            f"the runs taken one at a time, not a confidence interval (a 95% bootstrap interval needs at least "
            f"{RANGE_BELOW} runs per task; with 3 it is that range). Compare such groups run by run, paired by seed."
        )
    return " ".join(sentences)


def _heading(title: str, figure: tuple[str, str] | None = None) -> list[str]:
    """A section's first lines: its heading between blank lines, then its ``(alt text, file)`` figure."""
    lines = ["", f"## {title}", ""]
    return lines if figure is None else [*lines, f"![{figure[0]}]({figure[1]})", ""]


def _by_k_table(report: Report, estimates: Mapping[str, Estimate], column: str = "") -> str:
    """One row an algorithm with an estimate, one column a K (``"{algorithm} K={k}"`` keys)."""
    rows = [
        (a, *(ci_text(estimates.get(f"{a} K={k}")) for k in report.ks))
        for a in report.algorithms
        if any(f"{a} K={k}" in estimates for k in report.ks)
    ]
    return markdown_table(["algorithm", *[f"{column}K={k}" for k in report.ks]], rows)


class _Figures:
    """Saves a figure into the report's folder (``save(fig, name)`` returns the name for the link)."""

    def __init__(self, out: Path, dpi: int) -> None:
        self.out, self.dpi = out, dpi

    def __call__(self, fig, name: str) -> str:
        from matplotlib.ticker import EngFormatter

        for ax in fig.axes:  # 50k, 100k, ... instead of colliding 50000100000 tick labels
            if ax.get_xlabel() == "env steps":
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        fig.savefig(self.out / name, dpi=self.dpi, bbox_inches="tight")
        pyplot().close(fig)
        return name


def write_report(
    report: Report,
    out: str | os.PathLike,
    dpi: int = 110,
    lag: Robustness | None = None,
    scoring: Sensitivity | None = None,
    design: Design | None = None,
) -> Path:
    """Draw every figure into ``out`` and write ``out/summary.md`` (one function per section, in
    :data:`SECTIONS` order); returns the summary's path. ``lag``, ``scoring`` and ``design``: the
    robustness section's data, its sensitivity to the scoring and the 2x2 design's contrasts, if
    computed already (else computed here; ``scoring`` only when ``lag`` is not given)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save = _Figures(out, dpi)
    s: list[str] = [f"# Report: {report.experiment}", ""]
    if report.weak_scale:  # before anything a reader might quote
        s += ["**Read with care: the normalised scores below cannot separate the algorithms from seed noise.**", ""]
        s += [f"- {line}" for line in report.weak_scale] + [""]
    s += _runs_section(report, save)
    s += _normalisation_section(report, save)
    design = design if design is not None else two_by_two(report)
    s += _robustness_part(report, save, lag, scoring, design)
    s += design_section(report, design, scoring)
    scores = aggregate_scores(report)  # (after the robustness bootstrap, as the summary has always been drawn)
    s += _final_scores_section(report, save, scores)
    s += _iqm_section(report, save, scores)
    s += _improvement_section(report, save)
    s += _returns_section(report, save)
    s += _sample_efficiency_section(report, save)
    s += _profiles_section(report, save)
    s += _tv_section(report, save)
    s += _fractions_section(report, save)
    s += _ablations_section(report, save)
    s += _method_section(report, save)
    path = out / "summary.md"
    path.write_text("\n".join(s) + "\n")
    return path


def _runs_section(report: Report, save: _Figures) -> list[str]:
    """Runs."""
    s: list[str] = []
    s += ["## Runs", ""]
    main = report.main_runs()
    s.append(
        f"{len(report.runs)} finished runs on {len(report.tasks)} task(s) ({', '.join(report.tasks)}); "
        f"algorithms {', '.join(report.algorithms)}; K in {report.ks}. Main comparison: {len(main)} runs at "
        + " and ".join(f"{axis} = {value}" for axis, value in report.reference.items() if value is not None)
        + " (where they apply)."
    )
    counts = Counter((r.algorithm, r.K, r.env) for r in main)
    s += [
        "",
        markdown_table(
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
    return s


def _normalisation_section(report: Report, save: _Figures) -> list[str]:
    """Normalisation."""
    s: list[str] = []
    if report.scale == "as is":
        return [
            "",
            "## Normalisation",
            "",
            f"Final score = mean of the last {report.last_evals} {report.score_metric} value(s) of a run, scored as "
            "it is: an accuracy is already in [0, 1], so no min-max stretch (differences and the margin are in "
            "accuracy units).",
        ]
    if report.scale == "fixed":
        where = "min and max the study plan's fixed references (numbers that do not move as runs arrive):"
    elif report.normalization == "main":
        variants = sorted({r.algorithm for r in report.runs if is_variant(r.algorithm, r.variant_of)})
        where = (
            "min and max over the runs of the main algorithms at the main comparison's axis values, as the paper "
            f"defines it: ablation and control variants ({', '.join(variants) or 'none here'}) and runs at other "
            "axis values are scored on that scale but do not set it (`--normalize-over all` takes every run)."
        )
    else:
        where = "min and max over every run of the task in this report (`--normalize-over all`)."
    s += [
        "",
        "## Normalisation",
        "",
        f"Final score = mean of the last {report.last_evals} {report.score_metric} value(s) of a run; normalised = "
        f"(return - min) / (max - min) per task, {where}",
        "",
    ]
    s.append(
        markdown_table(
            ["task", "min", "max"],
            [
                (t, f"{lo:.{_decimals(report)}f}", f"{hi:.{_decimals(report)}f}")
                for t, (lo, hi) in sorted(report.bounds.items())
            ],
        )
    )
    return s


def _decimals(report: Report) -> int:
    """Decimals for raw scores: 1 for returns (hundreds, thousands), 3 for a score in [0, 1] (the LLM
    track's accuracy, which one decimal would round to 0.3 or 0.4)."""
    values = [abs(v) for v in report.final.values() if np.isfinite(v)]
    return 3 if values and max(values) <= 1.0 else 1


def _robustness_part(
    report: Report, save: _Figures, lag: Robustness | None, scoring: Sensitivity | None, design: Design | None
) -> list[str]:
    """Robustness to lag (the paper's claim), before the levels, and its sensitivity to the scoring
    (also saved as ``sensitivity.csv``, with the 2x2 design's contrasts if there is one)."""
    if lag is None:
        lag = robustness(report)
        scoring = sensitivity(report, lag, design=design)
    if scoring is not None and (scoring.rows or scoring.design):
        scoring.frame().to_csv(save.out / "sensitivity.csv", index=False)
    return robustness_section(
        report, lag, save(figure_robustness(report, lag), "robustness.png") if lag.drops else None, scoring
    )


def _final_scores_section(report: Report, save: _Figures, scores) -> list[str]:
    """Aggregates."""
    main = report.main_runs()
    fig, agg, notes = figure_aggregates(report, scores)
    s = _heading("Final scores", figure=("aggregate metrics", save(fig, "aggregate_metrics.png")))
    s += [
        "Median, IQM and Mean: higher is better; Optimality Gap: lower is better. "
        + _interval_sentence(agg, report.min_runs),
        "",
    ]
    s.append(
        markdown_table(
            ["group", "runs/task", "tasks", *AGGREGATES],
            [(k, e.runs_per_task, e.tasks, *(ci_text(e, i) for i in range(len(AGGREGATES)))) for k, e in agg.items()],
        )
    )
    s += [f"- {n}" for n in notes]
    final_returns, per_seed = defaultdict(list), defaultdict(list)
    d = _decimals(report)
    for r in sorted(main, key=lambda r: r.seed):
        final_returns[(r.env, r.algorithm, r.K)].append(report.final[r.run_id])
        per_seed[(r.env, r.algorithm, r.K)].append(f"s{r.seed}: {report.final[r.run_id]:.{d}f}")
    s += ["", f"Final {report.score_metric} (raw), mean +- sample SD (ddof = 1) over seeds, and each seed's:", ""]
    s.append(
        markdown_table(
            ["task", "algorithm", "K", "return", "runs", "per seed"],
            [
                (t, a, K, mean_sd_text(v, d), len(v), ", ".join(per_seed[(t, a, K)]))
                for (t, a, K), v in sorted(
                    final_returns.items(), key=lambda x: (x[0][0], report.algorithms.index(x[0][1]), x[0][2])
                )
            ],
        )
    )
    return s


def _iqm_section(report: Report, save: _Figures, scores) -> list[str]:
    """IQM vs K."""
    fig, iqm, _ = figure_iqm_vs_k(report, iqm_of(scores))  # the IQM column above: one bootstrap, one interval
    s = _heading("IQM against the degree of asynchrony", figure=("IQM vs K", save(fig, "iqm_vs_k.png")))
    s += [
        "The IQM of the table above, against K: which algorithm scores higher at each K (a level "
        "comparison; robustness is the section above). The intervals are the same as above.",
        "",
    ]
    s.append(_by_k_table(report, iqm))
    return s


def _improvement_section(report: Report, save: _Figures) -> list[str]:
    """Probability of improvement."""
    baseline = improvement_baseline(report)
    s = _heading("Probability of improvement")
    improvement = probability_of_improvement(report, baseline) if baseline else None
    if not improvement or not improvement.estimates:
        s.append(
            "No comparison: it needs a baseline algorithm (`--baseline NAME`; PPO-clip by default) with runs "
            "on every task at the K of another algorithm."
        )
    else:
        s += [
            f"P(X > Y): the probability that a run of X scores above a run of Y = {baseline} at the same K on a "
            "task drawn at random (rliable's `metrics.probability_of_improvement` on the normalised final "
            "scores; 0.5: no difference), with its 95% stratified-bootstrap interval. "
            + _interval_sentence(improvement.estimates, max(report.min_runs, RANGE_BELOW)),
            "",
        ]
        s.append(
            markdown_table(
                ["X", "Y", "P(X > Y)", "runs/task", "tasks"],
                [
                    (key.split(" vs ")[0], key.split(" vs ")[1], ci_text(e), e.runs_per_task, e.tasks)
                    for key, e in improvement.estimates.items()
                ],
            )
        )
    return s


def _returns_section(report: Report, save: _Figures) -> list[str]:
    """Returns."""
    s = _heading("Returns over training", figure=("returns", save(figure_returns(report), "returns.png")))
    s += [
        f"Raw {report.score_metric} per task and K; lines are means over seeds, bands one sample standard deviation.",
    ]
    return s


def _sample_efficiency_section(report: Report, save: _Figures) -> list[str]:
    """Sample efficiency."""
    fig, _, auc, notes = figure_sample_efficiency(report, sample_efficiency(report))
    s = _heading("Sample efficiency", figure=("sample efficiency", save(fig, "sample_efficiency.png")))
    s += [
        f"IQM of the normalised {report.score_metric} at common env steps (bands: 95% CIs), and the IQM of each run's "
        "normalised area under the curve: the mean over training of its values on the final scores' scale, "
        "(value - low) / (high - low) with the task's low and high (the runs' lowest and highest final scores "
        "unless references are given). 1: a run sat at the high end all along; below 0: it spent training under "
        "the low end, and a narrow range makes that large (an AUC of -4: training's values sat, on average, four "
        "widths of the range below its low end). " + _interval_sentence(auc, report.min_runs),
        "",
    ]
    s.append(_by_k_table(report, auc, "AUC "))
    s += [f"- {n}" for n in notes]
    return s


def _profiles_section(report: Report, save: _Figures) -> list[str]:
    """Performance profiles."""
    fig, notes = figure_performance_profiles(report, profiles(report))
    s = _heading("Performance profiles", figure=("performance profiles", save(fig, "performance_profiles.png")))
    s += [
        "Fraction of runs (over all tasks) whose normalised final score exceeds tau; bands are 95% "
        f"bootstrap CIs, drawn only for groups with at least {report.min_runs} runs per task.",
    ]
    s += [f"- {n}" for n in notes]
    return s


def _tv_section(report: Report, save: _Figures) -> list[str]:
    """TV."""
    s = _heading("TV divergence against delta/2", figure=("TV", save(figure_tv(report), "tv.png")))
    s += [
        "Top: `lag/forward_tv`, the TV between the behaviour mixture and the policy after the iteration's "
        "epochs, on the whole batch (the paper's 'TV of the final policy'). Bottom: `train/tv`, the minibatch "
        "TV the filter tests, averaged over the epochs. Each run contributes its mean over all iterations; "
        "lines are means over runs, bands one sample standard deviation; the dashed line is delta/2. "
        "+- in the table: sample SD (ddof = 1) over runs.",
        "",
    ]
    s.append(
        markdown_table(
            ["algorithm", "K", "lag/forward_tv", "train/tv", "delta/2"],
            [
                (
                    a,
                    K,
                    mean_sd_text(f, 4) if f else "-",
                    mean_sd_text(t, 4) if t else "-",
                    f"{d / 2:g}" if d is not None else "-",
                )
                for (a, K), (f, t, d) in tv_table(report).items()
            ],
        )
    )
    if len(report.tasks) > 1:
        per_task = tv_table(report, by_task=True)
        groups = list(dict.fromkeys((a, K) for _, a, K in per_task))
        s += ["", "`lag/forward_tv` per task (mean over runs):", ""]
        s.append(
            markdown_table(
                ["algorithm", "K", *report.tasks, "delta/2"],
                [
                    (
                        a,
                        K,
                        *[
                            f"{np.mean(per_task[(t, a, K)][0]):.4f}" if per_task.get((t, a, K), ([],))[0] else "-"
                            for t in report.tasks
                        ],
                        next(
                            (
                                f"{d / 2:g}"
                                for (_, a2, K2), (_, _, d) in per_task.items()
                                if (a2, K2) == (a, K) and d is not None
                            ),
                            "-",
                        ),
                    )
                    for a, K in sorted(groups, key=lambda g: (report.algorithms.index(g[0]), g[1]))
                ],
            )
        )
    return s + _step_size_part(report)


def _step_size_part(report: Report) -> list[str]:
    """The 2x2 design's check that each step-size pair holds step size at every K (only with
    ``--step-pairs``; nothing otherwise, so reports without pairs read as before)."""
    matches = step_size_matching(report)
    if not report.step_pairs:
        return []
    s = [
        "",
        "### Step size held at every K?",
        "",
        "Each declared pair (`--step-pairs FILTER=CLIP`: a TV-filter arm and the clip arm meant to move as far "
        "per iteration) side by side: realised `lag/forward_tv` (per run, its mean over iterations; per arm, the "
        f"mean over runs) and the clip arm's over the filter arm's. **drifts**: more than "
        f"{STEP_TOLERANCE:.0%} apart, so at that K the pair does not hold step size (calibrate the clip arm "
        "per K there, or say why not).",
        "",
    ]
    if not matches:
        return s + ["No pair has runs of both arms at a common task and K here."]
    s.append(
        markdown_table(
            ["pair", "task", "K", "filter arm TV", "clip arm TV", "clip / filter", "step size", "runs"],
            [
                (
                    f"{m.filter_arm} / {m.clip_arm}",
                    m.task,
                    m.K,
                    f"{m.filter_tv:.4f}",
                    f"{m.clip_tv:.4f}",
                    f"{m.ratio:.3f}",
                    "**drifts**" if m.drifts else "held",
                    f"{m.filter_runs} / {m.clip_runs}",
                )
                for m in matches
            ],
        )
    )
    phases = step_size_by_phase(report)
    s += [
        "",
        "By phase: the same ratio over each third of the runs (an arm can match on the run average and still "
        "move further early and less late), with the spread across seeds of the per-seed ratio (sample SD over the "
        f"seeds both arms ran). **leaves +-{STEP_TOLERANCE:.0%}**: that phase does not hold the step.",
        "",
        markdown_table(
            ["pair", "task", "K", "phase", "clip / filter", "SD over seeds", "seeds", "step size"],
            [
                (
                    f"{p.filter_arm} / {p.clip_arm}",
                    p.task,
                    p.K,
                    p.phase,
                    f"{p.ratio:.3f}",
                    "-" if math.isnan(p.ratio_sd) else f"{p.ratio_sd:.3f}",
                    p.seeds,
                    f"**leaves +-{STEP_TOLERANCE:.0%}**" if p.drifts else "held",
                )
                for p in phases
            ],
        ),
    ]
    return s


def _fractions_section(report: Report, save: _Figures) -> list[str]:
    """Fractions."""
    s = _heading(
        "Filter and clip fractions", figure=("fractions", save(figure_fractions(report), "filter_clip_fractions.png"))
    )
    s += [
        "Per batch (one value per iteration, the mean over its minibatches): `train/filter_fraction` for "
        "TV-filter objectives, `train/clip_fraction` for the others; averaged over runs.",
        "",
    ]
    s.append(
        markdown_table(
            ["algorithm", "K", "objective", "filter fraction", "clip fraction"],
            [
                (a, K, o, f"{f:.4f}", f"{c:.4f}")
                for (a, K), (f, c, o) in sorted(
                    fraction_table(report).items(), key=lambda x: (report.algorithms.index(x[0][0]), x[0][1])
                )
            ],
        )
    )
    return s


def _ablations_section(report: Report, save: _Figures) -> list[str]:
    """Ablations."""
    s: list[str] = []
    for name, ablation in ablations(report).items():
        heading = "Ablation: realignment" if name == "realign" else f"Ablation: {name}"
        s += ["", f"## {heading}", ""]
        if not ablation.runs:
            s.append(f"Not in this experiment: it {ablation.reason}.")
            continue
        fig, final_est, auc_est, notes = figure_ablation(report, ablation, ablation_scores(report, ablation))
        s += [
            f"![{ablation.title}]({save(fig, f'ablation_{name}.png')})",
            "",
            _interval_sentence(final_est, report.min_runs),
            "",
        ]
        s.append(
            markdown_table(
                ["variant and K", "IQM final", "IQM AUC"],
                [(k, ci_text(e), ci_text(auc_est.get(k))) for k, e in final_est.items()],
            )
        )
        s += [f"- {n}" for n in notes]
    return s


def _method_section(report: Report, save: _Figures) -> list[str]:
    """Method."""
    s = _heading("How this was computed")
    s += [
        f"rliable {_rliable_version()}: the intervals of `library.get_interval_estimates` (stratified bootstrap "
        f"over runs within each task, percentile method, {report.reps} resamples, numpy seed {report.seed}) around "
        "`metrics.aggregate_median/iqm/mean/optimality_gap` and `probability_of_improvement`, and of "
        "`library.create_performance_profile`, from rliable's own resamples with each statistic computed on all "
        "of them at once (`vaco.report.bootstrap`: the same numbers to rounding); "
        "`plot_utils.plot_interval_estimates`, `plot_sample_efficiency_curve`, `plot_performance_profiles`. "
        f"Intervals need at least {report.min_runs} runs per task. Curves are compared at the env steps all "
        f"runs of a figure evaluated at (at most {MAX_CURVE_POINTS}), else interpolated onto a shared range. "
        "Reference values: "
        + ", ".join(f"{axis} = {value}" for axis, value in report.reference.items() if value is not None)
        + ".",
        "",
        _resample_sentence(report),
        "",
    ]
    return s


def _resample_sentence(report: Report) -> str:
    """How many seeds the main comparison's cells have, and how many distinct resamples that allows."""
    counts = sorted(set(Counter((r.algorithm, r.K, r.env) for r in report.main_runs()).values()))
    if not counts:
        return ""
    few = [n for n in counts if distinct_resamples(n) < FEW_RESAMPLES]
    text = (
        f"Seeds per cell (algorithm, K, task): {', '.join(map(str, counts))}. With n seeds a task has only "
        "C(2n - 1, n) distinct bootstrap resamples ("
        + ", ".join(f"{n} seeds: {distinct_resamples(n):,}" for n in counts)
        + ")."
    )
    if few:
        text += (
            f" **Warning:** under {FEW_RESAMPLES:,} for {', '.join(map(str, few))} seeds: intervals from so few "
            "distinct resamples are optimistic; read them as rough."
        )
    return text


def _rliable_version() -> str:

    try:
        return version("rliable")
    except PackageNotFoundError:
        return "(unknown version)"
