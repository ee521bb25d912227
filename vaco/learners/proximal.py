"""The proximal policy of decoupled PPO that is not the learner at the iteration's start: an
exponential moving average (EWMA) of the actor's weights (Hilton, Cobbe and Schulman 2022).

An objective asks for a proximal policy by its ``proximal`` attribute (:class:`vaco.objectives.Objective`):
``"recompute"`` is the learner's log-probability from the iteration's one learner pass (no extra
work), ``"ewma"`` this module's average, evaluated on each minibatch and stepped after every
optimiser step by the run's update (:class:`vaco.learners.update.MinibatchUpdate`) or a population's
(:class:`vaco.population.layout.PopulationUpdate`, every member's average stacked). The average is a
submodule of the learner, so it is in every checkpoint and a resumed run continues it bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["EWMAPolicy", "ewma_weights"]


def ewma_weights(total_weight: float, decay: float) -> tuple[float, float, float]:
    """One step of the debiased average: ``(keep, add, new_total)`` with ``new = keep * old + add * current``.

    openai/ppo-ewma ``ppo_ewma/ppg.py::EwmaModel.update``: ``W' = decay * W + 1``,
    ``keep = decay * W / W'``, ``add = 1 / W'``, starting from ``W = 1`` (the average equals the
    actor at first, so early steps are not pulled towards the initial weights)."""
    new_total = decay * total_weight + 1.0
    return decay * total_weight / new_total, 1.0 / new_total, new_total


class EWMAPolicy(nn.Module):
    """An EWMA of an actor's weights, called as the actor is (``obs -> (loc, scale)``), without gradient.

    Args:
        actor: the learner's actor; the average starts as a copy of it.
        decay: the weight of the past per step, in [0, 1) (0: the actor after the last step).
    """

    def __init__(self, actor: nn.Module, decay: float) -> None:
        super().__init__()
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"`ewma_decay` must be in [0, 1), got {decay!r}")
        self.average = copy.deepcopy(actor).requires_grad_(False)
        self.decay = float(decay)
        self.total_weight = 1.0

    @torch.no_grad()
    def forward(self, obs: torch.Tensor):
        return self.average(obs)

    @torch.no_grad()
    def update(self, parameters: Iterable[torch.Tensor]) -> None:
        """Move the average towards ``parameters`` (the actor's, in ``named_parameters`` order)."""
        keep, _, new_total = ewma_weights(self.total_weight, self.decay)
        for average, current in zip(self.average.parameters(), parameters, strict=True):
            average.mul_(keep).add_(current.detach() / new_total)
        self.total_weight = new_total

    # the total weight travels with the weights in the state dict (and so in every checkpoint)
    def get_extra_state(self) -> dict[str, Any]:
        return {"total_weight": self.total_weight}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.total_weight = float(state["total_weight"])
