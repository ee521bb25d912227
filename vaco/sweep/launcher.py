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

A new launcher is one class: subclass :class:`Launcher`, give it a ``name``, implement
:meth:`~Launcher.launch` (and whatever of the rest it needs); defining the class registers it. The
sweep file's ``launcher`` takes a registered name or a class path (``my_launchers.DaskLauncher``),
so a launcher in a user's own module needs no edit of vaco.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from typing import ClassVar

from vaco.sweep.grid import Cell, Sweep
from vaco.sweep.schema import SweepError, import_class

__all__ = ["BUILTIN", "Launcher", "launcher_class", "launcher_names"]

#: name -> class of every launcher defined so far (the built-ins register when vaco.sweep.launchers loads)
_REGISTRY: dict[str, type[Launcher]] = {}
BUILTIN = ("local", "slurm", "ray")  # what `vaco sweep --help` lists; each is a Launcher subclass


class Launcher(ABC):
    """Base of the sweep launchers.

    Args:
        sweep: the loaded sweep (its output folder, experiment, algorithms).
        tracking_uri: the MLflow store every cell logs to (it may hold credentials: never written
            into a file a job reads; a launcher passes it through the job's environment).
        resources: the sweep file's ``resources`` merged with the command line's.
    """

    #: the sweep file's ``launcher`` value that picks this class
    name: ClassVar[str] = ""
    #: built for ``--dry-run`` and ``--status`` too: it answers about jobs it submitted earlier
    #: (SLURM asks the scheduler); others are built only to run
    answers_status: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            _REGISTRY[cls.name] = cls

    def __init__(self, sweep: Sweep, tracking_uri: str, resources: dict) -> None:
        self.sweep, self.uri, self.resources = sweep, tracking_uri, resources
        #: after :meth:`launch` returned 0: the cells were handed over and finish after ``vaco
        #: sweep`` has returned (a SLURM submission without ``--wait``): the parent run stays RUNNING
        self.detached = False

    # ------------------------------------------------------------------ what a launcher provides
    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add this launcher's own ``vaco sweep`` flags (``--ray-address``); none by default."""
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
    """The registered names (the built-ins and any launcher module imported so far)."""
    import vaco.sweep.launchers  # noqa: F401 - registers the built-ins

    return sorted(_REGISTRY)


def launcher_class(value: str, where: str = "launcher") -> type[Launcher]:
    """The class a sweep file's ``launcher`` names: a registered name or a class path."""
    if not isinstance(value, str) or not value:
        raise SweepError(f"`{where}` must be a launcher name ({', '.join(launcher_names())}) or a class path")
    if value in launcher_names():
        return _REGISTRY[value]
    if "." not in value:
        raise SweepError(f"`{where}` must be one of {', '.join(launcher_names())} or a class path, got {value!r}")
    found = import_class(value, where)
    if not (isinstance(found, type) and issubclass(found, Launcher)):
        raise SweepError(f"`{where}`: {value!r} is not a vaco.sweep.launcher.Launcher")
    return found
