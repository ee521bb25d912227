"""The throughput benchmark runs end to end at a tiny size (it measures nothing here: CI times nothing)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.runs import REPO


@pytest.mark.slow
def test_benchmark_runs_at_a_tiny_size(tmp_path):
    out = tmp_path / "throughput.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "throughput.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    for key in (
        "ceiling/Hopper-v5/2",
        "collect/Hopper-v5/2/K16",
        "update/1x64/impala",
        "e2e/1x64/cleanrl",
        "memory/paper_batch_peak_rss_mib",
    ):
        assert results[key] > 0, key
    assert len(results["targets"]) >= 9
    assert "targets (ratios from this run)" in done.stdout
