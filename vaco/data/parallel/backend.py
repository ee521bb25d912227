"""Actor processes as a collection backend: :class:`Actors` (``data.collection``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from vaco.data.collection import GYMNASIUM_ENV_BYTES, Collection, RolloutSettings
from vaco.data.parallel.actors import ActorSpec, actor_seed
from vaco.data.parallel.pool import ActorPool, split_envs, validate_backend, validate_mode

if TYPE_CHECKING:
    from torchrl.collectors import BaseCollector

__all__ = ["Actors"]


class Actors(Collection):
    """gymnasium envs stepped by ``num_workers`` actor processes (TorchRL's multi-process collectors).

    The batch (``[num_envs, num_steps]``, same keys) and the learner are those of the in-process
    backend; see :mod:`vaco.data.parallel.pool` for the two modes.

    * ``mode: sync``: the single-process algorithm (each env acts with a version drawn from the
      last K for its whole segment), with env stepping spread over processes. With
      ``num_workers: 1`` it reproduces the single-process run exactly.
    * ``mode: async``: actors keep collecting with the newest buffer they have received while
      the learner trains; policy lag arises on its own and ``lag/*`` measures it. With
      ``policy_buffer_size: 1`` the actors act with the newest version they have (set K > 1 to
      add simulated lag on top). ``staleness_limit: M`` drops actor batches more than M versions
      old (logged as ``lag/dropped_batches``).

    Each DDP rank runs its own ``num_workers`` actors.

    Args:
        num_workers: actor processes per rank; must divide ``data.num_envs``.
        mode: ``sync`` or ``async``.
        staleness_limit: async only: drop actor batches acting with a version more than this
            many updates older than the learner (``null``: keep all, as VACO does).
        backend: ``mp``: actor processes on this host (TorchRL's MultiSync/MultiAsyncCollector).
            ``distributed``: actors are ranks of a torch.distributed (gloo) group, on this or
            other hosts (TorchRL's DistributedCollector); one learner device only.
        launcher: ``distributed`` only: ``mp`` (local processes, over TCP), ``submitit``
            (SLURM jobs) or ``submitit_delayed`` (ranks started by the cluster).
        tcp_port: ``distributed`` only: the learner's port (+1, +2 are used too); default: free.
    """

    env_bytes = GYMNASIUM_ENV_BYTES  # the actor processes' envs live on this machine too

    field_prefix = "data.collection"  # how its fields are named in errors

    def __init__(
        self,
        num_workers: int = 2,
        mode: Literal["sync", "async"] = "sync",
        staleness_limit: int | None = None,
        backend: Literal["mp", "distributed"] = "mp",
        launcher: Literal["mp", "submitit", "submitit_delayed"] = "mp",
        tcp_port: int | None = None,
    ) -> None:
        prefix = self.field_prefix
        if not (isinstance(num_workers, int) and num_workers >= 1):
            raise ValueError(f"`{prefix}.num_workers` must be an integer >= 1, got {num_workers!r}")
        validate_mode(mode, staleness_limit, prefix)
        validate_backend(backend, launcher, prefix)
        self.num_workers, self.mode, self.staleness_limit = num_workers, mode, staleness_limit
        self.backend, self.launcher, self.tcp_port = backend, launcher, tcp_port

    @property
    def label(self) -> str:
        """``async x2``, ``sync x4 distributed``: the mode and the actors (the transport where not ``mp``)."""
        return f"{self.mode} x{self.num_workers}" + ("" if self.backend == "mp" else f" {self.backend}")

    def validate(self, data: RolloutSettings) -> None:
        super().validate(data)
        split_envs(data.num_envs, self.num_workers, f"{self.field_prefix}.num_workers")

    def actor_specs(self, data: RolloutSettings, seed: int) -> list[ActorSpec]:
        """What each actor process of the rank whose collection seed is ``seed`` steps."""
        per_actor = split_envs(data.num_envs, self.num_workers, f"{self.field_prefix}.num_workers")
        return [
            ActorSpec(
                env_id=data.env_id,
                num_envs=per_actor,
                num_steps=data.num_steps,
                seed=actor_seed(seed, w),
                first_env=w * per_actor,
                total_envs=data.num_envs,
                gamma=data.gamma,
                scale_reward=data.scale_reward,
                env_kwargs=dict(data.env_kwargs),
            )
            for w in range(self.num_workers)
        ]

    def collector(self, data: RolloutSettings, seed: int) -> BaseCollector:
        if self.backend == "distributed" and data.world_size() > 1:
            raise ValueError(
                f"`{self.field_prefix}.backend: distributed` makes the learner rank 0 of torch.distributed's "
                f"default group of actors, which Lightning's DDP also needs: use `{self.field_prefix}.backend: mp` "
                "(each DDP rank with its own actor processes) or a single learner device"
            )
        pool = ActorPool(
            self.actor_specs(data, seed),
            None,  # bound with the policy buffer, once the learner has built its actor
            data.num_iterations(),
            mode=self.mode,
            staleness_limit=self.staleness_limit,
            backend=self.backend,
            launcher=self.launcher,
            tcp_port=self.tcp_port,
        )
        # named in the error if an actor dies
        pool.last_checkpoint = lambda: getattr(data.trainer.checkpoint_callback, "last_model_path", "") or ""
        return pool

    def on_policy_pushed(self, data: RolloutSettings, version: int) -> None:
        data.collector.sync_weights()  # no-op until the actors run; blocks until all have it
        if self.staleness_limit is not None and version > 0:
            trainer = data.trainer
            if trainer is None or trainer.logger is None or trainer.global_rank != 0:
                return
            step = version * data.batch_size * trainer.world_size  # the step the learner logs this iteration at
            trainer.logger.log_metrics({"lag/dropped_batches": float(data.collector.dropped_batches)}, step=step)

    def on_exception(self, data: RolloutSettings) -> None:
        data.collector.shutdown(raise_on_error=False)

    def definition(self) -> dict[str, Any]:
        return {**super().definition(), "num_workers": self.num_workers, "mode": self.mode, "backend": self.backend}
