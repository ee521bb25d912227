"""Collection in actor processes: TorchRL's multi-process collectors driving vaco's rollout collector.

* :class:`ActorCollector` (actors.py): the collector TorchRL builds in each worker process;
* :class:`ActorPool` (pool.py): W actors behind ``MultiSyncCollector`` / ``MultiAsyncCollector``,
  with the policy-version buffer shipped by TorchRL's weight-sync scheme;
* :class:`Actors` (backend.py): the collection backend (``data.collection``), ``mode: sync | async``.

See docs/async.md. Imports are lazy: an actor process needs only actors.py (no Lightning).
"""

import importlib

__all__ = [
    "Actors",
    "ActorCollector",
    "ActorFailure",
    "ActorPool",
    "ActorSpec",
    "actor_seed",
    "split_envs",
]

_WHERE = {
    "ActorCollector": "actors",
    "ActorSpec": "actors",
    "actor_seed": "actors",
    "ActorFailure": "pool",
    "ActorPool": "pool",
    "split_envs": "pool",
    "Actors": "backend",
}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"vaco.data.parallel.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'vaco.data.parallel' has no attribute {name!r}")
