"""``vaco sweep``: the command line (see :mod:`vaco.sweep`)."""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import os
import sys
from pathlib import Path

from vaco.study.looks import judge_look, look_cells, look_progress
from vaco.sweep.cells import say
from vaco.sweep.grid import Cell, PopulationCell, Sweep, expand, pack
from vaco.sweep.launcher import BUILTIN, Launcher, launcher_class
from vaco.sweep.loader import load_sweep, validate_with_cli
from vaco.sweep.schema import RESOURCE_FIELDS, SweepError, check_resources
from vaco.sweep.state import (
    carried_runs,
    check_output_dir,
    check_plan,
    finished_runs,
    lock,
    parent_run,
    plan,
    plan_record_tags,
    resolve_tracking_uri,
)
from vaco.tracking import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    PARENT_TAG,
    PLAN_TAG,
    TrackingStoreError,
    artifact_location,
    check_tracking_store,
    redact_uri,
)

__all__ = ["main"]

MAX_LISTED = 40  # --dry-run/--status list at most this many cells unless --all-cells


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaco sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="the sweep file, e.g. configs/sweeps/laptop.yaml")
    parser.add_argument("--jobs", type=int, default=None, help="local: cells run at once (default: the file's `jobs`)")
    parser.add_argument("--dry-run", action="store_true", help="validate, print the cells and their state, run nothing")
    parser.add_argument(
        "--status", action="store_true", help="print every cell's state (finished, running, resume, new) and exit"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output folder of cell configs, logs, checkpoints (default: the file's `output_dir`)",
    )
    parser.add_argument(
        "--only", action="append", default=[], metavar="GLOB", help="run only cells whose id matches (repeatable)"
    )
    parser.add_argument(
        "--finished-in",
        action="append",
        default=[],
        metavar="DATA",
        help="a `vaco report --save-data` file: cells whose FINISHED runs it holds count as finished "
        "(a study continued in a new MLflow store; repeatable); a declared plan's record beside it "
        "(runs_record.json for runs.csv.gz) carries the plan's declaration and looks to the new store",
    )
    parser.add_argument(
        "--save-data",
        default=None,
        metavar="DATA",
        help="after each cell that finishes and when the sweep stops, write every FINISHED run of the sweep, "
        "this store's and the --finished-in files', to DATA (.csv.gz; the format `vaco report --save-data` writes), "
        "with a declared plan's record beside it; nothing is judged or summarised. With --status: write it and run "
        "nothing. The next block goes on from it in any store: --finished-in DATA",
    )
    parser.add_argument(
        "--all-cells", action="store_true", help="--dry-run/--status: list every cell, even in a large sweep"
    )
    parser.add_argument(
        "--until-decided",
        action="store_true",
        help="run the plan's looks in blocks of seeds (the first n seeds of every cell, n a look of the sweep "
        "file's `plan`), judge the primary family after each, and stop once every primary comparison is decided "
        "or the last look is reached; each look's verdicts go to the parent run (local launcher)",
    )
    launch = parser.add_argument_group("launchers (the sweep file's `launcher` and `resources`, overridden here)")
    launch.add_argument(
        "--launcher",
        default=None,
        help=f"{', '.join(BUILTIN)} (default local), or a vaco.sweep.launcher.Launcher class path",
    )
    for name in BUILTIN:  # each launcher adds its own flags
        launcher_class(name).add_arguments(launch)
    for name, (kind, text) in RESOURCE_FIELDS.items():
        launch.add_argument(f"--{name.replace('_', '-')}", dest=f"resource_{name}", type=kind, default=None, help=text)
    return parser


@dataclasses.dataclass
class _Plan:
    """What ``vaco sweep`` decided before running anything: the sweep, its cells and their states."""

    sweep: Sweep
    launcher: str
    resources: dict
    cells: list[Cell]
    uri: str
    runner: Launcher | None  # built (and so checked) before anything runs; for --dry-run/--status only if it answers
    states: dict[str, str]
    from_data: dict[str, str] = dataclasses.field(default_factory=dict)  # cell id -> the --finished-in file
    record: dict[str, str] | None = None  # a declared plan's tags from a --finished-in file's record
    record_from: str | None = None  # that record's file
    carried: dict = dataclasses.field(default_factory=dict)  # cell id -> (file, Run) of the --finished-in files
    saver: DataSaver | None = None  # --save-data


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # the launcher the command line names (local if none) may start something slow now, while
    # this process checks the plan: the local launcher's zygote imports torch & co. on the other core
    guess = _guess(args)
    args.prestarted = guess.prestart(args) if guess is not None and not (args.dry_run or args.status) else None
    runner = None
    try:
        try:
            p = _plan(args)
            if p.runner is None and not (args.dry_run or args.status):
                p.runner = launcher_class(p.launcher).from_args(p.sweep, p.uri, p.resources, args)
        except (SweepError, RuntimeError) as err:
            print(f"vaco sweep: {err}", file=sys.stderr)
            return 2
        runner = p.runner
        if args.save_data:
            p.saver = DataSaver(p, args.save_data)
        if args.prestarted is not None:  # not taken by the launcher: the file names another one
            args.prestarted.close()
            args.prestarted = None
        _say_plan(p, args)
        if args.dry_run or args.status:
            _list_cells(p, args)
            return _saved(p, args, 0) if args.status else 0
        return _saved(p, args, _run_looks(p, args) if args.until_decided else _run(p, args))
    finally:
        if args.prestarted is not None:
            args.prestarted.close()
        if runner is not None:
            runner.close()


def _saved(p: _Plan, args, rc: int) -> int:
    """``--save-data`` once the sweep has stopped, however it stopped; a file it cannot write is one
    line (the runs stay in the store: rerun with ``--status --save-data``), exit code 2 after a clean run."""
    if p.saver is None:
        return rc
    try:
        say(p.saver.save())
    except (SweepError, OSError, ValueError) as err:
        print(f"vaco sweep: `--save-data {args.save_data}`: {err}", file=sys.stderr)
        return rc or 2
    return rc


def _guess(args) -> type[Launcher] | None:
    try:
        return launcher_class(args.launcher or "local", "--launcher")
    except SweepError:
        return None  # reported by the plan


def _plan(args) -> _Plan:
    """Load and check everything (the file, the resources, the store, every cell's config) and find
    each cell's state; raises SweepError naming the field."""
    if args.jobs is not None and args.jobs < 1:
        raise SweepError(f"`--jobs` must be >= 1, got {args.jobs}")
    if args.save_data is not None:
        _check_save_data(args.save_data, args.dry_run)
    # a launcher named here is checked before the sweep file, whose loading imports torch and Lightning (~7 s)
    kind = launcher_class(args.launcher, "--launcher") if args.launcher is not None else None
    sweep = load_sweep(args.config, args.out)
    launcher = args.launcher or sweep.launcher
    if args.status and args.launcher is None and (sweep.output_dir / "submitit" / "jobs.yaml").is_file():
        launcher = "slurm"  # submitted to SLURM before: --status asks the scheduler too
    resources = {
        **sweep.resources,
        **{k[len("resource_") :]: v for k, v in vars(args).items() if k.startswith("resource_") and v is not None},
    }
    check_resources(resources)
    cells = expand(sweep)
    if args.only:
        cells = [c for c in cells if any(fnmatch.fnmatch(c.id, g) for g in args.only)]
        if not cells:
            raise SweepError(f"`--only {' '.join(args.only)}` matches no cell")
    # the launcher's name and flags are checked before the store is opened (a new SQLite store is
    # created and migrated there: seconds of work that a misspelt launcher should not cost)
    if kind is None:  # the file's launcher (or --status's switch to slurm)
        kind = launcher_class(launcher, "launcher")
    if getattr(args, "stop_after", None) is not None and kind.name != "local":
        raise SweepError(
            f"`--stop-after` is for the local launcher (the {launcher} launcher's cells run on their own: "
            "stop them with Ctrl-C, or give the jobs a time limit such as `--time-min`)"
        )
    uri = resolve_tracking_uri()
    _check_store(uri)
    # a launcher that answers --status (SLURM asks the scheduler, writes the script) is built for
    # --dry-run and --status too: a missing submitit is one line there as well. Others (Ray
    # connects to its cluster) are built to run only, after the plan is checked.
    runner = kind.from_args(sweep, uri, resources, args) if kind.answers_status else None
    validate_with_cli(sweep, cells, uri)
    check_plan(sweep, uri)  # a study's plan does not change once its runs exist
    if not getattr(args, "out", None):  # a folder from the file or the default, resolved against this directory
        check_output_dir(sweep, uri)  # another one would repeat the cells the first holds
    if getattr(args, "until_decided", False):
        if sweep.plan is None:
            raise SweepError("`--until-decided` needs the sweep file's `plan` block (its family and looks)")
        if kind.name != "local":
            raise SweepError(
                f"`--until-decided` judges each look once its cells have finished: it runs with the local launcher, "
                f"not {launcher}"
            )
    states = plan(sweep, cells, uri, with_running=args.status)
    carried = carried_runs(sweep, args.finished_in)
    from_data = _finished_in(carried, cells, states)
    record, record_from = _carried_record(args.finished_in, sweep)
    if (args.status or args.dry_run) and runner is not None:  # a dry run refuses what the real run would
        for cell_id, state in runner.job_states().items():
            if states.get(cell_id) != "finished":
                states[cell_id] = "queued" if state in ("PENDING", "REQUEUED", "CONFIGURING") else "running"
    return _Plan(sweep, launcher, resources, cells, uri, runner, states, from_data, record, record_from, carried)


def _check_save_data(path: str, dry_run: bool) -> None:
    """``--save-data``: refused in one line before anything runs (a file it cannot write would
    otherwise be found only when the block ends)."""
    where = Path(path)
    if dry_run:
        raise SweepError(
            "`--save-data`: a dry run writes nothing; `--status --save-data DATA` writes it and runs nothing"
        )
    if where.is_dir():
        raise SweepError(f"`--save-data`: {path} is a folder; name the file, e.g. {where / 'runs.csv.gz'}")
    if not where.name.endswith((".csv.gz", ".csv")):
        raise SweepError(
            f"`--save-data`: {path} must end in .csv.gz (or .csv): the data file `vaco report --data` reads"
        )
    parent = next(a for a in (where.absolute().parent, *where.absolute().parents) if a.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise SweepError(f"`--save-data`: cannot write in {parent}; choose a folder you can write to")


class DataSaver:
    """``--save-data``: the sweep's FINISHED runs (this store's and the ``--finished-in`` files') to
    ``path`` and a declared plan's record beside it, each written atomically, after every cell that
    finishes (the local launcher) and once more when the sweep stops; nothing is judged, so a
    block's export reads no verdict before its look is complete. Runs read once are kept (a FINISHED
    run does not change): a save after a cell reads only the new ones."""

    def __init__(self, p: _Plan, path: str) -> None:
        self.p, self.path = p, path
        self.known: dict = {}  # run id -> Run
        self.warned = False

    def save(self) -> str:
        from vaco.report.runs import save_runs
        from vaco.study.judge import record_path, write_record

        runs = finished_runs(self.p.sweep, self.p.uri, self.p.carried, self.known)
        save_runs(runs, self.path)
        tags = plan_record_tags(self.p.sweep, self.p.uri, self.p.record)
        record = f" and the plan's record -> {write_record(record_path(self.path), tags, runs)}" if tags else ""
        where = "this store's and the --finished-in files'" if self.p.carried else "this store's"
        return f"{len(runs)} finished runs of the sweep ({where}) -> {self.path}{record}; nothing judged"

    def after_cell(self) -> None:
        """Called by the launcher after each cell that finished; a failure is said once, not fatal
        (the runs stay in the store, and the sweep saves again when it stops)."""
        try:
            self.save()
        except (SweepError, OSError, ValueError) as err:
            if not self.warned:
                self.warned = True
                print(
                    f"vaco sweep: warning: `--save-data {self.path}` not written after a cell ({err}); "
                    "tried again when the sweep stops",
                    file=sys.stderr,
                )


def _finished_in(carried: dict, cells: list[Cell], states: dict[str, str]) -> dict[str, str]:
    """``--finished-in``: the cells not finished in this store whose FINISHED run a data file holds
    (:func:`vaco.sweep.state.carried_runs`) are marked finished in ``states``; returns cell id -> file."""
    found: dict[str, str] = {}
    for cell in cells:
        if cell.id in carried and states[cell.id] != "finished":
            states[cell.id] = "finished"
            found[cell.id] = carried[cell.id][0]
    return found


def _carried_record(paths: list[str], sweep: Sweep) -> tuple[dict[str, str] | None, str | None]:
    """The plan record beside the ``--finished-in`` files (``vaco report --save-data`` writes it): a
    study continued in a new store keeps its declaration time, commit and looks. Of several, the one
    with the most looks (a later export holds the earlier ones). Refused in one line where the record
    is of another plan than the sweep file's."""
    from vaco.study.judge import read_judgements, read_record, record_path

    best: tuple[dict[str, str], str] | None = None
    for path in paths:
        where = record_path(path)
        if not where.is_file():
            continue
        try:
            tags = read_record(where)
        except ValueError as err:
            raise SweepError(f"`--finished-in {path}`: {err}") from None
        ours = sweep.plan.digest if sweep.plan is not None else None
        if tags[f"{PLAN_TAG}.digest"] != ours:
            raise SweepError(
                f"`--finished-in {path}`: its plan record {where} is of plan {tags[f'{PLAN_TAG}.digest']}, declared "
                f"{tags[f'{PLAN_TAG}.declared']}; this sweep file's plan is {ours or 'none'}: a study continues under the "
                "plan its runs were made under"
            )
        if best is None or len(read_judgements(tags)) > len(read_judgements(best[0])):
            best = (tags, str(where))
    return best if best is not None else (None, None)


def shown_states(sweep: Sweep, cells: list[Cell], states: dict[str, str]) -> dict[str, str]:
    """Each cell's state as a user reads it: a member of a population whose folder holds a
    checkpoint resumes (the member's own folder has none, so ``plan`` calls it new)."""

    shown = dict(states)
    new = [c for c in cells if states.get(c.id) == "new"]
    if new:
        jobs, job_states = pack(sweep, new, states)
        for job in jobs:
            if isinstance(job, PopulationCell) and job_states.get(job.id) == "resume":
                shown.update(dict.fromkeys((m.id for m in job.members), "resume"))
    return shown


def _packed(sweep: Sweep, todo: list[Cell], states: dict[str, str]) -> tuple[list, list]:
    """The jobs that run ``todo`` (:func:`vaco.sweep.grid.pack`) and the populations among them."""

    jobs, _ = pack(sweep, todo, states) if todo else ([], {})
    return jobs, [job for job in jobs if hasattr(job, "members")]


def _population_setting(sweep: Sweep) -> str:
    """How the sweep packs seeds, in the words of its file."""
    if sweep.population != "auto":
        return f"population: {sweep.population}"
    return (
        "population: auto, the default (up to 12 seeds a process in process, 4 on envpool, 16 on Warp, "
        "evened out over a cell's seeds; docs/sweeps.md; `population: 1` runs every seed alone)"
    )


def _say_plan(p: _Plan, args) -> None:
    sweep, launcher, uri = p.sweep, p.launcher, p.uri
    states = shown_states(sweep, p.cells, p.states)
    jobs = args.jobs or sweep.jobs
    counts = {s: sum(1 for v in states.values() if v == s) for s in ("finished", "running", "queued", "resume", "new")}
    say(
        f"sweep '{sweep.experiment}' ({sweep.path}): {len(p.cells)} cells; {counts['finished']} finished "
        f"(skipped), "
        + (f"{counts['running']} running, " if args.status else "")
        + (f"{counts['queued']} queued, " if counts["queued"] else "")
        + f"{counts['resume']} resume from a checkpoint, {counts['new']} new; launcher {launcher}"
        + (f", {jobs} at a time" if launcher == "local" else "")
        + f"\n  MLflow: {redact_uri(uri)}  outputs: {sweep.output_dir}"
    )
    if sweep.plan is not None:
        from vaco.study.plan import undecidable_looks

        study = sweep.plan
        say(
            f"plan {study.digest}: a family of {len(study.family)} at looks {', '.join(map(str, study.looks))} seeds, "
            f"{study.spending}, alpha {study.alpha:g}, margin {study.margin:g}, {study.test} test, {study.score} score"
            + (", each task weighed alike (task-mean)" if study.estimand == "task-mean" else "")
            + (f", floor {study.floor:g}" if study.floor is not None else "")
        )
        if (args.status or args.dry_run) and not args.only:  # a look is over all the cells
            from vaco.study.judge import read_judgements

            tags = plan_record_tags(sweep, uri, p.record)
            say(look_progress(study, p.cells, states, read_judgements(tags) if tags else []))
        tasks = len({c.env for c in p.cells})
        for line in undecidable_looks(study, tasks):
            print(f"vaco sweep: warning: {line}", file=sys.stderr)
    for path in dict.fromkeys(p.from_data.values()):
        n = sum(1 for v in p.from_data.values() if v == path)
        say(f"{n} of them finished in {path} (--finished-in; not in this store: report with --data {path} too)")
    if p.record is not None:
        from vaco.study.judge import read_judgements

        readings = read_judgements(p.record)
        say(
            f"the plan's record comes from {p.record_from}: declared {p.record[f'{PLAN_TAG}.declared']}, "
            f"{len(readings)} readings at {len({j.seeds for j in readings})} looks recorded (a new parent run in "
            "this store carries it)"
        )
    if launcher in ("slurm", "ray") and uri.startswith("sqlite:"):
        print(
            f"vaco sweep: warning: a {launcher} sweep with a SQLite store ({redact_uri(uri)}): cells on other hosts cannot "
            "share one SQLite file safely; run an MLflow server with a database backend (docs/sweeps.md) and set "
            "MLFLOW_TRACKING_URI to it",
            file=sys.stderr,
        )


def _list_cells(p: _Plan, args) -> None:
    """--dry-run and --status: each cell's state (the first ones of a large sweep), and for SLURM
    the job arrays and the first sbatch script."""
    cells, sweep = p.cells, p.sweep
    states = shown_states(sweep, cells, p.states)
    shown = cells if args.all_cells or len(cells) <= MAX_LISTED else cells[: MAX_LISTED // 2]
    for cell in shown:
        print(f"  {states[cell.id]:8s}  {cell.id}")
    if len(shown) < len(cells):
        by_algo: dict[str, int] = {}
        for cell in cells:
            by_algo[cell.algorithm] = by_algo.get(cell.algorithm, 0) + 1
        print(
            f"  ... and {len(cells) - len(shown)} more (--all-cells lists them); cells per algorithm: "
            + ", ".join(f"{a} {n}" for a, n in by_algo.items())
        )
    print(
        f"  command of a cell: vaco fit --config {sweep.output_dir}/<cell>/config.yaml [--ckpt_path <cell>/checkpoints/last.ckpt]"
    )
    todo = [c for c in cells if states[c.id] not in ("finished", "running", "queued")]
    jobs, populations = _packed(sweep, todo, states)
    if populations:
        print(
            f"  {_population_setting(sweep)} -> {sum(len(j.members) for j in populations)} of the {len(todo)} "
            f"cells to run would run as {len(populations)} populations (e.g. {populations[0].id}); "
            f"{len(jobs)} processes in all"
        )
    extra = p.runner.describe(cells, states) if args.dry_run and p.runner is not None else None
    if extra:
        print(extra)


def _run(p: _Plan, args) -> int:
    """Run (or submit) the cells that have not finished, under the sweep's lock and parent run."""
    sweep, cells, states, uri, runner = p.sweep, p.cells, p.states, p.uri, p.runner
    for cell in cells:
        if states[cell.id] == "finished":
            say(f"skip   {cell.id} (finished{', in ' + p.from_data[cell.id] if cell.id in p.from_data else ''})")
    todo, populations = _packed(sweep, [c for c in cells if states[c.id] != "finished"], states)
    if populations:
        say(
            f"{sum(len(j.members) for j in populations)} cells run as {len(populations)} populations "
            f"({_population_setting(sweep)}; a member is its seed's run alone, bit for bit)"
        )
    if not todo:
        closed = close_parent_run(uri, sweep)
        say("nothing to do: every cell has finished" + (" (the sweep's parent run is now FINISHED)" if closed else ""))
        return 0
    try:
        lock_file = lock(sweep.output_dir)
        runner.check_ready()
    except (SweepError, RuntimeError) as err:
        print(f"vaco sweep: {err}", file=sys.stderr)
        return 2
    import mlflow

    client = mlflow.MlflowClient(uri)
    _experiment(client, sweep, uri)  # once, before cells race to create it
    sweep.parent_run_id = parent_run(client, sweep, cells, p.record, p.record_from)
    status = "FAILED"
    try:
        runner.on_cell_done = p.saver.after_cell if p.saver is not None else None
        rc = runner.launch(todo)
        if rc == 0 and runner.detached:
            status = "RUNNING"  # submitted: the cells report to MLflow themselves
        else:
            # stopped on purpose (Ctrl-C 130, SIGTERM 143, --stop-after 124): KILLED, not FAILED
            status = {0: "FINISHED", 130: "KILLED", 143: "KILLED", 124: "KILLED"}.get(rc, "FAILED")
        return rc
    finally:
        if status != "RUNNING":
            client.set_terminated(sweep.parent_run_id, status)
        lock_file.close()


def _experiment(client, sweep: Sweep, uri: str) -> None:
    """The sweep's MLflow experiment, created if the store has none."""

    if client.get_experiment_by_name(sweep.experiment) is None:
        client.create_experiment(
            sweep.experiment,
            artifact_location=artifact_location(uri, sweep.experiment),
            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
        )


def _run_looks(p: _Plan, args) -> int:
    """``--until-decided``: the plan's looks in turn, each the first n seeds of the cells, judged
    after it has run; stops at the first look where every primary comparison is decided. A look
    after the first runs only the cells its open comparisons need (their arms at K and at the
    reference K): a comparison decided at an earlier look keeps its verdict and its alpha passes to
    the others (Maurer and Bretz 2013), so more seeds of its arms would change nothing the plan
    judges. A look already judged (a resumed study) is judged again for its open comparisons but not
    recorded twice."""
    from vaco.study.judge import plan_lines, read_judgements, record_judgement

    study = p.sweep.plan
    so_far: set[str] = set()  # the cells of the looks taken: each look is judged on all of them
    needed = None  # the comparisons the next look runs cells for (None: all)
    for k, seeds in enumerate(study.looks):
        cells = look_cells(p.cells, seeds, needed)
        narrowed = "" if needed is None else f", the arms of {'; '.join(c.label() for c in needed)}"
        say(f"look {k + 1} of {len(study.looks)}: the first {seeds} seeds of the cells ({len(cells)} cells{narrowed})")
        states = plan(p.sweep, cells, p.uri)
        states.update({c: "finished" for c in p.from_data if c in states})
        look = dataclasses.replace(p, cells=cells, states=states)
        if k > 0:  # the launcher of the previous look is spent: a fresh one for this look
            p.runner.close()
            p.runner = look.runner = launcher_class(p.launcher).from_args(p.sweep, p.uri, p.resources, args)
        rc = _run(look, args)
        if rc != 0:
            return rc
        if p.sweep.parent_run_id is None:  # nothing ran (every cell of the look had finished): find it
            p.sweep.parent_run_id = _parent_run_id(p)
        so_far |= {c.id for c in cells}
        judged = judge_look(p.sweep, p.uri, so_far, p.from_data)
        lines = plan_lines(judged)
        print("\n".join(lines), flush=True)
        tags = _parent_tags(p)
        before = [j for j in read_judgements(tags) if j.by == "until-decided" and j.seeds == judged.seeds]
        if before and all(states[c.id] == "finished" for c in cells):
            say(f"look {k + 1} ({judged.seeds} seeds) was judged at {before[0].at}: not recorded again")
        else:
            record_judgement(p.uri, p.sweep.parent_run_id, judged, "until-decided", lines)
        if judged.settled:
            say(f"every primary comparison is decided at look {k + 1} ({seeds} seeds): stopping before the next look")
            return 0
        needed = judged.open
    say(f"the last look ({study.looks[-1]} seeds) is reached; what is undecided stays undecided")
    return 0


def _parent_tags(p: _Plan) -> dict[str, str]:
    import mlflow

    return mlflow.MlflowClient(p.uri).get_run(p.sweep.parent_run_id).data.tags


def _parent_run_id(p: _Plan) -> str:
    import mlflow

    client = mlflow.MlflowClient(p.uri)
    _experiment(client, p.sweep, p.uri)  # a study whose every run so far is in --finished-in files
    exp = client.get_experiment_by_name(p.sweep.experiment)
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1)
    return found[0].info.run_id if found else parent_run(client, p.sweep, p.cells, p.record, p.record_from)


def close_parent_run(uri: str, sweep) -> bool:
    """Mark the sweep's parent run FINISHED once every cell has finished (a SLURM sweep leaves it
    RUNNING at submission: the cells finish after `vaco sweep` has returned)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(sweep.experiment)
    if exp is None:
        return False
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1)
    if found and found[0].info.status == "RUNNING":
        client.set_terminated(found[0].info.run_id, "FINISHED")
        return True
    return False


def _check_store(uri: str) -> None:

    try:
        check_tracking_store(uri)
    except TrackingStoreError as err:
        raise SweepError(str(err)) from None
