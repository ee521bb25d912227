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
from vaco.data.warp.env import WarpVectorEnv

__all__ = ["WarpCollector"]


class WarpCollector(CollectorBase):
    """Collects ``num_iterations`` batches of ``num_envs x num_steps`` transitions on MuJoCo Warp.

    Args:
        env: the batched env (``num_worlds`` = ``num_envs``).
        num_steps: steps per world per batch.
        policy_buffer: the versions to act with (moved to the env's device when bound).
        num_iterations: batches to yield.
        gamma: discount of the reward scaler.
        scale_reward: CleanRL's reward scaling.
        seed: seeds the reset noise and the collector's generator (action noise, version draws).
    """

    def __init__(
        self,
        env: WarpVectorEnv,
        num_steps: int,
        policy_buffer: PolicyVersionBuffer | None,
        num_iterations: int,
        *,
        gamma: float = 0.99,
        scale_reward: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(
            env=env,
            num_envs=env.num_worlds,
            num_steps=num_steps,
            policy_buffer=policy_buffer,
            num_iterations=num_iterations,
            reward_scaler=DeviceRewardScaler(env.num_worlds, gamma, env.device) if scale_reward else None,
            generator=torch.Generator(device=env.device),
            seed=seed,
            device=env.device,
        )

    @property
    def policy_buffer(self) -> PolicyVersionBuffer | None:
        return self._policy_buffer

    @policy_buffer.setter
    def policy_buffer(self, buffer: PolicyVersionBuffer | None) -> None:
        self._policy_buffer = None if buffer is None else buffer.to(self.device)

    # ------------------------------------------------------------------ CollectorBase's hooks
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
