"""The learner contract: what ``vaco fit``, ``vaco sweep``, the callbacks and the checkpoints rely on.

Both learners inherit :class:`Learner`: :class:`~vaco.VacoModule` (MuJoCo) and
:class:`~vaco.llm.RLVRModule` (LLMs). A new learner (another domain, another update loop)
subclasses it, implements the abstract methods below and the usual Lightning hooks
(``training_step``, ``configure_optimizers``), and then runs under ``vaco fit``, sweeps by the
``K`` axis it names, resumes exactly, and is reported by the score it names.

What the base class does, so that no learner repeats it:

* ``setup``: meets the data module (``data.bind(self)``), after :meth:`Learner.build`;
* at fit start, the run's params (:meth:`Learner.run_params`) go to the logger;
* :meth:`Learner.log_metrics`: metrics to the logger (rank 0) and the progress shown beside the bar;
* :meth:`Learner.run_definition`: the fields a resumed run may not change, from the objective and
  the other defining modules, the hyperparameters and the data module's ``defining_fields``;
* the checkpoint's ``"vaco"`` dict: torch's RNG, the algorithm, the MLflow run id, the run
  definition, and what :meth:`Learner.extra_state` adds; loaded back through
  :meth:`Learner.restore_state`. Checkpoints hold only tensors and plain values (they load with
  ``weights_only=True``).
"""

from __future__ import annotations

import functools
import math
import os
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import lightning as L
import torch

from vaco.objectives import Objective
from vaco.tracking import VARIANT_PARAM

__all__ = ["Learner", "NonFiniteLossError", "plain_fields", "same_run_problem", "startup_seconds"]


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN or inf; the run stops before the optimiser applies it."""


def _process_age() -> float | None:
    """Seconds since this process started: Linux's /proc (10 ms ticks), else psutil where installed."""

    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
            return float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - no way to tell: the metric is left out
        return None


@functools.cache  # the first call's reading, ever after
def startup_seconds() -> float | None:
    """Seconds from this process's start to the first call, which training makes as it starts
    (imports, the config, the envs, the MLflow runs, the model; a population's members share it):
    logged as ``perf/startup_seconds`` with a process's first iteration (None where the process's
    start cannot be read)."""
    age = _process_age()
    return None if age is None else max(0.0, age)


