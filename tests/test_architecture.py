"""The house rules of docs/architecture.md, read from the code's own imports (every ``import`` and
``from ... import`` in vaco/, at any depth, TYPE_CHECKING blocks included): no import circle, no
arrow from a lower layer up to a higher one, no two files with one name, and the learners keep the
contract."""

from __future__ import annotations

import ast
import inspect
import os
import re
from collections import defaultdict
from pathlib import Path

import pytest

from helpers.runs import REPO

PACKAGE = REPO / "vaco"

# docs/architecture.md's layers, lowest first: a module may import its own layer and those below
LAYERS = {
    1: (
        "vaco._checks",
        "vaco.tracking",
        "vaco.files",
        "vaco.config_errors",
        "vaco.hints",
        "vaco.run.checkpoint",
        "vaco.lightning_private",
        "vaco.run.lock",
    ),
    2: (
        "vaco.objectives",
        "vaco.advantages",
        "vaco.learners.networks",
        "vaco.learners.proximal",
        "vaco.learners.step_size",
    ),
    3: (
        "vaco.data",
        "vaco.llm.data",
        "vaco.llm.policy",
        "vaco.llm.reward",
        "vaco.llm.advantage",
        "vaco.llm.synthetic",
        "vaco.llm.tokenizer",
        "vaco.llm.sft",
    ),
    4: (
        "vaco.learners.learner",
        "vaco.learners.vaco_module",
        "vaco.learners.update",
        "vaco.population",
        "vaco.llm.rlvr_module",
        "vaco.llm",
        "vaco.run.callbacks",
        "vaco.run.logger",
    ),
    5: ("vaco.report",),  # the report's statistics: the study's plan and the commands stand on them
    6: (
        "vaco.commands.fit",
        "vaco.commands.evaluate",
        "vaco.commands.ui",
        "vaco.commands.report",
        "vaco.sweep",
        "vaco.study",
        "vaco.commands.cli",
        "vaco",
    ),
}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _targets(node) -> list[str]:
    """The dotted names an import statement imports (``from a import b``: ``a.b``); [] for other
    nodes and relative imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [f"{node.module}.{a.name}" for a in node.names]
    return []


def _resolve(mods: dict[str, Path], name: str) -> str:
    """The vaco module a dotted name lands in (a name imported from a package: its submodule if one)."""
    while name not in mods:
        name = name.rpartition(".")[0]
    return name


def imports() -> dict[str, set[str]]:
    """module -> the vaco modules it imports (a name imported from a package resolves to the
    submodule when there is one)."""
    mods = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _targets(node):
                if target == "vaco" or target.startswith("vaco."):
                    found = _resolve(mods, target)
                    if found != name:
                        edges[name].add(found)
    return edges


def layer(module: str) -> int:
    best, found = -1, None
    for number, prefixes in LAYERS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), number
    assert found is not None, f"{module} is in no layer of docs/architecture.md: add it to LAYERS and the doc"
    return found


def test_no_import_circle():
    edges = imports()
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in modules():
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_no_arrow_runs_up_a_layer():
    up = [
        f"{a} (layer {layer(a)}) -> {b} (layer {layer(b)})"
        for a, targets in imports().items()
        for b in targets
        if layer(b) > layer(a)
    ]
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(up))


def test_circle_and_layer_checks_can_fail(tmp_path, monkeypatch):
    """The checks see a real circle and a real upward arrow (a copy of the tree with two added imports)."""
    import shutil

    copy = tmp_path / "vaco"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "tracking.py", "a") as fh:
        fh.write("\nfrom vaco.commands.fit import VacoCLI  # noqa\n")  # leaves -> commands: up, and a circle
    monkeypatch.setattr(__import__(__name__), "PACKAGE", copy)
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    with pytest.raises(AssertionError, match="import circles"):
        test_no_import_circle()
    with pytest.raises(AssertionError, match=r"vaco.tracking \(layer 1\) -> vaco.commands.fit \(layer 6\)"):
        test_no_arrow_runs_up_a_layer()


def test_no_two_files_share_a_name():
    names = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            names[path.name].append(str(path.relative_to(REPO)))
    assert not {n: p for n, p in names.items() if len(p) > 1}


def test_the_learners_keep_the_contract():
    from vaco import VacoModule
    from vaco.learners.learner import Learner
    from vaco.llm import RLVRModule

    abstract = set(Learner.__abstractmethods__)
    assert abstract == {"check_data", "default_run_name", "run_params", "evaluate", "should_evaluate", "last_score"}
    for learner in (VacoModule, RLVRModule):
        assert issubclass(learner, Learner) and not inspect.isabstract(learner)
        assert isinstance(learner.lag_key, str) and isinstance(learner.score_metric, str)

    class Incomplete(Learner):
        lag_key, score_metric = "data.init_args.policy_buffer_size", "eval/return"

    from vaco.objectives import PPOClip

    with pytest.raises(TypeError, match="abstract"):
        Incomplete(PPOClip(), "x")


def test_no_compatibility_layer_is_shipped():
    """An untagged 0.1 project keeps no shims for old module paths or spellings: the old names fail
    to import (they used to resolve through an import hook, with a FutureWarning)."""
    import importlib

    old_paths = ("vaco.module", "vaco.data.module", "vaco._moved", "vaco.data.parallel.legacy", "vaco.sweep.launchers")
    # the modules that moved into commands/, learners/ and run/ leave nothing at their old paths
    moved = ("cli", "fit", "evaluate", "ui", "learner", "vaco_module", "update", "networks", "logger", "checkpoint")
    for old in (*old_paths, *(f"vaco.{name}" for name in moved)):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    import vaco.data

    assert not hasattr(vaco.data, "ParallelRolloutDataModule")
    import vaco.commands.cli  # the dispatcher re-exports nothing: each name has one home

    for name in ("VacoCLI", "tracking_uri", "DEFAULT_TRACKING_URI", "vaco_command"):
        assert not hasattr(vaco.commands.cli, name), name


@pytest.mark.parametrize("walk", ["run", "population"])
def test_the_iteration_walk_in_the_architecture_doc_names_functions_that_exist(walk):
    """docs/architecture.md walks one VACO iteration, and one population iteration, file by file:
    every (file, function) row must name a function or method defined in that file (by its AST,
    nothing imported)."""
    import ast

    from helpers.runs import REPO

    _, rows = walk_rows(WALKS[walk][0])
    assert len(rows) >= 20 and [int(n) for n, _, _ in rows] == list(range(1, len(rows) + 1))
    for _, file, name in rows:
        tree = ast.parse((REPO / file).read_text())
        owner, _, member = name.rpartition(".")
        if owner:
            classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
            assert classes, f"{file}: no class {owner}"
            body = classes[0].body
        else:
            body = tree.body
        defined = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert (member or name) in defined, f"{file}: no function {name}"


def test_lightning_private_api_is_fenced_and_exists_on_this_lightning():
    """vaco.lightning_private lists every private Lightning name vaco touches. On the installed
    Lightning each one resolves (an override of a renamed method would silently never run: the
    failure names it), the version is one the fence was written for, and every private method a vaco
    subclass overrides on its Lightning base is listed (a new override cannot slip past the fence)."""
    import lightning

    from vaco.commands.fit import VacoArgumentParser, VacoCLI
    from vaco.lightning_private import TESTED, TOUCHES, resolve
    from vaco.run.callbacks import IterationCheckpoint, IterationLog, SaveConfigToMLflow, VacoProgressBar
    from vaco.run.checkpoint import SafeCheckpointIO
    from vaco.run.logger import VacoMLFlowLogger

    version = ".".join(lightning.__version__.split(".")[:2])
    assert version in TESTED, (
        f"Lightning {lightning.__version__} is not a version vaco.lightning_private was written for "
        f"({', '.join(TESTED)}): check each name in its TOUCHES against this version, then add it"
    )
    for name in TOUCHES:
        resolve(name)  # AttributeError naming it if gone
    with pytest.raises(AttributeError, match="_no_such_hook is gone"):
        resolve("lightning.pytorch.cli:LightningCLI._no_such_hook")
    listed = {name.rpartition(".")[2] for name in TOUCHES}
    for cls in (
        VacoCLI,
        VacoArgumentParser,
        IterationCheckpoint,
        IterationLog,
        VacoProgressBar,
        SaveConfigToMLflow,
        VacoMLFlowLogger,
        SafeCheckpointIO,
    ):
        for attribute in vars(cls):
            if attribute.startswith("__") or not attribute.startswith("_") or attribute == "_abc_impl":
                continue
            if any(hasattr(base, attribute) for base in cls.__mro__[1:]):
                assert attribute in listed, f"{cls.__name__}.{attribute} overrides Lightning's private API unlisted"
    # each private name is used where the fence says, and nowhere else in vaco
    private = {name.rpartition(".")[2] for name in TOUCHES if name.rpartition(".")[2].startswith("_")}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for attribute in private - {"_run_id", "_run_name", "_experiment_name", "_tracking_uri", "_artifact_location"}:
            read = re.search(rf"\.{re.escape(attribute)}\b(?!\s*\()", text)  # an attribute read or write
            named = f'"{attribute}"' in text or f"'{attribute}'" in text  # getattr(x, "_name"), hasattr, setattr
            if f".{attribute}(" in text or f"import {attribute}" in text or f" {attribute}," in text or read or named:
                assert path.name in ("lightning_private.py", "fit.py"), (
                    f"{path.name} uses {attribute} outside the fence"
                )


# One `vaco fit` whose second iteration is traced: the vaco files whose Python code runs between
# the start of iteration 2 and the start of iteration 3 (collection, update, checkpoint, logging).
# argv: the output file, the learner class whose training_step is traced, then `vaco`'s arguments.
_TRACE_ONE_ITERATION = r"""
import importlib, json, os, sys
import vaco
package = os.path.dirname(vaco.__file__)
files, calls = {}, [0]
def trace(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(package + os.sep):
        name = os.path.relpath(frame.f_code.co_filename, os.path.dirname(package))
        files.setdefault(name, set()).add(frame.f_code.co_qualname)
module, _, owner = sys.argv[2].rpartition(".")
cls = getattr(importlib.import_module(module), owner)
step = cls.training_step
def training_step(self, dataloader_iter):
    calls[0] += 1
    sys.setprofile(trace if calls[0] == 2 else None)
    return step(self, dataloader_iter)
cls.training_step = training_step
from vaco.commands.cli import main
try:
    main(sys.argv[3:])
except SystemExit as stop:
    assert not stop.code, stop.code
sys.setprofile(None)
assert calls[0] == 3, calls
with open(sys.argv[1], "w") as out:
    json.dump({name: sorted(functions) for name, functions in sorted(files.items())}, out)
"""

#: the walks of docs/architecture.md: (its section, the learner traced, extra `vaco fit` arguments)
WALKS = {
    "run": ("## One VACO iteration, file by file", "vaco.learners.vaco_module.VacoModule", ()),
    "population": (
        "## One population iteration, file by file",
        "vaco.population.module.PopulationModule",
        ("--population", "2"),
    ),
}


def walk_rows(heading: str) -> list[tuple[str, str, str]]:
    from helpers.runs import REPO

    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return section, re.findall(r"^\| (\d+) \| `([^`]+)` \| `([^`]+)` \|", section, flags=re.M)


@pytest.mark.slow
@pytest.mark.parametrize("walk", list(WALKS))
def test_the_iteration_walk_names_every_file_one_iteration_runs_and_no_other(tmp_path, walk):
    """Each walk in docs/architecture.md is the whole iteration: one real `vaco fit` (the walk's
    command at tiny sizes, a checkpoint every iteration; a population of two for the population's
    walk) is traced through its second iteration, and the vaco files whose code ran are exactly the
    walk's files; the count the doc states is that number. A file the iteration starts to call (or
    stops calling) fails here by name."""
    import json
    import subprocess
    import sys

    from helpers.runs import REPO

    heading, learner, extra = WALKS[walk]
    out = tmp_path / "files.json"
    argv = [
        "fit",
        *("--config", str(REPO / "configs/env/hopper.yaml"), "--config", str(REPO / "configs/algo/vaco.yaml")),
        *("--data.init_args.num_envs", "2", "--data.init_args.num_steps", "32", "--data.init_args.total_steps", "192"),
        *("--data.init_args.eval_every", "0", "--data.init_args.eval_episodes", "1"),
        *("--model.init_args.update_epochs", "1", "--model.init_args.num_minibatches", "2"),
        *("--checkpoint.every_n_iterations", "1", "--trainer.default_root_dir", str(tmp_path / "run")),
        "--trainer.enable_progress_bar=false",
        *extra,
    ]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    done = subprocess.run(
        [sys.executable, "-c", _TRACE_ONE_ITERATION, str(out), learner, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    functions = json.loads(out.read_text())
    ran = set(functions)
    section, rows = walk_rows(heading)
    walk_files = {file for _, file, _ in rows}
    missing = {name: functions[name] for name in sorted(ran - walk_files)}
    assert not missing, f"one iteration runs code in files the walk does not name: {missing}"
    assert walk_files - ran == set(), f"the walk names files one iteration does not run: {sorted(walk_files - ran)}"
    stated = re.search(r"runs code in (\d+) of vaco's files", section)
    assert stated and int(stated.group(1)) == len(ran), (stated and stated.group(0), len(ran))


#: the private names of other packages vaco reads, each where the package offers no public way
#: (attribute read on an object of that package: file -> names). Lightning's and TorchRL's live
#: in their fences (vaco/lightning_private.py, vaco/data/parallel/torchrl_compat.py).
THIRD_PARTY_PRIVATE = {
    "vaco/lightning_private.py": {
        "_hparams_initial",
        "_save_last_checkpoint",
        "_should_skip_saving_checkpoint",
        "_monitor_candidates",
        "_timeout",
    },
    "vaco/data/parallel/torchrl_compat.py": {"_closed", "_send_instruction", "_weight_sync_schemes"},
    # gymnasium's TimeLimit keeps its step counter private; an env snapshot must hold it
    "vaco/data/envs.py": {"_elapsed_steps", "_max_episode_steps", "_has_reset"},
    # the standard library's own documented names (os._exit, namedtuple._replace)
    "*": {"_exit", "_replace"},
}


def private_reaches(root: Path) -> list[str]:
    """Every place a file under ``root`` uses another file's private name: ``from x import _name``
    of a vaco module, or ``obj._name`` on anything but ``self``, ``cls`` or ``super()`` (a
    dunder is not private)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        allowed = THIRD_PARTY_PRIVATE.get(rel, set()) | THIRD_PARTY_PRIVATE["*"]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(root.name):
                folder = root.parent.joinpath(*node.module.split("."))
                found += [
                    f"{rel}:{node.lineno} imports {a.name} from {node.module}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__") and not (folder / f"{a.name}.py").exists()
                ]
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")
                and not str(node.args[1].value).startswith("__")
            ):
                owner = node.args[0]
                if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    if node.args[1].value not in allowed:
                        found.append(f"{rel}:{node.lineno} reads {ast.unparse(owner)}.{node.args[1].value} by name")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
                    continue
                if node.attr not in allowed:
                    found.append(f"{rel}:{node.lineno} reads {ast.unparse(owner)}.{node.attr}")
    return found


