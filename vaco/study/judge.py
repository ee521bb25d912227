"""The report judges a declared study plan (:mod:`vaco.study.plan`): its primary family of
difference-of-drops comparisons, at the look the data has reached, by the group-sequential Holm
procedure; everything else in the report is exploratory.

For each comparison (``arm`` against ``against`` at ``K``: ``drop(against) - drop(arm)``, positive
when the arm loses less) it shows the IQM estimate with its interval, the untrimmed mean contrast
beside it, its **split** into the gap at K (``IQM(arm, K) - IQM(against, K)``) and the gap at
``K_ref`` (``IQM(against, K_ref) - IQM(arm, K_ref)``: a difference of drops can come from an arm
that started lower), the p of "no difference" and of the equivalence test (TOST against the plan's
margin) with the level each met at its Holm step, and the seeds per task that would decide it. A
verdict is **differs** where the step-down on the "no difference" p rejects, else **equivalent**
where the step-down on the TOST p does, else **undecided**. A plan with a ``floor`` reports a
comparison whose arms both score below it at K as **at the floor: uninformative**: it is not judged
(its p counts as 1, so it keeps its share of alpha and frees none for the others).

**The looks are the ones taken.** Every judgement of a declared plan (each look of ``vaco sweep
--until-decided``, each ``vaco report`` of the experiment) is recorded on the sweep's parent run
(:func:`record_judgement`): when, at how many seeds, by which command, and what it decided. A
judgement is made against the boundary for the looks taken before it, itself, and the declared looks
still ahead (:func:`vaco.study.plan.schedule`), and a comparison decided at an earlier look keeps
that verdict (its alpha passes to the others). Before the first declared look nothing is decided.

A plan read from the experiment's parent run (declared with the sweep) carries the time it was
declared and the commit of its sweep file; a plan given as a file whose digest the experiment did
not record was written after the runs, and its verdicts are labelled exploratory.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from vaco.files import write_text_atomic
from vaco.report.decision import seeds_needed
from vaco.report.robustness import difference_of_drops
from vaco.study.plan import TESTS, Comparison, StudyPlan, holm_levels, schedule, sequential_holm
from vaco.tracking import PARENT_TAG, PLAN_TAG

__all__ = [
    "Judgement",
    "PlanJudgement",
    "PlannedVerdict",
    "declared_plan",
    "judge_plan",
    "plan_from_tags",
    "plan_lines",
    "plan_tags",
    "read_judgements",
    "read_record",
    "record_judgement",
    "record_path",
    "write_record",
]

DECIDED = ("differs", "equivalent")
FLOOR_WORD = "at the floor: uninformative"


@dataclasses.dataclass(frozen=True)
class Judgement:
    """One recorded reading of a plan: when, at how many seeds, by what, and what it decided."""

    seeds: int
    at: str  # UTC time
    by: str  # "until-decided" | "report"
    words: dict[str, str]  # comparison label -> verdict word

    def as_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


@dataclasses.dataclass(frozen=True)
class PlannedVerdict:
    comparison: Comparison
    seeds: int
    estimate: float
    interval: tuple[float, float] | None
    mean_estimate: float
    gap_at_k: float  # IQM(arm, K) - IQM(against, K)
    gap_at_ref: float  # IQM(against, K_ref) - IQM(arm, K_ref); estimate = gap_at_k + gap_at_ref
    levels_at_k: tuple[float, float]  # IQM(arm, K), IQM(against, K)
    p_differs: float
    level_differs: float  # the level this p met (or would have met) at its Holm step
    p_equivalent: float
    level_equivalent: float
    word: str
    seeds_needed: int | None
    method: str
    decided_at: int | None = None  # seeds of the earlier look that decided it (None: this look, or not decided)
    per_task: tuple[tuple[str, float, float], ...] = ()  # (task, IQM, untrimmed mean): sensitivity, not verdicts
    other_tests: tuple[tuple[str, float, float], ...] = ()  # (test, p, TOST p) by each test the plan did not declare
    pooled: float | None = None  # the pooled IQM estimate, beside a task-mean plan's (sensitivity)


@dataclasses.dataclass(frozen=True)
class _View:
    """A comparison as the plan's estimand sees it (:func:`_view`)."""

    estimate: float
    interval: tuple[float, float] | None
    mean_estimate: float
    gap_at_k: float
    gap_at_ref: float
    levels_at_k: tuple[float, float]  # (arm, against) at K: the report's IQM, or the mean of each task's


