"""Thin advantage modules: read rollout keys, call the pure function, write the results.

Keys (TorchRL's conventions; the rollout TensorDict has batch dims ``[..., T]``, time last):

======================== ======================================================
read                     meaning
======================== ======================================================
``("next", "reward")``   reward of step t (after any reward scaling)
``("next", "done")``     trajectory ends after step t
``("next", "terminated")`` no bootstrap after step t
``"state_value"``        critic's V(s_t)
``("next", "state_value")`` critic's V(s_{t+1}) (final observation at truncations)
``"log_prob"``           learner's log pi(a_t|s_t) (V-trace only)
``"behavior_log_prob"``  behaviour policy's log beta(a_t|s_t) (V-trace only)
======================== ======================================================

Written: ``"advantage"`` and ``"value_target"``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from tensordict import TensorDictBase
from torch import nn

from vaco import _checks
from vaco.advantages import advantage_math as F

__all__ = ["AdvantageModule", "GAE", "VTrace"]


def _get(td: TensorDictBase, key) -> torch.Tensor:
    """Read a per-step entry as ``[..., T]``, accepting TorchRL's trailing singleton dim."""
    value = td.get(key)
    return value.squeeze(-1) if value.ndim == td.ndim + 1 and value.shape[-1] == 1 else value


class AdvantageModule(nn.Module):
    """Base of the advantage modules. Subclasses implement :meth:`estimate`.

    A module describes itself to the learner, the sweep and the report with class attributes, so
    that none of them names a concrete module:
    """

    #: the family that names the algorithm an objective makes with this module (see
    #: :attr:`vaco.objectives.Objective.names`): ``"gae"`` (behaviour-policy advantage), ``"vtrace"``
    #: (realigned to the learner). A subclass inherits its parent's family.
    family: ClassVar[str] = ""
    #: it estimates the advantage of the learner pi_T from behaviour data (advantage realignment)
    realigns: ClassVar[bool] = False
    #: the class path a sweep's ``realign`` axis swaps this module for (the same estimator with
    #: realignment switched), or ``None`` where there is none
    realign_twin: ClassVar[str | None] = None
    #: the arguments a sweep may vary, with their short labels in run ids (see
    #: :attr:`vaco.objectives.Objective.sweep_axes`)
    sweep_axes: ClassVar[dict[str, str]] = {}

    def __init__(self, gamma: float = 0.99) -> None:
        super().__init__()
        _checks.in_closed_interval(0.0, 1.0, gamma=gamma)
        self.gamma = gamma

    def estimate(self, td: TensorDictBase, **inputs: torch.Tensor):  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        inputs = dict(
            rewards=_get(td, ("next", "reward")),
            values=_get(td, "state_value"),
            next_values=_get(td, ("next", "state_value")),
            done=_get(td, ("next", "done")),
            terminated=_get(td, ("next", "terminated")),
        )
        advantage, value_target = self.estimate(td, **inputs)
        td.set("advantage", advantage)
        td.set("value_target", value_target)
        return td


class GAE(AdvantageModule):
    """Generalised advantage estimation (PPO's estimator; behaviour-policy advantage).

    Args:
        gamma: discount factor.
        lmbda: GAE lambda (CleanRL: 0.95).
    """

    family = "gae"
    realign_twin = "vaco.advantages.VTrace"

    def __init__(self, gamma: float = 0.99, lmbda: float = 0.95) -> None:
        super().__init__(gamma)
        _checks.in_closed_interval(0.0, 1.0, lmbda=lmbda)
        self.lmbda = lmbda

    def estimate(self, td, **inputs):
        return F.gae(**inputs, gamma=self.gamma, lmbda=self.lmbda)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, lmbda={self.lmbda}"


class VTrace(AdvantageModule):
    """V-trace advantage realignment: the advantage of the learner pi_T from behaviour data.

    Called once per iteration with the learner as it stands when the batch arrives (VACO), or
    before every optimisation step (IMPALA's re-estimation; see ``Objective.reestimate_advantage``).

    Args:
        gamma: discount factor.
        lmbda: trace lambda; ``c_t = lmbda * min(c_bar, pi/beta)``.
        rho_bar: truncation of the importance weight in the TD error (fixes the target policy).
        c_bar: truncation of the trace coefficients.
    """

    family = "vtrace"
    realigns = True
    realign_twin = "vaco.advantages.GAE"
    sweep_axes = {"rho_bar": "rho"}

    def __init__(self, gamma: float = 0.99, lmbda: float = 0.95, rho_bar: float = 1.0, c_bar: float = 1.0) -> None:
        super().__init__(gamma)
        _checks.in_closed_interval(0.0, 1.0, lmbda=lmbda)
        _checks.positive(rho_bar=rho_bar, c_bar=c_bar)
        self.lmbda, self.rho_bar, self.c_bar = lmbda, rho_bar, c_bar

    def estimate(self, td, **inputs):
        log_rhos = _get(td, "log_prob") - _get(td, "behavior_log_prob")
        return F.vtrace(log_rhos, **inputs, gamma=self.gamma, lmbda=self.lmbda, rho_bar=self.rho_bar, c_bar=self.c_bar)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, lmbda={self.lmbda}, rho_bar={self.rho_bar}, c_bar={self.c_bar}"
