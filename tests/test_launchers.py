"""Sweeps beyond one machine: the SLURM launcher through submitit's local executor (the same job
code a cluster runs), the sbatch script it would submit, a real local Ray cluster whose worker is
killed mid-cell, a real `mlflow server` as the shared tracking store, and bad input refused
before any cell starts. One cell = one `vaco fit`, whatever launches it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from helpers.mlflow_server import closed_port, mlflow_server
from helpers.runs import CONFIGS, VACO, run_cli
from helpers.tiny_sweep import FIRST, ONLY, SECOND, TINY, cell_runs, parent_run
from vaco.run.checkpoint import CheckpointError, load_checkpoint


def _sweep(tmp_path: Path, uri: str, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return run_cli(
        "sweep",
        "--config",
        TINY,
        "--out",
        str(tmp_path / "out"),
        *args,
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": uri},
        timeout=timeout,
    )


# ---------------------------------------------------------------- SLURM (submitit)
def test_slurm_job_array_script_carries_the_sweeps_resources(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = _sweep(
        tmp_path,
        uri,
        "--launcher",
        "slurm",
        "--dry-run",
        "--partition",
        "gpu",
        "--account",
        "lab",
        "--cpus",
        "2",
        "--gpus",
        "1",
        "--mem-gb",
        "16",
        "--time-min",
        "600",
        "--array-parallelism",
        "3",
    )
    assert out.returncode == 0, out.stderr
    script = out.stdout.split("sbatch script:", 1)[1]
    for line in (
        "#SBATCH --array=0-4%3",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --mem=16GB",
        "#SBATCH --time=600",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=lab",
        "#SBATCH --signal=USR2@90",
    ):  # submitit's requeue signal: a preempted cell resumes
        assert line in script, line
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


@pytest.mark.slow
def test_slurm_without_submitit_is_refused_before_any_cell(tmp_path):
    code = (
        "import sys; sys.modules['submitit'] = None\n"
        "from vaco.commands.cli import main\n"
        f"sys.exit(main(['sweep', '--config', {str(TINY)!r}, '--out', {str(tmp_path / 'out')!r}, '--launcher', 'slurm']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}"),
    )
    assert out.returncode == 2 and "pip install -e '.[slurm]'" in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_slurm_dry_run_without_submitit_is_one_line_too(tmp_path):
    code = (
        "import sys; sys.modules['submitit'] = None\n"
        "from vaco.commands.cli import main\n"
        f"sys.exit(main(['sweep', '--config', {str(TINY)!r}, '--out', {str(tmp_path / 'out')!r}, '--launcher', 'slurm', '--dry-run']))\n"
    )
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip() == "vaco sweep: `--launcher slurm` needs submitit: pip install -e '.[slurm]'"


@pytest.mark.parametrize("damage", ["vaco-a-K1-s1: '123\nvaco-b-K1", "- 1\n- 2\n"], ids=["truncated", "not-a-mapping"])
@pytest.mark.parametrize("mode", ["--status", "--dry-run"])  # a dry run exited 0 and planned a submission
def test_a_damaged_jobs_record_is_one_line_naming_it(tmp_path, damage, mode):
    record = tmp_path / "out" / "submitit" / "jobs.yaml"
    record.parent.mkdir(parents=True)
    record.write_text(damage)
    out = run_cli(
        "sweep",
        "--config",
        str(TINY),
        "--out",
        str(tmp_path / "out"),
        *([mode] if mode == "--status" else [mode, "--launcher", "slurm"]),  # --status reads SLURM's record
        "--slurm-executor",
        "local",
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    (line,) = [line for line in out.stderr.splitlines() if line.strip()]
    assert line.startswith(f"vaco sweep: {record} is damaged (") and "delete it" in line


@pytest.mark.parametrize("odd", ["directory", "empty", "dangling-link"])
@pytest.mark.parametrize("mode", ["--dry-run", "submit"])
def test_an_odd_jobs_record_is_refused_before_anything_is_submitted(tmp_path, odd, mode):
    """A jobs.yaml that was a directory, empty or a dangling link read as "no record": the dry run
    said "2 new" and a real submit ran sbatch, then failed with a traceback, leaving a running job
    unrecorded. Now one line naming the file, exit 2, and nothing is submitted (no job folder)."""
    record = tmp_path / "out" / "submitit" / "jobs.yaml"
    record.parent.mkdir(parents=True)
    if odd == "directory":
        record.mkdir()
    elif odd == "empty":
        record.write_text("")
    else:
        record.symlink_to(tmp_path / "gone.yaml")
    before = set(record.parent.iterdir())
    out = run_cli(
        "sweep",
        "--config",
        str(TINY),
        "--out",
        str(tmp_path / "out"),
        *(["--dry-run"] if mode == "--dry-run" else []),
        "--launcher",
        "slurm",
        "--slurm-executor",
        "local",
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout[-2000:] + out.stderr[-3000:]
    (line,) = [x for x in out.stderr.splitlines() if x.strip() and not x.startswith("vaco sweep: warning:")]
    words = {"directory": "is not a file", "empty": "is empty", "dangling-link": "is a link to nothing"}[odd]
    assert line.startswith(f"vaco sweep: {record} {words}") and "delete it" in line, line
    assert set(record.parent.iterdir()) == before  # nothing submitted


# ---------------------------------------------------------------- Ray
@pytest.mark.slow
def test_ray_retries_a_cell_whose_worker_died_and_it_resumes_into_the_same_run(tmp_path):
    """A real local Ray cluster (2 CPUs, 127.0.0.1). The first cell's worker is SIGKILLed once
    the cell has a checkpoint; Ray retries the task, the cell resumes, one MLflow run per cell.
    `--save-data` writes the file as each cell finishes: it first appears holding one run, while
    the other cell still runs, and holds both at the end."""
    from vaco.report.runs import read_runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ledger = tmp_path / "ledger.csv.gz"
    log_path = tmp_path / "sweep.log"
    log_file = log_path.open("w")
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", RAY_DISABLE_USAGE_STATS="1")
    start = time.monotonic()
    sweep = subprocess.Popen(
        [
            VACO,
            "sweep",
            "--config",
            TINY,
            "--out",
            str(tmp_path / "out"),
            *ONLY,
            "--launcher",
            "ray",
            "--ray-cpus",
            "2",
            "--save-data",
            str(ledger),
        ],
        cwd=tmp_path,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    cell = tmp_path / "out" / FIRST
    killed = None
    try:
        deadline = time.monotonic() + 300
        while killed is None:
            assert sweep.poll() is None and time.monotonic() < deadline, "the cell ended before it could be killed"
            ckpt = cell / "checkpoints" / "last.ckpt"
            if ckpt.exists() and (cell / "worker.pid").exists():
                try:
                    if int(load_checkpoint(ckpt)["state_dict"]["version"]) >= 2:
                        killed = int((cell / "worker.pid").read_text())
                        os.kill(killed, signal.SIGKILL)  # the Ray worker running the cell
                except (CheckpointError, ValueError, ProcessLookupError):
                    killed = None
            time.sleep(0.1)
        first_seen = None  # the runs the data file holds when it first appears
        while sweep.poll() is None and time.monotonic() < deadline + 600:
            if first_seen is None and ledger.exists():
                first_seen = sorted(r.name for r in read_runs(ledger))
            time.sleep(0.1)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
            sweep.wait()
        log_file.close()
    elapsed = time.monotonic() - start
    print(f"ray (local cluster, 2 CPUs), 2 tiny cells with one worker killed: {elapsed:.0f} s")
    output = log_path.read_text()
    assert sweep.returncode == 0, output[-4000:]
    assert first_seen is not None and len(first_seen) == 1, first_seen  # saved after the first cell
    assert sorted(r.name for r in read_runs(ledger)) == sorted([FIRST, SECOND])
    runs = cell_runs(uri)
    assert sorted(runs) == sorted([FIRST, SECOND])
    for cell_id, found in runs.items():  # no duplicate MLflow runs, all finished
        assert len(found) == 1 and found[0].info.status == "FINISHED", cell_id
    log = (cell / "train.log").read_text()
    headers = [line for line in log.splitlines() if line.startswith("=== ")]
    assert len(headers) == 2 and "--ckpt_path" in headers[1], headers  # retried, and resumed
    assert int((cell / "worker.pid").read_text()) != killed  # by another worker


def test_an_unreachable_ray_address_is_refused_before_any_cell(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with closed_port() as port:
        out = _sweep(tmp_path, uri, "--launcher", "ray", "--ray-address", f"127.0.0.1:{port}")
    assert out.returncode == 2 and "`--ray-address`" in out.stderr and "no Ray cluster answers" in out.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- a shared tracking server
@pytest.mark.slow
def test_a_sweep_against_an_mlflow_server_with_a_database_backend_and_the_report_reads_it(tmp_path):
    backend = f"sqlite:///{tmp_path / 'server.db'}"  # a database backend (PostgreSQL on a cluster)
    with mlflow_server(backend, tmp_path, tmp_path / "server.log") as url:
        start = time.monotonic()
        out = _sweep(tmp_path, url, *ONLY, "--jobs", "2")
        print(f"local launcher against an mlflow server, 2 tiny cells: {time.monotonic() - start:.0f} s")
        assert out.returncode == 0, out.stdout[-3000:]
        runs = cell_runs(url)
        assert sorted(runs) == sorted([FIRST, SECOND]) and all(r[0].info.status == "FINISHED" for r in runs.values())
        report = run_cli(
            "report",
            "--experiment",
            "vaco-tiny",
            "--out",
            str(tmp_path / "report"),
            "--reps",
            "50",
            cwd=tmp_path,
            env={"MLFLOW_TRACKING_URI": url},
        )
        assert report.returncode == 0, report.stderr[-3000:]
        assert "2 finished runs" in (tmp_path / "report" / "summary.md").read_text()
        client = mlflow.MlflowClient(url)
        exp = client.get_experiment_by_name("vaco-tiny")
        (parent,) = client.search_runs([exp.experiment_id], filter_string="tags.`vaco.sweep.parent` = 'true'")
        assert "report/summary.md" in {a.path for a in client.list_artifacts(parent.info.run_id, "report")}


def test_an_unreachable_tracking_server_is_refused_before_any_cell(tmp_path):
    with closed_port() as port:
        out = _sweep(tmp_path, f"http://127.0.0.1:{port}", *ONLY)
    assert out.returncode == 2 and "no MLflow server answers" in out.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_launcher_is_refused(tmp_path):
    out = _sweep(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", "--launcher", "kubernetes")
    assert out.returncode == 2 and "`--launcher` must be one of local, ray, slurm or a class path" in out.stderr
    assert not (tmp_path / "mlflow.db").exists()  # refused before the store is opened (created, migrated)
    body = Path(TINY).read_text() + "launcher: kubernetes\n"
    (tmp_path / "s.yaml").write_text(body.replace("output_dir: sweeps/vaco-tiny", f"output_dir: {tmp_path / 'out'}"))
    out = run_cli(
        "sweep",
        "--config",
        str(tmp_path / "s.yaml"),
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    )
    assert out.returncode == 2 and "`launcher` must be one of local, ray, slurm or a class path" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    (tmp_path / "s.yaml").write_text(body.replace("launcher: kubernetes", "launcher: vaco.sweep.grid.Cell"))
    out = run_cli(
        "sweep", "--config", str(tmp_path / "s.yaml"), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": "sqlite:///x.db"}
    )
    assert out.returncode == 2 and "'vaco.sweep.grid.Cell' is not a vaco.sweep.launcher.Launcher" in out.stderr


# ---------------------------------------------------------------- the launcher seam
USER_LAUNCHER = """
from vaco.sweep.cells import prepare_cell, run_cell, say
from vaco.sweep.launcher import Launcher