@dataclasses.dataclass(frozen=True)
class PlanJudgement:
    plan: StudyPlan
    declared: str | None  # when the plan was declared (None: after the runs)
    seeds: int  # the fewest seeds any primary comparison has
    look: int | None  # this look's index in ``looks`` (None: before the first declared look)
    looks: tuple[int, ...]  # the schedule judged against: looks taken, this one, the declared ones ahead
    verdicts: list[PlannedVerdict]
    missing: list[str]  # comparisons the data cannot form
    reps: int = 2000  # the report's bootstrap resamples (its smallest p is 2 / (reps + 1))
    commit: str | None = None  # the commit of the sweep file when the plan was declared
    excluded: int = 0  # runs left out for a non-finite score

    @property
    def exploratory(self) -> bool:
        return self.declared is None

    @property
    def level(self) -> float | None:
        """This look's nominal level for one hypothesis at alpha (the last Holm step's)."""
        if self.look is None:
            return None
        return holm_levels(self.looks, self.plan.alpha, self.plan.spending, 1)[0][self.look]

    @property
    def settled(self) -> bool:
        """Whether more seeds can change nothing the plan asks: every comparison decided or at the floor."""
        return not self.missing and all(v.word in (*DECIDED, FLOOR_WORD) for v in self.verdicts)

    @property
    def open(self) -> list[Comparison]:
        """The comparisons more seeds can still decide: undecided, not yet at a look, or not in the data."""
        shut = {v.comparison for v in self.verdicts if v.word in (*DECIDED, FLOOR_WORD)}
        return [c for c in self.plan.family if c not in shut]

    def record(self, by: str) -> Judgement:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return Judgement(self.seeds, now, by, {v.comparison.label(): v.word for v in self.verdicts})


