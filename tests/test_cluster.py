"""A sweep on a real one-node SLURM cluster and against a real PostgreSQL database (tests/helpers/services.py
starts them once per session): submission through `sbatch` as a job array, a cell requeued
mid-run with `scontrol requeue`, a lost submission record that must not lead to a second
submission, the parent run closed once the cells are done, and a PostgreSQL password that
appears in no artifact, param, tag, cell file or log line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from helpers.runs import CONFIGS, REAL_VACO, VACO
from helpers.services import postgres, slurm_cluster
from helpers.tiny_sweep import FIRST, ONLY, SECOND, TINY, cell_runs, parent_run

SECRET = "Pg-s3cr3t-7f1c"


@pytest.fixture(scope="module")
def slurm():
    env, why = slurm_cluster()
    if env is None:
        pytest.skip(why)
    return env


def _vaco(*args: str, cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [VACO, *args],
        cwd=cwd,
        env=dict(os.environ, OMP_NUM_THREADS="1", **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _squeue(env: dict) -> list[tuple[str, str]]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=dict(os.environ, **env), capture_output=True, text=True)
    return [tuple(line.split()) for line in out.stdout.splitlines() if line.strip()]


def _wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(1)


@pytest.mark.slow
def test_a_sweep_through_real_sbatch_survives_a_requeue_and_closes_its_parent_run(slurm, tmp_path):
    """`scontrol requeue` with the default checkpoint interval (10 iterations): the cell stops at the
    iteration boundary after SLURM's SIGTERM with a checkpoint there, and the requeued job resumes
    from it, logging every iteration once."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**slurm, "MLFLOW_TRACKING_URI": uri}
    raw = yaml.safe_load(Path(TINY).read_text())
    assert raw["overrides"].pop("checkpoint.every_n_iterations") == 1  # the default (10) instead
    iterations = 64  # long enough for SLURM's SIGTERM to arrive mid-run (a tiny iteration is ~0.1 s)
    raw["overrides"]["data.init_args.total_steps"] = 2 * 64 * iterations
    raw["configs_dir"] = str(Path(TINY).parents[1])
    sweep_file = tmp_path / "tiny-default-checkpoints.yaml"
    sweep_file.write_text(yaml.safe_dump(raw))
    out = _vaco(
        "sweep",
        "--config",
        str(sweep_file),
        "--out",
        str(tmp_path / "out"),
        *ONLY,
        "--launcher",
        "slurm",
        "--mem-gb",
        "2",
        "--time-min",
        "30",
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "submitted 2 cells as slurm job array" in out.stdout
    jobs = yaml.safe_load((tmp_path / "out" / "submitit" / "jobs.yaml").read_text())
    assert sorted(jobs) == sorted([FIRST, SECOND])
    # requeue the first cell after its third iteration, before its first periodic checkpoint (SLURM
    # sends SIGTERM; the cell stops after its iteration with a checkpoint); a requeued job waits for
    # its begin time, which the test moves to now
    log_file = tmp_path / "out" / FIRST / "train.log"
    deadline = time.monotonic() + 600
    while not (log_file.is_file() and re.search(r"^iter +3/", log_file.read_text(), re.M)):
        assert time.monotonic() < deadline, "the first cell's iteration 3: not within 600 s"
        time.sleep(0.05)
    job = str(jobs[FIRST])
    subprocess.run(["scontrol", "requeue", job], env=dict(os.environ, **slurm), check=True)
    _wait_until(lambda: any(j == job and s == "PENDING" for j, s in _squeue(slurm)), 120, "the requeued job pending")
    status = _vaco(
        "sweep", "--config", str(sweep_file), "--out", str(tmp_path / "out"), *ONLY, "--status", cwd=tmp_path, env=env
    )
    assert "launcher slurm" in status.stdout and re.search(rf"queued\s+{FIRST}", status.stdout), status.stdout
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=dict(os.environ, **slurm), check=True)
    _wait_until(lambda: not _squeue(slurm), 900, "every job of the array ending")
    runs = cell_runs(uri)
    assert sorted(runs) == sorted([FIRST, SECOND])
    client = mlflow.MlflowClient(uri)
    for cell, found in runs.items():
        assert len(found) == 1 and found[0].info.status == "FINISHED", cell
        steps = [m.step for m in client.get_metric_history(found[0].info.run_id, "time/iteration")]
        assert sorted(steps) == sorted(set(steps)) and len(steps) == iterations, (cell, steps)
    log = log_file.read_text()
    assert log.count("=== ") >= 2 and "--ckpt_path" in log  # it ran again, from its checkpoint
    stopped = re.search(r"stopped by SIGTERM after iteration (\d+)", log)
    assert stopped and 3 <= int(stopped.group(1)) < iterations, log[-3000:]
    # the requeued job resumed from the checkpoint of the stop (not the last periodic one, every 10)
    resumed = re.search(r"^iter +(\d+)/", log[stopped.end() :], re.M)
    assert resumed and int(resumed.group(1)) == int(stopped.group(1)) + 1, log[-3000:]
    # the parent run stays RUNNING while the cells run on their own; a rerun closes it
    assert parent_run(uri).info.status == "RUNNING"
    again = _vaco(
        "sweep",
        "--config",
        str(sweep_file),
        "--out",
        str(tmp_path / "out"),
        *ONLY,
        "--launcher",
        "slurm",
        cwd=tmp_path,
        env=env,
    )
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert parent_run(uri).info.status == "FINISHED"


