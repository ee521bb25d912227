"""Files vaco writes on storage other people share: atomically, with the mode the umask gives.

Imports nothing heavy (the sweep's launchers use it; ``vaco sweep --help`` stays fast).
:func:`vaco.checkpoint.save_atomic` writes checkpoints the same way.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["current_umask", "write_text_atomic"]


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
    """Write ``text`` to a temporary file beside ``path``, fsync, then ``os.replace``: a reader (or a
    rerun after a kill) sees the old file or the new one, never a part. The file gets the mode a
    plain ``open`` would give it (0666 less the umask), not ``mkstemp``'s 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path
