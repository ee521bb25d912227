"""Advantage estimators as pure functions over plain tensors.

Shape contract for every function here: inputs are ``[..., T]`` with **time last** and any
number of leading batch dimensions (``[num_envs, T]`` for rollouts). All inputs must have the
same shape: nothing is broadcast.

Flags follow TorchRL's convention:

* ``done[t]``: the trajectory ends after step ``t`` (terminated *or* truncated); nothing is
  propagated backwards across it.
* ``terminated[t]``: the episode really ended, so there is no bootstrap after step ``t``.
  ``terminated`` implies ``done``.
* ``next_values[t]`` is ``V(s_{t+1})``. At a truncation it must be the value of the *final*
  observation (not of the reset observation), so that the truncated episode is bootstrapped.
"""

from __future__ import annotations

import torch
from torchrl.objectives.value.functional import generalized_advantage_estimate

from vaco import _checks

__all__ = ["gae", "vtrace", "group_relative"]


def _flags(done: torch.Tensor, terminated: torch.Tensor, dtype: torch.dtype):
    """Validate the done/terminated flags and return them as bool tensors."""
    flags = []
    for name, flag in (("done", done), ("terminated", terminated)):
        if flag.dtype != torch.bool:
            if flag.is_floating_point() and not bool(((flag == 0) | (flag == 1)).all()):
                raise ValueError(f"`{name}` must be boolean (or 0/1), got other values")
            flag = flag != 0
        flags.append(flag)
    done, terminated = flags
    if bool((terminated & ~done).any()):
        raise ValueError("`terminated[t]` implies `done[t]`: found terminated steps that are not done")
    return done, terminated