def test_the_dry_run_shows_the_arrays_and_the_script_that_will_be_submitted(slurm, tmp_path):
    out = _vaco(
        "sweep",
        "--config",
        TINY,
        "--out",
        str(tmp_path / "out"),
        "--launcher",
        "slurm",
        "--dry-run",
        cwd=tmp_path,
        env={**slurm, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    )
    assert out.returncode == 0, out.stderr
    assert (
        "5 cells to submit as 2 job array(s) of at most 4 (the cluster's MaxArraySize), 4 running at once" in out.stdout
    )
    script = out.stdout.split("sbatch script:", 1)[1]
    assert "#SBATCH --array=0-3%4" in script  # this install's interpreter, not a bare `python`:
    assert re.search(
        rf"{re.escape(str(Path(sys.executable).parent))}/python[0-9.]* -u -m submitit.core._submit", script
    )
    assert "cells on other hosts cannot share one SQLite file safely" in out.stderr


@pytest.mark.slow
def test_a_submitter_killed_before_recording_its_jobs_does_not_submit_twice(slurm, tmp_path):
    """The state a submitter killed between `sbatch` and writing jobs.yaml leaves behind: the jobs
    are queued and nothing records them. The rerun asks SLURM and refuses, in one line. The five
    cells go as two job arrays (the test cluster's MaxArraySize is 4)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**slurm, "MLFLOW_TRACKING_URI": uri}
    slurm_env = dict(os.environ, **slurm)
    subprocess.run(["scontrol", "update", "PartitionName=debug", "State=DOWN"], env=slurm_env, check=True)
    try:  # jobs stay queued while the partition is down
        out = _vaco(
            "sweep",
            "--config",
            TINY,
            "--out",
            str(tmp_path / "out"),
            "--launcher",
            "slurm",
            "--mem-gb",
            "2",
            cwd=tmp_path,
            env=env,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "submitted 5 cells as slurm job arrays" in out.stdout
        record = tmp_path / "out" / "submitit" / "jobs.yaml"
        ids = yaml.safe_load(record.read_text())
        arrays = sorted({str(j).split("_")[0] for j in ids.values()}, key=int)
        assert len(ids) == 5 and len(arrays) == 2
        queued = sorted(j for j, _ in _squeue(slurm))
        record.unlink()
        again = _vaco(
            "sweep", "--config", TINY, "--out", str(tmp_path / "out"), "--launcher", "slurm", cwd=tmp_path, env=env
        )
        assert again.returncode == 2, again.stdout + again.stderr
        (line,) = [text for text in again.stderr.strip().splitlines() if not text.startswith("vaco sweep: warning")]
        assert f"SLURM still holds job(s) {', '.join(arrays)}" in line and "would run their cells twice" in line
        assert sorted(j for j, _ in _squeue(slurm)) == queued  # nothing was submitted again
    finally:
        subprocess.run(["scancel", "--user", "root"], env=slurm_env)
        subprocess.run(["scontrol", "update", "PartitionName=debug", "State=UP"], env=slurm_env, check=True)
        _wait_until(lambda: not _squeue(slurm), 120, "the queue emptying")


def _descends_from(pid: int, root: int) -> bool:
    """Whether process ``pid`` is ``root`` or one of its descendants (the parent chain in /proc)."""
    for _ in range(64):
        if pid == root:
            return True
        if pid <= 1:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4, the parent's pid
    return False


def _process_list(keep) -> list[tuple[int, str]]:
    """``(pid, command line)`` of the processes ``keep(pid)`` selects, as a second local account reads
    them: `ps -eww` run as `nobody` (through `runuser`, as root); elsewhere /proc/*/cmdline read by this
    account (world-readable: what any account sees)."""
    if os.geteuid() == 0 and shutil.which("runuser"):
        listing = subprocess.run(
            ["runuser", "-u", "nobody", "--", "ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True
        ).stdout
        rows = [line.strip().partition(" ") for line in listing.splitlines()]
        return [(int(pid), args) for pid, _, args in rows if pid.isdigit() and keep(int(pid))]
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if keep(int(pid)):
                out.append(
                    (int(pid), Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                )
        except OSError:
            continue
    return out


@pytest.mark.slow
def test_a_sweep_and_its_report_on_postgresql_leak_no_password(tmp_path):
    url, why = postgres(SECRET)
    if url is None:
        pytest.skip(why)
    env = {"MLFLOW_TRACKING_URI": url}
    # the sweep, its zygote and its cell run while every process's command line (world-readable) is read
    sweep = subprocess.Popen(
        [VACO, "sweep", "--config", TINY, "--out", str(tmp_path / "out"), "--only", FIRST],
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen, shown = set(), []
    while sweep.poll() is None:
        # the sweep's own processes only (the suite's other worker may be running a test whose typed
        # command holds the password on purpose)
        for _, args in _process_list(lambda pid: _descends_from(pid, sweep.pid)):
            seen.add(args.encode())
            if SECRET in args:
                shown.append(args)
        time.sleep(0.05)
    stdout, stderr = sweep.communicate(timeout=60)
    out = subprocess.CompletedProcess(sweep.args, sweep.returncode, stdout, stderr)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert not shown, shown
    assert any(b"fit" in c and b"config.yaml" in c for c in seen) or any(b"sweep" in c for c in seen)
    report = _vaco(
        "report", "--experiment", "vaco-tiny", "--out", str(tmp_path / "report"), "--reps", "20", cwd=tmp_path, env=env
    )
    assert report.returncode == 0, report.stderr[-3000:]
    client = mlflow.MlflowClient(url)
    runs = cell_runs(url)
    assert len(runs[FIRST]) == 1 and runs[FIRST][0].info.status == "FINISHED"
    texts = [out.stdout, out.stderr, report.stdout, report.stderr]
    exp = client.get_experiment_by_name("vaco-tiny")
    for run in client.search_runs([exp.experiment_id]):
        texts += [repr(run.data.params), repr(run.data.tags)]
        local = client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts" / run.info.run_id))
        for path in Path(local).rglob("*"):
            if path.is_file():
                texts.append(path.read_bytes().decode("utf-8", "replace"))
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file() and path.suffix != ".ckpt":
            texts.append(path.read_bytes().decode("utf-8", "replace"))
    for path in (tmp_path / "report").rglob("*.md"):
        texts.append(path.read_text())
    assert any("config.yaml" in t or "trainer:" in t for t in texts)  # the artifacts were read
    leaks = [t[max(0, t.find(SECRET) - 80) : t.find(SECRET) + 40] for t in texts if SECRET in t]
    assert not leaks, leaks
    assert "postgresql+psycopg://***@127.0.0.1" in out.stdout  # what the sweep shows of the store


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["ray", "slurm"])
def test_a_sweep_on_ray_or_slurm_puts_no_password_on_a_command_line_or_in_a_file(launcher, tmp_path, request):
    """The same store with a password, the cell run by a local Ray cluster or through real sbatch: no
    process of the sweep (the driver, Ray's GCS, raylet and workers; the SLURM job and its `vaco fit`)
    shows it on its command line, which every account reads, while the cell runs; no file the run leaves
    (the sweep's folder, Ray's session logs, submitit's pickles and logs) holds it; the run finishes."""
    url, why = postgres(SECRET)
    if url is None:
        pytest.skip(why)
    env = {"MLFLOW_TRACKING_URI": url}
    scratch = Path(tempfile.mkdtemp(prefix="vr", dir="/tmp"))  # Ray's sockets need a short path
    if launcher == "ray":
        pytest.importorskip("ray")
        env["RAY_TMPDIR"] = str(scratch)
        extra = ["--launcher", "ray", "--ray-cpus", "1"]
    else:
        env.update(request.getfixturevalue("slurm"))
        extra = ["--launcher", "slurm", "--mem-gb", "2", "--time-min", "30", "--wait"]
    sweep = subprocess.Popen(
        [VACO, "sweep", "--config", TINY, "--out", str(tmp_path / "out"), "--only", FIRST, *extra],
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen, shown = 0, []
    try:

        def ours(pid: int) -> bool:  # the sweep's processes, and the job SLURM starts in its folder
            try:
                return _descends_from(pid, sweep.pid) or str(tmp_path) in os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                return False

        while sweep.poll() is None:
            for _, args in _process_list(ours):
                seen += bool(args)
                if SECRET in args:
                    shown.append(args)
            time.sleep(0.05)
        stdout, stderr = sweep.communicate(timeout=60)
        assert sweep.returncode == 0, stdout[-3000:] + stderr[-3000:]
        assert not shown, shown
        assert seen > 3
        runs = cell_runs(url)
        assert len(runs[FIRST]) == 1 and runs[FIRST][0].info.status == "FINISHED"
        leaks = []
        for root in (tmp_path, scratch):
            for path in root.rglob("*"):
                if path.is_file() and not path.is_symlink() and path.suffix != ".ckpt" and path.stat().st_size < 50e6:
                    if SECRET.encode() in path.read_bytes():
                        leaks.append(str(path))
        assert not leaks, leaks
        assert SECRET not in stdout + stderr
    finally:
        if sweep.poll() is None:
            sweep.kill()
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.slow
def test_a_population_through_real_sbatch_is_one_job_that_survives_a_requeue(slurm, tmp_path):
    """`population: 2` on SLURM: two seeds of one cell are one array task (`vaco fit --population`);
    `scontrol requeue` mid-run stops both members at one iteration boundary with one checkpoint and
    the requeued job resumes both, each logging every iteration once into its own FINISHED run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**slurm, "MLFLOW_TRACKING_URI": uri}
    raw = yaml.safe_load(Path(TINY).read_text())
    iterations = 48
    raw["overrides"]["data.init_args.total_steps"] = 2 * 64 * iterations
    raw["overrides"].pop("checkpoint.every_n_iterations")  # the default (10): the stop writes its own
    raw["configs_dir"] = str(Path(TINY).parents[1])
    raw["population"] = 2
    raw["defaults"]["seed"] = [1, 2]
    sweep_file = tmp_path / "tiny-population.yaml"
    sweep_file.write_text(yaml.safe_dump(raw))
    args = ("--out", str(tmp_path / "out"), "--only", "vaco-inverted_pendulum-K2-s*", "--launcher", "slurm")
    out = _vaco("sweep", "--config", str(sweep_file), *args, "--mem-gb", "2", "--time-min", "30", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 cells run as 1 populations" in out.stdout and "submitted 1 cells as slurm job array" in out.stdout
    population = "vaco-inverted_pendulum-K2-s1+2"
    jobs = yaml.safe_load((tmp_path / "out" / "submitit" / "jobs.yaml").read_text())
    assert sorted(jobs) == [population]
    log_file = tmp_path / "out" / population / "train.log"
    deadline = time.monotonic() + 600
    while not (log_file.is_file() and re.search(r"^iter +3/", log_file.read_text(), re.M)):
        assert time.monotonic() < deadline, "the population's iteration 3: not within 600 s"
        time.sleep(0.05)
    job = str(jobs[population])
    subprocess.run(["scontrol", "requeue", job], env=dict(os.environ, **slurm), check=True)
    _wait_until(lambda: any(j == job and s == "PENDING" for j, s in _squeue(slurm)), 120, "the requeued job pending")
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=dict(os.environ, **slurm), check=True)
    _wait_until(lambda: not _squeue(slurm), 900, "the job ending")
    runs = cell_runs(uri, experiment=raw["experiment"])
    assert sorted(runs) == ["vaco-inverted_pendulum-K2-s1", "vaco-inverted_pendulum-K2-s2"]
    client = mlflow.MlflowClient(uri)
    for cell, found in runs.items():
        assert len(found) == 1 and found[0].info.status == "FINISHED", cell
        steps = [m.step for m in client.get_metric_history(found[0].info.run_id, "time/iteration")]
        assert sorted(steps) == sorted(set(steps)) and len(steps) == iterations, (cell, steps)
    log = log_file.read_text()
    stopped = re.search(r"stopped by SIGTERM after iteration (\d+)", log)
    assert stopped and "--ckpt_path" in log, log[-3000:]
    resumed = re.search(r"^iter +(\d+)/", log[stopped.end() :], re.M)
    assert resumed and int(resumed.group(1)) == int(stopped.group(1)) + 1, log[-3000:]


@pytest.mark.slow
def test_vaco_ui_on_postgresql_puts_no_password_on_any_command_line(tmp_path):
    """`vaco ui` on a PostgreSQL store (its URI, password included, in MLFLOW_TRACKING_URI): while the
    UI serves, no process's command line holds the password (every account reads them all: /proc/*/cmdline
    is world-readable; read here with `ps` as `nobody`), and the UI answers with the store's runs. `--store` with a password is refused in
    one line before anything starts."""
    import signal
    import urllib.request

    from helpers.mlflow_server import free_port

    url, why = postgres(SECRET)
    if url is None:
        pytest.skip(why)
    client = mlflow.MlflowClient(url)
    if client.get_experiment_by_name("vaco-ui-secret") is None:
        client.create_experiment("vaco-ui-secret")
    refused = _vaco("ui", "--store", url, cwd=tmp_path, env={}, timeout=60)
    assert refused.returncode == 2 and "`--store` carries user info or a secret" in refused.stderr, refused.stderr
    assert SECRET not in refused.stdout + refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    port = free_port()
    ui = subprocess.Popen(
        [VACO, "ui", "--port", str(port)],
        cwd=tmp_path,
        env=dict(os.environ, MLFLOW_TRACKING_URI=url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        line, lines, deadline = "", [], time.monotonic() + 120
        while "vaco_token=" not in line:
            assert ui.poll() is None and time.monotonic() < deadline, "".join(lines)
            line = ui.stdout.readline()
            lines.append(line)
        token = re.search(r"\?vaco_token=([\w-]+)#", line).group(1)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search",
            data=b'{"max_results": 50}',
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as found:  # the server reads the store it was given
            assert "vaco-ui-secret" in found.read().decode()
        seen = 0
        # this UI's processes (not another test's typed command), as a second account reads them
        for _, args in _process_list(lambda pid: _descends_from(pid, ui.pid)):
            seen += str(port) in args  # the UI's own processes (its server, its workers)
            assert SECRET not in args, args
        assert seen >= 1
        assert SECRET not in "".join(lines)
    finally:
        os.killpg(ui.pid, signal.SIGINT)
        try:
            ui.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()


@pytest.mark.slow
@pytest.mark.parametrize("collection", ["async2", "distributed2"])
def test_actor_processes_show_no_password_to_another_account(collection, tmp_path):
    """`vaco fit` with actor processes (multiprocessing actors, or torch.distributed ranks started by
    the mp launcher) on a PostgreSQL store with a password: the process list, read as `nobody` (a
    second local account) with `ps` while the actors collect, shows the actors and no password."""
    url, why = postgres(SECRET)
    if url is None:
        pytest.skip(why)
    fit = subprocess.Popen(
        [REAL_VACO, "fit", "--config", str(CONFIGS / "demo.yaml"), "--config", str(CONFIGS / f"collection/{collection}.yaml"),
         "--data.init_args.num_envs", "4", "--data.init_args.num_steps", "64", "--data.init_args.total_steps", str(4 * 64 * 6),
         "--data.init_args.eval_every", "0", "--model.init_args.num_minibatches", "4", "--model.init_args.update_epochs", "2",
         "--trainer.logger.init_args.log_model", "false"],
        cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_TRACKING_URI=url),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    actors, shown = set(), []
    while fit.poll() is None:
        # the run's processes (the suite's other worker may be running a command that holds it on purpose)
        for pid, args in _process_list(lambda pid: _descends_from(pid, fit.pid)):
            if "spawn_main" in args or "multiprocessing" in args:
                actors.add(pid)
            if SECRET in args:
                shown.append(args)
        time.sleep(0.2)
    out = fit.communicate(timeout=60)[0]
    assert fit.returncode == 0, out[-3000:]
    assert len(actors) >= 2, (actors, out[-2000:])  # the actors were seen, as the other account sees them
    assert not shown, shown
    assert SECRET not in out
