"""What ``vaco fit`` checks before anything starts, and what a resumed run carries over.

The order (``vaco.commands.fit.VacoCLI``): the seed, the population's size, every folder the run will
write and the task (:func:`early_checks`), the tracking store (:func:`check_tracking`), the
checkpoint to resume from (:func:`read_resume_checkpoint`, :func:`resume_budget`,
:func:`continue_mlflow_run`, :func:`check_same_run`); and jsonargparse's parse errors said in
words (:func:`plain_type_error`). Each failure is a :class:`~vaco.config_errors.ConfigurationError`
of one line naming the field.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from jsonargparse import Namespace

from vaco.config_errors import ConfigurationError, did_you_mean, one_line
from vaco.learners.learner import same_run_problem
from vaco.run.checkpoint import CheckpointError, load_checkpoint
from vaco.tracking import TrackingStoreError, check_tracking_store, redact_uri, tracking_uri

# vaco's own top-level fields, said in words where jsonargparse would list the types it tried
_TYPE_WORDS = {
    "population": "must be an integer >= 1 (that many seeds from seed_everything on) or a list of seeds like [3, 5, 9]",
    "seed_everything": "must be an integer in [0, 2^32 - 1] (or true for a random one)",
    "torch_threads": "must be an integer >= 1",
}


def _configs_in(folder: str) -> str:
    """The shipped configs of ``configs/<folder>`` (this directory's, else the clone vaco runs from)."""

    for root in (Path("configs"), Path(__file__).resolve().parents[2] / "configs"):  # the clone's configs/
        names = sorted(p.stem for p in (root / folder).glob("*.yaml"))
        if names:
            return ", ".join(names)
    return "see the clone's configs/" + folder


def _given(field: str, argv: list[str]) -> str | None:
    """The value ``--field`` (or its ``init_args``-less spelling) has on this command line."""
    spellings = {f"--{field}", f"--{field.replace('.init_args.', '.')}"}
    for i, arg in enumerate(argv):
        key, _, value = arg.partition("=")
        if key in spellings:
            return value if value else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def _given_in_files(field: str, loaded: dict | None) -> str | None:
    """The class path ``field`` (``model.init_args.objective``) has in the last ``--config`` file that
    sets it: its ``class_path``, or the value itself where the file gives a bare name."""
    for tree in reversed(list((loaded or {}).values())):
        node = tree
        for key in field.split("."):
            if not isinstance(node, dict):
                node = None
                break
            node = node.get(key, node.get("init_args", {}).get(key) if key != "init_args" else None)
        if isinstance(node, dict) and node.get("class_path"):
            return str(node["class_path"])
        if isinstance(node, str):
            return node
    return None


def _shipped_classes(module_name: str) -> list[str]:
    """The classes a vaco module ships (its ``__all__``, base classes left out)."""
    module = importlib.import_module(module_name)
    return [
        name
        for name in getattr(module, "__all__", ())
        if inspect.isclass(getattr(module, name, None)) and not getattr(module, name).__module__.endswith(".base")
    ]


def plain_type_error(text: str, argv: list[str], loaded: dict | None = None) -> str:
    """jsonargparse's type bookkeeping said in words: ```population`: Expected a <class 'int'>; ...``
    as ```population` must be ..., got 'four'``; a missing task or algorithm names the config to add;
    an unknown objective or advantage class lists the shipped ones with a did-you-mean."""

    if "arguments are required: fit.data" in text:
        return f"no task given: add --config configs/env/<task>.yaml ({_configs_in('env')})"
    if "arguments are required: fit.model" in text:
        return f"no algorithm given: add --config configs/algo/<algorithm>.yaml ({_configs_in('algo')})"
    found = re.match(r"`(model(?:\.init_args)?\.(objective|advantage))`: .*import path", text)
    if found:
        kind = found.group(2)
        module = "vaco.objectives" if kind == "objective" else "vaco.advantages"
        shipped = _shipped_classes(module)
        given = _given(found.group(1), argv) or _given_in_files(f"model.init_args.{kind}", loaded) or "?"
        hint = did_you_mean(given.rpartition(".")[2], shipped)
        return (
            f"`model.{kind}`: no {kind} class {given!r}; the shipped ones are "
            + ", ".join(f"{module}.{name}" for name in shipped)
            + f" (or your own module.Class, importable from this directory).{hint}"
        )
    for field, words in _TYPE_WORDS.items():
        if text.startswith(f"`{field}`:") and "Expected a <class" in text:
            given = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == f"--{field}"), None)
            given = given or next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{field}=")), None)
            return f"`{field}` {words}" + (f", got {given!r}" if given is not None else "")
    return text