def _check_common(rewards, values, next_values, done, terminated, log_rhos=None) -> None:
    shape = _checks.same_shape(
        rewards=rewards,
        values=values,
        next_values=next_values,
        done=done,
        terminated=terminated,
        log_rhos=log_rhos,
    )
    if len(shape) == 0 or shape[-1] == 0:
        raise ValueError(f"inputs must be [..., T] with T >= 1 (time last), got shape {tuple(shape)}")
    for name, t in (("rewards", rewards), ("values", values), ("next_values", next_values)):
        if not t.is_floating_point():
            raise TypeError(f"`{name}` must be a floating tensor, got {t.dtype}")
    _checks.all_finite(rewards=rewards, values=values, next_values=next_values, log_rhos=log_rhos)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    lmbda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    ``A_t = delta_t + gamma * lmbda * (1 - done_t) * A_{t+1}``,
    ``delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)``; targets ``A_t + V(s_t)``.

    Args:
        rewards, values, next_values: ``[..., T]`` floating tensors (time last).
        done, terminated: ``[..., T]`` boolean flags (see the module docstring).
        gamma: discount in [0, 1].
        lmbda: GAE lambda in [0, 1].

    Returns:
        ``(advantages, value_targets)``, both ``[..., T]``.

    Example:
        >>> r = torch.ones(2, 5); v = torch.zeros(2, 5); f = torch.zeros(2, 5, dtype=torch.bool)
        >>> adv, target = gae(r, v, v, f, f, gamma=0.99, lmbda=0.95)
    """
    _check_common(rewards, values, next_values, done, terminated)
    _checks.in_closed_interval(0.0, 1.0, gamma=gamma, lmbda=lmbda)
    done, terminated = _flags(done, terminated, rewards.dtype)
    # TorchRL's implementation is the same recursion; it wants a trailing feature dim.
    adv, target = generalized_advantage_estimate(
        gamma,
        lmbda,
        values.unsqueeze(-1),
        next_values.unsqueeze(-1),
        rewards.unsqueeze(-1),
        done.unsqueeze(-1),
        terminated.unsqueeze(-1),
        time_dim=-2,
    )
    return adv.squeeze(-1), target.squeeze(-1)


def vtrace(
    log_rhos: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    lmbda: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and the *realigned* (not rho-weighted) advantage.

    IMPALA (Espeholt et al. 2018, arXiv:1802.01561), with lambda as in its appendix; the
    advantage is VACO's advantage realignment (Honari et al. 2026, eq. "A_vtrace"):

    ``v_t = V(s_t) + rho_t * delta_t + gamma * (1 - done_t) * c_t * (v_{t+1} - V(s_{t+1}))``
    ``A_t = r_t + gamma * (1 - terminated_t) * v_{t+1} - V(s_t)``

    with ``rho_t = min(rho_bar, pi/beta)``, ``c_t = lmbda * min(c_bar, pi/beta)`` and
    ``delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)``. ``v_{t+1}`` is the
    V-trace target of the next state inside the trajectory, and ``next_values[t]`` where
    ``done[t]`` (or at the end of the rollout).

    Unlike TorchRL, scalable_agent, torchbeast, rlax or sample-factory, the advantage is **not**
    multiplied by ``rho_t``: in VACO the ratio pi/beta already stands in the surrogate. The
    IMPALA objective applies ``min(rho_bar, pi/beta)`` itself.

    Args:
        log_rhos: ``log pi(a_t|s_t) - log beta(a_t|s_t)``, ``[..., T]``.
        rewards, values, next_values: ``[..., T]`` (values are the critic's, V ~ V_beta).
        done, terminated: ``[..., T]`` boolean flags (see the module docstring).
        gamma: discount in [0, 1].
        lmbda: trace-cutting lambda in [0, 1] (1 is IMPALA's V-trace).
        rho_bar: truncation of the TD-error weight; fixes the target policy (> 0).
        c_bar: truncation of the trace coefficients; sets the contraction rate (> 0).

    Returns:
        ``(advantages, value_targets)``, both ``[..., T]``.

    Example:
        >>> T = 5; z = torch.zeros(3, T); f = torch.zeros(3, T, dtype=torch.bool)
        >>> adv, vs = vtrace(z, torch.ones(3, T), z, z, f, f, gamma=0.99, lmbda=0.95)
    """
    _check_common(rewards, values, next_values, done, terminated, log_rhos)
    _checks.in_closed_interval(0.0, 1.0, gamma=gamma, lmbda=lmbda)
    _checks.positive(rho_bar=rho_bar, c_bar=c_bar)
    done, terminated = _flags(done, terminated, rewards.dtype)
    dtype = rewards.dtype
    not_done = (~done).to(dtype)
    bootstrap = gamma * (~terminated).to(dtype)

    ratio = log_rhos.to(dtype).exp()
    rho = ratio.clamp(max=rho_bar)
    trace = gamma * not_done * lmbda * ratio.clamp(max=c_bar)
    deltas = rho * (rewards + bootstrap * next_values - values)

    # Backward scan: (v - V)_t = rho_t delta_t + gamma (1 - done_t) c_t (v - V)_{t+1}
    acc = torch.zeros_like(deltas[..., -1])
    vs_minus_v = [None] * deltas.shape[-1]
    for t in range(deltas.shape[-1] - 1, -1, -1):
        acc = deltas[..., t] + trace[..., t] * acc
        vs_minus_v[t] = acc
    vs = values + torch.stack(vs_minus_v, dim=-1)

    # v_{t+1} inside the trajectory; the critic's bootstrap where it ends or at the rollout edge
    vs_next = torch.cat([vs[..., 1:], next_values[..., -1:]], dim=-1)
    vs_next = torch.where(done, next_values, vs_next)
    advantages = rewards + bootstrap * vs_next - values
    return advantages, vs


def group_relative(rewards: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantage of GRPO (Shao et al. 2024, arXiv:2402.03300).

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` over the last dimension (the G completions
    of one prompt), with the sample standard deviation as in TRL's GRPO. A group whose
    completions all score the same gets advantage 0.

    Args:
        rewards: ``[..., G]`` rewards of the G completions of each prompt (G >= 2).
        eps: added to the standard deviation (> 0).

    Returns:
        ``[..., G]`` advantages, one per completion (shared by all its tokens).
    """
    if rewards.ndim == 0 or rewards.shape[-1] < 2:
        raise ValueError(f"`rewards` must be [..., G] with G >= 2 completions per group, got {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        raise TypeError(f"`rewards` must be a floating tensor, got {rewards.dtype}")
    _checks.all_finite(rewards=rewards)
    _checks.positive(eps=eps)
    mean = rewards.mean(dim=-1, keepdim=True)
    std = rewards.std(dim=-1, keepdim=True)
    return (rewards - mean) / (std + eps)
