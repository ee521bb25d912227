"""Old module paths that still import: ``vaco.module`` is now ``vaco.vaco_module``, and so on.

Configs, checkpoints (LightningCLI stores the model's ``class_path``) and user code written before
the files were named for what they hold keep working. The old name is the same module object as
the new one, imported on first use (nothing is imported eagerly), with a ``FutureWarning`` once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: the release that drops these old paths and the other deprecated spellings (ParallelRolloutDataModule)
REMOVED_IN = "0.3.0"

#: old dotted path -> new dotted path
MOVED = {
    "vaco.module": "vaco.vaco_module",
    "vaco.llm.module": "vaco.llm.rlvr_module",
    "vaco.data.module": "vaco.data.datamodule",
    "vaco.data.parallel.module": "vaco.data.parallel.legacy",
    "vaco.sweep.cli": "vaco.sweep.sweep_cli",
    "vaco.report.cli": "vaco.report.report_cli",
    "vaco.objectives.functional": "vaco.objectives.objective_math",
    "vaco.advantages.functional": "vaco.advantages.advantage_math",
    "vaco.data.warp.collector": "vaco.data.warp.warp_collector",
}


#: classes whose old module now re-exports them from another (the old module maps to the shim)
MOVED_CLASSES = {"vaco.data.parallel.module.Actors": "vaco.data.parallel.backend.Actors"}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old path to the module at its new one (a meta-path finder: it is asked before
    the file system, and only for the names in :data:`MOVED`)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"`{spec.name}` is now `{new}`; the old path will be removed in vaco {REMOVED_IN}",
            FutureWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        """The module ran when its new name was imported."""


def install() -> None:
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


def current_path(dotted: str) -> str:
    """``dotted`` (a module or a class path) under the module's current name (a checkpoint's run
    definition names its components by class path; nothing is imported to answer)."""
    if dotted in MOVED_CLASSES:
        return MOVED_CLASSES[dotted]
    for old, new in MOVED.items():
        if dotted == old or dotted.startswith(old + "."):
            return new + dotted[len(old) :]
    return dotted
