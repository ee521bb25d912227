"""How a sweep's cells run: one cell is one ``vaco fit`` process, whatever launches it.

* ``local``: :class:`LocalLauncher`, ``jobs`` subprocesses at a time on this host. Written by
  hand (not ``concurrent.futures`` or submitit's local executor) for what only it does: a cell
  is a process group stopped cleanly on Ctrl-C (SIGTERM, a grace period, then SIGKILL), every
  cell writes its own log, a failed cell prints the end of it, and progress lines with an ETA.
* ``slurm``: :class:`SlurmLauncher`, one submitit job array per sweep.
* ``ray``: :class:`RayLauncher`, one Ray task per cell.

Every launcher runs :func:`run_cell`, which decides at start whether the cell resumes (its
``last.ckpt`` exists) or starts afresh, so a requeued SLURM job or a retried Ray task resumes
from its checkpoint into the same MLflow run.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import yaml

from vaco.files import write_text_atomic
from vaco.sweep.grid import Cell, Sweep, cell_config
from vaco.sweep.schema import DEFAULT_ARRAY_PARALLELISM
from vaco.tracking import CELL_TAG, ENV_VAR, has_secrets, redact_uri

__all__ = ["LocalLauncher", "run_cell"]


# ---------------------------------------------------------------------------------------- one cell
def prepare_cell(sweep: Sweep, cell: Cell, tracking_uri: str) -> Path:
    """Write the cell's ``config.yaml`` into its folder (on storage every host can read)."""
    cell_dir = sweep.cell_dir(cell)
    cell_dir.mkdir(parents=True, exist_ok=True)
    header = (
        "# A cell of `vaco sweep`. The tracking store is not written here (a URI may hold credentials):\n"
        f"# the sweep ran it with MLFLOW_TRACKING_URI={redact_uri(tracking_uri)}. To rerun the cell by hand:\n"
        f"#   MLFLOW_TRACKING_URI=... vaco fit --config {cell_dir / 'config.yaml'}\n"
    )
    write_text_atomic(cell_dir / "config.yaml", header + yaml.safe_dump(cell_config(sweep, cell), sort_keys=False))
    return cell_dir


def cell_command(cell_dir: Path) -> list[str]:
    """``vaco fit`` for the cell, resuming from its checkpoint when there is one (decided now, so
    a requeued or retried job resumes)."""
    command = [sys.executable, "-m", "vaco.cli", "fit", "--config", str(cell_dir / "config.yaml")]
    ckpt = cell_dir / "checkpoints" / "last.ckpt"
    return command + ["--ckpt_path", str(ckpt)] if ckpt.is_file() else command


def cell_env(tracking_uri: str) -> dict[str, str]:
    return dict(
        os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", MLFLOW_TRACKING_URI=tracking_uri
    )


def _log_header(fh, command: list[str]) -> None:
    fh.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} vaco {' '.join(command[3:])}\n")
    fh.flush()


def run_cell(cell_dir: str, tracking_uri: str) -> int:
    """Run one cell to its end in this process's host (a SLURM job, a Ray worker) and return
    ``vaco fit``'s exit code. The cell's output goes to ``<cell_dir>/train.log``; the ``vaco fit``
    process dies with the caller (so a killed worker leaves no orphan behind)."""
    folder = Path(cell_dir)
    command = cell_command(folder)
    (folder / "worker.pid").write_text(str(os.getpid()))
    with open(folder / "train.log", "a") as fh:
        _log_header(fh, command)
        proc = subprocess.Popen(
            command,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=cell_env(tracking_uri),
            preexec_fn=_set_pdeathsig if sys.platform == "linux" else None,
        )
        try:
            return proc.wait()
        finally:
            if proc.poll() is None:  # the job is being stopped (preemption, cancel): let vaco fit stop cleanly
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()


# ---------------------------------------------------------------------------------------- running
@dataclasses.dataclass
class _Job:
    cell: Cell
    proc: subprocess.Popen
    log: Path
    started: float
    resumed: bool


