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
"""

from __future__ import annotations

__all__ = ["TRAINING_VIEW_SCRIPT", "create_app"]

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


def create_app():
    """MLflow's server app with :func:`_training_view` after each request (the FastAPI wrapper
    MLflow itself builds under uvicorn, its default server; the Flask app under the others)."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app

    if _training_view not in app.after_request_funcs.get(None, []):
        app.after_request(_training_view)
    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
