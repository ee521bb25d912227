"""Decoupled PPO (Hilton, Cobbe and Schulman 2022, arXiv:2110.00641) as AReaL ships it.

Source: inclusionAI/AReaL, ``areal/utils/functional/functional.py::ppo_actor_loss_fn`` (its
decoupled loss: ``use_decoupled_loss: true``, the proximal log-probabilities recomputed by the
trainer before the update). vaco's default is AReaL's default until February 2026: the behaviour
weight ``pi_prox / beta`` applied uncapped (``behav_imp_weight_cap: None``). AReaL's default since
April 2026 (``rejection_sampling: None``, checked at 4aef98d) applies none: ``behavior_weight:
false`` (``configs/algo/decoupled_ppo_no_weight.yaml``); its GSM8K example's mask of weights above
5.0 is ``behavior_weight_cap: 5.0``.
"""

from __future__ import annotations

from typing import Literal

import torch

from vaco import _checks
from vaco.objectives.base import Objective

__all__ = ["DecoupledPPO"]

PROXIMAL_SOURCES = ("recompute", "ewma")


class DecoupledPPO(Objective):
    """``loss = -(pi_prox / beta) * min(r_p * A, clip(r_p, 1 - eps, 1 + eps_high) * A)``, ``r_p = pi_theta / pi_prox``.

    Three policies: the behaviour ``beta`` that acted, a *proximal* ``pi_prox`` that the clip
    holds the learner near, and the learner. The behaviour weight ``pi_prox / beta`` corrects for
    stale data and carries no gradient; the clip controls how far each update moves, from a
    policy that is recent whatever the data's age.

    With ``behavior_weight_cap`` (AReaL's ``behav_imp_weight_cap``) a sample whose behaviour
    weight exceeds the cap is masked: its weight is 0, so it gets no gradient (``mask_fraction``).

    Args:
        clip_epsilon: the clip around ``pi_prox`` (``eps_clip``; AReaL's GSM8K example uses 0.4,
            vaco's 0.2 is PPO's and CleanRL's for MuJoCo).
        clip_epsilon_high: the upper clip range (default: ``clip_epsilon``).
        behavior_weight_cap: mask samples with ``pi_prox / beta`` above it (AReaL's default None:
            no cap; its GSM8K example rejects ratios above 5.0).
        proximal: where ``pi_prox`` comes from: ``"recompute"`` (the learner at the start of the
            iteration, AReaL's) or ``"ewma"`` (an EWMA of the actor's weights, :class:`PPOEWMA`'s).
        ewma_decay: the EWMA's decay per optimiser step (only with ``proximal="ewma"``).
        behavior_weight: multiply by ``pi_prox / beta`` (AReaL's default until February 2026, vaco's);
            False: no behaviour weight, AReaL's default since April 2026 (``rejection_sampling: None``).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "decoupled_ppo"}

    def __init__(
        self,
        clip_epsilon: float = 0.2,
        clip_epsilon_high: float | None = None,
        behavior_weight_cap: float | None = None,
        proximal: Literal["recompute", "ewma"] = "recompute",
        ewma_decay: float = 0.9938,
        behavior_weight: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        clip_epsilon_high = clip_epsilon if clip_epsilon_high is None else clip_epsilon_high
        _checks.positive(clip_epsilon=clip_epsilon, clip_epsilon_high=clip_epsilon_high)
        if clip_epsilon >= 1:
            raise ValueError(f"`clip_epsilon` must be < 1 (the ratio is clipped at 1 - eps), got {clip_epsilon}")
        if behavior_weight_cap is not None:
            _checks.positive(behavior_weight_cap=behavior_weight_cap)
        if proximal not in PROXIMAL_SOURCES:
            raise ValueError(f"`proximal` must be one of {', '.join(map(repr, PROXIMAL_SOURCES))}, got {proximal!r}")
        if not (isinstance(ewma_decay, (int, float)) and 0.0 <= ewma_decay < 1.0):
            raise ValueError(f"`ewma_decay` must be in [0, 1), got {ewma_decay!r}")
        self.clip_epsilon, self.clip_epsilon_high = float(clip_epsilon), float(clip_epsilon_high)
        self.behavior_weight_cap = None if behavior_weight_cap is None else float(behavior_weight_cap)
        self.proximal = proximal
        self.ewma_decay = float(ewma_decay)
        if not isinstance(behavior_weight, bool):
            raise ValueError(f"`behavior_weight` must be true or false, got {behavior_weight!r}")
        if not behavior_weight and behavior_weight_cap is not None:
            raise ValueError(
                "`behavior_weight_cap` caps the behaviour weight; with `behavior_weight: false` there is none"
            )
        self.behavior_weight = behavior_weight

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        log_prob, proximal_log_prob = batch.get("log_prob"), batch.get("proximal_log_prob").detach()
        _checks.same_shape(log_prob=log_prob, proximal_log_prob=proximal_log_prob)
        proximal_ratio = (log_prob - proximal_log_prob).exp()
        unclipped = -advantage * proximal_ratio
        clipped = -advantage * proximal_ratio.clamp(1 - self.clip_epsilon, 1 + self.clip_epsilon_high)
        indicators = {"clipped": unclipped < clipped}
        if not self.behavior_weight:
            return torch.maximum(unclipped, clipped), indicators
        behavior_weight = (proximal_log_prob - batch.get("behavior_log_prob")).exp()
        if self.behavior_weight_cap is not None:
            over = behavior_weight > self.behavior_weight_cap
            behavior_weight = torch.where(over, torch.zeros_like(behavior_weight), behavior_weight)
            indicators["masked"] = over
        return torch.maximum(unclipped, clipped) * behavior_weight, indicators

    def extra_repr(self) -> str:
        return (
            f"clip_epsilon={self.clip_epsilon}, clip_epsilon_high={self.clip_epsilon_high}, "
            f"behavior_weight_cap={self.behavior_weight_cap}, proximal={self.proximal!r}, "
            f"behavior_weight={self.behavior_weight}"
        )