class Serial(Launcher):
    \"\"\"One cell after the other, in this process's host: the smallest launcher.\"\"\"

    name = "serial"

    def launch(self, cells):
        failed = 0
        for cell in cells:
            code = run_cell(str(prepare_cell(self.sweep, cell, self.uri)), self.uri)
            say(f"serial: {cell.id} exited {code}")
            failed += code != 0
        return 1 if failed else 0
"""


@pytest.mark.slow
def test_every_launcher_inherits_one_base_and_a_users_launcher_runs_a_sweep_unedited(tmp_path):
    from vaco.sweep.launcher import Launcher, launcher_class, launcher_names

    assert launcher_names() == ["local", "ray", "slurm"]
    assert all(issubclass(launcher_class(name), Launcher) for name in launcher_names())
    (tmp_path / "my_launchers.py").write_text(USER_LAUNCHER)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = _sweep(tmp_path, uri, "--only", FIRST, "--launcher", "my_launchers.Serial")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"serial: {FIRST} exited 0" in out.stdout and "launcher my_launchers.Serial" in out.stdout
    runs = cell_runs(uri)
    assert list(runs) == [FIRST] and runs[FIRST][0].info.status == "FINISHED"
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("vaco-tiny")
    (parent,) = client.search_runs([exp.experiment_id], filter_string="tags.`vaco.sweep.parent` = 'true'")
    assert parent.info.status == "FINISHED"  # the base flow closed the sweep's parent run


@pytest.mark.slow
def test_a_password_in_an_http_tracking_uri_leaks_nowhere_with_either_launcher(tmp_path):
    """MLflow's client accepts http://user:password@host; its own "View run ... at: <URI>" lines,
    each cell's train.log and submitit's pickles must not carry the password. A real `mlflow server`
    behind MLflow's basic-auth app: the right password runs both launchers; a wrong one is one line
    naming MLFLOW_TRACKING_URI before any work (its /health is open to anyone: the check must
    authenticate). The SLURM launcher runs its cells as a job array through submitit's local
    executor (the job code a cluster runs), skips the cell the local launcher finished in the same
    store, and a rerun submits nothing."""
    secret = "Sup3rSecretPw"
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    with mlflow_server(
        f"sqlite:///{server_dir / 'server.db'}", server_dir, server_dir / "server.log", admin_password=secret
    ) as base:
        wrong = run_cli(
            "fit",
            "--config",
            str(CONFIGS / "demo.yaml"),
            cwd=tmp_path,
            env={"MLFLOW_TRACKING_URI": base.replace("http://", "http://admin:Wr0ng@")},
        )
        assert wrong.returncode == 2, wrong.stderr[-3000:]
        lines = [line for line in wrong.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in wrong.stderr, wrong.stderr[-3000:]
        assert (
            lines[0].startswith("vaco fit: error: `MLFLOW_TRACKING_URI`='http://***@127.0.0.1:")
            and "HTTP 401" in lines[0]
        )
        assert "Wr0ng" not in wrong.stdout + wrong.stderr and not list(tmp_path.glob("checkpoints"))
        uri = base.replace("http://", f"http://admin:{secret}@")
        (tmp_path / "local").mkdir()
        (tmp_path / "slurm").mkdir()
        local = _sweep(tmp_path / "local", uri, "--only", FIRST)
        slurm = _sweep(tmp_path / "slurm", uri, *ONLY, "--launcher", "slurm", "--slurm-executor", "local")
        for out in (local, slurm):
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert f"skip   {FIRST} (finished)" in slurm.stdout, slurm.stdout[-3000:]
        assert "submitted 1 cells as local job array" in slurm.stdout, slurm.stdout[-3000:]
        runs = cell_runs(uri)
        assert sorted(runs) == sorted([FIRST, SECOND])
        assert all(len(runs[c]) == 1 and runs[c][0].info.status == "FINISHED" for c in (FIRST, SECOND))
        # the cell ran as a submitit job: its log is in the submitit folder and its own
        assert list((tmp_path / "slurm" / "out" / "submitit").glob("*_log.out"))
        assert "vaco fit --config" in (tmp_path / "slurm" / "out" / SECOND / "train.log").read_text()
        again = _sweep(tmp_path / "slurm", uri, *ONLY, "--launcher", "slurm", "--slurm-executor", "local")
        assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout[-3000:]
    texts = {"stdout/stderr": "".join(o.stdout + o.stderr for o in (local, slurm, again))}
    for root in (tmp_path / "local", tmp_path / "slurm"):  # (the server's own files hold its admin password)
        for path in root.rglob("*"):
            if path.is_file() and path.suffix != ".ckpt":
                texts[str(path)] = path.read_bytes().decode("utf-8", "replace")
    assert any(p.endswith("_submitted.pkl") for p in texts) and any(p.endswith("train.log") for p in texts)
    assert any("View run" not in t and "iter" in t for p, t in texts.items() if p.endswith("train.log"))
    leaks = [p for p, t in texts.items() if secret in t]
    assert not leaks, leaks


# ---------------------------------------------------------------- a study in blocks
@pytest.mark.slow
def test_stop_after_ends_a_block_with_124_and_the_same_command_without_it_finishes(tmp_path):
    """The tiny sweep's first cell made 8x longer (256 iterations, ~15 s idle here), so that a 4 s
    limit stops it mid-run on any machine; the same command without the limit then finishes it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    body = Path(TINY).read_text()
    assert "data.init_args.total_steps: 4096" in body
    body = body.replace("data.init_args.total_steps: 4096", "data.init_args.total_steps: 32768")
    (tmp_path / "s.yaml").write_text(body.replace("output_dir: sweeps/vaco-tiny", f"output_dir: {tmp_path / 'out'}"))

    def sweep(*args):
        argv = ["sweep", "--config", str(tmp_path / "s.yaml"), "--only", FIRST, *args]
        return run_cli(*argv, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri}, timeout=900)

    block = sweep("--stop-after", "4s")
    assert block.returncode == 124, block.stdout[-3000:] + block.stderr[-3000:]
    assert "--stop-after 4s reached: stopping the sweep" in block.stdout
    assert "stopped: done 0/1" in block.stdout, block.stdout[-3000:]
    assert parent_run(uri).info.status == "KILLED"  # stopped, to be resumed: not FAILED
    checkpointed = (tmp_path / "out" / FIRST / "checkpoints" / "last.ckpt").is_file()
    print(f"--stop-after 4s stopped the cell {'with' if checkpointed else 'before'} a checkpoint")
    rest = sweep()
    assert rest.returncode == 0, rest.stdout[-3000:]
    assert parent_run(uri).info.status == "FINISHED"
    statuses = sorted(r.info.status for r in cell_runs(uri).get(FIRST, []))
    if checkpointed:  # stopped at an iteration boundary: resumed in the same MLflow run
        assert "(resume from checkpoint)" in rest.stdout and statuses == ["FINISHED"]
    else:  # stopped before its first iteration: started afresh, the unfinished run marked KILLED
        assert statuses in (["FINISHED"], ["FINISHED", "KILLED"]), statuses
    bad = sweep("--stop-after", "soon")
    assert bad.returncode == 2 and "--stop-after: invalid duration value: 'soon'" in bad.stderr
    elsewhere = sweep("--launcher", "slurm", "--stop-after", "1h", "--dry-run")
    assert elsewhere.returncode == 2 and "`--stop-after` is for the local launcher" in elsewhere.stderr


