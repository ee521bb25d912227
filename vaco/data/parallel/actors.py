"""The actor side: :class:`ActorCollector`, the rollout collector TorchRL builds in a worker process.

TorchRL's multi-process collectors (``MultiSyncCollector`` / ``MultiAsyncCollector``) start W
worker processes and, in each, construct ``collector_class(create_env_fn, create_env_kwargs=...,
policy_factory=..., frames_per_batch=..., worker_idx=..., use_buffers=..., ...)`` (torchrl 0.14,
``collectors/_runner.py``), then drive it through a pipe: ``next(iter(collector))`` on
"continue", ``state_dict()`` / ``load_state_dict()`` / ``shutdown()`` on request. Weights reach
the worker through a weight-sync scheme: a background thread applies them to the module that
``policy_factory()`` returned and then calls ``collector.update_policy_weights_(...)``.

:class:`ActorCollector` is vaco's :class:`~vaco.data.collector.RolloutCollector` with that
constructor and four adaptations:

* the module the scheme writes into is a *staging* copy of the policy-version buffer; the
  buffer the rollouts read is replaced by a fresh copy of it on every update, so a rollout never
  sees a half-written buffer (the scheme's thread runs concurrently with collection);
* the batch goes out through one shared-memory TensorDict updated in place (TorchRL's
  ``use_buffers`` protocol: the first batch is moved to shared memory, later ones only signal);
* ``("collector", "traj_ids")`` is added, which TorchRL's multi-collectors count frames with;
* ``state_dict()`` is packed into tensors with :func:`vaco.run.checkpoint.pack_state` (plain values
  as JSON in a byte tensor), because the worker loop converts the state to a ``TensorDict``,
  which rounds Python floats to float32 and would break exact resumption. No pickle: the state
  comes back from a checkpoint through the same safe loader as everything else.
"""

from __future__ import annotations

import copy
import ctypes
import os
import signal
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data.utils import CloudpickleWrapper

from vaco.data.collector import RolloutCollector
from vaco.data.envs import make_vector_env
from vaco.run.checkpoint import pack_state, unpack_state

__all__ = ["ActorSpec", "ActorCollector", "actor_seed", "exit_with_parent"]

# env seeds are seed * 10_000 + i (RolloutCollector); actor w > 0 adds w * 100_000 to the seed, so
# actor 0 reproduces the single-process collector exactly and no two actors share an env seed
_ACTOR_SEED_STRIDE = 100_000


def actor_seed(seed: int, actor: int) -> int:
    """Seed of actor ``actor`` in a run seeded ``seed`` (actor 0 keeps ``seed``)."""
    return seed + _ACTOR_SEED_STRIDE * actor


@dataclass(frozen=True)
class ActorSpec:
    """What one actor process steps: ``num_envs`` of the run's envs, ``num_steps`` per batch.

    Passed to TorchRL as the worker's ``create_env_fn``; calling it builds the actor's vector env.

    Args:
        env_id: gymnasium id.
        num_envs: sub-environments stepped by this actor.
        num_steps: steps per env per batch.
        seed: the actor's seed (see :func:`actor_seed`).
        first_env: index of this actor's first env among all the run's envs (for trajectory ids).
        total_envs: envs of the whole run (for trajectory ids).
        gamma: discount of the reward scaler.
        scale_reward: CleanRL's reward scaling.
        env_kwargs: extra keyword arguments for ``gymnasium.make``.
    """

    env_id: str
    num_envs: int
    num_steps: int
    seed: int
    first_env: int = 0
    total_envs: int = 1
    gamma: float = 0.99
    scale_reward: bool = True
    env_kwargs: dict = field(default_factory=dict)

    def __call__(self):
        return make_vector_env(self.env_id, self.num_envs, self.env_kwargs)


