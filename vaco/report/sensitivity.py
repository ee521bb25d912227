"""Does a verdict depend on how the runs were scored? The difference of drops under every scoring.

The robustness section decides each difference of drops (:mod:`~vaco.report.robustness`) on one
scoring, declared before the data (``vaco report --score``). This module recomputes every such
difference, with its verdict, under each combination of

* **score**: ``final`` (the last evaluation), ``last-n`` (the mean of the last n evaluations) and
  ``auc`` (the normalised curve's mean over training);
* **aggregate**: ``IQM`` (the paper's) and ``mean``;
* **scale**: ``min-max`` (the paper's ``(x - min) / (max - min)`` per task, min and max over the
  main algorithms' runs, or the report's fixed bounds where it has them) and ``floor-free`` (``x / max`` per task: the same top, no floor, so runs
  that collapse do not define zero),

and flags a comparison whose verdict word changes across them as **scale-dependent**. With the
2x2 step-size design (two ``--step-pairs``, :mod:`~vaco.report.design`), its five contrasts get the
same treatment (:func:`design_rows`), on the same cells and seeds as the design's headline. Every
scoring is resampled with the same paired bootstrap draws as the headline, so the row of the
declared scoring reproduces the robustness section's interval exactly.

As a cross-check that does not aggregate at all, a two-way linear model (statsmodels OLS) per
comparison: ``score ~ C(algorithm) * C(lagged) + C(unit)``, one unit per (task, seed) pair (the
paired runs share initial weights and environment seeds, so the unit absorbs seed and task
effects); its interaction coefficient is the difference of mean drops, with a t-test.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from vaco.report.decision import Verdict, decide
from vaco.report.design import CONTRASTS, WEIGHTS, Design, design_cells
from vaco.report.robustness import Robustness, iqm, paired_bootstrap, paired_cells
from vaco.report.scores import (
    SCORES,
    Report,
    area_under_curve,
    final_score,
    is_variant,
    normalization_bounds,
    normalize,
)

__all__ = [
    "DROP_AGGREGATES",
    "DEFAULT_LAST_N",
    "SCALES",
    "ModelFit",
    "design_rows",
    "Sensitivity",
    "SensitivityRow",
    "interaction_model",
    "run_scores",
    "sensitivity",
]

DROP_AGGREGATES = ("IQM", "mean")
SCALES = ("min-max", "floor-free")
DEFAULT_LAST_N = 3  # the last-n score's n when the report's own score is not last-n


#: each aggregate over the last two axes (seeds x tasks), for every leading (resample) index
_AGGREGATE = {"IQM": iqm, "mean": lambda x: np.mean(x, axis=(-2, -1))}


@dataclasses.dataclass
class SensitivityRow:
    """One comparison under one scoring."""

    algorithm: str
    baseline: str
    K: int
    score: str
    aggregate: str
    scale: str
    difference: float  # drop(baseline) - drop(algorithm)
    interval: tuple[float, float] | None
    verdict: Verdict
    declared: bool  # the report's own scoring (the headline)


@dataclasses.dataclass
class ModelFit:
    """The two-way model's interaction term for one comparison (declared score and scale)."""

    algorithm: str
    baseline: str
    K: int
    estimate: float  # = difference of the mean drops
    se: float
    t: float
    p: float
    low: float  # 95% confidence interval
    high: float
    observations: int


