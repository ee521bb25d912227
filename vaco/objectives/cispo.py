"""CISPO (MiniMax-M1, Chen et al. 2025, arXiv:2506.13585): the importance weight clipped under a
stop-gradient, so a clipped sample keeps its gradient.

Source: verl-project/verl, ``verl/trainer/ppo/core_algos.py::compute_policy_loss_cispo``
(``-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi``, the ratio's log bounded at 20).
"""

from __future__ import annotations

from vaco import _checks
from vaco.objectives.base import Objective

__all__ = ["CISPO"]


class CISPO(Objective):
    """``loss = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi_theta``.

    Unlike PPO's clip, which removes a clipped sample's gradient, the weight is clipped and the
    gradient ``w * A * grad log pi`` kept (``cap_fraction``: the samples whose weight was clipped).

    Args:
        clip_epsilon_low: ``eps_low``; 1.0 (vaco's default) puts no lower bound on the weight, as
            MiniMax-M1 describes (SkyRL's ``CISPOConfig`` default 0.0 holds it at 1 from below).
        clip_epsilon_high: ``eps_high`` (SkyRL's ``CISPOConfig`` default 5.0).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "cispo", "group": "cispo"}
    fraction_metric = "cap_fraction"

    def __init__(self, clip_epsilon_low: float = 1.0, clip_epsilon_high: float = 5.0, **kwargs) -> None:
        super().__init__(**kwargs)
        if not 0.0 <= clip_epsilon_low <= 1.0:
            raise ValueError(f"`clip_epsilon_low` must be in [0, 1], got {clip_epsilon_low!r}")
        _checks.positive(clip_epsilon_high=clip_epsilon_high)
        self.clip_epsilon_low, self.clip_epsilon_high = float(clip_epsilon_low), float(clip_epsilon_high)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        ratio = log_ratio.detach().clamp(-20.0, 20.0).exp()
        low, high = 1 - self.clip_epsilon_low, 1 + self.clip_epsilon_high
        weight = ratio.clamp(low, high)
        return -weight * advantage * batch.get("log_prob"), {"capped": (ratio < low) | (ratio > high)}

    def applied_weight(self, log_ratio, batch):
        return log_ratio.detach().clamp(-20.0, 20.0).exp().clamp(1 - self.clip_epsilon_low, 1 + self.clip_epsilon_high)

    def extra_repr(self) -> str:
        return f"clip_epsilon_low={self.clip_epsilon_low}, clip_epsilon_high={self.clip_epsilon_high}"
