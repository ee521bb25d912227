"""``vaco sweep`` with ``population: P``: a cell's seeds run P at a time as ``vaco fit --population``.

A real local sweep (subprocesses, SQLite MLflow store, InvertedPendulum, 2 iterations a cell): seed 1
runs first alone; then the whole grid (seeds 1-4, population 3) skips it, packs seeds 2 and 3 (the
rest of their chunk) into one population and runs seed 4 alone; every cell has exactly one FINISHED
run named and tagged as its solo run would be; a third run has nothing to do.
"""

from __future__ import annotations

import subprocess

import mlflow
import pytest
import yaml

from helpers.runs import CONFIGS, VACO
from vaco import sweep as S
from vaco.population.module import MEMBER_TAG, POPULATION_TAG
from vaco.tracking import CELL_TAG

SWEEP = {
    "experiment": "pop-sweep",
    "jobs": 1,
    "population": 3,
    "configs_dir": str(CONFIGS),
    "overrides": {
        "data.init_args.num_envs": 2,
        "data.init_args.num_steps": 64,
        "data.init_args.total_steps": 256,
        "data.init_args.eval_every": 2,
        "data.init_args.eval_episodes": 2,
        "data.init_args.eval_envs": 2,
        "model.init_args.update_epochs": 2,
        "model.init_args.num_minibatches": 2,
    },
    "defaults": {"env": "inverted_pendulum", "K": 2, "seed": [1, 2, 3, 4]},
    "grid": {"main": {"algorithm": "vaco"}},
}
CELLS = [f"vaco-inverted_pendulum-K2-s{s}" for s in (1, 2, 3, 4)]


def _sweep(path, out, *args):
    return subprocess.run(
        [VACO, "sweep", "--config", str(path), "--out", str(out), *args], capture_output=True, text=True
    )


