"""The ``vaco`` command. This module only dispatches: each subcommand imports what it needs, so
``vaco --help`` and every ``--help`` except ``fit``'s return without importing torch or Lightning.

    vaco fit --config configs/env/hopper.yaml --config configs/algo/vaco.yaml
    vaco fit --config configs/demo.yaml --print_config
    vaco evaluate --ckpt checkpoints/<run>/last.ckpt --episodes 10 [--video out.mp4]
    vaco sweep --config configs/sweeps/laptop.yaml [--jobs 2] [--dry-run]
    vaco report --experiment vaco-laptop
    vaco ui
"""

from __future__ import annotations

import ctypes.util
import faulthandler
import importlib
import os
import select
import signal
import sys

from vaco import __version__
from vaco.config_errors import (
    ConfigurationError,
    check_config_files,
    config_files,
    did_you_mean,
    refuse_sweep_files,
)

__all__ = ["main", "COMMANDS"]

# name -> (module with a `main(argv)`, one-line description)
USER_MODULE_COMMANDS = ("fit", "sweep")  # the commands that import class paths from the user's directory
COMMANDS = {
    "fit": ("vaco.commands.fit", "train one run (LightningCLI: --config files, --print_config, --ckpt_path to resume)"),
    "evaluate": ("vaco.commands.evaluate", "run a checkpoint's policy for E episodes, optionally write a video"),
    "sweep": ("vaco.sweep", "run a grid of `vaco fit` cells; skips finished cells, resumes interrupted ones"),
    "report": ("vaco.commands.report", "rliable aggregates, curves and ablations from a sweep's MLflow runs"),
    "ui": ("vaco.commands.ui", "open the MLflow UI on the store `vaco fit` writes to (127.0.0.1)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return (
        "usage: vaco COMMAND [options]   (vaco COMMAND --help for its options)\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\nexamples:\n"
        + "\n".join("  " + line.strip() for line in __doc__.splitlines()[3:] if line.strip().startswith("vaco "))
    )


def main(argv: list[str] | None = None) -> int | None:
    try:
        return _main(argv)
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe broke (an actor's, a server's socket): that is an error to report
        # `vaco --help | head`, `vaco report ... | less` quit early: stop quietly, as `ls | head` does
        # (Python would print a traceback, and another one at exit when it flushes stdout)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + getattr(signal, "SIGPIPE", 13))
    except KeyboardInterrupt:
        # Ctrl-C while Python imports torch and Lightning (before vaco's own handler keeps a first one),
        # or a second Ctrl-C: one line, not the interpreter's traceback of wherever it landed
        print("vaco: stopped by Ctrl-C", file=sys.stderr, flush=True)
        sys.exit(128 + signal.SIGINT)


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll(2) reports POLLERR on such a pipe's
    write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll on this platform, or no real stdout
        return False


def _main(argv: list[str] | None) -> int | None:
    if argv is None and hasattr(signal, "SIGUSR1"):
        # `kill -USR1 <pid>` prints every thread's Python stack to stderr: a stuck run can be
        # diagnosed without stopping it (the tests use it when a run does not exit in time)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    # A class_path to the user's own module (my_objectives.RatioCap) resolves from the directory
    # vaco runs in: only for the commands that read class paths (fit, sweep), and *after* the
    # installed packages, so a stray numpy.py or yaml.py in the working directory never shadows them.
    if argv and argv[0] in USER_MODULE_COMMANDS and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command = argv[0]
    if command in ("-V", "--version"):
        print(f"vaco {__version__}")
        return 0
    if command not in COMMANDS:
        hint = did_you_mean(command, COMMANDS)
        print(f"vaco: unknown command {command!r}.{hint} Commands: {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    _check_gl(command, argv[1:])
    # MLflow prints "View run ... at: <tracking URI>" when a run ends, user info and password
    # included: into the terminal and every sweep cell's train.log. vaco prints its own pointer
    # (`vaco ui`), with the URI redacted. (A user may set the variable to false to have MLflow's.)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    if command == "fit":  # a bad --config file (missing, a tab, an alias bomb) is refused before torch imports
        try:
            refuse_sweep_files(check_config_files(config_files(argv[1:])))
        except ConfigurationError as err:
            print(f"vaco fit: error: {err}", file=sys.stderr)
            sys.exit(2)
    module = importlib.import_module(COMMANDS[command][0])
    return module.main(argv[1:])


_GL_LIBRARIES = {"osmesa": ("OSMesa", "libosmesa6"), "egl": ("EGL", "libegl1")}


def _check_gl(command: str, argv: list[str]) -> None:
    """``MUJOCO_GL=osmesa`` (or egl) without its library breaks every import of torchrl (PyOpenGL
    loads the platform at import). Where nothing renders, vaco runs without the setting; where a
    video is asked for, it says in one line which library to install."""

    backend = (os.environ.get("MUJOCO_GL") or os.environ.get("PYOPENGL_PLATFORM") or "").lower()
    if backend not in _GL_LIBRARIES:
        return
    library, package = _GL_LIBRARIES[backend]
    if ctypes.util.find_library(library):
        return
    if command == "evaluate" and any(a == "--video" or a.startswith("--video=") for a in argv):
        print(
            f"vaco evaluate: error: `MUJOCO_GL={backend}`: the {library} library is not installed, so no video can be "
            f"rendered (Debian/Ubuntu: apt-get install {package}; or set MUJOCO_GL to a backend this machine has)",
            file=sys.stderr,
        )
        sys.exit(2)
    for name in ("MUJOCO_GL", "PYOPENGL_PLATFORM"):  # nothing renders in this command
        os.environ.pop(name, None)


if __name__ == "__main__":
    sys.exit(main())
