"""DPPO with a binary TV trust region (arXiv:2602.04879) and a squared-log-ratio penalty, prime-rl's
default loss; and the Kimi K2.5 loss (arXiv:2602.02276), the same without the mask.

Source: PrimeIntellect-ai/prime-rl, ``src/prime_rl/trainer/rl/loss.py::default_loss_fn``
(``dppo_mask_low`` = ``dppo_mask_high`` = 0.2, ``kl_tau`` 1e-3, ``adv_tau`` 1.0 in its
``DefaultLossConfig``).
"""

from __future__ import annotations

from typing import Literal

import torch

from vaco import _checks
from vaco.objectives.base import Objective

__all__ = ["DPPOTV", "KimiK25"]


class DPPOTV(Objective):
    """``loss = -keep * A * r + tau * (log r)^2``: a sample whose probability moved past the
    threshold *in its advantage's direction* gets no policy gradient.

    ``d = pi_theta - beta`` (``difference="probability"``, prime-rl's, for tokens); a sample is
    masked when ``A > 0`` and ``d > mask_high``, or ``A <= 0`` and ``d < -mask_low``
    (``mask_fraction``). The penalty ``tau * (log r)^2`` applies to every sample. The closest
    shipped relative of VACO's filter: both drop only the gradients that would widen the gap,
    but per sample against a fixed threshold, where VACO tests the minibatch's TV.

    A Gaussian policy's ``pi`` is a density, not a probability (its scale depends on the action's
    units and dimension): there ``difference="ratio"`` tests ``d = r - 1``, the sample's term of
    the TV estimate ``0.5 * mean|r - 1|`` (vaco's choice for MuJoCo; with the default thresholds
    the mask then drops the gradients PPO's clip at 0.2 drops, without PPO's ``min``).

    Args:
        mask_low, mask_high: the thresholds (``dppo_mask_low``/``dppo_mask_high``, the source's 0.2);
            None leaves that side unmasked.
        kl_tau: the penalty's coefficient ``tau`` (the source's 1e-3).
        adv_tau: the advantage's scale (the source's 1.0).
        difference: ``"probability"`` (tokens) or ``"ratio"`` (continuous actions), see above.
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "dppo_tv", "group": "dppo_tv"}
    fraction_metric = "mask_fraction"

    def __init__(
        self,
        mask_low: float | None = 0.2,
        mask_high: float | None = 0.2,
        kl_tau: float = 1e-3,
        adv_tau: float = 1.0,
        difference: Literal["probability", "ratio"] = "probability",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        _checks.positive(**{k: v for k, v in (("mask_low", mask_low), ("mask_high", mask_high)) if v is not None})
        for name, value in (("kl_tau", kl_tau), ("adv_tau", adv_tau)):
            if not value >= 0:
                raise ValueError(f"`{name}` must be >= 0, got {value!r}")
        if difference not in ("probability", "ratio"):
            raise ValueError(f"`difference` must be 'probability' or 'ratio', got {difference!r}")
        inf = float("inf")  # None: no mask on that side
        self.mask_low = inf if mask_low is None else float(mask_low)
        self.mask_high = inf if mask_high is None else float(mask_high)
        self.kl_tau, self.adv_tau, self.difference = float(kl_tau), float(adv_tau), difference

    def unsupported(self, learner: str) -> str | None:
        if learner == "mujoco" and self.difference == "probability":
            return (
                "DPPOTV with difference 'probability' compares probabilities; a Gaussian policy's are densities: "
                "set `difference: ratio` (configs/algo/dppo_tv.yaml)"
            )
        return super().unsupported(learner)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        with torch.no_grad():
            if self.difference == "probability":
                difference = batch.get("log_prob").exp() - batch.get("behavior_log_prob").exp()
            else:
                difference = ratio - 1
            masked = torch.where(advantage > 0, difference > self.mask_high, difference < -self.mask_low)
        policy = torch.where(masked, torch.zeros_like(ratio), self.adv_tau * advantage * ratio)
        return -policy + self.kl_tau * log_ratio**2, {"masked": masked}

    def extra_repr(self) -> str:
        return f"mask_low={self.mask_low}, mask_high={self.mask_high}, kl_tau={self.kl_tau}, difference={self.difference!r}"


class KimiK25(DPPOTV):
    """``loss = -adv_tau * A * r + kl_tau * (log r)^2``: the Kimi K2.5 policy loss, an unclipped
    importance-weighted advantage held near the behaviour policy by the squared log-ratio alone.
    :class:`DPPOTV` with no mask (prime-rl's default loss cites Kimi K2.5 for this penalty and adds
    DPPO's mask; ``kl_tau`` 1e-3 and ``adv_tau`` 1.0 are its ``DefaultLossConfig``'s).

    Args:
        kl_tau: the penalty's coefficient (prime-rl's 1e-3).
        adv_tau: the advantage's scale (prime-rl's 1.0).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "kimi_k25", "group": "kimi_k25"}

    def __init__(self, kl_tau: float = 1e-3, adv_tau: float = 1.0, **kwargs) -> None:
        super().__init__(mask_low=None, mask_high=None, kl_tau=kl_tau, adv_tau=adv_tau, difference="ratio", **kwargs)

    def extra_repr(self) -> str:
        return f"kl_tau={self.kl_tau}, adv_tau={self.adv_tau}"
