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
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import dataclasses
import fnmatch
import hashlib
import importlib
import inspect
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "AXES",
    "Cell",
    "Sweep",
    "SweepError",
    "load_sweep",
    "expand",
    "cell_config",
    "main",
]

AXES = ("algorithm", "env", "K", "delta", "rho_bar", "realign", "seed")
_TOP_FIELDS = (
    "experiment",
    "output_dir",
    "jobs",
    "configs_dir",
    "overrides",
    "defaults",
    "grid",
    "description",
)
_AXIS_DEFAULTS = {"K": [1], "seed": [1]}
_LOGGER = "vaco.logger.VacoMLFlowLogger"
_VTRACE = "vaco.advantages.VTrace"
_GAE = "vaco.advantages.GAE"
CELL_TAG = "vaco.sweep.cell"
SETTINGS_TAG = "vaco.sweep.settings"
PARENT_TAG = "vaco.sweep.parent"  # "true" on the sweep's parent run; its cells are nested under it
PARENT_RUN_ID_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag
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
    "model.init_args.objective.init_args.delta",
    "model.init_args.objective.init_args.rho_bar",
    "model.init_args.advantage.class_path",
    "model.init_args.advantage.init_args.rho_bar",
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


# ---------------------------------------------------------------------------------------- model
@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One configs/algo/*.yaml file and what its classes accept."""

    name: str
    config: dict
    objective: str  # class path
    advantage: str  # class path
    takes_delta: bool
    objective_takes_rho_bar: bool
    realign_optional: bool  # False when the objective re-estimates V-trace itself (IMPALA)

    @property
    def realigned(self) -> bool:
        return self.advantage == _VTRACE

    def init_arg(self, part: str, name: str):
        """The value in the YAML, else the class default."""
        block = self.config["model"]["init_args"][part]
        value = (block.get("init_args") or {}).get(name, inspect.Parameter.empty)
        if value is inspect.Parameter.empty:
            value = inspect.signature(_import(block["class_path"])).parameters[name].default
        return value


@dataclasses.dataclass(frozen=True)
class Block:
    name: str
    algorithm: tuple[str, ...]
    env: tuple[str, ...]
    K: tuple[int, ...]
    seed: tuple[int, ...]
    delta: tuple[float, ...] | None = None
    rho_bar: tuple[float, ...] | None = None
    realign: tuple[bool, ...] | None = None
    extra: tuple[tuple[str, tuple], ...] = ()  # (dotted `vaco fit` key, values): any other axis


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the grid. ``delta``/``rho_bar`` are None where the axis does not apply."""

    algorithm: str  # label: a configs/algo name, or ``<name>+realign`` / ``<name>-realign``
    base: str  # the configs/algo file the cell starts from
    env: str
    K: int
    seed: int
    delta: float | None
    rho_bar: float | None
    realign: bool
    label_suffix: str = ""  # "-delta0.4-rho2" where delta/rho differ from the config's value
    extra: tuple[tuple[str, Any], ...] = ()  # values of the dotted-key axes

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
            "delta": self.delta,
            "rho_bar": self.rho_bar,
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
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"`--config`: no sweep file at {path}")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with the fields {', '.join(_TOP_FIELDS)}")
    for key in raw:
        if key not in _TOP_FIELDS:
            raise SweepError(f"{path}: unknown field `{key}` (known: {', '.join(_TOP_FIELDS)})")
    experiment = raw.get("experiment")
    if not (isinstance(experiment, str) and experiment.strip()):
        raise SweepError(f"{path}: `experiment` (the MLflow experiment name) is required")
    jobs = raw.get("jobs", 1)
    if not (isinstance(jobs, int) and not isinstance(jobs, bool) and jobs >= 1):
        raise SweepError(f"`jobs` must be an integer >= 1, got {jobs!r}")
    configs_dir = _configs_dir(path, raw.get("configs_dir"))
    algorithms = _load_algorithms(configs_dir)
    envs = _load_envs(configs_dir)
    overrides = _load_overrides(raw.get("overrides") or {})
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
    )


def _configs_dir(path: Path, given: str | None) -> Path:
    if given:
        found = (path.parent / given).resolve()
    else:  # configs/sweeps/x.yaml -> configs/; else the repository's configs/
        found = path.resolve().parent.parent
        if not (found / "algo").is_dir():
            found = Path(__file__).resolve().parents[1] / "configs"
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
        objective, advantage = init["objective"]["class_path"], init["advantage"]["class_path"]
        where = f"{file}: model.init_args.objective.class_path"
        objective_params = inspect.signature(_import(objective, where)).parameters
        out[file.stem] = Algorithm(
            name=file.stem,
            config=config,
            objective=objective,
            advantage=advantage,
            takes_delta="delta" in objective_params,
            objective_takes_rho_bar="rho_bar" in objective_params,
            realign_optional=not getattr(_import(objective, where), "reestimate_advantage", False)
            and advantage in (_VTRACE, _GAE),
        )
    return out


def _load_envs(configs_dir: Path) -> dict[str, dict]:
    return {
        file.stem: yaml.safe_load(file.read_text()) for file in sorted((configs_dir / "env").glob("*.yaml"))
    }


def _load_overrides(raw: dict) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SweepError("`overrides` must be a mapping of dotted `vaco fit` keys -> values")
    out = {}
    for key, value in raw.items():
        key = str(key)
        if key.startswith("--"):
            key = key[2:]
        for reserved in _RESERVED:
            if key == reserved or key.startswith(reserved + ".") or reserved.startswith(key + "."):
                raise SweepError(
                    f"`overrides.{key}`: set by the sweep itself ({reserved}); use the grid axes "
                    f"{', '.join(AXES)} or an algorithm config instead"
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
    for v in values:
        if axis == "algorithm" and v not in algorithms:
            raise SweepError(f"{where}: unknown algorithm `{v}` (known: {', '.join(algorithms)})")
        if axis == "env" and v not in envs:
            raise SweepError(f"{where}: unknown env `{v}` (known: {', '.join(envs)})")
        if axis in ("K", "seed"):
            low = 1 if axis == "K" else 0
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= low):
                raise SweepError(f"{where}: values must be integers >= {low}, got {v!r}")
        if axis in ("delta", "rho_bar"):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise SweepError(f"{where}: values must be numbers > 0, got {v!r}")
        if axis == "realign" and not isinstance(v, bool):
            raise SweepError(f"{where}: values must be true or false, got {v!r}")
    cast = {"delta": float, "rho_bar": float}.get(axis, lambda x: x)
    return tuple(dict.fromkeys(cast(v) for v in values))


def _load_block(name: str, body, defaults: dict, algorithms, envs) -> Block:
    if not isinstance(body, dict):
        raise SweepError(f"`grid.{name}` must be a mapping of axis -> values")
    for source, where in ((body, f"grid.{name}"), (defaults, "defaults")):
        for key in source:
            if key not in AXES and "." not in str(key):
                raise SweepError(
                    f"`{where}`: unknown field `{key}` (the axes are {', '.join(AXES)}, or any dotted "
                    "`vaco fit` key such as model.init_args.lr)"
                )
    extra = []
    for key in dict.fromkeys([k for k in (*defaults, *body) if "." in str(k)]):
        _load_overrides({key: None})  # the same reserved-key check as `overrides`
        raw = body.get(key, defaults.get(key))
        extra.append((str(key), tuple(dict.fromkeys(_as_list(name, key, raw)))))
    values = {}
    for axis in AXES:
        raw = body.get(axis, defaults.get(axis, _AXIS_DEFAULTS.get(axis)))
        if raw is None:
            if axis in ("algorithm", "env"):
                raise SweepError(f"`grid.{name}.{axis}` is required (in the block or in `defaults`)")
            values[axis] = None
            continue
        values[axis] = _check_values(name, axis, _as_list(name, axis, raw), algorithms, envs)
    block = Block(name=name, **values, extra=tuple(extra))
    algos = [algorithms[a] for a in block.algorithm]
    if block.delta is not None and not any(a.takes_delta for a in algos):
        raise SweepError(f"`grid.{name}.delta`: none of {list(block.algorithm)} has a TV threshold")
    if block.realign is not None and not any(a.realign_optional for a in algos):
        raise SweepError(f"`grid.{name}.realign`: none of {list(block.algorithm)} can switch realignment")
    if block.rho_bar is not None:

        def realign_values(a: Algorithm) -> set:
            return set(block.realign) if (block.realign and a.realign_optional) else {a.realigned}

        if not any(True in realign_values(a) for a in algos):
            raise SweepError(f"`grid.{name}.rho_bar`: none of {list(block.algorithm)} uses V-trace")
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
            block.delta or (None,),
            block.rho_bar or (None,),
            itertools.product(*(values for _, values in block.extra)),
        )
        keys = [key for key, _ in block.extra]
        for name, env, K, seed, realign, delta, rho_bar, extra in product:
            cell = _make_cell(sweep, sweep.algorithms[name], env, K, seed, realign, delta, rho_bar)
            if keys:
                cell = _with_extra(cell, tuple(zip(keys, extra)))
            cells.setdefault(cell.id, cell)
    return list(cells.values())


def _make_cell(sweep: Sweep, algo: Algorithm, env, K, seed, realign, delta, rho_bar) -> Cell:
    realigned = algo.realigned if (realign is None or not algo.realign_optional) else realign
    label, base = algo.name, algo
    if realigned != algo.realigned:
        twin = _twin(sweep.algorithms, algo, realigned)
        label = twin.name if twin else f"{algo.name}{'+' if realigned else '-'}realign"
        base = twin or algo
    suffix = ""
    if base.takes_delta:
        default = float(base.init_arg("objective", "delta"))
        delta = default if delta is None else delta
        suffix += f"-delta{_fmt(delta)}" if delta != default else ""
    else:
        delta = None
    if realigned:
        default = float(base.init_arg("advantage", "rho_bar")) if base.realigned else 1.0
        rho_bar = default if rho_bar is None else rho_bar
        suffix += f"-rho{_fmt(rho_bar)}" if rho_bar != default else ""
    else:
        rho_bar = None
    return Cell(label, base.name, env, K, seed, delta, rho_bar, realigned, suffix)


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


def cell_config(sweep: Sweep, cell: Cell, tracking_uri: str) -> dict:
    """The whole ``vaco fit`` config of one cell (env YAML + algorithm YAML + axes + overrides)."""
    algo = sweep.algorithms[cell.base]
    config = copy.deepcopy(sweep.envs[cell.env])
    config.update(copy.deepcopy({k: v for k, v in algo.config.items() if k != "data"}))
    model = config["model"]["init_args"]
    if cell.realign != algo.realigned:  # realign axis on an algorithm without a twin config
        old = model["advantage"].get("init_args") or {}
        kept = {k: old[k] for k in ("gamma", "lmbda") if k in old}
        model["advantage"] = {"class_path": _VTRACE if cell.realign else _GAE, "init_args": kept}
        if cell.realign:
            model["advantage"]["init_args"].update(rho_bar=1.0, c_bar=1.0)
    if cell.delta is not None:
        model["objective"].setdefault("init_args", {})["delta"] = cell.delta
    if cell.rho_bar is not None:
        model["advantage"].setdefault("init_args", {})["rho_bar"] = cell.rho_bar
        if algo.objective_takes_rho_bar:  # IMPALA: both modules must agree
            model["objective"].setdefault("init_args", {})["rho_bar"] = cell.rho_bar
    model["algorithm_name"] = cell.algorithm
    config["seed_everything"] = cell.seed
    config["data"].setdefault("init_args", {})["policy_buffer_size"] = cell.K
    config["torch_threads"] = 1
    cell_dir = sweep.cell_dir(cell)
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
                    "tracking_uri": tracking_uri,
                    "log_model": True,
                },
            },
        }
    )
    config.setdefault("checkpoint", {})["dirpath"] = str(cell_dir / "checkpoints")
    config.setdefault("progress_bar", {})["refresh_rate"] = 0  # logs without carriage-return noise
    for key, value in (*sweep.overrides.items(), *cell.extra):
        _set_dotted(config, key, copy.deepcopy(value))
    return config


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
        key = (cell.algorithm, cell.env, cell.delta is None, cell.rho_bar is None)
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

            raise SweepError(f"`overrides`: `vaco fit` rejects the config of cell {cell.id}: {one_line(str(err))}") from None


# ---------------------------------------------------------------------------------------- MLflow
def resolve_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``, with a relative SQLite path made absolute
    (cells and the report then find the same store whatever their working directory)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        uri = prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


def _sqlite_missing(uri: str) -> bool:
    return uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists()


def sweep_runs(client, experiment: str) -> list:
    """Every run of the experiment that carries a sweep cell tag."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    runs, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
        runs.extend(r for r in page if CELL_TAG in r.data.tags)
        token = page.token
        if not token:
            return runs


# ---------------------------------------------------------------------------------------- running
@dataclasses.dataclass
class _Job:
    cell: Cell
    proc: subprocess.Popen
    log: Path
    started: float
    resumed: bool


def _set_pdeathsig() -> None:  # runs in the child: die with the sweep, even on SIGKILL
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").replace("\r", "\n")
    except OSError:
        return "(no log)"
    return "\n".join("    " + ln for ln in [ln for ln in text.splitlines() if ln.strip()][-lines:])


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class _Runner:
    """Runs cells as subprocesses, ``jobs`` at a time; SIGINT/SIGTERM stop it cleanly."""

    def __init__(self, sweep: Sweep, tracking_uri: str, jobs: int, grace: float, status_every: float):
        import mlflow

        self.sweep, self.uri, self.jobs, self.grace = sweep, tracking_uri, jobs, grace
        self.status_every = status_every
        self.client = mlflow.MlflowClient(tracking_uri)
        self.running: dict[str, _Job] = {}
        self.done: list[tuple[Cell, float]] = []
        self.failed: list[Cell] = []
        self.stop_requested = 0
        self.total = 0

    def _on_signal(self, signum, _frame) -> None:
        self.stop_requested += 1
        name = signal.Signals(signum).name
        if self.stop_requested == 1:
            _say(
                f"{name}: stopping the sweep (running cells are terminated; rerun the same command to resume)"
            )
        else:
            _say(f"{name} again: killing the running cells now")

    def run(self, cells: list[Cell]) -> int:
        pending = deque(cells)
        self.total = len(cells)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        last_status = time.monotonic()
        try:
            while (pending or self.running) and not self.stop_requested:
                while pending and len(self.running) < self.jobs and not self.stop_requested:
                    self._start(pending.popleft())
                for job in list(self.running.values()):
                    if job.proc.poll() is not None:
                        self._finish(job)
                if time.monotonic() - last_status >= self.status_every and self.running:
                    last_status = time.monotonic()
                    _say(self._status(len(pending), detail=True))
                time.sleep(0.2)
        finally:
            if self.running:
                self._stop_all()
            for s, handler in old.items():
                signal.signal(s, handler)
        if self.stop_requested:
            _say(f"stopped: {self._status(len(pending))}. Rerun the same command to resume.")
            return 130
        _say(f"sweep finished: {self._status(0)}")
        if self.failed:
            _say("failed cells: " + ", ".join(c.id for c in self.failed))
        return 1 if self.failed else 0

    def _start(self, cell: Cell) -> None:
        cell_dir = self.sweep.cell_dir(cell)
        cell_dir.mkdir(parents=True, exist_ok=True)
        config_path = cell_dir / "config.yaml"
        config_path.write_text(yaml.safe_dump(cell_config(self.sweep, cell, self.uri), sort_keys=False))
        ckpt = cell_dir / "checkpoints" / "last.ckpt"
        command = [sys.executable, "-m", "vaco.cli", "fit", "--config", str(config_path)]
        resumed = ckpt.is_file()
        if resumed:
            command += ["--ckpt_path", str(ckpt)]
        else:
            self._close_stale_runs(cell)
        log = cell_dir / "train.log"
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            MLFLOW_TRACKING_URI=self.uri,
        )
        with open(log, "a") as fh:
            fh.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} vaco {' '.join(command[3:])}\n")
            fh.flush()
            proc = subprocess.Popen(
                command,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_set_pdeathsig if sys.platform == "linux" else None,
            )
        self.running[cell.id] = _Job(cell, proc, log, time.monotonic(), resumed)
        _say(f"start  {cell.id}{' (resume from checkpoint)' if resumed else ''}   [{self._status(None)}]")

    def _close_stale_runs(self, cell: Cell) -> None:
        """A cell that starts afresh marks its earlier runs that never ended (killed before their
        first checkpoint) as KILLED, so the MLflow UI does not show them as running."""
        for run in self._cell_runs(cell):
            if run.info.status == "RUNNING":
                self.client.set_terminated(run.info.run_id, "KILLED")

    def _cell_runs(self, cell: Cell) -> list:
        exp = self.client.get_experiment_by_name(self.sweep.experiment)
        if exp is None:
            return []
        return self.client.search_runs([exp.experiment_id], filter_string=f"tags.`{CELL_TAG}` = '{cell.id}'")

    def _finish(self, job: _Job) -> None:
        del self.running[job.cell.id]
        seconds = time.monotonic() - job.started
        code = job.proc.returncode
        finished = code == 0 and any(r.info.status == "FINISHED" for r in self._cell_runs(job.cell))
        if finished:
            self.done.append((job.cell, seconds))
            _say(f"done   {job.cell.id} in {_hms(seconds)}   [{self._status(None)}]")
            return
        if self.stop_requested:
            return
        self.failed.append(job.cell)
        _say(
            f"FAILED {job.cell.id} (exit code {code}) after {_hms(seconds)}   [{self._status(None)}]\n"
            f"  last lines of {job.log}:\n{_tail(job.log)}"
        )

    def _stop_all(self) -> None:
        for job in self.running.values():
            _signal_group(job.proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while self.running and time.monotonic() < deadline and self.stop_requested < 2:
            for job in list(self.running.values()):
                if job.proc.poll() is not None:
                    self._finish(job)
            time.sleep(0.1)
        for job in list(self.running.values()):
            _signal_group(job.proc, signal.SIGKILL)
            job.proc.wait()
            self._finish(job)

    def _status(self, pending: int | None, detail: bool = False) -> str:
        done, failed, running = len(self.done), len(self.failed), len(self.running)
        left = self.total - done - failed
        text = f"done {done}/{self.total}, running {running}, failed {failed}"
        if self.done and left > 0:
            mean = sum(s for _, s in self.done) / len(self.done)
            now = time.monotonic()
            busy = sum(max(mean - (now - j.started), 0.0) for j in self.running.values())
            queued = left - running
            text += f", ETA {_hms((queued * mean + busy) / self.jobs)}"
        elif left > 0:
            text += ", ETA after the first cell"
        if detail and self.running:
            now = time.monotonic()
            text += " | " + ", ".join(f"{j.cell.id} {_hms(now - j.started)}" for j in self.running.values())
        return text


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------- entry point
def plan(sweep: Sweep, cells: list[Cell], tracking_uri: str) -> dict[str, str]:
    """Each cell's state: ``finished`` (skipped), ``resume`` (has a checkpoint) or ``new``."""
    finished = set()
    if not _sqlite_missing(tracking_uri):
        import mlflow

        client = mlflow.MlflowClient(tracking_uri)
        runs = sweep_runs(client, sweep.experiment)
        other = sorted({r.data.tags.get(SETTINGS_TAG) for r in runs} - {sweep.settings, None})
        if other:
            raise SweepError(
                f"`overrides`: experiment '{sweep.experiment}' already holds sweep runs made with other "
                f"shared overrides (settings {', '.join(other)}; this file: {sweep.settings}); "
                "results would mix. Use another `experiment` name."
            )
        finished = {r.data.tags[CELL_TAG] for r in runs if r.info.status == "FINISHED"}
    states = {}
    for cell in cells:
        if cell.id in finished:
            states[cell.id] = "finished"
        elif (sweep.cell_dir(cell) / "checkpoints" / "last.ckpt").is_file():
            states[cell.id] = "resume"
        else:
            states[cell.id] = "new"
    return states


def _lock(output_dir: Path):
    import fcntl

    output_dir.mkdir(parents=True, exist_ok=True)
    handle = open(output_dir / ".sweep.lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise SweepError(f"another `vaco sweep` is running on {output_dir}") from None
    return handle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vaco sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="the sweep file, e.g. configs/sweeps/laptop.yaml")
    parser.add_argument(
        "--jobs", type=int, default=None, help="cells run at once (default: the file's `jobs`)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="validate, print the cells and their state, run nothing"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output folder of cell configs, logs, checkpoints (default: the file's `output_dir`)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="run only cells whose id matches (repeatable)",
    )
    parser.add_argument(
        "--grace", type=float, default=15.0, help="seconds a stopped cell gets to exit before SIGKILL"
    )
    parser.add_argument("--status-every", type=float, default=60.0, help="seconds between progress lines")
    args = parser.parse_args(argv)
    try:
        if args.jobs is not None and args.jobs < 1:
            raise SweepError(f"`--jobs` must be >= 1, got {args.jobs}")
        sweep = load_sweep(args.config, args.out)
        cells = expand(sweep)
        if args.only:
            cells = [c for c in cells if any(fnmatch.fnmatch(c.id, g) for g in args.only)]
            if not cells:
                raise SweepError(f"`--only {' '.join(args.only)}` matches no cell")
        uri = resolve_tracking_uri()
        validate_with_cli(sweep, cells, uri)
        states = plan(sweep, cells, uri)
    except SweepError as err:
        print(f"vaco sweep: {err}", file=sys.stderr)
        return 2
    jobs = args.jobs or sweep.jobs
    counts = {s: sum(1 for v in states.values() if v == s) for s in ("finished", "resume", "new")}
    _say(
        f"sweep '{sweep.experiment}' ({sweep.path}): {len(cells)} cells; {counts['finished']} finished "
        f"(skipped), {counts['resume']} resume from a checkpoint, {counts['new']} new; {jobs} at a time\n"
        f"  MLflow: {uri}  outputs: {sweep.output_dir}"
    )
    if args.dry_run:
        for cell in cells:
            print(f"  {states[cell.id]:8s}  {cell.id}")
        print(
            f"  command of a cell: vaco fit --config {sweep.output_dir}/<cell>/config.yaml [--ckpt_path <cell>/checkpoints/last.ckpt]"
        )
        return 0
    for cell in cells:
        if states[cell.id] == "finished":
            _say(f"skip   {cell.id} (finished)")
    todo = [c for c in cells if states[c.id] != "finished"]
    if not todo:
        _say("nothing to do: every cell has finished")
        return 0
    try:
        lock = _lock(sweep.output_dir)
    except SweepError as err:
        print(f"vaco sweep: {err}", file=sys.stderr)
        return 2
    import mlflow

    from vaco.logger import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    client = mlflow.MlflowClient(uri)
    if client.get_experiment_by_name(sweep.experiment) is None:  # once, before cells race to create it
        client.create_experiment(sweep.experiment, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    sweep.parent_run_id = parent_run(client, sweep, cells)
    status = "FAILED"
    try:
        rc = _Runner(sweep, uri, jobs, args.grace, args.status_every).run(todo)
        status = {0: "FINISHED", 130: "KILLED"}.get(rc, "FAILED")
        return rc
    finally:
        client.set_terminated(sweep.parent_run_id, status)
        lock.close()


def parent_run(client, sweep: Sweep, cells: list[Cell]) -> str:
    """The sweep's parent run (made once, found again on a rerun): its cells are MLflow child
    runs of it, so the UI groups them, and `vaco report` logs its figures to it."""
    exp = client.get_experiment_by_name(sweep.experiment)
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1)
    grid = json.dumps({b.name: {k: v for k, v in dataclasses.asdict(b).items() if v not in (None, ())} for b in sweep.blocks}, default=str)
    tags = {
        PARENT_TAG: "true",
        "vaco.sweep.name": sweep.experiment,
        "vaco.sweep.file": str(sweep.path),
        "vaco.sweep.grid": grid[:5000],
        "vaco.sweep.cells": str(len(expand(sweep))),
        SETTINGS_TAG: sweep.settings,
    }
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
    else:
        run_id = client.create_run(exp.experiment_id, run_name=f"sweep {sweep.experiment}", tags=tags).info.run_id
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    return run_id


if __name__ == "__main__":
    sys.exit(main())
