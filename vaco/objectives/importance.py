"""Importance-weighted policy gradients over the behaviour ratio ``r = pi_theta / beta``, in the
REINFORCE form ``-sg(w) * A * log pi_theta``: truncated (TIS) and masked (MIS) importance sampling,
per token or per sequence.

Source: verl-project/verl, ``verl/trainer/ppo/rollout_corr_helper.py`` (``compute_rollout_correction_weights``:
a single threshold truncates, TIS; ``"lower_upper"`` zeroes the weights outside, IcePop's MIS; ``rollout_is``
``"token"`` or ``"sequence"``; the weights detached) with its bypass mode's ``reinforce`` loss, which
applies them to ``-A * log pi`` with the behaviour policy as the old one.
"""

from __future__ import annotations

import torch

from vaco import _checks
from vaco.objectives.base import Objective
from vaco.objectives.objective_math import sequence_log_ratio

__all__ = ["MIS", "TIS", "SequenceMIS", "SequenceTIS"]

#: verl's bound on a log ratio before it is exponentiated (``SAFETY_BOUND``)
LOG_RATIO_BOUND = 20.0


class _ImportanceWeighted(Objective):
    """``loss = -sg(w) * A * log pi_theta`` with ``w`` from :meth:`weight`; ``level="sequence"``:
    one ratio per ``[B, L]`` row, ``prod_t r_t`` (the LLM track)."""

    fraction_metric = "cap_fraction"

    def __init__(self, level: str = "token", **kwargs) -> None:
        super().__init__(**kwargs)
        if level not in ("token", "sequence"):
            raise ValueError(f"`level` must be 'token' or 'sequence', got {level!r}")
        self.level = level

    def unsupported(self, learner: str) -> str | None:
        if learner == "mujoco" and self.level == "sequence":
            return f"{type(self).__name__} weighs whole completions (level 'sequence'); a MuJoCo minibatch has none"
        return super().unsupported(learner)

    def weight(self, ratio: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def _weights(self, log_ratio, batch):
        log_ratio = log_ratio.detach()
        if self.level == "sequence":
            log_ratio = sequence_log_ratio(log_ratio, batch.get("mask", None), mean=False).expand_as(log_ratio)
        return self.weight(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp())

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        weight, indicators = self._weights(log_ratio, batch)
        return -weight * advantage * batch.get("log_prob"), indicators

    def applied_weight(self, log_ratio, batch):
        return self._weights(log_ratio, batch)[0]


class TIS(_ImportanceWeighted):
    """Truncated importance sampling: ``w = min(r, C)``; past the cap the gradient is ``C * A * grad log pi``.

    Args:
        truncation: the cap ``C`` (verl's default ``rollout_is_threshold`` 2.0).
        level: ``"token"`` (each sample's ratio) or ``"sequence"`` (each completion's, LLM).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "tis", "group": "tis"}

    def __init__(self, truncation: float = 2.0, level: str = "token", **kwargs) -> None:
        super().__init__(level=level, **kwargs)
        _checks.positive(truncation=truncation)
        self.truncation = float(truncation)

    def weight(self, ratio):
        return ratio.clamp(max=self.truncation), {"capped": ratio > self.truncation}

    def extra_repr(self) -> str:
        return f"truncation={self.truncation}, level={self.level!r}"


class MIS(_ImportanceWeighted):
    """Masked importance sampling: ``w = r`` inside ``[low, high]``, else 0 (that sample gets no gradient).

    Args:
        low, high: the kept range of ``r`` (IcePop's 0.5 and 5.0, verl's ``"0.5_5.0"``).
        level: ``"token"`` or ``"sequence"`` (each completion's ratio, LLM).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "mis", "group": "mis"}
    fraction_metric = "mask_fraction"

    def __init__(self, low: float = 0.5, high: float = 5.0, level: str = "token", **kwargs) -> None:
        super().__init__(level=level, **kwargs)
        _checks.positive(low=low, high=high)
        if not low <= 1.0 <= high:
            raise ValueError(f"`low` ({low}) and `high` ({high}) must bracket 1 (on-policy data must keep its weight)")
        self.low, self.high = float(low), float(high)

    def weight(self, ratio):
        kept = ~((ratio < self.low) | (ratio > self.high))  # a NaN is kept: the loss then says so
        return torch.where(kept, ratio, torch.zeros_like(ratio)), {"masked": ~kept}

    def extra_repr(self) -> str:
        return f"low={self.low}, high={self.high}, level={self.level!r}"


class SequenceTIS(TIS):
    """:class:`TIS` with one weight per completion, ``min(prod_t r_t, C)`` (verl's ``rollout_is="sequence"``)."""

    names = {"group": "tis_seq"}

    def __init__(self, truncation: float = 2.0, **kwargs) -> None:
        super().__init__(truncation=truncation, level="sequence", **kwargs)


class SequenceMIS(MIS):
    """:class:`MIS` with one weight per completion: ``prod_t r_t`` kept inside ``[low, high]``."""

    names = {"group": "mis_seq"}

    def __init__(self, low: float = 0.5, high: float = 5.0, **kwargs) -> None:
        super().__init__(low=low, high=high, level="sequence", **kwargs)
