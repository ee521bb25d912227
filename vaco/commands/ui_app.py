"""The MLflow server app ``vaco ui`` runs (``mlflow ui --app-name vaco``, MLflow's plugin point for
server apps): MLflow's own, with one change, so that every address lands on the model-training
view rather than MLflow 3's GenAI pages.

MLflow's UI keeps the view in the browser (``localStorage["mlflow.workflowType_v1"]``, GenAI
unless set; a ``?workflowType=`` in the address overrides it for that page). The root, the
experiment links and the home button carry no such parameter, so a fresh browser opens the GenAI
pages from each of them. The page MLflow serves for every UI address gets a one-line script that
sets the training view where the browser has no choice of its own (a user who switches to the
GenAI view keeps it). Experiments also carry ``mlflow.experimentKind`` (set by ``vaco fit`` and
``vaco ui``), which MLflow reads for the experiment's own tabs.

**Only the owner's browser gets in.** ``vaco ui`` puts a random token in the server's environment
(``VACO_UI_TOKEN``: a process's environment is readable by its own account only, its command line by
every account) and in the address it prints. Every request, to MLflow's Flask routes and to its
native FastAPI ones (artifact upload and download, traces, jobs) alike, needs the token: in the
address once (``?vaco_token=``; the answer sets an HttpOnly, SameSite=Strict cookie and redirects to
the same address without it, so it leaves the location bar and the history), in that cookie, or as
``Authorization: Bearer <token>`` (an MLflow client with ``MLFLOW_TRACKING_TOKEN``). Anything else
gets 401, before MLflow sees it; ``/health`` (the server's liveness, no data) stays open. Tokens are
compared in constant time.
"""

from __future__ import annotations

import hmac
import os
import time
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlencode

from vaco.commands.ui_view import runs_view

__all__ = ["HOST_ENV", "QUERY", "TOKEN_ENV", "TRAINING_VIEW_SCRIPT", "TokenGate", "create_app"]

TOKEN_ENV = "VACO_UI_TOKEN"  # the server's credential, from `vaco ui` (environment only)
QUERY = "vaco_token"  # the address's query parameter that carries it once
DENIED = b"vaco ui: no access without its token: open the address `vaco ui` printed\n"
CROSS_ORIGIN = b"vaco ui: refused: only the UI's own page (the address `vaco ui` printed) may call it\n"
HOST_ENV = "VACO_UI_HOST"  # the UI's own host:port, from `vaco ui`: its cookie and its origin
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

#: set in the page's <head> before MLflow's scripts run (the storage format of MLflow's useLocalStorage,
#: ``<key>_v<version>`` holding JSON), each only where the browser holds no value of its own: the
#: training view, and the Assistant panel counted as already opened once (it opens by itself on a
#: browser's first visit to a localhost UI, over the runs table)
#: and an experiment's runs page opened without vaco's view in its address (a link from the experiments
#: list, a bookmark) gets it, once per experiment and page load (so a view the user changes stays theirs)
TRAINING_VIEW_SCRIPT = (
    b"<script>try{var s=window.localStorage,d={'mlflow.workflowType_v1':'machine_learning',"
    b"'mlflow.assistant.fab.autoOpenedOnFirstLoad_v1':true};for(var k in d)if(s.getItem(k)===null)"
    b"s.setItem(k,JSON.stringify(d[k]))}catch(e){}</script>"
    b"<script>(function(){var done={};function f(){var m=location.hash.match("
    b"/^#\\/experiments\\/([^\\/?]+)(?:\\/runs)?\\/?(?:\\?(.*))?$/);"
    b"if(!m||done[m[1]]||/viewStateShareKey=/.test(location.hash))return;done[m[1]]=1;"
    b"var q=new URLSearchParams(m[2]||'');q.set('viewStateShareKey','vaco');"
    b"if(!q.has('workflowType'))q.set('workflowType','machine_learning');"
    b"var h='#/experiments/'+m[1]+'/runs?'+q.toString();"
    b"if(document.readyState==='loading')history.replaceState(null,'',h);else location.replace(h)}"
    b"f();window.addEventListener('hashchange',f)})()</script>"
)


_VIEWED: dict[str, float] = {}  # experiment id -> when the server last wrote its view
VIEW_EVERY = 20.0  # seconds: an experiment's view is rewritten at most this often (its runs may grow)


def _experiment_view():
    """Before MLflow answers the UI's request for an experiment, write vaco's runs-table view onto it
    (:func:`vaco.commands.ui_view.runs_view`: the run's coordinates, the fields that tell its runs apart, the
    lag metrics), so an experiment created after the server started, or grown since, opens with it too."""
    from flask import request

    if not request.path.endswith(("/mlflow/experiments/get", "/mlflow/experiments/get-by-name")):
        return None
    store = os.environ.get("MLFLOW_BACKEND_STORE_URI")
    if not store:
        return None
    try:
        import mlflow

        client = mlflow.MlflowClient(store)
        experiment_id = request.args.get("experiment_id")
        if experiment_id is None and request.args.get("experiment_name"):
            found = client.get_experiment_by_name(request.args["experiment_name"])
            experiment_id = None if found is None else found.experiment_id
        now = time.monotonic()
        if experiment_id is None or now - _VIEWED.get(experiment_id, -VIEW_EVERY) < VIEW_EVERY:
            return None
        _VIEWED[experiment_id] = now
        runs_view(client, experiment_id)
    except Exception:  # noqa: BLE001 - the view is a convenience: MLflow answers the request either way
        pass
    return None


