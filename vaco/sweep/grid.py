"""The sweep file: loading and validating it, the grid's cells, each cell's ``vaco fit`` config.

Imports nothing heavy (``vaco sweep --help`` and ``--dry-run`` stay fast); ``vaco fit``'s parser
is imported only to validate the cells' configs.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import inspect
import itertools
import json
import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any

import yaml

from vaco.tracking import CELL_TAG, PARENT_RUN_ID_TAG, SETTINGS_TAG

__all__ = [
    "AXES",
    "Algorithm",
    "Block",
    "Cell",
    "Sweep",
    "SweepError",
    "load_sweep",
    "expand",
    "cell_config",
    "validate_with_cli",
]

AXES = ("algorithm", "env", "K", "realign", "seed")  # and each axis an objective or advantage declares
_TOP_FIELDS = (
    "experiment",
    "output_dir",
    "jobs",
    "configs_dir",
    "overrides",
    "defaults",
    "grid",
    "description",
    "launcher",
    "resources",
)
_AXIS_DEFAULTS = {"K": [1], "seed": [1]}
_LOGGER = "vaco.logger.VacoMLFlowLogger"
_VTRACE = "vaco.advantages.VTrace"
_GAE = "vaco.advantages.GAE"
# fields a cell's coordinates or the sweep itself set; an override of them is an error
_RESERVED = (
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


_SAFE_ID = re.compile(r"[A-Za-z0-9_.+=-]+")  # what a value may hold to become part of a cell id
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


# ---------------------------------------------------------------------------------------- model
@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One configs/algo/*.yaml file and what its classes accept."""

    name: str
    config: dict
    objective: str  # class path
    advantage: str | None  # class path; None where the module has its own (the LLM track's group-relative)
    realign_optional: bool  # False when the objective re-estimates V-trace itself (IMPALA)
    lag_key: str = "data.init_args.policy_buffer_size"  # what the K axis sets (the module class declares it)

    @property
    def realigned(self) -> bool:
        return self.advantage == _VTRACE

    def class_path(self, part: str, realigned: bool) -> str | None:
        """The objective's, or the advantage's with realignment on or off."""
        if part == "objective":
            return self.objective
        if realigned == self.realigned or self.advantage is None:
            return self.advantage
        return _VTRACE if realigned else _GAE

    def axes(self, realigned: bool) -> dict[str, tuple[str, list[str]]]:
        """Axis -> (run-id label, the parts that take it): the ``sweep_axes`` the objective and
        the advantage module declare, the objective's first. IMPALA's rho_bar is in both."""
        out: dict[str, tuple[str, list[str]]] = {}
        for part in ("objective", "advantage"):
            class_path = self.class_path(part, realigned)
            if class_path is None:
                continue
            for axis, label in getattr(_import(class_path), "sweep_axes", {}).items():
                out.setdefault(axis, (label, []))[1].append(part)
        return out

    def init_arg(self, part: str, name: str, realigned: bool | None = None):
        """The value in the YAML, else the class default (of the class the cell uses)."""
        realigned = self.realigned if realigned is None else realigned
        class_path = self.class_path(part, realigned)
        block = self.config["model"]["init_args"][part]
        given = block.get("init_args") or {} if class_path == block["class_path"] else {}
        value = given.get(name, inspect.Parameter.empty)
        if value is inspect.Parameter.empty:
            value = inspect.signature(_import(class_path)).parameters[name].default
        return value


