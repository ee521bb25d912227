"""Helpers shared by test_parallel.py and test_async.py: a filled policy buffer, a tiny real run,
and the processes a PID has started (read from /proc, Linux)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import MLFlowLogger

from helpers.runs import tiny_trainer
from vaco.data.policy_buffer import PolicyVersionBuffer
from vaco.learners.networks import GaussianActor
from vaco.tracking import artifact_location


def filled_buffer(capacity: int, pushes: int, obs_dim: int = 11, act_dim: int = 3):
    """A buffer whose version v acts with log_std = -0.2 v (so each version is recognisable)."""
    torch.manual_seed(0)
    buffer = None
    for v in range(pushes):
        actor = GaussianActor(obs_dim, act_dim)
        with torch.no_grad():
            actor.log_std.fill_(-0.2 * v)
        buffer = buffer or PolicyVersionBuffer(actor, obs_dim, capacity)
        buffer.push(actor, torch.full((obs_dim,), 0.1 * v), torch.full((obs_dim,), 1.0 + v), version=v)
    return buffer


def parallel_run(
    tmp_path: Path,
    uri: str,
    *,
    data_kwargs: dict,
    model_kwargs: dict | None = None,
    callbacks: tuple = (),
    run_id: str | None = None,
    seed: int = 3,
):
    """A real (VacoModule, RolloutDataModule with actor processes, Trainer) on a tiny InvertedPendulum
    setting; ``data_kwargs`` may hold the data module's and the :class:`Actors` backend's fields."""
    from vaco.advantages import VTrace
    from vaco.data import RolloutDataModule
    from vaco.data.parallel import Actors
    from vaco.learners.vaco_module import VacoModule
    from vaco.objectives import TVFilter
    from vaco.run.callbacks import IterationCheckpoint

    L.seed_everything(seed, verbose=False)
    data = dict(
        env_id="InvertedPendulum-v5",
        num_envs=4,
        num_steps=32,
        total_steps=4 * 32 * 4,
        policy_buffer_size=1,
        eval_every=0,
        eval_episodes=2,
        eval_envs=2,
        seed=seed,
        num_workers=2,
    )
    data.update(data_kwargs)
    model = dict(update_epochs=2, num_minibatches=4)
    model.update(model_kwargs or {})
    module = VacoModule(objective=TVFilter(delta=0.2), advantage=VTrace(gamma=0.99, lmbda=0.95), **model)
    actor_fields = ("num_workers", "mode", "staleness_limit", "backend", "launcher", "tcp_port")
    actors = Actors(**{key: data.pop(key) for key in actor_fields if key in data})
    datamodule = RolloutDataModule(**data, collection=actors)
    logger = MLFlowLogger(
        experiment_name="test", tracking_uri=uri, run_id=run_id, artifact_location=artifact_location(uri, "test")
    )
    checkpoint = IterationCheckpoint(every_n_iterations=1, dirpath=str(tmp_path / "ckpt"))
    trainer = tiny_trainer(tmp_path, logger, [checkpoint, *callbacks])
    return module, datamodule, trainer


def descendants(pid: int) -> set[int]:
    """PIDs of all living descendants of ``pid``."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status and os.path.exists(f"/proc/{pid}")


def still_alive_after(pids, seconds: float = 30.0) -> list[int]:
    """The ``pids`` still running once ``seconds`` have passed, polled every 50 ms (returns as soon
    as all are gone): an orphan check that neither races a busy machine nor waits longer than it must."""
    deadline = time.monotonic() + seconds
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left
