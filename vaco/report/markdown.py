"""Markdown pieces the report's summary is built from: tables, intervals, sample SDs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vaco.report.scores import Estimate

__all__: list[str] = []  # helpers of the summary modules, not part of vaco.report's API


def ci_text(e: Estimate | None, i: int = 0) -> str:
    if e is None:
        return "-"
    if e.interval is None:
        return f"{e.point[i]:.3f} (no CI)"
    if e.kind == "range":
        return f"{e.point[i]:.3f} (range {e.interval[0, i]:.3f} to {e.interval[1, i]:.3f}, {e.runs_per_task} runs)"
    return f"{e.point[i]:.3f} [{e.interval[0, i]:.3f}, {e.interval[1, i]:.3f}]"


def sample_sd(values) -> float:
    """The sample standard deviation (ddof = 1); 0 for one value."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1)) if values.size > 1 else 0.0


def mean_sd_text(values, digits: int) -> str:
    """``mean +- sample SD`` of ``values``; one value has no spread to show: ``x (1 run)``."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 1:
        return f"{values[0]:.{digits}f} (1 run)"
    return f"{values.mean():.{digits}f} +- {sample_sd(values):.{digits}f}"


def estimate_text(x: float, interval) -> str:
    if interval is None:
        return f"{x:.3f} (no CI)"
    return f"{x:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
