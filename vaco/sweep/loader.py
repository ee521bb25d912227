"""Reading a sweep file: its structure, names and types, checked field by field (one line naming
the field), and then each distinct cell's config parsed by ``vaco fit``'s own parser.

Imports nothing heavy (``vaco sweep --help`` and ``--dry-run`` stay fast); ``vaco fit``'s parser
is imported only to validate the cells' configs.
"""

from __future__ import annotations

import difflib
import inspect
import itertools
import logging
import math
import os
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from vaco.config_errors import ConfigurationError, check_config_files, one_line
from vaco.files import load_yaml
from vaco.sweep.grid import (
    Algorithm,
    Block,
    Cell,
    Sweep,
    cell_config,
    expand,
    format_value,
    population_size,
    seedless_id,
)
from vaco.sweep.launcher import launcher_class
from vaco.sweep.schema import (
    AXES,
    AXIS_DEFAULTS,
    RESERVED_FIELDS,
    RESOURCE_FIELDS,
    SAFE_ID,
    TOP_FIELDS,
    SweepError,
    check_resources,
    check_text,
    import_class,
)

__all__ = ["load_sweep", "validate_with_cli", "declared_axes"]


def load_sweep(path: str | os.PathLike, output_dir: str | None = None) -> Sweep:
    """Read and validate a sweep file (structure, names, types; not yet `vaco fit`'s parser)."""

    path = Path(path)
    if not path.is_file():
        raise SweepError(f"`--config`: no sweep file at {path}")
    try:  # unreadable, a tab, broken indentation: the file, the line and what is wrong
        raw = check_config_files([str(path)])[str(path)] or {}
    except ConfigurationError as err:
        raise SweepError(str(err)) from None
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with the fields {', '.join(TOP_FIELDS)}")
    for key in raw:
        if key not in TOP_FIELDS:
            raise SweepError(f"{path}: unknown field `{key}` (known: {', '.join(TOP_FIELDS)})")
    experiment = raw.get("experiment")
    if not (isinstance(experiment, str) and experiment.strip()):
        raise SweepError(f"{path}: `experiment` (the MLflow experiment name) is required")
    check_text("experiment", experiment)
    if "," in experiment:  # the SLURM job name is vaco-<experiment>: `squeue --name a,b` would match two names
        raise SweepError(
            f"`experiment` = {experiment!r} holds a comma (SLURM reads a job name with one as several names)"
        )
    if output_dir is not None:
        check_text("--out", str(output_dir))
    if raw.get("output_dir") is not None:
        if not isinstance(raw["output_dir"], str):
            raise SweepError(f"`output_dir` must be a path (a string), got {raw['output_dir']!r}")
        check_text("output_dir", raw["output_dir"])
    elif not output_dir and not _inside(Path("sweeps") / experiment, Path("sweeps")):
        raise SweepError(
            f"`experiment` = {experiment!r} would put the sweep outside sweeps/ (its default folder is "
            "sweeps/<experiment>): rename it or set `output_dir`"
        )
    jobs = raw.get("jobs", 1)
    if jobs == "auto":  # one cell a core this process may use, each cell one torch thread
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if not (isinstance(jobs, int) and not isinstance(jobs, bool) and jobs >= 1):
        raise SweepError(f"`jobs` must be an integer >= 1 or `auto` (one cell a core), got {jobs!r}")
    population = raw.get("population", "auto")
    if population != "auto" and not (
        isinstance(population, int) and not isinstance(population, bool) and population >= 1
    ):
        raise SweepError(
            f"`population` must be an integer >= 1 (seeds of a cell per process) or `auto` (the default: "
            f"sized by the cell's backend, docs/sweeps.md), got {population!r}"
        )
    # the launcher and resources first: they need no torch, and a misspelt one is refused in a second,
    # not after the algorithms' classes (and so torch and Lightning, ~7 s) are imported
    launcher = _load_launcher(raw.get("launcher", "local"))
    resources = _load_resources(raw.get("resources") or {})
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
    _check_labels(blocks)
    _check_size(blocks)
    out = Path(output_dir) if output_dir else Path(raw.get("output_dir") or Path("sweeps") / experiment)
    sweep = Sweep(
        path=path,
        experiment=experiment,
        output_dir=out.resolve(),
        jobs=jobs,
        population=population,
        configs_dir=configs_dir,
        overrides=overrides,
        blocks=blocks,
        algorithms=algorithms,
        envs=envs,
        description=str(raw.get("description", "")),
        launcher=launcher,
        resources=resources,
    )
    if raw.get("plan") is not None:
        sweep.plan = _load_plan(raw["plan"], sweep)
    return sweep


