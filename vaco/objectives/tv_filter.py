"""VACO's TV filter (Honari et al. 2026, Algorithm 1): constrain TV(beta || pi_theta) by dropping gradients."""

from __future__ import annotations

from typing import Literal

import torch

from vaco import _checks
from vaco.objectives.base import Objective
from vaco.objectives.objective_math import sequence_tv_filter_mask, tv_filter_mask

__all__ = ["SequenceTVFilter", "TVFilter"]


class TVFilter(Objective):
    """``loss = -r * (A - c_H * log pi_theta)``, with gradient-raising samples detached past ``delta/2``.

    Per minibatch, ``tv = 0.5 * mean|r - 1|`` with ``r = pi_theta / beta``. If ``tv > delta / 2``,
    every sample whose gradient would raise ``tv`` is detached (its loss value stays, its gradient
    is exactly zero): those whose coefficient of ``grad log pi_theta`` has the sign of
    ``pi_theta - beta``. The mean still divides by the full minibatch size, as in Algorithm 1.

    How ``c_H`` enters the sign test. The gradient of ``r * (A - c_H log pi)`` is
    ``r * grad log pi * (A - c_H (1 + log pi))``, so the exact coefficient is
    ``A - c_H (1 + log pi)``; that is the default (``sign_test="exact"``). The paper's
    Algorithm 1 writes ``A - c_H``; ``sign_test="paper"`` uses that literally. With
    ``c_H = 0`` (the paper's and CleanRL's default) both reduce to ``A * sign(r - 1) > 0``.

    Advantage normalisation (on by default, as in the paper's CleanRL base) happens before the
    sign test, so it changes which samples are filtered.

    ``level="sequence"`` (the LLM track; :class:`SequenceTVFilter` is that choice under its own
    name): the test is per completion instead of per minibatch, as in open-instruct's ``vaco``
    option (:func:`~vaco.objectives.objective_math.sequence_tv_filter_mask`).

    Args:
        delta: the TV threshold; the constraint is ``tv <= delta / 2`` (0.2 MuJoCo, 0.05 LLM).
        sign_test: ``"exact"`` or ``"paper"``, see above (only matters when ``entropy_coef > 0``).
        level: ``"minibatch"`` (the paper's test) or ``"sequence"`` (each ``[B, L]`` row its own).
        **kwargs: see :class:`~vaco.objectives.base.Objective`; ``entropy_coef`` is ``c_H``.
    """

    entropy_in_surrogate = True
    sweep_axes = {"delta": "delta"}
    fraction_metric = "filter_fraction"
    names = {"vtrace": "vaco", "gae": "vaco_no_realign", "group": "vaco_grpo"}
    variants = {"vaco_no_realign": "vaco"}  # the realignment ablation
    needs_minibatch_tv = True

    def __init__(
        self,
        delta: float = 0.2,
        sign_test: Literal["exact", "paper"] = "exact",
        level: Literal["minibatch", "sequence"] = "minibatch",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        _checks.positive(delta=delta)
        if sign_test not in ("exact", "paper"):
            raise ValueError(f"`sign_test` must be 'exact' or 'paper', got {sign_test!r}")
        if level not in ("minibatch", "sequence"):
            raise ValueError(f"`level` must be 'minibatch' or 'sequence', got {level!r}")
        self.delta, self.sign_test, self.level = float(delta), sign_test, level
        # a completion's test needs only its own tokens: a micro-batched minibatch needs no minibatch-wide TV
        self.needs_minibatch_tv = level == "minibatch"

    def unsupported(self, learner: str) -> str | None:
        if learner == "mujoco" and self.level == "sequence":
            return (
                f"{type(self).__name__} tests each completion of the LLM track's [completions, tokens] batches "
                "(level 'sequence'); a MuJoCo minibatch has no sequences: use vaco.objectives.TVFilter with its "
                "default level"
            )
        return super().unsupported(learner)

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        log_prob = batch.get("log_prob")
        c_h = self.entropy_coef
        coefficient = advantage
        if c_h > 0:
            coefficient = advantage - c_h * ((1 + log_prob.detach()) if self.sign_test == "exact" else 1.0)
        # `minibatch_tv`: given by a trainer that micro-batches one minibatch (the test is per
        # minibatch); non-finite inputs are caught on the loss by the base class
        if self.level == "sequence":
            keep, _ = sequence_tv_filter_mask(log_ratio, coefficient, delta=self.delta, mask=batch.get("mask", None))
        else:
            keep, _ = tv_filter_mask(
                log_ratio,
                coefficient,
                delta=self.delta,
                mask=batch.get("mask", None),
                tv=batch.get("minibatch_tv", None),
                check_finite=False,
            )
        ratio = torch.where(keep, ratio, ratio.detach())
        log_prob = torch.where(keep, log_prob, log_prob.detach())
        return -ratio * (advantage - c_h * log_prob), {"filtered": ~keep}

    def extra_repr(self) -> str:
        return f"delta={self.delta}, sign_test={self.sign_test!r}, level={self.level!r}"


class SequenceTVFilter(TVFilter):
    """The TV filter with one test per completion (``level="sequence"``): the mask of
    allenai/open-instruct's ``rho_mask_tv_divergence``, a co-author's LLM version of the paper's
    filter, on the paper's loss (open-instruct's whole rule, with its DAPO clip and truncated
    weights, is :class:`~vaco.objectives.rho_correction.OpenInstructRho`).

    It differs from the paper's in where the test is made: each completion's own mean
    ``0.5 * |r - 1|`` over its tokens against ``delta / 2``, so a drifting completion is filtered
    even when the minibatch as a whole is inside the threshold, and a well-behaved one is not
    filtered because others drifted. Only the tokens whose gradient would raise that divergence
    lose it, as in the paper's. (open-instruct measures the trainer's old policy against the
    sampler's; in vaco's LLM track those are the same weights, re-scored by the training
    forward, so the divergence tested is the learner's against the behaviour policy, as the
    paper's is: see docs/llm.md.)"""

    names = {"group": "vaco_grpo_seq"}
    variants = {"vaco_grpo_seq": "vaco_grpo"}

    def __init__(self, delta: float = 0.05, sign_test: Literal["exact", "paper"] = "exact", **kwargs) -> None:
        super().__init__(delta=delta, sign_test=sign_test, level="sequence", **kwargs)
