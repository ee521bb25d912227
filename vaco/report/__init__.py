"""``vaco report``: MLflow runs -> normalised scores -> rliable aggregates, PNG figures, a Markdown summary.

    vaco report --experiment vaco-laptop [--out reports/vaco-laptop] [--reps 2000] [--save-data runs.csv.gz]
    vaco report --data docs/data/runs.csv.gz          # the same report from a data file, no MLflow store
    vaco report --data part1.csv.gz part2.csv.gz --tasks Hopper-v5 HalfCheetah-v5 --baseline ppo_clip

The protocol follows the paper's Experiments section and Agarwal et al. (2021), computed with
rliable itself (``library.get_interval_estimates``, ``metrics.aggregate_*``,
``library.create_performance_profile``, ``plot_utils``):

* final score of a run: the mean of its last ``last_evals`` ``eval/return`` values (default 1:
  the return of the final policy, itself the mean over E evaluation episodes);
* normalised score: ``(return - min) / (max - min)``, with min and max over the final scores of
  the main algorithms' runs of that task at the main comparison's axis values, as the paper
  defines it (ablation and control variants are scored on that scale but do not set it;
  ``--normalize-over all`` takes every run); curves use the same two numbers, so a curve (or a
  variant) can leave [0, 1];
* robustness to lag (:mod:`~vaco.report.robustness`, the section that leads the summary): each
  algorithm's drop from its own K = 1 and the difference of drops against ``--baseline``, with
  paired stratified-bootstrap intervals;
* Median, IQM, Mean and Optimality Gap with 95% stratified-bootstrap intervals over runs x tasks,
  per algorithm and degree of asynchrony K; IQM of the normalised return over training and of
  its area under the curve (AUC: the curve's mean over its evaluation steps, trapezoid rule);
  performance profiles;
* TV of the policy after each iteration's epochs from the behaviour mixture (``lag/forward_tv``,
  the paper's "TV of the final policy") and the minibatch TV the filter tests (``train/tv``),
  each averaged over all iterations of a run, against ``delta / 2``;
* ``train/filter_fraction`` and ``train/clip_fraction`` per batch (one logged value per iteration);
* an ablation per sweep axis (delta, rho_bar, and any axis an objective declares in
  ``sweep_axes``), and realignment on/off.

The package is the workflow: :mod:`~vaco.report.runs` (read runs from MLflow or a data file),
:mod:`~vaco.report.scores` (statistics as data), :mod:`~vaco.report.figures` (drawn from them),
:mod:`~vaco.report.summary` (``summary.md``), :mod:`~vaco.report.cli` (``vaco report``). Everything
is importable from ``vaco.report`` too (``from vaco import report as R``).

The main comparison uses the runs at the reference value of each axis (the value most runs use,
unless ``--reference-delta``/``--reference-rho-bar`` is given). A group enters an aggregate only
if it has runs on every task of that figure; its runs per task are cut to its smallest count. A
group with fewer than ``min_runs`` (default 3) runs per task gets a point estimate and no
interval, and the summary says so.
"""

from vaco.report.cli import main
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
)
from vaco.report.robustness import (
    Drop,
    Interaction,
    Robustness,
    TaskDrop,
    distinct_resamples,
    paired_bootstrap,
    paired_cells,
    robustness,
)
from vaco.report.runs import (
    METRIC_KEYS,
    Run,
    load_runs,
    log_report,
    read_runs,
    runs_from_frame,
    runs_to_frame,
    save_runs,
)
from vaco.report.scores import (
    AGGREGATES,
    Ablation,
    Estimate,
    Profiles,
    Report,
    SampleEfficiency,
    Scores,
    ablation_scores,
    ablations,
    aggregate_estimates,
    aggregate_scores,
    area_under_curve,
    build_report,
    common_grid,
    curve_iqm,
    final_score,
    fraction_table,
    improvement_baseline,
    iqm_against_k,
    iqm_estimates,
    iqm_of,
    is_variant,
    normalization_bounds,
    normalize,
    performance_profiles,
    probability_of_improvement,
    profiles,
    resample,
    runs_frame,
    sample_efficiency,
    score_matrix,
    tv_table,
)
from vaco.report.summary import FIGURES, SECTIONS, write_report

__all__ = [
    "AGGREGATES",
    "FIGURES",
    "METRIC_KEYS",
    "SECTIONS",
    "Ablation",
    "Drop",
    "Interaction",
    "Robustness",
    "TaskDrop",
    "Estimate",
    "Profiles",
    "Report",
    "Run",
    "SampleEfficiency",
    "Scores",
    "ablation_scores",
    "ablations",
    "aggregate_estimates",
    "aggregate_scores",
    "area_under_curve",
    "build_report",
    "common_grid",
    "curve_iqm",
    "figure_ablation",
    "figure_aggregates",
    "figure_fractions",
    "figure_iqm_vs_k",
    "figure_performance_profiles",
    "figure_returns",
    "figure_robustness",
    "figure_sample_efficiency",
    "figure_tv",
    "final_score",
    "fraction_table",
    "iqm_against_k",
    "iqm_estimates",
    "iqm_of",
    "is_variant",
    "distinct_resamples",
    "paired_bootstrap",
    "paired_cells",
    "robustness",
    "load_runs",
    "log_report",
    "main",
    "normalization_bounds",
    "normalize",
    "performance_profiles",
    "profiles",
    "improvement_baseline",
    "probability_of_improvement",
    "read_runs",
    "resample",
    "runs_frame",
    "runs_from_frame",
    "runs_to_frame",
    "sample_efficiency",
    "save_runs",
    "score_matrix",
    "tv_table",
    "write_report",
]
