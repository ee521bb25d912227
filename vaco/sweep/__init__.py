"""``vaco sweep``: a grid of ``vaco fit`` runs, one MLflow run per cell, resumable.

    vaco sweep --config configs/sweeps/laptop.yaml [--jobs N] [--dry-run] [--only 'vaco-*']

A sweep file names an MLflow experiment, shared ``overrides`` of ``vaco fit`` fields, and one or
more grid ``blocks``; each block is a product over the axes ``algorithm`` (a configs/algo/*.yaml
name), ``env`` (a configs/env/*.yaml name), ``K`` (policy_buffer_size), ``delta`` (TV filter),
``rho_bar`` (V-trace), ``realign`` (V-trace instead of GAE, or back) and ``seed``. The sweep's
cells are the union of the blocks' cells, each cell once.

The rule for axes that do not apply: ``delta`` applies only to objectives with a TV threshold,
``rho_bar`` only to V-trace advantages (IMPALA's objective gets the same value), ``realign`` only
to objectives that do not re-estimate V-trace themselves (not IMPALA). An axis that does not apply
to a cell's algorithm is dropped from that cell, so it does not multiply it: ``{algorithm:
[vaco, ppo_clip], delta: [0.1, 0.2]}`` is three cells. A block whose axis applies to none of its
algorithms is an error. ``realign`` renames the algorithm: ``vaco`` without realignment is the
``vaco_no_realign`` cell; ``ppo_clip`` with it is ``ppo_clip+realign``.

Each cell is one ``vaco fit --config <out>/<cell>/config.yaml`` process with one torch thread,
logging one MLflow run tagged with its coordinates (``vaco.algorithm``, ``vaco.env``, ``vaco.K``,
``vaco.delta``, ``vaco.rho_bar``, ``vaco.realign``, ``vaco.seed``) and ``vaco.sweep.cell``. A
cell whose run FINISHED is skipped; a cell with ``<out>/<cell>/checkpoints/last.ckpt`` resumes
from it into the same MLflow run; a failed cell prints the end of its log and the others go on.
A cell's seeds run P at a time as one ``vaco fit --population`` process (:func:`pack`; ``population:
P``, or by default ``auto``: P by the cell's backend), each member still its own run (docs/sweeps.md).
"""

from vaco.sweep.grid import Algorithm, Block, Cell, PopulationCell, Sweep, cell_config, expand, pack
from vaco.sweep.loader import load_sweep, validate_with_cli
from vaco.sweep.schema import AXES, SweepError
from vaco.sweep.state import parent_run, plan, resolve_tracking_uri, sweep_runs
from vaco.sweep.sweep_cli import main
from vaco.tracking import CELL_TAG, PARENT_TAG, SETTINGS_TAG

__all__ = [
    "AXES",
    "Algorithm",
    "Block",
    "Cell",
    "PopulationCell",
    "Sweep",
    "SweepError",
    "cell_config",
    "expand",
    "pack",
    "load_sweep",
    "validate_with_cli",
    "parent_run",
    "plan",
    "resolve_tracking_uri",
    "sweep_runs",
    "main",
    "CELL_TAG",
    "PARENT_TAG",
    "SETTINGS_TAG",
]
