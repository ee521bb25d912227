"""`make notebook`'s first step: check that the analysis notebook has something to read.

The notebook reads ``VACO_DATA`` (a ``vaco report --save-data`` file) or the MLflow experiment
``VACO_EXPERIMENT`` (default ``vaco-laptop``, the laptop sweep's) from ``MLFLOW_TRACKING_URI``.
Where neither is there (right after ``make demo``, whose one run is in ``vaco-demo``), this says in
one line which variable to set and what the store holds, exit 2, instead of the notebook's
traceback from its first cell.

    python scripts/notebook_inputs.py    # exit 0: the notebook can run
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HINT = "VACO_DATA=docs/data/five_tasks.csv.gz make notebook reads the committed five-task study"


def problem() -> str | None:
    data = os.environ.get("VACO_DATA")
    if data:
        path = Path(data) if Path(data).is_absolute() else ROOT / data
        return None if path.is_file() else f"VACO_DATA: no file {data} (a `vaco report --save-data` file)"
    experiment = os.environ.get("VACO_EXPERIMENT", "vaco-laptop")
    uri = os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    if not uri.startswith("sqlite:///"):
        return None  # a server or PostgreSQL: the notebook says what it finds there
    db = Path(uri[len("sqlite:///") :])
    db = db if db.is_absolute() else ROOT / db
    if not db.is_file():
        return f"no MLflow store at {db}: run a sweep first (or set MLFLOW_TRACKING_URI); {HINT}"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        names = [row[0] for row in con.execute("SELECT name FROM experiments WHERE lifecycle_stage = 'active'")]
    if experiment in names:
        return None
    there = ", ".join(sorted(n for n in names if n != "Default")) or "none"
    return (
        f"no experiment '{experiment}' in {db.name} (its experiments: {there}): set VACO_EXPERIMENT to a sweep's "
        f"experiment (the notebook compares algorithms and K, so one demo run is not enough), or {HINT}"
    )


if __name__ == "__main__":
    message = problem()
    if message is not None:
        print(f"make notebook: {message}", file=sys.stderr)
        sys.exit(2)
