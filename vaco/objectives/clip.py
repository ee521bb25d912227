"""PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), ratio against the behaviour policy."""

from __future__ import annotations

import torch

from vaco import _checks
from vaco.objectives.base import Objective

__all__ = ["PPOClip"]


class PPOClip(Objective):
    """``loss = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` with ``r = pi_theta / beta``.

    Args:
        clip_epsilon: lower clip range ``eps_low`` (and the upper one unless given), PPO's 0.2.
        clip_epsilon_high: upper clip range (DAPO's clip-higher: 0.272 with 0.2 below).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.

    ``clip_fraction`` counts the samples whose gradient the clip removed (the clipped branch is
    strictly the minimum), the quantity comparable with the TV filter's ``filter_fraction``.
    """

    names = {"gae": "ppo_clip", "group": "grpo"}  # GRPO: with the group-relative advantage

    def __init__(self, clip_epsilon: float = 0.2, clip_epsilon_high: float | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        clip_epsilon_high = clip_epsilon if clip_epsilon_high is None else clip_epsilon_high
        _checks.positive(clip_epsilon=clip_epsilon, clip_epsilon_high=clip_epsilon_high)
        if clip_epsilon >= 1:
            raise ValueError(f"`clip_epsilon` must be < 1 (the ratio is clipped at 1 - eps), got {clip_epsilon}")
        self.clip_epsilon, self.clip_epsilon_high = float(clip_epsilon), float(clip_epsilon_high)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        unclipped = ratio * advantage
        clipped = ratio.clamp(1 - self.clip_epsilon, 1 + self.clip_epsilon_high) * advantage
        return -torch.min(unclipped, clipped), {"clipped": clipped < unclipped}

    def extra_repr(self) -> str:
        return f"clip_epsilon={self.clip_epsilon}, clip_epsilon_high={self.clip_epsilon_high}"
