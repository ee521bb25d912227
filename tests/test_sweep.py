"""`vaco sweep`: validation naming the field, the rule for axes that do not apply, the shipped
profiles, and a real two-cell sweep that is interrupted by SIGINT, resumes and skips."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
import yaml

from helpers.tiny_sweep import (
    ABLATIONS,
    BROKEN,
    FIRST,
    ITERATIONS,
    REPO,
    SECOND,
    TINY,
    full_sweep,
    interrupted_sweep,
)
from vaco import sweep as S

TINY_OVERRIDES = {
    "data.init_args.num_envs": 2,
    "data.init_args.num_steps": 64,
    "data.init_args.total_steps": 512,
    "data.init_args.eval_every": 2,
    "data.init_args.eval_episodes": 2,
    "data.init_args.eval_envs": 2,
    "model.init_args.update_epochs": 1,
    "model.init_args.num_minibatches": 2,
    "checkpoint.every_n_iterations": 1,
}


def _file(tmp_path: Path, body: dict, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _base(**grid) -> dict:
    return {
        "experiment": "x",
        "overrides": dict(TINY_OVERRIDES),
        "grid": {"main": {"algorithm": ["vaco"], "env": ["inverted_pendulum"], **grid}},
    }


# ---------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(bogus=1), "unknown field `bogus`"),
        (lambda d: d.pop("experiment"), "`experiment`"),
        (lambda d: d.update(jobs=0), "`jobs`"),
        (
            lambda d: d["grid"]["main"].update(algorithm=["vacco"]),
            "`grid.main.algorithm`: unknown algorithm `vacco`; did you mean `vaco`",
        ),
        (lambda d: d["grid"]["main"].update(env=["pong"]), "`grid.main.env`: unknown env `pong` (known:"),
        (
            lambda d: d["grid"]["main"].update(env=["hoper"]),
            "`grid.main.env`: unknown env `hoper`; did you mean `hopper`",
        ),
        (lambda d: d["grid"]["main"].update(deltas=[0.1]), "unknown field `deltas`"),
        (lambda d: d["grid"]["main"].update(K=[0]), "`grid.main.K`"),
        (lambda d: d["grid"]["main"].update(seed=["one"]), "`grid.main.seed`"),
        (lambda d: d["grid"]["main"].update(delta=[-0.1]), "`grid.main.delta`"),
        (lambda d: d["grid"]["main"].update(realign=["yes"]), "`grid.main.realign`"),
        (
            lambda d: d["grid"]["main"].update(algorithm=["ppo_clip"], delta=[0.1]),
            "`grid.main.delta`: none of ['ppo_clip']",
        ),
        (
            lambda d: d["grid"]["main"].update(algorithm=["spo"], rho_bar=[2.0]),
            "`grid.main.rho_bar`: none of ['spo']",
        ),
        (lambda d: d["grid"]["main"].update(algorithm=["impala"], realign=[False]), "`grid.main.realign`"),
        (
            lambda d: d["overrides"].update({"data.init_args.policy_buffer_size": 4}),
            "`overrides.data.init_args.policy_buffer_size`",
        ),
        (
            lambda d: d["overrides"].update({"model.init_args.objective.init_args.delta": 0.3}),
            "`overrides.model.init_args.objective.init_args.delta`",
        ),
        (lambda d: d["overrides"].update({"trainer.logger": None}), "`overrides.trainer.logger`"),
        (  # a typo in a range: 10^6 cells, refused before any is built (expanding them took 15 s)
            lambda d: d["grid"]["main"].update(K=list(range(1, 1001)), seed=list(range(1000))),
            "`grid`: up to 1,000,000 cells (`grid.main` alone 1,000,000), more than the 100,000",
        ),
    ],
)
def test_an_invalid_sweep_file_names_the_field(tmp_path, change, message):
    body = _base()
    change(body)
    with pytest.raises(S.SweepError) as err:
        S.load_sweep(_file(tmp_path, body))
    assert message in str(err.value)


def test_an_unknown_override_is_rejected_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    body = _base()
    body["overrides"]["data.init_args.num_env"] = 3
    path = _file(tmp_path, body)
    assert S.main(["--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "`overrides`" in err and "num_env" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "mlflow.db").exists()


# ---------------------------------------------------------------------------------------- the grid
def test_axes_that_do_not_apply_do_not_multiply_cells(tmp_path):
    body = _base(algorithm=["vaco", "ppo_clip", "impala"], delta=[0.1, 0.2], rho_bar=[1.0, 2.0], K=[1, 4], seed=[1, 2])
    body["grid"]["realign"] = {
        "algorithm": ["vaco", "ppo_clip", "impala"],
        "env": "inverted_pendulum",
        "realign": [True, False],
    }
    sweep = S.load_sweep(_file(tmp_path, body), output_dir=str(tmp_path / "out"))
    cells = S.expand(sweep)
    ids = [c.id for c in cells]
    assert len(ids) == len(set(ids))
    by = lambda algo: [c for c in cells if c.algorithm == algo]  # noqa: E731
    # vaco: 2 delta x 2 rho_bar x 2 K x 2 seeds; ppo_clip: 2 K x 2 seeds; impala: 2 rho_bar x 2 K x 2 seeds
    assert (len(by("vaco")), len(by("ppo_clip")), len(by("impala"))) == (16, 4, 8)
    # the realign block adds vaco without realignment (its twin config) and ppo_clip with it;
    # impala ignores the axis and vaco/ppo_clip at their own setting are cells already listed
    assert [c.id for c in by("vaco_no_realign")] == ["vaco_no_realign-inverted_pendulum-K1-s1"]
    assert [c.id for c in by("ppo_clip+realign")] == ["ppo_clip_realign-inverted_pendulum-K1-s1"]
    assert len(cells) == 16 + 4 + 8 + 2
    assert all(c.delta is None and c.rho_bar is None for c in by("ppo_clip"))
    assert all(c.delta is None and c.rho_bar in (1.0, 2.0) for c in by("impala"))

    uri = "sqlite:////nonexistent/mlflow.db"
    impala = next(c for c in by("impala") if c.rho_bar == 2.0)
    model = S.cell_config(sweep, impala, uri)["model"]["init_args"]
    assert model["objective"]["init_args"]["rho_bar"] == model["advantage"]["init_args"]["rho_bar"] == 2.0
    realigned = S.cell_config(sweep, by("ppo_clip+realign")[0], uri)
    assert realigned["model"]["init_args"]["advantage"] == {
        "class_path": "vaco.advantages.VTrace",
        "init_args": {"gamma": 0.99, "lmbda": 0.95, "rho_bar": 1.0, "c_bar": 1.0},
    }
    assert realigned["model"]["init_args"]["algorithm_name"] == "ppo_clip+realign"
    cell = next(c for c in by("vaco") if c.delta == 0.1 and c.rho_bar == 2.0 and c.K == 4 and c.seed == 2)
    assert cell.id == "vaco-inverted_pendulum-K4-delta0.1-rho2-s2"
    config = S.cell_config(sweep, cell, uri)
    assert config["seed_everything"] == 2 and config["data"]["init_args"]["policy_buffer_size"] == 4
    assert config["data"]["init_args"]["num_steps"] == 64  # shared override
    logger = config["trainer"]["logger"]["init_args"]
    assert logger["run_name"] == cell.id and logger["experiment_name"] == "x"
    assert "tracking_uri" not in logger  # the cell reads MLFLOW_TRACKING_URI from its launcher's environment
    assert logger["tags"] == {
        "vaco.algorithm": "vaco",
        "vaco.env": "inverted_pendulum",
        "vaco.K": "4",
        "vaco.delta": "0.1",
        "vaco.rho_bar": "2",
        "vaco.realign": "true",
        "vaco.seed": "2",
        "vaco.sweep.cell": cell.id,
        "vaco.sweep.settings": sweep.settings,
    }
    assert config["checkpoint"]["dirpath"] == str(tmp_path / "out" / cell.id / "checkpoints")
    S.validate_with_cli(sweep, cells, uri)  # every kind of cell parses with `vaco fit`'s own parser


def test_the_llm_grid_is_a_sweep_file_whose_k_axis_is_n(tmp_path):
    """configs/sweeps/llm_cpu.yaml: RLVRModule declares that K sets num_minibatches; the TV
    filter's delta stays at the LLM config's 0.05; the stress block is a variant at lr 3e-4; the
    per-completion filter is an arm of its own."""
    sweep = S.load_sweep(REPO / "configs" / "sweeps" / "llm_cpu.yaml")
    cells = S.expand(sweep)
    S.validate_with_cli(sweep, cells, "sqlite:////nonexistent/mlflow.db")
    assert len(cells) == 2 * 2 * 3 * 3 + 3 * 3
    assert {c.algorithm for c in cells} == {
        "grpo",
        "vaco_grpo",
        "vaco_grpo_seq",
        "grpo[lr=0.0003]",
        "vaco_grpo[lr=0.0003]",
    }
    seq = S.cell_config(sweep, next(c for c in cells if c.algorithm == "vaco_grpo_seq"), "sqlite:////x/mlflow.db")
    assert seq["model"]["init_args"]["objective"]["class_path"] == "vaco.objectives.SequenceTVFilter"
    cell = next(c for c in cells if c.algorithm == "vaco_grpo" and c.K == 16 and c.seed == 2)
    assert cell.id == "vaco_grpo-gsm8k_cpu-K16-s2" and cell.delta == 0.05
    config = S.cell_config(sweep, cell, "sqlite:////nonexistent/mlflow.db")
    model = config["model"]["init_args"]
    assert config["model"]["class_path"] == "vaco.llm.RLVRModule" and model["num_minibatches"] == 16
    assert model["model_path"] == "runs/llm/cpu/model"  # the env config's part survives the algorithm's
    assert model["objective"] == {
        "class_path": "vaco.objectives.TVFilter",
        "init_args": {"delta": 0.05, "normalize_advantage": False},
    }
    assert "policy_buffer_size" not in config["data"]["init_args"]
    assert config["trainer"]["logger"]["init_args"]["log_model"] is False  # the config's own choice is kept
    body = yaml.safe_load((REPO / "configs" / "sweeps" / "llm_cpu.yaml").read_text())
    body["configs_dir"] = str(REPO / "configs" / "llm")
    body["overrides"] = {"model.init_args.num_minibatches": 4}  # what K sets: refused, named
    with pytest.raises(S.SweepError, match="overrides.model.init_args.num_minibatches"):
        S.load_sweep(_file(tmp_path, body))


CLIP = "model.init_args.objective.init_args.clip_epsilon"


def _labelled(**blocks) -> dict:
    """A control calibrated per K: one arm, clip 0.4 at K = 1 and 0.35 at K = 4."""
    body = _base()
    body["grid"] = {
        "k1": {"algorithm": "ppo_clip_tv_matched", "env": "inverted_pendulum", "K": 1, "label": "clip_per_k"},
        "k4": {
            "algorithm": "ppo_clip_tv_matched",
            "env": "inverted_pendulum",
            "K": 4,
            CLIP: 0.35,
            "label": "clip_per_k",
        },
        **blocks,
    }
    return body


def test_a_labelled_block_is_one_arm_whatever_its_dotted_key_values(tmp_path):
    body = _labelled(plain={"algorithm": "ppo_clip_tv_matched", "env": "inverted_pendulum", "K": 4, CLIP: 0.35})
    sweep = S.load_sweep(_file(tmp_path, body), output_dir=str(tmp_path / "out"))
    cells = S.expand(sweep)
    assert [(c.algorithm, c.id) for c in cells] == [
        ("clip_per_k", "clip_per_k-inverted_pendulum-K1-s1"),
        ("clip_per_k", "clip_per_k-inverted_pendulum-K4-clip_epsilon0.35-s1"),
        # without a label the same cell is a variant the report keeps apart
        ("ppo_clip_tv_matched[clip_epsilon=0.35]", "ppo_clip_tv_matched-inverted_pendulum-K4-clip_epsilon0.35-s1"),
    ]
    uri = "sqlite:////nonexistent/mlflow.db"
    k1, k4 = (S.cell_config(sweep, c, uri) for c in cells[:2])
    assert k1["model"]["init_args"]["algorithm_name"] == k4["model"]["init_args"]["algorithm_name"] == "clip_per_k"
    assert k1["model"]["init_args"]["variant_of"] == "ppo_clip"  # still a control: out of the task's min and max
    assert k1["model"]["init_args"]["objective"]["init_args"]["clip_epsilon"] == 0.4  # the config's own
    assert k4["model"]["init_args"]["objective"]["init_args"]["clip_epsilon"] == 0.35
    assert k4["trainer"]["logger"]["init_args"]["tags"]["vaco.algorithm"] == "clip_per_k"
    assert k4["trainer"]["logger"]["init_args"]["tags"][f"vaco.{CLIP}"] == "0.35"  # the value, kept on the run
    S.validate_with_cli(sweep, cells, uri)


@pytest.mark.parametrize(
    "blocks, message",
    [
        ({"k1": {"algorithm": "vaco", "env": "inverted_pendulum", "label": "ppo_clip"}}, "is a configs/algo name"),
        ({"k1": {"algorithm": "vaco", "env": "inverted_pendulum", "label": "a b"}}, "`grid.k1.label` must be a name"),
        ({"k1": {"algorithm": ["vaco", "ppo_clip"], "env": "inverted_pendulum", "label": "x"}}, "one algorithm"),
        ({"k1": {"algorithm": "vaco", "env": "inverted_pendulum", "realign": False, "label": "x"}}, "renames the arm"),
        (
            {"k1": {"algorithm": "ppo_clip", "env": "inverted_pendulum", "K": 1, "label": "clip_per_k"}},
            "one configs/algo file",
        ),
        (
            {
                "k4b": {
                    "algorithm": "ppo_clip_tv_matched",
                    "env": "inverted_pendulum",
                    "K": 4,
                    CLIP: 0.3,
                    "label": "clip_per_k",
                }
            },
            "one value of each dotted key per K",
        ),
    ],
)
def test_a_bad_label_names_the_field(tmp_path, blocks, message):
    body = _labelled()
    body["grid"].update(blocks)
    with pytest.raises(S.SweepError, match=message):
        S.load_sweep(_file(tmp_path, body))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["paper", "laptop", "tiny"])
def test_the_shipped_profiles_are_valid(name):
    sweep = S.load_sweep(REPO / "configs" / "sweeps" / f"{name}.yaml")
    cells = S.expand(sweep)
    S.validate_with_cli(sweep, cells, "sqlite:////nonexistent/mlflow.db")
    algorithms = {c.algorithm for c in cells}
    assert {"vaco", "ppo_clip", "ppo_kl", "spo", "impala"} <= algorithms or name == "tiny"
    assert {c.delta for c in cells if c.algorithm == "vaco"} > {0.2}  # the delta ablation
    assert {c.rho_bar for c in cells if c.algorithm == "vaco"} > {1.0}  # the rho_bar ablation
    assert "vaco_no_realign" in algorithms  # realignment off
    if name == "paper":
        o = sweep.overrides
        assert (
            o["data.init_args.num_envs"],
            o["data.init_args.num_steps"],
            o["data.init_args.total_steps"],
        ) == (500, 1000, 100_000_000)
        main = [
            c
            for c in cells
            if c.algorithm in ("vaco", "ppo_clip", "ppo_kl", "spo", "impala")
            and c.delta in (None, 0.2)
            and c.rho_bar in (None, 1.0)
        ]
        assert len({c.seed for c in main}) == 10 and len({c.K for c in main}) == 5
        assert {c.env for c in main} == {"halfcheetah", "hopper", "walker2d", "ant", "humanoid"}
        assert len(main) == 5 * 5 * 5 * 10


STUDIES = sorted(
    p.stem
    for p in (REPO / "configs" / "sweeps").glob("*.yaml")
    if p.stem not in ("paper", "laptop", "tiny", "llm_cpu")  # checked above, and in test_llm_e2e.py
)


@pytest.mark.slow
@pytest.mark.parametrize("name", STUDIES)
def test_every_shipped_study_file_is_valid_and_each_cell_parses_with_vaco_fit(name):
    """A study run in blocks over several sessions must not fail at its 300th cell: every cell's
    config parses with `vaco fit`'s own parser now, and a labelled arm is one algorithm at every K."""
    sweep = S.load_sweep(REPO / "configs" / "sweeps" / f"{name}.yaml")
    cells = S.expand(sweep)
    assert cells and len({c.id for c in cells}) == len(cells)
    S.validate_with_cli(sweep, cells, "sqlite:////nonexistent/mlflow.db")
    for block in sweep.blocks:
        if block.label:
            assert {c.algorithm for c in cells if c.id.startswith(block.label + "-")} == {block.label}


