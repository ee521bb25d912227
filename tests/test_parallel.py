"""Synchronous collection in actor processes (TorchRL's MultiSyncCollector driving ActorCollector).

Real processes, real MuJoCo envs, a real Trainer and MLflow store: each actor reproduces the
single-process collector bit for bit, so the batch has the same keys and the same per-env
version-mixture semantics; a run is deterministic and resumes exactly (actor env snapshots travel
through TorchRL's collector state_dict); `vaco fit` with sync2.yaml runs end to end and learns.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from helpers.actors import filled_buffer, parallel_run
from helpers.runs import CONFIGS, fit_inverted_pendulum_ppo, metric_histories
from vaco.data.collector import RolloutCollector
from vaco.data.parallel import ActorPool, ActorSpec, actor_seed
from vaco.learners.networks import gaussian_log_prob

ENV, N, T, SEED = "Hopper-v5", 4, 32, 5


def _specs(num_workers: int, seed: int = SEED) -> list[ActorSpec]:
    n = N // num_workers
    return [ActorSpec(ENV, n, T, actor_seed(seed, w), first_env=w * n, total_envs=N) for w in range(num_workers)]


def _push(buffer, version: int) -> None:
    actor = copy.deepcopy(buffer.template)
    with torch.no_grad():
        actor.log_std.fill_(-0.2 * version)
    buffer.push(
        actor,
        torch.full_like(buffer.obs_mean[0], 0.1 * version),
        torch.full_like(buffer.obs_var[0], 1.0 + version),
        version,
    )


def _assert_same(a, b) -> None:
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"{key} differs")


@pytest.mark.slow
def test_two_actors_equal_two_single_process_collectors_and_keep_the_semantics():
    """Actor w is the single-process collector seeded actor_seed(seed, w), bit for bit; the batch
    has the single-process keys, [num_envs, num_steps], and per-env versions drawn from the buffer."""
    buffer = filled_buffer(capacity=4, pushes=4)  # K = 4: the vmap mixture path
    singles = [RolloutCollector(ENV, N // 2, T, buffer, 3, seed=actor_seed(SEED, w)) for w in range(2)]
    pool = ActorPool(_specs(2), buffer, 3, mode="sync")
    try:
        batches = iter(pool)
        batch = next(batches)
        _assert_same(batch, torch.cat([c.rollout() for c in singles], 0))
        _push(buffer, 4)  # the learner's update; the pool ships the buffer before the next batch
        pool.sync_weights()
        _assert_same(next(batches), torch.cat([c.rollout() for c in singles], 0))
    finally:
        pool.shutdown()
        for c in singles:
            c.shutdown()

    assert batch.batch_size == (N, T)
    # every env acts with one version for the whole segment, drawn from the buffer
    version = batch["policy_version"]
    assert (version == version[:, :1]).all()
    assert set(version[:, 0].tolist()) <= set(buffer.versions.tolist())
    assert len(set(version[:, 0].tolist())) > 1  # a mixture across envs (fixed seed)
    # ... and its behaviour distribution and log-prob are that version's
    expected_scale = torch.exp(-0.2 * version.float()).unsqueeze(-1).expand_as(batch["behavior_scale"])
    torch.testing.assert_close(batch["behavior_scale"], expected_scale)
    torch.testing.assert_close(
        batch["behavior_log_prob"],
        gaussian_log_prob(batch["action"], batch["behavior_loc"], batch["behavior_scale"]),
        rtol=1e-5,
        atol=1e-5,
    )
    # the two actors step different envs
    assert not torch.equal(batch["observation"][: N // 2, 0], batch["observation"][N // 2 :, 0])


@pytest.mark.parametrize(
    "config",
    sorted(p for p in (CONFIGS / "collection").glob("*.yaml") if p.stem not in ("warp", "envpool")),
    ids=lambda p: p.stem,
)  # the actor configs; warp.yaml and envpool.yaml are other backends (tests/test_warp.py, tests/test_envpool.py)
def test_every_collection_config_instantiates(config, mlflow_uri):
    from vaco.commands.fit import VacoCLI
    from vaco.data import RolloutDataModule
    from vaco.data.parallel import Actors

    cli = VacoCLI(
        args=[
            "--config",
            str(CONFIGS / "env/inverted_pendulum.yaml"),
            "--config",
            str(CONFIGS / "algo/vaco.yaml"),
            "--config",
            str(config),
        ],
        run=False,
    )
    assert type(cli.datamodule) is RolloutDataModule and isinstance(cli.datamodule.collection, Actors)
    assert cli.datamodule.collection.num_workers == 2 and cli.datamodule.collector is None  # nothing started yet


def test_bad_collection_settings_name_the_field():
    from vaco.data import RolloutDataModule
    from vaco.data.parallel import Actors

    with pytest.raises(ValueError, match=r"`data.collection.num_workers` \(3\) must divide `data.num_envs` \(4\)"):
        RolloutDataModule(env_id=ENV, num_envs=4, collection=Actors(num_workers=3))
    with pytest.raises(
        ValueError, match=r"`data.collection.staleness_limit` only applies to `data.collection.mode: async`"
    ):
        Actors(staleness_limit=1)
    with pytest.raises(ValueError, match=r"`data.collection.mode` must be 'sync' or 'async'"):
        Actors(mode="fast")
    with pytest.raises(ValueError, match=r"`data.collection.backend` must be 'mp' or 'distributed'"):
        Actors(backend="ray")
    with pytest.raises(ValueError, match=r"`data.collection.num_workers` must be an integer >= 1"):
        Actors(num_workers=0)


def test_a_backend_is_saved_as_plain_values(tmp_path):
    """A checkpoint's data-module hyperparameters hold the backend as its YAML config, which torch's
    safe loader (and vaco's) reads; an object there would make every resume refuse the file."""
    from vaco.data import RolloutDataModule
    from vaco.data.parallel import Actors

    data = RolloutDataModule(env_id=ENV, num_envs=4, collection=Actors(num_workers=2, mode="async", staleness_limit=1))
    assert data.hparams["collection"] == {
        "class_path": "vaco.data.parallel.backend.Actors",
        "init_args": {
            "num_workers": 2,
            "mode": "async",
            "staleness_limit": 1,
            "backend": "mp",
            "launcher": "mp",
            "tcp_port": None,
        },
    }
    torch.save({"datamodule_hyper_parameters": dict(data.hparams)}, tmp_path / "h.ckpt")
    assert torch.load(tmp_path / "h.ckpt", weights_only=True)["datamodule_hyper_parameters"] == dict(data.hparams)
    assert "collection" not in RolloutDataModule(env_id=ENV).hparams  # the default backend: nothing saved


class _StopAt(Callback):
    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if int(pl_module.version) == self.iteration:
            trainer.should_stop = True


@pytest.mark.slow
def test_sync_fit_is_deterministic_and_resumes_exactly(tmp_path, mlflow_uri):
    """Two actors, K=2: a run, the same run stopped after 2 of 4 iterations, and its resumption."""
    data = dict(policy_buffer_size=2, mode="sync")
    module, datamodule, trainer = parallel_run(tmp_path / "full", mlflow_uri, data_kwargs=data)
    trainer.fit(module, datamodule=datamodule)
    full = metric_histories(mlflow_uri, trainer.logger.run_id)

    module, datamodule, trainer = parallel_run(tmp_path / "half", mlflow_uri, data_kwargs=data, callbacks=(_StopAt(2),))
    trainer.fit(module, datamodule=datamodule)
    run_id = trainer.logger.run_id
    assert int(module.version) == 2
    ckpt = tmp_path / "half" / "ckpt" / "last.ckpt"
    module, datamodule, trainer = parallel_run(tmp_path / "half", mlflow_uri, data_kwargs=data, run_id=run_id)
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt))
    assert int(module.version) == 4
    resumed = metric_histories(mlflow_uri, run_id)

    assert full["time/iteration"][-1] == (4 * N * T, 4.0)
    assert set(full) == set(resumed)
    for key in full:
        assert full[key] == resumed[key], key  # same seed: same metrics; resume: continues exactly