@dataclasses.dataclass(frozen=True)
class Block:
    name: str
    algorithm: tuple[str, ...]
    env: tuple[str, ...]
    K: tuple[int, ...]
    seed: tuple[int, ...]
    realign: tuple[bool, ...] | None = None
    settings: tuple[tuple[str, tuple], ...] = ()  # (declared axis, values), e.g. ("delta", (0.1, 0.2))
    extra: tuple[tuple[str, tuple], ...] = ()  # (dotted `vaco fit` key, values): any other axis


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the grid: its coordinates, with a value for every axis its modules declare."""

    algorithm: str  # label: a configs/algo name, or ``<name>+realign`` / ``<name>-realign``
    base: str  # the configs/algo file the cell starts from
    env: str
    K: int
    seed: int
    settings: tuple[tuple[str, Any], ...]  # (declared axis, value): ("delta", 0.2), ("rho_bar", 1.0)
    realign: bool
    label_suffix: str = ""  # "-delta0.4-rho2" where an axis differs from the config's value
    extra: tuple[tuple[str, Any], ...] = ()  # values of the dotted-key axes

    @property
    def delta(self) -> float | None:
        return dict(self.settings).get("delta")

    @property
    def rho_bar(self) -> float | None:
        return dict(self.settings).get("rho_bar")

    @property
    def id(self) -> str:
        name = self.algorithm.split("[")[0].replace("+", "_")
        return f"{name}-{self.env}-K{self.K}{self.label_suffix}-s{self.seed}"

    @property
    def run_name(self) -> str:
        return self.id

    def coordinates(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "env": self.env,
            "K": self.K,
            **dict(self.settings),
            "realign": self.realign,
            "seed": self.seed,
            **dict(self.extra),
        }

    def tags(self, settings: str) -> dict[str, str]:
        tags = {f"vaco.{k}": _fmt(v) for k, v in self.coordinates().items() if v is not None}
        tags[CELL_TAG] = self.id
        tags[SETTINGS_TAG] = settings
        return tags


@dataclasses.dataclass
class Sweep:
    """A validated sweep file."""

    path: Path
    experiment: str
    output_dir: Path
    jobs: int
    configs_dir: Path
    overrides: dict[str, Any]
    blocks: list[Block]
    algorithms: dict[str, Algorithm]
    envs: dict[str, dict]
    description: str = ""
    launcher: str = "local"
    resources: dict = dataclasses.field(default_factory=dict)
    parent_run_id: str | None = None  # the sweep's parent MLflow run (set when the sweep starts)

    @property
    def settings(self) -> str:
        """A hash of the shared overrides: runs of one experiment must share them."""
        text = json.dumps(self.overrides, sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:10]

    def cell_dir(self, cell: Cell) -> Path:
        return self.output_dir / cell.id


# ---------------------------------------------------------------------------------------- loading
def load_sweep(path: str | os.PathLike, output_dir: str | None = None) -> Sweep:
    """Read and validate a sweep file (structure, names, types; not yet `vaco fit`'s parser)."""
    from vaco.config_errors import ConfigurationError, check_config_files

    path = Path(path)
    if not path.is_file():
        raise SweepError(f"`--config`: no sweep file at {path}")
    try:  # unreadable, a tab, broken indentation: the file, the line and what is wrong
        raw = check_config_files([str(path)])[str(path)] or {}
    except ConfigurationError as err:
        raise SweepError(str(err)) from None
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with the fields {', '.join(_TOP_FIELDS)}")
    for key in raw:
        if key not in _TOP_FIELDS:
            raise SweepError(f"{path}: unknown field `{key}` (known: {', '.join(_TOP_FIELDS)})")
    experiment = raw.get("experiment")
    if not (isinstance(experiment, str) and experiment.strip()):
        raise SweepError(f"{path}: `experiment` (the MLflow experiment name) is required")
    check_text("experiment", experiment)
    jobs = raw.get("jobs", 1)
    if not (isinstance(jobs, int) and not isinstance(jobs, bool) and jobs >= 1):
        raise SweepError(f"`jobs` must be an integer >= 1, got {jobs!r}")
    configs_dir = _configs_dir(path, raw.get("configs_dir"))
    algorithms = _load_algorithms(configs_dir)
    envs = _load_envs(configs_dir)
    overrides = _load_overrides(raw.get("overrides") or {}, algorithms)
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SweepError("`defaults` must be a mapping of axis -> values")
    grid = raw.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise SweepError("`grid` must be a mapping of block name -> axes, with at least one block")
    blocks = [_load_block(str(name), body, defaults, algorithms, envs) for name, body in grid.items()]
    for block in blocks:
        for key, _ in block.extra:
            if key in overrides:
                raise SweepError(f"`grid.{block.name}.{key}` is also in `overrides`: keep it in one place")
    out = Path(output_dir) if output_dir else Path(raw.get("output_dir") or Path("sweeps") / experiment)
    return Sweep(
        path=path,
        experiment=experiment,
        output_dir=out.resolve(),
        jobs=jobs,
        configs_dir=configs_dir,
        overrides=overrides,
        blocks=blocks,
        algorithms=algorithms,
        envs=envs,
        description=str(raw.get("description", "")),
        launcher=_load_launcher(raw.get("launcher", "local")),
        resources=_load_resources(raw.get("resources") or {}),
    )


LAUNCHERS = ("local", "slurm", "ray")


def _load_launcher(value) -> str:
    if value not in LAUNCHERS:
        raise SweepError(f"`launcher` must be one of {', '.join(LAUNCHERS)}, got {value!r}")
    return value


def _load_resources(raw) -> dict:
    from vaco.sweep.launchers import RESOURCE_FIELDS

    if not isinstance(raw, dict):
        raise SweepError("`resources` must be a mapping, e.g. {cpus: 1, gpus: 0, mem_gb: 8, time_min: 600}")
    for key, value in raw.items():
        if key not in RESOURCE_FIELDS:
            raise SweepError(f"`resources.{key}`: unknown field (known: {', '.join(RESOURCE_FIELDS)})")
        kind = RESOURCE_FIELDS[key][0]
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise SweepError(
                f"`resources.{key}` must be a {'non-negative integer' if kind is int else 'string'}, got {value!r}"
            )
    return check_resources(dict(raw))


def _configs_dir(path: Path, given: str | None) -> Path:
    if given:
        found = (path.parent / given).resolve()
    else:  # configs/sweeps/x.yaml -> configs/; else the repository's configs/
        found = path.resolve().parent.parent
        if not (found / "algo").is_dir():
            found = Path(__file__).resolve().parents[2] / "configs"
    if not (found / "algo").is_dir() or not (found / "env").is_dir():
        raise SweepError(f"`configs_dir`: {found} has no algo/ and env/ folders")
    return found


def _import(class_path: str, where: str = "class_path"):
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise SweepError(
            f"`{where}`: cannot import {class_path!r} ({err}); run `vaco sweep` from the directory that holds "
            "the module (it is on the import path there, as for `vaco fit`), or install it"
        ) from None


def _load_algorithms(configs_dir: Path) -> dict[str, Algorithm]:
    out = {}
    for file in sorted((configs_dir / "algo").glob("*.yaml")):
        config = yaml.safe_load(file.read_text())
        init = config["model"]["init_args"]
        objective, advantage = init["objective"]["class_path"], (init.get("advantage") or {}).get("class_path")
        where = f"{file}: model.init_args.objective.class_path"
        module = _import(config["model"].get("class_path", "vaco.VacoModule"), f"{file}: model.class_path")
        out[file.stem] = Algorithm(
            name=file.stem,
            config=config,
            objective=objective,
            advantage=advantage,
            lag_key=getattr(module, "lag_key", "data.init_args.policy_buffer_size"),
            realign_optional=not getattr(_import(objective, where), "reestimate_advantage", False)
            and advantage in (_VTRACE, _GAE),
        )
    return out


def _load_envs(configs_dir: Path) -> dict[str, dict]:
    return {file.stem: yaml.safe_load(file.read_text()) for file in sorted((configs_dir / "env").glob("*.yaml"))}


def declared_axes(algorithms: dict[str, Algorithm]) -> dict[str, list[str]]:
    """Every axis the algorithms' objectives and advantage modules declare (with realignment on
    and off) -> the parts (objective, advantage) that take it."""
    out: dict[str, list[str]] = {}
    for algo in algorithms.values():
        for realigned in (True, False) if algo.realign_optional else (algo.realigned,):
            for axis, (_, parts) in algo.axes(realigned).items():
                out.setdefault(axis, [])
                out[axis] += [p for p in parts if p not in out[axis]]
    return out


def _reserved(algorithms: dict[str, Algorithm]) -> list[str]:
    """Fields the sweep sets itself: the fixed ones, what K sets, and each declared axis's argument."""
    axes = declared_axes(algorithms)
    return list(
        dict.fromkeys(
            [
                *_RESERVED,
                *(a.lag_key for a in algorithms.values()),
                *(f"model.init_args.{part}.init_args.{a}" for a, parts in axes.items() for part in parts),
            ]
        )
    )


def _load_overrides(raw: dict, algorithms: dict[str, Algorithm]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SweepError("`overrides` must be a mapping of dotted `vaco fit` keys -> values")
    out, reserved_keys = {}, _reserved(algorithms)
    for key, value in raw.items():
        key = str(key)
        if key.startswith("--"):
            key = key[2:]
        for reserved in reserved_keys:
            if key == reserved or key.startswith(reserved + ".") or reserved.startswith(key + "."):
                raise SweepError(
                    f"`overrides.{key}`: set by the sweep itself ({reserved}); use the grid axes "
                    f"{', '.join([*AXES, *declared_axes(algorithms)])} or an algorithm config instead"
                )
        out[key] = value
    return out


def _as_list(block: str, axis: str, value) -> list:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise SweepError(f"`grid.{block}.{axis}` is empty")
    return values


def _check_values(block: str, axis: str, values: list, algorithms, envs) -> tuple:
    where = f"`grid.{block}.{axis}`"
    if axis not in AXES:  # a declared axis: numbers, checked by its class's own constructor
        for v in values:
            if not (isinstance(v, (int, float)) and not isinstance(v, bool)):
                raise SweepError(f"{where}: values must be numbers, got {v!r}")
        return tuple(dict.fromkeys(float(v) for v in values))
    for v in values:
        if axis == "algorithm" and v not in algorithms:
            raise SweepError(f"{where}: unknown algorithm `{v}` (known: {', '.join(algorithms)})")
        if axis == "env" and v not in envs:
            raise SweepError(f"{where}: unknown env `{v}` (known: {', '.join(envs)})")
        if axis in ("K", "seed"):
            low = 1 if axis == "K" else 0
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= low):
                raise SweepError(f"{where}: values must be integers >= {low}, got {v!r}")
        if axis == "realign" and not isinstance(v, bool):
            raise SweepError(f"{where}: values must be true or false, got {v!r}")
    return tuple(dict.fromkeys(values))


def _load_block(name: str, body, defaults: dict, algorithms, envs) -> Block:
    if not isinstance(body, dict):
        raise SweepError(f"`grid.{name}` must be a mapping of axis -> values")
    axes = declared_axes(algorithms)
    for source, where in ((body, f"grid.{name}"), (defaults, "defaults")):
        for key in source:
            if key not in AXES and key not in axes and "." not in str(key):
                raise SweepError(
                    f"`{where}`: unknown field `{key}` (the axes are {', '.join([*AXES, *axes])}, the last "
                    "declared by the objectives and advantage modules; or any dotted `vaco fit` key such as "
                    "model.init_args.lr)"
                )
    extra = []
    for key in dict.fromkeys([k for k in (*defaults, *body) if "." in str(k)]):
        _load_overrides({key: None}, algorithms)  # the same reserved-key check as `overrides`
        raw = body.get(key, defaults.get(key))
        values = tuple(dict.fromkeys(_as_list(name, key, raw)))
        for value in values:  # each value becomes part of a cell id: a folder name and an MLflow filter
            text = _fmt(value)
            if not _SAFE_ID.fullmatch(text) or ".." in text:
                raise SweepError(
                    f"`grid.{name}.{key}`: {value!r} cannot name a cell (its folder and MLflow run): a value is "
                    "a number, true/false, or text of letters, digits and _ . + = - (no '..')"
                )
        extra.append((str(key), values))
    values: dict[str, Any] = {}
    for axis in (*AXES, *axes):
        raw = body.get(axis, defaults.get(axis, _AXIS_DEFAULTS.get(axis)))
        if raw is None:
            if axis in ("algorithm", "env"):
                raise SweepError(f"`grid.{name}.{axis}` is required (in the block or in `defaults`)")
            values[axis] = None
            continue
        values[axis] = _check_values(name, axis, _as_list(name, axis, raw), algorithms, envs)
    settings = tuple((a, values.pop(a)) for a in axes if values.get(a) is not None)
    for a in axes:
        values.pop(a, None)
    block = Block(name=name, **values, settings=settings, extra=tuple(extra))
    algos = [algorithms[a] for a in block.algorithm]
    if block.realign is not None and not any(a.realign_optional for a in algos):
        raise SweepError(f"`grid.{name}.realign`: none of {list(block.algorithm)} can switch realignment")

    def realign_values(a: Algorithm) -> set:
        return set(block.realign) if (block.realign and a.realign_optional) else {a.realigned}

    for axis, axis_values in settings:
        takers = [(a, r) for a in algos for r in realign_values(a) if axis in a.axes(r)]
        if not takers:
            raise SweepError(f"`grid.{name}.{axis}`: none of {list(block.algorithm)} takes {axis}")
        for algo, realigned in takers:  # the class's own checks, before any cell starts
            part = algo.axes(realigned)[axis][1][0]
            class_path = algo.class_path(part, realigned)
            config = algo.config["model"]["init_args"][part]
            init = dict(config.get("init_args") or {}) if config["class_path"] == class_path else {}
            cls = _import(class_path)
            for v in axis_values:
                try:
                    cls(**{**init, axis: v})
                except ValueError as err:
                    raise SweepError(f"`grid.{name}.{axis}`: {v!r} is refused by {cls.__name__}: {err}") from None
                except Exception:  # the class needs more than its config gives; `vaco fit` checks it
                    break
    return block


# ---------------------------------------------------------------------------------------- cells
def expand(sweep: Sweep) -> list[Cell]:
    """The sweep's cells in block order, each once (see the module docstring for the rule)."""
    cells: dict[str, Cell] = {}
    for block in sweep.blocks:
        product = itertools.product(
            block.algorithm,
            block.env,
            block.K,
            block.seed,
            block.realign or (None,),
            itertools.product(*(values for _, values in block.settings)),
            itertools.product(*(values for _, values in block.extra)),
        )
        keys = [key for key, _ in block.extra]
        axes = [axis for axis, _ in block.settings]
        for name, env, K, seed, realign, setting, extra in product:
            given = dict(zip(axes, setting))
            cell = _make_cell(sweep, sweep.algorithms[name], env, K, seed, realign, given)
            if keys:
                cell = _with_extra(cell, tuple(zip(keys, extra)))
            cells.setdefault(cell.id, cell)
    return list(cells.values())


def _make_cell(sweep: Sweep, algo: Algorithm, env, K, seed, realign, given: dict[str, float]) -> Cell:
    """A cell takes a value for each axis its modules declare: the block's, else its config's
    (the id says only what differs from the config: ``-delta0.4``, ``-rho2``)."""
    realigned = algo.realigned if (realign is None or not algo.realign_optional) else realign
    label, base = algo.name, algo
    if realigned != algo.realigned:
        twin = _twin(sweep.algorithms, algo, realigned)
        label = twin.name if twin else f"{algo.name}{'+' if realigned else '-'}realign"
        base = twin or algo
    suffix, settings = "", []
    for axis, (short, parts) in base.axes(realigned).items():
        default = float(base.init_arg(parts[-1], axis, realigned))
        value = given.get(axis, default)
        suffix += f"-{short}{_fmt(value)}" if value != default else ""
        settings.append((axis, value))
    return Cell(label, base.name, env, K, seed, tuple(settings), realigned, suffix)


def _with_extra(cell: Cell, extra: tuple[tuple[str, Any], ...]) -> Cell:
    """A dotted-key axis makes a variant of the algorithm: ``vaco[lr=0.0001]`` is compared with
    ``vaco[lr=0.0003]`` by the report as two algorithms, never averaged together."""
    short = ",".join(f"{key.rsplit('.', 1)[-1]}={_fmt(value)}" for key, value in extra)
    suffix = "".join(f"-{key.rsplit('.', 1)[-1]}{_fmt(value)}" for key, value in extra)
    return dataclasses.replace(
        cell, algorithm=f"{cell.algorithm}[{short}]", label_suffix=cell.label_suffix + suffix, extra=extra
    )


def _twin(algorithms: dict[str, Algorithm], algo: Algorithm, realigned: bool) -> Algorithm | None:
    """The configs/algo entry that is ``algo`` with the other advantage (vaco <-> vaco_no_realign)."""
    want = _VTRACE if realigned else _GAE
    init = algo.config["model"]["init_args"]["objective"].get("init_args") or {}
    for other in algorithms.values():
        other_init = other.config["model"]["init_args"]["objective"].get("init_args") or {}
        if other.objective == algo.objective and other.advantage == want and other_init == init:
            return other
    return None


def cell_config(sweep: Sweep, cell: Cell, tracking_uri: str | None = None) -> dict:
    """The whole ``vaco fit`` config of one cell (env YAML + algorithm YAML + axes + overrides).
    The tracking store is not in it (``tracking_uri`` is accepted and unused): the cell's process
    gets ``MLFLOW_TRACKING_URI`` from its launcher."""
    algo = sweep.algorithms[cell.base]
    config = copy.deepcopy(sweep.envs[cell.env])
    _merge(config, copy.deepcopy({k: v for k, v in algo.config.items() if k != "data"}))
    model = config["model"]["init_args"]
    if cell.realign != algo.realigned:  # realign axis on an algorithm without a twin config
        old = model["advantage"].get("init_args") or {}
        kept = {k: old[k] for k in ("gamma", "lmbda") if k in old}
        model["advantage"] = {"class_path": _VTRACE if cell.realign else _GAE, "init_args": kept}
        if cell.realign:
            model["advantage"]["init_args"].update(rho_bar=1.0, c_bar=1.0)
    axes = algo.axes(cell.realign)
    for axis, value in cell.settings:  # every part that takes the axis (IMPALA: both modules agree)
        for part in axes[axis][1]:
            if model[part].get("init_args") is None:
                model[part]["init_args"] = {}
            model[part]["init_args"][axis] = value
    model["algorithm_name"] = cell.algorithm
    config["seed_everything"] = cell.seed
    _set_dotted(config, algo.lag_key, cell.K)
    config["torch_threads"] = 1
    cell_dir = sweep.cell_dir(cell)
    given_logger = ((config.get("trainer") or {}).get("logger") or {}).get("init_args") or {}
    config.setdefault("trainer", {}).update(
        {
            "default_root_dir": str(cell_dir),
            "logger": {
                "class_path": _LOGGER,
                "init_args": {
                    "experiment_name": sweep.experiment,
                    "run_name": cell.run_name,
                    "tags": {
                        **cell.tags(sweep.settings),
                        **({PARENT_RUN_ID_TAG: sweep.parent_run_id} if sweep.parent_run_id else {}),
                    },
                    # no tracking_uri: a cell reads MLFLOW_TRACKING_URI from the environment the
                    # launcher gives it, so credentials in the URI never reach shared storage
                    "log_model": given_logger.get("log_model", True),  # a config's false stays false
                },
            },
        }
    )
    config.setdefault("checkpoint", {})["dirpath"] = str(cell_dir / "checkpoints")
    config.setdefault("progress_bar", {})["refresh_rate"] = 0  # logs without carriage-return noise
    for key, value in (*sweep.overrides.items(), *cell.extra):
        _set_dotted(config, key, copy.deepcopy(value))
    return config


def _merge(base: dict, top: dict) -> None:
    """``top`` over ``base``, recursively (as ``vaco fit --config env --config algo`` composes);
    a node naming another ``class_path`` replaces the node whole."""
    for key, value in top.items():
        old = base.get(key)
        if (
            isinstance(old, dict)
            and isinstance(value, dict)
            and old.get("class_path", value.get("class_path")) == value.get("class_path", old.get("class_path"))
        ):
            _merge(old, value)
        else:
            base[key] = value


def _set_dotted(config: dict, key: str, value) -> None:
    parts = key.split(".")
    node = config
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# ---------------------------------------------------------------------------------------- validation
class _Parsed(Exception):
    pass


def validate_with_cli(sweep: Sweep, cells: list[Cell], tracking_uri: str) -> None:
    """Parse one cell per (algorithm, env) with ``vaco fit``'s own parser: unknown or mistyped
    override fields fail here, before anything starts, with jsonargparse's message."""
    from vaco.cli import VacoCLI

    class ParseOnly(VacoCLI):
        def init_parser(self, **kwargs):
            kwargs["exit_on_error"] = False
            return super().init_parser(**kwargs)

        def before_instantiate_classes(self) -> None:
            raise _Parsed

    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    seen = set()
    for cell in cells:
        key = (cell.algorithm, cell.env, tuple(axis for axis, _ in cell.settings))
        if key in seen:
            continue
        seen.add(key)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*args parameter is intended.*")
                ParseOnly(args=cell_config(sweep, cell, tracking_uri), run=False)
        except _Parsed:
            continue
        except (Exception, SystemExit) as err:  # jsonargparse's ArgumentError names the key
            from vaco.config_errors import one_line

            raise SweepError(
                f"`overrides`: `vaco fit` rejects the config of cell {cell.id}: {one_line(str(err))}"
            ) from None