def short_count(n: float) -> str:
    """A count for the progress line: ``1.23M``, ``4.50k``, ``17``."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def plain_fields(module: torch.nn.Module, buffers: bool = False) -> dict[str, Any]:
    """A module's public scalar settings (an objective's ``delta``, an advantage's ``gamma``, ...)
    and, with ``buffers``, its public scalar buffers as floats (PPO-KL's adaptive ``kl_coef``, logged
    as its value at the start: state, not part of a run's definition)."""
    out = {
        key: value
        for key, value in vars(module).items()
        if not key.startswith("_") and key != "training" and isinstance(value, (int, float, str, bool))
    }
    for key, value in module.named_buffers(recurse=False) if buffers else ():
        if not key.startswith("_") and value.numel() == 1 and value.is_floating_point():
            out[key] = float(value)
    return out


def class_path(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class Learner(L.LightningModule, ABC):
    """Base of vaco's LightningModules (see the module docstring for what it provides).

    A subclass declares :attr:`lag_key` and :attr:`score_metric` and implements
    :meth:`check_data`, :meth:`default_run_name`, :meth:`run_params`, :meth:`evaluate`,
    :meth:`should_evaluate` and :attr:`last_score`. It calls ``super().__init__(objective,
    algorithm)`` first and ``self.save_hyperparameters(...)`` itself.

    Attributes every learner has: ``objective``, ``algorithm`` (the MLflow ``algorithm`` param),
    ``version`` (a long buffer: updates done, the policy version), ``data`` (the data module,
    bound in ``setup``), ``progress`` (shown beside the progress bar) and ``last_metrics`` (the
    latest dict logged).
    """

    #: the config key a sweep's ``K`` axis sets (the degree of asynchrony)
    lag_key: ClassVar[str]
    #: the metric a run is scored by (the report's final score)
    score_metric: ClassVar[str]
    #: how the score is printed at the end of ``vaco fit``
    score_format: ClassVar[str] = ".1f"
    #: where a stop signal takes effect, as the signal's message says it ("stopping after ...")
    stop_boundary: ClassVar[str] = "this iteration"
    #: hyperparameters a resumed run may change (every other one defines the run)
    resumable_hparams: ClassVar[tuple[str, ...]] = ("algorithm_name", "variant_of")
    #: ``vaco evaluate`` can run this learner's checkpoints (MuJoCo policies)
    evaluable: ClassVar[bool] = False

    def __init__(self, objective: Objective, algorithm: str, variant_of: str | None = None) -> None:
        super().__init__()
        if not isinstance(objective, Objective):
            raise TypeError(f"`model.objective` must be a vaco.objectives.Objective, got {type(objective).__name__}")
        if variant_of is not None and not (isinstance(variant_of, str) and variant_of.strip()):
            raise ValueError(f"`model.variant_of` must be an algorithm name or null, got {variant_of!r}")
        self.automatic_optimization = False  # epochs x minibatches (or N minibatches) inside one step
        self.objective = objective
        self.algorithm = algorithm
        # an ablation or control of another algorithm (the report keeps it out of a task's min and max)
        self.variant_of = variant_of or objective.variants.get(algorithm)
        self.register_buffer("version", torch.zeros((), dtype=torch.long))
        self.data = None
        self.progress: dict[str, str] = {}
        self.last_metrics: dict[str, float] = {}
        self._restored = False  # set when a checkpoint's state was loaded (a resumed run)
        self.member_logger = None  # a population's member logs to its own MLflow run (vaco.population.module)

    # ------------------------------------------------------------------ what a learner provides
    @abstractmethod
    def check_data(self, data) -> None:
        """Cross-field checks between this learner and the data module; raise a ValueError naming
        the fields. Runs before any env starts or any MLflow run exists."""

    @abstractmethod
    def default_run_name(self, data) -> str:
        """The MLflow run's name from its coordinates (``vaco Hopper-v5 K=4 s3``)."""

    @abstractmethod
    def run_params(self) -> dict[str, Any]:
        """The coordinates a user compares runs by, as flat MLflow params (logged at fit start).
        ``vaco report`` reads ``algorithm``, ``env``, ``K`` and ``seed`` from them."""

    @abstractmethod
    def evaluate(self) -> dict[str, float]:
        """Evaluate the current policy; the dict holds :attr:`score_metric`."""

    @abstractmethod
    def should_evaluate(self) -> bool:
        """Whether the iteration that just finished evaluates (always the last one)."""

    @property
    @abstractmethod
    def last_score(self) -> float:
        """The latest value of :attr:`score_metric` (NaN before the first evaluation)."""

    # ------------------------------------------------------------------ hooks with defaults
    def build(self, data) -> None:
        """Build what depends on the task (networks sized by the env), before ``data.bind``."""

    def defining_modules(self) -> dict[str, torch.nn.Module]:
        """The components whose class and settings define the run (by their ``model.init_args`` name)."""
        return {"objective": self.objective}

    def total_iterations(self) -> int | None:
        """Iterations (``training_step`` calls) of the whole run, where known: the per-iteration log's denominator."""
        return None

    def progress_fields(self, metrics: dict[str, float], step: int) -> dict[str, str]:
        """What the progress bar (and the per-iteration log line) shows after ``metrics`` were logged."""
        return dict(self.progress)

    def extra_state(self) -> dict[str, Any]:
        """This learner's own part of the checkpoint's ``"vaco"`` dict (tensors and plain values)."""
        return {}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's ``"vaco"`` dict (called when it holds a saved run's state)."""
        torch.set_rng_state(state["torch_rng"])
        self._restored = True

    def summary(self) -> str | None:
        """The line ``vaco fit`` prints about the run's score at the end (None before any evaluation)."""
        score = self.last_score
        return None if math.isnan(score) else f"final {self.score_metric}: {score:{self.score_format}}"

    # ------------------------------------------------------------------ shared behaviour
    @property
    def logger(self):
        """The trainer's logger, or, for a member of a population, the member's own (its MLflow run)."""
        return self.member_logger if self.member_logger is not None else super().logger

    def setup(self, stage: str) -> None:
        """Meet the data module (the one place the learner looks it up, through the trainer):
        build what depends on the task, then ``data.bind(self)``; from here on each holds the
        other (``self.data``, ``data.learner``)."""
        data = self.trainer.datamodule
        self.build(data)
        data.bind(self)
        self.data = data

    @property
    def hparams_initial(self):
        """The init args Lightning logs as params, with ``variant_of`` as resolved (the objective's
        declaration where the config gives none), so the run has one value for it."""
        hparams = super().hparams_initial
        if "variant_of" in hparams:
            hparams["variant_of"] = self.variant_of
        return hparams

    def log_run_params(self) -> None:
        if self.logger is not None and self.global_rank == 0:
            self.logger.log_hyperparams({**self.run_params(), VARIANT_PARAM: self.variant_of})

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log ``metrics`` at ``step`` (rank 0) and update the progress shown beside the bar."""
        self.last_metrics = metrics  # what vaco.run.callbacks.IterationLog prints when not on a terminal
        if self.logger is not None and self.global_rank == 0:
            self.logger.log_metrics(metrics, step=step)
        self.progress = self.progress_fields(metrics, step)

    def run_definition(self, data) -> dict[str, Any]:
        """The fields that make a run what it is, by config path: a resumed run must match them.

        The defining modules with their class and settings, every hyperparameter but
        :attr:`resumable_hparams`, and the data module's ``defining_fields`` (a component among
        them, such as the collection backend, contributes its ``definition()``).
        """
        out: dict[str, Any] = {}
        for name, module in self.defining_modules().items():
            out[f"model.init_args.{name}"] = class_path(module)
            for key, value in plain_fields(module).items():
                out[f"model.init_args.{name}.init_args.{key}"] = value
        for key, value in self.hparams.items():
            if key not in self.resumable_hparams:
                out[f"model.init_args.{key}"] = list(value) if isinstance(value, (list, tuple)) else value
        for key in data.defining_fields:
            value = getattr(data, key)
            if hasattr(value, "definition"):  # a component: its class and settings
                value = value.definition()
            out[f"data.init_args.{key}"] = dict(value) if isinstance(value, dict) else value
        return out

    def on_fit_start(self) -> None:
        self.log_run_params()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["vaco"] = {
            "torch_rng": torch.get_rng_state(),
            "algorithm": self.algorithm,
            "mlflow_run_id": getattr(self.logger, "run_id", None),  # None without a logger
            "definition": self.run_definition(self.data) if self.data is not None else None,
            **self.extra_state(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("vaco", {})
        if "torch_rng" in state:  # written by on_save_checkpoint above: a learner's saved run
            self.restore_state(state)


def same_run_problem(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The first run-defining field that differs between a checkpoint and the config, as a message."""
    for key in sorted(set(saved) | set(now)):
        if saved.get(key) != now.get(key):
            then = f"has {saved[key]!r}" if key in saved else "has no such field"
            given = f"has {now[key]!r}" if key in now else "has no such field"
            return (
                f"`{key}` cannot change when resuming (the checkpoint's run {then}, the config {given}); only "
                "`data.init_args.total_steps` and the evaluation and logging fields may change. Start a new run "
                "for a different setting"
            )
    return None
