"""``vaco sweep``: the command line (see :mod:`vaco.sweep`)."""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import os
import sys

from vaco.sweep.grid import Cell, Sweep, expand
from vaco.sweep.launchers import say
from vaco.sweep.loader import load_sweep, validate_with_cli
from vaco.sweep.schema import LAUNCHERS, RESOURCE_FIELDS, SweepError, check_resources
from vaco.sweep.state import lock, parent_run, plan, resolve_tracking_uri
from vaco.tracking import redact_uri

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
        "--all-cells", action="store_true", help="--dry-run/--status: list every cell, even in a large sweep"
    )
    parser.add_argument(
        "--grace", type=float, default=15.0, help="local: seconds a stopped cell gets to exit before SIGKILL"
    )
    parser.add_argument("--status-every", type=float, default=60.0, help="local: seconds between progress lines")
    launch = parser.add_argument_group("launchers (the sweep file's `launcher` and `resources`, overridden here)")
    launch.add_argument("--launcher", choices=LAUNCHERS, default=None, help="local (default), slurm (submitit), ray")
    launch.add_argument(
        "--ray-address",
        default=None,
        help="ray: a running cluster (host:port or ray://host:port); default: start a local one",
    )
    launch.add_argument(
        "--ray-cpus", type=int, default=None, help="ray: CPUs of the local cluster it starts (default: all)"
    )
    launch.add_argument(
        "--slurm-executor",
        choices=("slurm", "local"),
        default="slurm",
        help="slurm: `local` runs the job array through submitit's local executor (try a sweep, test)",
    )
    launch.add_argument(
        "--wait", action="store_true", help="slurm: wait for the jobs instead of returning once submitted"
    )
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
    runner: object | None  # the SLURM or Ray launcher (checked early); None for local, and Ray's --dry-run/--status
    states: dict[str, str]
    zygote: object | None = None  # the local launcher's zygote, started before the plan


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # a local sweep's zygote imports torch & co. on the other core while this process checks the plan
    zygote = _early_zygote(args)
    try:
        try:
            p = _plan(args)
        except (SweepError, RuntimeError) as err:
            print(f"vaco sweep: {err}", file=sys.stderr)
            return 2
        _say_plan(p, args)
        if args.dry_run or args.status:
            _list_cells(p, args)
            return 0
        if p.launcher != "local" and zygote is not None:
            zygote.close()
            zygote = None
        p.zygote, zygote = zygote, None  # the launcher closes it
        return _run(p, args)
    finally:
        if zygote is not None:
            zygote.close()


def _early_zygote(args):
    """Start the local launcher's zygote (:mod:`vaco.sweep.zygote`) now, if this is a local run."""
    if args.dry_run or args.status or args.launcher not in (None, "local"):
        return None
    if os.environ.get("VACO_SWEEP_ZYGOTE", "1") == "0" or sys.platform != "linux":
        return None
    from vaco.sweep.launchers import cell_env
    from vaco.sweep.zygote import Zygote
    from vaco.tracking import tracking_uri

    try:
        return Zygote(cell_env(tracking_uri()), wait=False)
    except OSError:
        return None


def _plan(args) -> _Plan:
    """Load and check everything (the file, the resources, the store, every cell's config) and find
    each cell's state; raises SweepError naming the field."""
    if args.jobs is not None and args.jobs < 1:
        raise SweepError(f"`--jobs` must be >= 1, got {args.jobs}")
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
    uri = resolve_tracking_uri()
    _check_store(uri)
    # SLURM's launcher is built for --dry-run and --status too (it writes the script, asks the
    # scheduler): a missing submitit is one line there as well. Ray's connects, so only to run.
    runner = (
        _launcher(launcher, sweep, uri, resources, args)
        if not (args.dry_run or args.status) or launcher == "slurm"
        else None
    )
    validate_with_cli(sweep, cells, uri)
    states = plan(sweep, cells, uri, with_running=args.status)
    if args.status and launcher == "slurm":
        for cell_id, state in runner.job_states().items():
            if states.get(cell_id) != "finished":
                states[cell_id] = "queued" if state in ("PENDING", "REQUEUED", "CONFIGURING") else "running"
    return _Plan(sweep, launcher, resources, cells, uri, runner, states)


