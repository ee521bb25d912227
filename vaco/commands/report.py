"""``vaco report``: MLflow runs -> normalised scores -> rliable aggregates, PNG figures, a Markdown summary.

    vaco report --experiment vaco-laptop [--out reports/vaco-laptop] [--reps 2000] [--save-data runs.csv.gz]
    vaco report --data docs/data/runs.csv.gz          # the same report from a data file, no MLflow store
    vaco report --data part1.csv.gz part2.csv.gz --tasks Hopper-v5 HalfCheetah-v5 --baseline ppo_clip

The protocol follows the paper's Experiments section and Agarwal et al. (2021), computed with
rliable itself (``library.get_interval_estimates``, ``metrics.aggregate_*``,
``library.create_performance_profile``, ``plot_utils``):

* score of a run, declared per study (``--score``): ``final``, the last ``eval/return`` (the
  return of the final policy, itself the mean over E evaluation episodes); ``last-n``, the mean of
  the last ``--last-evals`` n; or ``auc``, the normalised curve's mean over training. The
  robustness verdicts decide on it; a table recomputes each verdict under every score, aggregate
  (IQM, mean) and scale (min-max, floor-free) and flags the scale-dependent ones
  (:mod:`~vaco.report.sensitivity`, with a two-way statsmodels model as a cross-check);
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

The main comparison uses the runs at the reference value of each axis (the value most runs use,
unless ``--reference-delta``/``--reference-rho-bar`` is given). A group enters an aggregate only
if it has runs on every task of that figure; its runs per task are cut to its smallest count. A
group with fewer than ``min_runs`` (default 3) runs per task gets a point estimate and no
interval, and the summary says so.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vaco.files import load_yaml
from vaco.report.ablations import step_size_matching
from vaco.report.decision import DEFAULT_MARGIN
from vaco.report.design import two_by_two
from vaco.report.figures import use_file_backend
from vaco.report.robustness import robustness
from vaco.report.robustness_summary import design_lines, ranking_lines, scoring_lines, verdict_lines
from vaco.report.runs import load_runs, log_report, read_data_files, save_runs, with_store_runs
from vaco.report.scores import NORMALIZATIONS, SCORES, build_report
from vaco.report.sensitivity import sensitivity
from vaco.report.summary import write_report
from vaco.tracking import PARENT_TAG, PLAN_TAG, prepare_sqlite_store, tracking_uri

__all__ = ["main"]


def _record_plan(paths: list[str]):
    """The declared plan of a data file's record (:func:`vaco.study.judge.record_path`), if one
    is beside a file: ``(plan, declared, commit, judgements, None, note)``; the reading is judged
    against the recorded looks and not recorded (there is no parent run to keep it)."""
    from vaco.study.judge import plan_from_tags, read_judgements, read_record, record_path

    for path in paths:
        where = record_path(path)
        if where.is_file():
            tags = read_record(where)
            note = f"the plan's record is {where} (its looks judged against; this reading is not recorded)"
            return (
                plan_from_tags(tags),
                tags[f"{PLAN_TAG}.declared"],
                tags.get(f"{PLAN_TAG}.commit"),
                read_judgements(tags),
                None,
                note,
            )
    return None, None, None, None, None, None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaco report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiment", help="MLflow experiment name (a sweep's `experiment`)")
    parser.add_argument(
        "--data",
        nargs="+",
        metavar="FILE",
        help="data files written by --save-data (one or several: a study run in parts): report without the "
        "MLflow store (no logging); with --experiment, its runs besides the store's (a study continued in a new "
        "store with `vaco sweep --finished-in`)",
    )
    parser.add_argument(
        "--save-data",
        default=None,
        help="also write the runs' coordinates and metric histories to this CSV (.csv.gz: gzipped)",
    )
    parser.add_argument("--name", default=None, help="the report's title with --data (default: the file's stem)")
    parser.add_argument(
        "--sweep",
        default=None,
        metavar="FILE",
        help="the sweep file that made the runs: the benchmark page gives each run's `vaco sweep --config FILE "
        "--only NAME`",
    )
    parser.add_argument("--out", default=None, help="output folder (default: reports/<experiment>)")
    parser.add_argument(
        "--reps", type=int, default=2000, help="bootstrap resamples (rliable suggests 50000 for a paper)"
    )
    parser.add_argument("--seed", type=int, default=0, help="numpy seed of the bootstrap")
    parser.add_argument("--min-runs", type=int, default=3, help="runs per task below which no interval is drawn")
    parser.add_argument(
        "--score",
        choices=SCORES,
        default=None,
        help="the score the verdicts decide on, declared per study: final (the last evaluation; default), last-n "
        "(the mean of the last --last-evals evaluations; the default when --last-evals > 1) or auc (the "
        "normalised curve's mean over training)",
    )
    parser.add_argument(
        "--last-evals", type=int, default=1, help="n of --score last-n: the score is the mean of the last n evaluations"
    )
    parser.add_argument(
        "--no-sensitivity",
        action="store_true",
        help="skip the table of verdicts under every scoring (score x aggregate x scale) and the two-way model",
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
    parser.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="AXIS=VALUE",
        help="the main comparison's value of any axis (repeatable), e.g. --reference truncation=2",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="ALGORITHM",
        help="the algorithm the probability of improvement compares with (default: ppo_clip where present)",
    )
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=None,
        metavar="ENV_ID",
        help="report only these tasks (e.g. --tasks Hopper-v5 HalfCheetah-v5)",
    )
    parser.add_argument(
        "--algorithms",
        nargs="+",
        default=None,
        metavar="ALGORITHM",
        help="report only these algorithms (the arms of one study out of files that hold others); a task's "
        "min and max are then over the main algorithms kept",
    )
    parser.add_argument(
        "--normalize-over",
        choices=NORMALIZATIONS,
        default="main",
        help="a task's min and max: over the main algorithms' runs at the reference axis values, leaving out "
        "ablation and control variants (main, the paper's), or over every run (all)",
    )
    parser.add_argument(
        "--step-pairs",
        action="append",
        default=[],
        metavar="FILTER=CLIP",
        help="a step-size pair of the 2x2 design, e.g. vaco=ppo_clip_tv_matched (repeatable): the TV section "
        "shows both arms' realised lag/forward_tv per task and K and flags a K where they are more than 10%% apart; "
        "its arms count in the comparison at their own delta. Two pairs (a large and a small step) add the 2x2 "
        "design's contrasts: the filter's advantage at each step, the objective and step-size main effects and "
        "their interaction, each with its verdict",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help=f"the smallest difference that matters, in normalised score units (default {DEFAULT_MARGIN}): each "
        "difference is decided as differs (95%% interval excludes 0), equivalent (90%% interval inside +-margin) "
        "or undecided (with the seeds per task that would decide it)",
    )
    parser.add_argument(
        "--plan",
        default=None,
        help="judge a study plan: a YAML file with a `plan:` block (a sweep file). Without it, the plan the "
        "experiment's sweep declared (its parent run's tag) is judged where there is one. A plan the experiment "
        "did not declare before its runs is labelled exploratory",
    )
    parser.add_argument("--include-unfinished", action="store_true", help="also use runs that did not FINISH")
    parser.add_argument("--no-mlflow", action="store_true", help="do not log the report as MLflow artifacts")
    return parser


class _Progress:
    """Where a long report is, on stderr (stdout keeps the results): each section as it starts, with the
    time so far, and within the sections that loop over comparisons a count and an ETA."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, what: str) -> None:
        print(f"vaco report: {what} ({time.monotonic() - self.start:.0f} s so far)", file=sys.stderr, flush=True)

    def each(self, what: str):
        """A callback ``(done, total)`` for a loop: a line at its start and then at most every 10 s, with an ETA."""
        began, last = time.monotonic(), [0.0]

        def tick(done: int, total: int) -> None:
            now = time.monotonic()
            if done and done < total and now - last[0] < 10:
                return
            last[0] = now
            eta = (now - began) / done * (total - done) if done else None
            left = "" if eta is None else f", about {eta:.0f} s left"
            print(f"vaco report: {what} {done}/{total}{left}", file=sys.stderr, flush=True)

        return tick


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not (args.experiment or args.data):
        parser.error("one of the arguments --experiment --data is required")
    experiment = args.experiment or args.name or Path(args.data[0]).name.split(".")[0]
    use_file_backend()
    uri = tracking_uri()
    if args.experiment:  # several commands opening a new SQLite store at once: its tables set up once
        prepare_sqlite_store(uri)
    say = _Progress()
    try:
        settings = _settings(args)
        runs, notes = _runs(args, uri)
        report = build_report(experiment, runs, notes, **settings)
        _check_names(args, report, settings["step_pairs"])
        study_plan, plan_record = _plan(args, report, uri)
        if study_plan is not None:
            from vaco.study.plan import score_settings

            # the plan's score is the report's unless --score or --last-evals asks for another (sensitivity),
            # and its fixed references normalise every score
            if args.score is None and args.last_evals == 1:
                settings["score"], settings["last_evals"] = score_settings(study_plan.score)
            fixed = {task: (low, high) for task, low, high in study_plan.references} or None
            if fixed or (settings["score"], settings["last_evals"]) != (report.score, report.last_evals):
                report = build_report(experiment, runs, notes, **settings, fixed_bounds=fixed)
    except ValueError as err:
        print(f"vaco report: {err}", file=sys.stderr)
        return 2
    if args.save_data:
        _save_data(args.save_data, runs, plan_record["parent_id"], uri)
    out = Path(args.out or Path("reports") / experiment)
    # progress only once the input is known good: a bad one is one line and nothing else
    say(f"{len(report.runs)} runs read and scored; each algorithm's drop from its own K = 1")
    lag = robustness(report)
    two = two_by_two(report)
    scoring = None
    if not args.no_sensitivity:
        say("every verdict under every scoring (--no-sensitivity skips it)")
        scoring = sensitivity(report, lag, design=two, progress=say.each("scorings of comparison"))
    say(f"the summary and figures -> {out}")
    summary = write_report(report, out, lag=lag, scoring=scoring, design=two)
    print(f"vaco report: {len(report.runs)} runs -> {summary} and {len(list(out.glob('*.png')))} figures in {out}")
    _print_verdicts(report, lag, scoring, two)
    judged = None
    if study_plan is not None:
        say("the study plan's verdicts")
        judged = _judge(study_plan, report, plan_record, out, uri)
    say("the benchmark page")
    page = _page(args, report, judged, plan_record, out, uri)
    print(f"  the benchmark page: {page} (one file, no network needed: open it in a browser)")
    for m in step_size_matching(report):
        print(
            f"step size {m.filter_arm} / {m.clip_arm}, {m.task} K={m.K}: lag/forward_tv {m.filter_tv:.4f} / "
            f"{m.clip_tv:.4f} = {m.ratio:.3f} -> {'drifts' if m.drifts else 'held'}"
        )
    if not args.no_mlflow and not args.data:
        _log(args.experiment, out, uri)
    return 0


