"""The learner side: :class:`ActorPool`, W actor processes behind TorchRL's multi-process collectors.

``mode="sync"`` uses ``torchrl.collectors.MultiSyncCollector``: every iteration all actors step
their share of the envs with the current policy-version buffer, the learner waits for all of them
and gets one ``[num_envs, num_steps]`` batch (actor batches concatenated along the env dim), then
trains while the actors wait, then the new buffer is shipped before the next batch. This is the
single-process algorithm, with env stepping spread over processes.

``mode="async"`` uses ``torchrl.collectors.MultiAsyncCollector``: an actor hands over a batch and
immediately starts the next one with the newest buffer it has received, while the learner trains.
An iteration takes the first ``num_envs / envs_per_actor`` actor batches to arrive; their
``policy_version`` says how old the acting policy was, so policy lag arises on its own and the
learner's lag telemetry measures it. ``staleness_limit=M`` drops actor batches acting with a
version more than M updates old (the usual alternative to correcting for lag, as VACO does).

Weights travel with TorchRL's ``MultiProcessWeightSyncScheme``: the whole policy-version buffer
(the last K actors with their observation statistics and version ids) is the "policy" model, so
stale versions act with the normaliser they were trained with, exactly as in one process.
"""

from __future__ import annotations

import atexit
import copy
import functools
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from tensordict import TensorDictBase
from torchrl.collectors import BaseCollector, MultiSyncCollector

from vaco.data.parallel.actors import ActorCollector, ActorSpec, exit_with_parent
from vaco.data.parallel.torchrl_compat import (
    AckWithLivenessScheme,
    BackpressureMultiAsyncCollector,
    check_actors_alive,
    find_free_port,
    stop_weight_receivers,
)
from vaco.data.policy_buffer import PolicyVersionBuffer
from vaco.hints import shell

__all__ = ["ActorPool", "ActorFailure", "split_envs", "validate_mode"]

Mode = Literal["sync", "async"]
Backend = Literal["mp", "distributed"]


class ActorFailure(RuntimeError):
    """An actor process died or stopped answering; the run stops (the last checkpoint is kept)."""


def split_envs(num_envs: int, num_workers: int, field: str = "data.collection.num_workers") -> int:
    """Envs per actor; ``num_envs`` must split evenly so every actor batch has the same shape."""
    if not (isinstance(num_workers, int) and num_workers >= 1):
        raise ValueError(f"`{field}` must be an integer >= 1, got {num_workers!r}")
    if num_envs % num_workers:
        raise ValueError(
            f"`{field}` ({num_workers}) must divide `data.num_envs` ({num_envs}): every actor "
            "steps the same number of envs"
        )
    return num_envs // num_workers


def validate_backend(backend: str, launcher: str, prefix: str = "data.collection") -> None:
    if backend not in ("mp", "distributed"):
        raise ValueError(f"`{prefix}.backend` must be 'mp' or 'distributed', got {backend!r}")
    if launcher not in ("mp", "submitit", "submitit_delayed"):
        raise ValueError(f"`{prefix}.launcher` must be 'mp', 'submitit' or 'submitit_delayed', got {launcher!r}")


def validate_mode(mode: str, staleness_limit: int | None, prefix: str = "data.collection") -> None:
    if mode not in ("sync", "async"):
        raise ValueError(f"`{prefix}.mode` must be 'sync' or 'async', got {mode!r}")
    if staleness_limit is not None and mode != "async":
        raise ValueError(f"`{prefix}.staleness_limit` only applies to `{prefix}.mode: async`")
    if staleness_limit is not None and not (isinstance(staleness_limit, int) and staleness_limit >= 0):
        raise ValueError(f"`{prefix}.staleness_limit` must be an integer >= 0 or null, got {staleness_limit!r}")


