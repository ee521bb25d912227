"""Faults a user meets, one test each, named after the fault; each asserts that nothing is lost.

Everything is real: checkpoint files written by real runs, `vaco` subprocesses, a real MLflow
SQLite store and a real `mlflow server`, real SIGKILLs. docs/reliability.md is the table of these.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import torch

from helpers.mlflow_server import closed_port, free_port, start_server, stop_server
from helpers.runs import CONFIGS, VACO, metric_histories, run_cli
from vaco.run.checkpoint import CheckpointError, load_checkpoint, pack_state, save_atomic, unpack_state
from vaco.tracking import TrackingStoreError, check_tracking_store

ENV = str(CONFIGS / "env" / "inverted_pendulum.yaml")
ALGO = str(CONFIGS / "algo" / "vaco.yaml")
# a tiny VACO run: 2 envs x 64 steps, K = 4, 6 iterations, a checkpoint every iteration
TINY = [
    "--config",
    ENV,
    "--config",
    ALGO,
    "--data.init_args.num_envs",
    "2",
    "--data.init_args.num_steps",
    "64",
    "--data.init_args.total_steps",
    str(2 * 64 * 6),
    "--data.init_args.policy_buffer_size",
    "4",
    "--data.init_args.eval_every",
    "3",
    "--data.init_args.eval_episodes",
    "2",
    "--data.init_args.eval_envs",
    "2",
    "--model.init_args.update_epochs",
    "2",
    "--model.init_args.num_minibatches",
    "4",
    "--checkpoint.every_n_iterations",
    "1",
    "--trainer.enable_progress_bar",
    "false",
]


class Payload:
    """Unpickling this creates a file: the proof that a loader ran code from a checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _malicious(path: Path, marker: Path, template: dict | None = None) -> Path:
    state = dict(template or {"state_dict": {}, "hyper_parameters": {}})
    state["payload"] = Payload(marker)
    torch.save(state, path)
    return path


