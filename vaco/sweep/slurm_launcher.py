"""The SLURM launcher: one submitit job array per sweep (a cluster's MaxArraySize cells per array);
``vaco sweep`` returns once it is submitted, a preempted or timed-out cell is requeued and resumes.
``--slurm-executor local`` runs the same jobs through submitit's local executor."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import yaml

from vaco.files import YAMLTooLarge, load_yaml, write_text_atomic
from vaco.sweep.cells import cell_dirs, cell_result, run_cell, say
from vaco.sweep.grid import Cell, Sweep
from vaco.sweep.launcher import Launcher
from vaco.sweep.schema import DEFAULT_ARRAY_PARALLELISM
from vaco.tracking import ENV_VAR, has_secrets

__all__ = ["CellJob", "SlurmLauncher", "max_array_size"]

SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001  # SLURM's own default, when `scontrol show config` cannot say


def max_array_size(env: dict | None = None) -> int:
    """The cluster's MaxArraySize (``scontrol show config``); SLURM's default 1001 where it cannot be read.
    A job array's indices must be below it, so one array holds at most this many cells."""

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
        return cell_result(run_cell(cell_dir, uri), cell_dir)

    def checkpoint(self, cell_dir: str):
        import submitit

        return submitit.helpers.DelayedSubmission(self, cell_dir)  # requeue: the cell resumes


class SlurmLauncher(Launcher):
    """One submitit job array per sweep; ``vaco sweep`` returns once it is submitted.

    ``executor="local"`` runs the same jobs through submitit's local executor (real processes on
    this host, the same job code): what the tests use, and a way to try a sweep file first.
    """

    name = "slurm"
    answers_status = True

    def __init__(
        self, sweep: Sweep, tracking_uri: str, resources: dict, executor: str = "slurm", wait: bool = False
    ) -> None:
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise RuntimeError("`--launcher slurm` needs submitit: pip install -e '.[slurm]'") from None
        super().__init__(sweep, tracking_uri, resources)
        self.kind = executor
        self.wait = wait or executor == "local"  # submitit's local executor's jobs die with this process
        self.folder = sweep.output_dir / "submitit"

    @classmethod
    def add_arguments(cls, group) -> None:
        group.add_argument(
            "--slurm-executor",
            choices=("slurm", "local"),
            default="slurm",
            help="slurm: `local` runs the job array through submitit's local executor (try a sweep, test)",
        )
        group.add_argument(
            "--wait", action="store_true", help="slurm: wait for the jobs instead of returning once submitted"
        )

    @classmethod
    def from_args(cls, sweep, tracking_uri, resources, args) -> SlurmLauncher:
        return cls(sweep, tracking_uri, resources, executor=args.slurm_executor, wait=args.wait)

    def check_ready(self) -> None:
        self.check_unrecorded()
        self.active_cells()  # the scheduler answers (else one line here, not a traceback later)

    def describe(self, cells: list[Cell], states: dict[str, str]) -> str:
        todo = sum(1 for c in cells if states[c.id] != "finished")
        sizes = self.chunks(max(todo, 1))
        return (
            f"  {todo} cells to submit as {len(sizes)} job array(s) of at most {max(sizes)} "
            f"(the cluster's MaxArraySize), {self.parameters(max(sizes))['array_parallelism']} running at once per "
            "array (`resources.array_parallelism`; the sweep's `jobs` is the local launcher's)\n"
            "  the first job array's sbatch script:\n" + self.submission_script(max(todo, 1))
        )

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
            except (ValueError, OSError):  # a job id submitit cannot parse, a vanished folder: not active
                continue
            if state.split()[0] in self._ACTIVE:
                active[cell_id] = state.split()[0]
        return active

    def _squeue_states(self, jobs: dict) -> dict[str, str]:
        """The recorded jobs SLURM still holds, from ``squeue`` (submitit asks ``sacct``, which a
        cluster without job accounting cannot answer: its jobs would all look gone)."""

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
        fix = "restore it from the submission's logs or, once no job of this sweep is queued or running, delete it"
        if record.is_symlink() and not record.exists():
            raise RuntimeError(f"{record} is a link to nothing ({os.readlink(record)}): {fix}")
        if not record.exists():
            return {}
        if not record.is_file():
            raise RuntimeError(f"{record} is not a file (a directory or a device) where the job record belongs: {fix}")
        try:
            text = record.read_text()
        except OSError as err:
            raise RuntimeError(f"{record} cannot be read ({err.strerror or err}): {fix}") from None
        if not text.strip():
            raise RuntimeError(f"{record} is empty (a record is written whole, so something else emptied it): {fix}")
        try:
            jobs = load_yaml(text) or {}
        except (yaml.YAMLError, UnicodeDecodeError, YAMLTooLarge) as err:
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

    def launch(self, cells: list[Cell]) -> int:
        import submitit

        active = self.active_cells()
        if active:
            say(f"still queued or running from an earlier submission, not submitted again: {', '.join(sorted(active))}")
        cells = [c for c in cells if c.id not in active]
        if not cells:
            return 0
        dirs = cell_dirs(self.sweep, cells, self.uri)
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
            chunk = executor.map_array(CellJob(self.uri), dirs[start : start + size])
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
        if not self.wait:
            self.detached = True  # the cells finish after `vaco sweep` returns
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
