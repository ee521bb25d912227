"""What a sweep has done so far, read back from MLflow and the output folder: the cells' states,
the sweep's parent run, the lock that keeps two sweeps from running the same folder."""

from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import json
import os
import subprocess
from pathlib import Path

from vaco.files import SymlinkRefused, open_for_lock
from vaco.sweep.grid import Cell, Sweep, expand
from vaco.sweep.schema import SweepError
from vaco.tracking import CELL_TAG, PARENT_TAG, PLAN_TAG, SETTINGS_TAG, absolute_tracking_uri, search_all_runs

__all__ = [
    "resolve_tracking_uri",
    "sweep_runs",
    "plan",
    "parent_run",
    "lock",
    "check_plan",
    "check_output_dir",
    "carried_runs",
    "finished_runs",
    "plan_record_tags",
]


def resolve_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``, with a relative SQLite path made absolute
    (cells and the report then find the same store whatever their working directory)."""
    return absolute_tracking_uri()


def _sqlite_missing(uri: str) -> bool:
    return uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists()


def sweep_runs(client, experiment: str) -> list:
    """Every run of the experiment that carries a sweep cell tag."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return [r for r in search_all_runs(client, [exp.experiment_id]) if CELL_TAG in r.data.tags]


def plan(sweep: Sweep, cells: list[Cell], tracking_uri: str, with_running: bool = False) -> dict[str, str]:
    """Each cell's state: ``finished`` (skipped), ``resume`` (has a checkpoint) or ``new``; with
    ``with_running`` (``--status``), ``running`` where its MLflow run is running."""
    finished, running = set(), set()
    if not _sqlite_missing(tracking_uri):
        import mlflow

        client = mlflow.MlflowClient(tracking_uri)
        runs = sweep_runs(client, sweep.experiment)
        other = sorted({r.data.tags.get(SETTINGS_TAG) for r in runs} - {sweep.settings, None})
        if other:
            raise SweepError(
                f"`overrides`: experiment '{sweep.experiment}' already holds sweep runs made with other "
                f"shared overrides (settings {', '.join(other)}; this file: {sweep.settings}); "
                "results would mix. Use another `experiment` name."
            )
        finished = {r.data.tags[CELL_TAG] for r in runs if r.info.status == "FINISHED"}
        running = {r.data.tags[CELL_TAG] for r in runs if r.info.status == "RUNNING"} if with_running else set()
    states = {}
    for cell in cells:
        if cell.id in finished:
            states[cell.id] = "finished"
        elif cell.id in running:
            states[cell.id] = "running"
        elif (sweep.cell_dir(cell) / "checkpoints" / "last.ckpt").is_file():
            states[cell.id] = "resume"
        else:
            states[cell.id] = "new"
    return states


def lock(output_dir: Path):

    path = output_dir / ".sweep.lock"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        handle = open_for_lock(path)
    except SymlinkRefused as err:
        raise SweepError(f"`output_dir`: {err.strerror}") from None
    except OSError as err:
        raise SweepError(f"`output_dir`: cannot write the sweep's lock file {path} ({err.strerror})") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        handle.close()
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise SweepError(f"another `vaco sweep` is running on {output_dir} (it holds {path})") from None
        raise SweepError(
            f"`output_dir`: cannot lock {path} ({err.strerror or err}): the filesystem may not support file locks "
            "(some NFS mounts); put `output_dir` on a filesystem that does (a local disk, or NFS with locking)"
        ) from None
    return handle


