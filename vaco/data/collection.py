"""How a :class:`~vaco.data.RolloutDataModule` collects and evaluates: the ``collection`` field,
chosen by ``class_path`` in YAML.

A collection backend is one class: it checks its settings before any work starts, says what the
networks need to know about the task (:class:`~vaco.data.envs.EnvSpec`), builds the collector (a
TorchRL ``BaseCollector`` yielding the batch described in :mod:`vaco.data.collector`) and runs
evaluation episodes. The data module owns everything else (sizes, the policy buffer, the
reward-scaler settings, checkpointing), so every backend produces the same batch for the same
learner.

* :class:`InProcess` (the default): gymnasium vector envs stepped in this process on the CPU.
* :class:`vaco.data.parallel.Actors`: gymnasium envs stepped by actor processes, synchronously or
  asynchronously (docs/async.md).
* :class:`vaco.data.warp.Warp`: MuJoCo Warp worlds on a device (``cpu`` or ``cuda``).

The learner meets the data module through :meth:`~vaco.data.RolloutDataModule.bind`: the data module
builds the collector and owns the policy-version buffer; the learner pushes versions into it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from vaco.data.envs import EnvSpec, env_spec, validate_env_id

if TYPE_CHECKING:
    from torchrl.collectors import BaseCollector

    from vaco.data.collector_base import VectorEnv
    from vaco.data.policy_buffer import PolicyVersionBuffer

__all__ = ["Collection", "InProcess", "RolloutSettings"]


class RolloutSettings(Protocol):
    """What a backend reads from the data module (:class:`~vaco.data.RolloutDataModule` is the one
    implementation): the task, the batch shape, the reward scaler's settings and the policy buffer.
    A backend depends on this, not on the Lightning data module."""

    env_id: str
    env_kwargs: dict | None
    num_envs: int
    num_steps: int
    gamma: float
    scale_reward: bool
    eval_envs: int
    trainer: Any  # the Lightning trainer (None outside fit): DDP rank and world size

    @property
    def batch_size(self) -> int: ...

    @property
    def policy_buffer(self) -> PolicyVersionBuffer: ...

    def world_size(self) -> int: ...

    def num_iterations(self) -> int: ...


class Collection:
    """Base of the collection backends (see the module docstring)."""

    #: a lower bound of the host memory one env takes (``check_memory``): 0 where the backend checks
    #: its own (Warp) or was not measured (envpool)
    env_bytes: int = 0

    def validate(self, data: RolloutSettings) -> None:
        """Raise a ValueError naming the field if this backend cannot run ``data``'s settings."""
        validate_env_id(data.env_id)

    def env_spec(self, data: RolloutSettings) -> EnvSpec:
        return env_spec(data.env_id, data.env_kwargs)

    def collector(self, data: RolloutSettings, seed: int, env: VectorEnv | None = None) -> BaseCollector:
        """The collector of ``data``'s batches, seeded with ``seed``; on ``env`` where given (one of
        :meth:`lockstep_envs`), else on envs of its own."""
        raise NotImplementedError  # pragma: no cover - abstract

    def check_members(self, data: RolloutSettings, members: int) -> None:
        """Raise a ValueError naming the field if ``members`` runs of ``data`` (a population) cannot
        run in one process on this backend (beyond :func:`vaco.data.datamodule.check_memory`)."""

    def lockstep_envs(self, datas: list[RolloutSettings], seeds: list[int]) -> list[VectorEnv] | None:
        """A population's envs as blocks of one simulator (member ``m``'s collector on the ``m``-th,
        seeded ``seeds[m]``), stepped for all at once by :class:`vaco.population.lockstep.Lockstep`; None
        (the default) where the backend has no such simulator: each member collects on its own envs,
        in turn."""
        return None

    def eval_env(self, data: RolloutSettings, num_envs: int, seed: int) -> VectorEnv:
        """The ``num_envs`` envs evaluation episodes run on (seeded by the loop's ``reset(seed)``)."""
        from vaco.data.collector import GymnasiumEnvs

        return GymnasiumEnvs(data.env_id, num_envs, data.env_kwargs)

    def evaluate(
        self,
        data: RolloutSettings,
        policy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        episodes: int,
        seed: int,
        deterministic: bool,
    ) -> np.ndarray:
        """Raw returns of ``episodes`` complete episodes of ``policy`` (raw obs -> (loc, scale)) on
        :meth:`eval_env`'s ``min(data.eval_envs, episodes)`` envs."""
        from vaco.data.episodes import episode_returns

        env = self.eval_env(data, max(1, min(data.eval_envs, episodes)), seed)
        try:
            return episode_returns(env, policy, episodes, seed=seed, deterministic=deterministic)
        finally:
            env.close()

    def on_policy_pushed(self, data: RolloutSettings, version: int) -> None:
        """After the learner pushed ``version`` into the policy buffer (e.g. ship it to actor processes)."""

    def on_exception(self, data: RolloutSettings) -> None:
        """Fit stopped on an error or Ctrl-C (e.g. stop actor processes); ``teardown`` shuts down otherwise."""

    def config(self) -> dict[str, Any]:
        """This backend as plain YAML values (``class_path`` and ``init_args``): what a checkpoint's
        hyperparameters hold. Every ``__init__`` argument is kept as an attribute of the same name."""

        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return {"class_path": self.definition()["class_path"], "init_args": {n: getattr(self, n) for n in names}}

    @property
    def label(self) -> str | None:
        """What a run's name says of this backend (``async x2``, ``warp``); None for the default
        (:class:`InProcess`), so that a plain run's name is only its coordinates."""
        return type(self).__name__.lower()

    def definition(self) -> dict[str, Any]:
        """What a resumed run may not change: the class and its defining settings."""
        return {"class_path": f"{type(self).__module__}.{type(self).__qualname__}"}


#: a gymnasium MuJoCo env takes 0.57-1.24 MB in process (RSS per env of 100-200 envs, 2026-11-28:
#: InvertedPendulum-v5 0.57, Hopper-v5 1.10, HalfCheetah-v5 1.12, Humanoid-v5 1.24); the check's lower bound
GYMNASIUM_ENV_BYTES = 500_000


class InProcess(Collection):
    """gymnasium vector envs (``SAME_STEP`` autoreset) stepped in this process: today's collector,
    :class:`~vaco.data.collector.RolloutCollector`."""

    env_bytes = GYMNASIUM_ENV_BYTES
    label = None  # the default backend: nothing in a run's name

    def lockstep_envs(self, datas: list[RolloutSettings], seeds: list[int]) -> list[VectorEnv]:
        """Each member's own gymnasium envs, as blocks of one :class:`~vaco.data.collector.JointGymnasium`
        (every member's envs step in one call, and act and record in one, :class:`vaco.population.lockstep.Lockstep`)."""
        from vaco.data.collector import GymnasiumEnvs, JointGymnasium

        blocks = [GymnasiumEnvs(data.env_id, data.num_envs, data.env_kwargs) for data in datas]
        JointGymnasium(blocks, datas[0].env_id)
        return blocks

    def collector(self, data: RolloutSettings, seed: int, env: VectorEnv | None = None) -> BaseCollector:
        from vaco.data.collector import RolloutCollector

        return RolloutCollector(
            data.env_id,
            data.num_envs,
            data.num_steps,
            None,  # the policy buffer is bound once the model has built its actor
            data.num_iterations(),
            gamma=data.gamma,
            scale_reward=data.scale_reward,
            seed=seed,
            env_kwargs=data.env_kwargs,
            env=env,
        )
