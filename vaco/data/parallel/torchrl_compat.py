"""Every use of TorchRL's private names by the learner side, in one place, behind a version check.

``ActorPool`` (pool.py) drives TorchRL's public multi-process collectors, but three fixes need
TorchRL internals that have no public API in torchrl 0.14:

* noticing a dead actor while waiting: the weight-sync scheme's ``_wait_for_ack`` / ``_ack_queues``
  (the check of the processes themselves is written here: TorchRL's ``_check_for_faulty_process``
  closes a sibling that is still running and raises from that race);
* back-pressure for the async collector: its output queue length, ``_queue_len``;
* stopping the weight receivers of distributed actors: ``_weight_sync_schemes`` and
  ``_send_instruction("stop")``.

(``distributed.py`` subclasses ``DistributedCollector`` for its receive buffers; it is the
adapter for that collector and checks the version the same way.) On a TorchRL version these were
not tested against, importing this module fails with a message saying so, rather than a run
failing in the middle with an ``AttributeError``.
"""

from __future__ import annotations

import queue
import socket

import torchrl
from torchrl.collectors import MultiAsyncCollector
from torchrl.weight_update import MultiProcessWeightSyncScheme

__all__ = [
    "TESTED_TORCHRL",
    "check_torchrl_version",
    "check_actors_alive",
    "find_free_port",
    "AckWithLivenessScheme",
    "BackpressureMultiAsyncCollector",
    "stop_weight_receivers",
]

TESTED_TORCHRL = ("0.14",)


def check_torchrl_version(version: str = torchrl.__version__) -> None:
    if not version.startswith(TESTED_TORCHRL):
        raise ImportError(
            f"vaco's actor processes use TorchRL internals tested on torchrl {', '.join(TESTED_TORCHRL)}.x; "
            f"this is torchrl {version}. Install torchrl>=0.14,<0.15 (pyproject.toml pins it) or use the "
            "in-process collector (vaco.data.RolloutDataModule)"
        )


check_torchrl_version()


def check_actors_alive(procs, grace: float = 5.0) -> None:
    """Raise TorchRL's RuntimeError naming the worker and its exit code if an actor process died,
    after stopping its siblings. TorchRL's ``_check_for_faulty_process`` terminates a sibling, waits
    0.1 s and calls ``close()``, which raises "Cannot close a process while it is still running" when
    the sibling takes longer to exit (a race a test met): here each sibling is terminated, joined
    (``grace`` seconds, then killed and joined), and only then closed."""
    dead = next(((i, p) for i, p in enumerate(procs) if not p._closed and not p.is_alive()), None)
    if dead is None:
        return
    index, proc = dead
    failed = f"worker {index} (exit code {proc.exitcode})"
    for other in procs:
        if other._closed:
            continue
        if other.is_alive():
            other.terminate()
            other.join(grace)
            if other.is_alive():
                other.kill()
                other.join(grace)
        if not other.is_alive():
            other.close()
    raise RuntimeError(f"At least one process failed: {failed}. Check for more infos in the log.")


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_weight_receivers(collector) -> None:
    """Tell distributed actors' weight-receiver threads to stop (they block on the scheme's
    TCPStore; without it they are still blocked when the learner's store closes, and abort)."""
    for scheme in (getattr(collector, "_weight_sync_schemes", None) or {}).values():
        scheme._send_instruction("stop")


class AckWithLivenessScheme(MultiProcessWeightSyncScheme):
    """TorchRL's queue-based scheme, but waiting for acknowledgements notices dead actors.

    torchrl 0.14's ``MultiProcessWeightSyncScheme.send`` waits for each worker's ack with
    ``queue.get(timeout=None)``: if an actor has died, the learner blocks forever. Here the wait
    polls and checks the worker processes in between, so a crash surfaces as an error.
    """

    _POLL_SECONDS = 1.0

    def _wait_for_ack(self, worker_ids=None, timeout=None) -> None:
        targets = (
            list(self._ack_queues)
            if worker_ids is None
            else ([worker_ids] if isinstance(worker_ids, int) else list(worker_ids))
        )
        procs = getattr(self.context, "procs", ())
        for worker in targets:
            while True:
                try:
                    self._ack_queues[worker].get(timeout=self._POLL_SECONDS)
                    break
                except queue.Empty:
                    check_actors_alive(procs)


class BackpressureMultiAsyncCollector(MultiAsyncCollector):
    """``MultiAsyncCollector`` whose output queue holds one batch per worker.

    In torchrl 0.14 the queue holds a single batch; a worker that finishes while it is full waits
    1 s, then throws its batch away and collects another. With a learner slower than the actors
    (the usual case) the actors then burn CPU on data nobody trains on. A worker never has more
    than one undelivered batch (it waits for "continue" after delivering), so a queue of
    ``num_workers`` never fills: each actor runs at most one batch ahead, then waits.
    """

    @property
    def _queue_len(self) -> int:
        return self.num_workers
