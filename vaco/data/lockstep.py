"""``Lockstep``: a population's collectors stepping one simulator together.

Each member of a population (``vaco fit --population S``) has its own collector: its policy buffer,
generator, reward scaler and episode counters. Where the backend can put every member's envs in one
simulator (MuJoCo Warp: one model of ``S x N`` worlds, each member's ``N`` a block with its own
reset generator, :class:`~vaco.data.warp.env.WarpBlock`), the members' rollouts run in lockstep:
at each step every member acts (:meth:`CollectorBase.act`: its own K-version mixture and noise),
the simulator steps all ``S x N`` worlds once (one kernel sequence, one CUDA graph on a GPU), and
each member records its block's outcome (:meth:`CollectorBase.observe`). A member's batch is the
one its collector alone would collect, bit for bit where the simulator is deterministic per world
(Warp's CPU device: ``tests/test_warp.py``); on a GPU that is as exact as the solo run is.

A member that stopped (non-finite values) collects no more; its worlds are reset once, from its
seed, so that a world holding NaN shares no step with the others, and act with zeros after.

**Batched (on a GPU).** Members acting and recording one by one cost S small calls a step each
(measured on an H200: ~15 s of a 16-member iteration's 25.8 s collection, docs/gpu.md). With
``batched`` (the default where the simulator is on cuda) every member's envs act in one call of a
:class:`~vaco.data.policy_buffer.PopulationPolicy` (each env its own version's weights and
normaliser), the noise still drawn from each member's own generator in its solo order, and the
outcome is recorded for all members at once into one stacked buffer (each member's batch a view of
its rows), with each member's reward scaling and episode counters stacked for the rollout. The same
arithmetic per env, except that a member whose envs all hold one version takes a per-env product
where its solo run takes a plain one: equal to float rounding (``tests/test_warp.py`` on the CPU),
as a GPU run is to itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from vaco.data.collector_base import CollectorBase, Segment, StepBuffers, record_actions
from vaco.data.normalization import EPS, DeviceRewardScaler, merge_moments
from vaco.data.policy_buffer import PopulationPolicy

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
        batched: act and record for all members at once (see the module docstring); None: where
            the simulator is on cuda.
    """

    def __init__(self, collectors: Sequence[CollectorBase], stopped: set[int], batched: bool | None = None) -> None:
        if not shares_one_simulator(collectors):
            raise ValueError("Lockstep needs collectors whose envs are blocks of one simulator")
        self.collectors = list(collectors)
        self.stopped = stopped
        self.simulator = collectors[0].env.shared
        self.batched = self.simulator.device.type == "cuda" if batched is None else bool(batched)
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
        # batched: the members' reward scalers are the device one (stacked below) or none
        if (
            self.batched
            and going
            and all(type(c.reward_scaler) in (DeviceRewardScaler, type(None)) for c in collectors)
        ):
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
        obs = torch.cat([c._obs for c in members])
        buffers = StepBuffers.empty(T, obs.shape[0], obs.shape[-1], env.act_dim, obs.device)
        for i, m in enumerate(going):
            segments[m].buffers = buffers.rows(slice(i * n, (i + 1) * n))
        policy = PopulationPolicy.of([segments[m].policy for m in going])
        if policy is None:  # an actor without batched_forward: each member's own mixture, in turn
            policy = _Each([segments[m].policy for m in going], n)
        # the members' state, stacked for the rollout (written back at its end)
        ep_return = torch.cat([c._ep_return for c in members])
        ep_length = torch.cat([c._ep_length for c in members])
        scalers = [c.reward_scaler for c in members]
        scale = scalers[0] is not None
        if scale:
            returns = torch.stack([r.returns for r in scalers])  # [S, N]
            mean, var, count = (torch.stack([getattr(r, k) for r in scalers]) for k in ("mean", "var", "count"))
            gamma, clip = scalers[0].gamma, scalers[0].clip
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
            loc, sd = policy(obs)
            noise = torch.cat(
                [torch.randn(n, act_dim, generator=c.generator, dtype=torch.float32, device=c.device) for c in members]
            )
            action = record_actions(buffers, t, loc, sd, noise, env.action_low, env.action_high)
            if every:
                outcome = env.step(action)
            else:
                outcome = tuple(x[rows] for x in env.step(full.index_copy(0, rows, action)))
            # observe (CollectorBase.observe), every member's envs at once; each member's reward scale
            new_obs, reward, term, trunc, final_obs = outcome
            done = term | trunc
            buffers.next_obs[t] = final_obs
            ep_return += reward.double()
            ep_length += 1
            buffers.ep_returns[t] = ep_return
            buffers.ep_lengths[t] = ep_length
            ep_return.masked_fill_(done, 0.0)
            ep_length.masked_fill_(done, 0)
            if scale:  # DeviceRewardScaler per member: its own returns' moments, on the rows of [S, N]
                r = reward.reshape(-1, n)
                returns = returns * gamma * (~term.reshape(-1, n)).double() + r.double()
                batch_mean = returns.sum(1) / n
                batch_var = (returns - batch_mean.unsqueeze(1)).square().sum(1) / n
                mean, var, count = merge_moments(mean, var, count, batch_mean, batch_var, n)
                returns = returns.masked_fill(done.reshape(-1, n), 0.0)
                reward = (r.double() / (var.unsqueeze(1) + EPS).sqrt()).clamp(-clip, clip).float().view(-1)
            buffers.rewards[t] = reward
            buffers.terminated[t], buffers.truncated[t] = term, trunc
            obs = new_obs
        for i, c in enumerate(members):
            part = slice(i * n, (i + 1) * n)
            c._obs, c._ep_return, c._ep_length = obs[part].clone(), ep_return[part].clone(), ep_length[part].clone()
            if scale:
                c.reward_scaler.returns = returns[i].clone()
                c.reward_scaler.mean, c.reward_scaler.var, c.reward_scaler.count = (
                    mean[i].clone(),
                    var[i].clone(),
                    count[i].clone(),
                )
        return segments


class _Each:
    """Members' mixtures called one by one on their rows (actors without ``batched_forward``)."""

    def __init__(self, mixtures: list, n: int) -> None:
        self.mixtures, self.n = mixtures, n

    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs = [mix(obs[i * self.n : (i + 1) * self.n]) for i, mix in enumerate(self.mixtures)]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1].expand_as(o[0]) for o in outs])