def _settings(args) -> dict:
    """The report's settings from the command line, each refused in one line naming its flag."""
    reference = {}
    for item in args.reference:
        axis, _, value = item.partition("=")
        try:
            reference[axis.strip()] = float(value)
        except ValueError:
            raise ValueError(f"`--reference` takes AXIS=NUMBER, got {item!r}") from None
    # the paper's two axes have flags of their own; they win over --reference for the same axis
    for axis in ("delta", "rho_bar"):
        if getattr(args, f"reference_{axis}") is not None:
            reference[axis] = getattr(args, f"reference_{axis}")
    step_pairs = {}
    for item in args.step_pairs:
        filter_arm, _, clip_arm = item.partition("=")
        if not (filter_arm.strip() and clip_arm.strip()):
            raise ValueError(f"`--step-pairs` takes FILTER=CLIP (two algorithm names), got {item!r}")
        filter_arm, clip_arm = filter_arm.strip(), clip_arm.strip()
        named = {*step_pairs, *step_pairs.values()}
        if filter_arm == clip_arm:
            raise ValueError(f"`--step-pairs` {item!r}: an arm cannot be its own partner")
        if filter_arm in named or clip_arm in named:
            raise ValueError(f"`--step-pairs` {item!r}: each arm may be in one pair only")
        step_pairs[filter_arm] = clip_arm
    for name in ("reps", "min_runs", "last_evals"):
        if getattr(args, name) < 1:
            raise ValueError(f"`--{name.replace('_', '-')}` must be >= 1")
    return dict(
        last_evals=args.last_evals,
        score=args.score,
        reference=reference,
        reps=args.reps,
        seed=args.seed,
        min_runs=args.min_runs,
        baseline=args.baseline,
        normalization=args.normalize_over,
        margin=args.margin,
        step_pairs=step_pairs,
    )