def judge_plan(
    plan: StudyPlan,
    report,
    declared: str | None,
    earlier: Sequence[Judgement] | None = None,
    commit: str | None = None,
) -> PlanJudgement:
    """Judge ``plan``'s family on ``report``'s runs (see the module docstring). ``earlier``: the
    plan's recorded judgements before this one (their seed counts are looks taken; their decisions
    stand); None where there is no record (a plan given as a file): every declared look below the
    data's seeds is then taken to have happened."""
    # every arm the plan names, variants and controls included (the robustness section's
    # comparisons are the main algorithms' only): its runs' cells, counted as the report counts them
    counts: dict[tuple[str, int, str], int] = defaultdict(int)
    for run in report.runs:
        counts[(run.algorithm, run.K, run.env)] += 1
    k_ref = min(run.K for run in report.runs) if report.runs else 1
    found, missing, notes, tests, views = {}, [], [], {}, {}
    for comparison in plan.family:
        interaction = difference_of_drops(
            report, comparison.arm, comparison.against, k_ref, comparison.K, counts, notes, runs=report.runs
        )
        if interaction is None or interaction.verdict is None or interaction.verdict.p_differs is None:
            missing.append(comparison.label())
        else:
            found[comparison] = interaction
            tests[comparison] = _tests(plan, interaction, report.seed, report.reps)
            views[comparison] = _view(plan, interaction, report.seed, report.reps)
    seeds = _look_seeds(plan, found, earlier)
    taken = [n for n in plan.looks if n < seeds] if earlier is None else [j.seeds for j in earlier]
    earlier = earlier or ()
    looks, look = schedule(plan.looks, taken, seeds)
    m = len(plan.family)
    levels = holm_levels(looks, plan.alpha, plan.spending, m)

    def at_floor(c: Comparison) -> bool:
        arm, against = views[c].levels_at_k
        return plan.floor is not None and arm < plan.floor and against < plan.floor

    # the family in declared order; a comparison missing from the data or at the floor has p = 1
    p_d = [tests[c][plan.test][0] if c in found and not at_floor(c) else 1.0 for c in plan.family]
    p_e = [tests[c][plan.test][1] if c in found and not at_floor(c) else 1.0 for c in plan.family]
    decided_before: dict[str, tuple[str, int]] = {}
    for j in sorted(earlier, key=lambda j: j.seeds):
        if j.seeds >= plan.looks[0] and j.seeds < seeds:
            for label, word in j.words.items():
                if word in DECIDED and label not in decided_before:
                    decided_before[label] = (word, j.seeds)
    before_d = [decided_before.get(c.label(), ("",))[0] == "differs" for c in plan.family]
    before_e = [decided_before.get(c.label(), ("",))[0] == "equivalent" for c in plan.family]
    if look is not None:
        rejected_d = sequential_holm(p_d, levels, look, before_d)
        rejected_e = sequential_holm(p_e, levels, look, before_e)
    else:
        rejected_d = rejected_e = [False] * m
    step_d, step_e = _step_levels(p_d, before_d, levels, look), _step_levels(p_e, before_e, levels, look)
    verdicts = []
    for idx, comparison in enumerate(plan.family):
        i = found.get(comparison)
        if i is None:
            continue
        earlier_word = decided_before.get(comparison.label())
        if earlier_word is not None:
            word, decided_at = earlier_word
        elif look is None:
            word, decided_at = "before the first look", None
        elif at_floor(comparison):
            word, decided_at = FLOOR_WORD, None
        elif rejected_d[idx]:
            word, decided_at = "differs", None
        elif rejected_e[idx]:
            word, decided_at = "equivalent", None
        else:
            word, decided_at = "undecided", None
        view = views[comparison]
        declared_p, declared_tost, method = tests[comparison][plan.test]
        others = tuple((name, *tests[comparison][name][:2]) for name in TESTS if name != plan.test)
        verdicts.append(
            PlannedVerdict(
                comparison,
                i.seeds,
                view.estimate,
                view.interval,
                view.mean_estimate,
                view.gap_at_k,
                view.gap_at_ref,
                view.levels_at_k,
                declared_p,
                step_d[idx],
                declared_tost,
                step_e[idx],
                word,
                _seeds_needed(i, plan.margin, step_d[idx]) if word == "undecided" else None,
                method,
                decided_at,
                i.per_task,
                others,
                None if plan.estimand == "pooled" else i.difference,
            )
        )
    return PlanJudgement(
        plan, declared, seeds, look, tuple(looks), verdicts, missing, report.reps, commit, len(report.excluded)
    )


def _seeds_needed(interaction, margin: float, level: float) -> int | None:
    """Seeds a task that would decide an undecided comparison at 80% power at the level the plan's
    rule holds it to at this look (its Holm step's), not at 0.05: the report's normal approximation
    (:func:`vaco.report.decision.seeds_needed`) on its paired seeds' spread."""
    if interaction.cells is None or not level > 0:
        return None
    xr, xk, yr, yk = (np.asarray(c, dtype=np.float64) for c in interaction.cells)
    paired = (yr - yk) - (xr - xk)
    needed = seeds_needed(paired, interaction.difference, margin, alpha=level)
    return None if needed is None else max(needed, interaction.seeds + 1)


def _view(plan: StudyPlan, interaction, seed: int, reps: int) -> _View:
    """The comparison's estimate, interval, untrimmed-mean estimate, split and levels at K for the plan's
    estimand: the report's pooled IQMs, or (``task-mean``) each task's IQMs over its seeds averaged over
    the tasks, with the percentile interval of ``reps`` paired, task-stratified resamples."""
    i = interaction
    if plan.estimand == "pooled":
        interval = None if i.difference_interval is None else tuple(float(b) for b in i.difference_interval)
        return _View(i.difference, interval, i.mean_difference, i.gap_at_k, i.gap_at_ref, (i.levels[1], i.levels[3]))
    from vaco.report.robustness import iqm
    from vaco.study.randomisation import bootstrap_samples

    cells = [np.asarray(c, dtype=np.float64) for c in i.cells]  # (seeds, tasks): arm at K_ref, K; against
    level = [float(iqm(c.T[..., None]).mean()) for c in cells]  # each task's IQM over its seeds, averaged
    mean = [float(c.mean(axis=0).mean()) for c in cells]
    samples = bootstrap_samples(cells, reps, seed, plan.estimand)
    low, high = np.percentile(samples, [2.5, 97.5])
    gap_k, gap_ref = level[1] - level[3], level[2] - level[0]
    return _View(
        gap_k + gap_ref,
        (float(low), float(high)),
        (mean[1] - mean[3]) + (mean[2] - mean[0]),
        gap_k,
        gap_ref,
        (level[1], level[3]),
    )


