"""Issue 23's faults on a shared cluster, each a test named after it: credentials in tracking URIs,
sweep-file strings that would inject into job scripts or escape `output_dir`, file modes on shared
storage, locks, module shadowing, and metrics the server refuses or the disk cannot hold.
Real parts throughout: an HTTP server that demands basic auth, a SQLite MLflow store, real files,
real subprocesses."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import mlflow
import pytest
import yaml

from vaco.files import write_text_atomic
from vaco.sweep import SweepError, cell_config, expand, load_sweep
from vaco.sweep.state import lock
from vaco.tracking import TrackingStoreError, check_tracking_store, has_secrets, redact_uri

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "sweeps" / "tiny.yaml"
SECRET = "s3cr3t-pw"


# ---------------------------------------------------------------------------------------- credentials
@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (f"postgresql://vaco:{SECRET}@db.example:5432/mlflow", "postgresql://***@db.example:5432/mlflow"),
        (f"https://{SECRET}@mlflow.example", "https://***@mlflow.example"),
        (f"http://user:{SECRET}@127.0.0.1:5000/", "http://***@127.0.0.1:5000/"),
        (
            f"postgresql://db/mlflow?sslmode=require&password={SECRET}",
            "postgresql://db/mlflow?sslmode=require&password=***",
        ),
        ("sqlite:////abs/path/mlflow.db", "sqlite:////abs/path/mlflow.db"),
        ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)
def test_credentials_leak_redact_uri_hides_user_info_and_secret_values(uri, shown):
    assert redact_uri(uri) == shown
    assert SECRET not in redact_uri(uri)
    assert has_secrets(uri) == (uri != shown)


class _BasicAuthHealth(BaseHTTPRequestHandler):
    expected = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()

    def do_GET(self):  # noqa: N802 - http.server's name
        ok = self.headers.get("Authorization") == self.expected
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b"OK" if ok else b"")

    def log_message(self, *args):
        pass


def test_credentials_in_the_uri_are_refused_no_more_the_check_sends_them_as_basic_auth():
    """MLflow's client sends http://user:password@host as basic auth to host; so does the check,
    and its refusal message names the setting without the password."""
    server = HTTPServer(("127.0.0.1", 0), _BasicAuthHealth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        check_tracking_store(f"http://alice:{SECRET}@127.0.0.1:{port}", field="MLFLOW_TRACKING_URI")
        with pytest.raises(TrackingStoreError) as err:
            check_tracking_store(f"http://alice:wrong-{SECRET}@127.0.0.1:{port}", field="MLFLOW_TRACKING_URI")
        assert "HTTP 401" in str(err.value) and SECRET not in str(err.value) and "***@127.0.0.1" in str(err.value)
    finally:
        server.shutdown()


def test_credentials_leak_cell_configs_hold_no_tracking_uri(tmp_path, monkeypatch):
    """A sweep cell's config.yaml (on shared storage) never holds the tracking URI: the launcher
    gives the cell MLFLOW_TRACKING_URI in its environment."""
    from vaco.sweep.cells import cell_env, prepare_cell

    uri = f"postgresql://vaco:{SECRET}@db.example/mlflow"
    sweep = load_sweep(TINY, str(tmp_path / "out"))
    cell = expand(sweep)[0]
    text = (prepare_cell(sweep, cell, uri) / "config.yaml").read_text()
    assert SECRET not in text and "postgresql://***@db.example/mlflow" in text
    config = yaml.safe_load(text)
    assert "tracking_uri" not in config["trainer"]["logger"]["init_args"]
    assert "tracking_uri" not in cell_config(sweep, cell)["trainer"]["logger"]["init_args"]
    assert cell_env(uri)["MLFLOW_TRACKING_URI"] == uri


def test_credentials_leak_the_config_artifact_is_redacted():
    from jsonargparse import Namespace

    from vaco.run.callbacks import redacted_config

    uri = f"https://{SECRET}@mlflow.example"
    config = Namespace(trainer=Namespace(logger=Namespace(init_args=Namespace(tracking_uri=uri, experiment_name="x"))))
    shown = redacted_config(config)
    assert shown.trainer.logger.init_args.tracking_uri == "https://***@mlflow.example"
    assert config.trainer.logger.init_args.tracking_uri == uri  # the running logger keeps the real one


# ---------------------------------------------------------------------------------------- sweep files
def _sweep_file(tmp_path: Path, **changes) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    raw["configs_dir"] = str(REPO / "configs")
    for key, value in changes.items():
        raw[key] = value
        if value is None:  # a field left out
            del raw[key]
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_injection_through_sweep_files_a_newline_in_experiment_is_refused(tmp_path):
    with pytest.raises(SweepError, match=r"^`experiment` holds a control character"):
        load_sweep(_sweep_file(tmp_path, experiment="x\nsrun rm -rf ~"))


@pytest.mark.parametrize("field", ["partition", "account"])
def test_injection_through_sweep_files_slurm_names_are_plain(tmp_path, field):
    with pytest.raises(SweepError, match=rf"^`resources.{field}` = "):
        load_sweep(_sweep_file(tmp_path, resources={field: "gpu\n#SBATCH --wrap=evil"}))
    assert load_sweep(_sweep_file(tmp_path, resources={field: "gpu,cpu-long"})).resources[field] == "gpu,cpu-long"


@pytest.mark.parametrize("value", ["../../outside", "a/b", "it's", "x y"])
def test_injection_through_sweep_files_axis_values_cannot_leave_output_dir(tmp_path, value):
    grid = {"main": {"algorithm": "vaco", "model.init_args.lr_schedule_name": [value]}}
    with pytest.raises(SweepError, match=r"^`grid.main.model.init_args.lr_schedule_name`: .* cannot name a cell"):
        load_sweep(_sweep_file(tmp_path, grid=grid))


def test_injection_through_sweep_files_a_newline_in_output_dir_or_out_is_refused(tmp_path):
    with pytest.raises(SweepError, match=r"^`output_dir` holds a control character"):
        load_sweep(_sweep_file(tmp_path, output_dir="out\n#SBATCH --wrap=evil"))
    with pytest.raises(SweepError, match=r"^`--out` holds a control character"):
        load_sweep(_sweep_file(tmp_path), str(tmp_path / "out\nsrun evil"))


@pytest.mark.parametrize("name", ["../../x", "../sweeps", "/tmp/x", "."])
def test_an_experiment_named_like_a_path_cannot_put_its_sweep_outside_sweeps(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SweepError, match=r"^`experiment` = .* would put the sweep outside sweeps/"):
        load_sweep(_sweep_file(tmp_path, experiment=name, output_dir=None))
    # with a folder of its own the name is only an MLflow experiment name
    assert load_sweep(_sweep_file(tmp_path, experiment=name, output_dir="out")).output_dir == tmp_path / "out"
    assert (
        load_sweep(_sweep_file(tmp_path, experiment="lag/robustness", output_dir=None)).output_dir
        == tmp_path / "sweeps/lag/robustness"
    )


def test_an_experiment_name_with_a_comma_is_refused_it_would_match_other_slurm_jobs(tmp_path):
    with pytest.raises(SweepError, match=r"^`experiment` = 'a,b' holds a comma"):
        load_sweep(_sweep_file(tmp_path, experiment="a,b"))


# ---------------------------------------------------------------------------------------- files
def test_checkpoints_unreadable_by_collaborators_atomic_writes_honour_the_umask(tmp_path):
    import torch

    from vaco.run.checkpoint import save_atomic

    old = os.umask(0o022)
    try:
        save_atomic({"x": torch.zeros(1)}, tmp_path / "last.ckpt")
        write_text_atomic(tmp_path / "jobs.yaml", "a: 1\n")
    finally:
        os.umask(old)
    for name in ("last.ckpt", "jobs.yaml"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    os.umask(0o077)
    try:
        write_text_atomic(tmp_path / "private.yaml", "a: 1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "private.yaml").stat().st_mode) == 0o600


def test_locks_on_shared_filesystems_say_what_happened(tmp_path):
    held = lock(tmp_path)
    try:
        with pytest.raises(SweepError, match="another `vaco sweep` is running"):
            lock(tmp_path)
    finally:
        held.close()
    lock(tmp_path).close()  # released: free again
    with pytest.raises(SweepError, match=r"^`output_dir`: cannot write the sweep's lock file"):
        lock(Path("/proc/self"))  # not writable, even by root
    with pytest.raises(SweepError, match=r"^`output_dir`: cannot write the sweep's lock file"):
        lock(Path("/proc/self/vaco-cannot-be-here"))


def test_symlinks_where_a_sweep_writes_are_refused_and_their_targets_untouched(tmp_path):
    """In a shared sweep folder, a `.sweep.lock` that is a link had its target truncated to 0 bytes,
    and a cell's `train.log` that is a link was appended to its target: both are refused in one line
    naming the file, the target unchanged; the cell's own log still works where it is a plain file."""
    from vaco.files import SymlinkRefused, open_append

    target = tmp_path / "someone_elses.txt"
    target.write_text("precious\n")
    out = tmp_path / "sweep"
    out.mkdir()
    (out / ".sweep.lock").symlink_to(target)
    with pytest.raises(SweepError, match=r"^`output_dir`: .*\.sweep\.lock is a symbolic link: vaco does not write"):
        lock(out)
    cell = out / "cell"
    cell.mkdir()
    (cell / "train.log").symlink_to(target)
    with pytest.raises(SymlinkRefused, match="train.log is a symbolic link"):
        open_append(cell / "train.log")
    assert target.read_text() == "precious\n"
    (cell / "train.log").unlink()
    with open_append(cell / "train.log") as fh:
        fh.write("a line\n")
    with open_append(cell / "train.log") as fh:
        fh.write("another\n")
    assert (cell / "train.log").read_text() == "a line\nanother\n"
    (out / ".sweep.lock").unlink()
    lock(out).close()


