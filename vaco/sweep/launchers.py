"""How a sweep's cells run: one cell is one ``vaco fit`` process, whatever launches it.

* ``local``: :class:`~vaco.sweep.local_launcher.LocalLauncher`, ``jobs`` processes at a time here.
* ``slurm``: :class:`~vaco.sweep.slurm_launcher.SlurmLauncher`, one submitit job array per sweep.
* ``ray``: :class:`~vaco.sweep.ray_launcher.RayLauncher`, one Ray task per cell.

Each inherits :class:`vaco.sweep.launcher.Launcher` (the seam: a new launcher is one subclass) and
runs :func:`vaco.sweep.cells.run_cell`, which decides at start whether the cell resumes (its
``last.ckpt`` exists) or starts afresh, so a requeued SLURM job or a retried Ray task resumes from
its checkpoint into the same MLflow run.

Importing this module registers the built-ins. It also keeps the names older code and pickles
use: a SLURM job submitted by an earlier vaco pickled ``vaco.sweep.launchers.CellJob``.
"""

from __future__ import annotations

from vaco.sweep.cells import cell_command, cell_env, prepare_cell, run_cell, say, see_results
from vaco.sweep.launcher import Launcher, launcher_class
from vaco.sweep.local_launcher import LocalLauncher
from vaco.sweep.ray_launcher import RayLauncher, check_ray_address, run_cell_task
from vaco.sweep.slurm_launcher import CellJob, SlurmLauncher, max_array_size

__all__ = [
    "CellJob",
    "Launcher",
    "LocalLauncher",
    "RayLauncher",
    "SlurmLauncher",
    "cell_command",
    "cell_env",
    "check_ray_address",
    "launcher_class",
    "max_array_size",
    "prepare_cell",
    "run_cell",
    "run_cell_task",
    "say",
    "see_results",
]