def _one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip() and "Seed set to" not in line]
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One real `vaco fit` run, shared: its checkpoint, store and run id."""
    root = tmp_path_factory.mktemp("finished")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    out = run_cli("fit", *TINY, cwd=root, env={"MLFLOW_TRACKING_URI": uri})
    assert out.returncode == 0, out.stderr[-3000:]
    ckpt = next(root.glob("checkpoints/*/last.ckpt"))
    return root, uri, ckpt


def _runs(uri: str) -> list:
    client = mlflow.MlflowClient(uri)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


# ---------------------------------------------------------------- malicious checkpoints
def test_malicious_checkpoint_given_to_evaluate_is_refused_and_its_payload_not_run(tmp_path):
    marker = tmp_path / "pwned"
    evil = _malicious(tmp_path / "evil.ckpt", marker)
    out = run_cli("evaluate", "--ckpt", str(evil), cwd=tmp_path)
    assert out.returncode == 2
    assert "refused" in out.stderr and str(evil) in out.stderr and "--ckpt" in out.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_malicious_checkpoint_given_to_fit_is_refused_before_any_run(tmp_path, finished_run):
    _, _, good = finished_run
    marker = tmp_path / "pwned"
    # a real checkpoint with one extra object: everything else about it is valid
    evil = _malicious(tmp_path / "evil.ckpt", marker, load_checkpoint(good))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli("fit", *TINY, "--ckpt_path", str(evil), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert out.returncode == 2, out.stderr[-2000:]
    assert _one_line(out.stderr).startswith("vaco fit: error: `ckpt_path`: refused")
    assert not marker.exists()
    assert not (tmp_path / "mlflow.db").exists() or _runs(uri) == []


@pytest.mark.slow
def test_malicious_checkpoint_in_a_sweep_cell_is_refused_and_the_cell_fails(tmp_path):
    cell = "vaco-inverted_pendulum-K2-s1"  # a cell of configs/sweeps/tiny.yaml
    marker = tmp_path / "pwned"
    (tmp_path / "out" / cell / "checkpoints").mkdir(parents=True)
    _malicious(tmp_path / "out" / cell / "checkpoints" / "last.ckpt", marker)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        "sweep",
        "--config",
        str(CONFIGS / "sweeps" / "tiny.yaml"),
        "--out",
        str(tmp_path / "out"),
        "--only",
        cell,
        "--jobs",
        "1",
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": uri},
    )
    assert out.returncode != 0
    logs = "".join(p.read_text() for p in (tmp_path / "out" / cell).glob("*.log"))
    assert "refused" in out.stdout + out.stderr + logs
    assert not marker.exists()


def test_actor_state_in_the_old_pickled_form_is_refused_and_its_payload_not_run(tmp_path):
    marker = tmp_path / "pwned"
    blob = pickle.dumps({"episodes": Payload(marker)})
    with pytest.raises(ValueError, match="not a packed state"):
        unpack_state({"pickled": torch.frombuffer(bytearray(blob), dtype=torch.uint8)})
    assert not marker.exists()


def test_actor_state_round_trips_exactly_as_tensors_and_plain_values():
    import numpy as np

    rng = np.random.default_rng(7)
    state = {
        "iteration": 3,
        "seed": 5,
        "reward_scaler": {"mean": 0.1 + 1e-17, "var": 1 / 3, "count": 2049.0},
        "envs": [
            {"mj_state": torch.randn(5, dtype=torch.float64), "elapsed_steps": None, "rng": rng.bit_generator.state}
        ],
        "episodes": np.arange(3),
    }
    packed = pack_state(state)
    assert all(isinstance(v, torch.Tensor) for v in packed.values())
    back = unpack_state(packed)
    assert back["reward_scaler"] == state["reward_scaler"]  # exact float64, not rounded to float32
    assert back["envs"][0]["rng"] == state["envs"][0]["rng"]  # 128-bit PCG64 state
    assert torch.equal(back["envs"][0]["mj_state"], state["envs"][0]["mj_state"])
    assert back["envs"][0]["elapsed_steps"] is None and back["iteration"] == 3
    assert back["episodes"].tolist() == [0, 1, 2]


def _overwrite_tensor_bytes(data: bytes) -> bytes:
    """The archive with 8 bytes in the middle of its largest tensor member flipped (same length,
    every zip record intact: only the member's CRC-32 can tell)."""
    import io
    import struct
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        member = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    name_len, extra_len = struct.unpack("<HH", data[member.header_offset + 26 : member.header_offset + 30])
    start = member.header_offset + 30 + name_len + extra_len + member.file_size // 2
    return data[:start] + bytes(b ^ 0xFF for b in data[start : start + 8]) + data[start + 8 :]


# ---------------------------------------------------------------- truncated, empty, interrupted writes
@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "empty", "overwritten"])
def test_damaged_checkpoint_is_reported_naming_the_file(tmp_path, finished_run, damage):
    """Overwritten tensor bytes used to load silently as other numbers (torch does not check the CRC)."""
    _, _, good = finished_run
    data = good.read_bytes()
    bad = tmp_path / f"{damage}.ckpt"
    damaged = {"truncated": data[: len(data) // 2], "empty": b"", "overwritten": _overwrite_tensor_bytes(data)}
    bad.write_bytes(damaged[damage])
    if damage == "overwritten":
        assert len(damaged[damage]) == len(data) and torch.load(bad, weights_only=True)  # torch alone loads it
    expected = {"truncated": "truncated", "empty": "empty", "overwritten": "fails its CRC-32 check"}[damage]
    out = run_cli("evaluate", "--ckpt", str(bad), cwd=tmp_path)
    assert out.returncode == 2 and expected in out.stderr and str(bad) in out.stderr
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli("fit", *TINY, "--ckpt_path", str(bad), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert out.returncode == 2
    line = _one_line(out.stderr)
    assert line.startswith("vaco fit: error: `ckpt_path`") and expected in line and str(bad) in line


def test_write_that_fails_midway_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = tmp_path / "last.ckpt"
    save_atomic({"version": torch.tensor(1), "weights": torch.ones(1000)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise OSError(28, "No space left on device")  # as a full disk fails a write midway

    with pytest.raises(
        CheckpointError, match=f"^cannot write the checkpoint {path} .No space left on device.; the previous"
    ):
        save_atomic({"weights": torch.zeros(1000), "version": Unpicklable()}, path)
    assert int(load_checkpoint(path)["version"]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no partial file left behind


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_is_one_line_naming_the_file_and_the_checkpoint_before_survives(
    tmp_path, finished_run
):
    """A real full disk: a tmpfs with room for one checkpoint but not for the next one's temporary file."""
    small = tmp_path / "small"
    small.mkdir()
    size = -(-int(1.5 * finished_run[2].stat().st_size) // 4096) * 4096
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        out = run_cli("fit", *TINY, "--checkpoint.dirpath", str(small), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
        assert out.returncode == 2, out.stderr[-3000:]
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
        assert _one_line(out.stderr) == (
            f"vaco fit: error: cannot write the checkpoint {small / 'last.ckpt'} (No space left on device); the "
            "previous checkpoint there is intact: free space (or choose `checkpoint.dirpath`) and resume from it "
            "with --ckpt_path"
        )
        assert int(load_checkpoint(small / "last.ckpt")["state_dict"]["version"]) == 1
        assert [p.name for p in small.iterdir()] == ["last.ckpt"]  # no partial file left behind
        (run,) = _runs(uri)
        assert run.info.status == "FAILED"
    finally:
        subprocess.run(["umount", str(small)], check=True)


@pytest.mark.slow
def test_a_store_that_fills_mid_run_is_one_line_not_mlflows_tracebacks(tmp_path):
    """A real full disk under the SQLite store: a tmpfs with room for the new store and a few
    iterations' metrics. MLflow's store logs each failed write with its ~90-line traceback before
    raising it; the console shows vaco's one line for the outage (the database's own message), the
    run keeps its unsent metrics and `vaco fit` ends saying so (exit 3)."""
    seed = tmp_path / "seed.db"
    mlflow.MlflowClient(f"sqlite:///{seed}").create_experiment("vaco")  # the store's tables, as a run makes them
    small = tmp_path / "small"
    small.mkdir()
    size = -(-(seed.stat().st_size + 160_000) // 4096) * 4096
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        shutil.copy(seed, small / "mlflow.db")
        uri = f"sqlite:///{small / 'mlflow.db'}"
        out = run_cli(
            "fit",
            *TINY,
            "--data.init_args.total_steps",
            str(2 * 64 * 150),
            "--data.init_args.eval_every",
            "0",
            cwd=tmp_path,
            env={"MLFLOW_TRACKING_URI": uri},
        )
        text = out.stdout + out.stderr
        assert out.returncode == 3, text[-3000:]
        assert "Traceback" not in text and "SQLAlchemy" not in text, text[-3000:]
        outages = [line for line in text.splitlines() if "could not send metrics to MLflow" in line]
        assert outages == [
            "vaco: could not send metrics to MLflow ((sqlite3.OperationalError) database or disk is full); keeping "
            "them and retrying every few seconds; training goes on"
        ], text[-3000:]
        assert len(text.strip().splitlines()) < 25, text
        assert list(tmp_path.glob("unsent-metrics-*.jsonl")), text[-2000:]
    finally:
        subprocess.run(["umount", str(small)], check=True)


_WRITER = """
import sys, torch
from vaco.run.checkpoint import save_atomic
path, version = sys.argv[1], 0
while True:
    version += 1
    save_atomic({"version": torch.tensor(version), "weights": torch.full((8_000_000,), float(version))}, path)
    print(version, flush=True)
"""


@pytest.mark.slow
def test_checkpoint_writer_killed_midway_leaves_a_whole_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    partial_size = None
    try:
        for _ in range(3):  # three whole writes
            assert writer.stdout.readline()
        whole = path.stat().st_size
        deadline = time.monotonic() + 120
        while partial_size is None:  # then kill it while a later write is visibly half done
            assert writer.poll() is None and time.monotonic() < deadline, "no write seen in progress"
            for part in tmp_path.glob(".last.ckpt.*.partial"):
                try:
                    size = part.stat().st_size
                except FileNotFoundError:
                    continue  # renamed into place meanwhile
                if 0 < size < whole // 2:
                    writer.send_signal(signal.SIGKILL)
                    partial_size = size
                    break
    finally:
        writer.kill()
        writer.wait()
    assert partial_size is not None and writer.returncode == -signal.SIGKILL
    assert list(tmp_path.glob(".last.ckpt.*.partial")), "the torn write should be left beside the checkpoint"
    state = load_checkpoint(path)
    version = int(state["version"])
    assert version >= 3 and bool((state["weights"] == version).all())
    # the next write of that checkpoint (a resume's) removes the torn one: killed writers pile up none
    other = tmp_path / ".other.ckpt.x.partial"  # another file's temporary is not this writer's to remove
    other.write_bytes(b"x")
    save_atomic({"version": torch.tensor(version + 1)}, path)
    assert not list(tmp_path.glob(".last.ckpt.*.partial")) and other.exists()
    assert int(load_checkpoint(path)["version"]) == version + 1


@pytest.mark.slow
def test_weights_that_do_not_fit_their_network_are_one_line_from_evaluate(tmp_path, finished_run):
    """A checkpoint whose env_spec was edited (or whose weights come from another network) names the
    file and the first tensor that does not fit, not torch's 16-line traceback."""
    _, _, good = finished_run
    state = load_checkpoint(good)
    state["hyper_parameters"]["env_spec"]["obs_dim"] += 1
    edited = tmp_path / "edited.ckpt"
    torch.save(state, edited)
    out = run_cli("evaluate", "--ckpt", str(edited), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    line = _one_line(out.stderr)
    assert line.startswith(f"vaco evaluate: error: `--ckpt`: {edited}'s weights do not fit the network")
    assert "`actor.mean.0.weight` is [64, 4] in the file, [64, 5] in the network" in line


# ---------------------------------------------------------------- tracking store
def test_dead_tracking_server_fails_fast_naming_the_setting(tmp_path):
    with closed_port() as port:  # nothing listens there, and no other test can take the port
        uri = f"http://127.0.0.1:{port}"
        start = time.monotonic()
        out = run_cli("fit", *TINY, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri}, timeout=120)
        elapsed = time.monotonic() - start
    assert out.returncode == 2
    line = _one_line(out.stderr)
    assert "`MLFLOW_TRACKING_URI`" in line and "no MLflow server answers" in line
    assert elapsed < 60, f"took {elapsed:.0f} s (MLflow's own retries take ~250 s)"
    assert not (tmp_path / "checkpoints").exists()


def test_a_port_that_answers_but_not_in_http_is_refused_in_one_line():
    """Another service on the tracking URI's port (a database, a Ray GCS) answers in bytes that are
    not HTTP: refused as "no MLflow server answers there", not a traceback."""
    import socket
    import threading

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer_in_bytes():
            for _ in range(2):  # /health, and the authenticated call if the first were taken as HTTP
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(4096)
                    conn.sendall(b"\x00\x00\x05\x00@\x00\x00\x00\x06\x00\x00@\x00\xfe\x03\n")

        thread = threading.Thread(target=answer_in_bytes, daemon=True)
        thread.start()
        with pytest.raises(TrackingStoreError) as err:
            check_tracking_store(f"http://127.0.0.1:{port}", field="MLFLOW_TRACKING_URI", timeout=5)
    message = str(err.value)
    assert "`MLFLOW_TRACKING_URI`" in message and "no MLflow server answers" in message and "not in HTTP" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "uri,message",
    [
        ("file:///tmp/mlruns", "refuses the file store"),
        ("sqlite:////no/such/dir/m.db", "does not exist"),
        ("ftp://x", "unknown scheme"),
    ],
)
def test_unusable_tracking_uri_is_one_line_before_any_work(tmp_path, uri, message):
    out = run_cli("fit", *TINY, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert out.returncode == 2 and message in _one_line(out.stderr)


ITERATIONS = 80


@pytest.mark.slow
def test_tracking_server_restart_mid_run_loses_no_metric(tmp_path):
    """The server dies after the run's first checkpoint and comes back on the same port; with
    MLflow's HTTP settings left at their defaults, training goes on while it is down (an iteration
    line between the two messages), and every metric of the run reaches the store (kept while it
    was down, sent when it returned)."""
    db = f"sqlite:///{tmp_path / 'server.db'}"
    port = free_port()
    server = start_server(db, port, tmp_path, tmp_path / "server.log")
    uri = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    assert TINY[-2] == "--trainer.enable_progress_bar"  # dropped: one line per iteration
    slow = [*TINY[:-2], "--data.init_args.total_steps", str(2 * 64 * ITERATIONS)]
    fit = subprocess.Popen(
        [VACO, "fit", *slow], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while (
            len(list(tmp_path.glob("checkpoints/*/epoch=*"))) + len(list(tmp_path.glob("checkpoints/*/last.ckpt"))) == 0
        ):
            assert fit.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        stop_server(server)  # the run goes on without a server while it restarts (a few seconds)
        server = start_server(db, port, tmp_path, tmp_path / "server.log")
        output, _ = fit.communicate(timeout=300)
    finally:
        if fit.poll() is None:
            fit.kill()
    try:
        assert fit.returncode == 0, output[-3000:]
        run = _runs(uri)[0]
        history = metric_histories(uri, run.info.run_id)
        assert [s for s, _ in history["train/tv"]] == [128 * i for i in range(1, ITERATIONS + 1)]
        assert "could not send metrics" in output and "reachable again" in output
        while_down = output.split("could not send metrics", 1)[1].split("reachable again", 1)[0]
        assert "\niter " in while_down, output[-3000:]  # training went on while the server was down
        assert run.info.status == "FINISHED"
    finally:
        stop_server(server)


@pytest.mark.slow
def test_postgresql_stopped_mid_run_and_started_again_loses_no_metric(tmp_path):
    """A real PostgreSQL store stopped (``pg_ctl stop -m fast``) after the run's first checkpoint and
    started again on the same port 10 s later: training goes on while it is down, one line says
    so and one that it is back, and every metric reaches the store once; the run ends FINISHED."""
    from helpers.services import postgres_cluster

    cluster, why = postgres_cluster("pg-mid-run")
    if cluster is None:
        pytest.skip(why)
    env = dict(os.environ, MLFLOW_TRACKING_URI=cluster.url, OMP_NUM_THREADS="1")
    slow = [*TINY[:-2], "--data.init_args.total_steps", str(2 * 64 * ITERATIONS)]
    fit = subprocess.Popen(
        [VACO, "fit", *slow], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("checkpoints/*/last.ckpt")):
            assert fit.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        cluster.stop()
        time.sleep(10)
        cluster.start()
        output, _ = fit.communicate(timeout=600)
    finally:
        if fit.poll() is None:
            fit.kill()
        if fit.stdout is not None:
            fit.stdout.close()
    try:
        assert fit.returncode == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        run = _runs(cluster.url)[0]
        history = metric_histories(cluster.url, run.info.run_id)
        assert [s for s, _ in history["train/tv"]] == [128 * i for i in range(1, ITERATIONS + 1)]
        assert "could not send metrics" in output and "reachable again" in output, output[-3000:]
        assert run.info.status == "FINISHED"
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_metric_batch_the_server_took_after_the_client_gave_up_is_not_sent_twice(tmp_path):
    """A relay holds the server's answer to one metric batch for 15 s (the client gives up after 10 s,
    the server has already written the batch); vaco keeps the batch and sends it again with the later
    ones. Every (metric, step) of the run is in the store once (before: that batch's every metric
    twice, Lightning's logger stamping each try anew)."""
    from helpers.mlflow_server import LateAnswers

    db = f"sqlite:///{tmp_path / 'server.db'}"
    port = free_port()
    server = start_server(db, port, tmp_path, tmp_path / "server.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    try:
        with LateAnswers(port) as relay:
            uri = f"http://127.0.0.1:{relay.port}"
            env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
            slow = [*TINY[:-2], "--data.init_args.total_steps", str(2 * 64 * 24)]
            fit = subprocess.Popen(
                [VACO, "fit", *slow], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            try:
                deadline = time.monotonic() + 300
                while not list(tmp_path.glob("checkpoints/*/last.ckpt")) and not list(
                    tmp_path.glob("checkpoints/*/epoch=*")
                ):
                    assert fit.poll() is None and time.monotonic() < deadline
                    time.sleep(0.2)
                relay.arm(1)
                output, _ = fit.communicate(timeout=300)
            finally:
                if fit.poll() is None:
                    fit.kill()
            assert fit.returncode == 0, output[-3000:]
            assert relay.held == 1 and "could not send metrics" in output and "reachable again" in output, output[
                -3000:
            ]
        client = mlflow.MlflowClient(f"http://127.0.0.1:{port}")
        (run,) = _runs(f"http://127.0.0.1:{port}")
        doubled = {}
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            if len(steps) != len(set(steps)):
                doubled[key] = len(steps) - len(set(steps))
        assert not doubled, doubled
        assert len(client.get_metric_history(run.info.run_id, "train/tv")) == 24
    finally:
        stop_server(server)


@pytest.mark.slow
def test_a_new_sqlite_store_opened_by_four_commands_at_once_is_set_up_once(tmp_path):
    """Four processes open a store that does not exist yet at the same instant (each waits for a
    file, then does what `vaco fit` does first: the store check, then its logger's first use of the
    store): each sets up nothing twice and all four write their experiment. Before: MLflow's schema set-up run at once in
    several processes failed in all of them (Alembic: 'expected to match one row')."""
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    go = tmp_path / "go"
    script = (  # what `vaco fit` does first: the store check, then its logger's first use of the store
        "import sys, time\n"
        "from pathlib import Path\n"
        "from vaco.run.logger import VacoMLFlowLogger\n"
        "from vaco.tracking import check_tracking_store\n"
        "Path(sys.argv[2] + sys.argv[3]).touch()\n"  # imported: ready
        "while not Path(sys.argv[2]).exists():\n"
        "    time.sleep(0.001)\n"
        "check_tracking_store(sys.argv[1])\n"
        "VacoMLFlowLogger(experiment_name='e' + sys.argv[3], tracking_uri=sys.argv[1]).experiment\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, uri, str(go), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(4)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"go{i}").exists() for i in range(4)):  # every process imported and waits at the line
        gone = [p for p in procs if p.poll() is not None]
        assert not gone and time.monotonic() < deadline, [p.communicate()[0][-1500:] for p in gone]
        time.sleep(0.05)
    go.touch()
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(o[-1500:] for o in outputs)
    names = {e.name for e in mlflow.MlflowClient(uri).search_experiments()}
    assert {"e0", "e1", "e2", "e3"} <= names


# ---------------------------------------------------------------- config errors
@pytest.mark.slow
@pytest.mark.parametrize(
    "override,field",
    [
        (["--model.init_args.num_minibatches", "7"], "`model.num_minibatches` (7) must divide the batch"),
        (
            ["--data.init_args.num_envz", "3"],
            "`data.init_args.num_envz`: vaco.data.RolloutDataModule has no field 'num_envz'. Did you mean num_envs?",
        ),
        (["--data.init_args.policy_buffer_size", "0"], "`data.policy_buffer_size` (K) must be an integer >= 1"),
        (["--seed_everythin", "3"], "unknown option --seed_everythin. Did you mean --seed_everything?"),
    ],
    ids=["cross-field", "misspelt-field", "bad-value", "abbreviated-option"],
)
def test_config_error_is_one_line_and_leaves_no_mlflow_run(tmp_path, override, field):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli("fit", *TINY, *override, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and field in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "usage:" not in out.stderr
    assert not (tmp_path / "mlflow.db").exists() or _runs(uri) == []
    assert not (tmp_path / "checkpoints").exists()


# ---------------------------------------------------------------- kill and resume
@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_an_uninterrupted_run(tmp_path, finished_run):
    _, reference_uri, reference_ckpt = finished_run
    reference_run = reference_ckpt.parent.name
    reference = metric_histories(reference_uri, reference_run)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    # no progress bar: one line per iteration on stdout says when to stop it (metrics do not depend on the bar)
    fit = subprocess.Popen(
        [VACO, "fit", *TINY[:-2]], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        for line in fit.stdout:
            if line.startswith("iter") and line.split()[1].startswith("2/"):
                # freeze it at once, then kill it: no race with the 6-iteration run however busy the machine
                fit.send_signal(signal.SIGSTOP)
                break
        else:
            pytest.fail("the run ended before iteration 2")
        (ckpt,) = tmp_path.glob("checkpoints/*/last.ckpt")
        fit.send_signal(signal.SIGKILL)
    finally:
        fit.kill()
        fit.wait()
        fit.stdout.close()
    # the checkpoint callback runs after the line is printed: iteration 1's or 2's checkpoint, never the end
    assert 1 <= int(load_checkpoint(ckpt)["state_dict"]["version"]) <= 3
    assert int(load_checkpoint(ckpt)["state_dict"]["version"]) < 6
    out = run_cli("fit", *TINY, "--ckpt_path", str(ckpt), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert out.returncode == 0, out.stderr[-3000:]
    runs = _runs(uri)
    assert len(runs) == 1  # the same MLflow run
    resumed = metric_histories(uri, runs[0].info.run_id)
    assert resumed.keys() == reference.keys()
    for key, values in reference.items():
        # iterations after the last checkpoint were logged twice: with the same values
        assert sorted(set(resumed[key])) == values, key


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2, signal.SIGINT])
def test_sigterm_mid_run_checkpoints_at_the_stop_and_the_resume_repeats_nothing(tmp_path, sig):
    """What SLURM sends before preempting (SIGTERM; SIGUSR2 with vaco's --signal=USR2@90) and Ctrl-C
    (SIGINT: it was Lightning's "Detected KeyboardInterrupt", exit 1, a FAILED run and no checkpoint at
    the stop): the run stops
    at the next iteration boundary with a checkpoint there, even with the default interval of 10
    iterations, is marked KILLED and exits 128 + signal; the resume logs every (metric, step) once."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    args = [*TINY[:-2], "--checkpoint.every_n_iterations", "10", "--data.init_args.total_steps", str(2 * 64 * 12)]
    assert TINY[-2] == "--trainer.enable_progress_bar"  # dropped: its iteration lines say when to signal
    fit = subprocess.Popen(
        [VACO, "fit", *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for line in fit.stdout:  # one line per iteration when stdout is not a terminal
            if line.startswith("iter") and line.split()[1].startswith("2/"):
                fit.send_signal(sig)
                break
        else:
            pytest.fail("the run ended before iteration 2")
        fit.stdout.read()
        err = fit.stderr.read()
        assert fit.wait(timeout=300) == 128 + sig, err[-3000:]
    finally:
        fit.kill()
    assert f"stopped by {signal.Signals(sig).name} after iteration" in err
    (ckpt,) = tmp_path.glob("checkpoints/*/last.ckpt")
    stopped_at = int(load_checkpoint(ckpt)["state_dict"]["version"])
    assert 2 <= stopped_at < 12
    (run,) = _runs(uri)
    assert run.info.status == "KILLED"
    out = run_cli("fit", *args, "--ckpt_path", str(ckpt), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = _runs(uri)
    assert run.info.status == "FINISHED"
    client = mlflow.MlflowClient(uri)
    for key in ("train/loss_policy", "lag/forward_tv", "time/iteration", "eval/return"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged a step twice"
    assert sorted(m.value for m in client.get_metric_history(run.info.run_id, "time/iteration")) == list(range(1, 13))


@pytest.mark.slow
def test_a_stop_while_vaco_fit_starts_waits_for_the_first_iteration_and_the_rerun_resumes_its_run(tmp_path):
    """SIGTERM as soon as the run has begun to start (Lightning's "Seed set to" line; the envs, the
    model and the MLflow run are made after it): the process used to die at once, leaving a RUNNING
    run and no checkpoint, so a rerun (a sweep's resume) opened a second run beside it. The signal is
    kept: the run stops after its first iteration with a checkpoint, KILLED, exit 143, and the rerun
    from that checkpoint finishes the same run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    args = TINY[:-2]
    fit = subprocess.Popen(
        [VACO, "fit", *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for line in fit.stderr:
            if line.startswith("Seed set to"):
                fit.send_signal(signal.SIGTERM)
                break
        else:
            pytest.fail("vaco fit printed no 'Seed set to' line")
        out, err = fit.communicate(timeout=300)
    finally:
        fit.kill()
    assert fit.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "received SIGTERM while starting" in err and "stopped by SIGTERM after iteration 1;" in err
    (ckpt,) = tmp_path.glob("checkpoints/*/last.ckpt")
    assert int(load_checkpoint(ckpt)["state_dict"]["version"]) == 1
    (run,) = _runs(uri)
    assert run.info.status == "KILLED"
    done = run_cli("fit", *args, "--ckpt_path", str(ckpt), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert done.returncode == 0, done.stderr[-3000:]
    (again,) = _runs(uri)
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"


@pytest.mark.slow
def test_a_store_locked_by_another_process_is_one_line_naming_it(tmp_path):
    """Another program holding the SQLite store's write lock (an open sqlite3 shell in a
    transaction) made `vaco fit` fail inside the config with "database is locked; Expected a
    <class 'collections.abc.Iterable'>; Expected a <class 'bool'>". It waits for the lock a while,
    then says which file is locked and what to do, exit 2, before any env starts."""
    import sqlite3

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    mlflow.MlflowClient(uri).search_experiments()  # a store with MLflow's tables
    holder = sqlite3.connect(str(db), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        out = run_cli("fit", *TINY, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert out.returncode == 2, out.stderr[-3000:]
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("vaco fit: error:")]
    assert f"{db} is locked by another process" in line and "Expected a" not in out.stderr
    assert not list(tmp_path.glob("checkpoints/*"))


# ---------------------------------------------------------------- one process per run
def _tiny_with_budget(steps: int) -> list[str]:
    at = TINY.index("--data.init_args.total_steps")
    return [*TINY[: at + 1], str(steps), *TINY[at + 2 :]]


@pytest.mark.slow
def test_a_second_process_on_a_run_refuses_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    """Two real `vaco fit --ckpt_path` of one checkpoint: the second exits 2 in one line naming the
    first (pid, host, since); once the first is killed (-9, it cannot let go), the next resume takes
    the lock over, says so, and finishes; a clean end leaves the lock free."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": uri}
    first = run_cli("fit", *_tiny_with_budget(2 * 64 * 2), cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = next(tmp_path.glob("checkpoints/*/last.ckpt"))
    lock = ckpt.parent / "vaco.lock"
    holder = subprocess.Popen(
        [VACO, "fit", *_tiny_with_budget(2 * 64 * 10_000), "--ckpt_path", str(ckpt)],
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1", **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while not (lock.exists() and lock.read_text().strip()) and time.time() < deadline:
            time.sleep(0.2)
        description = lock.read_text()
        assert description.strip(), "the resumed run never took its lock"
        second = run_cli("fit", *_tiny_with_budget(2 * 64 * 3), "--ckpt_path", str(ckpt), cwd=tmp_path, env=env)
        assert second.returncode == 2, second.stderr[-2000:]
        line = _one_line(second.stderr)
        assert (
            line.startswith("vaco fit: error: the run of `--ckpt_path`")
            and "is being trained by another process" in line
        )
        pid = json.loads(description)["pid"]  # the training process's (under the fork server, not Popen's)
        assert f"pid {pid} on " in line and " since " in line and "Traceback" not in second.stderr
        # a copy of the checkpoint in another folder resumes the same MLflow run: refused by the run's id,
        # before it touches the run (the holder's stays RUNNING). The holder takes its locks before it
        # reopens the run, so wait until it has (under load that is seconds after the lock)
        copy = tmp_path / "elsewhere" / "last.ckpt"
        copy.parent.mkdir()
        shutil.copy(ckpt, copy)
        run_id = ckpt.parent.name
        client = mlflow.MlflowClient(uri)
        while client.get_run(run_id).info.status != "RUNNING" and time.time() < deadline + 120:
            time.sleep(0.2)
        assert client.get_run(run_id).info.status == "RUNNING", "the holder never reopened its MLflow run"
        elsewhere = run_cli("fit", *_tiny_with_budget(2 * 64 * 3), "--ckpt_path", str(copy), cwd=tmp_path, env=env)
        assert elsewhere.returncode == 2, elsewhere.stderr[-2000:]
        line = _one_line(elsewhere.stderr)
        assert line.startswith(f"vaco fit: error: MLflow run {run_id} (the run of `--ckpt_path`) is being trained")
        assert f"pid {pid} on " in line and "Traceback" not in elsewhere.stderr
        assert client.get_run(run_id).info.status == "RUNNING"
        assert holder.poll() is None  # the holder was not disturbed
    finally:
        holder.kill()
        holder.wait()
    third = run_cli("fit", *_tiny_with_budget(2 * 64 * 3), "--ckpt_path", str(ckpt), cwd=tmp_path, env=env)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "vaco: took over the lock of the run of `--ckpt_path` from pid " in third.stderr
    assert not lock.exists()  # a clean end lets go and leaves nothing in the folder


def test_a_long_store_error_is_cut_at_a_word_and_says_so():
    """The outage line once read `... with url: /api/2.0/mlflo)`: a cut mid-word, as if the message."""
    from vaco.run.logger import _store_error_line

    url = "/api/2.0/mlflow/runs/log-batch"
    err = ConnectionError(
        "HTTPConnectionPool(host='127.0.0.1', port=43211): Max retries exceeded with url: "
        f"{url} (Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7f>: "
        "Failed to establish a new connection: [Errno 111] Connection refused'))"
    )
    line = _store_error_line(err)
    assert len(line) <= 204 and line.endswith(" ...") and line.startswith("ConnectionError: HTTPConnectionPool")
    cut, full = line.removesuffix(" ..."), f"ConnectionError: {err}"
    assert full.startswith(cut) and full[len(cut)] == " "  # whole words only
    assert _store_error_line(ConnectionError("short")) == "ConnectionError: short"


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.3, 2.0])
def test_ctrl_c_while_vaco_fit_starts_is_one_line_not_a_traceback(tmp_path, after):
    """Ctrl-C while Python still imports torch and Lightning (0.3 s), or after vaco's start-up handler
    kept a first one (2 s; a second Ctrl-C then stops at once): a line, no traceback (it printed 33-81
    lines of KeyboardInterrupt traceback)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    proc = subprocess.Popen(
        [VACO, "fit", *_tiny_with_budget(2 * 64 * 10_000)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(after)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        if proc.poll() is None:  # the first was kept: Ctrl-C again stops at once
            proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "vaco: stopped by Ctrl-C" in stderr or "received SIGINT" in stderr, stderr[-3000:]


_SWALLOWED_CTRL_C = """
import signal, sys, time
from vaco.run.callbacks import listen_while_starting, stop_listening
if sys.argv[1] == "listen":
    listen_while_starting()
    signal.raise_signal(signal.SIGINT)  # the first Ctrl-C while starting: kept
else:
    signal.signal(signal.SIGINT, signal.default_int_handler)
class Finaliser:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # the next Ctrl-C arrives while a finaliser runs
try:
    Finaliser()
    for _ in range(200):
        time.sleep(0.005)
    print("went on")
except KeyboardInterrupt:
    print("stopped")
stop_listening()
"""


def test_a_second_ctrl_c_that_lands_in_a_finaliser_still_stops_vaco_fit():
    """Python swallows a KeyboardInterrupt raised in a finaliser or a weakref callback (it prints
    "Exception ignored ... Traceback" and goes on): a second Ctrl-C while ``vaco fit`` started, landing
    in SQLAlchemy's weakref callback, once let the run go on to its first iteration. Under vaco's
    start-up handler it stops the code that runs next, with no traceback; without it (Python's own
    handler, the control) the interrupt is swallowed, so this test can tell the two apart."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ours = subprocess.run([sys.executable, "-c", _SWALLOWED_CTRL_C, "listen"], capture_output=True, text=True, env=env)
    assert ours.stdout.strip() == "stopped" and "Traceback" not in ours.stderr, ours.stdout + ours.stderr
    assert "received SIGINT while starting" in ours.stderr
    python = subprocess.run([sys.executable, "-c", _SWALLOWED_CTRL_C, "plain"], capture_output=True, text=True, env=env)
    assert python.stdout.strip() == "went on" and "Exception ignored" in python.stderr, python.stdout + python.stderr
