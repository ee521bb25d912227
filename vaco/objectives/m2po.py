"""M2PO (Zheng et al. 2025, arXiv:2510.01161): drop the samples whose squared log-ratio is largest
until the second moment of the rest is under a threshold, and apply the unclipped importance-weighted
advantage to the others.

Source: inclusionAI/AReaL, ``areal/trainer/ppo/actor.py::_apply_m2po_masking`` and
``_get_m2po_loss_mask`` (commit 4aef98d): ``m2 = (log beta - log pi_prox)^2`` over the valid tokens,
sorted in descending order; the first ``k`` are masked, ``k`` the first index whose suffix mean
(the mean of ``m2`` from there on) is below ``m2_threshold``, or all but the smallest when none is;
the masked tokens leave the loss's numerator, not its denominator. The objective on the kept samples
is the one AReaL's M2PO page states, ``M * pi_theta / pi_old * A``; ``m2_threshold`` 0.04 is AReaL's
``examples/math/gsm8k_m2po.yaml`` and the paper's.
"""

from __future__ import annotations

import torch

from vaco import _checks
from vaco.objectives.base import Objective

__all__ = ["M2PO", "second_moment_mask"]


def second_moment_mask(log_ratio: torch.Tensor, threshold: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Which samples M2PO keeps (bool, the shape of ``log_ratio``): over the valid samples, the
    largest ``log_ratio^2`` dropped until the mean of the rest is below ``threshold`` (all but the
    smallest when no suffix is). Invalid samples (``mask`` False) are not kept. Shape-static (no
    host sync), so it runs under ``vmap`` in a population."""
    m2 = log_ratio.detach().flatten() ** 2
    valid = torch.ones_like(m2, dtype=torch.bool) if mask is None else mask.flatten().bool()
    n = m2.numel()
    # the valid values in descending order, the invalid ones last
    order = torch.argsort(torch.where(valid, m2, torch.full_like(m2, -1.0)), descending=True, stable=True)
    ordered, ordered_valid = m2[order], valid[order]
    kept_values = torch.where(ordered_valid, ordered, torch.zeros_like(ordered))
    suffix_sum = kept_values.flip(0).cumsum(0).flip(0)
    suffix_count = ordered_valid.to(m2.dtype).flip(0).cumsum(0).flip(0)
    position = torch.arange(n, device=m2.device)
    valid_count = valid.sum()
    below = (suffix_sum / suffix_count.clamp(min=1.0) < threshold) & ordered_valid  # the suffix mean
    first = torch.where(below, position, torch.full_like(position, n)).min()
    dropped = torch.where(first == n, (valid_count - 1).clamp(min=0), first)
    keep_ordered = (position >= dropped) & ordered_valid
    keep = torch.zeros_like(valid).scatter(0, order, keep_ordered)
    return keep.view_as(log_ratio)


class M2PO(Objective):
    """``loss = -M * r * A``, ``M`` from :func:`second_moment_mask` on ``log r`` over the minibatch.

    ``r = pi_theta / beta`` against the behaviour policy: the learner's ratio at the minibatch's
    step, where AReaL takes ``log beta - log pi_prox`` with the proximal policy recomputed once an
    iteration; the two are the same at an iteration's first step (AReaL's example runs one step an
    iteration). A dropped sample keeps its place in the mean's denominator (``mask_fraction``).

    Args:
        m2_threshold: ``tau_M2``, the kept second moment's bound (AReaL's and the paper's 0.04).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "m2po", "group": "m2po"}
    fraction_metric = "mask_fraction"

    def __init__(self, m2_threshold: float = 0.04, **kwargs) -> None:
        super().__init__(**kwargs)
        _checks.positive(m2_threshold=m2_threshold)
        self.m2_threshold = float(m2_threshold)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        mask = batch.get("mask", None)
        keep = second_moment_mask(log_ratio, self.m2_threshold, mask)
        dropped = ~keep if mask is None else ~keep & mask.bool()
        return -torch.where(keep, ratio * advantage, torch.zeros_like(ratio)), {"masked": dropped}

    def extra_repr(self) -> str:
        return f"m2_threshold={self.m2_threshold}"
