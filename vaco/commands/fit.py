"""``vaco fit``: LightningCLI with vaco's defaults, checks before any work, and one-line errors.

    vaco fit --config configs/env/hopper.yaml --config configs/algo/vaco.yaml
    vaco fit --config configs/demo.yaml --print_config
    vaco fit --config ... --ckpt_path checkpoints/<run>/last.ckpt   # resume, same MLflow run

Before any env starts or any MLflow run exists, a run is checked in this order: the config parses
(an unknown field is one line with a did-you-mean); the seed, the task and the tracking store
(it answers and accepts the credentials), before Lightning prints "Seed set to"; every
constructor validates its own fields; the cross-field checks (``model.check_data``); a checkpoint
to resume from loads safely and defines the same run. Each failure is one line naming the field,
exit 2.
"""

from __future__ import annotations

import contextlib
import io
import logging
import signal
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from vaco.commands.fit_checks import (
    check_same_run,
    check_tracking,
    check_weights_fit,
    config_error,
    continue_mlflow_run,
    early_checks,
    plain_type_error,
    read_resume_checkpoint,
    resume_budget,
    resume_env_step,
)
from vaco.config_errors import (
    ConfigurationError,
    check_command_line_values,
    check_config_files,
    config_files,
    file_of_key,
    given_on_command_line,
    one_line,
    refuse_sweep_files,
)
from vaco.hints import shell, vaco_command
from vaco.learners.learner import Learner, NonFiniteLossError
from vaco.run.callbacks import (
    IterationCheckpoint,
    IterationLog,
    SaveConfigToMLflow,
    VacoProgressBar,
    listen_while_starting,
    stop_listening,
)
from vaco.run.checkpoint import CheckpointError
from vaco.run.lock import hold_mlflow_run_lock, hold_run_lock, release_run_locks
from vaco.run.logger import VacoMLFlowLogger
from vaco.run.rendezvous import host_store_on_loopback
from vaco.tracking import (
    CELL_TAG,
    DEFAULT_TRACKING_URI,
    TrackingStoreError,
    redact_uri,
    tracking_uri,
)

__all__ = ["VacoCLI", "ConfigurationError", "main", "DEFAULT_TRACKING_URI", "tracking_uri"]


_CONFIG_FILES: dict[str, object] = {}  # the --config files of this `vaco fit`, read by main()
_UNSENT: list[str] = []  # where this `vaco fit`'s loggers wrote metrics the store never took
_ARGV: list[str] = []  # this `vaco fit`'s arguments, read by main(): a value given there is not a file's