@pytest.mark.slow
def test_a_sweep_packs_a_cells_seeds_into_populations_and_skips_finished_members(tmp_path, mlflow_uri):
    path, out = tmp_path / "pop.yaml", tmp_path / "out"
    path.write_text(yaml.safe_dump(SWEEP))
    dry = _sweep(path, out, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert (
        "population: 3 -> 3 of the 4 cells to run would run as 1 populations (e.g. vaco-inverted_pendulum-K2-s1+2+3); 2 processes in all"
        in dry.stdout
    )
    first = _sweep(path, out, "--only", CELLS[0])
    assert first.returncode == 0, first.stdout + first.stderr
    assert "populations" not in first.stdout  # one cell: nothing to pack
    whole = _sweep(path, out)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert f"skip   {CELLS[0]} (finished)" in whole.stdout
    assert "2 cells run as 1 populations" in whole.stdout
    assert "done   vaco-inverted_pendulum-K2-s2+3" in whole.stdout and f"done   {CELLS[3]}" in whole.stdout
    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("pop-sweep").experiment_id
    runs = [r for r in client.search_runs([experiment]) if CELL_TAG in r.data.tags]
    by_cell = {}
    for run in runs:
        by_cell.setdefault(run.data.tags[CELL_TAG], []).append(run)
    assert sorted(by_cell) == CELLS and all(len(v) == 1 for v in by_cell.values())
    for seed, cell in zip((1, 2, 3, 4), CELLS):
        (run,) = by_cell[cell]
        assert run.info.status == "FINISHED" and run.info.run_name == cell
        assert run.data.tags["vaco.seed"] == str(seed) and run.data.params["seed"] == str(seed)
        assert (POPULATION_TAG in run.data.tags) == (seed in (2, 3))
    members = [by_cell[c][0] for c in CELLS[1:3]]
    assert [r.data.tags[MEMBER_TAG] for r in members] == ["0", "1"]
    assert len({r.data.tags[POPULATION_TAG] for r in members}) == 1
    config = yaml.safe_load((out / "vaco-inverted_pendulum-K2-s2+3" / "config.yaml").read_text())
    assert config["population"] == [2, 3] and config["seed_everything"] == 2
    again = _sweep(path, out)
    assert again.returncode == 0 and "nothing to do: every cell has finished" in again.stdout
    sweep = S.load_sweep(path, str(out))
    assert set(S.plan(sweep, S.expand(sweep), mlflow_uri).values()) == {"finished"}


def test_a_bad_population_field_names_it(tmp_path, mlflow_uri):
    path = tmp_path / "pop.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "population": 0}))
    result = _sweep(path, tmp_path / "out", "--dry-run")
    assert result.returncode == 2 and "`population` must be an integer >= 1" in result.stderr


def test_a_population_that_cannot_fit_is_refused_by_the_dry_run(tmp_path, mlflow_uri):
    """A cell whose run fits alone but whose population (`population` of its seeds in one process)
    cannot: refused before anything starts, naming the fields (the dry run refuses what the run would)."""
    # alone: 1,000 x 31,250 transitions, >= 1 GB; 2,000 seeds a cell, packed 2,000 at a time: >= 2 TB
    overrides = {**SWEEP["overrides"], "data.init_args.num_envs": 1000, "data.init_args.num_steps": 31_250}
    overrides["data.init_args.total_steps"] = 31_250_000
    defaults = {**SWEEP["defaults"], "seed": list(range(1, 2001))}
    path = tmp_path / "pop.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "population": 2000, "overrides": overrides, "defaults": defaults}))
    result = _sweep(path, tmp_path / "out", "--dry-run")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    expected = "`population` x `data.num_envs` x `data.num_steps` (2,000 x 1,000 x 31,250) needs at least 2.0 TB"
    assert expected in result.stderr, result.stderr[-2000:]
    path.write_text(yaml.safe_dump({**SWEEP, "population": 1, "overrides": overrides, "defaults": defaults}))
    assert _sweep(path, tmp_path / "out", "--dry-run").returncode == 0  # alone, it fits


def test_packing_forms_the_same_chunks_on_a_rerun_packs_impala_and_leaves_checkpointed_cells_alone(tmp_path):
    path = tmp_path / "pop.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "population": 2, "grid": {"main": {"algorithm": ["vaco", "impala"]}}}))
    sweep = S.load_sweep(path, str(tmp_path / "out"))
    cells = S.expand(sweep)
    states = {cell.id: "new" for cell in cells}
    states["vaco-inverted_pendulum-K2-s3"] = "resume"  # a solo run of seed 3 was cut off: it resumes alone
    jobs, job_states = S.pack(sweep, cells, states)
    ids = [job.id for job in jobs]
    assert "vaco-inverted_pendulum-K2-s1+2" in ids and "vaco-inverted_pendulum-K2-s3" in ids
    assert "vaco-inverted_pendulum-K2-s4" in ids  # the rest of seed 3's chunk: one cell, alone
    # IMPALA too (its V-trace re-estimated per member before every step)
    assert [i for i in ids if i.startswith("impala")] == [f"impala-inverted_pendulum-K2-s{s}" for s in ("1+2", "3+4")]
    assert job_states["vaco-inverted_pendulum-K2-s1+2"] == "new"
    # a rerun after seed 1's member finished... a population finishes together: both are skipped
    done = {**states, "vaco-inverted_pendulum-K2-s1": "finished", "vaco-inverted_pendulum-K2-s2": "finished"}
    todo = [c for c in cells if done[c.id] != "finished"]
    again, _ = S.pack(sweep, todo, done)
    assert [j.id for j in again if j.id.startswith("vaco")] == [
        "vaco-inverted_pendulum-K2-s3",
        "vaco-inverted_pendulum-K2-s4",
    ]


def test_a_stopped_population_is_counted_as_resuming_not_new(tmp_path, mlflow_uri):
    """A population stopped mid-run keeps its checkpoint in its own folder (its members' folders
    have none): the rerun's summary and its list count its members as resuming, not new."""
    path, out = tmp_path / "pop.yaml", tmp_path / "out"
    path.write_text(yaml.safe_dump(SWEEP))
    ckpt = out / "vaco-inverted_pendulum-K2-s1+2+3" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"")  # what a stop leaves there (the dry run reads only that it is there)
    dry = _sweep(path, out, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "0 finished (skipped), 3 resume from a checkpoint, 1 new" in dry.stdout, dry.stdout
    assert f"  resume    {CELLS[0]}" in dry.stdout and f"  new       {CELLS[3]}" in dry.stdout


def _packed(tmp_path, body: dict):
    """The sweep file ``body`` written and loaded, its cells, and its jobs' sizes as `pack` forms them."""
    from vaco.sweep.grid import pack

    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(body))
    sweep = S.load_sweep(path, output_dir=str(tmp_path / "out"))
    cells = S.expand(sweep)
    jobs, _ = pack(sweep, cells, dict.fromkeys((c.id for c in cells), "new"))
    return path, sweep, cells, [len(getattr(job, "members", (job,))) for job in jobs]


