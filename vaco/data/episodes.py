"""Episodes outside training: a policy run to the end of its episodes on gymnasium envs, and the
learner as a raw-observation policy. ``vaco evaluate`` and the in-process and actor backends'
evaluation use these (without Lightning)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from vaco.data.envs import make_vector_env
from vaco.data.normalization import normalize_observation

__all__ = ["run_episodes", "learner_policy"]


@torch.no_grad()
def run_episodes(
    env_id: str,
    policy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    episodes: int,
    *,
    num_envs: int = 10,
    seed: int = 0,
    deterministic: bool = False,
    env_kwargs: dict | None = None,
    render: Callable[[Any], None] | None = None,
) -> np.ndarray:
    """Returns of ``episodes`` complete episodes; each env runs episodes until enough have ended.

    Episodes are counted in the order they finish; with ``num_envs`` > 1 a sub-env that finishes
    early starts another, and only the first ``episodes`` completed returns are kept, which is
    unbiased only if all envs have the same episode length distribution (they do: same policy).
    """
    num_envs = max(1, min(num_envs, episodes))
    env = make_vector_env(env_id, num_envs, env_kwargs)
    generator = torch.Generator().manual_seed(seed)
    low = torch.as_tensor(env.single_action_space.low, dtype=torch.float32)
    high = torch.as_tensor(env.single_action_space.high, dtype=torch.float32)
    try:
        obs, _ = env.reset(seed=[seed * 10_000 + i for i in range(num_envs)])
        returns: list[float] = []
        running = np.zeros(num_envs)
        # each env contributes at most ceil(episodes / num_envs) episodes, so short episodes
        # (a failing policy) cannot crowd out long ones
        quota = np.full(num_envs, math.ceil(episodes / num_envs))
        while len(returns) < episodes:
            loc, scale = policy(torch.from_numpy(obs).float())
            action = loc if deterministic else loc + scale * torch.randn(loc.shape, generator=generator)
            obs, reward, term, trunc, _ = env.step(torch.maximum(torch.minimum(action, high), low).numpy())
            if render is not None:
                render(env)
            running += reward
            for i in np.flatnonzero(term | trunc):
                if quota[i] > 0 and len(returns) < episodes:
                    returns.append(float(running[i]))
                    quota[i] -= 1
                running[i] = 0.0
        return np.asarray(returns)
    finally:
        env.close()


def learner_policy(actor: torch.nn.Module, obs_mean: torch.Tensor, obs_var: torch.Tensor):
    """The learner as a raw-observation policy: normalise with its statistics, then the actor."""

    def policy(obs: torch.Tensor):
        return actor(normalize_observation(obs, obs_mean, obs_var))

    return policy
