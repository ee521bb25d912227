"""A preloaded process that forks a sweep's cells: ``vaco fit`` without its ~7 s of imports.

Every cell of a local sweep is one ``vaco fit``. Started as a fresh interpreter, a cell spends about
7 s (two-core machine here) importing torch, Lightning (which pulls in torchmetrics and
torch._dynamo), MLflow, gymnasium and TorchRL before its first env step: a fifth of a 246k-step
study cell. ``vaco sweep`` therefore starts one *zygote* per sweep: a process that imports those
once and then forks a child per cell. The child is the same ``vaco fit`` a subprocess would run
(``python -m vaco.commands.cli fit --config <cell>/config.yaml [--ckpt_path ...]``: the same argv, working
directory, environment and log file, its own session), so a cell computes exactly what it did;
only the imports are shared. No thread exists in the zygote when it forks (checked), so nothing
a thread held is inherited half-done.

The protocol is JSON lines. The launcher writes ``{"argv": [...], "cwd": ..., "env": {...},
"log": path}``; the zygote answers ``{"started": pid}`` and, when a child ends, ``{"pid": pid,
"returncode": code}`` (``subprocess``'s convention: ``-N`` for a signal). The zygote reaps its
children itself (they are not the launcher's), ignores SIGINT (the launcher stops the cells, as
it stops subprocesses) and dies with the launcher (``PR_SET_PDEATHSIG``); each child dies with
the zygote the same way, so a killed sweep leaves no orphan.

``VACO_SWEEP_ZYGOTE=0`` makes the launcher start every cell as a plain subprocess instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import vaco
from vaco.commands.cli import main

__all__ = ["Zygote", "ForkedCell", "PRELOAD", "serve"]

#: what the zygote imports before it forks (what `vaco fit` of a MuJoCo cell imports)
PRELOAD = (
    "torch",
    "lightning",
    "mlflow",
    "gymnasium",
    "torchrl",
    "tensordict",
    "vaco.commands.cli",
    "vaco.commands.fit",
    "vaco.learners.vaco_module",
    "vaco.data",
    "vaco.data.envs",
    "vaco.objectives",
    "vaco.advantages",
    "vaco.run.logger",
    "vaco.run.callbacks",
)


def _pdeathsig() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _send(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())  # unbuffered: nothing pending is copied by fork


# ---------------------------------------------------------------------------------------- the zygote
def serve() -> None:
    """The zygote's loop (``python -m vaco.sweep.zygote``): preload, then fork one child per request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _pdeathsig()
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # a cell that needs it fails the same way, with its own message
            importlib.import_module(name)
    if threading.active_count() != 1:  # forking a process with threads could inherit a held lock
        _send({"error": f"threads after preloading: {[t.name for t in threading.enumerate()]}"})
        return
    _send({"ready": os.getpid()})
    stdin = sys.stdin.buffer
    pending = b""
    while True:
        _reap()
        readable, _, _ = select.select([stdin.fileno()], [], [], 0.1)
        if not readable:
            continue
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:  # the launcher is gone or done: the children stay until they end (or get PDEATHSIG)
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                _send({"started": _fork(json.loads(line))})
    while True:  # reap what is left, then go
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        _send({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _fork(request: dict) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()  # its own session and group: the launcher signals the cell's whole group
        _pdeathsig()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fds 0-2 now belong to the cell
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - line-buffered, as PYTHONUNBUFFERED
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        # what `python -m vaco.commands.cli fit ...` would see: Lightning's DDP launcher and multiprocessing's
        # spawn start their processes from __main__'s module name and sys.argv
        sys.argv = [os.path.join(os.path.dirname(sys.executable), "vaco"), *request["argv"]]
        sys.modules["__main__"].__spec__ = importlib.util.find_spec("vaco.commands.cli")

        code = main(request["argv"]) or 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - the cell's own traceback, in its log
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# ---------------------------------------------------------------------------------------- the launcher's side
class ForkedCell:
    """A cell forked by the zygote, with the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.returncodes.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if not self.zygote.alive():  # the zygote died: the cell died with it (PDEATHSIG)
                self.returncode = -signal.SIGKILL
                break
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"cell {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode


class Zygote:
    """Starts the zygote process and forks cells through it (``start``); ``close`` ends it."""

    def __init__(self, env: dict[str, str], wait: bool = True, timeout: float = 120.0) -> None:

        self.returncodes: dict[int, int] = {}
        self._started: list[int] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self.timeout = timeout

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vaco.sweep.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            # started beside the launcher's own vaco: `-m` puts its directory first on sys.path (the
            # cells chdir to theirs after the imports), so another folder's vaco/ cannot shadow it
            cwd=str(Path(vaco.__file__).resolve().parents[1]),
            preexec_fn=_pdeathsig if sys.platform == "linux" else None,
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait (at most ``timeout`` s) until it has preloaded; raises RuntimeError if it did not."""
        if self._reader is not None:
            return
        first = self._read_line(self.timeout)
        if not first or "ready" not in first:
            raise RuntimeError(f"the sweep's zygote did not start: {first or 'no answer'}")
        self._reader = threading.Thread(target=self._read, name="vaco-zygote-reader", daemon=True)
        self._reader.start()

    def _read_line(self, timeout: float) -> dict | None:
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not readable:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line.strip() else None

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._cond:
                if "started" in message:
                    self._started.append(message["started"])
                elif "pid" in message:
                    self.returncodes[message["pid"]] = message["returncode"]
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, argv: list[str], cwd: str, env: dict[str, str], log: str) -> ForkedCell:
        request = {"argv": argv, "cwd": cwd, "env": env, "log": log}
        with self._cond:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            if not self._cond.wait_for(lambda: self._started or not self.alive(), timeout=60):
                raise RuntimeError("the sweep's zygote did not fork the cell in 60 s")
            if not self._started:
                raise RuntimeError(f"the sweep's zygote exited (code {self.proc.returncode})")
            return ForkedCell(self, self._started.pop(0))

    def close(self) -> None:
        """End the zygote (its running children, if any, are the launcher's to stop first); one
        still preloading is killed (it has no child yet)."""
        if self._reader is None:
            self.proc.kill()
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - it must not outlive the sweep
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    serve()