def early_checks(config) -> None:
    seed = config.get("seed_everything")
    if not (seed is None or isinstance(seed, bool) or (isinstance(seed, int) and 0 <= seed < 2**32)):
        raise ConfigurationError(
            f"`seed_everything` must be an integer in [0, 2^32 - 1] (or true for a random one), got {seed!r}"
        )
    trainer = config.get("trainer")
    limit = trainer.get("limit_train_batches") if hasattr(trainer, "get") else None
    if limit is not None and limit != 1.0:
        raise ConfigurationError(
            f"`trainer.limit_train_batches` ({limit!r}) would stop the run before its budget while its checkpoint "
            "says it finished (a resume would train nothing more): shorten a run with --data.init_args.total_steps"
        )
    check_writable(config)
    check_llm_devices(config)
    population = config.get("population", 1)
    if population != 1:
        from vaco.population.module import population_seeds

        try:
            population_seeds(population, seed if isinstance(seed, int) and not isinstance(seed, bool) else 0)
        except ValueError as err:
            raise ConfigurationError(str(err)) from None
    data = config.get("data")
    init = (data.get("init_args") if hasattr(data, "get") else None) or {}
    _check_chat_template(config, init)
    env_id = init.get("env_id") if hasattr(init, "get") else None
    if env_id is not None:  # the MuJoCo data modules (the LLM track's has no env_id)
        from vaco.data.envs import env_spec

        kwargs = init.get("env_kwargs") if hasattr(init, "get") else None
        try:
            env_spec(env_id, dict(kwargs) if kwargs else None, field="data.env_id")
        except ValueError as err:
            raise ConfigurationError(str(err)) from None


def _check_chat_template(config, data_init) -> None:
    """``data.chat_template: true`` with a model whose tokenizer has none: one line before the model
    loads (it failed after, with a traceback, a FAILED run and a checkpoint folder left)."""
    if not (hasattr(data_init, "get") and data_init.get("chat_template") is True):
        return
    model = config.get("model")
    init = (model.get("init_args") if hasattr(model, "get") else None) or {}
    path = init.get("model_path") if hasattr(init, "get") else None
    if not isinstance(path, str) or not os.path.isdir(path):
        return  # the model's own check names a missing folder
    from vaco.llm.policy import has_chat_template

    if not has_chat_template(path):
        raise ConfigurationError(
            f"`data.chat_template` is true but the tokenizer in {path} has no chat template: set it to false or "
            "null, or add `chat_template` to its tokenizer_config.json"
        )


def _device_count(trainer) -> int:
    """How many processes Lightning would start for ``trainer.devices`` x ``trainer.num_nodes``."""
    devices = trainer.get("devices", "auto")
    if isinstance(devices, str) and devices.strip() not in ("auto", "-1"):
        text = devices.strip()  # "2": two devices; "0,1" or "1,": device indices
        devices = [p for p in text.split(",") if p.strip()] if "," in text else int(text) if text.isdigit() else 1
    if devices in ("auto", "-1", -1):
        accelerator = str(trainer.get("accelerator", "auto"))
        import torch

        devices = torch.cuda.device_count() if accelerator in ("auto", "gpu", "cuda") else 1
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    nodes = trainer.get("num_nodes", 1)
    return max(int(devices), 1) * (int(nodes) if isinstance(nodes, int) else 1)


def check_llm_devices(config) -> None:
    """The LLM learner trains in one process: more devices are refused before anything starts."""
    model = config.get("model")
    path = model.get("class_path", "") if hasattr(model, "get") else ""
    trainer = config.get("trainer")
    if not (isinstance(path, str) and path.rsplit(".", 1)[-1] == "RLVRModule" and hasattr(trainer, "get")):
        return
    count = _device_count(trainer)
    if count > 1:
        raise ConfigurationError(
            f"`trainer.devices`: the LLM learner trains on one device, this config would start {count} processes "
            "(trainer.devices x trainer.num_nodes); set --trainer.devices 1 (one process generates and trains; "
            "data-parallel RLVR is not built)"
        )