def test_no_file_reaches_into_another_files_private_names():
    """A module talks to another through what it offers: no vaco file imports another's private
    function or reads a private attribute of an object it does not own (a population reads its
    members' state through VacoModule's and CollectorBase's methods). Private modules (vaco._checks)
    are the package's own and may be imported; other packages' privates are listed above, by file."""
    assert private_reaches(PACKAGE) == []


def test_the_private_reach_check_can_fail(tmp_path):
    package = tmp_path / "vaco"
    package.mkdir()
    (package / "a.py").write_text("def _hidden():\n    pass\n")
    (package / "b.py").write_text(
        "from vaco.a import _hidden\n\nclass B:\n    def f(self, other):\n        return self._own, other._state, super()._x\n"
        "\n    def g(self, other):\n        return getattr(other, '_flag', None), getattr(self, '_mine', 0)\n"
    )
    assert private_reaches(package) == [
        "vaco/b.py:1 imports _hidden from vaco.a",
        "vaco/b.py:5 reads other._state",
        "vaco/b.py:8 reads other._flag by name",
    ]


def _deferred_packages() -> set[str]:
    """The packages docs/architecture.md's "Imports inside functions" table lets a function import."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Imports inside functions", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row)}


def test_an_import_inside_a_function_defers_a_heavy_package():
    """Every import inside a function in vaco/ is of a package the architecture doc's table names
    (with its reason), or of a vaco module that imports one of them when it loads (at its top, or
    through its package); anything else belongs at the top of its module."""
    deferred = _deferred_packages()
    assert {"torch", "mlflow", "submitit"} <= deferred
    mods = modules()
    top: dict[str, set[str]] = defaultdict(set)  # module -> what it imports when it loads
    inner: list[tuple[str, int, str]] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            targets = _targets(node)
            if not targets:
                continue
            above, in_function = parents.get(node), False
            while above is not None and not in_function:
                if isinstance(above, ast.If) and "TYPE_CHECKING" in ast.unparse(above.test):
                    break
                in_function = isinstance(above, (ast.FunctionDef, ast.AsyncFunctionDef))
                above = parents.get(above)
            if isinstance(above, ast.If) and not in_function:
                continue  # a TYPE_CHECKING block: never run
            for target in targets:
                is_vaco = target == "vaco" or target.startswith("vaco.")
                module = _resolve(mods, target) if is_vaco else target.split(".")[0]
                if in_function:
                    inner.append((name, node.lineno, module))
                elif module != name:
                    top[name].add(module)

    def heavy(module: str, seen: frozenset = frozenset()) -> bool:
        parts = module.split(".")
        packages = [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in mods]
        for dep in [*top[module], *packages]:
            if dep in deferred or (dep in mods and dep not in seen and heavy(dep, seen | {module})):
                return True
        return False

    light = [
        f"{mods[name].relative_to(REPO)}:{line}: {module}"
        for name, line, module in inner
        if (module not in deferred if module not in mods else not heavy(module))
    ]
    assert not light, "imports inside functions that defer nothing heavy (move them to the top):\n" + "\n".join(light)