def _runs(args, uri: str) -> tuple[list, list[str]]:
    """The runs the report reads (the store's, the data files', or both) and the notes on them,
    narrowed to ``--tasks`` and ``--algorithms``."""
    runs, notes = load_runs(args.experiment, uri, args.include_unfinished) if args.experiment else ([], [])
    if args.data:
        found, more = read_data_files(args.data)
        runs, notes = with_store_runs(runs, found, notes + more) if args.experiment else (found, more)
    for flag, field, wanted in (("tasks", "env", args.tasks), ("algorithms", "algorithm", args.algorithms)):
        if not wanted:
            continue
        have = sorted({getattr(r, field) for r in runs})
        unknown = sorted(set(wanted) - set(have))
        if unknown:
            raise ValueError(f"`--{flag}`: no runs of {', '.join(unknown)}; the {flag} are {', '.join(have)}")
        runs = [r for r in runs if getattr(r, field) in wanted]
    return runs, notes


def _check_names(args, report, step_pairs: dict[str, str]) -> None:
    if args.baseline is not None and args.baseline not in report.algorithms:
        raise ValueError(
            f"`--baseline`: no runs of {args.baseline!r}; the algorithms are {', '.join(report.algorithms)}"
        )
    unknown = [a for pair in step_pairs.items() for a in pair if a not in report.algorithms]
    if unknown:
        raise ValueError(
            f"`--step-pairs`: no runs of {', '.join(map(repr, unknown))}; the algorithms are "
            f"{', '.join(report.algorithms)}"
        )


