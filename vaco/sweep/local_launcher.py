"""The local launcher: a sweep's cells as ``vaco fit`` processes on this host, ``jobs`` at a time.

Written by hand (not ``concurrent.futures`` or submitit's local executor) for what only it does: a
cell is a process group stopped cleanly on Ctrl-C (SIGTERM, a grace period, then SIGKILL), every
cell writes its own log, a failed cell prints the end of it, progress lines carry an ETA, and cells
fork from a zygote that imported torch and friends once (:mod:`vaco.sweep.zygote`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from vaco.files import SymlinkRefused, open_append
from vaco.sweep.cells import cell_command, cell_env, log_header, prepare_cell, say, see_results, set_pdeathsig
from vaco.sweep.grid import Cell, Sweep
from vaco.sweep.launcher import Launcher
from vaco.tracking import CELL_TAG, tracking_uri

__all__ = ["LocalLauncher", "estimate_eta"]


@dataclasses.dataclass
class _Job:
    cell: Cell
    proc: subprocess.Popen
    log: Path
    started: float
    resumed: bool


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").replace("\r", "\n")
    except OSError:
        return "(no log)"
    return "\n".join("    " + ln for ln in [ln for ln in text.splitlines() if ln.strip()][-lines:])


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _zygote_wanted() -> bool:
    """Cells fork from a zygote unless ``VACO_SWEEP_ZYGOTE=0`` (or off Linux)."""
    return os.environ.get("VACO_SWEEP_ZYGOTE", "1") != "0" and sys.platform == "linux"


class LocalLauncher(Launcher):
    """Runs cells as subprocesses (forked from a preloaded zygote where it can), ``jobs`` at a
    time; SIGINT/SIGTERM stop it cleanly."""

    name = "local"

    def __init__(
        self,
        sweep: Sweep,
        tracking_uri: str,
        resources: dict,
        jobs: int = 1,
        grace: float = 15.0,
        status_every: float = 60.0,
        zygote=None,
        stop_after: float | None = None,
        deadline: float | None = None,
    ) -> None:
        import mlflow

        super().__init__(sweep, tracking_uri, resources)
        self.jobs, self.grace, self.status_every = jobs, grace, status_every
        self.client = mlflow.MlflowClient(tracking_uri)
        self.running: dict[str, _Job] = {}
        self.done: list[tuple[Cell, float, bool]] = []  # (cell, seconds, resumed from a checkpoint)
        self.failed: list[Cell] = []
        self.stop_requested = 0
        self.total = 0
        self.zygote = zygote  # the preloaded process that forks the cells (vaco.sweep.zygote)
        self.stop_after = stop_after  # seconds, then stop as on Ctrl-C (a block of a long study)
        # the time.monotonic() at which to stop: the command's, shared by the launcher of every look of
        # --until-decided (from_args); None: stop_after seconds from launch
        self.deadline = deadline
        self.timed_out = False
        self.stop_signal = signal.SIGINT  # the first signal that stopped the sweep (its exit code is 128 + it)

    @classmethod
    def add_arguments(cls, group) -> None:
        group.add_argument(
            "--grace", type=float, default=15.0, help="local: seconds a stopped cell gets to exit before SIGKILL"
        )
        group.add_argument("--status-every", type=float, default=60.0, help="local: seconds between progress lines")
        group.add_argument(
            "--stop-after",
            type=parse_duration,
            metavar="DURATION",
            help="local: run the sweep for this long (e.g. 90m, 1h30m, 5400; with --until-decided, all its looks "
            "together), then stop it as Ctrl-C does (the running cells checkpoint at their next iteration boundary; "
            "rerun to resume); exit code 124",
        )

    @classmethod
    def prestart(cls, args):
        """The zygote (:mod:`vaco.sweep.zygote`), importing while the sweep checks its plan."""
        if not _zygote_wanted():
            return None
        from vaco.sweep.zygote import Zygote

        try:
            return Zygote(cell_env(tracking_uri()), wait=False)
        except OSError:
            return None

    @classmethod
    def from_args(cls, sweep, tracking_uri, resources, args) -> LocalLauncher:
        zygote, args.prestarted = getattr(args, "prestarted", None), None
        stop_after = getattr(args, "stop_after", None)
        if stop_after is not None and getattr(args, "stop_deadline", None) is None:
            # one deadline for the command: --until-decided builds a launcher for each look from these args
            args.stop_deadline = time.monotonic() + stop_after
        return cls(
            sweep,
            tracking_uri,
            resources,
            jobs=args.jobs or sweep.jobs,
            grace=args.grace,
            status_every=args.status_every,
            zygote=zygote,
            stop_after=stop_after,
            deadline=getattr(args, "stop_deadline", None),
        )

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def _on_signal(self, signum, _frame) -> None:
        self.stop_requested += 1
        if self.stop_requested == 1:
            self.stop_signal = signum
        name = signal.Signals(signum).name
        if self.stop_requested == 1:
            say(f"{name}: stopping the sweep (running cells are terminated; rerun the same command to resume)")
        else:
            say(f"{name} again: killing the running cells now")

    def launch(self, cells: list[Cell]) -> int:
        pending = deque(cells)
        self.total = len(cells)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        last_status = time.monotonic()
        deadline = self.deadline
        if deadline is None and self.stop_after is not None:
            deadline = last_status + self.stop_after
        self.zygote = self._start_zygote()
        try:
            while (pending or self.running) and not self.stop_requested:
                if deadline is not None and time.monotonic() >= deadline:
                    self.stop_requested, self.timed_out = 1, True
                    say(
                        f"--stop-after {_hms(self.stop_after)} reached: stopping the sweep (running cells stop at their next iteration boundary)"
                    )
                    break
                while pending and len(self.running) < self.jobs and not self.stop_requested:
                    self._start(pending.popleft())
                for job in list(self.running.values()):
                    if job.proc.poll() is not None:
                        self._finish(job)
                if time.monotonic() - last_status >= self.status_every and self.running:
                    last_status = time.monotonic()
                    say(self._status(len(pending), detail=True))
                time.sleep(0.2)
        finally:
            if self.running:
                self._stop_all()
            if self.zygote is not None:
                self.zygote.close()
                self.zygote = None
            for s, handler in old.items():
                signal.signal(s, handler)
        if self.stop_requested:
            say(f"stopped: {self._status(len(pending), eta=False)}. Rerun the same command to resume.")
            return 124 if self.timed_out else 128 + int(self.stop_signal)
        say(f"sweep finished: {self._status(0)}")
        if self.failed:
            say("failed cells: " + ", ".join(c.id for c in self.failed))
        say(see_results(self.sweep))
        return 1 if self.failed else 0

    def _start(self, cell: Cell) -> None:
        cell_dir = prepare_cell(self.sweep, cell, self.uri)
        command = cell_command(cell_dir)
        resumed = "--ckpt_path" in command
        if not resumed:
            self._close_stale_runs(cell)
        log = cell_dir / "train.log"
        try:
            with open_append(log) as fh:
                log_header(fh, command)
        except SymlinkRefused as err:  # a link planted in a shared sweep folder: this cell fails, the others go on
            self.failed.append(cell)
            say(f"FAILED {cell.id}: {err.strerror}")
            return
        if self.zygote is not None and self.zygote.alive():  # `vaco fit` without its imports
            proc = self.zygote.start(command[3:], os.getcwd(), cell_env(self.uri), str(log))
            self.running[cell.id] = _Job(cell, proc, log, time.monotonic(), resumed)
            say(f"start  {cell.id}{' (resume from checkpoint)' if resumed else ''}   [{self._status(None)}]")
            return
        with open_append(log) as fh:
            proc = subprocess.Popen(
                command,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=cell_env(self.uri),
                start_new_session=True,
                preexec_fn=set_pdeathsig if sys.platform == "linux" else None,
            )
        self.running[cell.id] = _Job(cell, proc, log, time.monotonic(), resumed)
        say(f"start  {cell.id}{' (resume from checkpoint)' if resumed else ''}   [{self._status(None)}]")

    def _start_zygote(self):
        """The sweep's zygote (:mod:`vaco.sweep.zygote`; the one started early if given), unless
        ``VACO_SWEEP_ZYGOTE=0`` or it cannot start (then every cell is a plain subprocess: it
        computes the same)."""
        zygote, self.zygote = self.zygote, None
        if not _zygote_wanted():
            if zygote is not None:
                zygote.close()
            return None
        from vaco.sweep.zygote import Zygote

        try:
            zygote = zygote or Zygote(cell_env(self.uri), wait=False)
            zygote.wait_ready()
            return zygote
        except (RuntimeError, OSError) as err:
            if zygote is not None:
                zygote.close()
            say(f"cells start as subprocesses ({err})")
            return None

    def _close_stale_runs(self, cell: Cell) -> None:
        """A cell that starts afresh marks its earlier runs that never ended (killed before their
        first checkpoint) as KILLED, so the MLflow UI does not show them as running."""
        for run in self._cell_runs(cell):
            if run.info.status == "RUNNING":
                self.client.set_terminated(run.info.run_id, "KILLED")

    def _cell_runs(self, cell: Cell) -> list:
        exp = self.client.get_experiment_by_name(self.sweep.experiment)
        if exp is None:
            return []
        ids = [member.id for member in getattr(cell, "members", (cell,))]  # a population: its members' runs
        return [
            run
            for cell_id in ids
            for run in self.client.search_runs([exp.experiment_id], filter_string=f"tags.`{CELL_TAG}` = '{cell_id}'")
        ]

    def _finish(self, job: _Job) -> None:
        del self.running[job.cell.id]
        seconds = time.monotonic() - job.started
        code = job.proc.returncode
        runs = self._cell_runs(job.cell)
        members = {m.id for m in getattr(job.cell, "members", (job.cell,))}  # a population: every member
        finished = code == 0 and members <= {r.data.tags.get(CELL_TAG) for r in runs if r.info.status == "FINISHED"}
        if finished:
            self.done.append((job.cell, seconds, job.resumed))
            say(f"done   {job.cell.id} in {_hms(seconds)}   [{self._status(None)}]")
            if self.on_cell_done is not None:
                self.on_cell_done()
            return
        if self.stop_requested:
            return
        self.failed.append(job.cell)
        say(
            f"FAILED {job.cell.id} (exit code {code}) after {_hms(seconds)}   [{self._status(None)}]\n"
            f"  last lines of {job.log}:\n{_tail(job.log)}"
        )

    def _stop_all(self) -> None:
        for job in self.running.values():
            _signal_group(job.proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while self.running and time.monotonic() < deadline and self.stop_requested < 2:
            for job in list(self.running.values()):
                if job.proc.poll() is not None:
                    self._finish(job)
            time.sleep(0.1)
        for job in list(self.running.values()):
            _signal_group(job.proc, signal.SIGKILL)
            job.proc.wait()
            self._finish(job)

    def _status(self, pending: int | None, detail: bool = False, eta: bool = True) -> str:
        done, failed, running = len(self.done), len(self.failed), len(self.running)
        left = self.total - done - failed
        text = f"done {done}/{self.total}, running {running}, failed {failed}"
        if eta and left > 0:
            now = time.monotonic()
            seconds = estimate_eta(
                [s for _, s, resumed in self.done if not resumed],
                [now - j.started for j in self.running.values()],
                left - running,
                self.jobs,
            )
            if seconds is not None:
                text += f", ETA {_hms(seconds)}"
            elif self.done:  # only resumed cells so far: their times are parts of runs
                text += ", ETA after the first cell run from its start"
            else:
                text += ", ETA after the first cell"
        if detail and self.running:
            now = time.monotonic()
            text += " | " + ", ".join(f"{j.cell.id} {_hms(now - j.started)}" for j in self.running.values())
        return text


def estimate_eta(whole: list[float], running: list[float], queued: int, jobs: int) -> float | None:
    """Seconds until a sweep ends, estimated from ``whole``, the times of the cells done that ran
    from their start (a cell resumed from a checkpoint ran only the rest of its run: its time would
    make the estimate too short), ``running`` the seconds each running cell has run so far, ``queued`` cells not started and
    ``jobs`` at a time; ``None`` until one whole cell is done. A running cell has the mean time
    left minus what it ran (for a resumed one an upper bound: what it ran before its stop is
    not known here)."""
    if not whole:
        return None
    mean = sum(whole) / len(whole)
    busy = sum(max(mean - elapsed, 0.0) for elapsed in running)
    return (queued * mean + busy) / jobs


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number of seconds (``5400``) or hours / minutes / seconds (``1h30m``, ``90m``,
    ``45s``); argparse turns the ValueError into a one-line error naming the option."""

    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or match is None:
        raise ValueError(text)
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise ValueError(text)
    return total


parse_duration.__name__ = "duration"  # argparse's message: "invalid duration value: 'x'"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
