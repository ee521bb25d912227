"""A real `mlflow server` process on a free 127.0.0.1 port, for the tests that need one."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

MLFLOW = str(Path(sys.executable).with_name("mlflow"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def closed_port():
    """A 127.0.0.1 port nothing answers on, for as long as the block runs: the socket is bound (so no
    other process, such as another test worker's server, can take the port) but never listens, so a
    connection to it is refused. A port from :func:`free_port` is only free when it is returned."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def start_server(
    backend_uri: str,
    port: int,
    cwd: Path,
    log_path: Path,
    timeout: float = 120,
    app_name: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start `mlflow server` (``app_name="basic-auth"``: behind MLflow's own basic-auth app) and wait
    (bounded) until /health answers."""
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", **(env or {}))  # no background job workers
    log = open(log_path, "a")
    server = subprocess.Popen(
        [
            MLFLOW,
            "server",
            "--backend-store-uri",
            backend_uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            *(["--app-name", app_name] if app_name else []),
        ],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + timeout
    while True:
        assert server.poll() is None, Path(log_path).read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        assert time.monotonic() < deadline, f"mlflow server did not start in {timeout} s"
        time.sleep(0.3)


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left; assert nothing remains."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    deadline = time.monotonic() + 30
    while group_alive(server.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(server.pid):
        os.killpg(server.pid, signal.SIGKILL)
    assert not group_alive(server.pid), "server processes left behind"


@contextlib.contextmanager
def mlflow_server(backend_uri: str, cwd: Path, log_path: Path, admin_password: str | None = None):
    """Yields the server's base URL. With ``admin_password``: behind MLflow's basic-auth app, whose
    user ``admin`` has that password (its user store a SQLite file in ``cwd``)."""
    port = free_port()
    auth = (
        {
            "app_name": "basic-auth",
            "env": {"MLFLOW_AUTH_ADMIN_PASSWORD": admin_password, "MLFLOW_FLASK_SERVER_SECRET_KEY": "vaco-tests"},
        }
        if admin_password
        else {}
    )
    server = start_server(backend_uri, port, cwd, log_path, **auth)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(server)


class LateAnswers:
    """An HTTP relay in front of a real `mlflow server` that forwards every request at once and, while
    armed, holds the server's answer to the next ``count`` requests whose path ends in ``suffix`` for
    ``hold`` seconds: the server has done the work, the client gives up waiting (a slow network, a
    stalled proxy). Used as ``with LateAnswers(upstream_port) as relay: ... relay.port``."""

    def __init__(self, upstream_port: int, suffix: str = "/runs/log-batch", hold: float = 15.0):
        import http.server
        import threading

        self.upstream, self.suffix, self.hold = upstream_port, suffix, hold
        self.armed, self.held = 0, 0
        self.lock = threading.Lock()
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _relay(self):
                import http.client

                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection("127.0.0.1", relay.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                with relay.lock:
                    late = relay.armed > 0 and self.path.split("?")[0].endswith(relay.suffix)
                    if late:
                        relay.armed -= 1
                        relay.held += 1
                if late:
                    time.sleep(relay.hold)
                try:
                    self.send_response(answer.status)
                    for k, v in answer.getheaders():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up: the work is done all the same
                    self.close_connection = True

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def arm(self, count: int = 1) -> None:
        with self.lock:
            self.armed += count

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
