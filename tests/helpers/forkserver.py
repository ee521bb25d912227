"""The suite's `vaco` without its ~7 s of imports: a preloaded process that forks each command.

Most tests run `vaco ...` as a subprocess (the real CLI, its exit code and its output); a cold
interpreter spends ~7 s of a two-core machine importing torch, Lightning, MLflow, gymnasium and
TorchRL first, and the suite starts well over a hundred of them. Each xdist worker starts one
server (tests/conftest.py) that imports those once and then forks a child per command. The child
is the command a subprocess would run: the same argv, working directory, environment, resource
limits and umask, the caller's own stdin, stdout and stderr (passed over the socket), its own
session, ``vaco.commands.cli.main`` with ``sys.argv`` as the ``vaco`` script sets it. The tests reach it
through a client script (``VACO`` in tests/helpers/runs.py) that forwards the signals it gets to
the child, exits with the child's code (or dies by the child's signal) and, killed itself, takes
the child with it (the server sees the connection close). This is how `vaco sweep` already forks
its cells (vaco/sweep/zygote.py; tests/test_sweep.py checks that a forked cell computes exactly
what a subprocess does).

The client runs the real ``vaco`` instead when no server answers, when the test asks for it
(``VACO_TEST_FRESH=1``: a test that looks at the process tree, or sets what only a fresh interpreter
reads) or when the environment differs from the server's in what is read at start-up
(:data:`STARTUP_KEYS`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import importlib.util
import json
import os
import resource
import select
import signal
import socket
import sys
import threading

from vaco.sweep.zygote import PRELOAD as ZYGOTE_PRELOAD

#: environment variables a preloaded module reads at import (or the interpreter at start-up): a
#: command whose value differs from the server's runs in a fresh interpreter
STARTUP_KEYS = (
    "MUJOCO_GL",
    "PYOPENGL_PLATFORM",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PYTHONHOME",
    "PYTHONWARNINGS",
    "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH",
    "PYTHONHASHSEED",
    "MPLBACKEND",
    "CUDA_VISIBLE_DEVICES",
    "WARP_CACHE_PATH",
)
LIMITS = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_CORE")
#: what a sweep's zygote preloads (a MuJoCo `vaco fit`), and what the other commands import
PRELOAD = (
    *ZYGOTE_PRELOAD,
    "pandas",
    "scipy.stats",
    "vaco.population.module",
    "vaco.commands.evaluate",
    "vaco.sweep.sweep_cli",
    "vaco.report",
    "vaco.commands.report",
)


def _pdeathsig() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def serve(path: str, vaco: str) -> None:
    """Preload, then fork one child per connection to the socket at ``path``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _pdeathsig()  # dies with its pytest worker
    base_path = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if threading.active_count() != 1:  # forking a process with threads could inherit a held lock
        print(f"forkserver: threads after preloading: {threading.enumerate()}", file=sys.stderr, flush=True)
        return
    startup = {key: os.environ.get(key) for key in STARTUP_KEYS}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # clients connect only once it listens
    listener.listen(64)
    children: dict[int, socket.socket] = {}  # pid -> its client's connection
    clients: dict[socket.socket, int] = {}
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        readable, _, _ = select.select([listener, *clients], [], [], 0.05)
        for conn in readable:
            if conn is listener:
                client, _ = listener.accept()
                pid = _start(client, startup, base_path, vaco, [listener, *clients])
                if pid is None:
                    client.close()
                else:
                    children[pid], clients[client] = client, pid
            else:  # a client's connection closed: it died (killed); its command dies with it
                pid = clients.pop(conn)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                conn.close()
        while True:  # reap, and tell each child's client how it ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            client = children.pop(pid, None)
            if client is not None:
                clients.pop(client, None)
                with contextlib.suppress(OSError):
                    client.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                client.close()


