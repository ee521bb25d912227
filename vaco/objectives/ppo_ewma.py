"""PPO-EWMA (Hilton, Cobbe and Schulman 2022, "Batch size-invariance for policy optimization",
arXiv:2110.00641): decoupled PPO whose proximal policy is an EWMA of the actor's weights.

Source: openai/ppo-ewma, ``ppo_ewma/ppo.py::compute_losses`` (the loss, ``imp_samp_max`` 100) and
``ppo_ewma/ppg.py::EwmaModel`` (the debiased average, stepped after every optimiser step).
"""

from __future__ import annotations

import math

import torch

from vaco import _checks
from vaco.objectives.decoupled import DecoupledPPO

__all__ = ["PPOEWMA"]


class PPOEWMA(DecoupledPPO):
    """``loss = max(-A * pi/beta', -A * clip(pi/pi_prox, 1 - eps, 1 + eps) * pi_prox/beta')``.

    ``beta' = max(beta, sg(pi) / M)`` caps the behaviour ratio at ``M`` (``imp_samp_max``) by
    *truncating* it: past the cap a sample's weight is ``M`` and its gradient ``M * grad log pi``
    (``cap_fraction``), where :class:`DecoupledPPO`'s cap *masks* it. Ratios are formed in log
    space, as in the source. The clip is symmetric in the source (``clip_param``).

    The proximal policy is an exponential moving average of the actor's weights
    (:class:`vaco.learners.proximal.EWMAPolicy`), stepped after every optimiser step. The source ships no
    default decay (``kl_ewma_decay=None`` turns the EWMA off); vaco's 0.9938 puts the average's
    centre of mass, ``decay / (1 - decay)``, at 160 optimiser steps: the mean age of PPO's
    iteration-start proximal policy at vaco's 10 epochs x 32 minibatches. The paper sets the
    decay by that rule of matching ages; change it with the number of steps per iteration.

    Args:
        clip_epsilon: the clip around ``pi_prox`` (``clip_param``, the source's 0.2).
        imp_samp_max: the cap ``M`` on ``pi / beta`` (the source's 100; 0 or None: no cap).
        proximal: ``"ewma"`` (the source's PPO-EWMA) or ``"recompute"`` (its ``staleness_loss="decoupled"``).
        ewma_decay: the EWMA's decay per optimiser step.
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "ppo_ewma"}

    def __init__(
        self,
        clip_epsilon: float = 0.2,
        imp_samp_max: float | None = 100.0,
        proximal: str = "ewma",
        ewma_decay: float = 0.9938,
        **kwargs,
    ) -> None:
        for name, instead in (("clip_epsilon_high", "clip_epsilon"), ("behavior_weight_cap", "imp_samp_max")):
            if kwargs.pop(name, None) is not None:  # DecoupledPPO's, which this loss does not read
                raise ValueError(f"`{name}`: PPOEWMA has no such setting (its clip is symmetric; see `{instead}`)")
        super().__init__(clip_epsilon=clip_epsilon, proximal=proximal, ewma_decay=ewma_decay, **kwargs)
        if imp_samp_max:
            _checks.positive(imp_samp_max=imp_samp_max)
        self.imp_samp_max = float(imp_samp_max) if imp_samp_max else None

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        log_prob, proximal_log_prob = batch.get("log_prob"), batch.get("proximal_log_prob").detach()
        _checks.same_shape(log_prob=log_prob, proximal_log_prob=proximal_log_prob)
        behavior_log_prob = batch.get("behavior_log_prob")
        indicators = {}
        if self.imp_samp_max is not None:
            cap = log_prob.detach() - math.log(self.imp_samp_max)
            indicators["capped"] = cap > behavior_log_prob
            behavior_log_prob = torch.maximum(behavior_log_prob, cap)
        unclipped = -advantage * (log_prob - behavior_log_prob).exp()
        bound = math.log(1 - self.clip_epsilon), math.log(1 + self.clip_epsilon)
        clipped_log_ratio = (log_prob - proximal_log_prob).clamp(*bound)
        clipped = -advantage * (clipped_log_ratio + proximal_log_prob - behavior_log_prob).exp()
        indicators["clipped"] = unclipped < clipped
        return torch.maximum(unclipped, clipped), indicators

    def extra_repr(self) -> str:
        return (
            f"clip_epsilon={self.clip_epsilon}, imp_samp_max={self.imp_samp_max}, proximal={self.proximal!r}, "
            f"ewma_decay={self.ewma_decay}"
        )