@dataclasses.dataclass
class Sensitivity:
    rows: list[SensitivityRow]
    models: list[ModelFit]
    last_n: int
    notes: list[str]
    #: the 2x2 design's contrasts under every scoring (``algorithm``: the contrast's name, ``baseline``: "")
    design: list[SensitivityRow] = dataclasses.field(default_factory=list)

    def scale_dependent(self, design: bool = False) -> dict[tuple[str, int], list[str]]:
        """(comparison, K) -> its verdict words in scoring order, for the comparisons whose word changes
        (``design``: the 2x2 contrasts' instead of the differences of drops)."""
        words: dict[tuple[str, int], list[str]] = defaultdict(list)
        for r in self.design if design else self.rows:
            words[(r.algorithm, r.K)].append(r.verdict.word)
        return {key: w for key, w in words.items() if len(set(w)) > 1}

    def under_holm(self, alpha: float = 0.05) -> list[tuple[float | None, float | None, str | None]]:
        """Every verdict of the table (:attr:`rows`, then :attr:`design`) re-decided with Holm's
        correction over the whole table at family-wise level ``alpha``: per row, its Holm-adjusted p
        of "no difference", of the equivalence test, and its word (``differs`` where the first is at
        most ``alpha``, else ``equivalent`` where the second is, else ``undecided``; None without a
        p-value). The table decides each row at ``alpha`` alone; this is what survives the count."""
        from vaco.report.decision import holm

        rows = [*self.rows, *self.design]
        tested = [
            i for i, r in enumerate(rows) if r.verdict.p_differs is not None and r.verdict.p_equivalent is not None
        ]
        _, p_d = holm([rows[i].verdict.p_differs for i in tested], alpha) if tested else (None, [])
        _, p_e = holm([rows[i].verdict.p_equivalent for i in tested], alpha) if tested else (None, [])
        out: list[tuple[float | None, float | None, str | None]] = [(None, None, None)] * len(rows)
        for i, d, e in zip(tested, p_d, p_e):
            word = "differs" if d <= alpha else "equivalent" if e <= alpha else "undecided"
            out[i] = (d, e, word)
        return out

    def holm_counts(self, alpha: float = 0.05) -> dict[str, tuple[int, int]]:
        """word -> (rows with that word at ``alpha`` alone, rows keeping it under :meth:`under_holm`)."""
        rows = [*self.rows, *self.design]
        counts: dict[str, tuple[int, int]] = {}
        for row, (_, _, word) in zip(rows, self.under_holm(alpha)):
            alone, kept = counts.get(row.verdict.word, (0, 0))
            counts[row.verdict.word] = (alone + 1, kept + int(word == row.verdict.word))
        return counts

    def frame(self):
        """One row per (comparison, scoring): the difference of drops, its interval and verdict,
        its p-values and their Holm adjustment over the whole table (:meth:`under_holm`)."""
        import pandas as pd

        corrected = self.under_holm()
        return pd.DataFrame(
            [
                {
                    "algorithm": r.algorithm,
                    "baseline": r.baseline,
                    "K": r.K,
                    "score": r.score,
                    "aggregate": r.aggregate,
                    "scale": r.scale,
                    "difference": r.difference,
                    "low": r.interval[0] if r.interval else math.nan,
                    "high": r.interval[1] if r.interval else math.nan,
                    "verdict": r.verdict.word,
                    "seeds_needed": r.verdict.seeds_needed,
                    "declared": r.declared,
                    "p_differs": r.verdict.p_differs,
                    "p_equivalent": r.verdict.p_equivalent,
                    "p_differs_holm": holm_d,
                    "p_equivalent_holm": holm_e,
                    "verdict_holm": word,
                }
                for r, (holm_d, holm_e, word) in zip([*self.rows, *self.design], corrected)
            ]
        )


def run_scores(report: Report, score: str, scale: str, last_n: int) -> tuple[dict[str, float], list[str]]:
    """Every run's score under one scoring: run_id -> value, and notes on what could not be scaled.

    ``final`` and ``last-n`` are scaled by their own per-task min and max (over the runs the report
    normalises by: the main algorithms at the reference axis values, or every run with
    ``--normalize-over all``); ``auc`` by the final score's, as the report's curves are. Where the
    report's bounds are fixed numbers (``report.scale``: a plan's references, or an accuracy scored
    as it is) every score is scaled by them, so the declared scoring's row is the headline's.
    """
    notes: list[str] = []
    if score not in SCORES or scale not in SCALES:
        raise ValueError(f"unknown scoring {score!r} / {scale!r}")
    raw_end = {r.run_id: final_score(r.score()[1], last_n if score == "last-n" else 1) for r in report.runs}
    by_task: dict[str, list[float]] = defaultdict(list)
    for r in report.runs:
        if report.normalization == "all" or (report.is_reference(r) and not is_variant(r.algorithm, r.variant_of)):
            by_task[r.env].append(raw_end[r.run_id])
    for r in report.runs:  # a task with no main-algorithm run: over all its runs, as build_report does
        if r.env not in by_task:
            by_task[r.env] = [raw_end[q.run_id] for q in report.runs if q.env == r.env]
    bounds = normalization_bounds(by_task)
    if report.scale != "runs":  # fixed numbers (a plan's references, an accuracy's [0, 1]): the same for every score
        bounds = {task: report.bounds.get(task, b) for task, b in bounds.items()}
    if scale == "floor-free":
        bad = sorted(t for t, (_, high) in bounds.items() if not high > 0)
        if bad:
            notes.append(f"floor-free scale undefined on {', '.join(bad)} (best score <= 0); min-max used there")

    def scaled(values, task):
        low, high = bounds[task]
        if scale == "floor-free" and high > 0:
            return np.asarray(values, dtype=np.float64) / high
        return normalize(values, (low, high))

    out = {}
    for r in report.runs:
        if score == "auc":
            steps, values = r.score()
            out[r.run_id] = area_under_curve(steps, scaled(values, r.env))
        else:
            out[r.run_id] = float(scaled(raw_end[r.run_id], r.env))
    return out, notes


