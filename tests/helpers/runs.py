"""A tiny real training run, the ``vaco`` command as a subprocess, and MLflow metric histories."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning as L
import mlflow
from lightning.pytorch.loggers import MLFlowLogger

from vaco.tracking import artifact_location

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
#: the real `vaco` script, and what the tests run as `vaco`: the fork server's client where the
#: suite started one (tests/helpers/forkserver.py: the same command without a cold interpreter)
REAL_VACO = str(Path(sys.executable).with_name("vaco"))
VACO = os.environ.get("VACO_TEST_CLIENT") or REAL_VACO


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
    logger_cls=MLFlowLogger,
):
    """A real (module, data module, trainer) triple on a tiny InvertedPendulum setting
    (``logger_cls=VacoMLFlowLogger``: the logger of ``vaco fit``, which lets a resumed run grow its budget)."""
    from vaco import RolloutDataModule, VacoModule
    from vaco.advantages import VTrace
    from vaco.objectives import TVFilter
    from vaco.run.callbacks import IterationCheckpoint

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
    # Lightning's own logger would put the artifacts in ./mlruns (the checkout): beside the test's store
    where = artifact_location(uri, experiment)
    logger = logger_cls(
        experiment_name=experiment, tracking_uri=uri, run_id=run_id, log_model=True, artifact_location=where
    )
    checkpoint = IterationCheckpoint(every_n_iterations=every_n_iterations, dirpath=str(tmp_path / "ckpt"))
    trainer = tiny_trainer(tmp_path, logger, [checkpoint, *callbacks], accelerator=accelerator, devices=devices)
    return module, datamodule, trainer


def tiny_trainer(tmp_path: Path, logger, callbacks: list, *, accelerator: str = "cpu", devices: int = 1) -> L.Trainer:
    """The Trainer of the tiny runs: one epoch (the whole run), no bar, no sanity steps."""
    return L.Trainer(
        max_epochs=1,
        accelerator=accelerator,
        devices=devices,
        logger=logger,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
    )


def run_cli(
    *args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None, prefix: tuple[str, ...] = ()
):
    """``vaco *args`` as a subprocess (``prefix``: a command that runs it, such as ``unshare ...``)."""
    import subprocess

    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(
        [*prefix, REAL_VACO if prefix else VACO, *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def fit_inverted_pendulum_ppo(tmp_path: Path, uri: str, collection: str):
    """`vaco fit` of PPO-clip on InvertedPendulum (12,288 steps, one final evaluation, no checkpoints)
    with ``configs/collection/<collection>.yaml``; returns the finished MLflow run (fails on a bad exit)."""
    out = run_cli(
        "fit",
        "--config",
        str(CONFIGS / "env/inverted_pendulum.yaml"),
        "--config",
        str(CONFIGS / "algo/ppo_clip.yaml"),
        "--config",
        str(CONFIGS / f"collection/{collection}.yaml"),
        "--data.init_args.total_steps",
        "12288",
        "--data.init_args.eval_every",
        "0",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--checkpoint.every_n_iterations",
        "0",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("vaco").experiment_id])
    return run


def fit_in_process(root: Path, algo: str, *args: str, eval_every: int = 2) -> None:
    """`vaco fit` in this process (its real parser and Trainer) of ``configs/algo/<algo>.yaml`` on a
    tiny InvertedPendulum setting: 2 envs x 64 steps, K = 3, 2 epochs x 4 minibatches, a checkpoint
    every iteration under ``root``; ``args`` add to or override it (the budget, ``--population``)."""
    from vaco.commands.fit import main

    argv = [
        "--config",
        str(CONFIGS / "env" / "inverted_pendulum.yaml"),
        "--config",
        str(CONFIGS / "algo" / f"{algo}.yaml"),
        "--data.init_args.num_envs",
        "2",
        "--data.init_args.num_steps",
        "64",
        "--data.init_args.policy_buffer_size",
        "3",
        "--data.init_args.eval_every",
        str(eval_every),
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
        "--trainer.default_root_dir",
        str(root),
        *args,
    ]
    assert main(argv) == 0