def _set_pdeathsig() -> None:  # runs in the child: die with the sweep, even on SIGKILL
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


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


class LocalLauncher:
    """Runs cells as subprocesses, ``jobs`` at a time; SIGINT/SIGTERM stop it cleanly."""

    def __init__(
        self, sweep: Sweep, tracking_uri: str, jobs: int, grace: float, status_every: float, zygote=None
    ) -> None:
        import mlflow

        self.sweep, self.uri, self.jobs, self.grace = sweep, tracking_uri, jobs, grace
        self.status_every = status_every
        self.client = mlflow.MlflowClient(tracking_uri)
        self.running: dict[str, _Job] = {}
        self.done: list[tuple[Cell, float]] = []
        self.failed: list[Cell] = []
        self.stop_requested = 0
        self.total = 0
        self.zygote = zygote  # the preloaded process that forks the cells (vaco.sweep.zygote)

    def _on_signal(self, signum, _frame) -> None:
        self.stop_requested += 1
        name = signal.Signals(signum).name
        if self.stop_requested == 1:
            say(f"{name}: stopping the sweep (running cells are terminated; rerun the same command to resume)")
        else:
            say(f"{name} again: killing the running cells now")

    def run(self, cells: list[Cell]) -> int:
        pending = deque(cells)
        self.total = len(cells)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        last_status = time.monotonic()
        self.zygote = self._start_zygote()
        try:
            while (pending or self.running) and not self.stop_requested:
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
            return 130
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
        with open(log, "a") as fh:
            _log_header(fh, command)
        if self.zygote is not None and self.zygote.alive():  # `vaco fit` without its imports
            proc = self.zygote.start(command[3:], os.getcwd(), cell_env(self.uri), str(log))
            self.running[cell.id] = _Job(cell, proc, log, time.monotonic(), resumed)
            say(f"start  {cell.id}{' (resume from checkpoint)' if resumed else ''}   [{self._status(None)}]")
            return
        with open(log, "a") as fh:
            proc = subprocess.Popen(
                command,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=cell_env(self.uri),
                start_new_session=True,
                preexec_fn=_set_pdeathsig if sys.platform == "linux" else None,
            )
        self.running[cell.id] = _Job(cell, proc, log, time.monotonic(), resumed)
        say(f"start  {cell.id}{' (resume from checkpoint)' if resumed else ''}   [{self._status(None)}]")

    def _start_zygote(self):
        """The sweep's zygote (:mod:`vaco.sweep.zygote`; the one started early if given), unless
        ``VACO_SWEEP_ZYGOTE=0`` or it cannot start (then every cell is a plain subprocess: it
        computes the same)."""
        zygote, self.zygote = self.zygote, None
        if os.environ.get("VACO_SWEEP_ZYGOTE", "1") == "0" or sys.platform != "linux":
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
        return self.client.search_runs([exp.experiment_id], filter_string=f"tags.`{CELL_TAG}` = '{cell.id}'")

    def _finish(self, job: _Job) -> None:
        del self.running[job.cell.id]
        seconds = time.monotonic() - job.started
        code = job.proc.returncode
        finished = code == 0 and any(r.info.status == "FINISHED" for r in self._cell_runs(job.cell))
        if finished:
            self.done.append((job.cell, seconds))
            say(f"done   {job.cell.id} in {_hms(seconds)}   [{self._status(None)}]")
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
        if not eta:
            pass
        elif self.done and left > 0:
            mean = sum(s for _, s in self.done) / len(self.done)
            now = time.monotonic()
            busy = sum(max(mean - (now - j.started), 0.0) for j in self.running.values())
            queued = left - running
            text += f", ETA {_hms((queued * mean + busy) / self.jobs)}"
        elif left > 0:
            text += ", ETA after the first cell"
        if detail and self.running:
            now = time.monotonic()
            text += " | " + ", ".join(f"{j.cell.id} {_hms(now - j.started)}" for j in self.running.values())
        return text


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def see_results(sweep: Sweep) -> str:
    """The closing hint of a sweep: the commands that show its results, runnable from here."""
    from vaco.hints import vaco_command

    vaco = vaco_command()
    return f"see the results: {vaco} report --experiment {sweep.experiment}   (or browse the runs: {vaco} ui)"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------- clusters
SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001  # SLURM's own default, when `scontrol show config` cannot say


def max_array_size(env: dict | None = None) -> int:
    """The cluster's MaxArraySize (``scontrol show config``); SLURM's default 1001 where it cannot be read.
    A job array's indices must be below it, so one array holds at most this many cells."""
    import shutil

    if not shutil.which("scontrol"):
        return SLURM_DEFAULT_MAX_ARRAY_SIZE
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return SLURM_DEFAULT_MAX_ARRAY_SIZE
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize":
            try:
                return max(1, int(value.strip()))
            except ValueError:
                break
    return SLURM_DEFAULT_MAX_ARRAY_SIZE


def _cell_dirs(sweep: Sweep, cells: list[Cell], tracking_uri: str) -> list[str]:
    return [str(prepare_cell(sweep, cell, tracking_uri)) for cell in cells]


class CellJob:
    """What a SLURM array task runs: one cell, requeued by submitit on preemption or time-out
    (its ``checkpoint`` hook), after which :func:`run_cell` resumes it from ``last.ckpt``."""

    def __init__(self, tracking_uri: str) -> None:
        # submitit pickles this object into <sweep>/submitit/*_submitted.pkl on shared storage: a URI
        # with credentials is not kept here but read from the job's environment, which sbatch (and
        # the local executor) copy from the submitter's (SlurmLauncher.launch puts it there)
        self.tracking_uri = None if has_secrets(tracking_uri) else tracking_uri

    def __call__(self, cell_dir: str) -> int:
        uri = self.tracking_uri or os.environ.get(ENV_VAR)
        if not uri:
            raise RuntimeError(
                f"{ENV_VAR} is not set in the job's environment (a tracking URI with credentials travels only there)"
            )
        return _cell_result(run_cell(cell_dir, uri), cell_dir)

    def checkpoint(self, cell_dir: str):
        import submitit

        return submitit.helpers.DelayedSubmission(self, cell_dir)  # requeue: the cell resumes


