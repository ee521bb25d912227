"""Rollout collection for the simulated asynchronous setup.

:class:`RolloutCollector` is a TorchRL collector (a :class:`torchrl.collectors.BaseCollector`:
an iterable of TensorDict batches with ``state_dict``, ``set_seed`` and ``shutdown``) whose
inner loop (:meth:`vaco.data.collector_base.CollectorBase.rollout`, shared with the Warp backend)
steps a gymnasium vector env directly, through :class:`GymnasiumEnvs`. Written here, not with TorchRL's
``Collector`` + ``GymWrapper``, because TorchRL does not do three things this setup needs:

* per-env behaviour policies: each sub-environment acts with its own version from the policy
  buffer for the whole segment, and every sample records that version and its distribution;
* exact mid-episode snapshots: a resumed run must continue bit for bit, so the collector's
  carried state (current observations, episode counters, reward statistics, RNG) and the
  simulator state are checkpointed together;
* speed at one env: on this machine ``Collector(GymWrapper(vector env))`` costs ~1.3 ms per step
  of overhead (700 steps/s at 1 env with a trivial policy, 5,500 at 64 envs against 8,200 for
  the bare vector env), more than the simulator itself.

The batch follows TorchRL's layout (root keys for step t, ``("next", ...)`` for its outcome),
with batch dims ``[num_envs, num_steps]`` (time last, the advantage functions' contract):

============================== =========================================================
``observation``                raw observation s_t (normalisation belongs to the policy)
``action``                     sampled action (unclipped; the env receives it clipped)
``behavior_log_prob``          log beta(a_t | s_t) under the version that acted
``behavior_loc/behavior_scale`` that version's Gaussian parameters (for the KL baseline)
``policy_version``             id of the version that acted
``("next", "observation")``    s_{t+1}; the *final* observation where the episode ended
``("next", "reward")``         reward after CleanRL's scaling
``("next", "done"/"terminated"/"truncated")``  episode-end flags
``("next", "episode_return")`` raw return of the episode so far (its total where done)
``("next", "episode_length")`` its length so far
============================== =========================================================
"""

from __future__ import annotations

import numpy as np
import torch

from vaco.data.collector_base import CollectorBase
from vaco.data.envs import MujocoSteps, capture_envs, make_vector_env, restore_envs
from vaco.data.normalization import RewardScaler
from vaco.data.policy_buffer import PolicyVersionBuffer

__all__ = ["GymnasiumEnvs", "RolloutCollector"]


class GymnasiumEnvs:
    """gymnasium's vector env (``SyncVectorEnv``, SAME_STEP autoreset) as the rollout loop's
    :class:`~vaco.data.collector_base.VectorEnv`: numpy in, CPU tensors out, float32
    observations (MuJoCo's float64 ones are rounded once, as the batch always stored them)."""

    device = torch.device("cpu")

    def __init__(self, env_id: str, num_envs: int, env_kwargs: dict | None = None) -> None:
        self.vector = make_vector_env(env_id, num_envs, env_kwargs)
        self.num_envs = num_envs
        #: gymnasium's own step for all envs at once, bit for bit, where the task has one (None: gymnasium's)
        self.fast = MujocoSteps.of(self.vector, env_id)
        space = self.vector.single_action_space
        self.act_dim = int(space.shape[0])
        self.action_low = torch.from_numpy(space.low.astype(np.float32))
        self.action_high = torch.from_numpy(space.high.astype(np.float32))

    def reset(self, seed: int) -> torch.Tensor:
        """Env ``i`` gets ``seed * 10_000 + i``."""
        obs, _ = self.vector.reset(seed=[seed * 10_000 + i for i in range(self.num_envs)])
        return torch.from_numpy(obs.astype(np.float32))

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.fast is not None and self.fast.ready():
            new_obs, reward, term, trunc, final = self.fast.step(action.numpy())
            final_obs = final.astype(np.float32)
        else:
            new_obs, reward, term, trunc, info = self.vector.step(action.numpy())
            done = term | trunc
            final_obs = new_obs.astype(np.float32)
            if done.any():  # SAME_STEP autoreset: the final observation is in the info
                final_obs[done] = np.stack(info["final_obs"][done])
        return (
            torch.from_numpy(new_obs.astype(np.float32)),
            torch.tensor(reward, dtype=torch.float64),
            torch.tensor(term, dtype=torch.bool),
            torch.tensor(trunc, dtype=torch.bool),
            torch.from_numpy(final_obs),
        )

    def close(self) -> None:
        self.vector.close()


class RolloutCollector(CollectorBase):
    """Collects ``num_iterations`` batches of ``num_envs x num_steps`` transitions on gymnasium's
    envs (env ``i`` reset with ``seed * 10_000 + i``); ``env_kwargs`` go to ``gymnasium.make``. The
    other arguments are :class:`~vaco.data.collector_base.CollectorBase`'s.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        num_steps: int,
        policy_buffer: PolicyVersionBuffer | None,
        num_iterations: int,
        *,
        env_kwargs: dict | None = None,
        **settings,
    ) -> None:
        super().__init__(
            GymnasiumEnvs(env_id, num_envs, env_kwargs), num_steps, policy_buffer, num_iterations, **settings
        )

    # ------------------------------------------------------------------ CollectorBase's hooks
    def _reward_scaler(self, gamma: float) -> RewardScaler:
        return RewardScaler(self.num_envs, gamma)

    def _assign_slots(self) -> torch.Tensor:
        return self.policy_buffer.assign(self.num_envs, self.generator)

    def _save_envs(self):
        return capture_envs(self.env.vector)

    def _restore_envs(self, state) -> None:
        self.env.vector.reset()  # gymnasium requires a reset before stepping; then overwrite the state
        restore_envs(self.env.vector, state)
