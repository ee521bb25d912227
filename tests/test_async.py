"""Real asynchronous training (issue 7): actor processes keep collecting while the learner trains.

Real processes, real MuJoCo envs, a real Trainer, a real MLflow store, real signals: lag arises
on its own and is logged; a staleness limit drops stale batches; a killed actor stops the run
with a clear message and no orphan process, the checkpoint survives, a resumed run continues,
and Ctrl-C stops it cleanly too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import mlflow
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from helpers.actors import descendants, parallel_run, still_alive_after
from helpers.runs import CONFIGS, REPO, metric_histories
from helpers.runs import REAL_VACO as VACO  # the process tree is looked at: a real `vaco` process


def _values(history) -> list[float]:
    return [value for _, value in history]


class _RecordActors(Callback):
    pids: list[int] = []

    def on_train_batch_end(self, trainer, *args) -> None:
        self.pids = self.pids or trainer.datamodule.collector.actor_pids()


def _fit_and_check_lag(tmp_path, uri, **data) -> None:
    actors = _RecordActors()
    module, datamodule, trainer = parallel_run(
        tmp_path, uri, data_kwargs=dict(mode="async", total_steps=4 * 32 * 8, **data), callbacks=(actors,)
    )
    trainer.fit(module, datamodule=datamodule)
    history = metric_histories(uri, trainer.logger.run_id)

    ages = _values(history["lag/policy_age_max"])
    assert len(ages) == 8
    assert ages[0] == 0  # the first batches act with version 0, the learner's own
    # afterwards the actors collect while the learner trains: some batches come from older versions
    assert max(ages) >= 1, ages
    # backward TV (pi_T vs the acting policy) is 0 on fresh data and positive on stale data
    tv = dict(history["lag/backward_tv"])
    for step, age in history["lag/policy_age_mean"]:
        assert (tv[step] > 1e-4) if age > 0 else (tv[step] < 1e-5), (step, age, tv[step])
    # the actors were separate processes, and they are gone after the run
    assert len(actors.pids) == 2 and os.getpid() not in actors.pids
    # none outlives the run: polled until gone or 30 s (a sleep of 0.5 s raced a busy machine and
    # let an actor that never exits pass as long as it was slow to be seen)
    assert still_alive_after(actors.pids) == []


@pytest.mark.slow
def test_two_async_actors_produce_lag_and_it_is_logged(tmp_path, mlflow_uri):
    """Local actor processes (TorchRL's MultiAsyncCollector, pipes and shared memory)."""
    _fit_and_check_lag(tmp_path, mlflow_uri)


@pytest.mark.slow
def test_async_actors_over_torch_distributed_on_localhost(tmp_path, mlflow_uri):
    """The cluster transport: actors are ranks of a gloo group talking to the learner over TCP
    (TorchRL's DistributedCollector + DistributedWeightSyncScheme), started here as local processes."""
    _fit_and_check_lag(tmp_path, mlflow_uri, backend="distributed", launcher="mp")


@pytest.mark.slow
def test_staleness_limit_drops_old_batches(tmp_path, mlflow_uri):
    """M = 0: only batches from the learner's current version are trained on (the rest are logged as dropped)."""
    module, datamodule, trainer = parallel_run(
        tmp_path, mlflow_uri, data_kwargs=dict(mode="async", staleness_limit=0, total_steps=4 * 32 * 5)
    )
    trainer.fit(module, datamodule=datamodule)
    history = metric_histories(mlflow_uri, trainer.logger.run_id)
    assert _values(history["lag/policy_age_max"]) == [0.0] * 5
    dropped = _values(history["lag/dropped_batches"])
    assert dropped == sorted(dropped) and dropped[-1] >= 1  # cumulative count


# ---------------------------------------------------------------- crash, resume, Ctrl-C
def _fit(tmp_path: Path, *extra: str) -> subprocess.Popen:
    args = [
        VACO,
        "fit",
        "--config",
        str(CONFIGS / "env/inverted_pendulum.yaml"),
        "--config",
        str(CONFIGS / "algo/vaco.yaml"),
        "--config",
        str(CONFIGS / "collection/async2.yaml"),
        "--data.init_args.num_steps",
        "64",
        "--data.init_args.total_steps",
        str(4 * 64 * 200),
        "--data.init_args.eval_every",
        "0",
        "--checkpoint.every_n_iterations",
        "1",
        "--checkpoint.dirpath",
        str(tmp_path / "ckpt"),
        "--trainer.default_root_dir",
        str(tmp_path),
        *extra,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # own session: the test can send Ctrl-C to the whole process group, as a terminal does. SIGINT
    # back to its default in the child: a test run started in the background by a non-interactive
    # shell (`make test &`, some CI runners) inherits SIGINT ignored, and so would the run
    return subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _communicate(proc: subprocess.Popen, timeout: float = 120) -> str:
    """Wait for the run to exit; if it does not, dump its threads' stacks (SIGUSR1, see vaco.commands.cli)
    into the failure message before killing it."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        err = proc.communicate()[1]
        raise AssertionError(f"the run did not exit within {timeout} s; its stacks:\n{err[-8000:]}") from None


def _version(ckpt: Path) -> int:
    return int(torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]["version"])


def _wait_for_checkpoint(proc: subprocess.Popen, ckpt: Path, above: int, timeout: float = 180) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if ckpt.exists():
            try:
                version = _version(ckpt)
            except Exception:  # being written
                version = -1
            if version > above:
                return version
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"no checkpoint past version {above} within {timeout} s")


def _actors(pid: int) -> list[int]:
    return [p for p in descendants(pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text(errors="ignore")]


@pytest.mark.slow
def test_killed_actor_stops_cleanly_then_resume_continues_and_ctrl_c_stops(tmp_path, mlflow_uri):
    ckpt = tmp_path / "ckpt" / "last.ckpt"

    # 1. a run whose actor is killed mid-run
    proc = _fit(tmp_path)
    reached = _wait_for_checkpoint(proc, ckpt, above=1)
    children = descendants(proc.pid)
    actors = _actors(proc.pid)
    assert len(actors) == 2, children
    os.kill(actors[1], signal.SIGKILL)
    err = _communicate(proc)
    assert proc.returncode != 0
    assert "an actor process stopped" in err and "resume with `--ckpt_path" in err, err[-3000:]
    assert children
    assert not still_alive_after(children), "orphan processes left behind"
    stopped_at = _version(ckpt)  # the checkpoint loads, and holds the last completed iteration(s)
    assert stopped_at >= reached

    # 2. the resumed run continues in the same MLflow run
    proc = _fit(tmp_path, "--ckpt_path", str(ckpt))
    _wait_for_checkpoint(proc, ckpt, above=stopped_at)
    children = descendants(proc.pid)
    assert len(_actors(proc.pid)) == 2

    # 3. Ctrl-C (SIGINT to the process group, actors included) stops it as SIGTERM does: at the next
    # iteration boundary with a checkpoint there, the run KILLED, exit 130 (it was Lightning's
    # "Detected KeyboardInterrupt", exit 1, the run FAILED)
    os.killpg(proc.pid, signal.SIGINT)
    err = _communicate(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "stopped by SIGINT after iteration" in err and "KeyboardInterrupt" not in err
    assert children
    assert not still_alive_after(children), "orphan processes left behind"
    assert _version(ckpt) > stopped_at

    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("vaco").experiment_id])
    assert run.info.status == "KILLED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "time/iteration")]
    assert max(steps) > stopped_at * 4 * 64  # the resumed iterations are in the same run
