"""``WarpCollector``: :class:`~vaco.data.collector.RolloutCollector`'s batch, collected on the
device the Warp worlds live on.

Same TensorDict (keys, ``[num_envs, num_steps]`` layout, dtypes), same semantics: each world
acts with the version the policy buffer assigns it for the whole segment (the K-policy mixture
runs as one batched call per step on the device), CleanRL's reward scaling, the final
observation kept where an episode ended, episode statistics per world. The observation
normaliser belongs to the policy, as in the CPU collector. Nothing leaves the device per step;
one check per batch that everything is finite.
"""

from __future__ import annotations

import torch

from vaco.data.collector_base import CollectorBase
from vaco.data.normalization import DeviceRewardScaler
from vaco.data.policy_buffer import PolicyVersionBuffer

__all__ = ["WarpCollector"]


class WarpCollector(CollectorBase):
    """Collects ``num_iterations`` batches of ``num_envs x num_steps`` transitions on MuJoCo Warp,
    on the env's device: ``WarpCollector(env, num_steps, policy_buffer, num_iterations, gamma=...,
    scale_reward=..., seed=...)``, :class:`~vaco.data.collector_base.CollectorBase`'s arguments. The
    policy buffer is moved to the env's device when bound; the seed also seeds the reset noise.
    """

    @property
    def policy_buffer(self) -> PolicyVersionBuffer | None:
        return self._policy_buffer

    @policy_buffer.setter
    def policy_buffer(self, buffer: PolicyVersionBuffer | None) -> None:
        self._policy_buffer = None if buffer is None else buffer.to(self.device)

    # ------------------------------------------------------------------ CollectorBase's hooks
    def _reward_scaler(self, gamma: float) -> DeviceRewardScaler:
        return DeviceRewardScaler(self.num_envs, gamma, self.device)

    @property
    def batch_device(self):
        return self.device

    def _assign_slots(self) -> torch.Tensor:
        # drawn on a CPU generator seeded from the collector's (device) one: one generator decides everything
        slots = self.policy_buffer.assign(self.num_envs, torch.Generator().manual_seed(_draw_seed(self.generator)))
        return slots.to(self.device)

    def _save_envs(self):
        return self.env.state_dict()

    def _restore_envs(self, state) -> None:
        self.env.load_state_dict(state)


def _draw_seed(generator: torch.Generator) -> int:
    """A seed for the CPU draw of version slots, from the collector's (device) generator, so one
    generator decides everything and checkpoints with the collector."""
    return int(torch.randint(2**62, (1,), generator=generator, device=generator.device).item())
