"""The data side of a MuJoCo run: envs, the policy-version buffer, the collector, evaluation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import torch
from torchrl.collectors import BaseCollector

from vaco import _checks
from vaco.data.collection import Collection, InProcess
from vaco.data.envs import EnvSpec
from vaco.data.policy_buffer import PolicyVersionBuffer

__all__ = ["RolloutDataModule"]


def check_memory(num_envs: int, num_steps: int, policy_buffer_size: int, members: int = 1, env_bytes: int = 0) -> None:
    """Refuse sizes whose smallest allocation cannot fit in this machine's available memory (one
    line naming the fields). Lower bounds, before any env exists: a rollout holds >= 8 float32
    numbers per transition (observation, action, log-prob, reward, value, ...), each of the K
    policy versions >= the smallest actor's ~4,500 float32 weights (64-64 hidden units), and each
    env ``env_bytes`` (the backend's, :attr:`vaco.data.collection.Collection.env_bytes`). A
    population (``members`` runs in one process) needs all of it once per member."""
    S = members
    of = "`population` x " if S > 1 else ""
    times = f"{S:,} x " if S > 1 else ""
    _checks.fits_in_memory(
        S * num_envs * num_steps * 8 * 4,
        f"{of}`data.num_envs` x `data.num_steps` ({times}{num_envs:,} x {num_steps:,})",
    )
    if env_bytes:
        _checks.fits_in_memory(
            S * num_envs * env_bytes, f"{of}`data.num_envs` ({times}{num_envs:,} envs of >= {env_bytes / 1e6:.1f} MB)"
        )
    _checks.fits_in_memory(
        S * policy_buffer_size * 4_500 * 4, f"{of}`data.policy_buffer_size` ({times}K = {policy_buffer_size:,})"
    )


class RolloutDataModule(L.LightningDataModule):
    """Rollouts of a MuJoCo task collected by a mixture of the last K policies.

    Each DDP rank collects its own ``num_envs`` envs (seeded by rank), so an iteration has
    ``world_size * num_envs * num_steps`` env steps in all.

    Args:
        env_id: gymnasium id, e.g. ``Hopper-v5``.
        num_envs: sub-environments (actors) per rank. CleanRL: 1; the paper: 500.
        num_steps: steps per env per iteration (rollout segment). CleanRL: 2048; the paper: 1000.
        total_steps: env steps of the whole run (all ranks); sets the number of iterations.
        policy_buffer_size: K, how many recent policies the actors draw from (1 = synchronous).
        scale_reward: CleanRL's reward scaling (divide by the std of the discounted return).
        gamma: discount of the reward scaler; keep it equal to the advantage module's gamma.
        eval_every: evaluate the learner every this many iterations (0: only at the end).
        eval_episodes: episodes per evaluation (E); ``eval/return`` is their mean.
        eval_envs: eval sub-environments run side by side (at most ``eval_episodes``).
        eval_deterministic: act with the Gaussian's mean during evaluation (default: sample,
            as CleanRL's evaluation and its reported returns do).
        seed: base seed of envs and collection RNG (linked from ``seed_everything`` by the CLI).
        env_kwargs: extra keyword arguments for ``gymnasium.make``.
        collection: how batches are collected (``class_path`` in YAML): ``vaco.data.InProcess``
            (default: gymnasium envs in this process), ``vaco.data.parallel.Actors`` (actor
            processes, sync or async) or ``vaco.data.warp.Warp`` (MuJoCo Warp worlds on a
            device); see :mod:`vaco.data.collection`.

    The learner meets it through :meth:`bind` (from the learner's ``setup``); nothing acts before.
    """

    # what a resumed run may not change (the module adds its own); see VacoModule.run_definition
    defining_fields = (
        "env_id",
        "num_envs",
        "num_steps",
        "policy_buffer_size",
        "scale_reward",
        "gamma",
        "seed",
        "env_kwargs",
        "collection",
    )

    def __init__(
        self,
        env_id: str = "Hopper-v5",
        num_envs: int = 1,
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
        collection: Collection | None = None,
    ) -> None:
        super().__init__()
        _checks.integers(
            "data",
            ("num_envs", num_envs, 1),
            ("num_steps", num_steps, 1),
            ("total_steps", total_steps, 1),
            ("eval_episodes", eval_episodes, 1),
            ("eval_envs", eval_envs, 1),
            ("eval_every", eval_every, 0),
        )
        if not (isinstance(policy_buffer_size, int) and policy_buffer_size >= 1):
            raise ValueError(f"`data.policy_buffer_size` (K) must be an integer >= 1, got {policy_buffer_size!r}")
        if total_steps < num_envs * num_steps:
            raise ValueError(
                f"`data.total_steps` ({total_steps}) is smaller than one batch "
                f"(num_envs * num_steps = {num_envs * num_steps})"
            )
        # the backend is saved as its plain config (class_path + init_args), never as an object: a
        # checkpoint holds only tensors and plain values (vaco.run.checkpoint refuses anything else)
        self.save_hyperparameters(ignore=["collection"])
        self.env_id, self.num_envs, self.num_steps = env_id, num_envs, num_steps
        self.total_steps, self.policy_buffer_size = total_steps, policy_buffer_size
        self.scale_reward, self.gamma, self.seed = scale_reward, gamma, seed
        self.eval_every, self.eval_episodes = eval_every, eval_episodes
        self.eval_envs, self.eval_deterministic = min(eval_envs, eval_episodes), eval_deterministic
        self.env_kwargs = env_kwargs or {}
        self.collection = collection if collection is not None else InProcess()
        if not isinstance(self.collection, Collection):
            raise ValueError(
                f"`data.collection` must be a vaco.data.collection.Collection, got {type(collection).__name__}"
            )
        self.collection.validate(self)  # the env id and the backend's own settings, before any work
        # after the backend's own, finer estimate
        check_memory(num_envs, num_steps, policy_buffer_size, env_bytes=self.collection.env_bytes)
        if collection is not None:
            self.hparams["collection"] = self.collection.config()
        self._spec: EnvSpec | None = None
        self.collector: BaseCollector | None = None  # a RolloutCollector, or the backend's
        self._policy_buffer: PolicyVersionBuffer | None = None  # built by bind()
        self.learner: L.LightningModule | None = None  # bound by the learner's setup (bind)
        self._pending_state: dict | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def batch_size(self) -> int:
        """Transitions per rank per iteration."""
        return self.num_envs * self.num_steps

    def world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def num_iterations(self) -> int:
        return max(1, self.total_steps // (self.batch_size * self.world_size()))

    @property
    def env_spec(self) -> EnvSpec:
        if self._spec is None:
            self._spec = self.collection.env_spec(self)
        return self._spec

    # ------------------------------------------------------------------ the learner
    def bind(self, learner: L.LightningModule) -> None:
        """Where the learner and the data module meet: the learner calls this from its ``setup``,
        once its networks exist, before any env starts.

        Ownership is explicit: the learner owns the networks and the observation statistics and
        pushes a version after each update (:meth:`push_policy`); the data module owns what acts
        with those versions: the collector and the policy-version buffer, built here from the
        learner's actor. The learner's cross-field checks (``check_data``) run first.
        """
        if self.learner is learner and self.collector is not None:
            return
        learner.check_data(self)
        self.learner = learner
        if self.collector is None:
            self.collector = self.collection.collector(self, seed=self.seed + 1_000 * learner.global_rank)
        self._policy_buffer = PolicyVersionBuffer(learner.actor, self.env_spec.obs_dim, self.policy_buffer_size)
        self.collector.policy_buffer = self._policy_buffer
        if self._pending_state is not None:
            self._load(self._pending_state)
            self._pending_state = None

    @property
    def policy_buffer(self) -> PolicyVersionBuffer:
        """The last K versions of the learner's actor (owned here; built by :meth:`bind`)."""
        if self._policy_buffer is None:
            raise RuntimeError("the data module has no learner yet: the learner's `setup` calls `data.bind(learner)`")
        return self._policy_buffer

    def train_dataloader(self):
        return self.collector

    def teardown(self, stage: str) -> None:
        if self.collector is not None:
            self.collector.shutdown()

    def on_exception(self, exception: BaseException) -> None:
        # Lightning calls this (not teardown) when fit stops on an error or Ctrl-C
        if self.collector is not None:
            self.collection.on_exception(self)

    def state_dict(self) -> dict[str, Any]:
        if self.collector is None:
            return {}
        return {"collector": self.collector.state_dict(), "policy_buffer": self.policy_buffer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self._policy_buffer is None:  # restored before the learner is bound (e.g. from a Python script)
            self._pending_state = state_dict
        else:
            self._load(state_dict)

    def _load(self, state: dict[str, Any]) -> None:
        self.policy_buffer.load_state_dict(state["policy_buffer"])
        self.collector.load_state_dict(state["collector"])

    # ------------------------------------------------------------------ policy versions
    def push_policy(self, actor: torch.nn.Module, obs_mean: torch.Tensor, obs_var: torch.Tensor, version: int) -> None:
        self.policy_buffer.push(actor, obs_mean, obs_var, version)
        self.collection.on_policy_pushed(self, version)

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self,
        policy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        episodes: int | None = None,
        seed: int | None = None,
        deterministic: bool | None = None,
    ) -> np.ndarray:
        """Run ``episodes`` full episodes of ``policy`` (raw obs -> (loc, scale)); return their raw returns."""
        return self.collection.evaluate(
            self,
            policy,
            episodes or self.eval_episodes,
            (self.seed + 12_345) if seed is None else seed,
            self.eval_deterministic if deterministic is None else deterministic,
        )
