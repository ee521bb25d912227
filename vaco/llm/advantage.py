"""GRPO's group-relative advantage as a thin module over :func:`vaco.advantages.advantage_math.group_relative`."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import nn

from vaco import _checks
from vaco.advantages.advantage_math import group_relative

__all__ = ["GroupRelative"]


class GroupRelative(nn.Module):
    """``A_i = (r_i - mean_g r) / (std_g r + eps)`` over the G completions of each prompt.

    Reads ``"reward"`` ``[P, G]`` (batch dims of the TensorDict), writes ``"advantage"`` ``[P, G]``.
    The RLVR module then gives every token of completion i the advantage ``A_i``
    (:meth:`per_token`).

    Args:
        eps: added to the group's standard deviation (a group that all scored alike gets 0).
    """

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        _checks.positive(eps=eps)
        self.eps = float(eps)

    @torch.no_grad()
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td.set("advantage", group_relative(td.get("reward"), eps=self.eps))
        return td

    @staticmethod
    def per_token(advantage: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[B]`` completion advantages -> ``[B, T]`` token advantages (0 on padding)."""
        if advantage.ndim != 1 or mask.ndim != 2 or mask.shape[0] != advantage.shape[0]:
            raise ValueError(
                f"`advantage` must be [B] and `mask` [B, T], got {tuple(advantage.shape)} and {tuple(mask.shape)}"
            )
        return torch.where(mask, advantage[:, None], torch.zeros((), dtype=advantage.dtype, device=advantage.device))

    def extra_repr(self) -> str:
        return f"eps={self.eps}"
