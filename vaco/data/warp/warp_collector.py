"""``WarpCollector``: :class:`~vaco.data.collector.RolloutCollector`'s batch, collected on the
device the Warp worlds live on.

Same TensorDict (keys, ``[num_envs, num_steps]`` layout, dtypes), same semantics: each world
acts with the version the policy buffer assigns it for the whole segment (the K-policy mixture
runs as one batched call per step on the device), CleanRL's reward scaling, the final
observation kept where an episode ended, episode statistics per world. The observation
normaliser belongs to the policy, as in the CPU collector. Nothing leaves the device per step;
one check per batch that everything is finite.
"""

from __future__ import annotations

import math
import time

import torch
from tensordict import TensorDict

from vaco.data.collector_base import CollectorBase
from vaco.data.normalization import DeviceRewardScaler
from vaco.data.policy_buffer import PolicyVersionBuffer
from vaco.data.warp.env import WarpVectorEnv

__all__ = ["WarpCollector"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class WarpCollector(CollectorBase):
    """Collects ``num_iterations`` batches of ``num_envs x num_steps`` transitions on MuJoCo Warp.

    Args:
        env: the batched env (``num_worlds`` = ``num_envs``).
        num_steps: steps per world per batch.
        policy_buffer: the versions to act with (moved to the env's device when bound).
        num_iterations: batches to yield.
        gamma: discount of the reward scaler.
        scale_reward: CleanRL's reward scaling.
        seed: seeds the reset noise and the collector's generator (action noise, version draws).
    """

    def __init__(
        self,
        env: WarpVectorEnv,
        num_steps: int,
        policy_buffer: PolicyVersionBuffer | None,
        num_iterations: int,
        *,
        gamma: float = 0.99,
        scale_reward: bool = True,
        seed: int = 0,
    ) -> None:
        self.device = env.device  # before the base sets policy_buffer (moved to this device)
        self._policy_buffer = None
        super().__init__(
            env=env,
            num_envs=env.num_worlds,
            num_steps=num_steps,
            policy_buffer=policy_buffer,
            num_iterations=num_iterations,
            reward_scaler=DeviceRewardScaler(env.num_worlds, gamma, env.device) if scale_reward else None,
            generator=torch.Generator(device=env.device),
            seed=seed,
        )

    @property
    def policy_buffer(self) -> PolicyVersionBuffer | None:
        return self._policy_buffer

    @policy_buffer.setter
    def policy_buffer(self, buffer: PolicyVersionBuffer | None) -> None:
        self._policy_buffer = None if buffer is None else buffer.to(self.device)

    # ------------------------------------------------------------------ state (CollectorBase's hooks)
    def _save_array(self, x: torch.Tensor) -> torch.Tensor:
        return x.cpu().clone()

    def _load_array(self, saved: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        return saved.to(self.device, dtype).clone() if dtype is not None else saved.to(self.device).clone()

    def _save_envs(self):
        return self.env.state_dict()

    def _restore_envs(self, state) -> None:
        self.env.load_state_dict(state)

    # ------------------------------------------------------------------ collection
    @torch.no_grad()
    def rollout(self) -> TensorDict:
        start = time.perf_counter()
        N, T, env = self.num_envs, self.num_steps, self.env
        if self._obs is None:
            self._obs = env.reset(seed=self.seed)
            self._ep_return.zero_()
            self._ep_length.zero_()
        slots = self.policy_buffer.assign(N, torch.Generator().manual_seed(_draw_seed(self.generator)))
        policy = self.policy_buffer.mixture(slots.to(self.device))
        obs_dim, act_dim = self._obs.shape[-1], env.act_dim
        f32 = dict(dtype=torch.float32, device=self.device)
        obs = torch.empty(T, N, obs_dim, **f32)
        next_obs = torch.empty(T, N, obs_dim, **f32)
        actions = torch.empty(T, N, act_dim, **f32)
        locs = torch.empty(T, N, act_dim, **f32)
        scales = torch.empty(T, N, act_dim, **f32)
        log_probs = torch.empty(T, N, **f32)
        rewards = torch.empty(T, N, **f32)
        terminated = torch.empty(T, N, dtype=torch.bool, device=self.device)
        truncated = torch.empty(T, N, dtype=torch.bool, device=self.device)
        ep_returns = torch.empty(T, N, **f32)
        ep_lengths = torch.empty(T, N, dtype=torch.long, device=self.device)
        for t in range(T):
            obs[t] = self._obs
            loc, scale = policy(self._obs)
            noise = torch.randn(N, act_dim, generator=self.generator, **f32)
            action = torch.addcmul(loc, scale, noise)
            log_probs[t] = (-0.5 * noise.square() - scale.log()).sum(-1) - act_dim * _LOG_SQRT_2PI
            actions[t], locs[t], scales[t] = action, loc, scale.expand_as(loc)
            clipped = torch.maximum(torch.minimum(action, env.action_high), env.action_low)
            new_obs, reward, term, trunc, final = env.step(clipped)
            done = term | trunc
            next_obs[t] = final
            self._ep_return += reward.double()
            self._ep_length += 1
            ep_returns[t] = self._ep_return.float()
            ep_lengths[t] = self._ep_length
            self._ep_return.masked_fill_(done, 0.0)
            self._ep_length.masked_fill_(done, 0)
            rewards[t] = self.reward_scaler(reward, term, done) if self.reward_scaler else reward
            terminated[t], truncated[t] = term, trunc
            self._obs = new_obs
        if not bool(torch.isfinite(rewards).all() & torch.isfinite(next_obs).all() & torch.isfinite(obs).all()):
            raise FloatingPointError(
                f"the environment returned NaN/inf observations or rewards at iteration {self.iteration}"
            )

        def env_major(x: torch.Tensor) -> torch.Tensor:
            return x.transpose(0, 1).contiguous()

        batch = TensorDict(
            {
                "observation": env_major(obs),
                "action": env_major(actions),
                "behavior_log_prob": env_major(log_probs),
                "behavior_loc": env_major(locs),
                "behavior_scale": env_major(scales),
                "policy_version": policy.versions.to(self.device).unsqueeze(-1).expand(N, T).clone(),
                "next": {
                    "observation": env_major(next_obs),
                    "reward": env_major(rewards),
                    "done": env_major(terminated | truncated),
                    "terminated": env_major(terminated),
                    "truncated": env_major(truncated),
                    "episode_return": env_major(ep_returns),
                    "episode_length": env_major(ep_lengths),
                },
            },
            batch_size=[N, T],
            device=self.device,
        )
        self.iteration += 1
        self.last_collect_seconds = time.perf_counter() - start
        return batch


def _draw_seed(generator: torch.Generator) -> int:
    """A seed for the CPU draw of version slots, from the collector's (device) generator, so one
    generator decides everything and checkpoints with the collector."""
    return int(torch.randint(2**62, (1,), generator=generator, device=generator.device).item())
