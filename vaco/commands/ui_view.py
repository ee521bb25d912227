"""vaco's runs-table view of an experiment in MLflow's UI (an experiment tag MLflow's own "share view"
writes): the run's coordinates, the fields that tell its runs apart, the lag metrics, in that order.
``vaco ui`` writes it for the experiment it opens; its server (:mod:`vaco.commands.ui_app`) for every
experiment the UI asks for."""

from __future__ import annotations

import json

from vaco.tracking import AXES_PARAM, PARENT_TAG

__all__ = ["VIEW_COLUMNS", "differing_params", "runs_page", "runs_view"]

TRAINING_VIEW = "workflowType=machine_learning"  # MLflow 3's model-training view (not its GenAI pages)
VIEW_KEY = "vaco"  # the share key of vaco's runs-table view (experiment tag mlflow.sharedViewState.vaco)
#: the runs table's columns, as MLflow's UI names them (``<type>.`<key>```); a column no run has stays empty
VIEW_COLUMNS = (
    *(f"params.`{p}`" for p in ("algorithm", "env", "K", "seed")),
    *(
        f"metrics.`{m}`"
        for m in (
            "eval/return",
            "eval/accuracy",
            "lag/forward_tv",
            "lag/backward_tv",
            "lag/policy_age_mean",
            "train/filter_fraction",
            "train/clip_fraction",
        )
    ),
    "attributes.`Duration`",
)


VIEW_RUNS = 2000  # runs a view's columns are chosen from (the newest)
PRIMARY_METRIC_TAG = "mlflow.experiment.primaryMetric.name"  # the chart MLflow's UI draws first
SCORE_METRICS = ("eval/return", "eval/accuracy")  # MuJoCo's, the LLM track's


MAX_EXTRA_COLUMNS = 12  # params beyond the run's coordinates a view shows (the ones that tell runs apart)
COORDINATES = ("algorithm", "env", "K", "seed")


def differing_params(runs) -> list[str]:
    """The params whose values differ between ``runs`` (one absent from some runs differs too), the
    swept axes first (the runs' ``axes`` param), then top-level fields, then nested ones
    (``objective.delta``); a field that splits the runs exactly as a field already shown does (``env_id``
    beside ``env``, ``objective.delta`` beside ``delta``) is left out; at most :data:`MAX_EXTRA_COLUMNS`."""

    def split(key: str) -> tuple[int, ...]:  # the partition of the runs a field's values make
        first: dict = {}
        return tuple(first.setdefault(r.data.params.get(key), len(first)) for r in runs)

    keys = {k for r in runs for k in r.data.params}
    axes = sorted({a for r in runs for a in r.data.params.get(AXES_PARAM, "").split(",") if a} & keys)
    ordered = [*axes, *sorted(k for k in keys if "." not in k), *sorted(k for k in keys if "." in k)]
    seen = {split(k) for k in COORDINATES}
    out = []
    for key in dict.fromkeys(ordered):
        parts = split(key)
        if key in COORDINATES or key == AXES_PARAM or len(set(parts)) < 2 or parts in seen:
            continue
        seen.add(parts)
        out.append(key)
        if len(out) == MAX_EXTRA_COLUMNS:
            break
    return out


def runs_view(client, experiment_id: str) -> str | None:
    """Write vaco's runs-table view onto the experiment (MLflow's shared-view tag) and return the
    address's query part that opens it; ``None`` where the store refuses the tag (read-only).

    A sweep's experiment (one with a parent run) is listed by algorithm rather than by start time:
    MLflow's UI folds the cells under their collapsed parent row when it orders by start time, and
    lists every run when it orders by anything else (the fold cannot be opened by a shared view).
    The score metric is the experiment's primary metric, so the chart view draws its curves first,
    against the step (env steps for MuJoCo), unless the experiment names one of its own."""

    sweep = bool(client.search_runs([experiment_id], filter_string=f"tags.`{PARENT_TAG}` = 'true'", max_results=1))
    runs = [r for r in client.search_runs([experiment_id], max_results=VIEW_RUNS) if r.data.params]
    extra = [f"params.`{k}`" for k in differing_params(runs)]
    columns = [*VIEW_COLUMNS[: len(COORDINATES)], *extra, *VIEW_COLUMNS[len(COORDINATES) :]]
    state = {
        "selectedColumns": columns,
        # the run's coordinates first, beside its name (MLflow's own order puts every metric before
        # them, off a laptop's screen), then what else tells the runs apart (delta, rho_bar, ...), and
        # the metrics wide enough for a value like 8.748329e-08
        "columnOrder": columns,
        "columnWidths": {column: 130 for column in columns if column.startswith("metrics.")},
        "orderByKey": "params.`algorithm`" if sweep else "attributes.start_time",
        "orderByAsc": sweep,
        "runsHiddenMode": "FIRST_20_RUNS",  # the runs the chart view draws
    }
    try:
        client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}", json.dumps(state))
        if PRIMARY_METRIC_TAG not in client.get_experiment(experiment_id).tags:
            latest = client.search_runs([experiment_id], max_results=1, order_by=["attributes.start_time DESC"])
            metrics = latest[0].data.metrics if latest else {}
            score = next((m for m in SCORE_METRICS if m in metrics), SCORE_METRICS[0])
            client.set_experiment_tag(experiment_id, PRIMARY_METRIC_TAG, score)
    except Exception:  # noqa: BLE001 - any store error: the plain table is still there
        return None
    return f"viewStateShareKey={VIEW_KEY}"


def runs_page(store: str, experiment: str | None = None) -> tuple[str, str | None]:
    """The UI path of an experiment's runs table in the model-training view, and the experiment's
    name: the one given, else the one whose latest run started last (the UI's home without runs)."""
    import mlflow

    client = mlflow.MlflowClient(store)
    if experiment is not None:
        best = client.get_experiment_by_name(experiment)
        if best is None:
            return "", None
    else:
        best, best_time = None, -1
        for exp in client.search_experiments():
            runs = client.search_runs([exp.experiment_id], max_results=1, order_by=["attributes.start_time DESC"])
            if runs and runs[0].info.start_time > best_time:
                best, best_time = exp, runs[0].info.start_time
        if best is None:
            return f"#/experiments?{TRAINING_VIEW}", None
    view = runs_view(client, best.experiment_id)
    query = TRAINING_VIEW + (f"&{view}" if view else "")
    return f"#/experiments/{best.experiment_id}/runs?{query}", best.name