class VacoArgumentParser(LightningArgumentParser):
    """Lightning's parser, reporting a parse error as one line (no screenful of usage first)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--seed_everythin 3` must not silently mean seed_everything
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error:
            return super().error(message, ex)
        options = [o for action in self._actions for o in action.option_strings]
        prog = "vaco fit"
        text = plain_type_error(one_line(message, options), _ARGV, _CONFIG_FILES)
        on_line = given_on_command_line(text, _ARGV)
        where = None if on_line else file_of_key(text, _CONFIG_FILES)
        if on_line:
            text += " (given on the command line)"
        elif where is not None:
            text += f" (in {where})"
        print(f"{prog}: error: {text} (`{prog} --help` lists the fields)", file=sys.stderr)
        sys.exit(2)


class VacoCLI(LightningCLI):
    """LightningCLI with vaco's defaults: CPU, one epoch over the run's iterations, MLflow, checkpoints.

    The model and the data are chosen with ``class_path``/``init_args`` (``vaco.VacoModule`` with
    ``vaco.data.RolloutDataModule`` for MuJoCo; the LLM track brings its own pair).
    """

    def __init__(self, args=None, run: bool = True) -> None:
        self._argv = [str(a) for a in (args if isinstance(args, (list, tuple)) else sys.argv[1:])]
        self._budget_line: str | None = None
        super().__init__(
            model_class=Learner,  # any vaco learner (vaco.learners.learner.Learner): the two shipped, or your own
            datamodule_class=L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            parser_class=VacoArgumentParser,
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
                    "class_path": "vaco.run.logger.VacoMLFlowLogger",
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
        parser.add_argument(
            "--population",
            type=int | list[int],
            default=1,
            help="train S runs that differ only by seed in one process: S seeds from seed_everything on, or "
            "a list of seeds. Member m is the run `--seed_everything s_m` alone, bit for bit, with its own "
            "MLflow run; one update computes all members' (vaco.population.module).",
        )
        parser.add_lightning_class_args(IterationCheckpoint, "checkpoint")
        parser.add_lightning_class_args(VacoProgressBar, "progress_bar")
        parser.link_arguments("seed_everything", "data.init_args.seed")

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # vaco trains; Lightning's validate/test/predict loops have nothing to run here
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"}}

    def _parse_ckpt_path(self) -> None:
        """Read ``--ckpt_path`` once, safely, before anything else happens.

        Lightning's version loads the checkpoint and merges its model hyperparameters over the
        config. vaco keeps the config as given and instead refuses a resume whose run-defining
        fields differ from the checkpoint's (:func:`check_same_run`), so nothing changes silently.
        """
        config = self.config.get(self.config.get("subcommand") or "", None) if self.config.get("subcommand") else None
        self._resume_state = read_resume_checkpoint(config) if config is not None else None
        if self._resume_state is not None:
            # one process per run: the resumed run's folder is locked before anything starts
            taken_over = [hold_run_lock(Path(config["ckpt_path"]).parent, "the run of `--ckpt_path`")]
            # and its MLflow run(s), wherever their checkpoint was copied to (one per population member)
            saved = self._resume_state.get("vaco", {})
            run_ids = [saved.get("mlflow_run_id")] + [m.get("mlflow_run_id") for m in saved.get("members", [])]
            for run_id in dict.fromkeys(r for r in run_ids if isinstance(r, str) and r):
                taken_over.append(hold_mlflow_run_lock(run_id, f"MLflow run {run_id} (the run of `--ckpt_path`)"))
            for line in filter(None, taken_over):
                print(line, file=sys.stderr, flush=True)
            self._budget_line = resume_budget(config, self._resume_state, self._argv)

    def _set_seed(self) -> None:
        """The checks that need no object, before Lightning prints "Seed set to" and before any
        MLflow run exists: the seed's range, the MuJoCo task (registered, continuous) and the
        tracking store (it answers, it accepts the credentials)."""
        config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
        early_checks(config)
        check_tracking(config)
        self._validate_classes()
        if self._budget_line is not None:  # a resume's first line: the budget it runs to, and why
            print(self._budget_line, flush=True)
        super()._set_seed()

    def _validate_classes(self) -> None:
        """Every constructor's own checks, once, before Lightning prints "Seed set to" and before
        the trainer's logger exists (Lightning's MLflow logger opens its client, and so creates a
        SQLite store, in its constructor). The objects are dropped; the run's own are made after
        seeding, as LightningCLI makes them."""
        config = self.config.clone()
        trainer = (config.get(self.subcommand) if self.subcommand else config).get("trainer")
        if trainer is not None:
            trainer["logger"] = False
        try:
            made = self.parser.instantiate_classes(config)
        except (ValueError, TypeError) as err:
            raise ConfigurationError(config_error(err)) from err
        made = made.get(self.subcommand, made) if self.subcommand else made
        if made.get("population", 1) != 1:
            from vaco.data.datamodule import RolloutDataModule, check_memory
            from vaco.population.module import PopulationModule, population_seeds

            try:
                PopulationModule.check_model(made.get("model"))
                data = made.get("data")
                if isinstance(data, RolloutDataModule):  # every member's envs and rollouts in this one process
                    members = len(population_seeds(made["population"], made.get("seed_everything") or 0))
                    check_memory(
                        data.num_envs,
                        data.num_steps,
                        data.policy_buffer_size,
                        members=members,
                        env_bytes=data.collection.env_bytes,
                    )
                    data.collection.check_members(data, members)
            except ValueError as err:
                raise ConfigurationError(str(err)) from None

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
        threads = config.get("torch_threads", 1)
        if not (isinstance(threads, int) and threads >= 1):
            raise ConfigurationError(f"`torch_threads` must be an integer >= 1, got {threads!r}")
        torch.set_num_threads(threads)
        continue_mlflow_run(config, self._resume_state)

    def before_fit(self) -> None:
        """Cross-field checks and the resume check, after the classes exist but before any env
        starts or any MLflow run is created (the logger creates its run lazily)."""
        model: Learner = self.model
        if isinstance(self.trainer.logger, VacoMLFlowLogger):
            self.trainer.logger.default_run_name = _run_name(model, self.datamodule, self.trainer)
        try:
            model.check_data(self.datamodule)
            if self._resume_state is not None:
                check_same_run(self.model, self.datamodule, self._resume_state)
                check_weights_fit(self.model, self.datamodule, self._resume_state)
        except ValueError as err:
            raise ConfigurationError(str(err)) from err
        logger = self.trainer.logger
        if self._resume_state is not None and isinstance(logger, VacoMLFlowLogger) and len(self.trainer.loggers) == 1:
            logger.replay_unsent(resume_env_step(self._resume_state, self.datamodule, self.trainer))

        self._store = host_store_on_loopback(self.trainer)  # single-node DDP: not on every interface

    def _instantiate_trainer(self, config, callbacks):
        if config.get("enable_progress_bar") is False:  # e.g. sweeps writing to log files
            callbacks = [c for c in callbacks if not isinstance(c, VacoProgressBar)]
        elif not sys.stdout.isatty():  # a log file: a line per iteration, not tqdm's redrawn bars
            callbacks = [c for c in callbacks if not isinstance(c, VacoProgressBar)] + [IterationLog()]
            config["enable_progress_bar"] = False
        try:
            return super()._instantiate_trainer(config, callbacks)
        except MisconfigurationException as err:  # e.g. `--trainer.accelerator gpu` on a machine without one
            accelerator = config.get("accelerator")
            on_line = any(word.split("=", 1)[0] == "--trainer.accelerator" for word in self._argv)
            where = None if on_line else file_of_key("`trainer.accelerator`", _CONFIG_FILES)
            given = f"{where} is for machines with a GPU" if where else "it was given on the command line"
            raise ConfigurationError(
                f"`trainer.accelerator` ({accelerator}): {str(err).splitlines()[0]} To train on the CPU, "
                f"leave it out or pass --trainer.accelerator cpu ({given})"
            ) from None

    def instantiate_classes(self) -> None:
        """Report a bad value as one line naming the field, not a jsonargparse traceback."""
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as err:
            raise ConfigurationError(config_error(err)) from err
        config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
        population = config.get("population", 1)
        if population != 1:
            self._make_population(config, population)

    def _make_population(self, config, population) -> None:
        """``--population``: the model and data become the members' (one copy per seed), and the
        trainer logs to one MLflow run per member (the trainer's logger is member 0's)."""
        from vaco.population.module import MEMBER_TAG, POPULATION_TAG, PopulationModule, population_seeds

        try:
            seeds = population_seeds(population, int(config.get("seed_everything")))
            self.model, self.datamodule = PopulationModule.from_run(self.model, self.datamodule, seeds)
        except ValueError as err:
            raise ConfigurationError(str(err)) from None
        saved = (self._resume_state or {}).get("vaco", {})
        if saved.get("population_id"):
            self.model.population_id = saved["population_id"]
        logger = self.trainer.logger
        if not isinstance(logger, VacoMLFlowLogger):
            return
        run_ids = [m.get("mlflow_run_id") for m in saved.get("members", [])] or [None] * len(seeds)
        loggers = []
        for m, (member, data) in enumerate(zip(self.model.members, self.datamodule.members)):
            if m == 0:
                member_logger = logger
            else:
                member_logger = logger.sibling(
                    _member_name(logger.run_name, seeds[0], seeds[m]),
                    _member_tags(logger.tags or {}, seeds[0], seeds[m]),
                    run_ids[m] if m < len(run_ids) else None,
                )
            member_logger.tags = {
                **(member_logger.tags or {}),
                POPULATION_TAG: self.model.population_id,
                MEMBER_TAG: str(m),
            }
            member_logger.default_run_name = _run_name(member, data, self.trainer)
            member.member_logger = member_logger
            loggers.append(member_logger)
        self.trainer.loggers = loggers

    def after_fit(self) -> None:
        stopped = next(
            (c.stop_signal for c in self.trainer.callbacks if getattr(c, "stop_signal", None) is not None), None
        )
        if stopped is not None:
            self._after_stop(stopped)
        if self.trainer.global_rank != 0:
            return
        model, logger = self.model, self.trainer.logger
        _UNSENT.extend(p for p in (getattr(each, "unsent_file", None) for each in self.trainer.loggers) if p)
        vaco = vaco_command()  # `.venv/bin/vaco` where `vaco` is not on PATH (after `make demo`)
        lines = [
            "",
            "vaco: training ended; not every metric reached MLflow (below)." if _UNSENT else "vaco: training finished.",
        ]
        summary = model.summary()
        if summary is not None:
            lines.append(f"  {summary}")
        ckpt = getattr(self.trainer.checkpoint_callback, "last_model_path", "")
        if ckpt:
            lines.append(f"  checkpoint: {ckpt}")
        run_id = getattr(logger, "run_id", None)
        members = getattr(model, "seeds", None)
        uri, experiment = tracking_uri(), ""
        if isinstance(logger, VacoMLFlowLogger):
            uri, experiment = logger.tracking_store, logger.experiment_name
        if run_id and members:
            ids = ", ".join(
                f"s{seed} {getattr(each, 'run_id', None)}" for seed, each in zip(members, self.trainer.loggers)
            )
            lines.append(f"  MLflow runs of population {model.population_id} in experiment '{experiment}': {ids}")
            lines.append(
                f"  open them with: {vaco} ui" + ("" if uri == tracking_uri() else f" --store {shell(redact_uri(uri))}")
            )
        elif run_id:
            lines.append(f"  MLflow run {run_id} in experiment '{experiment}'")
            lines.append(
                f"  open it with: {vaco} ui" + ("" if uri == tracking_uri() else f" --store {shell(redact_uri(uri))}")
            )
        failed = getattr(model, "stopped_members", [])
        if failed:
            lines.append(
                "  stopped alone on a non-finite loss (MLflow runs FAILED): "
                + ", ".join(f"member {m} (seed {members[m]})" for m in failed)
            )
        if ckpt and model.evaluable and members:
            lines.append(
                f"  evaluate member m (0..{len(members) - 1}) with: {vaco} evaluate --ckpt {shell(ckpt)} --member m"
            )
        elif ckpt and model.evaluable:  # `vaco evaluate` runs MuJoCo policies
            lines.append(f"  evaluate it with: {vaco} evaluate --ckpt {shell(ckpt)}")
        print("\n".join(lines), flush=True)
        if failed:  # the others finished; the command did not do all it was asked
            sys.exit(1)

    def _after_stop(self, signum: int) -> None:
        """A run stopped by SIGTERM/SIGUSR2 at an iteration boundary: the MLflow run is marked KILLED
        (not FINISHED: it has more to do), one line says how to resume, and the exit code is 128 + signal."""

        name = signal.Signals(signum).name
        ckpt = getattr(self.trainer.checkpoint_callback, "last_model_path", "")
        if self.trainer.global_rank == 0:
            for each in self.trainer.loggers:  # a population: every member's run
                run_id = getattr(each, "run_id", None)
                if isinstance(each, VacoMLFlowLogger) and run_id:
                    try:
                        each.experiment.set_terminated(run_id, "KILLED")
                    except Exception as err:  # noqa: BLE001 - the checkpoint is on disk; say what could not be marked
                        print(
                            f"vaco: could not mark the MLflow run {run_id} KILLED: {err}", file=sys.stderr, flush=True
                        )
            print(
                f"vaco: stopped by {name} after iteration {int(self.model.version)}; checkpoint {ckpt}; "
                f"resume with: {vaco_command()} fit ... --ckpt_path {shell(ckpt)}",
                file=sys.stderr,
                flush=True,
            )
        sys.exit(128 + int(signum))


def _run_name(model, data, trainer) -> str:
    """The learner's name from the run's coordinates, with what ran it where that is not the
    default: ``vaco Hopper-v5 K=4 s1 [async x2]``, ``[warp]``, ``[envpool]``, ``[ddp x2]``."""
    where = [getattr(getattr(data, "collection", None), "label", None)]
    if trainer.world_size > 1:
        where.append(f"ddp x{trainer.world_size}")
    where = [w for w in where if w]
    return model.default_run_name(data) + (f" [{', '.join(where)}]" if where else "")


def _member_name(name: str | None, first: int, seed: int) -> str | None:
    """A member's name from the first member's, where that ends with its seed (a sweep cell's
    ``...-s1`` run name and cell tag): ``...-s5`` for seed 5."""
    if name is None:
        return None
    for mark in ("-s", " s"):
        if name.endswith(f"{mark}{first}"):
            return name[: -len(str(first))] + str(seed)
    return name


def _member_tags(tags: dict, first: int, seed: int) -> dict:
    """The first member's tags for member ``seed``: the seed's own tag and a cell id that ends with the seed."""

    out = dict(tags)
    if "vaco.seed" in out:
        out["vaco.seed"] = str(seed)
    if CELL_TAG in out:
        out[CELL_TAG] = _member_name(str(out[CELL_TAG]), first, seed)
    return out


_HELP_HEADER = """usage: vaco fit --config FILE [--config FILE ...] [--FIELD VALUE ...] [--ckpt_path CKPT] [--print_config]

