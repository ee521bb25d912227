"""notebooks/analysis.ipynb executes from top to bottom on the tiny sweep's experiment (nbclient)."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from helpers.tiny_sweep import REPO, full_sweep


@pytest.mark.slow
def test_the_analysis_notebook_runs_on_a_tiny_experiment(tmp_path_factory, tmp_path, monkeypatch):
    sweep = full_sweep(tmp_path_factory)
    assert sweep.full_rc == 0, sweep.full_log
    out = tmp_path / "report"
    monkeypatch.setenv("VACO_EXPERIMENT", sweep.experiment)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sweep.uri)
    monkeypatch.setenv("VACO_REPORT_REPS", "100")
    monkeypatch.setenv("VACO_REPORT_OUT", str(out))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    text += "\n".join(o.get("data", {}).get("text/plain", "") for o in outputs if "data" in o)
    assert f"experiment '{sweep.experiment}'" in text
    assert "5 runs, tasks ['InvertedPendulum-v5']" in text
    assert "P(vaco > ppo_clip)" in text  # the custom comparison ran on the two main algorithms
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 10  # aggregates, IQM vs K, curves, returns, profiles, TV, fractions, 3 ablations, dots
    assert (out / "summary.md").is_file() and len(list(out.glob("*.png"))) == 10


@pytest.mark.slow
def test_the_notebook_runs_as_jupyter_starts_it_on_a_committed_data_file(tmp_path, monkeypatch):
    """Its own documented example: the kernel in notebooks/ (where Jupyter and `make notebook`
    start it), `VACO_DATA` relative to the repository root; no store is created anywhere."""
    monkeypatch.setenv("VACO_DATA", "docs/data/five_tasks.csv.gz")
    monkeypatch.delenv("VACO_EXPERIMENT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("VACO_REPORT_REPS", "50")
    monkeypatch.setenv("VACO_REPORT_OUT", str(tmp_path / "report"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    stray = REPO / "notebooks" / "mlflow.db"
    assert not stray.exists()
    nb = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"experiment 'five_tasks' from {REPO / 'docs/data/five_tasks.csv.gz'}" in text
    # section 3's robustness verdicts: the drop of each algorithm and the difference of drops, each decided
    assert "robustness to lag (final score), decided at margin 0.05" in text
    assert "vaco vs ppo_clip, K=4: difference of drops" in text and "-> undecided" in text
    assert (tmp_path / "report" / "summary.md").is_file()
    assert not stray.exists()


def test_make_notebook_after_the_demo_says_in_one_line_which_variable_to_set(tmp_path):
    """Right after `make demo` the store holds only `vaco-demo`: `make notebook`'s first step names
    the variables and the experiments there, one line, exit 2 (it was the notebook's 55-line traceback)."""
    import os
    import subprocess
    import sys

    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.MlflowClient(uri).create_experiment("vaco-demo", artifact_location=str(tmp_path / "mlruns"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VACO_")}
    script = [sys.executable, str(REPO / "scripts" / "notebook_inputs.py")]
    out = subprocess.run(script, env=dict(env, MLFLOW_TRACKING_URI=uri), capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert "no experiment 'vaco-laptop'" in line and "vaco-demo" in line and "VACO_EXPERIMENT" in line
    assert "VACO_DATA=docs/data/five_tasks.csv.gz make notebook" in line
    ok = subprocess.run(script, env=dict(env, MLFLOW_TRACKING_URI=uri, VACO_EXPERIMENT="vaco-demo"))
    assert ok.returncode == 0
    data = subprocess.run(script, env=dict(env, VACO_DATA="docs/data/five_tasks.csv.gz"))
    assert data.returncode == 0