def _tests(plan: StudyPlan, interaction, seed: int, reps: int) -> dict[str, tuple[float, float, str]]:
    """Every plan test's (p, TOST p, method) for one comparison: the declared one judges it, the others
    are shown beside it as sensitivity. The bootstrap's is the report's verdict (sign flips below
    :data:`~vaco.report.decision.PERMUTATION_BELOW` seeds) for the pooled estimand, the percentile
    bootstrap of ``reps`` resamples for the task-mean one; the randomisation test and the bootstrap-t
    run on the same paired cells (:mod:`vaco.study.randomisation`)."""
    from vaco.study.randomisation import SWAPS, bootstrap_p, bootstrap_t_p, randomisation_p

    v, e = interaction.verdict, plan.estimand
    p, tost, exact = randomisation_p(interaction.cells, plan.margin, SWAPS, seed, estimand=e)
    p_t, tost_t = bootstrap_t_p(interaction.cells, plan.margin, SWAPS, seed, estimand=e)
    swaps = "every swap pattern" if exact else f"{SWAPS} random swap patterns"
    boot = (v.p_differs, v.p_equivalent, v.method)
    if e != "pooled":
        boot = (*bootstrap_p(interaction.cells, plan.margin, reps, seed, estimand=e), f"bootstrap ({reps} resamples)")
    return {
        "bootstrap": boot,
        "randomisation": (p, tost, f"randomisation ({swaps}, studentised)"),
        "randomisation+bootstrap-t": (
            max(p, p_t),
            max(tost, tost_t),
            f"randomisation ({swaps}, studentised) and bootstrap-t ({SWAPS} resamples), the larger p",
        ),
    }


def _look_seeds(plan: StudyPlan, found: Mapping[Comparison, object], earlier: Sequence[Judgement] | None) -> int:
    """The seeds of this look: the fewest any comparison has that an earlier look left open. A
    comparison decided at an earlier look needs no more seeds (``vaco sweep --until-decided`` runs
    only the cells the open ones need), so its count does not hold the look back."""
    if not found:
        return 0
    most = max(i.seeds for i in found.values())
    closed = {
        label
        for j in earlier or ()
        if plan.looks[0] <= j.seeds < most
        for label, word in j.words.items()
        if word in DECIDED
    }
    still_open = [i.seeds for c, i in found.items() if c.label() not in closed]
    return min(still_open or [i.seeds for i in found.values()])


def _step_levels(p: Sequence[float], rejected: Sequence[bool], levels, look: int | None) -> list[float]:
    """The level each open hypothesis meets at its rank in the step-down (0: none, before the first look)."""
    out = [0.0] * len(p)
    if look is None:
        return out
    open_ = sorted((i for i in range(len(p)) if not rejected[i]), key=lambda i: (p[i], i))
    for rank, i in enumerate(open_):
        out[i] = levels[len(open_) - rank - 1][look]
    return out


