"""The tiny sweep the sweep, report, notebook and MLflow-server tests share (made once per session).

``interrupted_sweep`` runs the two main cells of configs/sweeps/tiny.yaml with one job, sends the
sweep process SIGINT as soon as the second cell has written its first checkpoint, records what it
sees, then runs the same command again (resume). ``full_sweep`` then runs the whole file, which
adds one cell per ablation and must skip the two finished cells; one new cell has a torn
checkpoint and fails, the others go on; a last run, after the bad file is removed, finishes it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

import mlflow
import torch

from helpers.runs import REPO, VACO

TINY = REPO / "configs" / "sweeps" / "tiny.yaml"
EXPERIMENT = "vaco-tiny"
FIRST, SECOND = "vaco-inverted_pendulum-K2-s1", "ppo_clip-inverted_pendulum-K2-s1"
ABLATIONS = (
    "vaco-inverted_pendulum-K2-delta0.4-s1",
    "vaco-inverted_pendulum-K2-rho2-s1",
    "vaco_no_realign-inverted_pendulum-K2-s1",
)
BROKEN = ABLATIONS[2]
ONLY = ["--only", FIRST, "--only", SECOND]
ITERATIONS = 32  # tiny.yaml: 4096 steps / (2 envs x 64 steps)

_cache: dict[str, object] = {}


@dataclasses.dataclass
class TinySweep:
    root: Path
    uri: str
    out: Path
    experiment: str = EXPERIMENT
    stopped_rc: int | None = None
    stopped_log: str = ""
    second_version_at_stop: int | None = None
    second_runs_at_stop: list = dataclasses.field(default_factory=list)  # (run_id, status)
    first_runs_at_stop: list = dataclasses.field(default_factory=list)
    leftover_processes: list = dataclasses.field(default_factory=list)
    resumed_rc: int | None = None
    resumed_log: str = ""
    failing_rc: int | None = None
    failing_log: str = ""
    full_rc: int | None = None
    full_log: str = ""

    def client(self) -> mlflow.MlflowClient:
        return mlflow.MlflowClient(self.uri)

    def cell_runs(self, cell: str) -> list:
        client = self.client()
        exp = client.get_experiment_by_name(self.experiment)
        return client.search_runs([exp.experiment_id], filter_string=f"tags.`vaco.sweep.cell` = '{cell}'")


ONLY = ["--only", FIRST, "--only", SECOND]  # the two main cells


def cell_runs(uri: str, experiment: str = EXPERIMENT) -> dict[str, list]:
    """Cell id -> its MLflow runs (a cell that ran twice would have two)."""
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    out: dict[str, list] = {}
    for run in client.search_runs([exp.experiment_id]):
        cell = run.data.tags.get("vaco.sweep.cell")
        if cell:
            out.setdefault(cell, []).append(run)
    return out


def parent_run(uri: str, experiment: str = EXPERIMENT):
    """The sweep's one parent run."""
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    (parent,) = client.search_runs([exp.experiment_id], filter_string="tags.`vaco.sweep.parent` = 'true'")
    return parent


def _env(uri: str) -> dict:
    return dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (children left behind)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def _run(args: list[str], sweep: TinySweep, log_name: str, timeout: float = 600) -> tuple[int, str]:
    log = sweep.root / log_name
    with open(log, "w") as fh:
        proc = subprocess.run(
            [VACO, "sweep", "--config", str(TINY), "--out", str(sweep.out), *args],
            cwd=sweep.root,
            env=_env(sweep.uri),
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
    return proc.returncode, log.read_text()


def interrupted_sweep(tmp_path_factory) -> TinySweep:
    """Run the two main cells, stop the sweep with SIGINT mid-way through the second, resume."""
    if "interrupted" in _cache:
        return _cache["interrupted"]
    root = tmp_path_factory.mktemp("tiny_sweep")
    sweep = TinySweep(root=root, uri=f"sqlite:///{root / 'mlflow.db'}", out=root / "out")
    ckpt = sweep.out / SECOND / "checkpoints" / "last.ckpt"
    log = root / "stopped.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [VACO, "sweep", "--config", str(TINY), "--out", str(sweep.out), "--jobs", "1", *ONLY],
            cwd=root,
            env=_env(sweep.uri),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 400
            while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
            sweep.stopped_rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    sweep.stopped_log = log.read_text()
    sweep.leftover_processes = _processes_mentioning(str(sweep.out))
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        sweep.second_version_at_stop = int(state["state_dict"]["version"])
    sweep.second_runs_at_stop = [(r.info.run_id, r.info.status) for r in sweep.cell_runs(SECOND)]
    sweep.first_runs_at_stop = [(r.info.run_id, r.info.status) for r in sweep.cell_runs(FIRST)]
    sweep.resumed_rc, sweep.resumed_log = _run([*ONLY, "--jobs", "1"], sweep, "resumed.log")
    _cache["interrupted"] = sweep
    return sweep


def full_sweep(tmp_path_factory) -> TinySweep:
    """The interrupted-and-resumed sweep, then the whole tiny.yaml (adds the three ablation cells).

    One of the new cells is given a torn checkpoint first, so that run must report it as failed
    and finish the others; after the bad file is removed, a last run does only that cell.
    """
    if "full" in _cache:
        return _cache["full"]
    sweep = interrupted_sweep(tmp_path_factory)
    broken = sweep.out / BROKEN / "checkpoints" / "last.ckpt"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"PK\x03\x04\x14\x00\x00\x00torn")  # a zip cut after its first header
    sweep.failing_rc, sweep.failing_log = _run(["--jobs", "2"], sweep, "failing.log")
    broken.unlink()
    sweep.full_rc, sweep.full_log = _run(["--jobs", "2"], sweep, "full.log")
    _cache["full"] = sweep
    return sweep