class SlurmLauncher:
    """One submitit job array per sweep; ``vaco sweep`` returns once it is submitted.

    ``executor="local"`` runs the same jobs through submitit's local executor (real processes on
    this host, the same job code): what the tests use, and a way to try a sweep file first.
    """

    def __init__(self, sweep: Sweep, tracking_uri: str, resources: dict, executor: str = "slurm") -> None:
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise RuntimeError("`--launcher slurm` needs submitit: pip install -e '.[slurm]'") from None
        self.sweep, self.uri, self.resources, self.kind = sweep, tracking_uri, resources, executor
        self.folder = sweep.output_dir / "submitit"

    def parameters(self, n: int) -> dict:
        r = self.resources
        params = {
            "job_name": f"vaco-{self.sweep.experiment}",
            "cpus_per_task": r.get("cpus", 1),
            "time": r.get("time_min", 60 * 24),
            "mem": f"{r.get('mem_gb', 8)}GB",
            "array_parallelism": min(r.get("array_parallelism", DEFAULT_ARRAY_PARALLELISM), n),
        }
        if r.get("gpus"):
            params["gpus_per_node"] = r["gpus"]
        if r.get("partition"):
            params["partition"] = r["partition"]
        if r.get("account"):
            params["account"] = r["account"]
        return params

    def chunks(self, n: int) -> list[int]:
        """How many cells each job array of the submission holds: at most the cluster's MaxArraySize."""
        size = max_array_size() if self.kind == "slurm" else n or 1
        return [min(size, n - start) for start in range(0, n, size)] or [0]

    def submission_script(self, n: int) -> str:
        """The sbatch script of the (first) job array, as submitit writes it for this interpreter
        (``--dry-run`` prints it)."""
        import shlex

        from submitit.slurm.slurm import _make_sbatch_string  # what SlurmExecutor writes (no public name)

        n = self.chunks(n)[0]
        command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(self.folder))}"
        return _make_sbatch_string(command=command, folder=self.folder, map_count=n, **self.parameters(n))

    _ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING")

    def active_cells(self) -> set[str]:
        """Cells whose job from an earlier submission is still queued or running (never submitted twice)."""
        return set(self.job_states())

    def job_states(self) -> dict[str, str]:
        """Cell -> its job's scheduler state (PENDING, RUNNING, REQUEUED, ...), for the cells whose
        job from an earlier submission is still queued or running."""
        import submitit

        jobs = self.recorded_jobs()
        if not jobs:
            return {}
        if self.kind == "slurm":
            return self._squeue_states(jobs)
        job_class = submitit.LocalJob
        active = {}
        for cell_id, job_id in jobs.items():
            try:
                state = job_class(folder=self.folder, job_id=str(job_id)).state.upper()
            except Exception:  # noqa: BLE001 - a job the scheduler no longer knows is not active
                continue
            if state.split()[0] in self._ACTIVE:
                active[cell_id] = state.split()[0]
        return active

    def _squeue_states(self, jobs: dict) -> dict[str, str]:
        """The recorded jobs SLURM still holds, from ``squeue`` (submitit asks ``sacct``, which a
        cluster without job accounting cannot answer: its jobs would all look gone)."""
        import shutil

        if not jobs or not shutil.which("squeue"):
            return {}
        try:  # by the sweep's job name: `--jobs` with one id SLURM has forgotten fails as a whole
            out = subprocess.run(
                [
                    "squeue",
                    "--me",
                    "--noheader",
                    "--array",
                    "--format",
                    "%i %T",
                    "--name",
                    self.parameters(1)["job_name"],
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if out.returncode != 0:
            raise RuntimeError(
                f"`squeue` failed ({out.stderr.strip()[:200]}): cannot tell which cells are still queued"
            )
        held = dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)
        return {cell: held[str(job)] for cell, job in jobs.items() if held.get(str(job)) in self._ACTIVE}

    def unrecorded_jobs(self) -> list[str]:
        """Jobs of this sweep (by job name) that SLURM still holds but ``jobs.yaml`` does not record:
        a submitter killed between ``sbatch`` and the record. Their cells would run twice if
        submitted again. Empty where ``squeue`` is not available (submitit's local executor)."""
        import shutil

        if self.kind != "slurm" or not shutil.which("squeue"):
            return []
        name = self.parameters(1)["job_name"]
        try:
            out = subprocess.run(
                ["squeue", "--me", "--noheader", "--name", name, "--format", "%i"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
        if out.returncode != 0:
            return []
        recorded = {str(j).split("_")[0] for j in self.recorded_jobs().values()}
        held = {line.split()[0].split("_")[0] for line in out.stdout.splitlines() if line.strip()}
        return sorted(held - recorded)

    def recorded_jobs(self) -> dict[str, str]:
        """Cell id -> SLURM job id of every submission so far (``submitit/jobs.yaml``); a damaged
        record is a one-line error naming the file (it is written atomically, so only a hand edit
        or a full disk on another writer damages it)."""
        record = self.folder / "jobs.yaml"
        if not record.is_file():
            return {}
        try:
            jobs = yaml.safe_load(record.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            first = str(err).strip().splitlines()[0]
            raise RuntimeError(
                f"{record} is damaged ({first}): restore it from the submission's logs or, once no job of this "
                "sweep is queued or running, delete it"
            ) from None
        if not isinstance(jobs, dict) or not all(isinstance(k, str) for k in jobs):
            raise RuntimeError(
                f"{record} is damaged (expected `cell id: job id` lines, got a {type(jobs).__name__}): restore it "
                "from the submission's logs or, once no job of this sweep is queued or running, delete it"
            )
        return {k: str(v) for k, v in jobs.items()}

    def check_unrecorded(self) -> None:
        """Refuse to submit while SLURM holds jobs of this sweep that nothing records (one line)."""
        jobs = self.unrecorded_jobs()
        if jobs:
            raise RuntimeError(
                f"SLURM still holds job(s) {', '.join(jobs)} named {self.parameters(1)['job_name']!r} that "
                f"{self.folder / 'jobs.yaml'} does not record (a submission cut off before it was recorded?): "
                f"submitting again would run their cells twice; wait for them to end or `scancel {' '.join(jobs)}`, then rerun"
            )

    def launch(self, cells: list[Cell], wait: bool = False) -> int:
        import submitit

        active = self.active_cells()
        if active:
            say(f"still queued or running from an earlier submission, not submitted again: {', '.join(sorted(active))}")
        cells = [c for c in cells if c.id not in active]
        if not cells:
            return 0
        cell_dirs = _cell_dirs(self.sweep, cells, self.uri)
        if has_secrets(self.uri):  # the jobs read it from their environment, not from a pickle (CellJob)
            os.environ[ENV_VAR] = self.uri
        executor = submitit.AutoExecutor(folder=self.folder, cluster=None if self.kind == "slurm" else "local")
        record = self.folder / "jobs.yaml"
        jobs, arrays, start = [], [], 0
        for size in self.chunks(len(cells)):  # one job array per MaxArraySize cells
            params = self.parameters(size)
            executor.update_parameters(
                name=params["job_name"],
                timeout_min=params["time"],
                cpus_per_task=params["cpus_per_task"],
                gpus_per_node=params.get("gpus_per_node", 0),
                mem_gb=self.resources.get("mem_gb", 8),
                slurm_array_parallelism=params["array_parallelism"],
                **({"slurm_partition": params["partition"]} if "partition" in params else {}),
                **({"slurm_account": params["account"]} if "account" in params else {}),
            )
            chunk = executor.map_array(CellJob(self.uri), cell_dirs[start : start + size])
            ids = self.recorded_jobs()
            ids.update({cell.id: job.job_id for cell, job in zip(cells[start : start + size], chunk)})
            write_text_atomic(
                record, yaml.safe_dump(ids)
            )  # after each array; a kill mid-write leaves the old record whole
            jobs += chunk
            arrays.append(chunk[0].job_id.split("_")[0])
            start += size
        say(
            f"submitted {len(jobs)} cells as {self.kind} job array{'s' if len(arrays) > 1 else ''} {', '.join(arrays)}"
            f" ({self.parameters(len(jobs))['array_parallelism']} at once per array); logs in {self.folder}; "
            f"`vaco sweep --config {self.sweep.path} --status` shows their state, and a rerun once they end closes the sweep"
        )
        if not wait:
            return 0
        failed = 0
        for cell, job in zip(cells, jobs):
            try:
                job.result()
                say(f"done   {cell.id}")
            except Exception as err:  # noqa: BLE001 - submitit re-raises the job's failure
                failed += 1
                say(f"FAILED {cell.id}: {str(err).strip().splitlines()[-1][:300]}")
        return 1 if failed else 0


def run_cell_task(cell_dir: str, tracking_uri: str) -> int:
    """What a Ray task runs (a module-level function: Ray ships it by reference)."""
    return _cell_result(run_cell(cell_dir, tracking_uri), cell_dir)


def _cell_result(code: int, cell_dir: str) -> int:
    """A cell job's result: 0, else an error that says what the exit code means. 128 + SIGTERM or
    SIGUSR2 is a stop at an iteration boundary with a checkpoint (preemption, ``scontrol requeue``,
    ``scancel``): the job has not finished its cell, and a requeue or a rerun of the sweep resumes it."""
    if code == 0:
        return code
    stops = {128 + s: s.name for s in (signal.SIGTERM, signal.SIGUSR2)}
    if code in stops:
        raise RuntimeError(
            f"vaco fit was stopped by {stops[code]} (exit {code}) with a checkpoint at an iteration boundary; "
            f"the cell is not finished: a requeue or a rerun of the sweep resumes it ({cell_dir}/train.log)"
        )
    raise RuntimeError(f"vaco fit exited with code {code}; see {cell_dir}/train.log")


class RayLauncher:
    """One Ray task per cell (plain tasks, not Ray Tune: a cell already resumes itself from its
    checkpoint, and Tune's trial runner would add a second layer of trial state, schedulers and
    checkpoint handling that a grid of independent runs does not need).

    A worker or node that dies takes its cell's ``vaco fit`` with it; Ray retries the task
    (``max_retries``) and the retry resumes from the cell's last checkpoint into the same MLflow run.
    """

    def __init__(
        self, sweep: Sweep, tracking_uri: str, resources: dict, address: str | None = None, num_cpus: int | None = None
    ) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise RuntimeError("`--launcher ray` needs Ray: pip install -e '.[ray]'") from None
        self.sweep, self.uri, self.resources, self.address, self.num_cpus = (
            sweep,
            tracking_uri,
            resources,
            address,
            num_cpus,
        )
        if address:
            check_ray_address(address)

    def launch(self, cells: list[Cell]) -> int:
        import ray

        cell_dirs = _cell_dirs(self.sweep, cells, self.uri)
        if self.address:
            ray.init(address=self.address, log_to_driver=False)
        else:  # a local cluster on this host only
            import logging

            # its notices about a cluster only this process uses (a generated token, "Started a local
            # Ray instance") say nothing to the user; errors still show
            for name in ("ray._private.authentication.authentication_token_setup", "ray._private.worker", "ray.worker"):
                logging.getLogger(name).setLevel(logging.ERROR)
            ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
        stop = {"signal": 0}

        def on_signal(signum, _frame):
            stop["signal"] = signum

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            task = ray.remote(run_cell_task).options(
                num_cpus=self.resources.get("cpus", 1),
                num_gpus=self.resources.get("gpus", 0),
                max_retries=self.resources.get("max_retries", 3),
                retry_exceptions=False,
            )
            pending = {task.remote(d, self.uri): cell for d, cell in zip(cell_dirs, cells)}
            say(f"ray: {len(pending)} cells on {ray.cluster_resources().get('CPU', 0):.0f} CPUs")
            failed = 0
            while pending and not stop["signal"]:
                done, _ = ray.wait(list(pending), timeout=1.0)
                for ref in done:
                    cell = pending.pop(ref)
                    try:
                        ray.get(ref)
                        say(f"done   {cell.id}   [{len(pending)} left]")
                    except Exception as err:  # noqa: BLE001 - the task's error, or the worker's death
                        failed += 1
                        say(f"FAILED {cell.id}: {str(err).strip().splitlines()[-1][:300]}")
            if stop["signal"]:
                for ref in pending:
                    ray.cancel(ref, force=True)
                say(
                    f"stopped: done {len(cells) - len(pending) - failed}/{len(cells)}, failed {failed}; "
                    "rerun the same command to resume"
                )
                return 130
            say(f"sweep finished: done {len(cells) - failed}/{len(cells)}, failed {failed} (ray)")
            say(see_results(self.sweep))
            return 1 if failed else 0
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            ray.shutdown()


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Fail in seconds, naming the field, if nothing listens at a Ray cluster address."""
    import socket

    hostport = address.split("://", 1)[-1]
    if address == "auto":
        return
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return
    except (OSError, ValueError) as err:
        raise RuntimeError(f"`--ray-address` {address!r}: no Ray cluster answers there ({err})") from None
