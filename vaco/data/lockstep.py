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
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from vaco.data.collector_base import CollectorBase

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
    """

    def __init__(self, collectors: Sequence[CollectorBase], stopped: set[int]) -> None:
        if not shares_one_simulator(collectors):
            raise ValueError("Lockstep needs collectors whose envs are blocks of one simulator")
        self.collectors = list(collectors)
        self.stopped = stopped
        self.simulator = collectors[0].env.shared
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
        segments = {m: collectors[m].begin_rollout() for m in going}
        steps = {c.num_steps for c in collectors}
        if len(steps) != 1:
            raise ValueError(f"the members' collectors step different segment lengths: {sorted(steps)}")
        env = self.simulator
        idle = {
            m: torch.zeros(c.num_envs, env.act_dim, device=c.device).clamp(env.action_low, env.action_high)
            for m, c in enumerate(collectors)
            if m not in segments
        }
        for t in range(steps.pop()):
            actions = [collectors[m].act(segments[m], t) if m in segments else idle[m] for m in range(len(collectors))]
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
