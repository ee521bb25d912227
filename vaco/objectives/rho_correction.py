"""open-instruct's rho correction with its VACO-style TV mask, as its own arm on the LLM track.

Source: allenai/open-instruct, ``open_instruct/grpo_utils.py::compute_rho_correction`` (added in its
PR 1681, ``rho_mask_tv_divergence``) and ``compute_grpo_loss`` (``loss_fn="dapo"``), with the
defaults of its ``GRPOExperimentConfig``: ``rho_clamp_lower_bound`` 0 (off), ``rho_clamp_upper_bound``
2.0, ``rho_mask_lower_bound`` 0 (off), ``rho_mask_upper_bound`` 0 (off: set it to turn the mask on),
``rho_mask_sequence_level`` False, ``clip_lower`` 0.2, ``clip_higher`` 0.272.

In open-instruct, ``rho = pi_old / mu`` compares the trainer's old policy with the inference
engine's log-probs. In vaco's LLM track the two are the same weights (the generation pass is
re-scored by the training forward), so that ratio is 1 and the rule would never act. The lag vaco
measures is the learner's against the behaviour policy, ``r = pi_theta / beta``; this arm puts ``r``
(detached) where open-instruct puts ``rho``, and ``beta`` where it puts ``pi_old`` in the DAPO
ratio. Per token of a valid completion:

* ``d = clamp(log r, -10, 10)``, ``rho = exp(d)``; each completion's ``tv_i = mean_t |rho - 1|``
  (no 1/2: its bound is on the mean absolute deviation);
* a token is dropped when ``tv_i > upper`` (or ``tv_i < lower``, when ``lower > 0``) and its
  update would raise the divergence, ``sign(d) * A > 0``;
* ``w = clamp(rho_eff, clamp_low, clamp_high)`` on kept tokens (``rho_eff = rho``, or with
  ``sequence_level`` the completion's ``exp(mean_t d)``), 0 on dropped ones: the truncated
  importance weight, detached;
* ``loss = w * max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``, the mean over every valid token
  (a dropped token adds 0 and still counts in the denominator, as open-instruct's ``masked_mean``).

How it differs from :class:`~vaco.objectives.tv_filter.SequenceTVFilter` (``vaco_grpo_seq``), whose
mask is the same at ``upper = delta`` (``0.5 * mean|r - 1| > delta / 2``): the DAPO clip stays on
top of the mask; a kept token's loss is weighted by ``min(r, 2)`` (so its gradient is
``w * A * r * grad log pi``, not ``A * r * grad log pi``); a dropped token's loss is zero (its value
and its gradient), where the TV filter keeps the value and detaches it; and an optional lower bound
drops tokens of completions that moved too little.
"""

from __future__ import annotations

import torch

from vaco import _checks
from vaco.objectives.base import Objective

__all__ = ["OpenInstructRho"]

#: open-instruct's bound on the log-ratio before it is exponentiated
LOG_RATIO_BOUND = 10.0


def _row_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each row's mean over its valid entries (0 for a row with none), broadcast back to the row."""
    weight = valid.to(values.dtype)
    return ((values * weight).sum(-1, keepdim=True) / weight.sum(-1, keepdim=True).clamp(min=1.0)).expand_as(values)


class OpenInstructRho(Objective):
    """open-instruct's DAPO loss under its rho correction with the TV mask (module docstring).

    Args:
        upper: ``rho_mask_upper_bound``: drop a completion's divergence-raising tokens when its
            ``mean |r - 1|`` exceeds this (0: no upper mask). 0.05 here: vaco_grpo_seq's mask at
            its delta.
        lower: ``rho_mask_lower_bound``: also when it is below this (0: off, open-instruct's default).
        clamp_low, clamp_high: ``rho_clamp_lower_bound``, ``rho_clamp_upper_bound`` of the weight
            (0: that side unclamped; open-instruct's defaults 0 and 2).
        clip_epsilon, clip_epsilon_high: DAPO's ``clip_lower``, ``clip_higher`` (0.2, 0.272).
        sequence_level: ``rho_mask_sequence_level``: the weight is each completion's
            ``exp(mean_t log r)`` instead of each token's ratio.
        **kwargs: see :class:`~vaco.objectives.base.Objective`.
    """

    names = {"group": "oi_rho_tv"}
    fraction_metric = "filter_fraction"

    def __init__(
        self,
        upper: float = 0.05,
        lower: float = 0.0,
        clamp_low: float = 0.0,
        clamp_high: float = 2.0,
        clip_epsilon: float = 0.2,
        clip_epsilon_high: float = 0.272,
        sequence_level: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        for name, value in (("upper", upper), ("lower", lower), ("clamp_low", clamp_low), ("clamp_high", clamp_high)):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0):
                raise ValueError(f"`{name}` must be a number >= 0 (0 turns it off), got {value!r}")
        if upper and lower and not lower < upper:
            raise ValueError(f"`lower` ({lower}) must be below `upper` ({upper})")
        if clamp_high and clamp_low and not clamp_low < clamp_high:
            raise ValueError(f"`clamp_low` ({clamp_low}) must be below `clamp_high` ({clamp_high})")
        _checks.positive(clip_epsilon=clip_epsilon, clip_epsilon_high=clip_epsilon_high)
        if not isinstance(sequence_level, bool):
            raise ValueError(f"`sequence_level` must be true or false, got {sequence_level!r}")
        self.upper, self.lower = float(upper), float(lower)
        self.clamp_low, self.clamp_high = float(clamp_low), float(clamp_high)
        self.clip_epsilon, self.clip_epsilon_high = float(clip_epsilon), float(clip_epsilon_high)
        self.sequence_level = sequence_level

    def unsupported(self, learner: str) -> str | None:
        if learner == "mujoco":
            return "OpenInstructRho tests each completion of the LLM track's [completions, tokens] batches; MuJoCo has none"
        return super().unsupported(learner)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        mask = batch.get("mask", None)
        valid = torch.ones_like(log_ratio, dtype=torch.bool) if mask is None else mask.bool()
        d = torch.where(valid, log_ratio.detach().clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND), torch.zeros_like(log_ratio))
        rho = d.exp()
        tv = _row_mean((rho - 1.0).abs(), valid)
        out_of_bounds = torch.zeros_like(valid)
        if self.upper > 0:
            out_of_bounds = out_of_bounds | (tv > self.upper)
        if self.lower > 0:
            out_of_bounds = out_of_bounds | (tv < self.lower)
        dropped = out_of_bounds & valid & (torch.sign(d) * advantage.detach() > 0)
        weight = _row_mean(d, valid).exp() if self.sequence_level else rho
        if self.clamp_low > 0:
            weight = weight.clamp(min=self.clamp_low)
        if self.clamp_high > 0:
            weight = weight.clamp(max=self.clamp_high)
        weight = torch.where(valid & ~dropped, weight, torch.zeros_like(weight))
        unclipped = -advantage * ratio
        clipped = -advantage * ratio.clamp(1.0 - self.clip_epsilon, 1.0 + self.clip_epsilon_high)
        loss = torch.maximum(unclipped, clipped) * weight
        return loss, {"filtered": dropped, "clipped": (clipped > unclipped) & ~dropped}

    def extra_repr(self) -> str:
        return (
            f"upper={self.upper}, lower={self.lower}, clamp=[{self.clamp_low}, {self.clamp_high}], "
            f"clip=[{self.clip_epsilon}, {self.clip_epsilon_high}], sequence_level={self.sequence_level}"
        )