def _training_view(response):
    from flask import request

    if request.endpoint != "serve" or response.status_code != 200 or response.mimetype != "text/html":
        return response
    response.direct_passthrough = False  # a file response: read it to change it
    page = response.get_data()
    if TRAINING_VIEW_SCRIPT not in page:
        page = page.replace(b"<head>", b"<head>" + TRAINING_VIEW_SCRIPT, 1)
    response.set_data(page)
    response.headers.pop("ETag", None)  # the page differs from the file its tag names
    response.headers["Cache-Control"] = "no-cache"
    return response


class TokenGate:
    """An ASGI app in front of MLflow's: a request without the token, from another origin, or (in a
    browser) to another host than the UI's own gets refused before MLflow sees it (module docstring)."""

    def __init__(self, app, token: str, cookie: str, host: str | None = None):
        self.app, self.token, self.cookie, self.host = app, token, cookie, host

    @property
    def origin(self) -> str | None:
        return None if self.host is None else f"http://{self.host}"

    def holds(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.token.encode())

    def allowed(self, path: str, headers: dict[bytes, bytes]) -> bool:
        """Whether the request carries the token: as a Bearer header (a client, any host), or as the
        cookie the UI's own host set (a browser)."""
        if path == "/health":
            return True
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.startswith("Bearer ") and self.holds(auth[len("Bearer ") :]):
            return True
        if self.host is not None and headers.get(b"host", b"").decode("latin-1") != self.host:
            return False  # the cookie counts only on the UI's own host (another host never set it)
        try:
            jar = SimpleCookie(headers.get(b"cookie", b"").decode("latin-1"))
        except CookieError:
            return False
        return self.cookie in jar and self.holds(jar[self.cookie].value)

    def decide(self, method: str, path: str, query: str, headers: dict[bytes, bytes]):
        """None to pass the request on, else the answer: (status, [(header, value)], body)."""
        pairs = parse_qsl(query, keep_blank_values=True)
        given = [v for k, v in pairs if k == QUERY]
        origin = headers.get(b"origin")
        if origin is not None and path != "/health" and self.origin is not None:
            if origin.decode("latin-1") != self.origin:  # another page, another port, a file: refused
                return 403, [("content-type", "text/plain; charset=utf-8")], CROSS_ORIGIN
        if given and self.holds(given[-1]):
            host = headers.get(b"host", b"").decode("latin-1")
            if self.host is not None and host != self.host:  # the UI's own host sets the cookie
                return 303, [("location", f"http://{self.host}{path}?{query}"), ("cache-control", "no-store")], b""
            rest = urlencode([(k, v) for k, v in pairs if k != QUERY])
            cookie = f"{self.cookie}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            location = path + (f"?{rest}" if rest else "")
            # 303: the browser keeps the address's #fragment across it
            return 303, [("location", location), ("set-cookie", cookie), ("cache-control", "no-store")], b""
        if not self.allowed(path, headers):
            return 401, [("content-type", "text/plain; charset=utf-8"), ("cache-control", "no-store")], DENIED
        bearer = headers.get(b"authorization", b"").startswith(b"Bearer ")
        if method not in SAFE_METHODS and not bearer and origin is None and self.origin is not None:
            # a browser's write always names its origin; one that does not is not the UI's page
            return 403, [("content-type", "text/plain; charset=utf-8")], CROSS_ORIGIN
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):  # lifespan: MLflow's start-up and shutdown
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        method = scope.get("method", "GET")
        answer = self.decide(method, scope["path"], scope.get("query_string", b"").decode("latin-1"), headers)
        if answer is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        status, head, body = answer
        root = scope.get("root_path", "")
        head = [(k, root + v if k == "location" and v.startswith("/") else v) for k, v in head]
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in head],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _wsgi_gate(wsgi_app, gate: TokenGate):
    """The same gate for MLflow's Flask app under a WSGI server (gunicorn, waitress)."""
    reasons = {303: "303 See Other", 401: "401 Unauthorized", 403: "403 Forbidden"}

    def app(environ, start_response):
        headers = {
            k[5:].replace("_", "-").lower().encode(): v.encode("latin-1")
            for k, v in environ.items()
            if k.startswith("HTTP_")
        }
        path = environ.get("PATH_INFO", "")
        answer = gate.decide(environ.get("REQUEST_METHOD", "GET"), path, environ.get("QUERY_STRING", ""), headers)
        if answer is None:
            return wsgi_app(environ, start_response)
        status, head, body = answer
        root = environ.get("SCRIPT_NAME", "")
        head = [(k, root + v if k == "location" and v.startswith("/") else v) for k, v in head]
        start_response(reasons[status], head)
        return [body]

    return app


def create_app():
    """MLflow's server app with :func:`_training_view` after each request (the FastAPI wrapper
    MLflow itself builds under uvicorn, its default server; the Flask app under the others), behind
    :class:`TokenGate` when ``VACO_UI_TOKEN`` is set (``vaco ui`` always sets it)."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app

    if _training_view not in app.after_request_funcs.get(None, []):
        app.after_request(_training_view)
    if _experiment_view not in app.before_request_funcs.get(None, []):
        app.before_request(_experiment_view)
    token = os.environ.get(TOKEN_ENV)
    port = os.environ.get("VACO_UI_PORT", "")
    host = os.environ.get(HOST_ENV) or None
    gate = TokenGate(None, token, f"vaco_ui_{port}" if port else "vaco_ui", host) if token else None
    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        served = create_fastapi_app(app)
        if gate is not None:
            gate.app = served
            return gate
        return served
    if gate is not None and not getattr(app.wsgi_app, "vaco_gate", False):
        app.wsgi_app = _wsgi_gate(app.wsgi_app, gate)
        app.wsgi_app.vaco_gate = True
    return app
