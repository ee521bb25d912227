"""One cell of a sweep: its folder and config, its ``vaco fit`` command and environment, and
:func:`run_cell`, which every launcher's job runs on the host it lands on."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

import vaco
from vaco.files import load_yaml, open_append, write_text_atomic
from vaco.hints import shell, vaco_command
from vaco.sweep.grid import Cell, Sweep, cell_config
from vaco.tracking import redact_uri

__all__ = [
    "cell_command",
    "cell_dirs",
    "cell_env",
    "cell_result",
    "log_header",
    "prepare_cell",
    "run_cell",
    "say",
    "see_results",
    "set_pdeathsig",
]


def prepare_cell(sweep: Sweep, cell: Cell, tracking_uri: str) -> Path:
    """Write the cell's ``config.yaml`` into its folder (on storage every host can read)."""
    cell_dir = sweep.cell_dir(cell)
    cell_dir.mkdir(parents=True, exist_ok=True)
    header = (
        "# A cell of `vaco sweep`. The tracking store is not written here (a URI may hold credentials):\n"
        f"# the sweep ran it with MLFLOW_TRACKING_URI={redact_uri(tracking_uri)}. To rerun the cell by hand:\n"
        f"#   MLFLOW_TRACKING_URI=... vaco fit --config {shell(cell_dir / 'config.yaml')}\n"
    )
    write_text_atomic(cell_dir / "config.yaml", header + yaml.safe_dump(cell_config(sweep, cell), sort_keys=False))
    return cell_dir


def cell_command(cell_dir: Path) -> list[str]:
    """``vaco fit`` for the cell, resuming from its checkpoint when there is one (decided now, so
    a requeued or retried job resumes). A resume restates the cell's budget on the command line:
    ``vaco fit`` otherwise keeps the checkpoint's, and the sweep file is what declares it."""
    config = cell_dir / "config.yaml"
    command = [sys.executable, "-m", "vaco.commands.cli", "fit", "--config", str(config)]
    ckpt = cell_dir / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        return command
    data = (load_yaml(config.read_text()) or {}).get("data") or {}
    init = (data.get("init_args") or {}) if isinstance(data, dict) else {}
    budget = [
        arg
        for field in ("total_steps", "num_steps")  # the MuJoCo and LLM budgets (num_steps cannot change in MuJoCo)
        if isinstance(init.get(field), int)
        for arg in (f"--data.init_args.{field}", str(init[field]))
    ]
    return command + budget + ["--ckpt_path", str(ckpt)]


def cell_env(tracking_uri: str) -> dict[str, str]:
    """A cell's environment: one thread, the store, and the vaco this sweep runs (the folder that
    holds the imported ``vaco`` first on ``PYTHONPATH``, and ``PYTHONSAFEPATH`` so that ``python -m``
    does not put the working directory first: a sweep started in another clone, or run from a
    worktree at a study's declared commit, must not have its cells import the clone's files)."""

    root = str(Path(vaco.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=path,
        PYTHONSAFEPATH="1",
        MLFLOW_TRACKING_URI=tracking_uri,
    )


def log_header(fh, command: list[str]) -> None:
    fh.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} vaco {' '.join(command[3:])}\n")
    fh.flush()


def run_cell(cell_dir: str, tracking_uri: str) -> int:
    """Run one cell to its end in this process's host (a SLURM job, a Ray worker) and return
    ``vaco fit``'s exit code. The cell's output goes to ``<cell_dir>/train.log``; the ``vaco fit``
    process dies with the caller (so a killed worker leaves no orphan behind)."""
    folder = Path(cell_dir)
    command = cell_command(folder)
    (folder / "worker.pid").write_text(str(os.getpid()))
    with open_append(folder / "train.log") as fh:
        log_header(fh, command)
        proc = subprocess.Popen(
            command,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=cell_env(tracking_uri),
            preexec_fn=set_pdeathsig if sys.platform == "linux" else None,
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


def set_pdeathsig() -> None:  # runs in the child: die with the sweep, even on SIGKILL
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def cell_dirs(sweep: Sweep, cells: list[Cell], tracking_uri: str) -> list[str]:
    return [str(prepare_cell(sweep, cell, tracking_uri)) for cell in cells]


def cell_result(code: int, cell_dir: str) -> int:
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


def see_results(sweep: Sweep) -> str:
    """The closing hint of a sweep: the commands that show its results, runnable from here."""
    vaco = vaco_command()
    return f"see the results: {vaco} report --experiment {shell(sweep.experiment)}   (or browse the runs: {vaco} ui)"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