def test_stop_after_counts_from_the_command_over_every_look(tmp_path, monkeypatch):
    """`--until-decided` builds a fresh launcher for each look from the command's arguments; the
    limit is the command's, so a look's launcher built after it has passed starts nothing (a block
    that asked for 90 minutes once ran 90 minutes a look). The first look's launcher is built, the
    limit passes, then the next look's launcher is given a real cell of the tiny sweep: it returns
    124 without preparing it. A launcher that counted from its own launch would start the cell."""
    from vaco.sweep.grid import expand
    from vaco.sweep.loader import load_sweep
    from vaco.sweep.local_launcher import LocalLauncher
    from vaco.sweep.sweep_cli import _parser

    monkeypatch.setenv("VACO_SWEEP_ZYGOTE", "0")  # no zygote to start: launch() goes straight to its loop
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = load_sweep(TINY, str(tmp_path / "out"))
    (cell,) = [c for c in expand(sweep) if c.id == FIRST]
    args = _parser().parse_args(["--config", str(TINY), "--until-decided", "--stop-after", "1s"])
    first = LocalLauncher.from_args(sweep, uri, {}, args)
    first.close()
    time.sleep(1.2)
    later = LocalLauncher.from_args(sweep, uri, {}, args)  # what _run_looks does before each look after the first
    try:
        assert later.launch([cell]) == 124 and later.timed_out
    finally:
        later.close()
    assert not later.done and not later.running and not (tmp_path / "out" / FIRST).exists()
    fresh = _parser().parse_args(["--config", str(TINY), "--stop-after", "1h"])  # another command: its own clock
    assert LocalLauncher.from_args(sweep, uri, {}, fresh).deadline > time.monotonic() + 3500


