"""vaco's MLflow logger: Lightning's ``MLFlowLogger`` that never loses a metric and lets a budget grow.

Two things Lightning's logger does not do:

* **Outages.** Metrics are sent with one quick try each (no retries inside MLflow's client, a
  10 s timeout, unless ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``/``_TIMEOUT`` are set): MLflow's own
  retries would block training for minutes, silently, while a server restarts. A batch that fails
  is kept, a message says so, and the kept batches are retried with later ones, at most every
  5-60 s (doubling) so that a hanging server costs training little; another message says when
  the server answers again. A batch carries the time it was first logged, and every try sends that
  same time, so a batch the server took after the client gave up on the request is not doubled when
  it is sent again: MLflow's SQL stores keep one row per (key, time, step, value). A run that ends with metrics still unsent retries
  for ~30 s, then writes
  them to ``unsent-metrics-<run id>.jsonl`` in the working directory (else the system's temporary
  directory, else stderr itself) and says so. Training goes on. A batch the server refuses for
  good (an HTTP 4xx other than 408/429: it would be refused again) is set aside with the unsent
  ones at once instead of blocking every later metric.
* **Resume with a larger budget.** MLflow params are immutable, so the budget (``total_steps``)
  is not a param: it is the tag ``total_steps`` (the current budget) and the metric
  ``time/total_steps`` (its history, at the env step where it changed). Every other param that a
  resumed run logs again must have the value it had.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only

from vaco.lightning_private import flatten_params
from vaco.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, artifact_location, prepare_sqlite_store

__all__ = ["VacoMLFlowLogger", "GROWABLE_PARAMS"]

# hyperparameters that may change when a run is resumed, kept out of MLflow's immutable params
GROWABLE_PARAMS = ("total_steps", "num_steps")  # MuJoCo env steps; the LLM track's optimiser steps


def _internal(key: str) -> bool:
    """Params that say how the code is wired, not what a researcher compares by."""
    return key.startswith("_") or key.split("/")[0] in ("env_spec",)


class VacoMLFlowLogger(MLFlowLogger):
    """``lightning.pytorch.loggers.MLFlowLogger`` with buffered metrics and a growable budget.

    Takes exactly Lightning's arguments (``experiment_name``, ``run_name``, ``tracking_uri``,
    ``tags``, ``run_id``, ``log_model``, ...).
    """

    FINAL_RETRY_SECONDS = (1, 2, 4, 8, 15)
    #: seconds between tries while the server does not answer (doubling from the first to the last)
    RETRY_INTERVAL = (5.0, 60.0)
    #: MLflow's HTTP settings for a metric batch, where the user has not set them
    QUICK_TRY = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("prefix"):
            raise ValueError("`logger.prefix`: vaco's logger sends metrics under their own names; leave it empty")
        # a new SQLite store's tables once, whoever else opens it now (Lightning's client opens it below)
        prepare_sqlite_store(kwargs.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or "")
        if kwargs.get("tags"):
            # a REST store (an `mlflow server`) needs strings; a YAML config may have made '2' a 2
            kwargs["tags"] = {str(k): str(v) for k, v in kwargs["tags"].items()}
        super().__init__(*args, **kwargs)
        # (metrics, step, time in ms when first logged): every try of a batch sends the same rows
        self._unsent: list[tuple[dict[str, float], int | None, int]] = []
        self._rejected: list[tuple[dict[str, float], int | None, int]] = []  # refused for good (HTTP 4xx)
        self.last_error: str | None = None
        self._next_try = 0.0  # time.monotonic() before which a down server is not asked again
        self._interval = self.RETRY_INTERVAL[0]
        self.default_run_name: str | None = None  # from the run's coordinates, set by `vaco fit`
        self._prepared = False
        self._status_before: str | None = None  # a resumed run's status, restored if the resume is refused
        self._refused = False
        #: the status the run ends with whatever the trainer says ("failed": a population's member
        #: that stopped alone while the others went on)
        self.final_status: str | None = None
        #: where the batches MLflow never took were written (None: every batch reached the store)
        self.unsent_file: str | None = None

    # ------------------------------------------------------------------ the experiment and the run
    @property
    def refused(self) -> bool:
        """Whether this logger refused to resume its run (the run keeps the status it had)."""
        return self._refused

    @property
    def tracking_store(self) -> str:
        """The tracking store's URI this logger writes to."""
        return self._tracking_uri

    @property
    def experiment_name(self) -> str:
        """The MLflow experiment's name."""
        return self._experiment_name

    @property
    def run_name(self) -> str | None:
        """The run's name as given (None: from the run's coordinates when the run opens)."""
        return self._run_name

    def sibling(self, run_name: str, tags: dict, run_id: str | None = None) -> VacoMLFlowLogger:
        """A logger of another run in the same experiment and store, with this one's settings (a
        population member's, beside member 0's)."""
        return VacoMLFlowLogger(
            experiment_name=self._experiment_name,
            run_name=run_name,
            tracking_uri=self._tracking_uri,
            tags=tags,
            log_model=self._log_model,
            prefix=self._prefix,
            artifact_location=self._artifact_location,
            run_id=run_id,
        )

    @property
    def experiment(self):
        """Lightning's client; on first use, the experiment is marked as model training and a
        new run is named after its coordinates (made unique within the experiment)."""
        if not self._prepared and rank_zero_only.rank == 0:
            self._prepared = True
            self._prepare()
        return super().experiment

    def _prepare(self) -> None:
        import mlflow
        from mlflow.exceptions import MlflowException

        client = mlflow.MlflowClient(self._tracking_uri)
        found = client.get_experiment_by_name(self._experiment_name)
        if found is None:  # artifacts beside a SQLite store's file, not in this process's directory (tracking.py)
            where = self._artifact_location or artifact_location(self._tracking_uri, self._experiment_name)
            try:  # the kind with it, in one write: a run that finds it a moment later sees the kind too
                experiment_id = client.create_experiment(
                    self._experiment_name, artifact_location=where, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
                )
                tags = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
            except MlflowException:
                # runs started at once into a new store: another made it first, so use theirs
                found = client.get_experiment_by_name(self._experiment_name)
                if found is None:
                    raise
        if found is not None:
            experiment_id, tags = found.experiment_id, found.tags
        if EXPERIMENT_KIND_TAG not in tags:  # a kind the user chose stays
            try:
                client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            except MlflowException:  # another run tagged it at the same moment
                if EXPERIMENT_KIND_TAG not in client.get_experiment(experiment_id).tags:
                    raise
        if self._run_id is None and self._run_name is None and self.default_run_name:
            self._run_name = unique_run_name(client, experiment_id, self.default_run_name)
        if self._run_id is not None:  # a resume: the run is RUNNING again (Lightning leaves it FINISHED)
            self._status_before = client.get_run(self._run_id).info.status
            if self._status_before != "RUNNING":
                client.update_run(self._run_id, status="RUNNING")

    # ------------------------------------------------------------------ params
    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        params = flatten_params(params)
        budget = {k: v for k, v in params.items() if k.rsplit("/", 1)[-1] in GROWABLE_PARAMS}
        internal = {k: v for k, v in params.items() if _internal(k) and k not in budget}
        params = {k: v for k, v in params.items() if k not in budget and k not in internal}
        for key, value in internal.items():
            if not key.startswith("_") and value is not None:  # `_instantiator` and the like: dropped
                self.experiment.set_tag(self.run_id, "vaco." + key.replace("/", "."), str(value)[:5000])
        logged = self.experiment.get_run(self.run_id).data.params
        changed = [k for k, v in params.items() if k in logged and logged[k] != str(v)[:250]]
        if changed:
            key = changed[0]
            self._refused = True  # finalize puts the run's status back as it was
            raise ValueError(
                f"`{key}` cannot change when a run resumes (the run logged {logged[key]!r}, this config has "
                f"{str(params[key])!r}): start a new run instead"
            )
        super().log_hyperparams({k: v for k, v in params.items() if k not in logged})
        for key, value in budget.items():
            self.experiment.set_tag(self.run_id, key.rsplit("/", 1)[-1], str(value))

    # ------------------------------------------------------------------ metrics
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._unsent.append((dict(metrics), step, int(time.time() * 1000)))
        if time.monotonic() >= self._next_try:
            self._flush()

    def _send(self, metrics: dict[str, float], step: int | None, timestamp: int) -> None:
        """One quick try (:attr:`QUICK_TRY`; MLflow reads its HTTP settings from the environment at
        each request) of one batch, with the time it was first logged (Lightning's logger would
        stamp each try anew, and a resent batch would become a second copy)."""
        from mlflow.entities import Metric

        saved = {key: os.environ.get(key) for key in self.QUICK_TRY}
        for key, value in self.QUICK_TRY.items():
            if saved[key] is None:
                os.environ[key] = value
        try:
            rows = [
                Metric(key=re.sub("[^a-zA-Z0-9_/. -]+", "", k), value=float(v), timestamp=timestamp, step=step or 0)
                for k, v in metrics.items()
                if not isinstance(v, str)
            ]
            self.experiment.log_batch(run_id=self.run_id, metrics=rows)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)

    def _flush(self) -> bool:
        while self._unsent:
            metrics, step, timestamp = self._unsent[0]
            try:
                self._send(metrics, step, timestamp)
            except Exception as err:  # noqa: BLE001 - MlflowException, ConnectionError, ...
                if _refused_for_good(err):
                    self._rejected.append(self._unsent.pop(0))
                    print(
                        f"vaco: MLflow refused a metric batch at step {step} ({_store_error_line(err)}); "
                        "it is kept aside and written to the unsent-metrics file at the end",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                if self.last_error is None:
                    print(
                        f"vaco: could not send metrics to MLflow ({_store_error_line(err)}); "
                        "keeping them and retrying every few seconds; training goes on",
                        file=sys.stderr,
                        flush=True,
                    )
                self.last_error = str(err)
                self._next_try = time.monotonic() + self._interval
                self._interval = min(2 * self._interval, self.RETRY_INTERVAL[1])
                return False
            self._unsent.pop(0)
            if self.last_error is not None:
                print("vaco: MLflow is reachable again; the kept metrics were sent", file=sys.stderr, flush=True)
                self.last_error = None
                self._interval = self.RETRY_INTERVAL[0]
        return True

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        status = self.final_status or status
        if self._refused:  # a refused resume changed nothing: the run keeps the status it had
            if self._status_before is not None and self._status_before != "RUNNING":
                self.experiment.set_terminated(self.run_id, self._status_before)
            return
        for wait in self.FINAL_RETRY_SECONDS:  # the run is over: give a restarting server a moment
            if not self._unsent or self._flush():
                break
            time.sleep(wait)
        if self._unsent and not self._flush() or self._rejected:
            try:
                self._write_unsent(self._rejected + self._unsent)
            finally:
                self._unsent.clear()
                self._rejected.clear()
        try:
            super().finalize(status)
        except Exception as err:  # noqa: BLE001 - the run's data is on disk; say so, do not mask the run's own error
            print(
                f"vaco: could not mark the MLflow run {self.run_id} as ended: {_store_error_line(err)}",
                file=sys.stderr,
                flush=True,
            )

    def _write_unsent(self, batches: list[tuple[dict[str, float], int | None, int]]) -> None:
        """The batches MLflow never took, as JSON lines (with the time each was first logged, so a
        replay is not doubled either): in the working directory, else the temporary directory, else
        on stderr. Never raises: the run is then marked ended either way."""

        lines = [
            json.dumps({"step": step, "timestamp": timestamp, "metrics": metrics}) + "\n"
            for metrics, step, timestamp in batches
        ]
        name = f"unsent-metrics-{self.run_id}.jsonl"
        for folder in (os.getcwd(), tempfile.gettempdir()):
            path = os.path.join(os.path.abspath(folder), name)
            try:
                with open(path, "a") as f:
                    f.writelines(lines)
            except OSError:
                continue
            self.unsent_file = path
            print(
                f"vaco: {len(batches)} metric batches could not be sent to MLflow; they are in {path}",
                file=sys.stderr,
                flush=True,
            )
            return
        print(
            f"vaco: {len(batches)} metric batches could not be sent to MLflow and no file could be written; "
            "here they are:",
            file=sys.stderr,
            flush=True,
        )
        sys.stderr.writelines(lines)
        sys.stderr.flush()
        self.unsent_file = "<stderr>"

    def replay_unsent(self, until_step: int | None = None) -> int:
        """A resumed run's metrics that an earlier process could not send
        (``unsent-metrics-<run id>.jsonl`` in the working or temporary directory) go to the store
        first, into the same run: the batches up to ``until_step`` (the checkpoint's env step; later
        ones are logged again by the resumed training, so they are dropped, not doubled). A file sent
        whole is renamed ``*.replayed``; one the store still refuses stays for the next resume.
        Returns the batches sent."""

        if self._run_id is None:
            return 0
        sent = 0
        name = f"unsent-metrics-{self._run_id}.jsonl"
        for folder in dict.fromkeys((os.getcwd(), tempfile.gettempdir())):
            path = os.path.join(os.path.abspath(folder), name)
            if not os.path.isfile(path):
                continue
            with open(path) as f:
                batches = [json.loads(line) for line in f if line.strip()]
            now = int(time.time() * 1000)
            keep = [
                (dict(b["metrics"]), b["step"], int(b.get("timestamp", now)))
                for b in batches
                if b.get("step") is None or until_step is None or int(b["step"]) <= until_step
            ]
            self._unsent[:0] = keep
            if not self._flush():
                print(f"vaco: the store still refuses the metrics in {path}; they stay there", file=sys.stderr)
                return sent
            sent += len(keep)
            os.replace(path, path + ".replayed")
            dropped = len(batches) - len(keep)
            print(
                f"vaco: replayed {len(keep)} metric batches from {path} into run {self._run_id}"
                + (
                    f" ({dropped} past the checkpoint dropped: the resumed training logs them again)" if dropped else ""
                ),
                file=sys.stderr,
                flush=True,
            )
        return sent


def _store_error_line(err: Exception) -> str:
    """An error from the store in one line: the database's own message where MLflow wraps
    SQLAlchemy's (``(sqlite3.OperationalError) database or disk is full``), else its first line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for line in lines:
        found = re.search(r"\((?:sqlite3|psycopg2?|pymysql|MySQLdb)[\w.]*\) .+", line)
        if found:
            return _shorten(found.group(0))
    return _shorten(f"{type(err).__name__}: {lines[0] if lines else ''}")


def _shorten(line: str, limit: int = 200) -> str:
    """``line`` cut at a word boundary near ``limit`` characters, with an ellipsis where it was cut
    (a cut mid-word, ``url: /api/2.0/mlflo)``, read as the message itself)."""
    if len(line) <= limit:
        return line
    head = line[:limit]
    space = head.rfind(" ")
    return (head[:space] if space > limit // 2 else head).rstrip(" ,;:(") + " ..."


class _StoreTracebacksOff(logging.Filter):
    """MLflow's SQL store logs every failed write with its whole traceback (``mlflow.store.db.utils``,
    ~90 lines) and then raises the error, which vaco reports in one line per outage: the record is
    dropped, the error is not."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SQLAlchemy database error")


logging.getLogger("mlflow.store.db.utils").addFilter(_StoreTracebacksOff())


def _refused_for_good(err: Exception) -> bool:
    """An HTTP 4xx from the tracking server other than 408 (timeout) and 429 (too many requests):
    the same request would be refused again."""
    code = getattr(err, "get_http_status_code", None)
    try:
        status = int(code()) if callable(code) else None
    except (TypeError, ValueError):
        status = None
    if status is None:
        response = getattr(err, "response", None)
        status = getattr(response, "status_code", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)


def unique_run_name(client, experiment_id: str, base: str) -> str:
    """``base``, or ``base (2)``, ``base (3)``, ... : the first name no run of the experiment has."""
    escaped = base.replace("'", "\\'")
    taken = {
        r.info.run_name
        for r in client.search_runs(
            [experiment_id], filter_string=f"attributes.run_name LIKE '{escaped}%'", max_results=1000
        )
    }
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base} ({n})"
    return name