def _declared(report: Report) -> tuple[str, str, str]:
    return report.score, "IQM", "min-max"


def _scorings(report: Report, last_n: int) -> tuple[dict[tuple[str, str], dict[str, float]], list[str]]:
    """Every run's score under each (score, scale): the inputs of every row."""
    values, notes = {}, []
    for score in SCORES:
        for scale in SCALES:
            values[(score, scale)], more = run_scores(report, score, scale, last_n)
            notes.extend(n for n in more if n not in notes)
    return values, notes


_COMBOS = [(s, a, c) for s in SCORES for a in DROP_AGGREGATES for c in SCALES]


def sensitivity(
    report: Report,
    found: Robustness,
    last_n: int | None = None,
    design: Design | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Sensitivity:
    """Every difference of drops in ``found`` (the robustness section) under every scoring, and the
    two-way model's interaction for each; with ``design`` (:func:`vaco.report.design.two_by_two`),
    its contrasts under every scoring too (:func:`design_rows`). ``progress(done, total)`` is called
    before each comparison and at the end."""
    last_n = last_n or (report.last_evals if report.score == "last-n" else DEFAULT_LAST_N)
    combos = _COMBOS
    values, notes = _scorings(report, last_n)
    rows: list[SensitivityRow] = []
    models: list[ModelFit] = []
    k_ref = found.k_ref
    offset = {key: 4 * i for i, key in enumerate(values)}  # where each scoring's four cells sit in ``flat``
    total = len(found.interactions)
    for done, ((algo, K), headline) in enumerate(found.interactions.items()):
        if progress is not None:
            progress(done, total)
        baseline = headline.baseline
        cells = [(algo, k_ref), (algo, K), (baseline, k_ref), (baseline, K)]
        tasks = [t for t in report.tasks if all(found.seeds.get((a, k, t)) for a, k in cells)]
        stacks = {key: paired_cells(report, cells, tasks, v)[0] for key, v in values.items()}
        n = stacks[(report.score, "min-max")][0].shape[0]
        if n == 0:
            continue

        def all_scorings(*flat):
            out = []
            for score, agg, scale in combos:
                start = offset[(score, scale)]
                xr, xk, yr, yk = flat[start : start + 4]
                f = _AGGREGATE[agg]
                out.append((f(yr) - f(yk)) - (f(xr) - f(xk)))
            return np.stack(out, axis=-1)

        flat = [m for key in values for m in stacks[key]]
        point = all_scorings(*flat)
        samples = paired_bootstrap(flat, all_scorings, report.reps, report.seed) if n >= report.min_runs else None
        for j, (score, agg, scale) in enumerate(combos):
            xr, xk, yr, yk = stacks[(score, scale)]
            column = None if samples is None else samples[:, j]
            verdict = decide(float(point[j]), (yr - yk) - (xr - xk), report.margin, column, report.seed)
            interval = None if column is None else tuple(float(v) for v in np.percentile(column, [2.5, 97.5]))
            rows.append(
                SensitivityRow(
                    algo,
                    baseline,
                    K,
                    score,
                    agg,
                    scale,
                    float(point[j]),
                    interval,
                    verdict,
                    (score, agg, scale) == _declared(report),
                )
            )
        models.append(interaction_model(stacks[(report.score, "min-max")], tasks, algo, baseline, K))
    if progress is not None:
        progress(total, total)
    return Sensitivity(rows, models, last_n, notes, design_rows(report, design, values) if design else [])


def design_rows(
    report: Report, design: Design, values: dict[tuple[str, str], dict[str, float]] | None = None
) -> list[SensitivityRow]:
    """The 2x2 design's contrasts under every scoring: per K, the eight cells and paired seeds of
    :func:`vaco.report.design.two_by_two`, each scoring's IQM (or mean) drops combined by the
    contrasts' weights, resampled with one paired bootstrap (the same draws as the design's
    headline, so the declared scoring's row is its interval) and decided by the same rule.
    ``values``: the runs' scores per (score, scale), if computed already."""
    if values is None:
        values, _ = _scorings(report, report.last_evals if report.score == "last-n" else DEFAULT_LAST_N)
    weights = WEIGHTS  # contrasts x (filter_L, clip_L, filter_S, clip_S)
    keys = list(values)
    rows: list[SensitivityRow] = []
    for K in dict.fromkeys(c.K for c in design.contrasts):
        cells, tasks = design_cells(report, design, K)
        stacks = {key: paired_cells(report, cells, tasks, v)[0] for key, v in values.items()}
        n = stacks[keys[0]][0].shape[0]

        def all_scorings(*flat):
            out = []
            for score, agg, scale in _COMBOS:
                start = 8 * keys.index((score, scale))
                f = _AGGREGATE[agg]
                drops = np.stack([f(flat[start + 2 * i]) - f(flat[start + 2 * i + 1]) for i in range(4)], axis=-1)
                out.append(drops @ weights.T)
            return np.concatenate(out, axis=-1)

        flat = [m for key in keys for m in stacks[key]]
        point = all_scorings(*flat)
        samples = paired_bootstrap(flat, all_scorings, report.reps, report.seed) if n >= report.min_runs else None
        j = 0
        for score, agg, scale in _COMBOS:
            mats = stacks[(score, scale)]
            per_seed = np.stack([mats[2 * i] - mats[2 * i + 1] for i in range(4)], axis=-1) @ weights.T
            for c, name in enumerate(CONTRASTS):
                column = None if samples is None else samples[:, j]
                verdict = decide(float(point[j]), per_seed[:, :, c], report.margin, column, report.seed)
                interval = None if column is None else tuple(float(v) for v in np.percentile(column, [2.5, 97.5]))
                declared = (score, agg, scale) == _declared(report)
                rows.append(
                    SensitivityRow(name, "", K, score, agg, scale, float(point[j]), interval, verdict, declared)
                )
                j += 1
    return rows


def interaction_model(cells, tasks, algo: str, baseline: str, K: int) -> ModelFit:
    """OLS ``score ~ C(algorithm) * C(lagged) + C(unit)`` on the four paired (seeds x tasks) cells
    (``algo`` at K_ref and K, ``baseline`` at K_ref and K), unit = (task, seed). The interaction
    coefficient is signed as the difference of drops: positive when ``algo`` loses less."""
    import pandas as pd
    import statsmodels.formula.api as smf

    rows = []
    for cell, (is_algo, lagged) in zip(cells, [(1, 0), (1, 1), (0, 0), (0, 1)]):
        for i in range(cell.shape[0]):
            for j, task in enumerate(tasks):
                rows.append({"score": cell[i, j], "algo": is_algo, "lagged": lagged, "unit": f"{task}/{i}"})
    frame = pd.DataFrame(rows)
    fit = smf.ols("score ~ C(algo) * C(lagged) + C(unit)", data=frame).fit()
    term = "C(algo)[T.1]:C(lagged)[T.1]"
    low, high = (float(v) for v in fit.conf_int().loc[term])
    return ModelFit(
        algo,
        baseline,
        K,
        float(fit.params[term]),
        float(fit.bse[term]),
        float(fit.tvalues[term]),
        float(fit.pvalues[term]),
        low,
        high,
        int(fit.nobs),
    )
