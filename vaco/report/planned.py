"""The report judges a declared study plan (:mod:`vaco.report.plan`): its primary family of
difference-of-drops comparisons, at the look the data has reached, with Holm's correction at that
look's nominal level; everything else in the report is exploratory.

For each comparison (``arm`` against ``against`` at ``K``: ``drop(against) - drop(arm)``, positive
when the arm loses less) it shows the IQM estimate with its interval, the untrimmed mean contrast
beside it, the raw and Holm-adjusted p-values of "no difference" and of the equivalence test
(TOST against the plan's margin), and the seeds per task that would decide it. A verdict is
**differs** where the Holm-adjusted p of "no difference" is at most the look's level, else
**equivalent** where the Holm-adjusted TOST p is, else **undecided**. Before the first look, or at
a look that cannot decide (the ``fixed`` rule's early ones), nothing is decided.

A plan read from the experiment's parent run (declared with the sweep) carries the time it was
declared; a plan given as a file whose digest the experiment did not record was written after the
runs, and its verdicts are labelled exploratory.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from vaco.report.plan import Comparison, StudyPlan, holm
from vaco.report.robustness import difference_of_drops

__all__ = ["PlanJudgement", "PlannedVerdict", "judge_plan", "plan_lines"]


@dataclasses.dataclass(frozen=True)
class PlannedVerdict:
    comparison: Comparison
    seeds: int
    estimate: float
    interval: tuple[float, float] | None
    mean_estimate: float
    p_differs: float
    p_differs_holm: float
    p_equivalent: float
    p_equivalent_holm: float
    word: str
    seeds_needed: int | None
    method: str


@dataclasses.dataclass(frozen=True)
class PlanJudgement:
    plan: StudyPlan
    declared: str | None  # when the plan was declared (None: after the runs)
    seeds: int  # the fewest seeds any primary comparison has
    look: int | None  # the index of the look reached (None: before the first)
    level: float | None  # that look's nominal two-sided level
    verdicts: list[PlannedVerdict]
    missing: list[str]  # comparisons the data cannot form
    reps: int = 2000  # the report's bootstrap resamples (its smallest p is 2 / (reps + 1))

    @property
    def exploratory(self) -> bool:
        return self.declared is None


def judge_plan(plan: StudyPlan, report, declared: str | None) -> PlanJudgement:
    """Judge ``plan``'s family on ``report``'s runs (see the module docstring)."""
    # every arm the plan names, variants and controls included (the robustness section's
    # comparisons are the main algorithms' only): its runs' cells, counted as the report counts them
    seeds: dict[tuple[str, int, str], int] = defaultdict(int)
    for run in report.runs:
        seeds[(run.algorithm, run.K, run.env)] += 1
    k_ref = min(run.K for run in report.runs) if report.runs else 1
    found, missing, notes = [], [], []
    for comparison in plan.family:
        interaction = difference_of_drops(
            report, comparison.arm, comparison.against, k_ref, comparison.K, seeds, notes, runs=report.runs
        )
        if interaction is None or interaction.verdict is None or interaction.verdict.p_differs is None:
            missing.append(comparison.label())
        else:
            found.append((comparison, interaction))
    seeds = min((i.seeds for _, i in found), default=0)
    look = plan.look_of(seeds)
    level = plan.levels()[look] if look is not None else None
    _, adjusted_diff = holm([i.verdict.p_differs for _, i in found], level or 0.0) if found else (None, [])
    _, adjusted_eq = holm([i.verdict.p_equivalent for _, i in found], level or 0.0) if found else (None, [])
    verdicts = []
    for (comparison, i), p_d, p_e in zip(found, adjusted_diff, adjusted_eq):
        if not level:
            word = "not decided at this look" if look is not None else "before the first look"
        elif p_d <= level:
            word = "differs"
        elif p_e <= level:
            word = "equivalent"
        else:
            word = "undecided"
        interval = (
            None
            if i.difference_interval is None
            else (float(i.difference_interval[0]), float(i.difference_interval[1]))
        )
        verdicts.append(
            PlannedVerdict(
                comparison,
                i.seeds,
                i.difference,
                interval,
                i.mean_difference,
                i.verdict.p_differs,
                p_d,
                i.verdict.p_equivalent,
                p_e,
                word,
                i.verdict.seeds_needed if word == "undecided" else None,
                i.verdict.method,
            )
        )
    return PlanJudgement(plan, declared, seeds, look, level, verdicts, missing, report.reps)


def plan_lines(judgement: PlanJudgement) -> list[str]:
    """The plan's verdicts as the report prints them (and writes to ``plan.md``)."""
    plan = judgement.plan
    when = (
        f"declared {judgement.declared}"
        if judgement.declared
        else "declared after the runs: its verdicts are exploratory"
    )
    if judgement.look is None:
        at = f"before its first look ({plan.looks[0]} seeds; the data has {judgement.seeds})"
    else:
        at = (
            f"look {judgement.look + 1} of {len(plan.looks)} ({plan.looks[judgement.look]} seeds; the data has "
            f"{judgement.seeds}), {plan.spending} nominal level {judgement.level:.4g}"
        )
    lines = [
        f"study plan {plan.digest} ({when}): a family of {len(plan.family)}, Holm at {at}, margin {plan.margin:g}, "
        f"alpha {plan.alpha:g}, {plan.score} score"
    ]
    for v in judgement.verdicts:
        interval = "" if v.interval is None else f" [{v.interval[0]:.3f}, {v.interval[1]:.3f}]"
        needed = f" (seeds needed: {v.seeds_needed})" if v.seeds_needed else ""
        lines.append(
            f"  {v.comparison.label()}: drop({v.comparison.against}) - drop({v.comparison.arm}) {v.estimate:+.3f}{interval}"
            f" (untrimmed mean {v.mean_estimate:+.3f}), {v.seeds} seeds, {v.method}: p {v.p_differs:.3g} "
            f"(Holm {v.p_differs_holm:.3g}), TOST p {v.p_equivalent:.3g} (Holm {v.p_equivalent_holm:.3g}) -> "
            f"**{v.word}**{needed}"
        )
    lines += [f"  {label}: not in the data (no seed has runs in all four cells)" for label in judgement.missing]
    floor = 2 / (judgement.reps + 1)
    if judgement.level and any(v.method == "bootstrap" for v in judgement.verdicts):
        if floor * len(judgement.verdicts) > judgement.level:
            lines.append(
                f"  with {judgement.reps} bootstrap resamples the smallest p is {floor:.3g}: too coarse for Holm over "
                f"{len(judgement.verdicts)} at level {judgement.level:.3g}; raise --reps (at least "
                f"{int(2 * len(judgement.verdicts) / judgement.level)})"
            )
    if plan.references:
        fixed = ", ".join(f"{task} [{low:g}, {high:g}]" for task, low, high in plan.references)
        lines.append(f"  scores normalised by the plan's fixed references: {fixed} (every section of this report)")
    lines.append("every other verdict of this report is exploratory (outside the declared family)")
    return lines