def _plan(args, report, uri: str) -> tuple:
    """The plan to judge (``--plan``, else the one the sweep declared) and its record: when it was
    declared, at which commit, its earlier looks, the parent run that keeps them (all None for a plan
    written after the runs: exploratory), and a data file's note on its record."""
    from vaco.study.judge import declared_plan as read_declared

    record_note = None
    if args.experiment:
        declared, declared_at, commit, earlier, parent_id = read_declared(args.experiment, uri)
    else:  # a data file's plan record (written beside it by --save-data): its looks, not recorded again
        declared, declared_at, commit, earlier, parent_id, record_note = _record_plan(args.data)
    study_plan = _read_plan(args.plan, report) if args.plan else declared
    if study_plan is not None and (declared is None or study_plan.digest != declared.digest):
        declared_at, commit, earlier, parent_id = None, None, None, None  # written after the runs: exploratory
    record = dict(
        declared_at=declared_at,
        commit=commit,
        earlier=earlier,
        parent_id=parent_id,
        note=record_note if study_plan is declared else None,
    )
    return study_plan, record


def _save_data(path: str, runs: list, parent_id: str | None, uri: str) -> None:
    print(f"vaco report: {len(runs)} runs' metric histories -> {save_runs(runs, path)}")
    if parent_id is not None:
        import mlflow

        from vaco.study.judge import record_path, write_record

        tags = mlflow.MlflowClient(uri).get_run(parent_id).data.tags
        print(f"vaco report: the plan's record -> {write_record(record_path(path), tags, runs)}")


