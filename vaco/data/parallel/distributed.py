"""Actors on other hosts: TorchRL's ``DistributedCollector`` (torch.distributed, gloo) driving ActorCollector.

The learner is rank 0 of a torch.distributed group whose other ranks are actor processes, one
:class:`~vaco.data.parallel.actors.ActorCollector` each, anywhere on the network. Batches travel
with ``TensorDict.isend``/``irecv``, the policy-version buffer with TorchRL's
``DistributedWeightSyncScheme``, instructions through a ``TCPStore``: nothing here is vaco's own
transport. ``launcher="mp"`` starts the actors as local processes that connect over TCP (what the
tests do, over localhost); ``launcher="submitit"`` submits them as SLURM jobs;
``launcher="submitit_delayed"`` expects them to be started by the cluster (``srun``) with
:func:`run_remote_actor`. See docs/async.md.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import torch
from torchrl.collectors.distributed import DistributedCollector

from vaco.data.parallel.actors import ActorCollector
from vaco.data.parallel.torchrl_compat import check_torchrl_version

check_torchrl_version()

__all__ = ["VacoDistributedCollector", "run_remote_actor"]


class VacoDistributedCollector(DistributedCollector):
    """``DistributedCollector`` whose receive buffers are shaped by an :class:`ActorCollector` batch.

    torchrl 0.14's ``DistributedCollector._make_container`` builds the learner's receive buffers
    by running one batch of TorchRL's own ``Collector`` on the env factory, whatever
    ``collector_class`` the remote ranks use; that only works for TorchRL ``EnvBase`` envs. Here
    the template batch comes from the collector class the ranks actually run.
    """

    def _make_container(self) -> None:
        policy = self.policy
        local = ActorCollector(self.env_constructors[0], policy_factory=lambda: copy.deepcopy(policy))
        try:
            data = local.rollout().clone()
        finally:
            local.shutdown()
        # from here on as in DistributedCollector._make_container
        out = data.expand((self.num_workers, *data.shape)).clone().to_lazystack(0)
        if self._sync:
            out.lock_()
            self._tensordict_out = out
            self._tensordict_out_unbind = out.unbind(0)
            for td in self._tensordict_out_unbind:
                td.lock_()
        else:
            self._tensordict_out = out.unbind(0)
            for td in self._tensordict_out:
                td.lock_()

    def alive_jobs(self) -> list[Any]:
        """Local actor processes (``launcher="mp"``); remote jobs are not visible from here."""
        return list(self.jobs) if self.launcher == "mp" else []

    def raise_if_rank_died(self) -> None:
        """Raise (as TorchRL's multi-process collectors do) if a local rank has exited."""
        for i, job in enumerate(self.alive_jobs()):
            if job.exitcode is not None:
                raise RuntimeError(f"At least one process failed: rank {i + 1} (exit code {job.exitcode}).")

    def shutdown(self, timeout: float | None = None) -> None:
        """``DistributedCollector.shutdown``, unless a local rank died: torchrl 0.14 then waits for
        the dead rank's "down" (10 s), raises, and leaves the other ranks running. Here the
        surviving local ranks are killed and the group is torn down."""
        if getattr(self, "_shutdown", False):
            return
        if not any(job.exitcode is not None for job in self.alive_jobs()):
            return super().shutdown(timeout)
        self._shutdown = True
        for job in self.alive_jobs():
            if job.exitcode is None:
                job.kill()
                job.join(5)
        for scheme in (self._weight_sync_schemes or {}).values():
            scheme.shutdown()
        self._weight_sync_schemes = None
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def _next_async(self, total_frames, trackers):
        """``DistributedCollector._next_async`` (without the automatic weight-update options vaco
        does not use), but a local rank that died stops the run instead of hanging it.

        torchrl 0.14 polls the ranks' "done" flags forever (a dead rank never sets it) and leaves
        the flag set after taking the batch. Here the flag is removed once the batch is taken, so
        "done" always means a batch has been sent and the blocking receive completes; in between
        polls the local ranks (launcher "mp") are checked. (gloo's receive cannot be polled:
        ``is_completed()`` turns true only inside ``wait()``, and a timed-out ``wait()`` closes the
        connection; so sync mode, which waits for all ranks, still hangs on a dead rank.)
        """
        while True:
            for i in range(self.num_workers):
                key = f"NODE_{i + 1}_status"
                if self._store.check([key]) and self._store.get(key) == b"done":
                    self._store.delete_key(key)
                    for work in trackers[i]:
                        work.wait()
                    data = self._tensordict_out[i].clone()
                    return data, total_frames + data.numel(), i
            self.raise_if_rank_died()
            time.sleep(1e-3)


def run_remote_actor(rank: int, world_size: int, learner_host: str, tcp_port: int, backend: str = "gloo") -> None:
    """Entry point of an actor started by the cluster (``launcher="submitit_delayed"``).

    Joins the learner's torch.distributed group as ``rank`` (1 .. world_size - 1), receives its
    ActorSpec, policy factory and weight-sync scheme from the learner, and collects until told to stop.
    """
    from torchrl.collectors.distributed.generic import _distributed_init_delayed

    torch.set_num_threads(1)
    _distributed_init_delayed(rank, backend, learner_host, tcp_port, world_size)


def main(argv: list[str] | None = None) -> None:
    """``python -m vaco.data.parallel.distributed --rank R --world-size W --learner-host H --tcp-port P``."""

    parser = argparse.ArgumentParser(description=run_remote_actor.__doc__)
    parser.add_argument("--rank", type=int, required=True, help="1 .. world_size - 1 (the learner is 0)")
    parser.add_argument("--world-size", type=int, required=True, help="actors + 1")
    parser.add_argument("--learner-host", required=True)
    parser.add_argument("--tcp-port", type=int, required=True, help="the learner's `data.tcp_port`")
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args(argv)
    if not 1 <= args.rank < args.world_size:
        parser.error(f"--rank must be in 1 .. {args.world_size - 1}, got {args.rank}")
    run_remote_actor(args.rank, args.world_size, args.learner_host, args.tcp_port, args.backend)


if __name__ == "__main__":
    main()