def _start(client: socket.socket, startup: dict, base_path: list[str], vaco: str, others) -> int | None:
    data, fds, _, _ = socket.recv_fds(client, 1 << 20, 3)
    while not data.endswith(b"\n"):  # a large environment comes in pieces
        more = client.recv(1 << 20)
        if not more:
            return None
        data += more
    request = json.loads(data)
    env = request["env"]
    if len(fds) != 3 or any(env.get(key) != value for key, value in startup.items()):
        client.sendall(b'{"fresh": true}\n')
        for fd in fds:
            os.close(fd)
        return None
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        client.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        return pid
    # the child: the command, as the `vaco` script runs it (`sys.exit(main())`), ended as a fresh
    # interpreter ends (below)
    for sock in (*others, client):
        sock.close()
    os.setsid()  # its own group: a Ctrl-C the client forwards reaches the command's processes
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    os.umask(request["umask"])
    for name, (soft, hard) in request["limits"].items():
        if resource.getrlimit(getattr(resource, name)) != (soft, hard):
            resource.setrlimit(getattr(resource, name), (soft, hard))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(vaco), *extra, *base_path]
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=unbuffered or stream is sys.stderr or os.isatty(stream.fileno()))
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the client's stdin
    sys.argv = [vaco, *request["argv"]]
    # what `vaco ...` would see: Lightning's DDP launcher and multiprocessing's spawn start
    # their processes from __main__'s module and sys.argv (as vaco/sweep/zygote.py does)
    sys.modules["__main__"].__spec__ = importlib.util.find_spec("vaco.commands.cli")
    from vaco.commands.cli import main

    code, interrupted = 1, False
    try:
        sys.exit(main())
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:  # as the interpreter does: the message on stderr, exit 1
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        interrupted = True
    except BaseException:  # noqa: BLE001 - a traceback on stderr and exit 1, as a fresh interpreter's
        sys.excepthook(*sys.exc_info())
    # the interpreter's own ending, less its teardown of every module (seconds in a process this
    # size, each object's page copied on write): non-daemon threads joined, atexit handlers run
    # (logging, multiprocessing's children, temporary files), the streams flushed
    threading._shutdown()
    atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    if interrupted:  # an uncaught KeyboardInterrupt ends a Python process by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


CLIENT = '''#!{python} -SE
"""`vaco` through the suite's fork server (tests/helpers/forkserver.py); the real one otherwise."""
import json, os, resource, signal, socket, sys

REAL = {real!r}
LIMITS = {limits!r}


def fresh():
    os.execv(REAL, [REAL, *sys.argv[1:]])


path = os.environ.get("VACO_TEST_FORKSERVER")
if not path or os.environ.get("VACO_TEST_FRESH"):
    fresh()
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    conn.connect(path)
except OSError:
    fresh()
umask = os.umask(0)
os.umask(umask)
request = {{
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "env": dict(os.environ),
    "umask": umask,
    "limits": {{name: resource.getrlimit(getattr(resource, name)) for name in LIMITS}},
}}
data = json.dumps(request).encode() + b"\\n"
socket.send_fds(conn, [data[:65536]], [0, 1, 2])
if len(data) > 65536:
    conn.sendall(data[65536:])
reader = conn.makefile("rb")
first = json.loads(reader.readline() or b'{{"fresh": true}}')
if "pid" not in first:
    conn.close()
    fresh()
pid = first["pid"]


def forward(signum, frame):
    try:
        if signum == signal.SIGINT:  # Ctrl-C: to the command's whole group, as a terminal sends it
            try:
                os.killpg(pid, signum)
            except ProcessLookupError:  # not yet its own group
                os.kill(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, forward)
line = b""
while not line:
    try:
        line = reader.readline()
        break
    except InterruptedError:
        continue
code = json.loads(line)["returncode"] if line else 1
if code < 0:  # killed by a signal: end the same way
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code)
'''


def write_client(where: str, python: str, real: str) -> str:
    """The client script (executable) at ``where``; returns its path."""
    with open(where, "w") as fh:
        fh.write(CLIENT.format(python=python, real=real, limits=LIMITS))
    os.chmod(where, 0o755)
    return where


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