def config_error(err: Exception) -> str:
    """The validators' own messages, without jsonargparse's union bookkeeping around them."""
    text = str(err)
    reasons = [
        line.strip()[2:]
        for line in text.splitlines()
        if line.strip().startswith("- ")
        and "Expected a <class 'NoneType'>" not in line
        and "Does not validate against any of the Union subtypes" not in line
    ]
    return "; ".join(reasons) if reasons else one_line(text)


def read_resume_checkpoint(config) -> dict | None:
    """The checkpoint given as ``--ckpt_path``, loaded safely (a bad file is one line, exit 2)."""
    ckpt_path = config.get("ckpt_path")
    if not ckpt_path or str(ckpt_path) in ("last", "best", "hpc", "registry"):
        return None
    try:
        return load_checkpoint(str(ckpt_path), field="ckpt_path")
    except CheckpointError as err:
        raise ConfigurationError(str(err)) from None


#: the checkpoint's record of a run's budget -> the data field that sets it (MuJoCo: env steps; the
#: LLM track: optimiser steps)
BUDGET_FIELDS = {"total_steps": "total_steps", "num_steps": "num_steps"}


def resume_budget(config, state: dict, argv: list[str]) -> str | None:
    """A resume runs to the checkpoint's budget unless the command line names another.

    The budget in the config files is the one the run was started from, or a file's default
    (``configs/env/hopper.yaml``'s 1M): taking it would extend a run silently. Only the budget field
    given on this command line (``--data.init_args.total_steps N`` or ``--data.total_steps N``)
    changes it. Returns the line ``vaco fit`` prints first, saying which budget and why."""
    saved = state.get("vaco", {})
    key = next((k for k in BUDGET_FIELDS if isinstance(saved.get(k), int)), None)
    data = config.get("data")
    init = data.get("init_args") if hasattr(data, "get") else None
    if key is None or init is None or not hasattr(init, "get"):
        return None
    field, before = BUDGET_FIELDS[key], saved[key]
    flags = {f"--data.init_args.{field}", f"--data.{field}"}
    asked = any(word.split("=", 1)[0] in flags for word in argv)
    unit = "env steps" if field == "total_steps" else "optimiser steps"
    if asked:
        now = init.get(field)
        had = "as the checkpoint's run had" if now == before else f"the checkpoint's run had {before:,}"
        return f"vaco fit: resuming to a budget of {now:,} {unit} (--data.init_args.{field}; {had})"
    config_value = init.get(field)
    init[field] = before
    note = "" if config_value in (None, before) else f"; the config's {config_value:,} is not used on a resume"
    return (
        f"vaco fit: resuming to the checkpoint's budget of {before:,} {unit}{note} "
        f"(--data.init_args.{field} N runs it to N)"
    )


def _logger_config(config):
    logger = config.get("trainer", {}).get("logger")
    # the parsed logger is a jsonargparse Namespace (a dict only when it comes from the defaults)
    if not isinstance(logger, (dict, Namespace)) or "MLFlowLogger" not in str(logger.get("class_path", "")):
        return None
    if logger.get("init_args") is None:
        logger["init_args"] = type(logger)()
    return logger["init_args"]


def check_tracking(config) -> None:
    init_args = _logger_config(config)
    if init_args is None:
        return
    uri = init_args.get("tracking_uri") or tracking_uri()
    field = (
        "MLFLOW_TRACKING_URI"
        if os.environ.get("MLFLOW_TRACKING_URI") == uri
        else "trainer.logger.init_args.tracking_uri"
    )
    try:
        check_tracking_store(uri, field)
    except TrackingStoreError as err:
        raise ConfigurationError(str(err)) from None


def continue_mlflow_run(config, state: dict | None) -> None:
    """Resuming from a checkpoint logs into the MLflow run that wrote it (unless a run is given)."""
    init_args = _logger_config(config)
    if state is None or init_args is None or init_args.get("run_id"):
        return
    run_id = state.get("vaco", {}).get("mlflow_run_id")
    if not run_id:
        return
    import mlflow

    uri = init_args.get("tracking_uri") or tracking_uri()
    try:
        mlflow.MlflowClient(uri).get_run(run_id)
    except mlflow.exceptions.MlflowException:
        raise ConfigurationError(
            f"`ckpt_path`: its MLflow run {run_id} is not in the tracking store {redact_uri(uri)}; set MLFLOW_TRACKING_URI "
            "to the store the run was tracked in, or pass --trainer.logger.init_args.run_id to log elsewhere"
        ) from None
    init_args["run_id"] = run_id


