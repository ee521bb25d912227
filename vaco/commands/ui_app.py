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
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlencode

__all__ = ["QUERY", "TOKEN_ENV", "TRAINING_VIEW_SCRIPT", "TokenGate", "create_app"]

TOKEN_ENV = "VACO_UI_TOKEN"  # the server's credential, from `vaco ui` (environment only)
QUERY = "vaco_token"  # the address's query parameter that carries it once
DENIED = b"vaco ui: no access without its token: open the address `vaco ui` printed\n"

#: set in the page's <head> before MLflow's scripts run (the storage format of MLflow's useLocalStorage,
#: ``<key>_v<version>`` holding JSON), each only where the browser holds no value of its own: the
#: training view, and the Assistant panel counted as already opened once (it opens by itself on a
#: browser's first visit to a localhost UI, over the runs table)
TRAINING_VIEW_SCRIPT = (
    b"<script>try{var s=window.localStorage,d={'mlflow.workflowType_v1':'machine_learning',"
    b"'mlflow.assistant.fab.autoOpenedOnFirstLoad_v1':true};for(var k in d)if(s.getItem(k)===null)"
    b"s.setItem(k,JSON.stringify(d[k]))}catch(e){}</script>"
)


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
    """An ASGI app in front of MLflow's: a request without the token gets 401 (module docstring)."""

    def __init__(self, app, token: str, cookie: str):
        self.app, self.token, self.cookie = app, token, cookie

    def holds(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.token.encode())

    def allowed(self, path: str, headers: dict[bytes, bytes]) -> bool:
        if path == "/health":
            return True
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.startswith("Bearer ") and self.holds(auth[len("Bearer ") :]):
            return True
        try:
            jar = SimpleCookie(headers.get(b"cookie", b"").decode("latin-1"))
        except CookieError:
            return False
        return self.cookie in jar and self.holds(jar[self.cookie].value)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):  # lifespan: MLflow's start-up and shutdown
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [v for k, v in query if k == QUERY]
        if scope["type"] == "http" and given and self.holds(given[-1]):
            rest = urlencode([(k, v) for k, v in query if k != QUERY])
            location = scope.get("root_path", "") + scope["path"] + (f"?{rest}" if rest else "")
            cookie = f"{self.cookie}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,  # the browser keeps the address's #fragment across it
                    "headers": [
                        (b"location", location.encode()),
                        (b"set-cookie", cookie.encode()),
                        (b"cache-control", b"no-store"),
                    ],
                }
            )
            return await send({"type": "http.response.body", "body": b""})
        if self.allowed(scope["path"], headers):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"cache-control", b"no-store")],
            }
        )
        await send({"type": "http.response.body", "body": DENIED})


def _wsgi_gate(wsgi_app, gate: TokenGate):
    """The same gate for MLflow's Flask app under a WSGI server (gunicorn, waitress)."""

    def app(environ, start_response):
        headers = {
            k[5:].replace("_", "-").lower().encode(): v.encode("latin-1")
            for k, v in environ.items()
            if k.startswith("HTTP_")
        }
        query = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        given = [v for k, v in query if k == QUERY]
        path = environ.get("PATH_INFO", "")
        if given and gate.holds(given[-1]):
            rest = urlencode([(k, v) for k, v in query if k != QUERY])
            cookie = f"{gate.cookie}={gate.token}; HttpOnly; SameSite=Strict; Path=/"
            location = environ.get("SCRIPT_NAME", "") + path + (f"?{rest}" if rest else "")
            start_response(
                "303 See Other", [("Location", location), ("Set-Cookie", cookie), ("Cache-Control", "no-store")]
            )
            return [b""]
        if gate.allowed(path, headers):
            return wsgi_app(environ, start_response)
        start_response(
            "401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")]
        )
        return [DENIED]

    return app


def create_app():
    """MLflow's server app with :func:`_training_view` after each request (the FastAPI wrapper
    MLflow itself builds under uvicorn, its default server; the Flask app under the others), behind
    :class:`TokenGate` when ``VACO_UI_TOKEN`` is set (``vaco ui`` always sets it)."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app

    if _training_view not in app.after_request_funcs.get(None, []):
        app.after_request(_training_view)
    token = os.environ.get(TOKEN_ENV)
    port = os.environ.get("VACO_UI_PORT", "")
    gate = TokenGate(None, token, f"vaco_ui_{port}" if port else "vaco_ui") if token else None
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