@pytest.mark.parametrize(
    ("collection", "population", "expected"),
    [
        (None, None, [5]),  # the default, in process: up to 12 seeds a process, so the cell's five in one
        (None, 1, [1] * 5),  # `population: 1`: every seed alone
        (None, 2, [2, 2, 1]),
        ("vaco.data.parallel.Actors", None, [1] * 5),  # actor processes: alone
        ("vaco.data.warp.Warp", None, [5]),  # Warp: up to 16, so the cell's five seeds in one
    ],
)
def test_a_sweep_packs_seeds_into_populations_by_default_sized_by_the_backend(
    tmp_path, collection, population, expected
):
    """Without `population`, a sweep packs a cell's seeds by its backend (vaco.sweep.grid.AUTO_POPULATION);
    `population: 1` keeps every seed alone, and the plan prints how the seeds are packed."""
    body = {**SWEEP, "defaults": {"env": "inverted_pendulum", "K": 2, "seed": [1, 2, 3, 4, 5]}}
    body.pop("population")
    if population is not None:
        body["population"] = population
    if collection is not None:
        body["overrides"] = {**body["overrides"], "data.init_args.collection": {"class_path": collection}}
    path, sweep, cells, sizes = _packed(tmp_path, body)
    assert sizes == expected
    if population is None and collection is None:
        dry = _sweep(path, tmp_path / "out", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "population: auto, the default (up to 12 seeds a process" in dry.stdout
        assert "5 of the 5 cells to run would run as 1 populations" in dry.stdout


@pytest.mark.parametrize(("seeds", "expected"), [(12, [12]), (13, [7, 6]), (20, [10, 10]), (25, [9, 9, 7])])
def test_auto_populations_are_evened_out_over_a_cells_seeds(tmp_path, seeds, expected):
    """`population: auto` in process packs up to 12 seeds a process, the cell's seeds split evenly
    (20 seeds: two of 10, not 12 and 8), from the sweep file alone (a rerun forms the same ones)."""
    from vaco.sweep.grid import pack

    body = {**SWEEP, "defaults": {"env": "inverted_pendulum", "K": 2, "seed": list(range(1, seeds + 1))}}
    body.pop("population")
    _, sweep, cells, sizes = _packed(tmp_path, body)
    assert sizes == expected
    # a rerun with the first members finished forms the same chunks (the rest of the first one, then the others)
    done = {c.id for c in cells[:3]}
    jobs, _ = pack(sweep, [c for c in cells if c.id not in done], {c.id: "new" for c in cells if c.id not in done})
    assert [len(getattr(job, "members", (job,))) for job in jobs] == [expected[0] - 3, *expected[1:]]


def test_jobs_auto_is_one_cell_a_usable_core(tmp_path):
    import os

    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "jobs": "auto"}))
    assert S.load_sweep(path, output_dir=str(tmp_path / "out")).jobs == len(os.sched_getaffinity(0))
    path.write_text(yaml.safe_dump({**SWEEP, "jobs": "two"}))
    with pytest.raises(S.SweepError, match="`jobs` must be an integer >= 1 or `auto`"):
        S.load_sweep(path, output_dir=str(tmp_path / "out"))