def check_plan(sweep: Sweep, tracking_uri: str) -> None:
    """A study's plan is declared before its runs: refuse a sweep whose ``plan`` differs from the
    one its experiment's runs were made under (or adds one after runs exist), in one line."""
    if _sqlite_missing(tracking_uri):
        return
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    runs = sweep_runs(client, sweep.experiment)
    if not runs:
        return  # nothing run yet: the plan may still change (it is declared when the first cell starts)
    exp = client.get_experiment_by_name(sweep.experiment)
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1)
    tags = found[0].data.tags if found else {}
    before = tags.get(f"{PLAN_TAG}.digest")
    now = sweep.plan.digest if sweep.plan is not None else None
    if before == now:
        return
    if before is None:
        raise SweepError(
            f"`plan`: experiment '{sweep.experiment}' already holds {len(runs)} runs made without a plan; a plan is "
            "declared before the runs it judges: declare it in a new experiment (or judge these runs with "
            "`vaco report --plan FILE`, which labels the plan as declared after the runs)"
        )
    declared = tags.get(f"{PLAN_TAG}.declared", "?")
    raise SweepError(
        f"`plan`: experiment '{sweep.experiment}' was declared with another plan ({before}, declared {declared}; this "
        f"file's is {now or 'none'}) and holds {len(runs)} runs: a plan does not change after its runs exist; restore "
        "it, or declare the new plan in a new experiment"
    )


OUTPUT_DIR_TAG = "vaco.sweep.output_dir"  # the folder of the sweep's cells (configs, logs, checkpoints)


def check_output_dir(sweep: Sweep, tracking_uri: str) -> None:
    """A sweep's folder is part of its identity: its cells' checkpoints live there. Run from another
    working directory (the default folder is ``sweeps/<experiment>`` under it) the same experiment
    would list running cells as new and restart stopped ones from step 0; refuse that in one line
    naming the folder the experiment's parent run recorded. (An explicit ``--out`` is the user's
    choice of folder and is not checked.)"""
    if _sqlite_missing(tracking_uri):
        return
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(sweep.experiment)
    if exp is None:
        return
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1)
    first = found[0].data.tags.get(OUTPUT_DIR_TAG) if found else None
    if first is None or Path(first) == sweep.output_dir or not Path(first).exists():
        return  # new, the same folder, or the first one is gone (nothing there to repeat or lose)
    raise SweepError(
        f"`output_dir`: experiment '{sweep.experiment}' keeps its cells in {first}; this run would use "
        f"{sweep.output_dir} and repeat their work: run from the directory you first ran it in, or pass --out {first}"
    )


