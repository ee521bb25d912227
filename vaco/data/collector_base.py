"""The one rollout loop of vaco's collectors, over a small vector-env protocol.

Both backends, gymnasium's (:class:`~vaco.data.collector.RolloutCollector`, through
:class:`~vaco.data.collector.GymnasiumEnvs`) and MuJoCo Warp's
(:class:`~vaco.data.warp.warp_collector.WarpCollector`, whose env speaks the protocol natively), run
:meth:`CollectorBase.rollout`: each env draws one of the last K policy versions, steps T times with
it, and the time-major step buffers become the ``[N, T]`` batch (:class:`StepBuffers`). A new
simulator (a batched CPU one) is a :class:`VectorEnv` and a small collector subclass. The class is
also TorchRL's ``BaseCollector`` API over ``rollout()`` and the resumable state (iteration, seed and
generator, the envs' state and observation, episode counters, reward scaler), with the same keys
whichever backend wrote it."""

from __future__ import annotations

import dataclasses
import math
import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

import torch
from tensordict import TensorDict
from torchrl.collectors import BaseCollector

__all__ = ["CollectorBase", "Segment", "StepBuffers", "VectorEnv"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class VectorEnv(Protocol):
    """A batch of ``num_envs`` envs as the rollout loop steps them: tensors in and out, on the
    collector's device, observations float32, episodes reset in the same step they end."""

    device: torch.device
    num_envs: int
    act_dim: int
    action_low: torch.Tensor  # [act_dim], float32
    action_high: torch.Tensor

    def reset(self, seed: int) -> torch.Tensor:
        """Seeded reset of every env; the observations ``[N, obs_dim]``."""

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One step with ``action`` ``[N, act_dim]`` (inside the bounds). Returns ``(obs, reward,
        terminated, truncated, final_obs)``: ``obs`` is the reset observation where an episode
        ended and ``final_obs`` the one it ended on (``obs`` elsewhere)."""

    def close(self) -> None: ...


@dataclasses.dataclass
class StepBuffers:
    """One rollout's time-major ``[T, N, ...]`` buffers: each step writes contiguous rows, and
    :meth:`batch` transposes each once into the ``[N, T]`` batch."""

    obs: torch.Tensor
    next_obs: torch.Tensor
    actions: torch.Tensor
    locs: torch.Tensor
    scales: torch.Tensor
    log_probs: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    ep_returns: torch.Tensor
    ep_lengths: torch.Tensor

    @classmethod
    def empty(cls, T: int, N: int, obs_dim: int, act_dim: int, device) -> StepBuffers:
        f32 = dict(dtype=torch.float32, device=device)
        flags = dict(dtype=torch.bool, device=device)
        return cls(
            obs=torch.empty(T, N, obs_dim, **f32),
            next_obs=torch.empty(T, N, obs_dim, **f32),
            actions=torch.empty(T, N, act_dim, **f32),
            locs=torch.empty(T, N, act_dim, **f32),
            scales=torch.empty(T, N, act_dim, **f32),
            log_probs=torch.empty(T, N, **f32),
            rewards=torch.empty(T, N, **f32),
            terminated=torch.empty(T, N, **flags),
            truncated=torch.empty(T, N, **flags),
            ep_returns=torch.empty(T, N, **f32),
            ep_lengths=torch.empty(T, N, dtype=torch.long, device=device),
        )

    def rows(self, rows: slice) -> StepBuffers:
        """The buffers of envs ``rows`` (views: writing either writes both)."""
        return StepBuffers(**{f.name: getattr(self, f.name)[:, rows] for f in dataclasses.fields(self)})

    def all_finite(self) -> bool:
        return bool(
            torch.isfinite(self.rewards).all() & torch.isfinite(self.next_obs).all() & torch.isfinite(self.obs).all()
        )

    def batch(self, versions: torch.Tensor, device=None) -> TensorDict:
        """The ``[N, T]`` batch (TorchRL's layout, see :mod:`vaco.data.collector`); ``versions``
        is the version each env acted with, ``[N]``."""

        def env_major(x: torch.Tensor) -> torch.Tensor:
            return x.transpose(0, 1).contiguous()

        terminated, truncated = env_major(self.terminated), env_major(self.truncated)
        N, T = terminated.shape
        return TensorDict(
            {
                "observation": env_major(self.obs),
                "action": env_major(self.actions),
                "behavior_log_prob": env_major(self.log_probs),
                "behavior_loc": env_major(self.locs),
                "behavior_scale": env_major(self.scales),
                "policy_version": versions.unsqueeze(-1).expand(N, T).clone(),
                "next": {
                    "observation": env_major(self.next_obs),
                    "reward": env_major(self.rewards),
                    "done": terminated | truncated,
                    "terminated": terminated,
                    "truncated": truncated,
                    "episode_return": env_major(self.ep_returns),
                    "episode_length": env_major(self.ep_lengths),
                },
            },
            batch_size=[N, T],
            device=device,
        )


class CollectorBase(BaseCollector):
    """The rollout loop and the collector's state over ``env`` (a :class:`VectorEnv`; the collector
    lives on its device). A subclass implements :meth:`_reward_scaler`, :meth:`_assign_slots` and
    the envs' two state hooks. ``batch_device``: the device the batch is marked with (None: left
    unmarked, CPU).

    Args:
        env: the batched envs (``num_envs`` of them).
        num_steps: steps per env per batch (the rollout segment).
        policy_buffer: the versions to act with; read at the start of every batch.
        num_iterations: batches to yield before stopping.
        gamma: discount used by the reward scaler.
        scale_reward: apply CleanRL's reward scaling.
        seed: seeds the collector's generator (action noise and version assignment) and the envs'
            reset.
    """

    batch_device = None

    def __init__(
        self,
        env: VectorEnv,
        num_steps: int,
        policy_buffer,
        num_iterations: int,
        *,
        gamma: float = 0.99,
        scale_reward: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.device = torch.device(env.device)  # before policy_buffer: a subclass may move the buffer there
        self.trajs_per_batch = None  # BaseCollector: fixed-size batches, not whole trajectories
        self.env = env
        self.num_envs, self.num_steps = env.num_envs, num_steps
        self.frames_per_batch = self.num_envs * num_steps
        self.policy_buffer = policy_buffer
        self.num_iterations = num_iterations
        self.reward_scaler = self._reward_scaler(gamma) if scale_reward else None
        self.generator = torch.Generator(device=self.device)
        self.set_seed(seed)
        self.iteration = 0
        self._obs = None
        self._ep_return = torch.zeros(self.num_envs, dtype=torch.float64, device=self.device)
        self._ep_length = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self.last_collect_seconds = 0.0

    # ------------------------------------------------------------------ what a backend provides
    @abstractmethod
    def _reward_scaler(self, gamma: float):
        """The reward scaler for ``num_envs`` envs on the collector's device (``scale_reward``)."""

    @abstractmethod
    def _assign_slots(self) -> torch.Tensor:
        """Each env's slot in the policy buffer for this rollout, ``[N]`` on the collector's device."""

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
            obs=None if self._obs is None else self._obs.cpu().clone(),
            ep_return=self._ep_return.cpu().clone(),
            ep_length=self._ep_length.cpu().clone(),
            reward_scaler=None if self.reward_scaler is None else self.reward_scaler.state_dict(),
            envs=None if self._obs is None else self._save_envs(),
        )

    def load_state_dict(self, state_dict: OrderedDict) -> None:
        self.iteration = int(state_dict["iteration"])
        self.seed = int(state_dict["seed"])
        self.generator.set_state(state_dict["generator"])
        self._ep_return = torch.as_tensor(state_dict["ep_return"]).to(self.device, torch.float64).clone()
        self._ep_length = torch.as_tensor(state_dict["ep_length"]).to(self.device, torch.long).clone()
        if self.reward_scaler is not None and state_dict["reward_scaler"] is not None:
            self.reward_scaler.load_state_dict(state_dict["reward_scaler"])
        if state_dict["obs"] is None:
            self._obs = None
        else:
            self._restore_envs(state_dict["envs"])
            # float32, as the loop keeps it
            self._obs = torch.as_tensor(state_dict["obs"]).to(self.device, torch.float32).clone()

    # ------------------------------------------------------------------ the loop
    @torch.no_grad()
    def rollout(self) -> TensorDict:
        """One iteration's batch ``[num_envs, num_steps]``: each env acts with the version in its
        slot for the whole segment; episodes that end reset in the same step (the final
        observation is kept as ``("next", "observation")``).

        The loop in three phases (:meth:`begin_rollout`, :meth:`act` / :meth:`observe` per step,
        :meth:`end_rollout`), so that several collectors whose envs are blocks of one simulator step
        it once per step for all (:class:`vaco.population.lockstep.Lockstep`, a population's members)."""
        start = time.perf_counter()
        segment = self.begin_rollout()
        for t in range(self.num_steps):
            self.observe(segment, t, self.env.step(self.act(segment, t)))
        batch = self.end_rollout(segment)
        self.last_collect_seconds = time.perf_counter() - start
        return batch

    @torch.no_grad()
    def begin_rollout(self) -> Segment:
        """Start a segment: a seeded reset where none happened yet, each env's version, the buffers."""
        policy = self.start_rollout()
        buffers = StepBuffers.empty(self.num_steps, self.num_envs, self._obs.shape[-1], self.env.act_dim, self.device)
        return Segment(policy, buffers)

    @torch.no_grad()
    def start_rollout(self):
        """:meth:`begin_rollout` without the buffers (a population's lockstep allocates one for all
        its members): the reset where none happened yet, and the segment's behaviour mixture."""
        if self._obs is None:
            self._obs = self.env.reset(self.seed)
            self._ep_return.zero_()
            self._ep_length.zero_()
        return self.policy_buffer.mixture(self._assign_slots())

    @torch.no_grad()
    def act(self, segment: Segment, t: int) -> torch.Tensor:
        """Step ``t``'s actions (sampled from each env's version; recorded), clipped to the bounds."""
        buffers, env = segment.buffers, self.env
        buffers.obs[t] = self._obs
        loc, scale = segment.policy(buffers.obs[t])
        noise = torch.randn(
            self.num_envs, env.act_dim, generator=self.generator, dtype=torch.float32, device=self.device
        )
        return record_actions(buffers, t, loc, scale, noise, env.action_low, env.action_high)

    @torch.no_grad()
    def observe(self, segment: Segment, t: int, outcome: tuple[torch.Tensor, ...]) -> None:
        """Record step ``t``'s outcome (``VectorEnv.step``'s tuple): :func:`record_outcome` with this
        collector's episode counters and reward scaler."""
        self._obs = record_outcome(segment.buffers, t, outcome, self._ep_return, self._ep_length, self.reward_scaler)

    def episode_state(self) -> EpisodeState:
        """The envs' current observation (None before the first reset) and each env's running
        episode return and length: what a population's lockstep steps for all its members at once."""
        return EpisodeState(self._obs, self._ep_return, self._ep_length)

    def set_episode_state(self, state: EpisodeState) -> None:
        """Take over ``state`` (:meth:`episode_state`'s tuple, stepped elsewhere)."""
        self._obs, self._ep_return, self._ep_length = state

    @torch.no_grad()
    def end_rollout(self, segment: Segment) -> TensorDict:
        """The segment's ``[N, T]`` batch (a FloatingPointError where the envs returned NaN/inf)."""
        buffers = segment.buffers
        if not buffers.all_finite():
            raise FloatingPointError(
                f"the environment returned NaN/inf observations or rewards at iteration {self.iteration}"
            )
        batch = buffers.batch(segment.policy.versions.to(self.device), self.batch_device)
        self.iteration += 1
        return batch


