"""Run metadata in one place: where runs are tracked (the MLflow tracking URI and a fast check
that the store is usable), the tag names vaco writes, and the paged run search its readers use.

Every vaco command resolves the store here (``MLFLOW_TRACKING_URI``, else a local SQLite file;
MLflow 3.14+ refuses the old file store). :func:`check_tracking_store` runs before any env or
MLflow run exists, so a dead server or a typo costs seconds, not MLflow's four minutes of
retries. Imports nothing heavy (``vaco --help`` imports it).
"""

from __future__ import annotations

import base64
import fcntl
import http.client
import os
import re
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlparse, urlunparse

__all__ = [
    "DEFAULT_TRACKING_URI",
    "TrackingStoreError",
    "tracking_uri",
    "absolute_tracking_uri",
    "artifact_location",
    "check_tracking_store",
    "prepare_sqlite_store",
    "search_all_runs",
    "CELL_TAG",
    "SETTINGS_TAG",
    "PARENT_TAG",
    "PARENT_RUN_ID_TAG",
    "REPORT_TAG",
    "PLAN_TAG",
    "EXPERIMENT_KIND_TAG",
    "EXPERIMENT_KIND",
    "AXES_PARAM",
    "FRACTION_PARAM",
    "SCORE_PARAM",
    "PAPER_AXES",
    "declared_axes",
    "run_axes",
    "redact_uri",
    "has_secrets",
]

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
ENV_VAR = "MLFLOW_TRACKING_URI"

# tags vaco writes (the sweep, the report and the logger read and write these names only)
CELL_TAG = "vaco.sweep.cell"  # the sweep cell id of a run
SETTINGS_TAG = "vaco.sweep.settings"  # a hash of the sweep's shared overrides
PARENT_TAG = "vaco.sweep.parent"  # "true" on a sweep's parent run
PARENT_RUN_ID_TAG = "mlflow.parentRunId"  # MLflow's own nesting: a cell's parent
REPORT_TAG = "vaco.report"  # "true" on the report run of an experiment without a sweep
# a sweep's study plan (JSON) on its parent run, with PLAN_TAG.digest, .declared (UTC), .commit (the
# sweep file's) and .judgement.NNN (each recorded reading of the plan, vaco.study.judge)
PLAN_TAG = "vaco.plan"
# MLflow 3's experiment kind: without it the UI opens an experiment on its GenAI pages
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
_DB_SCHEMES = ("postgresql", "mysql", "mssql")

# params vaco logs beside a run's coordinates (algorithm, env, K, seed, and each axis by name)
AXES_PARAM = "axes"  # the comma-separated names of the swept arguments the run's modules declare
FRACTION_PARAM = "fraction_metric"  # the metric that says how much the surrogate intervened
SCORE_PARAM = "score_metric"  # the metric a run is scored by (eval/return; the LLM track's eval/accuracy)
VARIANT_PARAM = "variant_of"  # the algorithm a run ablates or controls for (``model.variant_of``), or None
REALIGNED_PARAM = "realigned"  # True where the advantage module realigns (estimates pi_T's advantage)
PAPER_AXES = ("delta", "rho_bar")  # what a run logged before AXES_PARAM existed


def declared_axes(*modules) -> dict[str, object]:
    """Axis name -> value for the ``sweep_axes`` the given objective/advantage modules declare,
    in the modules' order (the objective's first)."""
    out: dict[str, object] = {}
    for module in modules:
        for axis in getattr(module, "sweep_axes", {}):
            out.setdefault(axis, getattr(module, axis, None))
    return out


def run_axes(params: dict[str, str]) -> tuple[str, ...]:
    """The axis names of a logged run (its ``axes`` param; the paper's two for older runs)."""
    raw = params.get(AXES_PARAM)
    if raw is None:
        return PAPER_AXES
    return tuple(a for a in raw.split(",") if a)


class TrackingStoreError(RuntimeError):
    """The tracking store cannot be used (the message names the setting and what to do)."""


_SECRET_QUERY_KEYS = ("password", "passwd", "pwd", "token", "secret", "key", "access_token", "api_key", "sslpassword")
REDACTED = "***"


