"""docs/extending.md's own objective (``RatioCap``) and advantage (``TD0``), written for one run,
train unchanged in a population: each member equals its seed's solo run bit for bit (every logged
metric but the timings), from the user's directory with the doc's files, as `vaco fit` runs them."""

from __future__ import annotations

import mlflow
import pytest

from helpers.runs import REPO, VACO, metric_histories
from test_extending import TINY_FIT, _run, doc_blocks


@pytest.mark.slow
@pytest.mark.parametrize("config", ["ratio_cap.yaml", "ppo_td0.yaml"])
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


BRANCHING = '''
import torch

from vaco.objectives import Objective


class Branching(Objective):
    """Clips only when some ratio is large: a Python branch on a tensor's value."""

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        if (ratio > 2.0).any():
            ratio = ratio.clamp(max=2.0)
        return -ratio * advantage, {}
'''


@pytest.mark.slow
def test_every_shipped_objective_passes_the_population_check_and_a_branching_one_stops_in_one_line(tmp_path):
    """The probe vmaps each objective's forward over two members, as the population update does:
    every shipped objective passes it; one that branches on a tensor's value is refused by `vaco fit
    --population` in one line that says why, exit 2, before any environment or MLflow run exists;
    the same objective trains alone."""
    import os
    import subprocess
    import sys

    import yaml

    from vaco.objectives import IMPALA, PPOKL, SPO, PPOClip, TVFilter
    from vaco.population.layout import check_vmappable

    for objective in (TVFilter(), PPOClip(), PPOKL(), SPO(), IMPALA(), PPOClip(clip_epsilon_high=0.28)):
        check_vmappable(objective)
    sys.path.insert(0, str(tmp_path))
    (tmp_path / "branching.py").write_text(BRANCHING)
    from branching import Branching

    with pytest.raises(ValueError, match=r"`model.objective` \(Branching\) cannot run in a population"):
        check_vmappable(Branching())
    config = {
        "model": {
            "class_path": "vaco.VacoModule",
            "init_args": {
                "objective": {"class_path": "branching.Branching"},
                "advantage": {"class_path": "vaco.advantages.GAE"},
            },
        }
    }
    (tmp_path / "branching.yaml").write_text(yaml.safe_dump(config))
    argv = [VACO, "fit", "--config", str(REPO / "configs/env/inverted_pendulum.yaml"), "--config", "branching.yaml"]
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    out = subprocess.run([*argv, "--population", "2"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    (line,) = out.stderr.strip().splitlines()
    assert "cannot run in a population: torch.func.vmap refused its forward" in line and "torch.where" in line
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "checkpoints").exists()
    alone = subprocess.run([*argv, *TINY_FIT], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert alone.returncode == 0, alone.stderr[-3000:]
