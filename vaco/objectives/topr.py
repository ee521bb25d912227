"""TOPR, tapered off-policy REINFORCE (Le Roux et al. 2025, arXiv:2503.14286): a sample with a
positive advantage keeps the REINFORCE gradient unweighted; one with a non-positive advantage is
weighted by its ratio truncated to [0, 1].

Source: Trinity-RFT, ``trinity/algorithm/policy_loss_fn/topr_policy_loss.py::TOPRPolicyLossFn``
(yanxi-chen/Trinity-RFT at 5b77c08, the file as agentscope-ai/Trinity-RFT ships it):
``alpha = clamp(r, 0, 1)`` where ``A <= advantage_threshold`` (default 0.0) else 1, ``loss =
-sg(alpha) * A * log pi`` per token (the paper's per-sequence ratio is Trinity's per-token one here).
"""

from __future__ import annotations

import torch

from vaco.objectives.base import Objective

__all__ = ["TOPR"]


class TOPR(Objective):
    """``loss = -sg(alpha) * A * log pi_theta`` with ``alpha = min(r, 1)`` where ``A <= threshold``, else 1.

    ``cap_fraction``: the samples whose weight was tapered (``A <= threshold`` and ``r > 1``: their
    gradient kept at weight 1 instead of ``r``); ``r < 1`` with ``A <= threshold`` is weighted by ``r``.

    Args:
        advantage_threshold: at or below it the ratio tapers the weight (Trinity-RFT's 0.0; >= 0).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "topr", "group": "topr"}
    fraction_metric = "cap_fraction"

    def __init__(self, advantage_threshold: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        if not (isinstance(advantage_threshold, (int, float)) and 0.0 <= advantage_threshold < float("inf")):
            raise ValueError(
                f"`advantage_threshold` must be a finite number >= 0 (below 0, negative advantages would go "
                f"untapered), got {advantage_threshold!r}"
            )
        self.advantage_threshold = float(advantage_threshold)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        ratio = ratio.detach()
        tapered = advantage <= self.advantage_threshold
        alpha = torch.where(tapered, ratio.clamp(0.0, 1.0), torch.ones_like(ratio))
        return -alpha * advantage * batch.get("log_prob"), {"capped": tapered & (ratio > 1.0)}

    def extra_repr(self) -> str:
        return f"advantage_threshold={self.advantage_threshold}"
