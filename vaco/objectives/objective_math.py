"""Pure functions used by the objectives: masked means, the TV filter mask, the Gaussian KL.

Shapes: any ``[...]`` (``[B]`` for MuJoCo minibatches, ``[B, L]`` for LLM tokens); all inputs
of one call have the same shape. ``mask`` (optional, bool) marks valid entries (padding tokens
are False); means are taken over valid entries only ("token-mean" aggregation).
"""

from __future__ import annotations

import torch

from vaco import _checks

__all__ = [
    "effective_sample_size",
    "gaussian_kl",
    "masked_mean",
    "masked_quantile",
    "normalize",
    "sequence_log_ratio",
    "sequence_tv_filter_mask",
    "total_variation",
    "tv_filter_mask",
]


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` is True (all entries if ``mask`` is None)."""
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def normalize(x: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the valid entries (CleanRL's per-minibatch advantage norm)."""
    mean = masked_mean(x, mask)
    if mask is None:
        std = x.std() if x.numel() > 1 else torch.zeros((), dtype=x.dtype, device=x.device)
    else:
        n = mask.sum().clamp(min=2)
        std = (masked_mean((x - mean) ** 2, mask) * n / (n - 1)).sqrt()
    return (x - mean) / (std + eps)


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The normalised effective sample size of importance weights: ``(sum w)^2 / (N sum w^2)``.

    1 when every weight is equal (on-policy data), ``1/N`` when one sample carries all the weight
    (Kong 1992; the ``rollout_is_eff_sample_size`` verl logs, there as ``1 / mean((w / mean w)^2)``,
    the same number). Over the valid entries where ``mask`` is given.
    """
    if mask is not None:
        weights = weights * mask.to(weights.dtype)
        n = mask.sum().to(weights.dtype).clamp(min=1.0)
    else:
        n = weights.numel()
    return weights.sum() ** 2 / (n * (weights**2).sum()).clamp(min=torch.finfo(weights.dtype).tiny)


def masked_quantile(x: torch.Tensor, q: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The ``q``-quantile of ``x`` over its valid entries, interpolated linearly between order
    statistics as ``torch.quantile`` does by default; written with a sort and a gather so that it
    runs under ``torch.func.vmap`` (a population) and with a data-dependent count of valid entries."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"`q` must be in [0, 1], got {q!r}")
    flat = x.flatten()
    if mask is None:
        ordered = flat.sort().values
        position = torch.tensor(q * (flat.numel() - 1), dtype=x.dtype, device=x.device)
    else:
        valid = mask.flatten().bool()
        ordered = torch.where(valid, flat, torch.full_like(flat, float("inf"))).sort().values
        position = q * (valid.sum().to(x.dtype) - 1).clamp(min=0.0)
    low = position.floor()
    below = ordered.gather(0, low.long().reshape(1)).squeeze(0)
    above = ordered.gather(0, position.ceil().long().reshape(1)).squeeze(0)
    return below + (position - low) * (above - below)


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor | None = None, *, mean: bool) -> torch.Tensor:
    """Each ``[B, L]`` row's log importance ratio, ``[B, 1]``: the sum of its valid tokens' log
    ratios (the sequence's ratio ``prod_t r_t``) or, with ``mean``, their mean (GSPO's geometric mean)."""
    if log_ratio.dim() != 2:
        raise ValueError(f"a sequence-level ratio needs [sequences, tokens] inputs, got {tuple(log_ratio.shape)}")
    valid = torch.ones_like(log_ratio) if mask is None else mask.to(log_ratio.dtype)
    total = (log_ratio * valid).sum(1, keepdim=True)
    return total / valid.sum(1, keepdim=True).clamp(min=1.0) if mean else total


def total_variation(log_ratio: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Sample estimate of the expected TV divergence: ``0.5 * mean|pi/beta - 1|`` (paper eq. dtv)."""
    return 0.5 * masked_mean((log_ratio.exp() - 1.0).abs(), mask)


def tv_filter_mask(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    delta: float,
    mask: torch.Tensor | None = None,
    tv: torch.Tensor | None = None,
    check_finite: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """VACO's TV filter: which samples keep their gradient.

    ``tv = 0.5 * mean|r - 1|`` with ``r = pi_theta / beta``. If ``tv > delta / 2``, the samples
    whose gradient would raise ``tv`` are filtered: those whose coefficient of
    ``grad log pi_theta`` has the same sign as ``pi_theta - beta``, i.e. ``A * sign(r - 1) > 0``.
    Samples with ``r == 1`` exactly are never filtered (their TV gradient is zero).

    With an entropy bonus the coefficient is not ``A``: pass the coefficient itself as
    ``advantages`` (see :class:`vaco.objectives.TVFilter` for how ``c_H`` enters it).

    Args:
        log_ratio: ``log pi_theta(a|s) - log beta(a|s)``.
        advantages: the (possibly normalised) advantage, or the full gradient coefficient.
        delta: the TV threshold (the constraint is ``tv <= delta / 2``), > 0.
        mask: optional validity mask; filtered-out padding stays ``keep=True`` (it has no gradient).
        tv: the TV to compare against ``delta / 2``; default: measured on these samples. When
            these samples are a micro-batch of a minibatch (gradient accumulation), pass the
            whole minibatch's TV: the paper's test is per minibatch (one optimiser step).
        check_finite: raise on NaN/inf inputs, naming them (a host sync; the trainer checks the
            loss on the device instead).

    Returns:
        ``(keep, tv)``: ``keep`` is a bool tensor like ``log_ratio`` (True = gradient kept) and
        ``tv`` the scalar TV estimate that was compared against ``delta / 2``.
    """
    _checks.same_shape(log_ratio=log_ratio, advantages=advantages, mask=mask)
    _checks.positive(delta=delta)
    if check_finite:
        _checks.all_finite(log_ratio=log_ratio, advantages=advantages)
    log_ratio, advantages = log_ratio.detach(), advantages.detach()
    tv = total_variation(log_ratio, mask) if tv is None else tv.detach()
    raises_tv = advantages * torch.sign(log_ratio) > 0  # sign(r - 1) == sign(log r)
    keep = ~(raises_tv & (tv > delta / 2))
    if mask is not None:
        keep = keep | ~mask.bool()
    return keep, tv


def sequence_tv_filter_mask(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    delta: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequence-level TV filter: the mask of open-instruct's ``rho_mask_tv_divergence`` (its PR 1681):
    each sequence (a row of ``[B, L]`` tokens) has its own divergence, ``tv_i = 0.5 * mean_t |r_it - 1|``
    over its valid tokens; in a row with ``tv_i > delta / 2`` the tokens whose gradient would raise
    it (``A * sign(r - 1) > 0``) lose their gradient. Rows under the threshold keep every token,
    whatever the others do; there is no minibatch-wide test.

    Returns ``(keep, tv)``: ``keep`` like ``log_ratio``; ``tv`` the ``[B]`` per-sequence divergences.
    """
    _checks.same_shape(log_ratio=log_ratio, advantages=advantages, mask=mask)
    _checks.positive(delta=delta)
    if log_ratio.dim() != 2:
        raise ValueError(f"the sequence-level TV filter needs [sequences, tokens] inputs, got {tuple(log_ratio.shape)}")
    log_ratio, advantages = log_ratio.detach(), advantages.detach()
    deviation = (log_ratio.exp() - 1.0).abs()
    if mask is None:
        tv = 0.5 * deviation.mean(1)
    else:
        valid = mask.to(deviation.dtype)
        tv = 0.5 * (deviation * valid).sum(1) / valid.sum(1).clamp(min=1.0)
    raises_tv = advantages * torch.sign(log_ratio) > 0
    keep = ~(raises_tv & (tv > delta / 2).unsqueeze(1))
    if mask is not None:
        keep = keep | ~mask.bool()
    return keep, tv


def gaussian_kl(loc_p: torch.Tensor, scale_p: torch.Tensor, loc_q: torch.Tensor, scale_q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` between diagonal Gaussians, summed over the last (action) dimension.

    ``KL = sum_i log(s_q/s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2``.
    """
    _checks.same_shape(loc_p=loc_p, scale_p=scale_p, loc_q=loc_q, scale_q=scale_q)
    var_ratio = (scale_p / scale_q) ** 2
    mean_term = ((loc_p - loc_q) / scale_q) ** 2
    return (0.5 * (var_ratio + mean_term - 1.0) - 0.5 * var_ratio.log()).sum(-1)
