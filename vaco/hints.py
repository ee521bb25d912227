"""How vaco names itself in the hints it prints (``open it with: vaco ui``): a leaf module that
``vaco fit``, ``vaco sweep`` and the command dispatcher all import."""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["vaco_command"]


def vaco_command() -> str:
    """How the user can run vaco from where they are: ``vaco`` when it is on PATH (this install's),
    else the script's path (``.venv/bin/vaco`` after ``make demo``, relative where shorter)."""
    import shutil

    script = Path(sys.executable).with_name("vaco")
    found = shutil.which("vaco")
    if found and Path(found).resolve() == script.resolve():
        return "vaco"
    try:
        relative = os.path.relpath(script)
    except ValueError:
        relative = str(script)
    return relative if len(relative) < len(str(script)) else str(script)
