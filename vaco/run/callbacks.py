"""Lightning callbacks: checkpoints counted in iterations, a progress bar in env steps, config to MLflow."""

from __future__ import annotations

import _thread
import os
import signal
import sys
import tempfile
import threading

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from vaco.lightning_private import save_last_checkpoint
from vaco.run.checkpoint import SafeCheckpointIO
from vaco.run.lock import hold_mlflow_run_lock, hold_run_lock
from vaco.tracking import has_secrets, redact_uri

__all__ = ["IterationCheckpoint", "IterationLog", "VacoProgressBar", "SaveConfigToMLflow"]


#: the signals that stop a run at the next iteration boundary with a checkpoint: what SLURM sends
#: before preempting or requeueing a job (SIGTERM; ``--signal=USR2@90`` in vaco's sbatch script)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)  # SIGINT: Ctrl-C, once (twice stops at once)

#: a stop signal that came while ``vaco fit`` was starting, and the handlers it found (see :func:`listen_while_starting`)
_STARTING: dict = {"signal": None, "handlers": {}, "unraisablehook": sys.unraisablehook}


def _on_signal_while_starting(signum, frame) -> None:
    if _STARTING["signal"] is None:
        _STARTING["signal"] = signum
        again = " (Ctrl-C again stops at once, without one)" if signum == signal.SIGINT else ""
        print(
            f"vaco: received {signal.Signals(signum).name} while starting; it is kept: the run stops at its first "
            f"boundary (an iteration; the LLM track's next token or minibatch) with a checkpoint{again}",
            file=sys.stderr,
            flush=True,
        )
    elif signum == signal.SIGINT:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt


def _on_unraisable(unraisable) -> None:
    """A second Ctrl-C raises KeyboardInterrupt wherever Python is; where that is a finaliser or a
    weakref callback (SQLAlchemy's, MLflow's), Python prints it as "Exception ignored" and goes on,
    and the run did not stop. Such a KeyboardInterrupt is delivered again, not printed: from another
    thread a moment later, so that it reaches the main thread's code after the finaliser (raised here,
    it would be raised in this hook and swallowed too); any other goes to the hook that was there."""
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        threading.Timer(0.01, _thread.interrupt_main).start()  # SIGINT's handler is Python's default by now
        return
    _STARTING["unraisablehook"](unraisable)


def listen_while_starting() -> None:
    """From the start of ``vaco fit`` until :class:`IterationCheckpoint` takes over, a stop signal
    is kept, not obeyed at once: the MLflow runs are created while the trainer starts, and a run
    killed then had no checkpoint, so a rerun (a sweep's resume) opened new runs beside the dead
    ones. Kept, the signal stops the run after its first iteration, as one during training does.
    Until ``vaco fit`` ends, a Ctrl-C that Python would swallow in a finaliser is delivered again
    (:func:`_on_unraisable`)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _STARTING["signal"] = None
    if sys.unraisablehook is not _on_unraisable:
        _STARTING["unraisablehook"] = sys.unraisablehook
        sys.unraisablehook = _on_unraisable
    for sig in STOP_SIGNALS:
        previous = signal.signal(sig, _on_signal_while_starting)
        if previous is not _on_signal_while_starting:
            _STARTING["handlers"][sig] = previous


def stop_listening() -> None:
    """The handlers :func:`listen_while_starting` found, back (``vaco fit`` has ended)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in _STARTING["handlers"].items():
        if signal.getsignal(sig) is _on_signal_while_starting:
            signal.signal(sig, handler)
    _STARTING["handlers"].clear()
    if sys.unraisablehook is _on_unraisable:
        sys.unraisablehook = _STARTING["unraisablehook"]


