"""The launcher seam: one abstract :class:`Launcher` that every way of running a sweep's cells
inherits, and the registry ``vaco sweep`` chooses from.

Modelled on submitit's ``Executor``: the base owns the flow and a launcher fills in submission and
state. ``vaco sweep`` plans (loads the file, checks the store and every cell's config, finds each
cell's state), builds the launcher the file or ``--launcher`` names with :meth:`Launcher.from_args`,
asks it :meth:`~Launcher.job_states` (``--status``) and :meth:`~Launcher.describe` (``--dry-run``),
then, under the sweep's lock and parent run, :meth:`~Launcher.check_ready` and
:meth:`~Launcher.launch` with the cells that have not finished. Whatever a launcher is, each cell
it runs is :func:`vaco.sweep.cells.run_cell` on some host, which resumes the cell from its
checkpoint, so a requeue or a retry continues the same MLflow run.

A new launcher is one class: subclass :class:`Launcher` and implement :meth:`~Launcher.launch`
(and whatever of the rest it needs). The sweep file's ``launcher`` (and ``--launcher``) takes a
built-in's name (:data:`BUILTIN`, the registry) or a class path (``my_launchers.DaskLauncher``), so
a launcher in a user's own module needs no edit of vaco.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from vaco.sweep.grid import Cell, Sweep
from vaco.sweep.schema import SweepError, import_class

__all__ = ["BUILTIN", "Launcher", "launcher_class", "launcher_names"]

#: the registry: name -> class path of the built-in launchers (imported when chosen, so that
#: submitit and Ray load only for a sweep that uses them); any other Launcher is named by class path
BUILTIN = {
    "local": "vaco.sweep.local_launcher.LocalLauncher",
    "slurm": "vaco.sweep.slurm_launcher.SlurmLauncher",
    "ray": "vaco.sweep.ray_launcher.RayLauncher",
}


class Launcher(ABC):
    """Base of the sweep launchers.

    Args:
        sweep: the loaded sweep (its output folder, experiment, algorithms).
        tracking_uri: the MLflow store every cell logs to (it may hold credentials: never written
            into a file a job reads; a launcher passes it through the job's environment).
        resources: the sweep file's ``resources`` merged with the command line's.
    """

    #: a short name for messages (the built-ins: their key in :data:`BUILTIN`)
    name: ClassVar[str] = ""
    #: built for ``--dry-run`` and ``--status`` too: it answers about jobs it submitted earlier
    #: (SLURM asks the scheduler); others are built only to run
    answers_status: ClassVar[bool] = False

    def __init__(self, sweep: Sweep, tracking_uri: str, resources: dict) -> None:
        self.sweep, self.uri, self.resources = sweep, tracking_uri, resources
        #: after :meth:`launch` returned 0: the cells were handed over and finish after ``vaco
        #: sweep`` has returned (a SLURM submission without ``--wait``): the parent run stays RUNNING
        self.detached = False
        #: called with no arguments in the launcher's own process after each cell (or population)
        #: that finished, if the launcher sees it finish (the local and Ray ones do): `vaco sweep
        #: --save-data` keeps the runs so far there. A launcher whose cells finish elsewhere may ignore it
        self.on_cell_done: Callable[[], None] | None = None

    # ------------------------------------------------------------------ what a launcher provides
    @classmethod
    def add_arguments(cls, group) -> None:
        """Add this launcher's own ``vaco sweep`` flags (``--ray-address``) to ``group`` (an
        ``argparse`` argument group); none by default."""
        return None

    @classmethod
    def prestart(cls, args: argparse.Namespace):
        """Start something slow while ``vaco sweep`` checks its plan, for :meth:`from_args` to take
        from ``args.prestarted`` (the local launcher's zygote); an object with ``close()``, or None.
        Called for the launcher the command line names (local if none) before the file is read."""
        return None

    @classmethod
    def from_args(cls, sweep: Sweep, tracking_uri: str, resources: dict, args: argparse.Namespace) -> Launcher:
        """Build the launcher from ``vaco sweep``'s arguments (its own flags among them); take
        ``args.prestarted`` (set it to None) if it is yours. Raise a RuntimeError or SweepError
        with one line (a missing package, an unreachable cluster) before any cell starts."""
        return cls(sweep, tracking_uri, resources)

    @abstractmethod
    def launch(self, cells: list[Cell]) -> int:
        """Run or submit ``cells`` (none of them finished); return 0, 1 if a cell failed, 130 if
        stopped by a signal. Set :attr:`detached` where the cells outlive the call."""

    def job_states(self) -> dict[str, str]:
        """Cell id -> scheduler state (PENDING, RUNNING, ...) of jobs from an earlier submission
        that are still queued or running; ``--status`` shows them and :meth:`launch` must not
        start those cells again. None by default (a launcher whose cells die with it)."""
        return {}

    def check_ready(self) -> None:
        """Last checks before :meth:`launch`, under the sweep's lock (SLURM: no job of this sweep
        that nothing records, the scheduler answers); raise RuntimeError with one line."""
        return None

    def describe(self, cells: list[Cell], states: dict[str, str]) -> str | None:
        """Extra ``--dry-run`` lines (SLURM: the job arrays and their sbatch script)."""
        return None

    def close(self) -> None:
        """Release what the launcher holds when ``vaco sweep`` ends without launching."""
        return None


def launcher_names() -> list[str]:
    """The built-in launchers' names."""
    return sorted(BUILTIN)


def launcher_class(value: str, where: str = "launcher") -> type[Launcher]:
    """The class a sweep file's ``launcher`` names: a built-in's name or a class path."""
    if not isinstance(value, str) or not value:
        raise SweepError(f"`{where}` must be a launcher name ({', '.join(launcher_names())}) or a class path")
    value = BUILTIN.get(value, value)
    if "." not in value:
        raise SweepError(f"`{where}` must be one of {', '.join(launcher_names())} or a class path, got {value!r}")
    found = import_class(value, where)
    if not (isinstance(found, type) and issubclass(found, Launcher)):
        raise SweepError(f"`{where}`: {value!r} is not a vaco.sweep.launcher.Launcher")
    return found
