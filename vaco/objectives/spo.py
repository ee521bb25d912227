"""Simple Policy Optimization (Xie et al. 2025, arXiv:2401.16025), as in its official code."""

from __future__ import annotations

from vaco import _checks
from vaco.objectives.base import Objective

__all__ = ["SPO"]


class SPO(Objective):
    """``loss = -(A * r - |A| * (r - 1)^2 / (2 * eps))``, no clipping.

    The quadratic penalty is SPO's squared-TV term; its gradient vanishes at ``r = 1 + sign(A) eps``.

    Args:
        epsilon: SPO's trust-region size (0.2).
    """

    names = {"gae": "spo"}

    def __init__(self, epsilon: float = 0.2, **kwargs) -> None:
        super().__init__(**kwargs)
        _checks.positive(epsilon=epsilon)
        self.epsilon = float(epsilon)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        return -(advantage * ratio - advantage.abs() * (ratio - 1) ** 2 / (2 * self.epsilon)), {}

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}"
