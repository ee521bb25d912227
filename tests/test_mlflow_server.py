"""The path a user takes to compare runs in the MLflow UI: `mlflow server` on a localhost port
against the store a sweep wrote; the sweep's runs, params and metrics come back through the REST API."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from helpers.mlflow_server import mlflow_server
from helpers.tiny_sweep import FIRST, ITERATIONS, SECOND, interrupted_sweep


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


@pytest.mark.slow
def test_mlflow_server_shows_the_sweep_runs(tmp_path_factory, tmp_path):
    sweep = interrupted_sweep(tmp_path_factory)
    assert sweep.resumed_rc == 0, sweep.resumed_log
    with mlflow_server(sweep.uri, sweep.root, tmp_path / "server.log") as base:
        experiment = _get(base, "/api/2.0/mlflow/experiments/get-by-name", experiment_name=sweep.experiment)[
            "experiment"
        ]
        found = _post(
            base,
            "/api/2.0/mlflow/runs/search",
            {"experiment_ids": [experiment["experiment_id"]], "max_results": 100},
        )
        cells = {
            {t["key"]: t["value"] for t in r["data"].get("tags", [])}.get("vaco.sweep.cell") for r in found["runs"]
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
        assert params["algorithm"] == "ppo_clip" and params["K"] == "2" and params["env"] == "InvertedPendulum-v5"
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