def test_module_shadowing_the_working_directory_never_shadows_installed_packages(tmp_path):
    """A stray yaml.py in the working directory: `vaco report --help` imports the real PyYAML."""
    (tmp_path / "yaml.py").write_text("raise SystemExit('the stray yaml.py was imported')\n")
    vaco = str(Path(sys.executable).with_name("vaco"))
    for command in (["report", "--help"], ["sweep", "--help"]):
        out = subprocess.run([vaco, *command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "stray" not in out.stderr + out.stdout


# ---------------------------------------------------------------------------------------- metrics
def test_metrics_lost_on_a_read_only_working_directory_go_to_the_temp_dir(tmp_path, monkeypatch, capsys):
    """A batch the store refuses for good (the run was deleted: HTTP 400 from a server, the same
    error from SQLite) does not block later metrics, and the unsent ones land in the temporary
    directory when the working directory cannot be written (even root cannot write /proc)."""
    from vaco.run.logger import VacoMLFlowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = VacoMLFlowLogger(experiment_name="faults", tracking_uri=uri)
    logger.log_metrics({"a": 1.0}, step=1)
    run_id = logger.run_id
    client = mlflow.MlflowClient(uri)
    client.delete_run(run_id)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.chdir("/proc")
    logger.log_metrics({"a": 2.0}, step=2)  # refused for good: set aside, nothing blocks
    assert logger._unsent == [] and len(logger._rejected) == 1
    logger.finalize("success")
    err = capsys.readouterr().err
    path = tmp_path / f"unsent-metrics-{run_id}.jsonl"
    assert path.is_file() and '"a": 2.0' in path.read_text() and str(path) in err


@pytest.mark.slow
def test_a_resume_replays_the_unsent_metrics_into_the_same_run_once(tmp_path, monkeypatch, capsys):
    """A run whose store stopped taking writes left 102-150 of 200 iterations only in the unsent file,
    and a later resume marked the run FINISHED without them. Now the resume sends the file's batches
    first, into the same run (a real SQLite store): those up to the checkpoint's step, once; those past
    it are dropped, since the resumed training logs them again; the file is renamed once sent."""
    from vaco.run.logger import VacoMLFlowLogger

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    first = VacoMLFlowLogger(experiment_name="replay", tracking_uri=uri)
    first.log_metrics({"eval/return": 1.0}, step=100)
    run_id = first.run_id
    client.delete_run(run_id)  # the store refuses this run's writes for good from here
    for step in (200, 300, 400):
        first.log_metrics({"eval/return": step / 100}, step=step)
    first.finalize("success")
    assert first.unsent_file == str(tmp_path / f"unsent-metrics-{run_id}.jsonl")
    client.restore_run(run_id)  # the store takes writes again
    again = VacoMLFlowLogger(experiment_name="replay", tracking_uri=uri, run_id=run_id)
    assert again.replay_unsent(until_step=300) == 2  # the checkpoint was saved at step 300
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/return")]
    assert sorted(history) == [(100, 1.0), (200, 2.0), (300, 3.0)]
    assert not (tmp_path / f"unsent-metrics-{run_id}.jsonl").exists()
    assert (tmp_path / f"unsent-metrics-{run_id}.jsonl.replayed").is_file()
    assert "1 past the checkpoint dropped" in capsys.readouterr().err
    assert again.replay_unsent(until_step=300) == 0  # nothing left: a second resume sends nothing again
