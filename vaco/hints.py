"""How vaco names itself in the hints it prints (``open it with: vaco ui``): a leaf module that
``vaco fit``, ``vaco sweep`` and the command dispatcher all import."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["shell", "vaco_command"]


def shell(*words: object) -> str:
    """A command line the user can paste: each word quoted for a POSIX shell where it needs it
    (a path with a space, a URI with ``&``), bare where it does not (``vaco ui``)."""

    return " ".join(shlex.quote(str(word)) for word in words)


def vaco_command() -> str:
    """How the user can run vaco from where they are, quoted for the shell: ``vaco`` when it is on
    PATH (this install's), else the script's path (``.venv/bin/vaco`` after ``make demo``, relative
    where shorter)."""

    script = Path(sys.executable).with_name("vaco")
    found = shutil.which("vaco")
    if found and Path(found).resolve() == script.resolve():
        return "vaco"
    try:
        relative = os.path.relpath(script)
    except ValueError:
        relative = str(script)
    return shell(relative if len(relative) < len(str(script)) else str(script))
