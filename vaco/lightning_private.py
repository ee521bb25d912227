"""Lightning's private API, fenced: every name vaco relies on that Lightning does not promise to keep.

vaco is written against Lightning 2.6 (:data:`TESTED`). A private method that vaco overrides is the
dangerous kind: if Lightning renames it, the override is silently never called (the checks it runs
are skipped, nothing fails). So each private name is listed in :data:`TOUCHES` with who uses it and
why no public route does the job, and ``tests/test_architecture.py`` resolves every one on the
installed Lightning (failing with the name that is gone) and refuses a Lightning outside
:data:`TESTED` by name. The code that reads or edits Lightning's private state lives here; the three
``LightningCLI`` overrides stay methods of :class:`vaco.commands.fit.VacoCLI` (an override has to), and are
listed here. docs/architecture.md gives the same list.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from typing import Any

__all__ = [
    "TESTED",
    "TOUCHES",
    "ddp_timeout",
    "flatten_params",
    "reopen_finished_epoch",
    "resolve",
    "save_last_checkpoint",
    "set_logged_hparam",
    "uncount_current_batch",
]

#: the Lightning versions (major.minor) this fence was written and tested against
TESTED = ("2.6",)

#: name -> (who uses it, why). A name is ``module:Class.attribute`` (a class attribute or method),
#: ``module:Class.field`` of a dataclass (an instance field, checked among the dataclass's fields), or
#: ``module:Class().attribute`` (an instance attribute, checked as assigned in ``Class.__init__``).
TOUCHES: dict[str, tuple[str, str]] = {
    "lightning.pytorch.cli:LightningCLI._parse_ckpt_path": (
        "vaco.commands.fit.VacoCLI overrides it",
        "Lightning's version loads the checkpoint and merges its hyperparameters over the config; vaco "
        "reads it once (weights only) and refuses a resume whose run-defining fields differ instead",
    ),
    "lightning.pytorch.cli:LightningCLI._set_seed": (
        "vaco.commands.fit.VacoCLI overrides it",
        "the checks that need no object (seed range, task, tracking store) and every constructor's own "
        "checks run before 'Seed set to' and before any MLflow store exists: no public hook runs that early",
    ),
    "lightning.pytorch.cli:LightningCLI._instantiate_trainer": (
        "vaco.commands.fit.VacoCLI overrides it",
        "a line per iteration instead of tqdm's bars when stdout is a file, and an accelerator the machine "
        "lacks as one line naming the field (Lightning raises while building the trainer)",
    ),
    "lightning.pytorch.callbacks:ModelCheckpoint._should_skip_saving_checkpoint": (
        "save_last_checkpoint (vaco.run.callbacks.VacoCheckpoint)",
        "vaco saves last.ckpt at iteration boundaries and on a stop signal, with ModelCheckpoint's own "
        "rules for when not to save (sanity checks, a save already at this step) and its own writer",
    ),
    "lightning.pytorch.callbacks:ModelCheckpoint._save_last_checkpoint": (
        "save_last_checkpoint (vaco.run.callbacks.VacoCheckpoint)",
        "the same: ModelCheckpoint's save of last.ckpt (linking, versioning, removal of the previous one)",
    ),
    "lightning.pytorch.callbacks:ModelCheckpoint._monitor_candidates": (
        "save_last_checkpoint (vaco.run.callbacks.VacoCheckpoint)",
        "the metrics ModelCheckpoint formats the file name and state with",
    ),
    "lightning.pytorch.loggers:MLFlowLogger()._run_id": (
        "vaco.run.logger.VacoMLFlowLogger",
        "a resume continues its MLflow run (set before the run starts) and a new run gets a unique name; "
        "MLFlowLogger takes both only as constructor arguments, and vaco learns them after construction",
    ),
    "lightning.pytorch.loggers:MLFlowLogger()._run_name": ("vaco.run.logger.VacoMLFlowLogger", "the same"),
    "lightning.pytorch.loggers:MLFlowLogger()._experiment_name": (
        "vaco.run.logger.VacoMLFlowLogger",
        "the experiment is created with vaco's artifact location and kind tag before Lightning's first use",
    ),
    "lightning.pytorch.loggers:MLFlowLogger()._tracking_uri": ("vaco.run.logger.VacoMLFlowLogger", "the same"),
    "lightning.pytorch.loggers:MLFlowLogger()._artifact_location": ("vaco.run.logger.VacoMLFlowLogger", "the same"),
    "lightning.fabric.utilities.logger:_convert_params": (
        "flatten_params (vaco.run.logger.VacoMLFlowLogger.log_hyperparams)",
        "the logged params are flattened as Lightning's own MLFlowLogger flattens them, so the keys match",
    ),
    "lightning.fabric.utilities.logger:_flatten_dict": (
        "flatten_params (vaco.run.logger.VacoMLFlowLogger.log_hyperparams)",
        "the same",
    ),
    "lightning.pytorch.loops.progress:_BatchProgress.is_last_batch": (
        "reopen_finished_epoch (checkpoint loading of every learner)",
        "a finished run resumed with a larger budget: Lightning's loop state in the checkpoint says the "
        "run's one epoch ended; no public API reopens it",
    ),
    "lightning.pytorch.loops.progress:_ProcessedTracker.processed": (
        "reopen_finished_epoch",
        "the epoch counters (completed, processed) of the checkpoint's fit loop",
    ),
    "lightning.pytorch.strategies:DDPStrategy()._timeout": (
        "ddp_timeout (vaco.run.rendezvous)",
        "the loopback rendezvous store must wait as long as the process group the strategy makes; the "
        "strategy keeps its `timeout` argument only privately",
    ),
    "lightning.pytorch.core.mixins.hparams_mixin:HyperparametersMixin()._hparams_initial": (
        "set_logged_hparam (vaco.population.module)",
        "a population member's data module logs its own seed as a param; Lightning logs the initial "
        "hyperparameters from this private copy (the public `hparams_initial` returns a copy of it)",
    ),
    "lightning.pytorch.loops.progress:_ProcessedTracker.started": (
        "uncount_current_batch (vaco.llm.rlvr_module)",
        "a generation batch stopped between its minibatches is finished by the first call after the "
        "resume, so the stopped call must not count as a batch of the epoch",
    ),
}


def resolve(name: str) -> Any:
    """The object ``name`` (a key of :data:`TOUCHES`) denotes on the installed Lightning; raises
    ``AttributeError`` naming it when it is gone."""

    module_name, _, path = name.partition(":")
    obj: Any = importlib.import_module(module_name)
    if "()." in path:
        cls_name, _, attribute = path.partition("().")
        cls = getattr(obj, cls_name)

        # an instance attribute the class itself assigns or reads (Lightning sets some from helpers)
        if not re.search(rf"self\.{re.escape(attribute)}\b", inspect.getsource(cls)):
            raise AttributeError(f"Lightning's {name} is gone (used by {TOUCHES.get(name, ('?',))[0]})")
        return attribute
    parts = path.split(".")
    for i, part in enumerate(parts):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        last = i == len(parts) - 1
        if last and dataclasses.is_dataclass(obj) and part in {f.name for f in dataclasses.fields(obj)}:
            return dataclasses.fields(obj)[[f.name for f in dataclasses.fields(obj)].index(part)]
        raise AttributeError(f"Lightning's {name} is gone (used by {TOUCHES.get(name, ('?',))[0]})")
    return obj


# ---------------------------------------------------------------- the code that touches them
def ddp_timeout(strategy, default):
    """The process-group timeout a DDP strategy was given (``default`` for a strategy without one)."""
    return getattr(strategy, "_timeout", None) or default


def set_logged_hparam(module, key: str, value) -> None:
    """Change one hyperparameter Lightning will log for ``module`` (its saved initial copy)."""
    if getattr(module, "_hparams_initial", None) is not None:
        module._hparams_initial[key] = value


def flatten_params(params) -> dict[str, Any]:
    """Hyperparameters flattened to ``a/b`` keys, as Lightning's MLFlowLogger flattens them."""
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict

    return _flatten_dict(_convert_params(params))


def save_last_checkpoint(callback, trainer, force: bool = False) -> None:
    """``callback`` (a ModelCheckpoint) writes last.ckpt now, unless its own rules skip this step
    (one of them: a save at the optimiser step already saved). ``force``: save even then (a run
    stopped before its first step has nothing on disk at step 0)."""
    if force or not callback._should_skip_saving_checkpoint(trainer):
        callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def reopen_finished_epoch(checkpoint: dict[str, Any]) -> None:
    """A finished run resumed with a larger budget: mark its one epoch (the whole run) unfinished.

    A vaco run is one Lightning epoch whose length is the number of iterations. A checkpoint
    written at the end has that epoch completed, or (when ``checkpoint.every_n_iterations``
    divides the run, so the last iteration's own save is the last one) its last batch marked as
    the last; either way Lightning would stop at once (``max_epochs=1``). Reopened, it resumes
    mid-epoch like an interrupted run, and the collector (restored with the new
    ``num_iterations``) yields the remaining iterations (the LLM track's prompt stream likewise).
    """
    loop = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs = loop.get("epoch_progress")
    if not epochs:
        return
    if epochs["current"]["completed"] >= 1:
        for scope in ("current", "total"):
            epochs[scope]["completed"] = epochs[scope]["processed"] = epochs[scope]["completed"] - 1
    loop.get("epoch_loop.batch_progress", {})["is_last_batch"] = False


def uncount_current_batch(trainer) -> None:
    """Lightning counts a training-step call as one batch of its epoch (the epoch ends after
    ``len(stream)`` calls). A generation batch stopped between its minibatches is finished by the
    first call after the resume, which pulls nothing: so the stopped call does not count, and the
    checkpoint's loop state is that of the batch before it."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    for tracker in (progress.current, progress.total):
        tracker.ready -= 1
        tracker.started -= 1
