"""What vaco's rollout collectors share (the gymnasium one, :class:`~vaco.data.collector.RolloutCollector`,
and the MuJoCo Warp one, :class:`~vaco.data.warp.warp_collector.WarpCollector`): TorchRL's
``BaseCollector`` API over one ``rollout()`` per iteration, and the resumable state (the iteration,
the seed and generator, the envs' own state and observation, the episode counters, the reward
scaler). A backend fills in how its arrays and envs are saved and restored; the state's keys and
their meaning are the same for both, so a checkpoint reads the same way whichever wrote it."""

from __future__ import annotations

from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.collectors import BaseCollector

__all__ = ["CollectorBase"]


class CollectorBase(BaseCollector):
    """A subclass sets ``num_iterations``, ``iteration``, ``seed``, ``generator``, ``env``,
    ``reward_scaler`` (or None), ``_obs`` (None until the first reset), ``_ep_return`` (float64)
    and ``_ep_length`` (int64), and implements :meth:`rollout` and the four state hooks."""

    def __init__(
        self,
        *,
        env,
        num_envs: int,
        num_steps: int,
        policy_buffer,
        num_iterations: int,
        reward_scaler,
        generator: torch.Generator,
        seed: int,
    ) -> None:
        super().__init__()
        self.trajs_per_batch = None  # BaseCollector: fixed-size batches, not whole trajectories
        self.env = env
        self.num_envs, self.num_steps = num_envs, num_steps
        self.frames_per_batch = num_envs * num_steps
        self.policy_buffer = policy_buffer
        self.num_iterations = num_iterations
        self.reward_scaler = reward_scaler
        self.generator = generator
        self.set_seed(seed)
        self.iteration = 0
        self._obs = None
        # the episode counters in the backend's own kind (numpy, or tensors on its device)
        self._ep_return = self._load_array(torch.zeros(num_envs, dtype=torch.float64), torch.float64)
        self._ep_length = self._load_array(torch.zeros(num_envs, dtype=torch.int64), torch.int64)
        self.last_collect_seconds = 0.0

    # ------------------------------------------------------------------ what a backend provides
    @abstractmethod
    def rollout(self) -> TensorDict:
        """One iteration's batch ``[num_envs, num_steps]``; advances ``iteration``."""

    @abstractmethod
    def _save_array(self, x) -> torch.Tensor:
        """A copy of one of the collector's arrays as a CPU tensor (checkpoints hold tensors only)."""

    @abstractmethod
    def _load_array(self, saved: torch.Tensor, dtype: torch.dtype | None):
        """The saved array back in the collector's own kind (numpy, or a tensor on its device)."""

    @abstractmethod
    def _save_envs(self) -> Any:
        """The envs' simulator state (tensors and plain values)."""

    @abstractmethod
    def _restore_envs(self, state: Any) -> None:
        """Put the envs back in the saved state (the observation is restored separately)."""

    # ------------------------------------------------------------------ BaseCollector API
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        self.seed = int(seed)
        self.generator.manual_seed(self.seed)
        self._obs = None  # the next batch starts from a seeded reset
        return self.seed

    def __len__(self) -> int:
        return self.num_iterations

    def iterator(self) -> Iterator[TensorDict]:
        while self.iteration < self.num_iterations:
            yield self.rollout()

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        if close_env:
            self.env.close()

    def state_dict(self) -> OrderedDict:
        # tensors and plain values only: checkpoints load with torch.load(weights_only=True)
        return OrderedDict(
            iteration=self.iteration,
            seed=self.seed,
            generator=self.generator.get_state(),
            obs=None if self._obs is None else self._save_array(self._obs),
            ep_return=self._save_array(self._ep_return),
            ep_length=self._save_array(self._ep_length),
            reward_scaler=None if self.reward_scaler is None else self.reward_scaler.state_dict(),
            envs=None if self._obs is None else self._save_envs(),
        )

    def load_state_dict(self, state_dict: OrderedDict) -> None:
        self.iteration = int(state_dict["iteration"])
        self.seed = int(state_dict["seed"])
        self.generator.set_state(state_dict["generator"])
        self._ep_return = self._load_array(state_dict["ep_return"], torch.float64)
        self._ep_length = self._load_array(state_dict["ep_length"], torch.int64)
        if self.reward_scaler is not None and state_dict["reward_scaler"] is not None:
            self.reward_scaler.load_state_dict(state_dict["reward_scaler"])
        if state_dict["obs"] is None:
            self._obs = None
        else:
            self._restore_envs(state_dict["envs"])
            self._obs = self._load_array(state_dict["obs"], None)
