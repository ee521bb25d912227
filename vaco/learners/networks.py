"""CleanRL's continuous-control agent: 64-64 tanh MLPs, state-independent log std, orthogonal init.

The Gaussian log-density and entropy are written out (rather than built through
``torch.distributions``) because the collector evaluates them at every env step for a mixture
of policies; the formulas are the standard ones and are tested against ``torch.distributions``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["layer_init", "mlp", "GaussianActor", "Critic", "gaussian_log_prob", "gaussian_entropy"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with gain ``std`` and constant bias (CleanRL's ``layer_init``)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width)), nn.Tanh()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)


class GaussianActor(nn.Module):
    """``a ~ N(mu(s), exp(log_std))`` with a state-independent ``log_std`` (initialised to 0)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int] = (64, 64)) -> None:
        super().__init__()
        self.mean = mlp(obs_dim, hidden, act_dim, out_std=0.01)
        self.log_std = nn.Parameter(torch.zeros(act_dim))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.mean(obs)
        return loc, self.log_std.exp().expand_as(loc)

    def batched_forward(self, per_env: dict[str, torch.Tensor]):
        """``(loc, scale)`` of N actors at once, env ``i`` with its own parameters ``per_env[name][i]``
        (``[N, *shape]``, keyed as ``named_parameters``): the behaviour mixture of K policy versions
        (:class:`vaco.data.policy_buffer.MixturePolicy`) calls it once per rollout and the result
        on each step's observations ``[N, obs_dim]``. ``None`` where the MLP is not Linear/Tanh
        (then the buffer vmaps :meth:`forward`).

        One ``baddbmm`` per layer over the envs' own weights, written by hand because ``vmap``
        re-traces ``functional_call`` on every step: for 64 envs on HalfCheetah its dispatch
        overhead cost ~20% of collection throughput at K = 16. Same arithmetic as ``nn.Linear``
        (``x @ W.T + b``) per env.
        """
        plain = all(isinstance(m, (nn.Linear, nn.Tanh)) for m in self.mean)
        if not plain or type(self).forward is not GaussianActor.forward:  # a subclass's own layers or forward
            return None
        layers = []  # (weight transposed [N, in, out], bias [N, 1, out]) or None for tanh
        for i, module in enumerate(self.mean):
            if isinstance(module, nn.Linear):
                weight = per_env[f"mean.{i}.weight"].transpose(1, 2).contiguous()
                bias = per_env[f"mean.{i}.bias"].unsqueeze(1) if module.bias is not None else None
                layers.append((weight, bias))
            else:
                layers.append(None)
        scale = per_env["log_std"].exp()  # [N, act]: state-independent, once per rollout

        def forward(obs):
            h = obs.unsqueeze(1)  # [N, 1, obs_dim]
            for layer in layers:
                if layer is None:
                    h = torch.tanh(h)
                else:
                    weight, bias = layer
                    h = torch.bmm(h, weight) if bias is None else torch.baddbmm(bias, h, weight)
            return h.squeeze(1), scale

        return forward


class Critic(nn.Module):
    """``V(s)``: the same MLP shape with a unit-gain output layer; returns ``[...]`` (no trailing 1)."""

    def __init__(self, obs_dim: int, hidden: Sequence[int] = (64, 64)) -> None:
        super().__init__()
        self.net = mlp(obs_dim, hidden, 1, out_std=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)


def gaussian_log_prob(action: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``sum_i log N(a_i; mu_i, sigma_i)`` over the last (action) dimension."""
    z = (action - loc) / scale
    return (-0.5 * z.pow(2) - scale.log() - _LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(scale: torch.Tensor) -> torch.Tensor:
    """``sum_i (1/2 + log(sqrt(2 pi) sigma_i))`` over the last dimension."""
    return (0.5 + _LOG_SQRT_2PI + scale.log()).sum(-1)
