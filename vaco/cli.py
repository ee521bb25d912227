"""The ``vaco`` command: ``fit`` (LightningCLI), ``evaluate``, and the experiment tools.

    vaco fit --config configs/env/hopper.yaml --config configs/algo/vaco.yaml
    vaco fit --config configs/demo.yaml --print_config
    vaco evaluate --ckpt checkpoints/<run>/last.ckpt --episodes 10 [--video out.mp4]
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import warnings

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI

from vaco.callbacks import IterationCheckpoint, SaveConfigToMLflow, VacoProgressBar

__all__ = ["VacoCLI", "ConfigurationError", "main", "DEFAULT_TRACKING_URI", "tracking_uri"]

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a local SQLite store (MLflow 3.14+ refuses the file store)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


class VacoCLI(LightningCLI):
    """LightningCLI with vaco's defaults: CPU, one epoch over the run's iterations, MLflow, checkpoints.

    The model and the data are chosen with ``class_path``/``init_args`` (``vaco.VacoModule`` with
    ``vaco.data.RolloutDataModule`` for MuJoCo; the LLM track brings its own pair).
    """

    def __init__(self, args=None, run: bool = True) -> None:
        super().__init__(
            model_class=L.LightningModule,
            datamodule_class=L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=SaveConfigToMLflow,
            save_config_kwargs={"save_to_log_dir": False, "overwrite": True},
            trainer_defaults={
                "max_epochs": 1,
                "accelerator": "cpu",
                "devices": 1,
                "num_sanity_val_steps": 0,
                "enable_model_summary": False,
                "log_every_n_steps": 1,
                "logger": {
                    "class_path": "lightning.pytorch.loggers.MLFlowLogger",
                    "init_args": {"experiment_name": "vaco", "tracking_uri": tracking_uri(), "log_model": True},
                },
            },
            seed_everything_default=1,
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--torch_threads",
            type=int,
            default=1,
            help="torch intra-op threads. 1 by default: env stepping shares the cores, and two torch "
            "threads competing with it made an update 20x slower on a 2-core machine.",
        )
        parser.add_lightning_class_args(IterationCheckpoint, "checkpoint")
        parser.add_lightning_class_args(VacoProgressBar, "progress_bar")
        parser.link_arguments("seed_everything", "data.init_args.seed")

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
        threads = config.get("torch_threads", 1)
        if not (isinstance(threads, int) and threads >= 1):
            raise ValueError(f"`torch_threads` must be an integer >= 1, got {threads!r}")
        torch.set_num_threads(threads)
        _continue_mlflow_run(config)

    def _instantiate_trainer(self, config, callbacks):
        if config.get("enable_progress_bar") is False:  # e.g. sweeps writing to log files
            callbacks = [c for c in callbacks if not isinstance(c, VacoProgressBar)]
        return super()._instantiate_trainer(config, callbacks)

    def instantiate_classes(self) -> None:
        """Report a bad value as one line naming the field, not a jsonargparse traceback."""
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as err:
            raise ConfigurationError(_config_error(err)) from err

    def after_fit(self) -> None:
        if self.trainer.global_rank != 0:
            return
        model, logger = self.model, self.trainer.logger
        lines = ["", "vaco: training finished."]
        final = getattr(model, "last_eval_return", None)
        if final is not None:
            lines.append(f"  final eval/return: {final:.1f}")
        ckpt = getattr(self.trainer.checkpoint_callback, "last_model_path", "")
        if ckpt:
            lines.append(f"  checkpoint: {ckpt}")
        run_id = getattr(logger, "run_id", None)
        if run_id:
            uri = getattr(logger, "_tracking_uri", tracking_uri())
            lines.append(f"  MLflow run {run_id} in experiment '{getattr(logger, '_experiment_name', '')}'")
            lines.append(f"  open it with: mlflow ui --backend-store-uri {uri}")
        if ckpt and hasattr(model, "actor"):  # `vaco evaluate` runs MuJoCo policies
            lines.append(f"  evaluate it with: vaco evaluate --ckpt {ckpt}")
        print("\n".join(lines), flush=True)


class ConfigurationError(ValueError):
    """A config value was rejected by a constructor's validation (the message names the field)."""


def _config_error(err: Exception) -> str:
    """The validators' own messages, without jsonargparse's union bookkeeping around them."""
    text = str(err)
    reasons = [
        line.strip()[2:]
        for line in text.splitlines()
        if line.strip().startswith("- ") and "Expected a <class 'NoneType'>" not in line
    ]
    return "; ".join(reasons) if reasons else text


def _continue_mlflow_run(config) -> None:
    """Resuming from a checkpoint logs into the MLflow run that wrote it (unless a run is given)."""
    ckpt_path = config.get("ckpt_path")
    logger = config.get("trainer", {}).get("logger")
    # the parsed logger is a jsonargparse Namespace (a dict only when it comes from the defaults)
    if not ckpt_path or not os.path.isfile(str(ckpt_path)) or not isinstance(logger, (dict, Namespace)):
        return
    if "MLFlowLogger" not in str(logger.get("class_path", "")):
        return
    if logger.get("init_args") is None:
        logger["init_args"] = type(logger)()
    init_args = logger["init_args"]
    if init_args.get("run_id"):
        return
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    run_id = state.get("vaco", {}).get("mlflow_run_id")
    if run_id:
        init_args["run_id"] = run_id


def _quiet() -> None:
    """Silence notices that say nothing to a vaco user (we use ``dataloader_iter`` on purpose:
    it is how the collection of batch T+1 waits until the update on batch T is done)."""
    for message in (
        ".*dataloader_iter.*",
        ".*`isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
        ".*The number of training batches .* is smaller than the logging interval.*",
        ".*does not have many workers which may be a bottleneck.*",
    ):
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: "litlogger" not in record.getMessage()
    )


def main(argv: list[str] | None = None) -> None:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "evaluate":
        from vaco.evaluate import main as evaluate_main

        return evaluate_main(argv[1:])
    if argv and argv[0] in ("sweep", "report"):
        import importlib

        return importlib.import_module(f"vaco.{argv[0]}").main(argv[1:])
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nSubcommands: fit, validate, evaluate, sweep, report. Run `vaco fit --help` for options.")
        return None
    _quiet()
    if from_command_line and hasattr(signal, "SIGUSR1"):
        # `kill -USR1 <pid>` prints every thread's Python stack to stderr: a stuck run can be
        # diagnosed without stopping it (the tests use it when a run does not exit in time)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        VacoCLI(args=None if from_command_line else argv)
    except ConfigurationError as err:
        print(f"vaco: invalid configuration: {err}", file=sys.stderr)
        sys.exit(2)
    return None


if __name__ == "__main__":
    main()