Trains one run. Configs compose left to right; any field can be set on the command line with its
dotted name (--data.init_args.policy_buffer_size 4 or, shorter, --data.policy_buffer_size 4).
A field of a chosen class: `vaco fit --model.objective.help vaco.objectives.TVFilter`.

  --config FILE         a YAML file (configs/env/*.yaml, configs/algo/*.yaml, your own)
  --print_config        print the resolved config and exit
  --ckpt_path CKPT      resume from a checkpoint, in the same MLflow run (a larger
                        data.total_steps extends a finished run)
  --seed_everything N   the run's seed (default 1)
  --torch_threads N     torch intra-op threads (default 1)
  --population S        train S seeds (seed_everything on) or a list of seeds [3,5,9] in one process,
                        each member bit for bit its seed's run alone, with its own MLflow run (default 1)
  --checkpoint.every_n_iterations N   checkpoint period in iterations (default 10)
  --trainer.*           Lightning Trainer options (accelerator, devices, strategy, ...):
                        `vaco fit --help-all` lists them all
"""


def _help() -> str:
    """vaco's own fields: the MuJoCo model and data classes, as jsonargparse documents them."""

    sections = [_HELP_HEADER]
    for key, class_path in (("model", "vaco.VacoModule"), ("data", "vaco.data.RolloutDataModule")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            VacoCLI(args=["fit", f"--{key}.help", class_path])
        text = out.getvalue()
        body = text[text.index("\n\n", text.index("usage:")) + 2 :] if "usage:" in text else text
        sections.append(f"{key} ({class_path}; --{key} chooses another class):\n" + body.split("\n", 2)[-1])
    sections.append(
        "The LLM track's classes: `vaco fit --model.help vaco.llm.rlvr_module.RLVRModule`, `--data.help vaco.llm.data.GSM8kDataModule`."
    )
    return "\n".join(sections)


def _quiet() -> None:
    """Silence notices that say nothing to a vaco user (we use ``dataloader_iter`` on purpose:
    it is how the collection of batch T+1 waits until the update on batch T is done)."""
    for message in (
        ".*dataloader_iter.*",
        ".*`isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
        ".*The number of training batches .* is smaller than the logging interval.*",
        ".*does not have many workers which may be a bottleneck.*",
        ".*LightningCLI's args parameter is intended to run from within Python.*",
        ".*The `srun` command is available on your system but is not used.*",
        # torch's own all_gather (called by Lightning's `LightningModule.all_gather`, which vaco's
        # DDP ranks use to share normaliser statistics) calls a function torch deprecates
        ".*`torch.distributed.all_gather_into_tensor` is deprecated.*",
        ".*torch.distributed.nn.functional.all_gather is deprecated.*",
    ):
        warnings.filterwarnings("ignore", message=message)

    # vaco prints its own summary; Lightning's "`Trainer.fit` stopped: `max_epochs=1` reached." says
    # nothing to a user whose run is counted in env steps
    # nothing; "GPU available: False, used: False" and "TPU available: False" greet every CPU run
    # (a GPU that is there, used or not, is still reported)
    def keep(record) -> bool:
        text = record.getMessage()
        return not any(
            noise in text
            for noise in ("litlogger", "`max_epochs=", "GPU available: False, used: False", "TPU available: False")
        )

    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(keep)
    # "Creating initial MLflow database tables..." / "Updating database tables" on a new SQLite store:
    # MLflow's bookkeeping, printed into the first run of every user (warnings and errors still show)
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """``vaco fit ARGS`` (``argv`` without the word ``fit``)."""
    argv = list(sys.argv[2:] if argv is None else argv)
    _quiet()
    if argv in (["-h"], ["--help"]):
        print(_help())
        return 0
    if not argv:
        print(
            "vaco fit: error: no config given; a run is a task and an algorithm, e.g.\n"
            "  vaco fit --config configs/env/hopper.yaml --config configs/algo/vaco.yaml\n"
            "(configs/env/ and configs/algo/ list what exists; `vaco fit --help` lists every field)",
            file=sys.stderr,
        )
        return 2
    if argv and argv[0] == "--help-all":  # Lightning's complete list (every Trainer flag)
        argv = ["--help", *argv[1:]]
    listen_while_starting()
    try:
        _CONFIG_FILES.clear()
        _UNSENT.clear()
        _CONFIG_FILES.update(check_config_files(config_files(argv)))
        refuse_sweep_files(_CONFIG_FILES)
        check_command_line_values(argv)
        _ARGV[:] = argv
        VacoCLI(args=["fit", *argv])
    except (ConfigurationError, CheckpointError, TrackingStoreError) as err:
        print(f"vaco fit: error: {err}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError as err:  # the run stopped itself: its MLflow run is FAILED, the checkpoint kept
        print(f"vaco fit: stopped: {err}", file=sys.stderr)
        sys.exit(1)
    finally:
        stop_listening()
        release_run_locks()
    if _UNSENT:
        print(
            f"vaco fit: training ended, but the run is not finished: {_UNSENT[0]} holds metric batches the MLflow "
            "store never took; once the store takes writes again, resume the run (--ckpt_path its last.ckpt; a sweep "
            "rerun does it) and they are replayed into it first",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
