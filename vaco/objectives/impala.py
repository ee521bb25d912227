"""IMPALA's V-trace policy gradient (Espeholt et al. 2018, arXiv:1802.01561)."""

from __future__ import annotations

from vaco import _checks
from vaco.objectives.base import Objective

__all__ = ["IMPALA"]


class IMPALA(Objective):
    """``loss = -min(rho_bar, r) * A * log pi_theta`` with the weight treated as a constant.

    ``A`` is the realigned V-trace advantage ``r_t + gamma v_{t+1} - V(s_t)`` *re-estimated for
    the current policy before every optimisation step* (``reestimate_advantage``): that is
    IMPALA's difference from VACO, which realigns once per iteration, and its extra cost.
    Requires a :class:`~vaco.advantages.VTrace` advantage module with the same ``rho_bar``.

    Args:
        rho_bar: truncation of the importance weight (1.0).
    """

    reestimate_advantage = True
    names = {"vtrace": "impala"}
    sweep_axes = {"rho_bar": "rho"}  # varied with the V-trace module's: a sweep sets both

    def __init__(self, rho_bar: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        _checks.positive(rho_bar=rho_bar)
        self.rho_bar = float(rho_bar)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        weight = ratio.detach().clamp(max=self.rho_bar)
        return -(weight * advantage * batch.get("log_prob")), {}

    def applied_weight(self, log_ratio, batch):
        return log_ratio.detach().exp().clamp(max=self.rho_bar)

    def extra_repr(self) -> str:
        return f"rho_bar={self.rho_bar}"
