"""Input checks shared by the pure functions: fail loudly, naming the argument.

Silent broadcasting is the classic RL bug (a ``[B]`` advantage against a ``[B, 1]`` ratio
gives a ``[B, B]`` loss that still trains, badly), so every public function states its shape
contract and calls these before doing any math.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "same_shape",
    "all_finite",
    "NonFiniteInputError",
    "positive",
    "in_closed_interval",
    "available_memory",
    "fits_in_memory",
]


class NonFiniteInputError(ValueError):
    """An input tensor holds NaN or inf (the message names it)."""


def same_shape(**tensors: torch.Tensor | None) -> torch.Size:
    """Check that every given tensor has exactly the same shape (no broadcasting).

    Returns the common shape. ``None`` entries are skipped (optional inputs).
    """
    shape: torch.Size | None = None
    first = ""
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(tensor).__name__}")
        if shape is None:
            shape, first = tensor.shape, name
        elif tensor.shape != shape:
            raise ValueError(
                f"`{name}` has shape {tuple(tensor.shape)} but `{first}` has shape {tuple(shape)}; "
                "all inputs must have the same shape (no broadcasting: a [B] tensor against a "
                "[B, 1] tensor is an error, squeeze the trailing dimension first)"
            )
    if shape is None:
        raise ValueError("no tensors given")
    return shape


def all_finite(**tensors: torch.Tensor | None) -> None:
    """Raise if a floating tensor holds NaN or inf, naming it."""
    checked = {k: t for k, t in tensors.items() if t is not None and t.is_floating_point()}
    if not checked:
        return
    # one host sync on the happy path (this runs on every minibatch)
    if bool(torch.stack([torch.isfinite(t).all() for t in checked.values()]).all()):
        return
    for name, tensor in checked.items():
        if not bool(torch.isfinite(tensor).all()):
            n_nan = int(torch.isnan(tensor).sum())
            n_inf = int(torch.isinf(tensor).sum())
            raise NonFiniteInputError(f"`{name}` contains {n_nan} NaN and {n_inf} inf values")


def positive(**values: float) -> None:
    """Raise unless every value is a finite number > 0."""
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}")


def integers(prefix: str, *checks: tuple[str, object, int]) -> None:
    """Each ``(name, value, low)``: ``value`` an integer (not a bool) >= ``low``, else a ValueError
    naming the config field ``{prefix}.{name}``."""
    for name, value, low in checks:
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
            raise ValueError(f"`{prefix}.{name}` must be an integer >= {low}, got {value!r}")


def in_closed_interval(low: float, high: float, **values: float) -> None:
    """Raise unless every value lies in [low, high]."""
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and low <= value <= high):
            raise ValueError(f"`{name}` must be in [{low}, {high}], got {value!r}")


def available_memory() -> int | None:
    """Bytes this machine can still give (``MemAvailable`` of /proc/meminfo), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fits_in_memory(needed: float, what: str) -> None:
    """Refuse, naming the fields in ``what``, a setting whose smallest allocation (``needed``
    bytes, a lower bound) exceeds the memory this machine has available: one line before any
    run exists, not a traceback from a failed allocation partway into one."""
    free = available_memory()
    if free is not None and needed > free:
        raise ValueError(f"{what} needs at least {_bytes(needed)}, more than this machine's {_bytes(free)} available")


def _bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"