def parent_run(
    client, sweep: Sweep, cells: list[Cell], carried: dict[str, str] | None = None, carried_from: str | None = None
) -> str:
    """The sweep's parent run (made once, found again on a rerun): its cells are MLflow child
    runs of it, so the UI groups them, and `vaco report` logs its figures to it. A plan is declared
    when the parent is first made, unless ``carried`` (a plan record of the same plan, from the
    ``--finished-in`` file ``carried_from``) brings the declaration and the looks of an earlier store."""
    exp = client.get_experiment_by_name(sweep.experiment)
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1)
    grid = json.dumps(
        {b.name: {k: v for k, v in dataclasses.asdict(b).items() if v not in (None, ())} for b in sweep.blocks},
        default=str,
    )
    tags = {
        PARENT_TAG: "true",
        "vaco.sweep.name": sweep.experiment,
        "vaco.sweep.file": str(sweep.path),
        "vaco.sweep.grid": grid[:5000],
        "vaco.sweep.cells": str(len(expand(sweep))),
        SETTINGS_TAG: sweep.settings,
        OUTPUT_DIR_TAG: str(sweep.output_dir),
    }
    if sweep.plan is not None:
        plan_tags = {f"{PLAN_TAG}.digest": sweep.plan.digest, PLAN_TAG: json.dumps(sweep.plan.as_dict())[:5000]}
        if not found and carried is not None and carried.get(f"{PLAN_TAG}.digest") == sweep.plan.digest:
            plan_tags = {**carried, f"{PLAN_TAG}.carried_from": str(carried_from)}
        elif not found or found[0].data.tags.get(f"{PLAN_TAG}.digest") != sweep.plan.digest:
            plan_tags[f"{PLAN_TAG}.declared"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            commit = sweep_file_commit(sweep.path)
            if commit:
                plan_tags[f"{PLAN_TAG}.commit"] = commit
        tags.update(plan_tags)
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
    else:
        run_id = client.create_run(exp.experiment_id, run_name=f"sweep {sweep.experiment}", tags=tags).info.run_id
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    return run_id


def sweep_file_commit(path) -> str | None:
    """The commit that last changed the sweep file (``git log -1 -- FILE``), with its time, and whether
    the file has changes since; None outside a git work tree or for a file git does not track."""

    if path is None:
        return None
    path = Path(path).resolve()

    def git(*args: str) -> str:
        try:
            out = subprocess.run(
                ["git", "-C", str(path.parent), *args],
                capture_output=True,
                text=True,
                timeout=10,
                env={**os.environ, "TZ": "UTC"},
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    found = git("log", "-1", "--format=%h %cd", "--date=format-local:%Y-%m-%d %H:%M:%S UTC", "--", path.name)
    if not found:
        return None
    dirty = git("status", "--porcelain", "--", path.name)
    return found + (" (the file has uncommitted changes)" if dirty else "")


def carried_runs(sweep: Sweep, paths=()) -> dict:
    """Cell id -> (file, :class:`vaco.report.runs.Run`): the FINISHED runs the data files ``paths``
    (``--finished-in``) hold for the sweep's cells (same name, algorithm, K and seed; all the cells,
    whatever ``--only`` narrowed), the first file's where several hold one. A run whose coordinates
    are not its cell's is refused (SweepError naming the file). A data file keeps no sweep settings,
    so that these runs used the sweep file's ``overrides`` is the user's word."""
    if not paths:
        return {}
    from vaco.report.runs import read_runs

    cells = {c.id: c for c in expand(sweep)}
    found = {}
    for path in dict.fromkeys(paths):
        try:
            runs = read_runs(path)
        except (OSError, ValueError) as err:
            raise SweepError(f"`--finished-in {path}`: {str(err).removeprefix('`--data`: ')}") from None
        for run in runs:
            cell = cells.get(run.name)
            if cell is None or run.status != "FINISHED" or run.name in found:
                continue
            if (run.algorithm, run.K, run.seed) != (cell.algorithm, cell.K, cell.seed):
                raise SweepError(
                    f"`--finished-in {path}`: its run {run.name!r} is {run.algorithm} K={run.K} seed={run.seed}, "
                    f"but this sweep's cell of that name is {cell.algorithm} K={cell.K} seed={cell.seed}"
                )
            found[run.name] = (str(path), run)
    return found


def finished_runs(sweep: Sweep, uri: str, carried: dict | None = None, known: dict | None = None) -> list:
    """Every FINISHED run of the sweep's cells, in the sweep's cell order: this store's, and the
    ``carried`` ones (:func:`carried_runs`) of cells this store has not finished. ``known`` (run id
    -> Run, filled here) keeps the runs already read: a FINISHED run does not change, so a sweep
    that saves after every cell reads only the new ones."""
    from vaco.report.runs import load_runs

    cells = [c.id for c in expand(sweep)]
    found = {cell_id: run for cell_id, (_, run) in (carried or {}).items()}
    if not _sqlite_missing(uri):
        import mlflow

        if mlflow.MlflowClient(uri).get_experiment_by_name(sweep.experiment) is not None:
            for run in load_runs(sweep.experiment, uri, known=known)[0]:
                found[run.name] = run  # the store's run where a file holds one too
    return [found[c] for c in cells if c in found]


def plan_record_tags(sweep: Sweep, uri: str, carried: dict[str, str] | None = None) -> dict[str, str] | None:
    """The tags a declared plan's record keeps: the store's parent run's (its declaration and every
    recorded look), else ``carried`` (a ``--finished-in`` record, when nothing ran in this store);
    None for a sweep without a plan or with neither."""
    if sweep.plan is None:
        return None
    if not _sqlite_missing(uri):
        import mlflow

        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(sweep.experiment)
        if exp is not None:
            found = client.search_runs(
                [exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1
            )
            if found and found[0].data.tags.get(f"{PLAN_TAG}.digest") == sweep.plan.digest:
                return dict(found[0].data.tags)
    return carried
