"""``ParallelRolloutDataModule``: actor processes spelt as a data module, from before collection
backends existed. Deprecated: write ``collection: {class_path: vaco.data.parallel.Actors}`` under
:class:`~vaco.data.RolloutDataModule` instead (docs/async.md). Kept so that old configs and
checkpoints keep working; it warns once per construction."""

from __future__ import annotations

import warnings
from typing import Any, Literal

from vaco._moved import REMOVED_IN
from vaco.data.datamodule import RolloutDataModule
from vaco.data.parallel.backend import Actors

__all__ = ["ParallelRolloutDataModule", "Actors"]

DEPRECATION = (
    "vaco.data.parallel.ParallelRolloutDataModule is deprecated: use data.class_path vaco.data.RolloutDataModule "
    "with data.init_args.collection.class_path vaco.data.parallel.Actors (the same run; docs/async.md); "
    f"it will be removed in vaco {REMOVED_IN}"
)


class ParallelRolloutDataModule(RolloutDataModule):
    """:class:`~vaco.data.RolloutDataModule` with ``collection: vaco.data.parallel.Actors``: the
    spelling of actor processes before collection backends existed, kept so that its configs and
    checkpoints keep working. Its actor arguments are :class:`Actors`'; the rest are
    :class:`~vaco.data.RolloutDataModule`'s. Its run definition is the new spelling's, so a run
    started with one spelling resumes with the other.
    """

    def __init__(
        self,
        num_envs: int = 2,
        num_workers: int = 2,
        mode: Literal["sync", "async"] = "sync",
        staleness_limit: int | None = None,
        backend: Literal["mp", "distributed"] = "mp",
        launcher: Literal["mp", "submitit", "submitit_delayed"] = "mp",
        tcp_port: int | None = None,
        **kwargs: Any,
    ) -> None:
        """``kwargs``: :class:`~vaco.data.RolloutDataModule`'s other arguments (LightningCLI reads
        them from there), but ``collection``."""
        warnings.warn(DEPRECATION, FutureWarning, stacklevel=2)
        if "collection" in kwargs:
            raise ValueError(
                "`data.collection`: ParallelRolloutDataModule is the actors backend; use RolloutDataModule"
            )
        actors = _DataFieldActors(num_workers, mode, staleness_limit, backend, launcher, tcp_port)
        super().__init__(num_envs=num_envs, collection=actors, **kwargs)

    # the actor settings, where this data module's callers have always read them
    num_workers = property(lambda self: self.collection.num_workers)
    mode = property(lambda self: self.collection.mode)
    backend = property(lambda self: self.collection.backend)
    staleness_limit = property(lambda self: self.collection.staleness_limit)


class _DataFieldActors(Actors):
    """:class:`Actors` whose fields are ``data.*`` (ParallelRolloutDataModule's own arguments)."""

    field_prefix = "data"

    def definition(self) -> dict[str, Any]:
        return {**super().definition(), "class_path": f"{Actors.__module__}.{Actors.__qualname__}"}
