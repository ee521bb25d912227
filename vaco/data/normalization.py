"""Observation normalisation and reward scaling, as CleanRL does them (gymnasium's wrappers).

Hand-written rather than gymnasium's ``NormalizeObservation`` / ``NormalizeReward`` wrappers or
TorchRL's ``VecNorm`` because

* a stale policy must act with the normaliser it was trained with, so observation statistics
  belong to the *policy version* (stored in the policy buffer), not to the environment;
* the statistics must be plain tensors that checkpoints, DDP all-gathers and worker processes
  can move around (TorchRL's ``VecNorm`` uses an exponential decay, not CleanRL's exact counts).

The arithmetic is gymnasium's ``RunningMeanStd`` (Chan et al. parallel update) and is tested
against gymnasium's wrappers.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["RunningMeanStd", "normalize_observation", "RewardScaler", "merge_moments"]

OBS_CLIP = 10.0
EPS = 1e-8


def merge_moments(mean_a, var_a, count_a, mean_b, var_b, count_b):
    """Combine two (mean, var, count) summaries into one (population variance)."""
    delta = mean_b - mean_a
    total = count_a + count_b
    mean = mean_a + delta * count_b / total
    m2 = var_a * count_a + var_b * count_b + delta**2 * count_a * count_b / total
    return mean, m2 / total, total


def batch_moments(x: torch.Tensor, chunk_rows: int = 65_536) -> tuple[torch.Tensor, torch.Tensor, float]:
    """float64 mean and population variance over the first dim of ``x`` ``[rows, ...]``.

    Up to ``chunk_rows`` rows this is ``x.double().mean(0), x.double().var(0)``; larger inputs are
    summarised chunk by chunk and merged (Chan et al.), so a paper-scale batch (500 x 1,000
    Humanoid observations) never has a float64 copy of the whole batch in memory (~2.8 GB of
    temporaries at that size).
    """
    rows = x.shape[0]
    mean = var = None
    count = 0.0
    for start in range(0, rows, chunk_rows):
        part = x[start : start + chunk_rows].to(torch.float64)
        m, v, c = part.mean(0), part.var(0, unbiased=False), float(part.shape[0])
        mean, var, count = (m, v, c) if mean is None else merge_moments(mean, var, count, m, v, c)
    return mean, var, count


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of ``[..., *shape]`` samples (float64 buffers).

    Starts at mean 0, variance 1, count 1e-4, like gymnasium's ``RunningMeanStd``.
    """

    def __init__(self, shape: tuple[int, ...] | int = ()) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        self.update_from_moments(*batch_moments(x.reshape(-1, *self.mean.shape)))

    @torch.no_grad()
    def update_from_moments(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
        m, v, c = merge_moments(self.mean, self.var, self.count, mean.to(self.mean), var.to(self.var), count)
        self.mean.copy_(m)
        self.var.copy_(v)
        self.count.fill_(float(c))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return normalize_observation(x, self.mean, self.var)


def normalizer(mean: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The running statistics as the float32 ``(shift, inv_scale)`` that training and acting use,
    fixed for an iteration (the learner) or a rollout (the actors): ``shift = mean``,
    ``inv_scale = 1 / sqrt(var + 1e-8)``."""
    return mean.float(), (var + EPS).rsqrt().float()


def apply_normalizer(obs: torch.Tensor, shift: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """``clip((obs - shift) * inv_scale, -10, 10)``: what the learner's and the actors' networks see.

    The learner (``VacoModule``) and the policy-version buffer's actors both normalise through
    :func:`normalizer` and this function, so an actor and the learner see the same numbers.
    """
    return ((obs - shift) * inv_scale).clamp(-OBS_CLIP, OBS_CLIP)


def normalize_observation(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """``clip((x - mean) / sqrt(var + 1e-8), -10, 10)`` in the dtype of ``x``: evaluation's form
    (``vaco evaluate`` and every backend's evaluation, through ``learner_policy``). It equals
    :func:`apply_normalizer` up to float32 rounding (a division where that multiplies by a
    reciprocal square root); it is kept as is so that evaluations, and the returns committed under
    docs/data, stay bit for bit what they were."""
    return ((x - mean.to(x.dtype)) / (var.to(x.dtype) + EPS).sqrt()).clamp(-OBS_CLIP, OBS_CLIP)


class RewardScaler:
    """CleanRL's reward scaling for a vector of envs: divide by the std of the discounted return.

    ``G_t = gamma * (1 - terminated_t) * G_{t-1} + r_t``, restarted at 0 after every episode end;
    the statistics of ``G`` are updated every step with all envs, and the reward is divided by
    ``sqrt(var(G) + 1e-8)`` and clipped to [-10, 10]. This is gymnasium 1.x's vector
    ``NormalizeReward`` in SAME_STEP autoreset mode followed by CleanRL's clip.
    State is plain numpy so it checkpoints and crosses processes.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0) -> None:
        self.gamma, self.clip = gamma, clip
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, reward, terminated, done):
        """Scaled rewards; numpy arrays in and out, or CPU tensors (the rollout loop's) in and out."""
        if isinstance(reward, torch.Tensor):
            return torch.from_numpy(self(reward.numpy(), terminated.numpy(), done.numpy()))
        self.returns = self.returns * self.gamma * (1.0 - terminated) + reward
        n = len(self.returns)
        batch_mean = float(self.returns.sum()) / n
        batch_var = float(np.square(self.returns - batch_mean).sum()) / n
        self.mean, self.var, self.count = merge_moments(self.mean, self.var, self.count, batch_mean, batch_var, n)
        self.returns[done] = 0.0
        return np.clip(reward / np.sqrt(self.var + EPS), -self.clip, self.clip)

    def state_dict(self) -> dict:
        return {
            "returns": torch.from_numpy(self.returns.copy()),
            "mean": float(self.mean),
            "var": float(self.var),
            "count": float(self.count),
        }

    def load_state_dict(self, state: dict) -> None:
        self.returns = np.asarray(state["returns"], dtype=np.float64).copy()
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])


