"""The declared dependencies match the code: every third-party module vaco imports belongs to a
distribution pyproject.toml declares (in the core list, or in an extra where only optional code
imports it), and every declared distribution is imported by vaco, or by the scripts and tests its
extra exists for, or is named below with why nothing imports it."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[1]
# modules whose distribution may be absent from this environment (platform-limited extras)
KNOWN = {"envpool": "envpool", "mujoco_warp": "mujoco-warp", "warp": "warp-lang"}
# declared, imported by nothing in the repository: why each is declared
NOT_IMPORTED = {
    "pytest-xdist": "a pytest plugin: `make test` runs `pytest -n 2`",
    "ruff": "a command: `make check` runs it",
    "ipykernel": "the kernel nbclient starts for notebooks/analysis.ipynb",
    "flask-wtf": "MLflow's basic-auth app needs it when the tests start `mlflow server --app-name basic-auth`",
}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imports(folders) -> set[str]:
    out = set()
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    out |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    out.add(node.module.split(".")[0])
    return {m for m in out if m not in sys.stdlib_module_names and m not in ("vaco", "helpers")}


def _distribution(module: str, table) -> str:
    found = table.get(module) or ([KNOWN[module]] if module in KNOWN else None)
    assert found, f"{module} is imported but belongs to no installed distribution"
    # a module several distributions provide (mlflow, mujoco): the one named like it
    by_name = [d for d in found if d.lower().replace("_", "-") == module.replace("_", "-")]
    return (by_name or found)[0].lower().replace("_", "-")


def test_every_module_vaco_imports_is_declared_and_every_declared_one_is_used():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    # an extra's own extras pull distributions in: imageio[ffmpeg] brings imageio-ffmpeg
    pulled = {"imageio-ffmpeg"} if "imageio" in extras else set()
    table = md.packages_distributions()
    used = {_distribution(m, table) for m in _imports(["vaco"])}
    undeclared = sorted(used - core - extras - pulled)
    assert not undeclared, f"imported by vaco, declared nowhere in pyproject.toml: {undeclared}"

    everywhere = used | {_distribution(m, table) for m in _imports(["scripts", "benchmarks", "tests"]) if m in table}
    unused = sorted((core | extras) - everywhere - set(NOT_IMPORTED))
    assert not unused, f"declared in pyproject.toml, imported by nothing: {unused}"
    assert not set(NOT_IMPORTED) & everywhere, (
        "a distribution listed as not imported is imported: drop it from the list"
    )


def test_the_core_install_imports_nothing_only_an_extra_declares():
    """A module the core package imports at module level belongs to a core dependency (the extras'
    modules are imported only inside the optional code paths)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    table = md.packages_distributions()
    optional = ("vaco/llm", "vaco/data/warp", "vaco/data/envpool_backend.py", "vaco/sweep/ray_launcher.py")
    optional += ("vaco/sweep/slurm_launcher.py", "vaco/commands/evaluate.py")
    for path in (REPO / "vaco").rglob("*.py"):
        if str(path.relative_to(REPO)).startswith(optional):
            continue
        for node in ast.parse(path.read_text()).body:  # module level only
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module.split(".")[0]]
            for m in names:
                if m in sys.stdlib_module_names or m == "vaco":
                    continue
                assert _distribution(m, table) in core, f"{path.relative_to(REPO)} imports {m} at module level"
