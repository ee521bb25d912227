"""``Lockstep``: a population's collectors stepping one simulator together.

Each member of a population (``vaco fit --population S``) has its own collector: its policy buffer,
generator, reward scaler and episode counters. Where the backend puts every member's envs in one
simulator (gymnasium in process: each member's own envs, stepped in one call,
:class:`~vaco.data.collector.JointGymnasium`; MuJoCo Warp: one model of ``S x N`` worlds, each
member's ``N`` a block with its own reset generator, :class:`~vaco.data.warp.env.WarpBlock`), the
members' rollouts run in lockstep: at each step every member acts (its own K-version mixture and
noise), the simulator steps all ``S x N`` envs once (on a GPU one kernel sequence, one CUDA graph),
and each member records its block's outcome. A member that stopped (non-finite values) collects no
more; its envs are reset once, from its seed, so that an env holding NaN shares no step with the
others, and act with zeros after.

**Batched** (the default): the members act in one policy call and record in one, not S small calls
a step each (on an H200 those cost ~15 s of a 16-member iteration's 25.8 s collection,
docs/gpu.md; on a CPU each is ~20 small ops). Every env acts through a
:class:`~vaco.data.policy_buffer.PopulationPolicy` (each env its own version's weights and
normaliser); the noise is still drawn from each member's own generator in its solo order, and the
outcome is recorded for all members at once into one buffer (each member's batch a view of its
rows).

**Exact** (the default on a CPU): a member's batch is the one its collector alone would collect,
bit for bit. The per-env product of the mixture gives each env the numbers its solo run gives it,
so members whose envs hold several versions act in one call; a member whose envs all hold one
version (always so at K = 1) acts through its own plain module, as alone (a per-env product rounds
otherwise than a plain one); each member's reward scaler scales its own rows. On a GPU (``exact``
False) every member acts in the one call and the reward scalers are stacked: equal to a member's
solo run to float rounding, as a GPU run is to itself (``tests/test_warp.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from vaco.data.collector_base import CollectorBase, EpisodeState, Segment, StepBuffers, record_actions, record_outcome
from vaco.data.normalization import DeviceRewardScaler
from vaco.data.policy_buffer import MixturePolicy, PopulationPolicy

__all__ = ["Lockstep", "shares_one_simulator"]


def shares_one_simulator(collectors: Sequence[object]) -> bool:
    """Whether every collector's envs are a block of the same simulator (see the module docstring)."""
    shared = [getattr(getattr(c, "env", None), "shared", None) for c in collectors]
    return len(shared) >= 1 and shared[0] is not None and all(s is shared[0] for s in shared)