class DeviceRewardScaler:
    """:class:`RewardScaler` on torch tensors, for collectors whose envs live on a device: the
    same arithmetic in float64 (``merge_moments`` works on tensors as on floats), no host sync.
    Its ``state_dict`` has the same keys, moments as 0-d tensors.

    :meth:`stacked` makes one scaler of several (a population's members, ``returns`` ``[S, N]`` and
    moments ``[S]``): each member's moments from its own rows, one set of ops for all, the numbers
    of each member's own scaler (the reductions run over the last dimension either way)."""

    def __init__(self, num_envs: int, gamma: float, device: torch.device | str = "cpu", clip: float = 10.0) -> None:
        self.gamma, self.clip = gamma, clip
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.mean = torch.zeros((), dtype=torch.float64, device=device)
        self.var = torch.ones((), dtype=torch.float64, device=device)
        self.count = torch.full((), 1e-4, dtype=torch.float64, device=device)

    def __call__(self, reward: torch.Tensor, terminated: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Scaled rewards, the shape of ``reward`` (``[N]``; a stacked scaler's ``[S * N]`` member-major)."""
        shape = self.returns.shape
        r, terminated, done = reward.reshape(shape), terminated.reshape(shape), done.reshape(shape)
        self.returns = self.returns * self.gamma * (~terminated).double() + r.double()
        n = shape[-1]
        batch_mean = self.returns.sum(-1) / n
        batch_var = (self.returns - batch_mean.unsqueeze(-1)).square().sum(-1) / n
        self.mean, self.var, self.count = merge_moments(self.mean, self.var, self.count, batch_mean, batch_var, n)
        self.returns = self.returns.masked_fill(done, 0.0)
        scaled = (r.double() / (self.var.unsqueeze(-1) + EPS).sqrt()).clamp(-self.clip, self.clip).float()
        return scaled.reshape(reward.shape)

    @classmethod
    def stacked(cls, scalers: list[DeviceRewardScaler]) -> DeviceRewardScaler:
        """One scaler for all of ``scalers`` (same ``gamma`` and ``clip``); :meth:`unstack` writes it back."""
        out = cls.__new__(cls)
        out.gamma, out.clip = scalers[0].gamma, scalers[0].clip
        for key in ("returns", "mean", "var", "count"):
            setattr(out, key, torch.stack([getattr(r, key) for r in scalers]))
        return out

    def unstack(self, scalers: list[DeviceRewardScaler]) -> None:
        """Give each of ``scalers`` its row of this stacked scaler's state."""
        for i, scaler in enumerate(scalers):
            for key in ("returns", "mean", "var", "count"):
                setattr(scaler, key, getattr(self, key)[i].clone())

    def state_dict(self) -> dict:
        return {
            "returns": self.returns.cpu().clone(),
            "mean": self.mean.cpu().clone(),
            "var": self.var.cpu().clone(),
            "count": self.count.cpu().clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        device = self.returns.device
        self.returns = torch.as_tensor(state["returns"], dtype=torch.float64).to(device).clone()
        self.mean, self.var, self.count = (
            torch.as_tensor(state[k], dtype=torch.float64).to(device).clone() for k in ("mean", "var", "count")
        )
