"""Learner-side corrections: a factor on each optimiser step's size, computed from the data the step
trains on. Any objective combines with any of them (``model.step_size`` on either learner).

The factor ``f`` scales the optimiser's whole step: the weights before the step ``w`` and after it
``w'`` become ``w + f (w' - w)`` (:func:`scale_step`). For Adam and AdamW, whose step is linear in the
learning rate (the moments do not depend on it), that is the step at learning rate ``f * lr``, as the
sources set it, with the same moments; it is one place for a run, a population (a factor per member)
and the LLM track, so a member's numbers stay its solo run's.

* :class:`ESSStepSize`, VCPO's (mit-han-lab/vcpo ``verl/workers/actor/megatron_actor.py::
  _optimizer_step_with_buffer`` with ``recipe/fully_async_policy/staleness_utils.py::compute_ess_info``,
  at c7f030f): ``f = min(1, ess_ratio / base_ess_ratio)`` under ``sqrt`` (its default) or ``linear``,
  ``ess_ratio = (sum w)^2 / (sum w^2 + 1e-8) / n`` over the minibatch's importance weights ``w =
  pi_theta / beta`` (VCPO's are per completion, the sequence's ratio; a MuJoCo sample is its own).
* :class:`StalenessStepSize`: ``f = min(1, reference_lag / S)`` with ``S`` the data's lag, a step size
  inversely proportional to the staleness, as the two-constraint rule of Song et al. 2026
  (arXiv:2607.01083, ``eta << R / (S G)``) makes the largest stable one. ``S`` is the batch's largest
  policy age in policy versions on MuJoCo (what ``K`` sets), the optimiser steps since generation on the
  LLM track (minibatch ``k`` of a generation batch is ``k`` steps behind); ``S = 0`` (on-policy) keeps
  the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from vaco import _checks

__all__ = ["ESSStepSize", "StalenessStepSize", "StepSize", "log_importance_weights", "scale_step", "scaled_step"]

#: VCPO's guard in the ESS's denominator (``compute_ess_info``'s ``eps``)
ESS_EPS = 1e-8


class StepSize(nn.Module):
    """A factor on each optimiser step. Subclasses set :attr:`reads_weights` and implement :meth:`factor`."""

    #: the factor reads the minibatch's (log) importance weights (else only the data's lag)
    reads_weights: bool = False
    #: the weights' level on the LLM track: ``"sequence"`` (a completion's ratio) or ``"token"``
    level: str = "sequence"
    #: what a run's default algorithm name adds after the objective's (``ppo_clip_ess_step``)
    suffix: str = ""

    def factor(self, log_weights: torch.Tensor | None, lag: torch.Tensor) -> torch.Tensor:
        """The step's factor: ``log_weights`` ``[..., n]`` (the logs of the minibatch's importance weights
        along the last dim; None when :attr:`reads_weights` is False), ``lag`` ``[...]`` the data's lag.
        Returns ``[...]``."""
        raise NotImplementedError


class ESSStepSize(StepSize):
    """VCPO's step size: ``f = min(1, ess_ratio / base_ess_ratio) ** (1/2 or 1)``.

    Args:
        scaling_rule: ``"sqrt"`` (VCPO's default) or ``"linear"``.
        base_ess_ratio: the ESS ratio at and above which the step is kept (VCPO's 1.0).
        level: on the LLM track, the weights' level: ``"sequence"`` (VCPO's, a completion's
            ``prod_t r_t``) or ``"token"``; a MuJoCo sample is its own.
    """

    reads_weights = True
    suffix = "ess_step"

    def __init__(self, scaling_rule: str = "sqrt", base_ess_ratio: float = 1.0, level: str = "sequence") -> None:
        super().__init__()
        if scaling_rule not in ("sqrt", "linear"):
            raise ValueError(f"`scaling_rule` must be 'sqrt' or 'linear', got {scaling_rule!r}")
        if level not in ("sequence", "token"):
            raise ValueError(f"`level` must be 'sequence' or 'token', got {level!r}")
        _checks.positive(base_ess_ratio=base_ess_ratio)
        self.scaling_rule, self.base_ess_ratio, self.level = scaling_rule, float(base_ess_ratio), level

    def factor(self, log_weights, lag):
        # in float64, as VCPO's Python floats; where a weight's square overflows even there (a log-ratio
        # above ~354 nats), the same ratio from the weights scaled by their largest (its eps dropped)
        log_weights = log_weights.double()
        n = log_weights.shape[-1]
        weights = log_weights.exp()
        direct = weights.sum(-1) ** 2 / ((weights**2).sum(-1) + ESS_EPS) / n
        scaled = (log_weights - log_weights.amax(-1, keepdim=True)).exp()
        guarded = scaled.sum(-1) ** 2 / (scaled**2).sum(-1) / n
        ess_ratio = torch.where(torch.isfinite(direct), direct, guarded)
        scale = (ess_ratio / max(self.base_ess_ratio, 1e-8)).clamp(max=1.0)
        return scale.sqrt() if self.scaling_rule == "sqrt" else scale

    def extra_repr(self) -> str:
        return f"scaling_rule={self.scaling_rule!r}, base_ess_ratio={self.base_ess_ratio}, level={self.level!r}"


class StalenessStepSize(StepSize):
    """``f = min(1, reference_lag / S)``: the step inversely proportional to the data's lag ``S``.

    Args:
        reference_lag: the lag at and below which the step is kept (1: every stale step is divided
            by its lag).
    """

    suffix = "lag_step"

    def __init__(self, reference_lag: float = 1.0) -> None:
        super().__init__()
        _checks.positive(reference_lag=reference_lag)
        self.reference_lag = float(reference_lag)

    def factor(self, log_weights, lag):
        lag = torch.as_tensor(lag, dtype=torch.float32)
        return torch.where(lag > self.reference_lag, self.reference_lag / lag.clamp(min=1e-12), torch.ones_like(lag))

    def extra_repr(self) -> str:
        return f"reference_lag={self.reference_lag}"


def log_importance_weights(log_ratio: torch.Tensor, mask: torch.Tensor | None, level: str) -> torch.Tensor:
    """A minibatch's log importance weights, 1-D: each ``[B]`` sample's ``log r``; on ``[B, L]`` token
    rows (``mask`` their valid tokens) each completion's ``sum_t log r_t`` (``level="sequence"``, the
    log of ``prod_t r_t``) or every valid token's ``log r`` (``"token"``). Detached."""
    log_ratio = log_ratio.detach()
    if log_ratio.dim() == 1 or mask is None:
        return log_ratio.flatten()
    if level == "sequence":
        return (log_ratio * mask.to(log_ratio.dtype)).sum(-1)
    return log_ratio[mask.bool()]