# ---------------------------------------------------------------------------------------- running
def test_dry_run_lists_the_cells_and_starts_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert S.main(["--config", str(TINY), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "5 cells; 0 finished (skipped), 0 resume from a checkpoint, 5 new" in out
    assert f"new       {FIRST}" in out and "vaco_no_realign-inverted_pendulum-K2-s1" in out
    assert not (tmp_path / "out").exists() and not (tmp_path / "mlflow.db").exists()


def test_the_eta_counts_only_cells_run_from_their_start():
    """A cell resumed from a checkpoint ran only the rest of its run: a sweep that begins by
    resuming two cells (a block after a stop) must not take their minute for a cell's time."""
    from vaco.sweep.local_launcher import estimate_eta

    assert estimate_eta([], [30.0, 10.0], queued=65, jobs=2) is None  # only resumed cells done yet
    # whole cells of 300 and 420 s (mean 360); running 100 s and 400 s; 10 queued; 2 at a time
    expected = (10 * 360 + (360 - 100) + 0) / 2
    assert estimate_eta([300.0, 420.0], [100.0, 400.0], queued=10, jobs=2) == pytest.approx(expected)


@pytest.mark.slow
def test_a_failed_cell_shows_its_log_and_the_others_go_on(tmp_path_factory):
    s = full_sweep(tmp_path_factory)  # one ablation cell was given a torn checkpoint
    assert s.failing_rc == 1, s.failing_log
    # the torn checkpoint is a configuration error of that cell: one line naming the file, exit 2
    assert f"FAILED {BROKEN} (exit code 2)" in s.failing_log
    tail = s.failing_log.split(f"FAILED {BROKEN}", 1)[1]
    assert "last lines of" in tail and "train.log" in tail and "is truncated or not a checkpoint" in tail
    for cell in ABLATIONS[:2]:
        assert f"done   {cell}" in s.failing_log
    assert f"skip   {FIRST} (finished)" in s.failing_log and f"skip   {SECOND} (finished)" in s.failing_log
    assert f"failed cells: {BROKEN}" in s.failing_log
    # with the bad file gone, the next run does that cell alone, afresh, and everything has finished
    assert s.full_rc == 0, s.full_log
    assert f"start  {BROKEN}   [" in s.full_log and f"done   {BROKEN}" in s.full_log
    assert s.full_log.count("skip   ") == 4
    for cell in (FIRST, SECOND, *ABLATIONS):
        assert [r.info.status for r in s.cell_runs(cell)] == ["FINISHED"], cell


@pytest.mark.slow
def test_a_sweep_continued_in_a_new_store_counts_the_cells_its_data_files_hold(
    tmp_path_factory, tmp_path, monkeypatch, capsys
):
    """``--finished-in DATA``: a study whose MLflow store is gone goes on in a new one from its
    exported data: the cells whose FINISHED runs a data file holds are skipped, the others run.
    A run whose coordinates are not its cell's, or a missing file, is one line naming the flag."""
    from vaco.report.runs import load_runs, runs_to_frame, save_runs

    s = full_sweep(tmp_path_factory)
    runs, _ = load_runs(s.experiment, s.uri)
    two = save_runs([r for r in runs if r.name in (FIRST, SECOND)], tmp_path / "two.csv.gz")
    every = save_runs(runs, tmp_path / "all.csv.gz")
    store = tmp_path / "new"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    base = ["--config", str(TINY), "--out", str(tmp_path / "out")]
    assert S.main([*base, "--finished-in", str(two), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "5 cells; 2 finished (skipped), 0 resume from a checkpoint, 3 new" in out
    assert f"2 of them finished in {two} (--finished-in" in out
    assert f"finished  {FIRST}" in out and f"finished  {SECOND}" in out and f"new       {BROKEN}" in out
    # every cell in the files: nothing runs, nothing is written to the new store
    assert S.main([*base, "--finished-in", str(two), "--finished-in", str(every)]) == 0
    out = capsys.readouterr().out
    assert f"skip   {FIRST} (finished, in {two})" in out and "nothing to do: every cell has finished" in out
    assert mlflow.MlflowClient(uri).get_experiment_by_name(s.experiment) is None
    # a run that is not its cell: SECOND's run under FIRST's name
    frame = runs_to_frame([r for r in runs if r.name == SECOND])
    frame["name"] = FIRST
    frame.to_csv(tmp_path / "wrong.csv.gz", index=False)
    wrong = f"its run '{FIRST}' is ppo_clip K=2 seed=1, but this sweep's cell of that name is vaco"
    for bad, message in ((tmp_path / "wrong.csv.gz", wrong), (tmp_path / "missing.csv.gz", "no file at")):
        assert S.main([*base, "--finished-in", str(bad), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"vaco sweep: `--finished-in {bad}`: ") and message in err[0], err


@pytest.mark.slow
def test_a_sweep_saves_its_finished_runs_so_the_next_block_goes_on_in_any_store(
    tmp_path_factory, tmp_path, monkeypatch, capsys
):
    """``--save-data DATA``: every FINISHED run of the sweep, the store's and the ``--finished-in``
    files' (whatever ``--only`` ran), in the data file `vaco report` reads, the same bytes for the same
    runs; a block continued from DATA in a new store writes DATA after each cell, so a sweep killed
    outright loses nothing that finished. Bad input is one line naming the flag, before any store is
    made."""
    import os
    import subprocess
    import sys
    import time

    from helpers.tiny_sweep import _processes_mentioning
    from vaco.report.runs import load_runs, read_runs, runs_to_frame, save_runs

    def frame(runs):
        return runs_to_frame(sorted(runs, key=lambda r: r.name)).reset_index(drop=True)

    s = full_sweep(tmp_path_factory)
    stored, _ = load_runs(s.experiment, s.uri)
    assert len(stored) == 5
    monkeypatch.setenv("MLFLOW_TRACKING_URI", s.uri)
    base = ["--config", str(TINY), "--out", str(s.out)]
    ledger = tmp_path / "ledger.csv.gz"
    assert S.main([*base, "--status", "--save-data", str(ledger)]) == 0
    assert f"5 finished runs of the sweep (this store's) -> {ledger}; nothing judged" in capsys.readouterr().out
    assert frame(read_runs(ledger)).equals(frame(stored))
    first_bytes = ledger.read_bytes()
    assert S.main([*base, "--status", "--save-data", str(ledger)]) == 0
    assert ledger.read_bytes() == first_bytes  # no time in the gzip header: a committed file moves with its runs only
    assert not list(tmp_path.glob(".*partial"))

    # a new store, two runs carried: --status writes them; then a block of one cell (--only) in the
    # new store, continued from and saved to the same file, holds all three
    two = save_runs([r for r in stored if r.name in (FIRST, SECOND)], tmp_path / "two.csv.gz")
    new_uri = f"sqlite:///{tmp_path / 'new.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_uri)
    base = ["--config", str(TINY), "--out", str(tmp_path / "out")]
    assert S.main([*base, "--finished-in", str(two), "--status", "--save-data", str(ledger)]) == 0
    assert "2 finished runs of the sweep (this store's and the --finished-in files')" in capsys.readouterr().out
    assert sorted(r.name for r in read_runs(ledger)) == sorted((FIRST, SECOND))
    # a block of two cells in the new store, one at a time, going on from and saving to that file:
    # once the first has finished the file holds it, so a sweep killed by SIGKILL before the second
    # ends (no save at its end) has lost nothing that finished
    out = tmp_path / "out"
    command = [sys.executable, "-m", "vaco", "sweep", "--config", str(TINY), "--out", str(out), "--jobs", "1"]
    command += [
        "--finished-in",
        str(ledger),
        "--save-data",
        str(ledger),
        "--only",
        ABLATIONS[0],
        "--only",
        ABLATIONS[1],
    ]
    log = tmp_path / "block.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            command, env={**os.environ, "MLFLOW_TRACKING_URI": new_uri}, stdout=fh, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 400
            while len(read_runs(ledger)) < 3 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert proc.poll() is None, log.read_text()[-3000:]
            proc.kill()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    deadline = time.monotonic() + 60  # its cells end with it (they die with their parent)
    while _processes_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_mentioning(str(out)) == []
    text = log.read_text()
    assert f"done   {ABLATIONS[0]}" in text and "sweep finished" not in text and "nothing judged" not in text
    saved = read_runs(ledger)
    assert sorted(r.name for r in saved) == sorted((FIRST, SECOND, ABLATIONS[0]))
    (new_run,) = load_runs(s.experiment, new_uri)[0]
    assert frame([r for r in saved if r.name == ABLATIONS[0]]).equals(frame([new_run]))
    assert frame([r for r in saved if r.name != ABLATIONS[0]]).equals(
        frame([r for r in stored if r.name in (FIRST, SECOND)])
    )
    capsys.readouterr()

    fresh = f"sqlite:///{tmp_path / 'never.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", fresh)
    for extra, message in (
        (["--save-data", str(tmp_path / "runs.txt")], "must end in .csv.gz"),
        (["--save-data", str(tmp_path)], "is a folder"),
        (["--dry-run", "--save-data", str(ledger)], "a dry run writes nothing"),
    ):
        assert S.main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("vaco sweep: `--save-data`: ") and message in err[0], err
    assert not (tmp_path / "never.db").exists()


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_its_cell_and_skips_the_finished_one(tmp_path_factory):
    s = interrupted_sweep(tmp_path_factory)
    # -- stopped by SIGINT while the second cell was running
    assert s.stopped_rc == 130, s.stopped_log
    assert "SIGINT: stopping the sweep" in s.stopped_log
    assert f"done   {FIRST}" in s.stopped_log
    assert s.leftover_processes == [], "children left behind"
    assert [status for _, status in s.first_runs_at_stop] == ["FINISHED"]
    assert len(s.second_runs_at_stop) == 1 and s.second_runs_at_stop[0][1] != "FINISHED"
    assert s.second_version_at_stop is not None and 1 <= s.second_version_at_stop < ITERATIONS
    # -- the same command again: skip the finished cell, resume the other in its own MLflow run
    assert s.resumed_rc == 0, s.resumed_log
    assert f"skip   {FIRST} (finished)" in s.resumed_log
    assert f"start  {SECOND} (resume from checkpoint)" in s.resumed_log
    assert f"start  {FIRST}" not in s.resumed_log
    first, second = s.cell_runs(FIRST), s.cell_runs(SECOND)
    assert [r.info.run_id for r in first] == [s.first_runs_at_stop[0][0]]
    assert [r.info.run_id for r in second] == [s.second_runs_at_stop[0][0]]
    run = second[0]
    assert run.info.status == "FINISHED" and run.info.run_name == SECOND
    steps = {m.step for m in s.client().get_metric_history(run.info.run_id, "time/env_steps")}
    assert steps == {128 * i for i in range(1, ITERATIONS + 1)}  # every iteration, before and after the stop
    assert run.data.params["algorithm"] == "ppo_clip" and run.data.params["K"] == "2"
    assert {k: run.data.tags[k] for k in ("vaco.algorithm", "vaco.env", "vaco.K", "vaco.seed", "vaco.sweep.cell")} == {
        "vaco.algorithm": "ppo_clip",
        "vaco.env": "inverted_pendulum",
        "vaco.K": "2",
        "vaco.seed": "1",
        "vaco.sweep.cell": SECOND,
    }
    second_log = (s.out / SECOND / "train.log").read_text()
    assert second_log.count("\n=== ") == 2 and "--ckpt_path" in second_log.split("\n=== ")[2]
    assert "Restored all states from the checkpoint" in second_log
    assert (s.out / FIRST / "train.log").read_text().count("\n=== ") == 1
    # -- and a third time there is nothing to do
    sweep = S.load_sweep(TINY, str(s.out))
    cells = [c for c in S.expand(sweep) if c.id in (FIRST, SECOND)]
    assert set(S.plan(sweep, cells, s.uri).values()) == {"finished"}


@pytest.mark.slow
def test_cells_forked_by_the_zygote_compute_exactly_what_subprocesses_do(tmp_path):
    """A local sweep forks its cells from a preloaded zygote (vaco.sweep.zygote) instead of
    starting an interpreter per cell: the same cell gives the same metrics, bit for bit, as with
    VACO_SWEEP_ZYGOTE=0, and no zygote or cell process outlives the sweep. Each sweep starts in a
    folder holding a decoy ``vaco/`` package (as a clone's root does when a study runs from a
    worktree at its declared commit): the cells must import the launcher's vaco, not the decoy."""
    import os
    import subprocess

    import mlflow

    from helpers.runs import VACO, metric_histories

    histories = {}
    for mode in ("1", "0"):
        root = tmp_path / f"zygote{mode}"
        (root / "vaco").mkdir(parents=True)
        (root / "vaco" / "__init__.py").write_text("raise ImportError('the decoy vaco of the working directory')\n")
        uri = f"sqlite:///{root / 'mlflow.db'}"
        out = subprocess.run(
            [VACO, "sweep", "--config", str(TINY), "--out", str(root / "out"), "--only", FIRST],
            cwd=root,
            env=dict(os.environ, MLFLOW_TRACKING_URI=uri, VACO_SWEEP_ZYGOTE=mode, OMP_NUM_THREADS="1"),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "cells start as subprocesses" not in out.stdout  # the zygote did start where asked
        client = mlflow.MlflowClient(uri)
        experiment = client.get_experiment_by_name("vaco-tiny").experiment_id
        (run,) = client.search_runs([experiment], filter_string=f"tags.`vaco.sweep.cell` = '{FIRST}'")
        histories[mode] = {
            key: values
            for key, values in metric_histories(uri, run.info.run_id).items()
            if not key.startswith(("perf/", "time/"))
        }
        assert run.info.status == "FINISHED" and "train/tv" in histories[mode]
    assert histories["1"] == histories["0"]
    leftovers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):  # no zygote of these sweeps outlives them
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "vaco.sweep.zygote" in cmdline and str(tmp_path) in environ:  # these sweeps' (their store is here)
            leftovers.append(cmdline)
    assert not leftovers, leftovers


def test_the_papers_llm_grid_is_36_gpu_cells_whose_k_is_n():
    """configs/sweeps/llm_gsm8k.yaml: GRPO and VACO-GRPO x N in {1, 2, 4, 8, 16, 32} x 3 seeds on
    the Qwen setting, one GPU a cell on SLURM; each cell's config sets num_minibatches to N and
    parses with `vaco fit` (the model folder is the cluster's, not this machine's)."""
    sweep = S.load_sweep(REPO / "configs" / "sweeps" / "llm_gsm8k.yaml")
    cells = S.expand(sweep)
    assert len(cells) == 36 and {c.K for c in cells} == {1, 2, 4, 8, 16, 32} and {c.seed for c in cells} == {1, 2, 3}
    assert {c.algorithm for c in cells} == {"grpo", "vaco_grpo"} and {c.env for c in cells} == {"gsm8k_qwen"}
    assert sweep.launcher == "slurm" and sweep.resources["gpus"] == 1
    config = S.cell_config(sweep, next(c for c in cells if c.K == 16))
    assert config["model"]["init_args"]["num_minibatches"] == 16
    assert config["model"]["init_args"]["model_path"] == "models/Qwen2.5-0.5B"
    assert config["trainer"]["accelerator"] == "gpu"


@pytest.mark.slow
def test_the_same_sweep_from_another_directory_is_refused_instead_of_repeating_its_cells(tmp_path):
    """Without `output_dir` a sweep's folder is `sweeps/<experiment>` under the working directory:
    from a second directory the dry run listed cells running elsewhere as "new", and a real run
    restarted two stopped cells from step 0 into new runs. The parent run now records the folder,
    and another one is refused in one line naming it (the first folder, or --out it, still works)."""
    import subprocess

    from helpers.runs import CONFIGS, VACO

    body = {**_base(), "configs_dir": str(CONFIGS)}
    body["overrides"]["data.init_args.total_steps"] = 128
    path = _file(tmp_path, body)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    env = dict(__import__("os").environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")

    def sweep(cwd, *extra):
        return subprocess.run(
            [VACO, "sweep", "--config", str(path), *extra], cwd=cwd, capture_output=True, text=True, env=env
        )

    ran = sweep(first)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    for extra in ((), ("--dry-run",)):
        other = sweep(second, *extra)
        assert other.returncode == 2, other.stdout[-2000:] + other.stderr[-2000:]
        (line,) = other.stderr.strip().splitlines()
        folder = (first / "sweeps" / "x").resolve()
        assert line == (
            f"vaco sweep: `output_dir`: experiment 'x' keeps its cells in {folder}; this run would use "
            f"{(second / 'sweeps' / 'x').resolve()} and repeat their work: run from the directory you first ran "
            f"it in, or pass --out {folder}"
        )
    assert not (second / "sweeps").exists()
    again = sweep(second, "--out", str(first / "sweeps" / "x"))
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]
