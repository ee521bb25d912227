"""docs/extending.md's own objective (``ClippedIS``) and advantage (``TD0``), written for one run,
train unchanged in a population: each member equals its seed's solo run bit for bit (every logged
metric but the timings), from the user's directory with the doc's files, as `vaco fit` runs them."""

from __future__ import annotations

import mlflow
import pytest

from helpers.runs import REPO, VACO, metric_histories
from test_extending import TINY_FIT, _run, doc_blocks


@pytest.mark.parametrize("config", ["clipped_is.yaml", "ppo_td0.yaml"])
def test_the_docs_objective_and_advantage_run_unchanged_in_a_population(tmp_path, config):
    files, _ = doc_blocks()
    for name in ("my_objectives.py", "my_advantages.py", config):
        (tmp_path / name).write_text(files[name])
    (tmp_path / "configs").symlink_to(REPO / "configs")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    base = [VACO, "fit", "--config", "configs/env/inverted_pendulum.yaml", "--config", config, *TINY_FIT]
    base += ["--data.init_args.policy_buffer_size", "2"]
    out = _run([*base, "--population", "[3, 4]"], tmp_path, uri)
    assert out.returncode == 0, out.stderr[-3000:]
    for seed in (3, 4):
        out = _run([*base, "--seed_everything", str(seed)], tmp_path, uri)
        assert out.returncode == 0, out.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("vaco").experiment_id])
    members = {r.data.params["seed"]: r for r in runs if "vaco.population" in r.data.tags}
    alone = {r.data.params["seed"]: r for r in runs if "vaco.population" not in r.data.tags}
    assert sorted(members) == sorted(alone) == ["3", "4"]
    for seed in ("3", "4"):
        mine = metric_histories(uri, members[seed].info.run_id)
        assert mine == metric_histories(uri, alone[seed].info.run_id), (config, seed)
        assert len(mine["train/loss_policy"]) == 3  # 384 steps of 2 x 64
