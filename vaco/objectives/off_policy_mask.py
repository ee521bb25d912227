"""DeepSeek-V3.2's off-policy sequence masking (DeepSeek-AI 2025, arXiv:2512.02556) on PPO's clipped
surrogate: a completion with a negative advantage whose mean ``log(beta / pi_theta)`` over its tokens
exceeds ``delta`` gets no gradient.

Source: huggingface/trl, ``trl/trainer/grpo_trainer.py::GRPOTrainer.get_off_policy_mask`` (commit
f2cd577): ``kl = log pi_sampling - log pi_theta`` (detached), its mean over a completion's valid
tokens; keep where ``A >= 0`` or that mean ``<= off_policy_mask_threshold``; the mask multiplies the
per-token clipped loss. TRL leaves the threshold unset; its docs suggest 0.5 as a start.
"""

from __future__ import annotations

import torch

from vaco.objectives.clip import PPOClip
from vaco.objectives.objective_math import sequence_log_ratio

__all__ = ["OffPolicySequenceMask"]


class OffPolicySequenceMask(PPOClip):
    """:class:`PPOClip` times ``M``: ``M = 0`` where ``A < 0`` and the completion's mean
    ``log(beta / pi_theta)`` is above ``delta`` (``mask_fraction``).

    On ``[B, L]`` token batches the mean is over each row's valid tokens (TRL's); on a MuJoCo
    minibatch each sample is its own one-step sequence, so the test is per sample.

    Args:
        delta: the threshold in nats per token (``off_policy_mask_threshold``; TRL's docs: 0.5).
        clip_epsilon, clip_epsilon_high: PPO's clip (see :class:`PPOClip`).
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"gae": "ppo_opsm", "group": "grpo_opsm"}
    fraction_metric = "mask_fraction"

    def __init__(self, delta: float = 0.5, clip_epsilon: float = 0.2, clip_epsilon_high=None, **kwargs) -> None:
        super().__init__(clip_epsilon=clip_epsilon, clip_epsilon_high=clip_epsilon_high, **kwargs)
        if not delta >= 0:
            raise ValueError(f"`delta` must be >= 0 (nats per token), got {delta!r}")
        self.delta = float(delta)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        loss, indicators = super().surrogate(ratio=ratio, log_ratio=log_ratio, advantage=advantage, batch=batch)
        behind = -log_ratio.detach()  # log(beta / pi_theta)
        if behind.dim() == 2:  # [B, L]: each completion's mean over its valid tokens
            behind = -sequence_log_ratio(log_ratio.detach(), batch.get("mask", None), mean=True).expand_as(behind)
        masked = (advantage < 0) & (behind > self.delta)
        return torch.where(masked, torch.zeros_like(loss), loss), {**indicators, "masked": masked}

    def extra_repr(self) -> str:
        return f"delta={self.delta}, {super().extra_repr()}"