def _say_plan(p: _Plan, args) -> None:
    sweep, launcher, uri, states = p.sweep, p.launcher, p.uri, p.states
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
    cells, states, sweep = p.cells, p.states, p.sweep
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
    if args.dry_run and p.launcher == "slurm":
        todo = sum(1 for c in cells if states[c.id] != "finished")
        slurm = p.runner
        sizes = slurm.chunks(max(todo, 1))
        print(
            f"  {todo} cells to submit as {len(sizes)} job array(s) of at most {max(sizes)} "
            f"(the cluster's MaxArraySize), {slurm.parameters(max(sizes))['array_parallelism']} running at once per array "
            "(`resources.array_parallelism`; the sweep's `jobs` is the local launcher's)"
        )
        print("  the first job array's sbatch script:\n" + slurm.submission_script(max(todo, 1)))


def _run(p: _Plan, args) -> int:
    """Run (or submit) the cells that have not finished, under the sweep's lock and parent run."""
    sweep, cells, states, uri, launcher, runner = p.sweep, p.cells, p.states, p.uri, p.launcher, p.runner
    for cell in cells:
        if states[cell.id] == "finished":
            say(f"skip   {cell.id} (finished)")
    todo = [c for c in cells if states[c.id] != "finished"]
    if not todo:
        closed = close_parent_run(uri, sweep)
        say("nothing to do: every cell has finished" + (" (the sweep's parent run is now FINISHED)" if closed else ""))
        return 0
    try:
        lock_file = lock(sweep.output_dir)
        if launcher == "slurm":
            runner.check_unrecorded()
            runner.active_cells()  # the scheduler answers (else one line here, not a traceback later)
    except (SweepError, RuntimeError) as err:
        print(f"vaco sweep: {err}", file=sys.stderr)
        return 2
    import mlflow

    from vaco.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    client = mlflow.MlflowClient(uri)
    if client.get_experiment_by_name(sweep.experiment) is None:  # once, before cells race to create it
        client.create_experiment(sweep.experiment, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    sweep.parent_run_id = parent_run(client, sweep, cells)
    status = "FAILED"
    try:
        if launcher == "local":
            from vaco.sweep.launchers import LocalLauncher

            rc = LocalLauncher(sweep, uri, args.jobs or sweep.jobs, args.grace, args.status_every, zygote=p.zygote).run(
                todo
            )
        elif launcher == "slurm":
            rc = runner.launch(todo, wait=args.wait or args.slurm_executor == "local")
            if rc == 0 and not (args.wait or args.slurm_executor == "local"):
                status = "RUNNING"  # submitted: the cells report to MLflow themselves
        else:
            rc = runner.launch(todo)
        status = status if status == "RUNNING" else {0: "FINISHED", 130: "KILLED"}.get(rc, "FAILED")
        return rc
    finally:
        if status != "RUNNING":
            client.set_terminated(sweep.parent_run_id, status)
        lock_file.close()


def close_parent_run(uri: str, sweep) -> bool:
    """Mark the sweep's parent run FINISHED once every cell has finished (a SLURM sweep leaves it
    RUNNING at submission: the cells finish after `vaco sweep` has returned)."""
    import mlflow

    from vaco.tracking import PARENT_TAG

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
    from vaco.tracking import TrackingStoreError, check_tracking_store

    try:
        check_tracking_store(uri)
    except TrackingStoreError as err:
        raise SweepError(str(err)) from None


def _launcher(name: str, sweep, uri: str, resources: dict, args):
    """The cluster launchers are built before anything starts: a missing package or an
    unreachable Ray address is an error before any cell runs."""
    from vaco.sweep.launchers import RayLauncher, SlurmLauncher

    if name == "slurm":
        return SlurmLauncher(sweep, uri, resources, executor=args.slurm_executor)
    if name == "ray":
        return RayLauncher(sweep, uri, resources, address=args.ray_address, num_cpus=args.ray_cpus)
    return None