def _print_verdicts(report, lag, scoring, two) -> None:
    for line in report.weak_scale:
        print(f"vaco report: read with care: {line}")
    if lag.drops:
        print(f"robustness to lag ({report.score} score), decided at margin {report.margin:g} ({report.units} units):")
        print("\n".join(verdict_lines(lag) + ranking_lines(report, lag)))
    if scoring is not None and scoring.rows:
        flagged = scoring_lines(scoring)
        print("verdicts under every scoring: " + ("none depends on it" if not flagged else "scale-dependent:"))
        if flagged:
            print("\n".join(flagged))
    if two is not None and two.contrasts:
        print(f"the 2x2 design (large step {two.large[0]} / {two.large[1]}, small {two.small[0]} / {two.small[1]}):")
        print("\n".join(design_lines(two)))
        if scoring is not None and scoring.design:
            flagged = scoring_lines(scoring, design=True)
            print("its contrasts under every scoring: " + ("none depends on it" if not flagged else "scale-dependent:"))
            if flagged:
                print("\n".join(flagged))


def _judge(study_plan, report, record: dict, out: Path, uri: str) -> None:
    """The plan judged on the report, written to plan.md and printed; a declared plan's reading is
    one of its looks, kept on the sweep's parent run."""
    from vaco.study.judge import judge_plan, plan_lines, record_judgement

    scored = f"last-{report.last_evals}" if report.score == "last-n" else report.score
    # another score than the declared one: what the rule says of it, not verdicts. The looks' path (which
    # arms ran more seeds) followed the declared score's decisions, so it is not replayed: every
    # comparison is judged once, on the seeds it has, at the levels of the data's last look
    sensitivity = scored != study_plan.score
    earlier = None if sensitivity else record["earlier"]
    judged = judge_plan(study_plan, report, record["declared_at"], earlier, record["commit"])
    lines, title = plan_lines(judged), "The study plan's verdicts"
    if sensitivity:
        title = "The study plan's rule on another score"
        lines.insert(
            0,
            f"score sensitivity, not verdicts: the plan's rule and references on the {scored} score, where the plan "
            f"declares the {study_plan.score} score (its verdicts: `vaco report` without --score); each comparison "
            "judged once on the seeds it has, at the levels of the data's last look (the looks' path followed the "
            "declared score's decisions and is not replayed); not recorded",
        )
    (out / "plan.md").write_text(f"# {title}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    if sensitivity:
        return None
    if record["parent_id"] is not None:
        record_judgement(uri, record["parent_id"], judged, "report", lines)
        print(f"  this reading is recorded on the sweep's parent run ({record['parent_id']}) as a look of the plan")
    elif record["note"] is not None:
        print(f"  {record['note']}")
    return judged


def _page(args, report, judged, record: dict, out: Path, uri: str) -> Path:
    """``benchmark.html``: the report's runs to click through, with the plan's looks where it was judged."""
    from vaco.report.page import page_data, write_page
    from vaco.study.judge import plan_lines
    from vaco.study.looks import trajectory

    looks = trajectory(judged, report, record["earlier"] or ()) if judged is not None else []
    lines = plan_lines(judged) if judged is not None else None
    command = f"vaco sweep --config {args.sweep} --only '{{name}}'" if args.sweep else None
    store = None
    if args.experiment:
        import mlflow

        found = mlflow.MlflowClient(uri).get_experiment_by_name(args.experiment)
        store = {"experiment_id": found.experiment_id} if found is not None else None
    return write_page(out / "benchmark.html", page_data(report, lines, looks, command, store))


def _log(experiment: str, out: Path, uri: str) -> None:
    import mlflow

    run_id = log_report(experiment, out, uri)
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    kind = (
        f"the sweep's parent run '{tags.get('mlflow.runName', '')}'"
        if tags.get(PARENT_TAG) == "true"
        else "the run 'report'"
    )
    print(f"  logged as artifacts report/ of {kind} ({run_id}) in experiment '{experiment}'")


def _read_plan(path: str, report):
    """``--plan FILE``: the ``plan`` block of a YAML file, checked against the report's runs."""
    from vaco.study.plan import load_plan

    try:
        raw = load_yaml(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"`--plan`: cannot read {path} ({err.strerror})") from None
    if not isinstance(raw, dict) or "plan" not in raw:
        raise ValueError(f"`--plan`: {path} has no `plan:` block")
    ks = sorted({r.K for r in report.runs})
    try:
        return load_plan(raw["plan"], report.algorithms, ks, seeds=10**6)
    except ValueError as err:
        raise ValueError(f"`--plan` ({path}): {err}") from None


if __name__ == "__main__":
    sys.exit(main())
