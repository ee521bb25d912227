"""PPO-clip plus a KL(beta || pi_theta) penalty, analytic from the stored behaviour Gaussian."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vaco import _checks
from vaco.objectives.clip import PPOClip
from vaco.objectives.objective_math import gaussian_kl

__all__ = ["PPOKL"]


class PPOKL(PPOClip):
    """``loss = clip surrogate + kl_coef * KL(beta(.|s) || pi_theta(.|s))``.

    The paper's baseline ("PPO-KL Penalty=1") uses a fixed ``kl_coef = 1.0``. With ``target_kl``
    set, the coefficient adapts once per iteration in :meth:`update_coefficients` (PPO paper,
    section 4): doubled if the iteration's mean KL exceeds ``1.5 * target_kl``, halved if it is
    below ``target_kl / 1.5``. It is a buffer, so checkpoints carry it.

    Reads ``loc``/``scale`` (learner, with gradient) and ``behavior_loc``/``behavior_scale``.
    Reports ``kl``, the per-minibatch mean of the analytic KL.
    """

    names = {"gae": "ppo_kl"}

    def __init__(self, kl_coef: float = 1.0, target_kl: float | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        if not (kl_coef >= 0):
            raise ValueError(f"`kl_coef` must be >= 0, got {kl_coef!r}")
        if target_kl is not None:
            _checks.positive(target_kl=target_kl)
        self.target_kl = target_kl
        self.register_buffer("kl_coef", torch.tensor(float(kl_coef)))

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        loss, indicators = super().surrogate(ratio=ratio, log_ratio=log_ratio, advantage=advantage, batch=batch)
        kl = gaussian_kl(batch.get("behavior_loc"), batch.get("behavior_scale"), batch.get("loc"), batch.get("scale"))
        _checks.same_shape(kl=kl, ratio=ratio)
        return loss + self.kl_coef * kl, {**indicators, "kl": kl}

    def update_coefficients(self, metrics: Mapping[str, float]) -> None:
        if self.target_kl is None or "kl" not in metrics:
            return
        if metrics["kl"] > 1.5 * self.target_kl:
            self.kl_coef.mul_(2.0)
        elif metrics["kl"] < self.target_kl / 1.5:
            self.kl_coef.div_(2.0)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kl_coef={float(self.kl_coef)}, target_kl={self.target_kl}"
