"""The policy-version buffer of the simulated asynchronous setup (paper, Figure 1 left).

The buffer keeps the last K policies. A policy *version* is the actor's weights together with
the observation statistics it was trained with (a stale policy must see observations the way
it was trained to). Before each collection phase every actor (one sub-environment) is assigned
a version drawn uniformly from the buffer and keeps it for its whole rollout segment.

Acting with K versions costs one call, not K: the assigned parameters are gathered per env
once per rollout and the mixture is evaluated in one batched call: one ``baddbmm`` per layer
for vaco's MLP actor, ``torch.func.vmap`` over ``functional_call`` for any other actor; when
every env holds the same version (always so for K = 1) the plain module is called. K = 1 is
ordinary synchronous on-policy training.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call, vmap

from vaco.data.normalization import apply_normalizer, normalizer

__all__ = ["PolicyVersionBuffer", "MixturePolicy", "PopulationPolicy"]


def _buffer_name(param_name: str) -> str:
    return "param__" + param_name.replace(".", "__")


class PolicyVersionBuffer(nn.Module):
    """Ring buffer of the last ``capacity`` (actor weights, obs mean, obs var, version id).

    Everything is a registered buffer, so ``state_dict()`` checkpoints the whole buffer and a
    worker process can receive it as plain tensors.

    Who owns which copy: the learner (``VacoModule``) owns the training weights, on its device
    (a GPU, say); this buffer owns CPU copies of the last K versions, made by :meth:`push`. The
    actors act on the CPU, where the envs step: a 64x64 MLP per env step is cheaper there than a
    host-device round trip per step, and actor processes and the weight-sync schemes (TorchRL's)
    then only ever see CPU tensors.

    Args:
        actor: the learner's actor (its architecture is copied; its weights are not shared).
        obs_dim: observation size (for the stored normaliser statistics).
        capacity: K, the number of versions kept (the degree of asynchrony), >= 1.
    """

    def __init__(self, actor: nn.Module, obs_dim: int, capacity: int) -> None:
        super().__init__()
        if not (isinstance(capacity, int) and capacity >= 1):
            raise ValueError(f"`policy_buffer_size` (K) must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self.template = copy.deepcopy(actor).requires_grad_(False).cpu()
        self._names = [name for name, _ in self.template.named_parameters()]
        for name, p in self.template.named_parameters():
            self.register_buffer(_buffer_name(name), torch.zeros(capacity, *p.shape, dtype=p.dtype))
        self.register_buffer("obs_mean", torch.zeros(capacity, obs_dim, dtype=torch.float64))
        self.register_buffer("obs_var", torch.ones(capacity, obs_dim, dtype=torch.float64))
        self.register_buffer("versions", torch.full((capacity,), -1, dtype=torch.long))
        self.register_buffer("cursor", torch.zeros((), dtype=torch.long))

    @property
    def size(self) -> int:
        return int((self.versions >= 0).sum())

    @property
    def newest_version(self) -> int:
        return int(self.versions.max())

    @torch.no_grad()
    def push(self, actor: nn.Module, obs_mean: torch.Tensor, obs_var: torch.Tensor, version: int) -> None:
        """Store a new version (copied to the CPU from wherever the learner is), overwriting the oldest when full."""
        slot = int(self.cursor)
        for name, p in actor.named_parameters():
            getattr(self, _buffer_name(name))[slot].copy_(p.detach())
        self.obs_mean[slot].copy_(obs_mean)
        self.obs_var[slot].copy_(obs_var)
        self.versions[slot] = version
        self.cursor.fill_((slot + 1) % self.capacity)

    def assign(self, num_envs: int, generator: torch.Generator) -> torch.Tensor:
        """Draw a slot uniformly from the filled ones for each of ``num_envs`` actors."""
        filled = (self.versions >= 0).nonzero().squeeze(-1)
        if filled.numel() == 0:
            raise RuntimeError("the policy buffer is empty: push the initial policy before collecting")
        return filled[torch.randint(filled.numel(), (num_envs,), generator=generator)]

    def mixture(self, slots: torch.Tensor) -> MixturePolicy:
        return MixturePolicy(self, slots)

    def params(self, slot: int | torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: getattr(self, _buffer_name(name))[slot] for name in self._names}


class MixturePolicy:
    """The behaviour policy of one rollout: env ``i`` acts with version ``slots[i]``.

    Calling it on raw observations ``[N, obs_dim]`` returns ``(loc, scale)`` of each env's Gaussian.
    """

    def __init__(self, buffer: PolicyVersionBuffer, slots: torch.Tensor) -> None:
        self.buffer = buffer
        self.slots = slots
        self.versions = buffer.versions[slots]
        self.obs_mean = buffer.obs_mean[slots]
        self.obs_var = buffer.obs_var[slots]
        distinct = torch.unique(slots)
        #: every env acts with one version, through a plain module (see below)
        self.plain = distinct.numel() == 1
        if distinct.numel() == 1:
            self.obs_mean, self.obs_var = self.obs_mean[:1], self.obs_var[:1]
        # the normaliser as a float32 shift and scale, computed once per rollout
        self._shift, self._inv_scale = normalizer(self.obs_mean, self.obs_var)
        if distinct.numel() == 1:
            # everyone acts with one version: load it into a plain module, no vmap on the hot path
            self._module = copy.deepcopy(buffer.template)
            for name, value in buffer.params(distinct[0]).items():
                self._module.get_parameter(name).copy_(value)
            self._forward = self._module
        else:
            per_env = buffer.params(slots)  # gathered once per rollout: [N, *param_shape]
            # the actor's own batched forward where it has one (GaussianActor: one baddbmm per layer), else vmap
            batched = getattr(buffer.template, "batched_forward", None)
            self._forward = (batched(per_env) if batched is not None else None) or _vmapped(buffer.template, per_env)

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc, scale)`` for raw observations ``[N, obs_dim]``, normalised as the learner normalises them."""
        return self._forward(apply_normalizer(obs, self._shift, self._inv_scale))

    def per_env(self) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """Each env's parameters ``{name: [N, *shape]}`` and normaliser ``(shift, inv_scale)``
        ``[N, obs_dim]``: what :class:`PopulationPolicy` concatenates over a population's members."""
        n = self.slots.shape[0]
        params = self.buffer.params(self.slots)
        return params, self._shift.expand(n, -1), self._inv_scale.expand(n, -1)


class PopulationPolicy:
    """Several mixtures (a population's members, each its own K versions) as one call on all their
    envs: each env's own parameters and normaliser, concatenated once per rollout, and one
    ``batched_forward`` (a ``baddbmm`` per layer) per step. Each env gets the numbers its own
    mixture's per-env product gives it; a mixture on one version calls a plain module, whose
    product rounds otherwise (:class:`vaco.population.lockstep.Lockstep` calls that one alone where the
    members must be their solo runs bit for bit). ``None`` from :meth:`of` where the actor has no
    ``batched_forward`` (the members then act one by one)."""

    def __init__(self, forward, shift: torch.Tensor, inv_scale: torch.Tensor) -> None:
        self._forward, self._shift, self._inv_scale = forward, shift, inv_scale

    @classmethod
    def of(cls, mixtures: list[MixturePolicy]) -> PopulationPolicy | None:
        batched = getattr(mixtures[0].buffer.template, "batched_forward", None)
        if batched is None:
            return None
        parts = [m.per_env() for m in mixtures]
        params = {name: torch.cat([p[name] for p, _, _ in parts]) for name in parts[0][0]}
        forward = batched(params)
        if forward is None:
            return None
        return cls(forward, torch.cat([s for _, s, _ in parts]), torch.cat([i for _, _, i in parts]))

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc, scale)`` for every member's envs' raw observations, ``[sum of N, obs_dim]``."""
        return self._forward(apply_normalizer(obs, self._shift, self._inv_scale))


def _vmapped(template: nn.Module, per_env: dict[str, torch.Tensor]):
    """Any actor: ``vmap`` over envs of ``functional_call`` with each env's parameters."""

    def one_env(params, obs):
        return functional_call(template, params, (obs.unsqueeze(0),))

    batched = vmap(one_env, in_dims=(0, 0))

    def forward(obs):
        loc, scale = batched(per_env, obs)
        return loc.squeeze(1), scale.squeeze(1)

    return forward