def _load_plan(raw, sweep: Sweep):
    """The ``plan`` block, checked against the grid it plans (its arms, K values and seeds)."""
    from vaco.study.plan import load_plan

    cells = expand(sweep)
    seeds: dict[str, int] = {}
    for cell in cells:
        key = cell.id[: -len(f"s{cell.seed}")]
        seeds[key] = seeds.get(key, 0) + 1
    algorithms = list(dict.fromkeys(cell.algorithm for cell in cells))
    ks = sorted({cell.K for cell in cells})
    try:
        return load_plan(raw, algorithms, ks, max(seeds.values()))
    except ValueError as err:
        raise SweepError(str(err)) from None


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` stays within ``folder`` once ``..`` and links are resolved (and is not it)."""
    path, folder = path.resolve(), folder.resolve()
    return path != folder and path.is_relative_to(folder)


def _load_launcher(value) -> str:
    """A registered launcher name or a Launcher class path (checked by importing it)."""

    launcher_class(value)
    return value


def _load_resources(raw) -> dict:
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


def _load_algorithms(configs_dir: Path) -> dict[str, Algorithm]:
    from vaco.advantages import AdvantageModule
    from vaco.learners.learner import Learner
    from vaco.objectives import Objective

    out = {}
    for file in sorted((configs_dir / "algo").glob("*.yaml")):
        config = load_yaml(file.read_text())
        init = config["model"]["init_args"]
        objective, advantage = init["objective"]["class_path"], (init.get("advantage") or {}).get("class_path")
        module = _checked_class(
            config["model"].get("class_path", "vaco.VacoModule"), Learner, f"{file}: model.class_path"
        )
        where = f"{file}: model.init_args.objective.class_path"
        objective_class = _checked_class(objective, Objective, where)
        if advantage is not None:
            _checked_class(advantage, AdvantageModule, f"{file}: model.init_args.advantage.class_path")
        out[file.stem] = Algorithm(
            name=file.stem,
            config=config,
            objective=objective,
            advantage=advantage,
            lag_key=module.lag_key,
            realign_optional=not objective_class.reestimate_advantage
            and advantage is not None
            and import_class(advantage).realign_twin is not None,
        )
    return out


def _checked_class(class_path: str, base: type, where: str) -> type:
    found = import_class(class_path, where)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise SweepError(f"`{where}`: {class_path!r} is not a {base.__module__}.{base.__qualname__}")
    return found


def _load_envs(configs_dir: Path) -> dict[str, dict]:
    return {file.stem: load_yaml(file.read_text()) for file in sorted((configs_dir / "env").glob("*.yaml"))}


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
                *RESERVED_FIELDS,
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


def _did_you_mean(value, choices) -> str:
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else ""


def _check_values(block: str, axis: str, values: list, algorithms, envs) -> tuple:
    where = f"`grid.{block}.{axis}`"
    if axis not in AXES:  # a declared axis: numbers, checked by its class's own constructor
        for v in values:
            if not (isinstance(v, (int, float)) and not isinstance(v, bool)):
                raise SweepError(f"{where}: values must be numbers, got {v!r}")
        return tuple(dict.fromkeys(float(v) for v in values))
    for v in values:
        if axis == "algorithm" and v not in algorithms:
            raise SweepError(
                f"{where}: unknown algorithm `{v}`{_did_you_mean(v, algorithms)} (known: {', '.join(algorithms)})"
            )
        if axis == "env" and v not in envs:
            raise SweepError(f"{where}: unknown env `{v}`{_did_you_mean(v, envs)} (known: {', '.join(envs)})")
        if axis in ("K", "seed"):
            low = 1 if axis == "K" else 0
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= low):
                raise SweepError(f"{where}: values must be integers >= {low}, got {v!r}")
        if axis == "realign" and not isinstance(v, bool):
            raise SweepError(f"{where}: values must be true or false, got {v!r}")
    return tuple(dict.fromkeys(values))


#: the most cells a sweep file may list: each is a `vaco fit` run, a folder and an MLflow run (the
#: paper's grid is 2,100; a grid past this is a typo in a range: 10^6 cells took 15 s to expand alone)
MAX_CELLS = 100_000


def _check_size(blocks: list[Block]) -> None:
    """Refuse a grid of more than :data:`MAX_CELLS` cells before any cell is built."""
    sizes = {}
    for block in blocks:
        axes = (block.algorithm, block.env, block.K, block.seed, block.realign or (None,))
        size = math.prod(len(values) for values in axes)
        sizes[block.name] = size * math.prod(len(v) for _, v in (*block.settings, *block.extra))
    total = sum(sizes.values())
    if total > MAX_CELLS:
        largest = max(sizes, key=sizes.get)
        raise SweepError(
            f"`grid`: up to {total:,} cells (`grid.{largest}` alone {sizes[largest]:,}), more than the {MAX_CELLS:,} a "
            "sweep may list: each cell is a run; check the block's value lists, or split the study into sweeps"
        )


def _load_block(name: str, body, defaults: dict, algorithms, envs) -> Block:
    if not isinstance(body, dict):
        raise SweepError(f"`grid.{name}` must be a mapping of axis -> values")
    axes = declared_axes(algorithms)
    for source, where in ((body, f"grid.{name}"), (defaults, "defaults")):
        for key in source:
            if key == "label" and source is body:
                continue
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
            text = format_value(value)
            if not SAFE_ID.fullmatch(text) or ".." in text:
                raise SweepError(
                    f"`grid.{name}.{key}`: {value!r} cannot name a cell (its folder and MLflow run): a value is "
                    "a number, true/false, or text of letters, digits and _ . + = - (no '..')"
                )
        extra.append((str(key), values))
    values: dict[str, Any] = {}
    for axis in (*AXES, *axes):
        raw = body.get(axis, defaults.get(axis, AXIS_DEFAULTS.get(axis)))
        if raw is None:
            if axis in ("algorithm", "env"):
                raise SweepError(f"`grid.{name}.{axis}` is required (in the block or in `defaults`)")
            values[axis] = None
            continue
        values[axis] = _check_values(name, axis, _as_list(name, axis, raw), algorithms, envs)
    settings = tuple((a, values.pop(a)) for a in axes if values.get(a) is not None)
    for a in axes:
        values.pop(a, None)
    label = _load_label(name, body.get("label"), values, algorithms)
    block = Block(name=name, **values, settings=settings, extra=tuple(extra), label=label)
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
            cls = import_class(class_path)
            for v in axis_values:
                try:
                    cls(**{**init, axis: v})
                except ValueError as err:
                    raise SweepError(f"`grid.{name}.{axis}`: {v!r} is refused by {cls.__name__}: {err}") from None
                except TypeError:  # a required argument the config leaves to `vaco fit`: it checks the value
                    break
    return block


def _load_label(block: str, label, values: dict, algorithms: dict[str, Algorithm]) -> str | None:
    """A block's ``label``: the one arm its cells are, whatever their dotted-key values (a control
    whose clip range is calibrated per K). One algorithm, no realignment switch, and a name no
    configs/algo file has (the arm is not that file's uncalibrated algorithm)."""
    if label is None:
        return None
    where = f"`grid.{block}.label`"
    if not (isinstance(label, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", label)):
        raise SweepError(f"{where} must be a name of letters, digits and _ (starting with a letter), got {label!r}")
    if label in algorithms:
        raise SweepError(
            f"{where} = {label!r} is a configs/algo name: a labelled block is its own arm, so give it a new name"
        )
    if len(values["algorithm"]) != 1:
        raise SweepError(f"{where} names one arm: the block must have one algorithm, got {list(values['algorithm'])}")
    if values.get("realign") is not None:
        raise SweepError(f"{where} and `grid.{block}.realign` together: a realignment switch renames the arm itself")
    return label


def _check_labels(blocks: list[Block]) -> None:
    """A labelled arm starts from one configs/algo file, and has one cell per (env, K, seed, declared
    axes): two clip ranges at one K would be two arms averaged as one."""
    base: dict[str, tuple[str, str]] = {}
    for block in blocks:
        if block.label:
            first = base.setdefault(block.label, (block.algorithm[0], block.name))
            if first[0] != block.algorithm[0]:
                raise SweepError(
                    f"`grid.{block.name}.label` = {block.label!r} starts from {block.algorithm[0]}, but "
                    f"`grid.{first[1]}` gives that arm {first[0]}: one arm, one configs/algo file"
                )
    seen: dict[tuple, dict] = {}
    for block in (b for b in blocks if b.label):
        keys = [key for key, _ in block.extra]
        settings = itertools.product(*(values for _, values in block.settings))
        extras = [dict(zip(keys, values)) for values in itertools.product(*(v for _, v in block.extra))]
        for env, K, seed, setting, given in itertools.product(block.env, block.K, block.seed, list(settings), extras):
            before = seen.setdefault((block.label, env, K, seed, setting), given)
            if before != given:
                raise SweepError(
                    f"`grid.{block.name}.label` = {block.label!r}: two cells of the arm at env {env}, K = {K}, "
                    f"seed {seed} ({before} and {given}): a labelled arm has one value of each dotted key per K"
                )


class _Parsed(Exception):
    pass


def _check_memory(sweep: Sweep, cell: Cell, tracking_uri: str, members: int = 1) -> None:
    """A MuJoCo cell's sizes against the memory here (``vaco.data.datamodule.check_memory``)."""
    from vaco.data.datamodule import RolloutDataModule, check_memory

    config = cell_config(sweep, cell, tracking_uri)
    init = (config.get("data") or {}).get("init_args") or {}
    defaults = inspect.signature(RolloutDataModule).parameters
    sizes = [init.get(k, defaults[k].default) for k in ("num_envs", "num_steps", "policy_buffer_size")]
    if "env_id" not in init or not all(isinstance(v, int) for v in sizes):
        return  # not a MuJoCo cell (the LLM track's data), or a mistyped size the parser names
    collection = (init.get("collection") or {}).get("class_path", "vaco.data.InProcess")
    from vaco.data.collection import GYMNASIUM_ENV_BYTES

    env_bytes = GYMNASIUM_ENV_BYTES if collection.rsplit(".", 1)[-1] in ("InProcess", "Actors") else 0
    try:  # a population runs up to `population` of a cell's seeds in one process
        check_memory(*sizes, members=members, env_bytes=env_bytes)
    except ValueError as err:
        raise SweepError(f"cell {cell.id}: {err}") from None


def validate_with_cli(sweep: Sweep, cells: list[Cell], tracking_uri: str) -> None:
    """Parse one cell per (algorithm, env) with ``vaco fit``'s own parser: unknown or mistyped
    override fields fail here, before anything starts, with jsonargparse's message; and every
    cell's sizes (num_envs x num_steps, K) must fit in this machine's memory."""
    from vaco.commands.fit import VacoCLI

    class ParseOnly(VacoCLI):
        def init_parser(self, **kwargs):
            kwargs["exit_on_error"] = False
            return super().init_parser(**kwargs)

        def _validate_classes(self) -> None:
            """Parsing only: a constructor may check the machine (a model folder, a CUDA device) that
            runs the cell, not the one that plans the sweep."""

        def before_instantiate_classes(self) -> None:
            raise _Parsed

    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    seen = set()
    seeds_of = Counter(seedless_id(cell) for cell in cells)  # a cell's seeds: a population's most members
    for cell in cells:
        members = min(population_size(sweep, cell, seeds_of[seedless_id(cell)]), seeds_of[seedless_id(cell)])
        _check_memory(sweep, cell, tracking_uri, members=members)
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
            raise SweepError(
                f"`overrides`: `vaco fit` rejects the config of cell {cell.id}: {one_line(str(err))}"
            ) from None