@pytest.mark.slow
def test_vaco_fit_sync2_learns_inverted_pendulum(tmp_path, mlflow_uri):
    """`vaco fit` with configs/collection/sync2.yaml: 2 actor processes, learns InvertedPendulum."""
    run = fit_inverted_pendulum_ppo(tmp_path, mlflow_uri, "sync2")
    assert run.data.params["algorithm"] == "ppo_clip"
    assert run.info.run_name == "ppo_clip InvertedPendulum-v5 K=1 s1 [sync x2]"  # the backend is in the name
    final = run.data.metrics["eval/return"]
    # a random policy scores ~5-10; 12 iterations of PPO on 4 envs reach the 1000 cap in most seeds
    assert final > 300 and math.isfinite(final), final
    assert run.data.metrics["lag/policy_age_max"] == 0  # K = 1, sync: on-policy


def _slow_to_stop(ready):
    """An actor that takes a moment to exit after SIGTERM (a sibling still flushing its work)."""
    import signal
    import time

    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), exit(0)))
    ready.set()
    while True:
        time.sleep(0.05)


def _dies():
    raise SystemExit(3)


@pytest.mark.slow
def test_a_dead_actor_is_reported_in_one_error_whatever_its_siblings_state():
    """TorchRL's check terminated a sibling, slept 0.1 s and closed it: a sibling that took longer to
    exit made it raise "Cannot close a process while it is still running" (a traceback instead of the
    one-line stop; seen once in a fresh clone's `make test`). Real processes here: one dead, one slow
    to stop; the check names the dead one, every sibling is stopped and closed."""
    import multiprocessing as mp

    from torchrl._utils import _check_for_faulty_process

    from vaco.data.parallel.torchrl_compat import check_actors_alive

    ctx = mp.get_context("fork")  # the check is about processes, not how they start: fork starts at once

    def start():
        ready = ctx.Event()
        procs = [ctx.Process(target=_dies), ctx.Process(target=_slow_to_stop, args=(ready,))]
        for p in procs:
            p.start()
        procs[0].join(60)
        assert ready.wait(60)  # the slow one has installed its handler
        return procs

    procs = start()
    with pytest.raises(ValueError, match="Cannot close a process while it is still running"):
        _check_for_faulty_process(procs)  # the race, on TorchRL's own check
    procs[1].join(10)
    for _ in range(3):  # and ours, every time
        procs = start()
        with pytest.raises(RuntimeError, match=r"At least one process failed: worker 0 \(exit code 3\)"):
            check_actors_alive(procs)
        assert all(p._closed for p in procs)
