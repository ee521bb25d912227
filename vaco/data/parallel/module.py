"""``ParallelRolloutDataModule``: the MuJoCo data module with its envs stepped in actor processes."""

from __future__ import annotations

from typing import Any, Literal

from vaco.data.module import RolloutDataModule
from vaco.data.parallel.actors import ActorSpec, actor_seed
from vaco.data.parallel.pool import ActorPool, split_envs, validate_backend, validate_mode

__all__ = ["ParallelRolloutDataModule"]


class ParallelRolloutDataModule(RolloutDataModule):
    """:class:`~vaco.data.RolloutDataModule` whose ``num_envs`` are stepped by ``num_workers`` processes.

    Every other argument, the batch (``[num_envs, num_steps]``, same keys) and the learner are
    unchanged; see :mod:`vaco.data.parallel.pool` for the two modes.

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
        num_workers: actor processes per rank; must divide ``num_envs``.
        mode: ``sync`` or ``async``.
        staleness_limit: async only: drop actor batches acting with a version more than this
            many updates older than the learner (``null``: keep all, as VACO does).
        backend: ``mp``: actor processes on this host (TorchRL's MultiSync/MultiAsyncCollector).
            ``distributed``: actors are ranks of a torch.distributed (gloo) group, on this or
            other hosts (TorchRL's DistributedCollector); one learner device only.
        launcher: ``distributed`` only: ``mp`` (local processes, over TCP), ``submitit``
            (SLURM jobs) or ``submitit_delayed`` (ranks started by the cluster).
        tcp_port: ``distributed`` only: the learner's port (+1, +2 are used too); default: free.
        **kwargs: the arguments of :class:`~vaco.data.RolloutDataModule`.
    """

    defining_fields = RolloutDataModule.defining_fields + ("num_workers", "mode", "backend")

    def __init__(
        self,
        env_id: str = "Hopper-v5",
        num_envs: int = 2,
        num_steps: int = 2048,
        total_steps: int = 1_000_000,
        policy_buffer_size: int = 1,
        scale_reward: bool = True,
        gamma: float = 0.99,
        eval_every: int = 10,
        eval_episodes: int = 10,
        eval_envs: int = 10,
        eval_deterministic: bool = False,
        seed: int = 1,
        env_kwargs: dict[str, Any] | None = None,
        num_workers: int = 2,
        mode: Literal["sync", "async"] = "sync",
        staleness_limit: int | None = None,
        backend: Literal["mp", "distributed"] = "mp",
        launcher: Literal["mp", "submitit", "submitit_delayed"] = "mp",
        tcp_port: int | None = None,
    ) -> None:
        super().__init__(
            env_id=env_id,
            num_envs=num_envs,
            num_steps=num_steps,
            total_steps=total_steps,
            policy_buffer_size=policy_buffer_size,
            scale_reward=scale_reward,
            gamma=gamma,
            eval_every=eval_every,
            eval_episodes=eval_episodes,
            eval_envs=eval_envs,
            eval_deterministic=eval_deterministic,
            seed=seed,
            env_kwargs=env_kwargs,
        )
        split_envs(num_envs, num_workers)
        validate_mode(mode, staleness_limit)
        validate_backend(backend, launcher)
        self.num_workers, self.mode, self.staleness_limit = num_workers, mode, staleness_limit
        self.backend, self.launcher, self.tcp_port = backend, launcher, tcp_port

    def actor_specs(self, rank: int = 0) -> list[ActorSpec]:
        """What each actor process of DDP rank ``rank`` steps."""
        per_actor = split_envs(self.num_envs, self.num_workers)
        base = self.seed + 1_000 * rank  # as RolloutDataModule seeds a rank
        return [
            ActorSpec(
                env_id=self.env_id,
                num_envs=per_actor,
                num_steps=self.num_steps,
                seed=actor_seed(base, w),
                first_env=w * per_actor,
                total_envs=self.num_envs,
                gamma=self.gamma,
                scale_reward=self.scale_reward,
                env_kwargs=dict(self.env_kwargs),
            )
            for w in range(self.num_workers)
        ]

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str) -> None:
        if self.collector is not None:
            return
        check = getattr(self.trainer.lightning_module, "check_data", None)
        if check is not None:
            check(self)  # cross-field validation before any process starts
        if self.backend == "distributed" and self.trainer.world_size > 1:
            raise ValueError(
                "`data.backend: distributed` makes the learner rank 0 of torch.distributed's default "
                "group of actors, which Lightning's DDP also needs: use `data.backend: mp` (each DDP "
                "rank with its own actor processes) or a single learner device"
            )
        self.collector = ActorPool(
            self.actor_specs(self.trainer.global_rank),
            None,  # bound with the policy buffer, once the model has built its actor
            self.num_iterations(),
            mode=self.mode,
            staleness_limit=self.staleness_limit,
            backend=self.backend,
            launcher=self.launcher,
            tcp_port=self.tcp_port,
        )
        self.collector.last_checkpoint = lambda: getattr(self.trainer.checkpoint_callback, "last_model_path", "") or ""
        if self._pending_state is not None:
            self._load(self._pending_state)
            self._pending_state = None

    def on_exception(self, exception: BaseException) -> None:
        # Lightning calls this (not teardown) when fit stops on an error or Ctrl-C
        if self.collector is not None:
            self.collector.shutdown(raise_on_error=False)

    # ------------------------------------------------------------------ policy versions
    def push_policy(self, actor, obs_mean, obs_var, version: int) -> None:
        super().push_policy(actor, obs_mean, obs_var, version)
        self.collector.sync_weights()  # no-op until the actors run; blocks until all have it
        if self.staleness_limit is not None and version > 0:
            self._log_dropped(version)

    def _log_dropped(self, version: int) -> None:
        trainer = self.trainer
        if trainer is None or trainer.logger is None or trainer.global_rank != 0:
            return
        step = version * self.batch_size * trainer.world_size  # the step the module logs this iteration at
        trainer.logger.log_metrics({"lag/dropped_batches": float(self.collector.dropped_batches)}, step=step)
