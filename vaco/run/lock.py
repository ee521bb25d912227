"""One process per run: an exclusive lock on a run's checkpoint folder while ``vaco fit`` trains it.

Two ``vaco fit --ckpt_path`` of one checkpoint (a job resubmitted while it still runs, a cell
listed twice) would both resume the same MLflow run and write the same ``last.ckpt``: the run's
history two runs interleaved. So ``vaco fit`` holds ``<checkpoint folder>/vaco.lock`` while it
trains: a resume takes it before anything starts (``--ckpt_path``'s folder), a new run as soon as
its folder is known (:class:`vaco.run.callbacks.IterationCheckpoint`). A second process refuses in one
line naming the holder (pid, host, since when).

A copy of a checkpoint in another folder resumes the same MLflow run, so the run's MLflow id is
locked too (:func:`hold_mlflow_run_lock`): a lock file per run id in this account's own lock folder
on this host (``$XDG_RUNTIME_DIR`` or the temporary directory, ``vaco-run-locks-<uid>``), taken by a
new run once its id exists and by a resume before anything touches the run. Two processes on two
hosts sharing one store are not stopped by it.

The lock is a POSIX record lock (``fcntl.lockf``): the kernel drops it when its process dies,
however it dies, and a child process (an env worker) does not inherit it. The file holds the
holder's description; a clean exit removes it, so a file found by the next holder is one whose
process died without letting go, and the taking over is said in one line. On a file system
without POSIX locks (some network mounts) the lock is skipped with a warning.
"""

from __future__ import annotations

import atexit
import datetime
import errno
import fcntl
import json
import os
import re
import socket
import sys
import tempfile
from pathlib import Path

from vaco.config_errors import ConfigurationError

__all__ = [
    "LOCK_NAME",
    "RunLockedError",
    "hold_mlflow_run_lock",
    "hold_run_lock",
    "mlflow_lock_folder",
    "release_run_locks",
]

LOCK_NAME = "vaco.lock"
_HELD: dict[str, tuple[int, Path]] = {}  # resolved folder -> (the open descriptor holding its lock, the file)


class RunLockedError(ConfigurationError):
    """Another live process trains this run (``vaco fit`` exits 2 with its one line)."""


def _describe(holder: dict) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"


def mlflow_lock_folder(run_id: str) -> Path:
    """The folder whose lock stands for MLflow run ``run_id`` (this account's, on this host)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", str(run_id)):
        raise ValueError(f"not an MLflow run id: {run_id!r}")
    return Path(base) / f"vaco-run-locks-{os.getuid()}" / str(run_id)


def hold_mlflow_run_lock(run_id: str, what: str) -> str | None:
    """:func:`hold_run_lock` on MLflow run ``run_id``'s own lock folder (:func:`mlflow_lock_folder`),
    whichever checkpoint folder the process trains in."""
    folder = mlflow_lock_folder(run_id)
    folder.parent.mkdir(mode=0o700, exist_ok=True)
    return hold_run_lock(folder, what, show_folder=False)


def hold_run_lock(folder: str | os.PathLike, what: str = "this run", show_folder: bool = True) -> str | None:
    """Take ``folder``'s run lock for the rest of this process (a no-op if it already holds it).

    Returns a line to print where the lock was taken over from a process that died holding it,
    else None. Raises :class:`RunLockedError` (one line naming the holder) where a live process holds it.
    """
    folder = Path(folder).resolve()
    key = str(folder)
    if key in _HELD or not _first_process():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:  # a run-id folder removed by its last holder meanwhile
            folder.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read(fd)
            os.close(fd)
            if err.errno in (errno.EACCES, errno.EAGAIN):
                where = f" ({folder})" if show_folder else ""
                raise RunLockedError(
                    f"{what}{where} is being trained by another process ({_describe(holder)}); wait for it to "
                    "end or stop it, then run this again"
                ) from None
            print(f"vaco: warning: no lock on {path} ({err.strerror}): nothing stops a second process", file=sys.stderr)
            return None
        try:  # the file locked is still the folder's: a holder that ended may have removed it meanwhile
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    previous = _read(fd)
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    os.fsync(fd)
    _HELD[key] = (fd, path)
    atexit.register(_release, key)
    if previous:
        return f"vaco: took over the lock of {what} from {_describe(previous)}: that process ended without releasing it"
    return None


def _first_process() -> bool:
    """Whether this is a run's first process: the other ranks of a multi-process (DDP) run, started
    by Lightning or SLURM with these variables set, train the same run and take no lock."""
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def _read(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0)
        return json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {"pid": "?", "host": "?", "since": "?"}


def _release(key: str) -> None:
    """A clean exit: the file removed while still locked, then the lock let go (a process that opened
    the old file meanwhile sees it is no longer the folder's and opens the new one)."""
    held = _HELD.pop(key, None)
    if held is None:
        return
    fd, path = held
    try:
        path.unlink(missing_ok=True)
        fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    if path.parent.parent.name.startswith("vaco-run-locks-"):  # a run id's own folder: leave no empty folder
        try:
            path.parent.rmdir()
        except OSError:
            pass


def release_run_locks() -> None:
    """Let go of every run lock this process holds (``vaco fit``'s end; a process that runs several
    fits in turn, such as a test, must not keep the first one's run locked)."""
    for key in list(_HELD):
        _release(key)
