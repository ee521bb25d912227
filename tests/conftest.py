"""Shared fixtures: float32 by default (float64 on request) and a real MLflow store in a temp dir.
Helpers that tests import (a tiny real run, the CLI, the cluster services) are in ``tests/helpers/``.

`make test` runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``). Each test file
is one group, so a file's module-scoped set-up runs once; the files that start the one-node SLURM
cluster, PostgreSQL or a local Ray cluster (tests/helpers/services.py starts each once per process)
share one group, so those services start once per suite and never twice side by side.

Each worker also starts a fork server (tests/helpers/forkserver.py): a process that has imported
torch, Lightning, MLflow and vaco once, from which the tests' ``vaco`` commands (``VACO`` in
tests/helpers/runs.py) are forked instead of started as cold interpreters (~7 s each on two cores).
``VACO_TEST_FORKSERVER=0`` runs every command as a plain subprocess instead.

With ``--durations`` (as `make test` runs it) the summary also gives each file's seconds and each
worker's: where the suite's time goes by file, and whether the two workers were kept busy alike."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

# the files whose tests share the cluster services: one worker runs them all
SHARED_SERVICES = {"test_cluster", "test_launchers", "test_shared_cluster"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        stem = item.path.stem
        item.add_marker(pytest.mark.xdist_group("services" if stem in SHARED_SERVICES else stem))


_FORKSERVER: dict = {}
REAL_VACO = str(Path(sys.executable).with_name("vaco"))


def pytest_configure(config):
    """One fork server per process that runs tests (each xdist worker; the only one without xdist):
    the tests' `vaco` commands fork from it instead of starting a cold interpreter (see
    tests/helpers/forkserver.py). ``VACO_TEST_FORKSERVER=0`` turns it off."""
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # xdist's controller runs no test
    if os.environ.get("VACO_TEST_FORKSERVER") == "0":
        return
    where = Path(tempfile.mkdtemp(prefix="vaco-forkserver-"))
    socket_path = str(where / "server.sock")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tests' own, for a command to match
    server = Path(__file__).with_name("helpers") / "forkserver.py"
    with open(where / "server.log", "w") as log:
        _FORKSERVER["proc"] = subprocess.Popen(
            [sys.executable, str(server), socket_path, REAL_VACO],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    from helpers.forkserver import write_client

    os.environ["VACO_TEST_FORKSERVER"] = socket_path
    os.environ["VACO_TEST_CLIENT"] = write_client(str(where / "vaco"), sys.executable, REAL_VACO)
    _FORKSERVER["where"] = where


def pytest_unconfigure(config):
    proc = _FORKSERVER.pop("proc", None)
    if proc is not None:
        proc.kill()
        proc.wait()


_FILE_SECONDS: dict[str, float] = {}
_WORKER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Seconds by file and by xdist worker (set-up, call and tear-down of every test)."""
    path = report.nodeid.split("::")[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration
    node = getattr(report, "node", None)  # xdist's controller sets it to the worker that ran the test
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    _WORKER_SECONDS[worker] = _WORKER_SECONDS.get(worker, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, config):
    if not config.getoption("durations", None) or not _FILE_SECONDS:
        return
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", "seconds by test file (set-up + call + tear-down)")
    ranked = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])
    for path, seconds in ranked:
        write(f"{seconds:8.1f}s {path}")
    total = sum(_FILE_SECONDS.values())
    busy = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(_WORKER_SECONDS.items()))
    write(f"{total:8.1f}s in all; by worker: {busy}")


@pytest.fixture(autouse=True)
def _default_dtype_is_float32(request):
    """Fail loudly if a test module changed torch's default dtype at import (it leaks into every
    later module: networks built in float64 then meet float32 observations)."""
    if "float64" not in request.fixturenames:
        assert torch.get_default_dtype() == torch.float32, "torch default dtype leaked; use the float64 fixture"


@pytest.fixture
def float64():
    """Reference math in float64; restored afterwards so other test modules are unaffected."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    """A fresh SQLite tracking store for this test (also seen by subprocesses)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri
