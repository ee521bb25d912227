"""scripts/llm_projection.py: the paper's LLM grid multiplied out from measured figures. Its
arithmetic against sums written out here, from the real sweep file's sizes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.runs import REPO

SCRIPT = REPO / "scripts" / "llm_projection.py"
FIGURES = {
    "decode_tokens_per_second": 1000.0,
    "completion_tokens": 200.0,
    "update_seconds_per_step": 2.0,
    "rescore_seconds_per_step": 0.3,
    "tv_pass_seconds_per_step": 0.5,
    "eval_tokens_per_second": 2000.0,
    "eval_completion_tokens": 100.0,
    "checkpoint_gb": 6.0,
    "checkpoint_write_gb_per_second": 0.5,
    "startup_seconds": 60.0,
}


def _inputs(tmp_path, figures=FIGURES, source="a test's chosen number"):
    path = tmp_path / "figures.json"
    path.write_text(json.dumps({k: {"value": v, "source": source} for k, v in figures.items()}))
    return path


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=REPO)


def _expected_hours(n: int, algorithm: str) -> float:
    """One cell of configs/sweeps/llm_gsm8k.yaml (256 steps of 32 prompts x 8 completions, an
    evaluation every 32 steps and at the start, a checkpoint every 8 generation batches; every
    minibatch re-scored; micro-batches of 8 sequences, so VACO-GRPO's filter measures each
    minibatch's TV in a pass of its own), by hand."""
    generation = 256 * 32 * 8 * 200 / 1000
    update = 256 * 2.0 + 256 * 0.3 + (256 * 0.5 if algorithm == "vaco_grpo" else 0.0)
    batches = 256 // n
    evaluations = 1 + min(batches, 256 // 32)  # a batch of N <= 32 steps passes at most one multiple of 32
    evaluation = evaluations * 1319 * 100 / 2000
    checkpoints = -(-batches // 8) * 6.0 / 0.5
    return (generation + update + evaluation + checkpoints + 60.0) / 3600


def test_the_projection_multiplies_out_the_grid_from_its_sweep_file(tmp_path):
    out = _run("--inputs", _inputs(tmp_path), "--sweep", REPO / "configs/sweeps/llm_gsm8k.yaml")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("PROJECTED (not measured)")
    assert "a test's chosen number" in out.stdout  # every figure's source is printed
    total = 0.0
    for algorithm in ("grpo", "vaco_grpo"):
        for n in (1, 2, 4, 8, 16, 32):
            hours = _expected_hours(n, algorithm)
            assert f"{algorithm} N = {n:>2}: {hours:.2f} h a cell" in out.stdout, (n, hours, out.stdout)
            total += 3 * hours  # 3 seeds
    assert "tv pass" in out.stdout.split("vaco_grpo N =  1")[1].splitlines()[0]
    assert "tv pass" not in out.stdout.split("grpo N =  1")[1].splitlines()[0]
    assert f"the grid: {total:.1f} h ({total / 24:.2f} days) projected" in out.stdout


def test_a_figure_without_its_source_is_refused_in_one_line(tmp_path):
    out = _run("--inputs", _inputs(tmp_path, source=""))
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "--inputs: `decode_tokens_per_second` has no source: say which command, machine and date measured it"
    ]


@pytest.mark.parametrize("value", [0, -1, "fast"])
def test_a_figure_that_is_not_a_positive_number_is_refused(tmp_path, value):
    out = _run("--inputs", _inputs(tmp_path, figures={**FIGURES, "checkpoint_gb": value}))
    assert out.returncode != 0 and "`checkpoint_gb` must be" in out.stderr