def plan_lines(judgement: PlanJudgement) -> list[str]:
    """The plan's verdicts as the report prints them (and writes to ``plan.md``)."""
    plan = judgement.plan
    if judgement.declared:
        when = f"declared {judgement.declared}" + (
            f", its sweep file at commit {judgement.commit}" if judgement.commit else ""
        )
    else:
        when = "declared after the runs: its verdicts are exploratory"
    looks = ", ".join(map(str, judgement.looks))
    if judgement.look is None:
        at = f"before its first look ({plan.looks[0]} seeds; the data has {judgement.seeds})"
    else:
        at = (
            f"look {judgement.look + 1} of {len(judgement.looks)} ({judgement.seeds} seeds), {plan.spending} "
            f"boundary over the looks {looks}"
        )
    lines = [
        f"study plan {plan.digest} ({when}): a family of {len(plan.family)}, group-sequential Holm at {at}, margin "
        f"{plan.margin:g}, alpha {plan.alpha:g}, {plan.score} score, {plan.test} test"
        + (
            ", each task weighed alike (the mean of the tasks' differences of drops)"
            if plan.estimand != "pooled"
            else ""
        )
        + (f", floor {plan.floor:g}" if plan.floor is not None else "")
    ]
    if judgement.look is not None and tuple(judgement.looks) != tuple(plan.looks):
        lines.append(
            f"  the looks differ from the declared ones ({', '.join(map(str, plan.looks))}): the boundary is the one for "
            f"the looks taken ({', '.join(map(str, judgement.looks[: judgement.look + 1]))}) and those still ahead"
        )
    for v in judgement.verdicts:
        interval = "" if v.interval is None else f" [{v.interval[0]:.3f}, {v.interval[1]:.3f}]"
        needed = f" (seeds a task needed at level {v.level_differs:.3g}: {v.seeds_needed})" if v.seeds_needed else ""
        at_earlier = f" (decided at the {v.decided_at}-seed look)" if v.decided_at else ""
        tests = (
            f"p {v.p_differs:.3g} (Holm step level {v.level_differs:.3g}), TOST p {v.p_equivalent:.3g} "
            f"(level {v.level_equivalent:.3g})"
            if judgement.look is not None and not v.decided_at
            else f"p {v.p_differs:.3g}, TOST p {v.p_equivalent:.3g}"  # before the first look, or decided earlier
        )
        lines.append(
            f"  {v.comparison.label()}: drop({v.comparison.against}) - drop({v.comparison.arm}) {v.estimate:+.3f}{interval}"
            f" (untrimmed mean {v.mean_estimate:+.3f}) = gap at K {v.gap_at_k:+.3f} + gap at K=1 {v.gap_at_ref:+.3f}; "
            f"IQM at K {v.levels_at_k[0]:.3f} / {v.levels_at_k[1]:.3f}; {v.seeds} seeds, {v.method}: {tests} -> "
            f"**{v.word}**{at_earlier}{needed}"
        )
        if v.other_tests:
            said = "; ".join(f"{name} p {p:.3g}, TOST p {tost:.3g}" for name, p, tost in v.other_tests)
            lines.append(f"    sensitivity, not verdicts: the other tests give {said}")
        if v.pooled is not None:
            lines.append(
                f"    sensitivity, not a verdict: one IQM over every seed and task (pooled) gives {v.pooled:+.3f}"
            )
        if len(v.per_task) > 1:  # what the pooled statistic rests on
            split = "; ".join(f"{task} {iqm:+.3f} (mean {mean:+.3f})" for task, iqm, mean in v.per_task)
            lines.append(f"    sensitivity, not a verdict: each task alone, IQM (untrimmed mean): {split}")
    lines += [f"  {label}: not in the data (no seed has runs in all four cells)" for label in judgement.missing]
    if judgement.excluded:
        lines.append(f"  {judgement.excluded} runs left out for a non-finite score (the report's notes name them)")
    floor = 2 / (judgement.reps + 1)
    smallest = min((v.level_differs for v in judgement.verdicts if v.level_differs > 0), default=0.0)
    if (
        smallest
        and plan.test == "bootstrap"
        and any(v.method == "bootstrap" for v in judgement.verdicts)
        and floor > smallest
    ):
        lines.append(
            f"  with {judgement.reps} bootstrap resamples the smallest p is {floor:.3g}: too coarse for the first Holm "
            f"step's level {smallest:.3g}; raise --reps (at least {int(2 / smallest) + 1})"
        )
    if plan.references:
        fixed = ", ".join(f"{task} [{low:g}, {high:g}]" for task, low, high in plan.references)
        lines.append(f"  scores normalised by the plan's fixed references: {fixed} (every section of this report)")
    lines.append("every other verdict of this report is exploratory (outside the declared family)")
    return lines


# ------------------------------------------------------------------------------ the record on the parent run
def read_judgements(tags: Mapping[str, str]) -> list[Judgement]:
    """The recorded judgements in a parent run's tags, oldest first."""

    prefix = f"{PLAN_TAG}.judgement."
    out = []
    for key in sorted(k for k in tags if k.startswith(prefix)):
        raw = json.loads(tags[key])
        out.append(Judgement(int(raw["seeds"]), str(raw["at"]), str(raw["by"]), dict(raw["words"])))
    return out


