"""The path a user takes to compare runs in the MLflow UI: `mlflow server` on a localhost port
against the store a sweep wrote; the sweep's runs, params and metrics come back through the REST API."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from sweep_fixture import FIRST, ITERATIONS, SECOND, interrupted_sweep

MLFLOW = str(Path(sys.executable).with_name("mlflow"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str, **query) -> dict:
    url = f"{base}{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _post(base: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"{base}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_mlflow_server_shows_the_sweep_runs(tmp_path_factory, tmp_path):
    sweep = interrupted_sweep(tmp_path_factory)
    assert sweep.resumed_rc == 0, sweep.resumed_log
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no background job workers
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [
            MLFLOW,
            "server",
            "--backend-store-uri",
            sweep.uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=sweep.root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # bounded wait for the server to answer
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, "mlflow server did not start in 120 s"
            time.sleep(0.5)

        experiment = _get(base, "/api/2.0/mlflow/experiments/get-by-name", experiment_name=sweep.experiment)[
            "experiment"
        ]
        found = _post(
            base,
            "/api/2.0/mlflow/runs/search",
            {"experiment_ids": [experiment["experiment_id"]], "max_results": 100},
        )
        cells = {
            {t["key"]: t["value"] for t in r["data"].get("tags", [])}.get("vaco.sweep.cell")
            for r in found["runs"]
        }
        assert {FIRST, SECOND} <= cells
        one = _post(
            base,
            "/api/2.0/mlflow/runs/search",
            {
                "experiment_ids": [experiment["experiment_id"]],
                "filter": f"tags.`vaco.sweep.cell` = '{SECOND}'",
            },
        )["runs"]
        assert len(one) == 1
        run = one[0]
        params = {p["key"]: p["value"] for p in run["data"]["params"]}
        tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
        metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
        assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == SECOND
        assert (
            params["algorithm"] == "ppo_clip"
            and params["K"] == "2"
            and params["env"] == "InvertedPendulum-v5"
        )
        assert tags["vaco.algorithm"] == "ppo_clip" and tags["vaco.K"] == "2"
        assert {"eval/return", "lag/forward_tv", "train/clip_fraction", "time/env_steps"} <= set(metrics)
        history = _get(
            base,
            "/api/2.0/mlflow/metrics/get-history",
            run_id=run["info"]["run_id"],
            metric_key="time/env_steps",
        )
        assert {m["step"] for m in history["metrics"]} == {128 * i for i in range(1, ITERATIONS + 1)}
        by_params = _post(
            base,
            "/api/2.0/mlflow/runs/search",
            {
                "experiment_ids": [experiment["experiment_id"]],
                "filter": "params.algorithm = 'ppo_clip' and params.K = '2'",
            },
        )["runs"]
        assert [r["info"]["run_name"] for r in by_params] == [SECOND]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        deadline = time.monotonic() + 30
        while _group_alive(server.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _group_alive(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
    assert server.returncode is not None
    assert not _group_alive(server.pid), "server processes left behind"