class ActorCollector(RolloutCollector):
    """A :class:`RolloutCollector` constructed and driven by TorchRL inside a worker process.

    Args:
        create_env_fn: the :class:`ActorSpec` (TorchRL may hand it over in a ``CloudpickleWrapper``,
            or as a one-element list on a ``DistributedCollector`` rank).
        policy_factory: returns the staging policy-version buffer; TorchRL's wrapper around it
            also registers the weight-sync receiver and applies the initial weights.
        use_buffers: must be true: batches are written in place into one shared TensorDict.
        worker_idx: this worker's index (TorchRL's).
        **torchrl_kwargs: the rest of what TorchRL passes to every collector class (devices,
            exploration type, replay buffer, ...); checked where they would change the data.
    """

    def __init__(
        self,
        create_env_fn: ActorSpec | CloudpickleWrapper,
        *,
        policy_factory,
        use_buffers: bool | None = True,
        worker_idx: int | None = None,
        **torchrl_kwargs: Any,
    ) -> None:
        if isinstance(create_env_fn, (list, tuple)):  # DistributedCollector's remote ranks pass [env_fn]
            if len(create_env_fn) != 1:
                raise ValueError(f"an ActorCollector steps one ActorSpec, got {len(create_env_fn)}")
            (create_env_fn,) = create_env_fn
        # TorchRL wraps every env factory that is not one of its own envs in a CloudpickleWrapper
        spec = create_env_fn.fn if isinstance(create_env_fn, CloudpickleWrapper) else create_env_fn
        if not isinstance(spec, ActorSpec):
            raise TypeError(f"ActorCollector needs an ActorSpec as create_env_fn, got {type(spec).__name__}")
        for name in ("replay_buffer", "postproc", "trajs_per_batch"):
            if torchrl_kwargs.get(name) is not None:
                raise ValueError(f"ActorCollector does not support TorchRL's `{name}`")
        if use_buffers is False:
            raise ValueError("ActorCollector writes batches in place: use_buffers must be true")
        super().__init__(
            spec.env_id,
            spec.num_envs,
            spec.num_steps,
            None,
            sys.maxsize,  # the learner decides when the run ends
            gamma=spec.gamma,
            scale_reward=spec.scale_reward,
            seed=spec.seed,
            env_kwargs=spec.env_kwargs,
        )
        self.spec = spec
        self.worker_idx = worker_idx
        self._use_buffers = True
        self.policy = policy_factory()  # staging copy: the weight-sync thread writes here
        self.policy_buffer = copy.deepcopy(self.policy)  # what rollouts read; replaced, never mutated
        self._episodes = np.zeros(spec.num_envs, dtype=np.int64)
        self._out: TensorDict | None = None
        self.closed = False  # read by TorchRL's DistributedCollector ranks

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        if not self.closed:
            self.closed = True
            super().shutdown(timeout=timeout, close_env=close_env, raise_on_error=raise_on_error)

    # ------------------------------------------------------------------ weights
    def get_model(self, model_id: str):
        if model_id != "policy":
            raise KeyError(f"ActorCollector only holds the 'policy' model, not {model_id!r}")
        return self.policy

    def update_policy_weights_(self, policy_or_weights=None, *, model_id: str | None = None, **kwargs) -> None:
        """Called by the weight-sync thread once the new buffer is in ``self.policy``.

        The learner waits for this call to return (the scheme acknowledges after it), so the
        staging copy is stable while it is copied. Assigning the attribute is atomic: a rollout
        reads either the old buffer or the new one, whole.
        """
        self.policy_buffer = copy.deepcopy(self.policy)

    # ------------------------------------------------------------------ collection
    def rollout(self) -> TensorDict:
        batch = super().rollout()
        done = batch["next", "done"].numpy()
        # trajectory id: (episode count of the env at t) * total_envs + global env index
        episode = self._episodes[:, None] + np.cumsum(done, axis=1) - done
        env_index = self.spec.first_env + np.arange(self.num_envs)[:, None]
        batch.set(("collector", "traj_ids"), torch.from_numpy(episode * self.spec.total_envs + env_index))
        self._episodes += done.sum(1)
        if self._out is None:
            self._out = batch
        else:
            self._out.update_(batch)
        return self._out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> OrderedDict:
        """The collector's state as tensors (:func:`~vaco.run.checkpoint.pack_state`).

        TorchRL's worker loop ships the state through a ``TensorDict``, which turns Python floats
        into float32 tensors: the reward scaler's float64 statistics would come back rounded and
        a resumed run would drift from one that never stopped. Packed, every value is exact.
        """
        return pack_state(dict(super().state_dict(), episodes=self._episodes.copy()))

    def load_state_dict(self, state_dict) -> None:
        state = unpack_state(state_dict)
        self._episodes = np.asarray(state.pop("episodes"), dtype=np.int64).copy()
        super().load_state_dict(state)


def exit_with_parent(parent_pid: int) -> None:
    """Worker init hook: die with the learner even if it is SIGKILLed (Linux), so no actor is orphaned.

    Without it an actor notices a dead learner only when it next reads its pipe, after a rollout.
    An actor also ignores Ctrl-C (the terminal sends SIGINT to the whole process group): the
    learner stops at its next iteration boundary and shuts its actors down itself.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the learner died before the hook ran
        os._exit(1)