class ActorPool(BaseCollector):
    """W actor processes collecting ``[num_envs, num_steps]`` batches for the learner.

    Args:
        specs: one :class:`ActorSpec` per actor process.
        policy_buffer: the learner's policy-version buffer; shipped to the actors by :meth:`sync_weights`.
        num_iterations: batches to yield in all (a resumed pool yields the rest).
        mode: ``"sync"`` or ``"async"``.
        staleness_limit: async only: drop actor batches whose oldest acting version is more
            than this many versions behind the learner (``None``: keep everything).
        backend: ``"mp"``: actor processes on this host, TorchRL's ``MultiSyncCollector`` /
            ``MultiAsyncCollector`` (pipes, shared memory). ``"distributed"``: actors are ranks of
            a torch.distributed (gloo) group, possibly on other hosts, TorchRL's ``DistributedCollector``.
        launcher: ``"distributed"`` only: how the actor ranks start (TorchRL's launchers):
            ``"mp"`` (local processes over TCP), ``"submitit"`` (SLURM jobs),
            ``"submitit_delayed"`` (started by the cluster, see :func:`~vaco.data.parallel.distributed.run_remote_actor`).
        tcp_port: ``"distributed"`` only: the learner's port (ports +1 and +2 are used too);
            default: a free port.
    """

    def __init__(
        self,
        specs: Sequence[ActorSpec],
        policy_buffer: PolicyVersionBuffer | None,
        num_iterations: int,
        *,
        mode: Mode = "sync",
        staleness_limit: int | None = None,
        backend: Backend = "mp",
        launcher: str = "mp",
        tcp_port: int | None = None,
    ) -> None:
        super().__init__()
        validate_mode(mode, staleness_limit)
        validate_backend(backend, launcher)
        shapes = {(s.num_envs, s.num_steps) for s in specs}
        if len(shapes) != 1:
            raise ValueError(f"all actors must step the same number of envs and steps, got {sorted(shapes)}")
        self.specs = list(specs)
        self.policy_buffer = policy_buffer
        self.num_iterations = num_iterations
        self.mode = mode
        self.staleness_limit = staleness_limit
        self.backend, self.launcher, self.tcp_port = backend, launcher, tcp_port
        self.trajs_per_batch = None
        self.envs_per_actor, self.num_steps = shapes.pop()
        self.num_envs = self.envs_per_actor * len(self.specs)
        self.frames_per_batch = self.num_envs * self.num_steps
        self.iteration = 0
        self.last_collect_seconds = 0.0
        self.dropped_batches = 0  # async + staleness_limit: actor batches discarded as too old
        self.collector: MultiSyncCollector | BackpressureMultiAsyncCollector | None = None
        self._stream: Iterator[TensorDictBase] | None = None
        self._pending_state: dict | None = None
        self.last_checkpoint: Callable[[], str] | None = None  # named in the error if an actor dies
        self._saved_env: dict[str, str | None] = {}

    @property
    def num_workers(self) -> int:
        return len(self.specs)

    # ------------------------------------------------------------------ processes
    def start(self) -> None:
        """Start the actor processes (they receive the current buffer while starting)."""
        if self.collector is not None:
            return
        if self.policy_buffer is None or self.policy_buffer.size == 0:
            raise RuntimeError("the policy buffer is empty: push the initial policy before starting the actors")
        threads = torch.get_num_threads()
        buffer = self.policy_buffer
        factory = functools.partial(
            PolicyVersionBuffer, copy.deepcopy(buffer.template), buffer.obs_mean.shape[-1], buffer.capacity
        )
        common: dict[str, Any] = dict(
            policy=buffer,  # only where the scheme reads the weights from; actors build their own
            policy_factory=[factory] * self.num_workers,
            total_frames=-1,
            collector_class=ActorCollector,
            use_buffers=True,
            num_threads=threads,  # TorchRL would otherwise resize this process's thread pool
            num_sub_threads=1,  # one torch thread per actor: they step envs, the net is tiny
            weight_sync_schemes={"policy": AckWithLivenessScheme()},
            init_fn=functools.partial(exit_with_parent, os.getpid()),
        )
        try:
            if self.backend == "distributed":
                self.collector = self._distributed_collector(factory)
            elif self.mode == "sync":
                self.collector = MultiSyncCollector(
                    self.specs,
                    frames_per_batch=[s.num_envs * s.num_steps for s in self.specs],
                    cat_results=0,  # concatenate along the env dim: [num_envs, num_steps]
                    **common,
                )
            else:
                self.collector = BackpressureMultiAsyncCollector(
                    self.specs, frames_per_batch=self.envs_per_actor * self.num_steps, **common
                )
        finally:
            torch.set_num_threads(threads)
        # an exception outside Lightning (a script, a test) must not leave the interpreter joining
        # actors forever at exit: shut them down first (atexit runs handlers last-in, first-out)
        atexit.register(self.shutdown)
        if self._pending_state is not None:
            self.collector.load_state_dict(self._pending_state)
            self._pending_state = None

    def _distributed_collector(self, factory):
        from torchrl.weight_update import DistributedWeightSyncScheme

        from vaco.data.parallel.distributed import VacoDistributedCollector

        sync = self.mode == "sync"
        # DistributedCollector exports MASTER_ADDR/MASTER_PORT for its group; put them back at shutdown
        self._saved_env = {key: os.environ.get(key) for key in ("MASTER_ADDR", "MASTER_PORT")}
        return VacoDistributedCollector(
            self.specs,
            policy=self.policy_buffer,
            policy_factory=[factory] * self.num_workers,
            frames_per_batch=self.frames_per_batch if sync else self.envs_per_actor * self.num_steps,
            # torchrl 0.14's DistributedCollector loops `while frames < total_frames` without turning
            # the documented "endless" -1 into infinity, so -1 yields nothing: use a huge budget
            total_frames=sys.maxsize,
            collector_class=ActorCollector,
            sync=sync,
            launcher=self.launcher,
            backend="gloo",
            tcp_port=self.tcp_port or find_free_port(),
            weight_sync_schemes={"policy": DistributedWeightSyncScheme(backend="gloo", sync=True)},
        )

    def _procs(self) -> list:
        if self.collector is None:
            return []
        return self.collector.alive_jobs() if self.backend == "distributed" else self.collector.procs

    def sync_weights(self) -> None:
        """Ship the policy buffer to every actor; returns once all have it."""
        if self.collector is None:
            return
        self._check_actors()
        try:
            self.collector.update_policy_weights_(self.policy_buffer)
        except RuntimeError as err:
            raise self._failure(err) from err

    def _check_actors(self) -> None:
        try:
            if self.backend == "distributed":
                self.collector.raise_if_rank_died()
            else:
                check_actors_alive(self.collector.procs)
        except RuntimeError as err:
            raise self._failure(err) from err

    def _failure(self, err: BaseException) -> ActorFailure:
        # TorchRL's message names the worker and its exit code ("worker 1 (exit code -9)")
        path = self.last_checkpoint() if self.last_checkpoint is not None else ""
        return ActorFailure(
            f"an actor process stopped: {err} The run stops here and the other actors are shut down. "
            f"The last checkpoint is intact: resume with `--ckpt_path {shell(path) if path else '<checkpoint dir>/last.ckpt'}`."
        )

    # ------------------------------------------------------------------ iteration
    def __len__(self) -> int:
        return self.num_iterations

    def iterator(self) -> Iterator[TensorDictBase]:
        self.start()
        # local actors got the buffer while starting, but DistributedCollector ranks build their
        # collector before they connect: ship it once more before the first batch
        self.sync_weights()
        if self._stream is None:
            self._stream = iter(self.collector)
        while self.iteration < self.num_iterations:
            start = time.perf_counter()
            batch = self._next_sync() if self.mode == "sync" else self._next_async()
            self.last_collect_seconds = time.perf_counter() - start
            self.iteration += 1
            yield batch

    def _next_from_stream(self) -> TensorDictBase:
        try:
            return next(self._stream)
        except RuntimeError as err:  # TorchRL reports a dead worker as a RuntimeError
            raise self._failure(err) from err

    def _next_sync(self) -> TensorDictBase:
        batch = self._next_from_stream()
        if batch.ndim == 3:  # DistributedCollector stacks the ranks' batches: [ranks, envs, steps]
            batch = torch.cat(batch.unbind(0), 0)
        return batch.exclude("collector")

    def _next_async(self) -> TensorDictBase:
        version = self.policy_buffer.newest_version
        parts: list[TensorDictBase] = []
        while len(parts) * self.envs_per_actor < self.num_envs:
            part = self._next_from_stream()
            if self.staleness_limit is not None and version - int(part["policy_version"].min()) > self.staleness_limit:
                self.dropped_batches += 1
                continue
            parts.append(part.exclude("collector"))
        return torch.cat(parts, 0) if len(parts) > 1 else parts[0]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> OrderedDict:
        """Sync mode: every actor's exact state (envs, RNG, reward scaler) for a bit-exact resume.

        Async mode: only counters. Actors are mid-rollout and TorchRL's async worker drops a batch
        when it is asked for its state, so a resumed async run starts the actors' envs afresh.
        Same for ``backend="distributed"`` (TorchRL's ``DistributedCollector`` has no state_dict).
        """
        state = OrderedDict(iteration=self.iteration, dropped_batches=self.dropped_batches, mode=self.mode)
        if self.mode == "sync" and self.backend == "mp" and self.collector is not None:
            state["actors"] = self.collector.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict.get("mode", self.mode) != self.mode:
            raise ValueError(
                f"the checkpoint was collected with `data.mode: {state_dict['mode']}`, this run uses {self.mode!r}"
            )
        self.iteration = int(state_dict["iteration"])
        self.dropped_batches = int(state_dict.get("dropped_batches", 0))
        actors = state_dict.get("actors")
        if actors is None:
            return
        saved = sum(1 for key in actors if str(key).startswith("worker"))
        if saved != self.num_workers:
            raise ValueError(f"the checkpoint holds {saved} actor states but `data.num_workers` is {self.num_workers}")
        if self.collector is None:
            self._pending_state = actors
        else:
            self.collector.load_state_dict(actors)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        raise NotImplementedError("actor seeds are fixed by their ActorSpec (see vaco.data.parallel.actor_seed)")

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        """Stop the actor processes (idempotent). TorchRL closes, then terminates, then kills them."""
        collector, self.collector, self._stream = self.collector, None, None
        if collector is None:
            return
        atexit.unregister(self.shutdown)
        threads = torch.get_num_threads()
        local = collector.alive_jobs() if self.backend == "distributed" else []
        try:
            if self.backend == "distributed":
                stop_weight_receivers(collector)
                collector.shutdown(timeout=timeout)
            else:
                collector.shutdown(timeout=timeout, raise_on_error=raise_on_error)
        except Exception:
            if raise_on_error:
                raise
        finally:
            torch.set_num_threads(threads)  # TorchRL resizes the pool on shutdown
            for job in local:  # DistributedCollector joins its local ranks but never kills them
                job.join(timeout=5)
                if job.is_alive():
                    job.kill()
            for key, value in self._saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def actor_pids(self) -> list[int]:
        return [p.pid for p in self._procs()]
