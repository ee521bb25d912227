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