@torch.no_grad()
def scale_step(tensors: Sequence[torch.Tensor], before: Sequence[torch.Tensor], factor: torch.Tensor) -> None:
    """``w <- w_before + factor * (w - w_before)`` in place, for each tensor and its copy from before the
    step. ``factor`` is ``[]``, or ``[S]`` for a population's stacked ``[S, ...]`` tensors (row ``m``
    scaled by ``factor[m]``); a list of a population's rows is passed row by row by the caller. Where
    the factor is 1 the step is the optimiser's, bit for bit."""
    for now, old in zip(tensors, before):
        f = factor.to(now.dtype)
        if f.dim():
            f = f.view(-1, *[1] * (now.dim() - 1))
        # a factor of 1 keeps the optimiser's own numbers (w + (w' - w) can round away from w')
        now.copy_(torch.where(f == 1, now, old + f * (now - old)))


def scaled_step(step: Callable[[], object], optimizer: torch.optim.Optimizer, factor: torch.Tensor | None) -> None:
    """``step()`` (the optimiser's, or Lightning's wrapper of it), then every parameter of ``optimizer``
    moved by :func:`scale_step` with ``factor`` (``None``: the step alone)."""
    if factor is None:
        step()
        return
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    before = [p.detach().clone() for p in tensors]
    step()
    scale_step(tensors, before, factor)
