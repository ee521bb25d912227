"""``vaco ui``: the MLflow UI on the store ``vaco fit`` writes to, on 127.0.0.1, stopped by Ctrl-C.

    vaco ui                      # http://127.0.0.1:5000, store: MLFLOW_TRACKING_URI or sqlite:///mlflow.db
    vaco ui --port 5001 --store sqlite:///results/mlflow.db
    vaco ui --experiment vaco-laptop

Only the browser that opens the printed address gets in: the address carries a random token, made
anew at every start (the server sets it as a cookie and drops it from the address), and every
request without it gets 401, reads and writes alike, so no other account on a shared machine can
read, change or delete the store through the UI (the store's own files are protected by their
permissions, not by this). The address names the UI's own host, ``vaco-<random>.localhost`` (browsers
resolve ``*.localhost`` to this machine): the cookie is that host's alone, so no other server on
127.0.0.1 (another port, another account's) is ever sent it, and a request from any other origin (a
page another server serves, a file) is refused, reads and writes alike. A script reaches the same
server at ``http://127.0.0.1:<port>`` with ``MLFLOW_TRACKING_TOKEN=<token>``.
The token travels in clear over HTTP: to reach the UI from another machine, forward the port over
SSH rather than listen on ``--host 0.0.0.0``.

Every address of the UI (the root, an experiment's link, the home button) opens MLflow's
model-training view, where MLflow 3 opens a fresh browser on its GenAI pages: the server is
MLflow's own app with one script added to its page (:mod:`vaco.commands.ui_app`). It prints the address
of an experiment's runs table:
the experiment given, else the one with the most recent run. The table opens with the columns a
lag study is read by (algorithm, env, K, seed, eval/return, the lag and filter metrics), not
MLflow's defaults (Source, Models, Dataset): a view MLflow's UI loads from an experiment tag
(``mlflow.sharedViewState.vaco``, what its own "share view" writes), named in the address.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from vaco.commands.ui_app import HOST_ENV, QUERY, TOKEN_ENV
from vaco.commands.ui_view import runs_page
from vaco.tracking import (
    TrackingStoreError,
    absolute_tracking_uri,
    check_tracking_store,
    has_secrets,
    redact_uri,
)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaco ui", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--store", default=None, help="tracking store (default: MLFLOW_TRACKING_URI or sqlite:///mlflow.db)"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine; its other accounts need the printed token)",
    )
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the UI to answer")
    parser.add_argument(
        "--experiment",
        default=None,
        help="the experiment whose runs the printed address opens (default: the most recent)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if has_secrets(args.store):
        print(
            "vaco ui: error: `--store` carries user info or a secret (a password, a token), which every account on "
            "this machine reads in the process list: set MLFLOW_TRACKING_URI to it instead, or keep the password in "
            "~/.pgpass",
            file=sys.stderr,
        )
        return 2
    store = absolute_tracking_uri(args.store)
    if store.startswith(("http://", "https://")):
        print(f"vaco ui: the store is already a server: open {store}")
        return 0
    try:
        check_tracking_store(store, "--store" if args.store else None)
    except TrackingStoreError as err:
        print(f"vaco ui: error: {err}", file=sys.stderr)
        return 2
    if store.startswith("sqlite:///") and not Path(store[len("sqlite:///") :]).exists():
        print(f"vaco ui: error: `--store`: {store} has no runs yet (run `vaco fit` first)", file=sys.stderr)
        return 2
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    # the store goes in the server's environment (its own account's), never on its command line:
    # a PostgreSQL URI carries its password, and every account reads every process's command line
    command = [
        mlflow,
        "ui",
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--workers",
        "1",
        "--app-name",
        "vaco",  # MLflow's app with the training view as a fresh browser's default (vaco.commands.ui_app)
    ]
    token = secrets.token_urlsafe(24)  # in the server's environment (its own account's), never its command line
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", VACO_UI_PORT=str(args.port))
    env["MLFLOW_BACKEND_STORE_URI"] = store
    env[TOKEN_ENV] = token
    # the UI's own host name: browsers resolve *.localhost to loopback, and a cookie set there is sent
    # to no other server (127.0.0.1 at another port gets it: cookies ignore the port); requests from any
    # other origin are refused (vaco.commands.ui_app)
    host = ui_host(args.host, args.port)
    env[HOST_ENV] = host
    loopback = [f"127.0.0.1:{args.port}", f"localhost:{args.port}", f"[[]::1]:{args.port}"]  # health, clients
    env["MLFLOW_SERVER_ALLOWED_HOSTS"] = ",".join([host, *loopback])
    env["MLFLOW_SERVER_CORS_ALLOWED_ORIGINS"] = f"http://{host}"
    # MLflow's server imports a Starlette module Starlette deprecates: a warning on every start that
    # asks nothing of a vaco user (the user's own PYTHONWARNINGS stay, after this one)
    quiet = "ignore:starlette.middleware.wsgi is deprecated"
    env["PYTHONWARNINGS"] = ",".join(w for w in (quiet, os.environ.get("PYTHONWARNINGS", "")) if w)
    server = subprocess.Popen(command, env=env, start_new_session=True)  # its own group: stopped as one
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    try:
        deadline = time.monotonic() + args.timeout
        while stop["signal"] is None:
            if server.poll() is not None:
                print(
                    f"vaco ui: error: the MLflow UI exited (code {server.returncode}); is port {args.port} free?",
                    file=sys.stderr,
                )
                return 1
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    print(f"vaco ui: error: no answer from {url} in {args.timeout:.0f} s", file=sys.stderr)
                    return 1
                time.sleep(0.3)
        if stop["signal"] is None:
            page, name = runs_page(store, args.experiment)
            if args.experiment and name is None:
                print(
                    f"vaco ui: error: `--experiment`: no experiment named {args.experiment!r} in {redact_uri(store)}",
                    file=sys.stderr,
                )
                return 2
            where = f"the runs of '{name}'" if name else "no runs yet"
            print(
                f"vaco ui: http://{host}/?{QUERY}={token}{page}  ({where}; store {redact_uri(store)}; only this "
                f"address gets in; Ctrl-C stops it)",
                flush=True,
            )
        while stop["signal"] is None and server.poll() is None:
            time.sleep(0.2)
        return 0
    finally:
        _stop(server)


LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::")  # a browser on this machine reaches these


def ui_host(listen: str, port: int) -> str:
    """The host:port the printed address names: a random ``vaco-<hex>.localhost`` where the server
    listens on loopback (its own site: no other local server shares its cookie or origin), else the
    address it listens on."""
    if listen in LOOPBACK:
        return f"vaco-{secrets.token_hex(5)}.localhost:{port}"
    return f"[{listen}]:{port}" if ":" in listen else f"{listen}:{port}"


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:  # gunicorn/uvicorn workers share the group: nothing may outlive the UI
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.wait()


if __name__ == "__main__":
    sys.exit(main())