class Lockstep:
    """The members' collectors as one loader: each ``next`` is every member's batch (None for a
    member in ``stopped``; the FloatingPointError for one whose envs returned NaN/inf).

    Args:
        collectors: the members' :class:`~vaco.data.collector_base.CollectorBase` s, member ``m``'s
            env the simulator's block ``m`` (``env.shared``, ``env.rows``).
        stopped: the members that collect no more (updated by the population as members stop).
        batched: act and record for all members at once (see the module docstring); False: each
            member acts and records in turn.
        exact: batched, each member's batch bit for bit its solo collector's (see the module
            docstring); None: where the simulator is on the CPU.
    """

    def __init__(
        self,
        collectors: Sequence[CollectorBase],
        stopped: set[int],
        batched: bool = True,
        exact: bool | None = None,
    ) -> None:
        if not shares_one_simulator(collectors):
            raise ValueError("Lockstep needs collectors whose envs are blocks of one simulator")
        self.collectors = list(collectors)
        self.stopped = stopped
        self.simulator = collectors[0].env.shared
        self.batched = bool(batched)
        self.exact = self.simulator.device.type == "cpu" if exact is None else bool(exact)
        self._parked: set[int] = set()

    def __len__(self) -> int:
        return min(len(c) for c in self.collectors)

    def __iter__(self) -> Iterator[list]:
        while all(c.iteration < c.num_iterations for c in self.collectors):
            yield self.rollout()

    @torch.no_grad()
    def rollout(self) -> list:
        start = time.perf_counter()
        collectors = self.collectors
        for m in sorted(self.stopped - self._parked):  # a stopped member's worlds leave any NaN behind
            collectors[m].env.reset(collectors[m].seed)
            self._parked.add(m)
        going = [m for m in range(len(collectors)) if m not in self.stopped]
        steps = {c.num_steps for c in collectors}
        if len(steps) != 1:
            raise ValueError(f"the members' collectors step different segment lengths: {sorted(steps)}")
        env = self.simulator
        idle = {
            m: torch.zeros(c.num_envs, env.act_dim, device=c.device).clamp(env.action_low, env.action_high)
            for m, c in enumerate(collectors)
            if m not in going
        }
        if self.batched and going:
            segments = self._batched(going, idle, steps.pop())
        else:
            segments = {m: collectors[m].begin_rollout() for m in going}
            for t in range(steps.pop()):
                actions = [
                    collectors[m].act(segments[m], t) if m in segments else idle[m] for m in range(len(collectors))
                ]
                outcome = env.step(torch.cat(actions))
                for m, segment in segments.items():
                    rows = collectors[m].env.rows
                    collectors[m].observe(segment, t, tuple(x[rows] for x in outcome))
        batches: list = [None] * len(collectors)
        for m, segment in segments.items():
            try:
                batches[m] = collectors[m].end_rollout(segment)
            except FloatingPointError as err:  # that member stops alone
                batches[m] = err
        seconds = (time.perf_counter() - start) / max(1, len(segments))
        for m in segments:
            collectors[m].last_collect_seconds = seconds
        return batches

    def _batched(self, going: list[int], idle: dict[int, torch.Tensor], T: int) -> dict:
        """The going members' segments, stepped with one policy call and one record per step
        (:meth:`CollectorBase.act` and :meth:`CollectorBase.observe` on all their envs at once)."""
        collectors, env = self.collectors, self.simulator
        members = [collectors[m] for m in going]
        n = members[0].num_envs
        # each member's reset (where none happened yet) and versions, in the solo order; one buffer for all
        segments = {m: Segment(collectors[m].start_rollout(), None) for m in going}
        states = [c.episode_state() for c in members]
        obs = torch.cat([state.obs for state in states])
        buffers = StepBuffers.empty(T, obs.shape[0], obs.shape[-1], env.act_dim, obs.device)
        for i, m in enumerate(going):
            segments[m].buffers = buffers.rows(slice(i * n, (i + 1) * n))
        acting = _acting([segments[m].policy for m in going], n, self.exact, buffers)
        # the members' counters, stacked for the rollout (given back at its end)
        ep_return = torch.cat([state.ep_return for state in states])
        ep_length = torch.cat([state.ep_length for state in states])
        scalers = [c.reward_scaler for c in members]
        member_rows = [slice(i * n, (i + 1) * n) for i in range(len(members))]
        # the reward scalers stacked (a GPU's: one set of ops for all members) or each on its rows
        stacked = scalers[0] is not None and not self.exact and all(type(r) is DeviceRewardScaler for r in scalers)
        if stacked:
            scale = DeviceRewardScaler.stacked(scalers)
        elif scalers[0] is not None:
            scale = _EachScaler(scalers, member_rows)
        else:
            scale = None
        every = len(going) == len(collectors)
        if not every:  # a stopped member's worlds act with zeros; the others' rows of each outcome are read
            rows = torch.cat([torch.arange(m * n, (m + 1) * n, device=obs.device) for m in going])
            full = torch.cat(
                [idle.get(m, torch.zeros(n, env.act_dim, device=obs.device)) for m in range(len(collectors))]
            )
        act_dim = env.act_dim
        for t in range(T):
            # act (CollectorBase.act), every member's envs at once; each member's noise from its generator
            buffers.obs[t] = obs
            noise = torch.cat(
                [torch.randn(n, act_dim, generator=c.generator, dtype=torch.float32, device=c.device) for c in members]
            )
            if len(acting) == 1:
                action = record_actions(buffers, t, *acting[0][1](obs), noise, env.action_low, env.action_high)
            else:
                action = torch.cat(
                    [
                        record_actions(part, t, *policy(obs[rows]), noise[rows], env.action_low, env.action_high)
                        for rows, policy, part in acting
                    ]
                )
            if every:
                outcome = env.step(action)
            else:
                outcome = tuple(x[rows] for x in env.step(full.index_copy(0, rows, action)))
            # observe (CollectorBase.observe), every member's envs at once; each member's reward scale
            obs = record_outcome(buffers, t, outcome, ep_return, ep_length, scale)
        for i, c in enumerate(members):
            part = member_rows[i]
            c.set_episode_state(EpisodeState(obs[part].clone(), ep_return[part].clone(), ep_length[part].clone()))
        if stacked:
            scale.unstack(scalers)
        return segments


def _acting(mixtures: list[MixturePolicy], n: int, exact: bool, buffers: StepBuffers) -> list[tuple]:
    """Who acts in which call, for a rollout: ``(rows, policy, buffers of those rows)`` in member
    order. Not ``exact``: every env in one :class:`PopulationPolicy` call. ``exact``: each run of
    consecutive members whose envs hold several versions in one call (per-env products, as alone),
    a member on one version through its own mixture (its plain module, as alone). An actor without
    ``batched_forward``: each member's own mixture, in turn."""
    if not exact:
        policy = PopulationPolicy.of(mixtures) or _Each(mixtures, n)
        return [(slice(0, n * len(mixtures)), policy, buffers)]
    groups, i = [], 0
    while i < len(mixtures):
        j = i + 1
        if not mixtures[i].plain:
            while j < len(mixtures) and not mixtures[j].plain:
                j += 1
        policy = PopulationPolicy.of(mixtures[i:j]) if j - i > 1 else None
        if policy is None:
            groups += [(k, k + 1, mixtures[k]) for k in range(i, j)]
        else:
            groups.append((i, j, policy))
        i = j
    if len(groups) == 1:
        return [(slice(0, n * len(mixtures)), groups[0][2], buffers)]
    return [(rows := slice(a * n, b * n), policy, buffers.rows(rows)) for a, b, policy in groups]


class _EachScaler:
    """Members' reward scalers, each on its rows of ``[S * N]`` (as alone: a CPU's exact path)."""

    def __init__(self, scalers: list, rows: list[slice]) -> None:
        self.scalers, self.rows = scalers, rows

    def __call__(self, reward: torch.Tensor, terminated: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        return torch.cat([sc(reward[m], terminated[m], done[m]) for sc, m in zip(self.scalers, self.rows)])


class _Each:
    """Members' mixtures called one by one on their rows (actors without ``batched_forward``)."""

    def __init__(self, mixtures: list, n: int) -> None:
        self.mixtures, self.n = mixtures, n

    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs = [mix(obs[i * self.n : (i + 1) * self.n]) for i, mix in enumerate(self.mixtures)]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1].expand_as(o[0]) for o in outs])
