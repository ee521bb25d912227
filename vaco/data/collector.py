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

__all__ = ["GymnasiumEnvs", "JointGymnasium", "RolloutCollector"]


class GymnasiumEnvs:
    """gymnasium's vector env (``SyncVectorEnv``, SAME_STEP autoreset) as the rollout loop's
    :class:`~vaco.data.collector_base.VectorEnv`: numpy in, CPU tensors out, float32
    observations (MuJoCo's float64 ones are rounded once, as the batch always stored them).

    A population member's envs are a block of a :class:`JointGymnasium` (``shared``, its ``rows``):
    they reset, checkpoint and close as their own, and step with every member's in one call."""

    device = torch.device("cpu")
    #: the :class:`JointGymnasium` whose block these envs are, and their rows in it (None: alone)
    shared: JointGymnasium | None = None
    rows: slice | None = None

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
            return _outcome(*self.fast.step(action.numpy()))
        new_obs, reward, term, trunc, info = self.vector.step(action.numpy())
        done = term | trunc
        final_obs = new_obs.astype(np.float32)
        if done.any():  # SAME_STEP autoreset: the final observation is in the info
            final_obs[done] = np.stack(info["final_obs"][done])
        return _outcome(new_obs, reward, term, trunc, final_obs)

    def close(self) -> None:
        self.vector.close()


def _outcome(new_obs, reward, term, trunc, final_obs) -> tuple[torch.Tensor, ...]:
    """A step's numpy outcome as the rollout loop's tensors (float32 observations)."""
    return (
        torch.from_numpy(new_obs.astype(np.float32)),
        torch.tensor(reward, dtype=torch.float64),
        torch.tensor(term, dtype=torch.bool),
        torch.tensor(trunc, dtype=torch.bool),
        torch.from_numpy(final_obs.astype(np.float32, copy=False)),
    )


class JointGymnasium:
    """A population's members' :class:`GymnasiumEnvs` (one config, each member's own envs and seeds)
    as one simulator that :class:`~vaco.population.lockstep.Lockstep` steps once per step for all members:
    member ``m``'s envs are rows ``m * N ... (m + 1) * N``. Where the task has gymnasium's step for
    all envs at once (:class:`~vaco.data.envs.MujocoSteps`), it runs over every member's envs in
    one call (each env its own ``mj_step``, the observations, rewards and terminations of all in one
    numpy expression each); elsewhere each block steps through gymnasium in turn. Either way each
    env steps exactly as in its member's run alone: a member's envs share nothing with the others'.

    Built by :meth:`vaco.data.collection.InProcess.lockstep_envs`; the blocks keep their own reset,
    snapshot and close."""

    device = torch.device("cpu")

    def __init__(self, blocks: list[GymnasiumEnvs], env_id: str) -> None:
        sizes = {b.num_envs for b in blocks}
        if len(sizes) != 1:
            raise ValueError(f"the members' envs differ in number: {sorted(sizes)}")
        n = sizes.pop()
        self.blocks, self.num_envs = list(blocks), n * len(blocks)
        self.act_dim, self.action_low, self.action_high = blocks[0].act_dim, blocks[0].action_low, blocks[0].action_high
        self.fast = MujocoSteps.of([b.vector for b in blocks], env_id) if all(b.fast for b in blocks) else None
        for m, block in enumerate(self.blocks):
            block.shared, block.rows = self, slice(m * n, (m + 1) * n)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.fast is not None and self.fast.ready():
            return _outcome(*self.fast.step(action.numpy()))
        parts = [block.step(action[block.rows]) for block in self.blocks]
        return tuple(torch.cat(part) for part in zip(*parts))

    def close(self) -> None:
        for block in self.blocks:
            block.close()


class RolloutCollector(CollectorBase):
    """Collects ``num_iterations`` batches of ``num_envs x num_steps`` transitions on gymnasium's
    envs (env ``i`` reset with ``seed * 10_000 + i``); ``env_kwargs`` go to ``gymnasium.make``;
    ``env``: those envs made already (a population member's block of a :class:`JointGymnasium`). The
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
        env: GymnasiumEnvs | None = None,
        **settings,
    ) -> None:
        if env is None:
            env = GymnasiumEnvs(env_id, num_envs, env_kwargs)
        elif env.num_envs != num_envs:
            raise ValueError(f"the given envs are {env.num_envs}, not `num_envs` = {num_envs}")
        super().__init__(env, num_steps, policy_buffer, num_iterations, **settings)

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