class IterationCheckpoint(ModelCheckpoint):
    """Keeps ``last.ckpt`` up to date every ``every_n_iterations`` rollout batches and at the end.

    SIGTERM, SIGUSR2 or a Ctrl-C (SIGINT; :data:`STOP_SIGNALS`) stops the run at the next iteration
    boundary (a second Ctrl-C stops at once): the
    iteration in progress finishes, ``last.ckpt`` is written (atomically) and training ends;
    ``vaco fit`` then marks the MLflow run KILLED and exits with ``128 + signal``. A resume from
    that checkpoint repeats no iteration. (The LLM track's iteration is a generation batch of N
    minibatches: it stops at the next minibatch boundary, its checkpoint holding the batch.)

    Writes are atomic and reads safe (:class:`vaco.run.checkpoint.SafeCheckpointIO`, installed on the
    trainer's strategy here). Lightning's own schedule counts optimiser steps, and with manual optimisation an iteration
    holds ``update_epochs * num_minibatches`` of them; here the unit is the iteration. The
    directory defaults to ``checkpoints/<mlflow run id>/`` under the trainer's root dir.

    Args:
        every_n_iterations: checkpoint period in iterations (0: only at the end).
        dirpath: where to write; default ``<default_root_dir>/checkpoints/<run id>``.
    """

    def __init__(self, every_n_iterations: int = 10, dirpath: str | None = None) -> None:
        if not (isinstance(every_n_iterations, int) and every_n_iterations >= 0):
            raise ValueError(f"`checkpoint.every_n_iterations` must be an integer >= 0, got {every_n_iterations!r}")
        # one file per run, overwritten: without enable_version_counter=False, a run resumed from a
        # folder that was moved (Lightning then forgets the last path it wrote) saved last-v1.ckpt
        # beside the old last.ckpt, and a later resume from last.ckpt silently took the older state
        super().__init__(
            dirpath=dirpath,
            save_last=True,
            save_top_k=0,
            every_n_train_steps=0,
            save_on_train_epoch_end=True,
            enable_version_counter=False,
        )
        self.every_n_iterations = every_n_iterations
        self.stop_signal: int | None = None  # the signal that asked the run to stop, once it has stopped
        self._requested: int | None = None
        self._previous_handlers: dict[int, object] = {}
        self._boundary = "this iteration"  # the learner's (Learner.stop_boundary), from setup on

    # -- stopping at an iteration boundary on SIGTERM / SIGUSR2
    def _on_signal(self, signum, frame) -> None:
        if self._requested is None:
            self._requested = signum
            again = " (Ctrl-C again stops at once, without one)" if signum == signal.SIGINT else ""
            print(
                f"vaco: received {signal.Signals(signum).name}; stopping after {self._boundary} with a checkpoint{again}",
                file=sys.stderr,
                flush=True,
            )
        elif signum == signal.SIGINT:  # a second Ctrl-C: the user does not want to wait for the iteration
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt

    def _install(self) -> None:
        """This callback's handler for every stop signal (the handlers it replaced kept once, to restore)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if self._requested is None and _STARTING["signal"] is not None:
            self._requested = _STARTING["signal"]  # it came while vaco fit was starting
        for sig in STOP_SIGNALS:
            previous = signal.signal(sig, self._on_signal)
            if previous is _on_signal_while_starting:  # restored to what was there before vaco fit started
                previous = _STARTING["handlers"].get(sig, signal.SIG_DFL)
            self._previous_handlers.setdefault(sig, previous)

    def _restore(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    def on_train_start(self, trainer, pl_module) -> None:
        # again after Lightning's own handlers (its SIGTERM notifier only acts at the end of the run's one epoch)
        self._install()

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore()
        if self.stop_signal is None:  # Lightning's save_last at the end; a stopped run saved at its stop
            super().on_train_end(trainer, pl_module)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._restore()  # also when fit ended before training did (an error in on_fit_start)
        super().teardown(trainer, pl_module, stage)

    def stop_requested(self, trainer) -> bool:
        """Whether a stop signal arrived (on any rank): a learner may stop inside its iteration at a
        boundary of its own (the LLM track's minibatches), then this callback saves and stops."""
        asked = self._requested is not None
        if trainer.world_size > 1:  # every rank stops at the same iteration
            asked = trainer.strategy.reduce_boolean_decision(asked, all=False)
        return asked

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.stop_signal is None:  # a stopped run's checkpoint is the one at its stop, mid-run
            super().on_train_epoch_end(trainer, pl_module)

    def on_fit_start(self, trainer, pl_module) -> None:
        # stop signals are caught from here on (the callbacks' on_fit_start runs before the learner's):
        # the learner's on_fit_start comes before training (the LLM track evaluates there, for
        # minutes) and Lightning installs no handler until training starts, so a SIGTERM there killed
        # the process at once (no checkpoint, the MLflow run left RUNNING). Before fit starts (the
        # envs being built) a signal still ends the process at once: there is nothing to save yet.
        self._install()

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._boundary = getattr(pl_module, "stop_boundary", self._boundary)
        # atomic writes and safe reads (vaco.run.checkpoint) unless the user chose their own CheckpointIO
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = SafeCheckpointIO()
        if self.dirpath is None:
            run = getattr(trainer.logger, "version", None) or "run"
            self.dirpath = os.path.join(trainer.default_root_dir, "checkpoints", str(run))
        if trainer.global_rank == 0:  # one process per run (vaco.run.lock): this run's folder, from here on
            taken_over = [hold_run_lock(self.dirpath, "this run")]
            run_id = getattr(trainer.logger, "run_id", None)  # and its MLflow run, wherever a copy resumes it
            if isinstance(run_id, str) and run_id:
                taken_over.append(hold_mlflow_run_lock(run_id, f"MLflow run {run_id}"))
            for line in filter(None, taken_over):
                print(line, file=sys.stderr, flush=True)
        super().setup(trainer, pl_module, stage)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        iteration = int(pl_module.version)  # a vaco.learners.learner.Learner: updates done
        stop = self.stop_requested(trainer)
        due = self.every_n_iterations >= 1 and iteration % self.every_n_iterations == 0
        if due or stop:
            # stopped before the first step (the LLM track's first evaluation or generation): nothing
            # is on disk, and ModelCheckpoint skips a save at global step 0; the run must resume from here
            save_last_checkpoint(self, trainer, force=stop and not self.last_model_path)
        if stop:
            self.stop_signal = self._requested or signal.SIGTERM  # another rank's signal
            trainer.should_stop = True


class IterationLog(Callback):
    """One line per iteration, for output that is not a terminal (a sweep cell's ``train.log``, a
    batch job's log): tqdm's bars redrawn into a file make one unreadable line. ``vaco fit`` uses
    it instead of :class:`VacoProgressBar` when stdout is not a TTY."""

    #: (metric, label): printed where the learner logged them this iteration
    COLUMNS = (
        ("eval/return", "eval"),
        ("train/episode_return", "ep return"),
        ("lag/forward_tv", "tv"),
        ("train/filter_fraction", "filtered"),
        ("train/clip_fraction", "clipped"),
        ("train/loss_policy", "pi loss"),
        ("train/loss_value", "v loss"),
        ("train/explained_variance", "expl var"),
        ("lag/policy_age_mean", "age"),
    )

    def __init__(self) -> None:
        super().__init__()
        self._printed: int | None = None  # the last iteration printed

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank != 0:
            return
        iteration = int(pl_module.version)  # a vaco.learners.learner.Learner
        if iteration == self._printed:  # a batch abandoned on a stop signal (the LLM track): nothing new
            return
        self._printed = iteration
        total = pl_module.total_iterations()
        width = len(str(total)) if total else 1
        parts = [f"iter {iteration:>{width}}" + (f"/{total}" if total else "")]
        progress = dict(pl_module.progress)
        parts += [f"{key} {value}" for key, value in progress.items() if key != "eval"]
        metrics = pl_module.last_metrics
        own = pl_module.objective.fraction_metric
        for key, label in self.COLUMNS:
            if own and key.endswith("_fraction") and key != f"train/{own}":
                continue  # the objective's own intervention fraction only
            value = metrics.get(key)
            if value is None and key == "eval/return" and "eval" in progress:
                parts.append(f"eval {progress['eval']}")
            elif value is not None:
                parts.append(f"{label} {float(value):.4g}")
        print(" | ".join(parts), flush=True)


class VacoProgressBar(TQDMProgressBar):
    """Iterations as the bar; env steps done/total, SPS and the latest eval return beside it."""

    def get_metrics(self, trainer, pl_module):
        return dict(pl_module.progress)

    def init_train_tqdm(self):
        bar = super().init_train_tqdm()
        bar.set_description("iteration")
        return bar

    def on_train_epoch_start(self, trainer, *_) -> None:
        super().on_train_epoch_start(trainer, *_)
        self.train_progress_bar.set_description("iteration")


def redacted_config(config):
    """A copy of a jsonargparse config with ``trainer.logger.init_args.tracking_uri`` redacted."""

    key = "trainer.logger.init_args.tracking_uri"
    try:
        uri = config.get(key)
    except (AttributeError, KeyError, TypeError):
        return config
    if not isinstance(uri, str) or not has_secrets(uri):
        return config
    config = config.clone()
    config[key] = redact_uri(uri)
    return config


class SaveConfigToMLflow(SaveConfigCallback):
    """Writes the resolved config next to the logs and as the MLflow artifact ``config.yaml``,
    with the tracking URI's user info and secrets redacted (every reader of the experiment sees
    the artifact; the running logger keeps the real URI)."""

    def __init__(self, parser, config, *args, **kwargs) -> None:
        super().__init__(parser, redacted_config(config), *args, **kwargs)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        logger = trainer.logger
        if not isinstance(logger, MLFlowLogger) or trainer.global_rank != 0:
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.yaml")
            self.parser.save(self.config, path, skip_none=False, overwrite=True, multifile=False)
            logger.experiment.log_artifact(logger.run_id, path)