def redact_uri(uri: str | None) -> str:
    """``uri`` with its user info and secret query values replaced by ``***``: what vaco prints,
    logs or writes wherever a tracking URI appears (``postgresql://vaco:pw@db/mlflow`` ->
    ``postgresql://***@db/mlflow``; ``https://token@host`` -> ``https://***@host``). The user name
    goes too: with a token as user info, the user name is the secret."""
    if not uri:
        return uri or ""
    try:
        parts = urlparse(uri)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    secret_query = any(k.lower() in _SECRET_QUERY_KEYS for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    if "@" not in netloc and not secret_query:
        return uri  # unchanged, character for character (urlunparse would rewrite sqlite:////abs paths)
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in _SECRET_QUERY_KEYS for k, _ in pairs):
            query = urlencode([(k, REDACTED if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs], safe="*")
    return urlunparse(parts._replace(netloc=netloc, query=query))


def has_secrets(uri: str | None) -> bool:
    """Whether ``uri`` carries user info or a secret query value."""
    return bool(uri) and redact_uri(uri) != uri


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a local SQLite store."""
    return os.environ.get(ENV_VAR) or DEFAULT_TRACKING_URI


def absolute_tracking_uri(uri: str | None = None) -> str:
    """The tracking URI with a relative SQLite path made absolute: processes started in other
    directories (sweep cells, launcher jobs) then write to the same store."""
    uri = uri or tracking_uri()
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


def artifact_location(uri: str | None, experiment: str) -> str | None:
    """Where a new experiment of a local SQLite store keeps its runs' artifacts (``config.yaml``,
    the checkpoints): ``mlruns/<experiment>`` beside the database file.

    MLflow's own default is ``./mlruns`` in whichever directory first created the experiment: a
    store opened from another directory (a sweep's store, a test's temporary one) then scatters
    its checkpoints into that directory, where they outlive the database or are lost without it.
    Beside the file, a store is one folder. ``None`` for other stores (a server, a database):
    they choose their own."""
    uri = absolute_tracking_uri(uri)
    prefix = "sqlite:///"
    path = uri[len(prefix) :] if uri.startswith(prefix) else ""
    if not path or path == ":memory:":
        return None
    folder = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip("._") or "experiment"
    return str(Path(path).parent / "mlruns" / folder)


def search_all_runs(client, experiment_ids: list[str], filter_string: str = "") -> list:
    """Every run matching ``filter_string`` (MLflow pages its search at 1,000 runs)."""
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _field(uri: str, field: str | None) -> str:
    if field:
        return field
    return ENV_VAR if os.environ.get(ENV_VAR) == uri else "trainer.logger.init_args.tracking_uri"


def check_tracking_store(uri: str, field: str | None = None, timeout: float = 5.0) -> None:
    """Raise :class:`TrackingStoreError` in at most ~``timeout`` s if ``uri`` cannot be used.

    Checks: a known scheme; for SQLite, that the file's directory exists and is writable and the
    file (if any) is a SQLite database; for an HTTP server, that it answers MLflow's ``/health`` and
    accepts the credentials (an authenticated API call);
    for a database URL, that a connection opens. A check writes nothing (a refused config leaves no
    store behind); the logger sets up a new SQLite store's tables (:func:`prepare_sqlite_store`).
    """
    name = _field(uri, field)
    shown = redact_uri(uri)
    scheme = urlparse(uri).scheme.split("+")[0]
    hint = f"set {ENV_VAR} to a reachable server (http://host:port) or a local store such as {DEFAULT_TRACKING_URI}"
    if scheme in ("", "file"):
        raise TrackingStoreError(f"`{name}`={shown!r}: MLflow 3.14+ refuses the file store; {hint}")
    if scheme == "sqlite":
        _check_sqlite(uri, name)
    elif scheme in ("http", "https"):
        _check_http(uri, name, timeout, hint)
    elif scheme in _DB_SCHEMES:
        _check_database(uri, name, timeout)
    elif scheme not in ("databricks", "databricks-uc", "uc"):
        raise TrackingStoreError(
            f"`{name}`={shown!r}: unknown scheme {scheme!r} (expected sqlite, http(s), postgresql, mysql "
            f"or databricks); {hint}"
        )


def _check_sqlite(uri: str, name: str) -> None:
    path = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else ""
    if not path or path == ":memory:":
        return
    file = Path(path)
    parent = file.parent if str(file.parent) else Path(".")
    if not parent.is_dir():
        raise TrackingStoreError(
            f"`{name}`={uri!r}: directory {parent} does not exist; create it or choose another path"
        )
    if not os.access(parent, os.W_OK | os.X_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise TrackingStoreError(f"`{name}`={uri!r}: {file} is not writable; choose a path you can write to")
    if file.exists() and file.stat().st_size > 0:
        with open(file, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise TrackingStoreError(f"`{name}`={uri!r}: {file} exists and is not a SQLite database")
        try:
            sqlite3.connect(f"file:{file}?mode=ro", uri=True, timeout=5).close()
        except sqlite3.Error as err:
            raise TrackingStoreError(f"`{name}`={uri!r}: cannot open {file}: {err}") from None
        _check_sqlite_lock(file, uri, name)


def _has_schema(file: Path) -> bool:
    """Whether MLflow has set up its tables in ``file`` (its migrations table holds a revision)."""
    if not file.exists() or file.stat().st_size == 0:
        return False
    try:
        with sqlite3.connect(f"file:{file}?mode=ro", uri=True, timeout=SQLITE_LOCK_WAIT) as db:
            return db.execute("SELECT count(*) FROM alembic_version").fetchone()[0] == 1
    except sqlite3.Error:
        return False


def prepare_sqlite_store(uri: str) -> None:
    """Set up a new SQLite store's tables once, however many vaco commands open it at the same moment
    (``vaco fit``'s logger calls it before its first use of the store; a no-op for other stores):
    MLflow's set-up (its Alembic migrations) run by two processes at once fails in both (4 of 4 failed
    here). The first to take an exclusive ``flock`` on the store's folder runs it (through MLflow's own
    client, as any first use would); the others wait, then find the tables there. The lock is on the
    folder, not on the database file, whose POSIX locks are SQLite's own."""
    path = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else ""
    if not path or path == ":memory:":
        return
    file = Path(path)
    if _has_schema(file):
        return
    folder = os.open(file.parent if str(file.parent) else ".", os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        if not _has_schema(file):
            import mlflow

            mlflow.MlflowClient(uri).search_experiments(max_results=1)
    finally:
        os.close(folder)  # releases the lock


#: seconds a run waits at its start for another writer's lock on a SQLite store (the writes of a
#: sweep's runs sharing one store take milliseconds; a lock held this long is held on purpose or by a hung program)
SQLITE_LOCK_WAIT = 10.0


def _check_sqlite_lock(file: Path, uri: str, name: str) -> None:
    """Whether a write could start: another process holding the store's write lock (an open
    ``sqlite3`` shell in a transaction, a hung writer) made MLflow fail deep inside the config."""
    try:
        db = sqlite3.connect(str(file), timeout=SQLITE_LOCK_WAIT, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
        finally:
            db.close()
    except sqlite3.OperationalError as err:
        if "locked" not in str(err):
            raise TrackingStoreError(f"`{name}`={uri!r}: cannot write {file}: {err}") from None
        raise TrackingStoreError(
            f"`{name}`={uri!r}: {file} is locked by another process (waited {SQLITE_LOCK_WAIT:.0f} s for its write "
            "lock): close the program holding it (a sqlite3 shell in a transaction, a hung run), or give runs that "
            "write at once a server store (docs/mlflow.md)"
        ) from None


def _http_auth_header(parts) -> dict[str, str]:
    """The Authorization header MLflow's client would send: the URI's user info as basic auth, else
    ``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``, else ``MLFLOW_TRACKING_TOKEN`` as a bearer token."""

    if parts.username is not None or parts.password is not None:
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
    else:
        user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user is not None or password is not None:
        return {"Authorization": "Basic " + base64.b64encode(f"{user or ''}:{password or ''}".encode()).decode()}
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": "Bearer " + os.environ["MLFLOW_TRACKING_TOKEN"]}
    return {}


#: an API call every MLflow server answers and an authenticating one checks (``/health`` is left open
#: by MLflow's basic-auth app, so it cannot tell a wrong password from a right one)
_AUTHENTICATED_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"


def _check_http(uri: str, name: str, timeout: float, hint: str) -> None:
    """Two requests: ``/health`` (is a server there?) and one authenticated API call (are these
    credentials accepted?). MLflow's client sends a URI's user info as HTTP basic auth to the host
    after the ``@``; so do these (urllib would try to resolve ``user:password@host`` as a host)."""
    parts = urlparse(uri)
    request_headers = _http_auth_header(parts)
    in_uri = parts.username is not None or parts.password is not None
    if "@" in parts.netloc:
        parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
    base = urlunparse(parts).rstrip("/")
    uri = redact_uri(uri)
    for path in ("/health", _AUTHENTICATED_PROBE):
        try:
            request = urllib.request.Request(base + path, headers=request_headers)
            with urllib.request.urlopen(request, timeout=timeout):  # noqa: S310 - the user's own server
                continue
        except urllib.error.HTTPError as err:
            if err.code in (401, 403):
                where = (
                    "the user name and password in it were refused"
                    if in_uri
                    else "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
                    if not request_headers
                    else "the credentials in MLFLOW_TRACKING_USERNAME/_PASSWORD (or _TOKEN) were refused"
                )
                raise TrackingStoreError(
                    f"`{name}`={uri!r}: the server refused access (HTTP {err.code}); {where}"
                ) from None
            continue  # it answers: a proxy without /health, a server without this API, is still a server
        except http.client.HTTPException as err:  # something listens there, but it does not speak HTTP
            raise TrackingStoreError(
                f"`{name}`={uri!r}: no MLflow server answers there (the port answers, but not in HTTP: "
                f"{type(err).__name__}); is it another service's port? Start one (`mlflow server --host 127.0.0.1 "
                f"--port PORT --backend-store-uri ...`) or {hint}"
            ) from None
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise TrackingStoreError(
                f"`{name}`={uri!r}: no MLflow server answers there ({reason}); start one (`mlflow server "
                f"--host 127.0.0.1 --port PORT --backend-store-uri ...`) or {hint}"
            ) from None


def _check_database(uri: str, name: str, timeout: float) -> None:
    try:
        import sqlalchemy
    except ImportError:  # MLflow needs it for database stores; it will say so itself
        return
    connect_args = {"connect_timeout": int(timeout)} if uri.startswith(("postgresql", "mysql")) else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=connect_args)
        with engine.connect():
            pass
    except Exception as err:  # noqa: BLE001 - any driver's failure, reported in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TrackingStoreError(f"`{name}`: cannot connect to the tracking database ({first})") from None
