"""APPO as sample-factory ships it: PPO's clipped surrogate over the behaviour ratio, clipped in
``[1 / (1 + eps), 1 + eps]``, on a V-trace advantage weighted by the truncated ratio.

Source: alex-petrenko/sample-factory, ``sample_factory/algo/learning/learner.py::_calculate_losses``
(``clip_ratio_high = 1 + ppo_clip_ratio``, ``clip_ratio_low = 1 / clip_ratio_high``, ``ppo_clip_ratio``
0.1; the ratio clamped to [0.05, 20] first; with ``with_vtrace`` the advantage is
``min(rho_hat, r) * (r_t + gamma * v_{t+1} - V(s_t))``, ``vtrace_rho`` 1.0).
"""

from __future__ import annotations

import torch

from vaco import _checks
from vaco.objectives.base import Objective

__all__ = ["APPO"]


class APPO(Objective):
    """``loss = -min(r * A', clip(r, 1/(1+eps), 1+eps) * A')`` with ``A' = min(rho_bar, r) * A`` (no gradient).

    The clip is symmetric in ``log r``; ``r`` is first clamped to ``[0.05, 20]``, as in the
    source. ``A`` is vaco's realigned V-trace advantage (:class:`~vaco.advantages.VTrace`), made
    once per iteration; sample-factory recomputes its V-trace from the current policy on every
    minibatch (IMPALA's cost), the one difference from the source.

    Args:
        clip_epsilon: ``eps`` (``ppo_clip_ratio``, the source's 0.1).
        rho_bar: the truncation of the advantage's weight (``vtrace_rho``, 1.0); must equal the
            V-trace module's.
        weight_advantage: multiply the advantage by ``min(rho_bar, r)`` as the source does.
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"vtrace": "appo"}
    sweep_axes = {"rho_bar": "rho"}

    def __init__(
        self, clip_epsilon: float = 0.1, rho_bar: float = 1.0, weight_advantage: bool = True, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        _checks.positive(clip_epsilon=clip_epsilon, rho_bar=rho_bar)
        if clip_epsilon >= 10:  # the range [1/(1+eps), 1+eps] is symmetric in log r, so any eps is a clip; 10 is 11x
            raise ValueError(
                f"`clip_epsilon` must be < 10 (the ratio is kept in [1/(1+eps), 1+eps]), got {clip_epsilon}"
            )
        self.clip_epsilon, self.rho_bar, self.weight_advantage = float(clip_epsilon), float(rho_bar), weight_advantage

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        ratio = ratio.clamp(0.05, 20.0)  # the source's: extreme ratios are noise
        if self.weight_advantage:
            advantage = advantage * ratio.detach().clamp(max=self.rho_bar)
        high = 1.0 + self.clip_epsilon
        unclipped = ratio * advantage
        clipped = ratio.clamp(1.0 / high, high) * advantage
        return -torch.min(unclipped, clipped), {"clipped": clipped < unclipped}

    def extra_repr(self) -> str:
        return f"clip_epsilon={self.clip_epsilon}, rho_bar={self.rho_bar}, weight_advantage={self.weight_advantage}"