def record_outcome(
    buffers: StepBuffers,
    t: int,
    outcome: tuple[torch.Tensor, ...],
    ep_return: torch.Tensor,
    ep_length: torch.Tensor,
    scale: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    r"""Record step ``t``'s outcome (``VectorEnv.step``'s tuple) in ``buffers``: rewards (``scale``\ d
    where given: ``(reward, terminated, done) -> reward``), flags, the final observations, and the
    episode statistics (``ep_return`` and ``ep_length`` are advanced in place and restarted where an
    episode ended). Returns the envs' new observation. A collector's :meth:`CollectorBase.observe`,
    and a lockstep's for all its members' envs at once."""
    new_obs, reward, term, trunc, final_obs = outcome
    done = term | trunc
    buffers.next_obs[t] = final_obs
    ep_return += reward.double()
    ep_length += 1
    buffers.ep_returns[t] = ep_return
    buffers.ep_lengths[t] = ep_length
    ep_return.masked_fill_(done, 0.0)
    ep_length.masked_fill_(done, 0)
    buffers.rewards[t] = scale(reward, term, done) if scale is not None else reward
    buffers.terminated[t], buffers.truncated[t] = term, trunc
    return new_obs


class EpisodeState(NamedTuple):
    """What a collector carries from step to step and rollout to rollout."""

    obs: torch.Tensor | None  # [N, obs_dim]; None: the next rollout starts with a seeded reset
    ep_return: torch.Tensor  # [N] float64
    ep_length: torch.Tensor  # [N] long


def record_actions(
    buffers: StepBuffers,
    t: int,
    loc: torch.Tensor,
    scale: torch.Tensor,
    noise: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
) -> torch.Tensor:
    """Step ``t``'s actions ``loc + scale * noise`` recorded (with their log-prob, loc and scale) in
    ``buffers``; returns them clipped to ``[low, high]`` (a collector's act; a lockstep's for all members)."""
    action = torch.addcmul(loc, scale, noise)
    # log N(a; loc, scale) with a = loc + scale * noise
    buffers.log_probs[t] = (-0.5 * noise.square() - scale.log()).sum(-1) - noise.shape[-1] * _LOG_SQRT_2PI
    buffers.actions[t], buffers.locs[t], buffers.scales[t] = action, loc, scale.expand_as(loc)
    return torch.maximum(torch.minimum(action, high), low)


@dataclasses.dataclass
class Segment:
    """A rollout in progress: the versions acting (the mixture) and the step buffers."""

    policy: Any
    buffers: StepBuffers
