"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071): PPO's clip on
each completion's geometric-mean ratio (the LLM track).

Source: verl-project/verl, ``verl/trainer/ppo/core_algos.py::compute_policy_loss_gspo`` (the
token-level form ``s_it = sg(s_i) * pi_it / sg(pi_it)``, its log bounded above at 10) with the
paper's clip ranges 3e-4 below and 4e-4 above.
"""

from __future__ import annotations

import torch

from vaco import _checks
from vaco.objectives.base import Objective
from vaco.objectives.objective_math import sequence_log_ratio

__all__ = ["GSPO"]


class GSPO(Objective):
    """``loss = -min(s * A, clip(s, 1 - eps_low, 1 + eps_high) * A)``, ``s_i = exp(mean_t log r_it)``.

    Every token of completion ``i`` carries the sequence's ratio ``s_i`` in value, and the
    gradient of its own ``log pi`` (``log s_it = sg(log s_i) + log pi_it - sg(log pi_it)``); a
    clipped completion's tokens get none (``clip_fraction``). Needs ``[B, L]`` rows.

    Args:
        clip_epsilon: ``eps_low`` (the paper's 3e-4).
        clip_epsilon_high: ``eps_high`` (the paper's 4e-4).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"group": "gspo"}

    def __init__(self, clip_epsilon: float = 3e-4, clip_epsilon_high: float = 4e-4, **kwargs) -> None:
        super().__init__(**kwargs)
        _checks.positive(clip_epsilon=clip_epsilon, clip_epsilon_high=clip_epsilon_high)
        self.clip_epsilon, self.clip_epsilon_high = float(clip_epsilon), float(clip_epsilon_high)

    def unsupported(self, learner: str) -> str | None:
        if learner == "mujoco":
            return "GSPO clips each completion's ratio ([B, L] rows); a MuJoCo minibatch has no sequences"
        return super().unsupported(learner)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        log_prob = batch.get("log_prob")
        sequence = sequence_log_ratio(log_ratio.detach(), batch.get("mask", None), mean=True)
        token = (log_prob - log_prob.detach() + sequence).clamp(max=10.0)
        s = token.exp()
        unclipped = s * advantage
        clipped = s.clamp(1 - self.clip_epsilon, 1 + self.clip_epsilon_high) * advantage
        return -torch.min(unclipped, clipped), {"clipped": clipped < unclipped}

    def extra_repr(self) -> str:
        return f"clip_epsilon={self.clip_epsilon}, clip_epsilon_high={self.clip_epsilon_high}"