@pytest.mark.slow
def test_ray_runs_a_population_as_one_task_with_a_run_per_member(tmp_path):
    """`population: 2` on a real local Ray cluster: seeds 1 and 2 of one cell are one Ray task
    (`vaco fit --population [1, 2]`), each member one FINISHED run named and tagged as its cell."""
    import yaml

    raw = yaml.safe_load(Path(TINY).read_text())
    raw["configs_dir"] = str(Path(TINY).parents[1])
    raw["population"] = 2
    raw["defaults"]["seed"] = [1, 2]
    raw["overrides"]["data.init_args.total_steps"] = 2 * 64 * 4
    sweep_file = tmp_path / "tiny-population.yaml"
    sweep_file.write_text(yaml.safe_dump(raw))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        "sweep",
        "--config",
        str(sweep_file),
        "--out",
        str(tmp_path / "out"),
        "--only",
        "vaco-inverted_pendulum-K2-s*",
        "--launcher",
        "ray",
        "--ray-cpus",
        "2",
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": uri, "RAY_DISABLE_USAGE_STATS": "1"},
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 cells run as 1 populations" in out.stdout and "done   vaco-inverted_pendulum-K2-s1+2" in out.stdout
    runs = cell_runs(uri, experiment=raw["experiment"])
    assert sorted(runs) == ["vaco-inverted_pendulum-K2-s1", "vaco-inverted_pendulum-K2-s2"]
    for cell_id, found in runs.items():
        assert len(found) == 1 and found[0].info.status == "FINISHED" and found[0].info.run_name == cell_id
        assert found[0].data.tags["vaco.population_member"] in ("0", "1")
