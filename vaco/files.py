"""Files vaco writes on storage other people share: atomically, with the mode the umask gives.

Imports nothing heavy (the sweep's launchers use it; ``vaco sweep --help`` stays fast).
:func:`vaco.run.checkpoint.save_atomic` writes checkpoints the same way.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

__all__ = [
    "MAX_YAML_VALUES",
    "SymlinkRefused",
    "YAMLTooLarge",
    "current_umask",
    "load_yaml",
    "open_append",
    "open_for_lock",
    "write_bytes_atomic",
    "write_text_atomic",
]


class SymlinkRefused(OSError):
    """A file vaco writes in an output folder is a symbolic link (in a shared folder, anyone's)."""


def _open_no_follow(path: str | os.PathLike, flags: int) -> int:
    """``os.open`` that never follows a final symlink: on a shared sweep folder a link planted where
    vaco writes would truncate or append to its target (another user's file)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP or (os.path.islink(path) and err.errno in (errno.EMLINK, errno.ENOTDIR)):
            raise SymlinkRefused(
                errno.ELOOP, f"{path} is a symbolic link: vaco does not write through one (remove it)"
            ) from None
        raise


def open_append(path: str | os.PathLike):
    """A log opened for appending (created 0666 less the umask), never through a symlink."""
    return os.fdopen(_open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a")


def open_for_lock(path: str | os.PathLike):
    """A lock file opened for ``flock`` (created if absent, never truncated), never through a symlink."""
    return os.fdopen(_open_no_follow(path, os.O_WRONLY | os.O_CREAT), "w")


#: the most values a YAML file vaco reads may hold once its aliases are expanded (vaco's largest
#: config holds a few hundred; a nine-level alias bomb holds 9^9)
MAX_YAML_VALUES = 100_000


class YAMLTooLarge(ValueError):
    """A YAML document whose aliases expand it past :data:`MAX_YAML_VALUES` values."""


def load_yaml(text: str):
    """``yaml.safe_load`` that refuses a document whose aliases expand it past
    :data:`MAX_YAML_VALUES` values (an "alias bomb": ``&a [*b, *b, ...]`` nested a few levels).

    PyYAML builds aliases as shared references, so loading is cheap; whatever then walks the
    result as a tree (jsonargparse, ``copy.deepcopy``, a dump) expands it, gigabytes for a
    1 KiB file. The expanded size is counted here on the shared structure, without expanding it.
    Raises :class:`yaml.YAMLError` for a syntax error and :class:`YAMLTooLarge` for a bomb."""
    import yaml

    document = yaml.safe_load(text)
    sizes: dict[int, int] = {}

    def size(node) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key not in sizes:
            sizes[key] = 0  # a self-referencing alias counts once: it cannot be expanded anyway
            children = node.values() if isinstance(node, dict) else node
            total = 1
            for child in children:
                total += size(child)
                if total > MAX_YAML_VALUES:
                    break
            sizes[key] = total
        return sizes[key]

    if size(document) > MAX_YAML_VALUES:
        raise YAMLTooLarge(
            f"its aliases expand it to more than {MAX_YAML_VALUES:,} values (an alias bomb?); vaco does not read it"
        )
    return document


def current_umask() -> int:
    """The process's umask (Linux reads it without changing it; elsewhere set and restored)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically: :func:`write_bytes_atomic`."""
    return write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync, then ``os.replace``: a reader (or a
    rerun after a kill) sees the old file or the new one, never a part. The file gets the mode a
    plain ``open`` would give it (0666 less the umask), not ``mkstemp``'s 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path