def record_judgement(uri: str, run_id: str, judged: PlanJudgement, by: str, lines: Sequence[str]) -> Judgement:
    """Keep a judgement on the sweep's parent run: a tag ``vaco.plan.judgement.NNN`` (JSON) and its
    lines as the artifact ``plan/judgementNNN.md``."""

    import mlflow

    client = mlflow.MlflowClient(uri)
    tags = client.get_run(run_id).data.tags
    number = len(read_judgements(tags)) + 1
    record = judged.record(by)
    client.set_tag(run_id, f"{PLAN_TAG}.judgement.{number:03d}", record.as_json()[:5000])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"judgement{number:03d}.md"
        path.write_text(f"{record.at}, {by}, {record.seeds} seeds\n\n" + "\n".join(lines) + "\n")
        client.log_artifact(run_id, str(path), artifact_path="plan")
    return record


def plan_from_tags(tags: Mapping[str, str]) -> StudyPlan:
    """The plan a parent run's (or a record's) ``vaco.plan`` tag holds."""
    from vaco.study.plan import load_plan

    raw = json.loads(tags[PLAN_TAG])
    algorithms = sorted({c[k] for c in raw["family"] for k in ("arm", "against")})
    return load_plan(
        raw, algorithms, sorted({c["K"] for c in raw["family"]}), seeds=raw["looks"][-1], default_test="bootstrap"
    )


def declared_plan(experiment: str, uri: str):
    """The plan the experiment's sweep declared, read off its parent run: ``(plan, declared, commit,
    judgements, run_id)``; ``(None, None, None, [], None)`` without one."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None, None, None, [], None
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1)
    tags = found[0].data.tags if found else {}
    if PLAN_TAG not in tags:
        return None, None, None, [], None
    return (
        plan_from_tags(tags),
        tags.get(f"{PLAN_TAG}.declared"),
        tags.get(f"{PLAN_TAG}.commit"),
        read_judgements(tags),
        found[0].info.run_id,
    )


# ------------------------------------------------------------------------------ the record beside a data file
RECORD_SUFFIX = "_record.json"


def record_path(data_path) -> Path:
    """Where the plan record of a data file lives: ``runs.csv.gz`` -> ``runs_record.json`` beside it."""
    data_path = Path(data_path)
    stem = data_path.name
    for ending in (".csv.gz", ".csv"):
        if stem.endswith(ending):
            stem = stem[: -len(ending)]
            break
    return data_path.with_name(stem + RECORD_SUFFIX)


def plan_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The tags of a parent run that are its plan's record: the plan, its digest, declaration, commit, judgements."""

    return {k: v for k, v in tags.items() if k == PLAN_TAG or k.startswith(PLAN_TAG + ".")}


def write_record(path, tags: Mapping[str, str], runs) -> Path:
    """Keep a declared plan's record beside an exported data file (``vaco report --save-data``, ``vaco
    sweep --save-data``; written atomically): the parent run's plan tags, and when the exported runs
    started. A study continued in a new store (``vaco sweep --finished-in``) carries it onto its new
    parent run."""
    starts = sorted(r.start_time for r in runs if r.start_time)
    when = (
        datetime.datetime.fromtimestamp(starts[0] / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if starts
        else None
    )
    record = {"parent_run_tags": plan_tags(tags), "finished_runs": sum(r.status == "FINISHED" for r in runs)}
    if when:
        record["first_run_start"] = when
    return write_text_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def read_record(path) -> dict[str, str]:
    """The plan tags a record file holds (JSON: nothing in it is executed); ValueError in one line naming the file."""

    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a plan record `vaco report --save-data` writes: {err}") from None
    tags = raw.get("parent_run_tags") if isinstance(raw, dict) else None
    if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise ValueError(f"{path}: `parent_run_tags` must map tag names to strings")
    tags = plan_tags(tags)
    for key in (PLAN_TAG, f"{PLAN_TAG}.digest", f"{PLAN_TAG}.declared"):
        if key not in tags:
            raise ValueError(f"{path}: the record has no `{key}` tag, so it cannot carry a declared plan")
    return tags