def resume_env_step(state: dict, datamodule, trainer) -> int | None:
    """The env step (the MLflow step) a MuJoCo checkpoint was saved at; None where it is not known."""
    version = state.get("state_dict", {}).get("version")
    rows = getattr(datamodule, "num_envs", None), getattr(datamodule, "num_steps", None)
    if version is None or None in rows:
        return None
    return int(version) * rows[0] * rows[1] * trainer.world_size


def check_writable(config) -> None:
    """Every folder the run will write is writable, checked before anything starts (seeding, envs,
    the MLflow run): a checkpoint folder found unwritable at the first save lost everything trained
    before it."""
    ckpt = config.get("checkpoint") or {}
    trainer = config.get("trainer") or {}
    dirpath = ckpt.get("dirpath") if hasattr(ckpt, "get") else None
    if dirpath:
        folder, field = str(dirpath), "checkpoint.dirpath"
    else:
        root = (trainer.get("default_root_dir") if hasattr(trainer, "get") else None) or os.getcwd()
        folder, field = os.path.join(str(root), "checkpoints"), "trainer.default_root_dir"
    problem = _unwritable(folder)
    if problem is not None:
        raise ConfigurationError(
            f"`{field}`: checkpoints go to {folder}, but {problem}; choose a folder you can write (--{field} DIR)"
        )


def _unwritable(folder: str) -> str | None:
    """Why ``folder`` (made if missing) cannot be written, or None: the nearest existing folder on
    its path must take a new file."""
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if not os.path.isdir(path):
        return f"{path} is a file, not a folder"

    try:  # a real write: os.access says yes to root on a read-only mount
        handle, probe = tempfile.mkstemp(prefix=".vaco-write-check-", dir=path)
    except OSError as err:
        return f"{path} is not writable ({err.strerror or err})"
    os.close(handle)
    os.unlink(probe)
    return None


def check_weights_fit(model, datamodule, checkpoint: dict) -> None:
    """Refuse, before any MLflow run is touched, a checkpoint whose weights do not fit the model this
    config builds (another network size, another task's dimensions): the learner's task-sized modules
    are built here as ``setup`` would build them (:meth:`~vaco.learners.learner.Learner.build`, which
    builds once), and every tensor both hold must have the same shape."""
    saved = checkpoint.get("state_dict")
    if not isinstance(saved, dict):
        return
    model.build(datamodule)
    have = model.state_dict()
    for key, tensor in saved.items():
        if key in have and hasattr(tensor, "shape") and tuple(have[key].shape) != tuple(tensor.shape):
            raise ValueError(
                f"`ckpt_path`: its weights do not fit the model this config builds ({key}: {list(tensor.shape)} in "
                f"the checkpoint, {list(have[key].shape)} here); resume with the config the run was made with "
                "(its config.yaml), or start a new run"
            )


def check_same_run(model, datamodule, state: dict) -> None:
    """Refuse to resume a checkpoint into a different experiment (only the budget may change). A
    checkpoint holds the data module's defining settings twice: in the run's definition and in its
    data settings (``datamodule_hyper_parameters``, what ``vaco evaluate`` reads, e.g. the reward);
    both must be the config's, so a checkpoint edited in either place is refused in one line."""
    saved = state.get("vaco", {}).get("definition")
    if saved is None:  # written by a learner that had no data module to define the run by
        return
    problem = same_run_problem(saved, model.run_definition(datamodule))
    stored, given = state.get("datamodule_hyper_parameters") or {}, getattr(datamodule, "hparams", {})
    keys = [k for k in datamodule.defining_fields if k in stored and k in given]
    problem = problem or same_run_problem(
        {f"data.init_args.{k}": _plain(stored[k]) for k in keys},
        {f"data.init_args.{k}": _plain(given[k]) for k in keys},
    )
    if problem is not None:
        raise ValueError(problem)


def _plain(value):
    """A stored setting as the config gives it (a tuple read back is the list written)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value
