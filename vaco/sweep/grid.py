"""The grid of a sweep: its model (algorithms, blocks, cells, the sweep), the expansion of the
blocks into cells, and each cell's ``vaco fit`` config. Reading the file is
:mod:`vaco.sweep.loader`'s; the vocabulary is :mod:`vaco.sweep.schema`'s."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import itertools
import json
from pathlib import Path
from typing import Any

from vaco.sweep.schema import LOGGER_CLASS, import_class
from vaco.tracking import CELL_TAG, PARENT_RUN_ID_TAG, SETTINGS_TAG

__all__ = ["Algorithm", "Block", "Cell", "PopulationCell", "Sweep", "expand", "cell_config", "pack"]


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
        """The advantage module says it realigns (V-trace and its subclasses)."""
        return self.advantage is not None and import_class(self.advantage).realigns

    def class_path(self, part: str, realigned: bool) -> str | None:
        """The objective's, or the advantage's with realignment on or off (the module's
        ``realign_twin`` where the realignment differs from the config's)."""
        if part == "objective":
            return self.objective
        if realigned == self.realigned or self.advantage is None:
            return self.advantage
        return import_class(self.advantage).realign_twin

    def axes(self, realigned: bool) -> dict[str, tuple[str, list[str]]]:
        """Axis -> (run-id label, the parts that take it): the ``sweep_axes`` the objective and
        the advantage module declare, the objective's first. IMPALA's rho_bar is in both."""
        out: dict[str, tuple[str, list[str]]] = {}
        for part in ("objective", "advantage"):
            class_path = self.class_path(part, realigned)
            if class_path is None:
                continue
            for axis, label in import_class(class_path).sweep_axes.items():  # checked by the loader
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
            value = inspect.signature(import_class(class_path)).parameters[name].default
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
    #: the arm these cells are, whatever their dotted-key values: a control calibrated per K
    #: (``ppo_clip_step_matched``: clip 0.4 / 0.35 / 0.30 at K 1 / 4 / 16) is one algorithm to the
    #: report, not three ``ppo_clip_tv_matched[clip_epsilon=...]`` variants
    label: str | None = None


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
        tags = {f"vaco.{k}": format_value(v) for k, v in self.coordinates().items() if v is not None}
        tags[CELL_TAG] = self.id
        tags[SETTINGS_TAG] = settings
        return tags


@dataclasses.dataclass(frozen=True)
class PopulationCell:
    """Cells that differ only by seed, run as one ``vaco fit --population [seeds]`` (the sweep
    file's ``population``): one job, one folder and checkpoint, one MLflow run per member cell,
    tagged with that cell's id as its solo run would be."""

    members: tuple[Cell, ...]

    # the coordinates every member shares: the first member's
    algorithm = property(lambda self: self.members[0].algorithm)
    base = property(lambda self: self.members[0].base)
    env = property(lambda self: self.members[0].env)
    K = property(lambda self: self.members[0].K)
    settings = property(lambda self: self.members[0].settings)
    realign = property(lambda self: self.members[0].realign)
    label_suffix = property(lambda self: self.members[0].label_suffix)
    extra = property(lambda self: self.members[0].extra)

    @property
    def seed(self) -> int:
        """The first member's: the population's ``seed_everything`` (each member runs on its own)."""
        return self.members[0].seed

    @property
    def seeds(self) -> list[int]:
        return [cell.seed for cell in self.members]

    @property
    def id(self) -> str:
        first = self.members[0].id
        return first[: -len(f"s{self.members[0].seed}")] + "s" + "+".join(str(s) for s in self.seeds)

    @property
    def run_name(self) -> str:
        return self.members[0].run_name

    def tags(self, settings: str) -> dict[str, str]:
        return self.members[0].tags(settings)


def pack(sweep: Sweep, cells: list[Cell], states: dict[str, str]) -> tuple[list, dict[str, str]]:
    """The jobs that run ``cells`` (those not finished) and their states: with a population size
    P > 1 (:func:`population_size`), the cells that differ only by seed are taken P at a time, in the sweep's seed order, over
    the whole grid (so that a rerun forms the same populations); a population runs the members of
    its chunk that have neither finished nor a checkpoint of their own (those resume alone); the LLM
    track's cells run alone (:func:`_batchable`).
    Returns (jobs, states with each population's: ``resume`` where its folder has a checkpoint)."""
    todo = {cell.id for cell in cells}
    groups: dict[str, list[Cell]] = {}
    for cell in expand(sweep):
        groups.setdefault(seedless_id(cell), []).append(cell)
    jobs, out = [], dict(states)
    for group in groups.values():
        if not any(c.id in todo for c in group):
            continue
        size = population_size(sweep, group[0], len(group))
        for start in range(0, len(group), size):
            chunk = [c for c in group[start : start + size] if c.id in todo]
            # a member with its own checkpoint resumes alone; the LLM track is not batched
            batched = _batchable(sweep.algorithms[group[0].base])
            alone = [c for c in chunk if states.get(c.id) != "new" or not batched]
            together = [c for c in chunk if states.get(c.id) == "new" and batched]
            jobs += alone
            if len(together) == 1:
                jobs += together
            elif together:
                population = PopulationCell(tuple(together))
                ckpt = sweep.cell_dir(population) / "checkpoints" / "last.ckpt"
                out[population.id] = "resume" if ckpt.is_file() else "new"
                jobs.append(population)
    order = {cell.id: i for i, cell in enumerate(cells)}
    jobs.sort(key=lambda job: order[job.members[0].id if isinstance(job, PopulationCell) else job.id])
    return jobs, out


#: most members per population where a sweep file leaves ``population`` at ``auto``, by the cells'
#: collection backend: what docs/performance.md's measurements found fastest. In process
#: (gymnasium, members in lockstep): 12 (the stage-2 cell on Hopper cost 1.3-1.4x less CPU a seed
#: as one population of 12 than as three of 4, on two cores); envpool on a CPU: 4 (its members step
#: in turn); Warp: 16 (16 x 500 Hopper worlds on one H200, 6.67x one run's steps/s). Actor
#: processes and DDP: alone (each member would start its own actors; DDP is refused).
AUTO_POPULATION = {"InProcess": 12, "EnvPool": 4, "Warp": 16}


def population_size(sweep: Sweep, cell: Cell, seeds: int | None = None) -> int:
    """Members per population for ``cell``'s seeds: the sweep file's ``population``, or with
    ``auto`` (the default) :data:`AUTO_POPULATION` of the cell's collection backend, evened out
    over the cell's ``seeds`` (20 seeds at most 12 a process: two populations of 10, not 12 and 8).
    It depends on the sweep file alone, so that a rerun forms the same populations."""
    if sweep.population != "auto":
        return sweep.population
    config = cell_config(sweep, cell)
    trainer = config.get("trainer") or {}
    devices = trainer.get("devices", 1)
    if "ddp" in str(trainer.get("strategy", "")) or (isinstance(devices, int) and devices > 1):
        return 1
    collection = ((config.get("data") or {}).get("init_args") or {}).get("collection") or "vaco.data.InProcess"
    name = collection.get("class_path", "") if isinstance(collection, dict) else str(collection)
    most = AUTO_POPULATION.get(name.rsplit(".", 1)[-1], 1)
    if seeds is None or seeds <= most:
        return most
    return -(-seeds // -(-seeds // most))  # ceil(seeds / the number of populations)


def _batchable(algo: Algorithm) -> bool:
    """Whether a population can train this algorithm: a ``vaco.VacoModule`` (MuJoCo): every
    built-in objective, IMPALA's re-estimation included."""
    from vaco.learners.vaco_module import VacoModule

    model = import_class(algo.config["model"].get("class_path", "vaco.VacoModule"))
    return issubclass(model, VacoModule)


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
    #: members per population: a cell's seeds run P at a time in one process; "auto": by backend
    population: int | str = "auto"
    plan: Any = None  # the study plan declared with the sweep (vaco.study.plan.StudyPlan), or None
    parent_run_id: str | None = None  # the sweep's parent MLflow run (set when the sweep starts)

    @property
    def settings(self) -> str:
        """A hash of the shared overrides: runs of one experiment must share them."""
        text = json.dumps(self.overrides, sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:10]

    def cell_dir(self, cell: Cell) -> Path:
        return self.output_dir / cell.id


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
            if block.label:
                cell = dataclasses.replace(cell, algorithm=block.label)
            cells.setdefault(cell.id, cell)
    return list(cells.values())


def seedless_id(cell: Cell) -> str:
    """The cell's id without its seed: the cells that share it differ only by seed (a population's members)."""
    return cell.id[: -len(f"s{cell.seed}")]


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
        suffix += f"-{short}{format_value(value)}" if value != default else ""
        settings.append((axis, value))
    return Cell(label, base.name, env, K, seed, tuple(settings), realigned, suffix)


def _with_extra(cell: Cell, extra: tuple[tuple[str, Any], ...]) -> Cell:
    """A dotted-key axis makes a variant of the algorithm: ``vaco[lr=0.0001]`` is compared with
    ``vaco[lr=0.0003]`` by the report as two algorithms, never averaged together."""
    short = ",".join(f"{key.rsplit('.', 1)[-1]}={format_value(value)}" for key, value in extra)
    suffix = "".join(f"-{key.rsplit('.', 1)[-1]}{format_value(value)}" for key, value in extra)
    return dataclasses.replace(
        cell, algorithm=f"{cell.algorithm}[{short}]", label_suffix=cell.label_suffix + suffix, extra=extra
    )


def _twin(algorithms: dict[str, Algorithm], algo: Algorithm, realigned: bool) -> Algorithm | None:
    """The configs/algo entry that is ``algo`` with the other advantage (vaco <-> vaco_no_realign)."""
    want = algo.class_path("advantage", realigned)
    init = algo.config["model"]["init_args"]["objective"].get("init_args") or {}
    for other in algorithms.values():
        other_init = other.config["model"]["init_args"]["objective"].get("init_args") or {}
        if other.objective == algo.objective and other.advantage == want and other_init == init:
            return other
    return None


def _twin_advantage(block: dict, twin: str) -> dict:
    """The advantage block with the twin module: the arguments both accept carried over (gamma,
    lmbda), the twin's own at their defaults, written out (rho_bar, c_bar)."""
    old = block.get("init_args") or {}
    old_params = inspect.signature(import_class(block["class_path"])).parameters
    kept = {}
    for name, parameter in inspect.signature(import_class(twin)).parameters.items():
        if name in old:
            kept[name] = old[name]
        elif name not in old_params and parameter.default is not inspect.Parameter.empty:
            kept[name] = parameter.default
    return {"class_path": twin, "init_args": kept}


def cell_config(sweep: Sweep, cell: Cell, tracking_uri: str | None = None) -> dict:
    """The whole ``vaco fit`` config of one cell (env YAML + algorithm YAML + axes + overrides).
    The tracking store is not in it (``tracking_uri`` is accepted and unused): the cell's process
    gets ``MLFLOW_TRACKING_URI`` from its launcher."""
    algo = sweep.algorithms[cell.base]
    config = copy.deepcopy(sweep.envs[cell.env])
    _merge(config, copy.deepcopy({k: v for k, v in algo.config.items() if k != "data"}))
    model = config["model"]["init_args"]
    if cell.realign != algo.realigned:  # realign axis on an algorithm without a twin config
        model["advantage"] = _twin_advantage(model["advantage"], algo.class_path("advantage", cell.realign))
    axes = algo.axes(cell.realign)
    for axis, value in cell.settings:  # every part that takes the axis (IMPALA: both modules agree)
        for part in axes[axis][1]:
            if model[part].get("init_args") is None:
                model[part]["init_args"] = {}
            model[part]["init_args"][axis] = value
    model["algorithm_name"] = cell.algorithm
    config["seed_everything"] = cell.seed
    if isinstance(cell, PopulationCell):
        config["population"] = cell.seeds
    _set_dotted(config, algo.lag_key, cell.K)
    config["torch_threads"] = 1
    cell_dir = sweep.cell_dir(cell)
    given_logger = ((config.get("trainer") or {}).get("logger") or {}).get("init_args") or {}
    config.setdefault("trainer", {}).update(
        {
            "default_root_dir": str(cell_dir),
            "logger": {
                "class_path": LOGGER_CLASS,
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


def format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
