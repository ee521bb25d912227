"""The runs a report is made of: read from an MLflow experiment or from a data file, and the
report logged back beside them.

A :class:`Run` is one finished training run: its coordinates (algorithm, env, K, seed, realign,
and the value of every sweep axis its objective and advantage module declare, e.g. ``delta``,
``rho_bar``) and the metric histories the report needs. The names it reads are the ones
:mod:`vaco.tracking` defines and ``vaco fit`` writes.

A run is scored by the metric its module names (``score_metric``: ``eval/return``; the LLM
track's ``eval/accuracy``); a report's runs must share one.

A data file (``--save-data`` / ``--data``) is one CSV (optionally gzipped) with a row per logged
metric value and the run's coordinates on every row: everything the report needs, without the
MLflow store that produced it. Floats are written in full precision, so a report from the file
is the report from the store.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np

from vaco.files import write_bytes_atomic
from vaco.tracking import (
    FRACTION_PARAM,
    PARENT_TAG,
    REALIGNED_PARAM,
    REPORT_TAG,
    SCORE_PARAM,
    VARIANT_PARAM,
    redact_uri,
    run_axes,
    search_all_runs,
    tracking_uri,
)

__all__ = [
    "METRIC_KEYS",
    "Run",
    "load_runs",
    "log_report",
    "cell_of",
    "one_per_step",
    "read_data_files",
    "read_runs",
    "runs_from_frame",
    "runs_to_frame",
    "save_runs",
    "with_store_runs",
]

METRIC_KEYS = ("eval/return", "lag/forward_tv", "train/tv", "train/filter_fraction", "train/clip_fraction")
_COLUMNS = (
    "run_id",
    "name",
    "status",
    "start_time",
    "algorithm",
    "env",
    "K",
    "seed",
    "realign",
    "objective",
    "fraction_metric",
    "score_metric",
    "axes",
    "variant_of",
    "metric",
    "step",
    "value",
)
_OPTIONAL = ("variant_of",)  # columns a file saved by an older vaco lacks


@dataclasses.dataclass
class Run:
    """One finished training run: its coordinates and the metric histories the report needs."""

    run_id: str
    name: str
    status: str
    algorithm: str
    env: str
    K: int
    seed: int
    axes: dict[str, float | None]  # each declared sweep axis -> its value ({"delta": 0.2, "rho_bar": 1.0})
    realign: bool
    objective: str
    histories: dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (env steps, values), sorted by step
    start_time: int = 0
    fraction_metric: str = ""  # the objective's intervention fraction, e.g. "train/filter_fraction"
    score_metric: str = "eval/return"  # what the run is scored by (the LLM track: eval/accuracy)
    variant_of: str | None = None  # the algorithm this run ablates or controls for (its `variant_of` param)

    def history(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        return self.histories.get(key, (np.zeros(0), np.zeros(0)))

    def score(self) -> tuple[np.ndarray, np.ndarray]:
        """The history of the metric the run is scored by."""
        return self.history(self.score_metric)


def _keys(score_metric: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys([score_metric, *METRIC_KEYS]))


def _number(text: str | None) -> float | None:
    if text in (None, "", "None", "null"):
        return None
    return float(text)


def _fraction_metric(params: dict[str, str]) -> str:
    """The logged fraction metric; runs older than the param: the TV filter's or the clip's."""
    if FRACTION_PARAM in params:
        return params[FRACTION_PARAM]
    return "train/filter_fraction" if _number(params.get("delta")) is not None else "train/clip_fraction"


def load_runs(
    experiment: str, uri: str | None = None, include_unfinished: bool = False, known: dict | None = None
) -> tuple[list[Run], list[str]]:
    """The training runs of an MLflow experiment (not the report's own run) and notes on what was left out.

    A run needs the params ``algorithm``, ``env``, ``K``, ``seed`` (``vaco fit`` logs them). Runs
    that did not FINISH are left out unless ``include_unfinished``; of runs with the same
    coordinates only the newest is kept. ``known`` (run id -> Run) is a cache of FINISHED runs read
    before, whose histories are not read again (a finished run does not change); new ones are added.
    """
    import mlflow

    client = mlflow.MlflowClient(uri or tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(
            f"`--experiment`: no MLflow experiment named '{experiment}' in {redact_uri(uri or tracking_uri())}"
        )
    found = search_all_runs(client, [exp.experiment_id])
    notes: list[str] = []
    statuses = Counter()
    kept: dict[tuple, object] = {}
    duplicates = 0
    for r in found:
        p = r.data.params
        if r.data.tags.get(REPORT_TAG) or not all(k in p for k in ("algorithm", "env", "K", "seed")):
            continue
        statuses[r.info.status] += 1
        if r.info.status != "FINISHED" and not include_unfinished:
            continue
        key = (p["algorithm"], p["env"], p["K"], p["seed"], *((a, p.get(a)) for a in run_axes(p)))
        if key in kept:
            duplicates += 1
            if r.info.start_time <= kept[key].info.start_time:
                continue
        kept[key] = r
    left_out = {s: n for s, n in statuses.items() if s != "FINISHED"}
    if left_out and not include_unfinished:
        notes.append(
            "left out runs that did not finish: "
            + ", ".join(f"{n} {s}" for s, n in sorted(left_out.items()))
            + " (an interrupted sweep: rerun `vaco sweep` to finish them)"
        )
    if duplicates:
        notes.append(f"{duplicates} run(s) repeated the coordinates of another; the newest of each was kept")
    runs = []
    for r in kept.values():
        if known is not None and r.info.run_id in known:
            runs.append(known[r.info.run_id])
            continue
        p = r.data.params
        histories = {}
        score_metric = p.get(SCORE_PARAM, "eval/return")
        for key in _keys(score_metric):
            hist = one_per_step(client.get_metric_history(r.info.run_id, key))
            if hist:
                steps, values = np.array(hist, dtype=np.float64).T
                histories[key] = (steps, values)
        runs.append(
            Run(
                run_id=r.info.run_id,
                name=r.info.run_name or r.info.run_id,
                status=r.info.status,
                algorithm=p["algorithm"],
                env=p["env"],
                K=int(p["K"]),
                seed=int(p["seed"]),
                axes={a: _number(p.get(a)) for a in run_axes(p)},
                realign=p.get(REALIGNED_PARAM) == "True",
                objective=p.get("objective", ""),
                histories=histories,
                start_time=r.info.start_time or 0,
                fraction_metric=_fraction_metric(p),
                score_metric=score_metric,
                variant_of=_name(p.get(VARIANT_PARAM)),
            )
        )
        if known is not None and r.info.status == "FINISHED":
            known[r.info.run_id] = runs[-1]
    return runs, notes


def _name(value) -> str | None:
    """A logged name, or None for a missing, empty or ``None`` one (MLflow logs None as ``"None"``)."""
    return (
        None
        if value is None or (isinstance(value, float) and np.isnan(value)) or str(value) in ("", "None")
        else str(value)
    )


# ---------------------------------------------------------------------------------------- data file
def one_per_step(history) -> list[tuple[int, float]]:
    """``(step, value)`` pairs of an MLflow metric history, one per step: the value logged last.

    A run resumed after a SIGKILL redoes the iterations after its last checkpoint and logs their
    steps again; the later value is the one the continuing run built on.
    """
    latest: dict[int, tuple[int, float]] = {}
    for order, m in enumerate(history):
        key = (m.timestamp, order)
        if m.step not in latest or key >= latest[m.step][0]:
            latest[m.step] = (key, m.value)
    return sorted((step, value) for step, (_, value) in latest.items())


def runs_to_frame(runs: list[Run]):
    """One row per logged metric value, with the run's coordinates (a long pandas DataFrame)."""
    import pandas as pd

    rows = []
    for r in runs:
        coords = (
            r.run_id,
            r.name,
            r.status,
            r.start_time,
            r.algorithm,
            r.env,
            r.K,
            r.seed,
            r.realign,
            r.objective,
            r.fraction_metric,
            r.score_metric,
            json.dumps(r.axes, sort_keys=True),
            r.variant_of or "",
        )
        for key in _keys(r.score_metric):
            for step, value in zip(*r.history(key)):
                rows.append((*coords, key, float(step), float(value)))
        if not any(len(r.history(k)[0]) for k in _keys(r.score_metric)):  # a run without metrics keeps its row
            rows.append((*coords, "", np.nan, np.nan))
    return pd.DataFrame(rows, columns=list(_COLUMNS))


def runs_from_frame(frame) -> list[Run]:
    """The runs of a frame made by :func:`runs_to_frame` (or read from a data file)."""
    missing = [c for c in _COLUMNS if c not in frame.columns and c not in _OPTIONAL]
    if missing:
        raise ValueError(
            f"`--data`: the file has no column {', '.join(missing)} (a `vaco report --save-data` file has)"
        )
    runs = []
    for run_id, rows in frame.groupby("run_id", sort=False):
        first = rows.iloc[0]
        histories = {}
        for key, part in rows[rows["metric"].isin(_keys(str(first["score_metric"])))].groupby("metric", sort=False):
            part = part.drop_duplicates("step", keep="last").sort_values("step", kind="stable")
            histories[key] = (part["step"].to_numpy(np.float64), part["value"].to_numpy(np.float64))
        runs.append(
            Run(
                run_id=str(run_id),
                name=str(first["name"]),
                status=str(first["status"]),
                algorithm=str(first["algorithm"]),
                env=str(first["env"]),
                K=int(first["K"]),
                seed=int(first["seed"]),
                axes=json.loads(first["axes"]),
                realign=bool(first["realign"]),
                objective=str(first["objective"]) if isinstance(first["objective"], str) else "",
                histories=histories,
                start_time=int(first["start_time"]),
                fraction_metric=str(first["fraction_metric"]),
                score_metric=str(first["score_metric"]),
                variant_of=_name(first.get("variant_of")),  # files saved before the column have none
            )
        )
    return runs


def save_runs(runs: list[Run], path: str | os.PathLike) -> Path:
    """Write the runs as a data file (CSV; gzipped when the name ends in .gz, compressed as pandas infers
    from other endings), atomically: a reader, or the next block of a sweep continued from the file,
    sees the old file or the new one, never a part. Gzip's header carries no time, so the same runs
    give the same bytes (a committed data file changes only where its runs do)."""
    from pandas.io.common import infer_compression

    method = infer_compression(str(path), "infer")
    compression = None if method is None else {"method": method, **({"mtime": 0} if method == "gzip" else {})}
    buffer = io.BytesIO()
    runs_to_frame(runs).to_csv(buffer, index=False, compression=compression)
    return write_bytes_atomic(path, buffer.getvalue())


#: the most a data file may hold, uncompressed (an export of 2,000 runs is ~110 MB): a gzip bomb
#: (a few MB that decompress to GBs) is refused before pandas builds it in memory
DATA_LIMIT = 2 * 1024**3


def _uncompressed_size(path: Path, limit: int) -> int:
    """Bytes ``path`` decompresses to, counted in chunks up to ``limit`` + 1 (nothing is kept)."""

    total = 0
    with gzip.open(path, "rb") as f:
        while total <= limit:
            chunk = f.read(16 * 1024 * 1024)
            if not chunk:
                break
            total += len(chunk)
    return total


def read_runs(path: str | os.PathLike) -> list[Run]:
    """The runs of a data file written by :func:`save_runs`; a gzipped file that would decompress
    to more than :data:`DATA_LIMIT` bytes is refused in one line before it is read."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"`--data`: no file at {path}")
    if path.name.endswith(".gz") and _uncompressed_size(path, DATA_LIMIT) > DATA_LIMIT:
        raise ValueError(
            f"`--data`: {path} decompresses to more than {DATA_LIMIT / 1024**3:g} GiB ({path.stat().st_size:,} bytes "
            "compressed): not an export of `vaco report --save-data` (2,000 runs are ~110 MB); refused before reading"
        )
    frame = pd.read_csv(
        path, float_precision="round_trip", dtype={"run_id": str, "name": str, "axes": str, "variant_of": str}
    )
    return runs_from_frame(frame)


# ---------------------------------------------------------------------------------------- logging
def log_report(experiment: str, out: str | os.PathLike, uri: str | None = None) -> str:
    """Log the folder as artifacts ``report/`` of the sweep's parent run, beside the runs it
    summarises; an experiment without one (runs made by hand) gets a ``report`` run, made once."""
    import mlflow

    client = mlflow.MlflowClient(uri or tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    parent = client.search_runs([exp.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1)
    if parent:
        run_id = parent[0].info.run_id
        status = parent[0].info.status
        client.log_artifacts(run_id, str(out), artifact_path="report")
        if status == "RUNNING":  # a sweep still running keeps its parent open
            return run_id
        client.set_terminated(run_id, status)
        return run_id
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{REPORT_TAG}` = 'true'", max_results=1)
    run_id = (
        found[0].info.run_id
        if found
        else client.create_run(exp.experiment_id, run_name="report", tags={REPORT_TAG: "true"}).info.run_id
    )
    client.log_artifacts(run_id, str(out), artifact_path="report")
    client.set_terminated(run_id, "FINISHED")
    return run_id


def read_data_files(paths: list[str]) -> tuple[list, list[str]]:
    """The runs of several data files; a run in more than one file (same run id) is kept once.

    Two different runs of one cell (algorithm, task, K, seed and sweep axes) are refused: a cell
    run twice and exported from two stores, or files of two studies (another budget or backend)
    whose coordinates coincide. Keeping both would pair the seed twice; keeping one would drop
    data without saying which."""
    runs, seen, notes = [], set(), []
    cells: dict[tuple, tuple[str, str]] = {}  # cell -> (run id, file)
    clashes: list[str] = []
    for path in paths:
        if not Path(path).is_file():
            raise ValueError(f"`--data`: no data file at {path}")
        from pandas.errors import EmptyDataError, ParserError

        try:
            found = read_runs(path)
        except (OSError, EOFError, UnicodeDecodeError, ParserError, EmptyDataError) as err:  # gzip's, pandas' own
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(
                f"`--data`: {path} is not a data file `vaco report --save-data` writes (a gzipped CSV of metric "
                f"histories): {reason[:160]}"
            ) from None
        new = [r for r in found if r.run_id not in seen]
        for r in new:
            cell = cell_of(r)
            if cell in cells and cells[cell][0] != r.run_id:
                clashes.append(f"{r.algorithm} {r.env} K={r.K} seed {r.seed} ({cells[cell][1]} and {path})")
            cells.setdefault(cell, (r.run_id, str(path)))
        seen.update(r.run_id for r in new)
        runs += new
    if clashes:
        more = f" and {len(clashes) - 1} more" if len(clashes) > 1 else ""
        raise ValueError(
            f"`--data`: two different runs of one cell: {clashes[0]}{more}; a cell run twice, or files of "
            "different studies (another budget or backend): report them apart, or keep one run per cell"
        )
    if len(paths) > 1:
        notes.append(f"{len(runs)} runs read from {len(paths)} data files: {', '.join(map(str, paths))}")
    return runs, notes


def cell_of(run) -> tuple:
    """A run's cell: algorithm, task, K, seed and sweep axes."""
    return (run.algorithm, run.env, run.K, run.seed, tuple(sorted(run.axes.items())))


def with_store_runs(store: list, data: list, notes: list[str]) -> tuple[list, list[str]]:
    """A store's runs and data files' runs together: a run in both (same id) once; one cell with a
    run in each is refused, as two data files' are (:func:`read_data_files`)."""
    ids = {r.run_id for r in store}
    cells = {cell_of(r) for r in store}
    clashes = [
        f"{r.algorithm} {r.env} K={r.K} seed {r.seed}" for r in data if r.run_id not in ids and cell_of(r) in cells
    ]
    if clashes:
        raise ValueError(
            f"`--data`: {len(clashes)} cells have a run in the store and another in the data files "
            f"({'; '.join(clashes[:3])}{'; ...' if len(clashes) > 3 else ''}): a cell counts once; export one of them"
        )
    extra = [r for r in data if r.run_id not in ids]
    return store + extra, [*notes, f"{len(store)} runs from the store and {len(extra)} from the data files"]
