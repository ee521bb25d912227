"""Episodes outside training: a policy run to the end of its episodes on any backend's vector env
(:func:`episode_returns`, on gymnasium's or Warp's envs through each backend's evaluation), and the
learner as a raw-observation policy. ``vaco evaluate``
and every backend's evaluation use these (without Lightning)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from vaco.data.collector_base import VectorEnv
from vaco.data.normalization import normalize_observation

__all__ = ["episode_returns", "learner_policy"]


@torch.no_grad()
def episode_returns(
    env: VectorEnv,
    policy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    episodes: int,
    *,
    seed: int = 0,
    deterministic: bool = False,
) -> np.ndarray:
    """Returns of ``episodes`` complete episodes of ``policy`` on ``env``, any backend's
    :class:`~vaco.data.collector_base.VectorEnv`; each env runs episodes until enough have ended.

    ``policy`` maps raw observations on the CPU to ``(loc, scale)``; action noise comes from a
    generator on the env's device seeded with ``seed``. Episodes are counted in the order they finish; a
    sub-env that finishes early starts another, and only the first ``episodes`` completed returns
    are kept, which is unbiased only if all envs have the same episode length distribution (they
    do: same policy). Each env contributes at most ceil(episodes / N) episodes, so short episodes
    (a failing policy) cannot crowd out long ones. Returns are summed in float64."""
    obs = env.reset(seed)
    num, device = obs.shape[0], env.device
    generator = torch.Generator(device=device).manual_seed(seed)
    running = torch.zeros(num, dtype=torch.float64, device=device)
    quota = [math.ceil(episodes / num)] * num
    returns: list[float] = []
    while len(returns) < episodes:
        loc, scale = (x.to(device) for x in policy(obs.cpu()))
        action = loc if deterministic else loc + scale * torch.randn(loc.shape, generator=generator, device=device)
        obs, reward, term, trunc, _ = env.step(torch.maximum(torch.minimum(action, env.action_high), env.action_low))
        running += reward.double()
        done = (term | trunc).cpu()
        if bool(done.any()):  # one sync per step on a device: evaluation is not the hot path
            ended = running.cpu()
            for i in done.nonzero().flatten().tolist():
                if quota[i] > 0 and len(returns) < episodes:
                    returns.append(float(ended[i]))
                    quota[i] -= 1
            running.masked_fill_(done.to(device), 0.0)
    return np.asarray(returns)


def learner_policy(actor: torch.nn.Module, obs_mean: torch.Tensor, obs_var: torch.Tensor):
    """The learner as a raw-observation policy: normalise with its statistics, then the actor."""

    def policy(obs: torch.Tensor):
        return actor(normalize_observation(obs, obs_mean, obs_var))

    return policy
