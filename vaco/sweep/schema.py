"""The sweep file's vocabulary: its fields, the reserved config keys, the launchers and their
resources, and the checks on free strings that reach job scripts. Imports nothing of vaco's
sweep package (the loader, the grid and the launchers all read it)."""

from __future__ import annotations

import importlib
import re

__all__ = [
    "AXES",
    "RESOURCE_FIELDS",
    "SweepError",
    "check_resources",
    "check_text",
    "import_class",
]

AXES = ("algorithm", "env", "K", "realign", "seed")  # and each axis an objective or advantage declares
TOP_FIELDS = (
    "experiment",
    "output_dir",
    "jobs",
    "population",
    "plan",
    "configs_dir",
    "overrides",
    "defaults",
    "grid",
    "description",
    "launcher",
    "resources",
)
AXIS_DEFAULTS = {"K": [1], "seed": [1]}
LOGGER_CLASS = "vaco.run.logger.VacoMLFlowLogger"
# fields a cell's coordinates or the sweep itself set; an override of them is an error
RESERVED_FIELDS = (
    "seed_everything",
    "ckpt_path",
    "torch_threads",
    "data.class_path",
    "data.init_args.env_id",
    "data.init_args.seed",
    "data.init_args.policy_buffer_size",
    "model.class_path",
    "model.init_args.algorithm_name",
    "model.init_args.objective.class_path",
    "model.init_args.advantage.class_path",
    "trainer.default_root_dir",
    "trainer.logger.class_path",
    "trainer.logger.init_args.experiment_name",
    "trainer.logger.init_args.run_name",
    "trainer.logger.init_args.run_id",
    "trainer.logger.init_args.tags",
    "trainer.logger.init_args.tracking_uri",
    "checkpoint.dirpath",
)


class SweepError(ValueError):
    """An invalid sweep file; the message names the field."""


SAFE_ID = re.compile(r"[A-Za-z0-9_.+=-]+")  # what a value may hold to become part of a cell id
_SAFE_SLURM = re.compile(r"[A-Za-z0-9_.,-]+")  # partition and account names (a comma lists several)


def check_text(field: str, value: str) -> str:
    """A free string that reaches a job script, a log or a run name: no control characters (a
    newline would end an ``#SBATCH`` line and run the rest on the compute node)."""
    bad = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise SweepError(f"`{field}` holds a control character ({bad!r}): use printable text only")
    return value


def check_resources(resources: dict) -> dict:
    """The SLURM names in ``resources`` (from the file or the command line) are plain names."""
    for key in ("partition", "account"):
        value = resources.get(key)
        if value is not None and not _SAFE_SLURM.fullmatch(str(value)):
            raise SweepError(
                f"`resources.{key}` = {value!r}: a SLURM {key} name is letters, digits and _ . - (a comma lists several)"
            )
    return resources


DEFAULT_ARRAY_PARALLELISM = 64  # a sweep of thousands of cells must not take a whole partition at once

RESOURCE_FIELDS = {
    # name: (type, meaning) — the sweep file's `resources:` and the matching command-line flags
    "cpus": (int, "CPUs per cell (default 1: one env-stepping process with one torch thread)"),
    "gpus": (int, "GPUs per cell (default 0)"),
    "mem_gb": (int, "memory per cell, GiB (SLURM; default 8)"),
    "time_min": (int, "wall-time limit per cell, minutes (SLURM; a cell past it is requeued and resumes)"),
    "partition": (str, "SLURM partition"),
    "account": (str, "SLURM account"),
    "array_parallelism": (int, f"SLURM: cells of a job array running at once (default {DEFAULT_ARRAY_PARALLELISM})"),
    "max_retries": (int, "Ray: retries of a cell whose worker or node died (default 3)"),
}


def import_class(class_path: str, where: str = "class_path"):
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise SweepError(
            f"`{where}`: cannot import {class_path!r} ({err}); run `vaco sweep` from the directory that holds "
            "the module (it is on the import path there, as for `vaco fit`), or install it"
        ) from None
