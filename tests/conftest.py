"""Shared test helpers: a real MLflow store in a temp dir and a tiny real training run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning as L
import mlflow
import pytest
import torch
from lightning.pytorch.loggers import MLFlowLogger

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
VACO = str(Path(sys.executable).with_name("vaco"))

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _default_dtype_is_float32(request):
    """Fail loudly if a test module changed torch's default dtype at import (it leaks into every
    later module: networks built in float64 then meet float32 observations)."""
    if "float64" not in request.fixturenames:
        assert torch.get_default_dtype() == torch.float32, "torch default dtype leaked; use the float64 fixture"


@pytest.fixture
def float64():
    """Reference math in float64; restored afterwards so other test modules are unaffected."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    """A fresh SQLite tracking store for this test (also seen by subprocesses)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def metric_histories(uri: str, run_id: str, skip_prefixes=("perf/",)) -> dict[str, list[tuple[int, float]]]:
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    out = {}
    for key in run.data.metrics:
        if key.startswith(skip_prefixes):
            continue
        out[key] = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
    return out


def build_run(
    tmp_path: Path,
    uri: str,
    *,
    objective=None,
    advantage=None,
    data_kwargs: dict | None = None,
    model_kwargs: dict | None = None,
    every_n_iterations: int = 1,
    run_id: str | None = None,
    callbacks: tuple = (),
    devices: int = 1,
    accelerator: str = "cpu",
    seed: int = 3,
    experiment: str = "test",
):
    """A real (module, data module, trainer) triple on a tiny InvertedPendulum setting."""
    from vaco import RolloutDataModule, VacoModule
    from vaco.advantages import VTrace
    from vaco.callbacks import IterationCheckpoint
    from vaco.objectives import TVFilter

    L.seed_everything(seed, verbose=False)
    data = dict(
        env_id="InvertedPendulum-v5",
        num_envs=2,
        num_steps=64,
        total_steps=2 * 64 * 6,
        policy_buffer_size=3,
        eval_every=3,
        eval_episodes=2,
        eval_envs=2,
        seed=seed,
    )
    data.update(data_kwargs or {})
    model = dict(update_epochs=2, num_minibatches=4)
    model.update(model_kwargs or {})
    module = VacoModule(
        objective=objective or TVFilter(delta=0.2),
        advantage=advantage or VTrace(gamma=0.99, lmbda=0.95),
        **model,
    )
    datamodule = RolloutDataModule(**data)
    logger = MLFlowLogger(experiment_name=experiment, tracking_uri=uri, run_id=run_id, log_model=True)
    checkpoint = IterationCheckpoint(every_n_iterations=every_n_iterations, dirpath=str(tmp_path / "ckpt"))
    trainer = L.Trainer(
        max_epochs=1,
        accelerator=accelerator,
        devices=devices,
        logger=logger,
        callbacks=[checkpoint, *callbacks],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
    )
    return module, datamodule, trainer


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None):
    import subprocess

    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([VACO, *args], cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
