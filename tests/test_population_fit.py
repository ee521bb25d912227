"""``vaco fit --population``: each member is its seed's run alone, bit for bit (weights, normaliser,
every logged metric but the timings), and stays so across a resume; one MLflow run per member,
tagged with the population; a checkpoint from which ``vaco evaluate`` plays any member; bad values
are one line.

Real runs of ``vaco fit`` (in this process: Lightning Trainer, gymnasium MuJoCo envs, a SQLite MLflow
store), K = 3 stale policies so that the mixture of versions acts, 2 envs x 64 steps per iteration.
"""

from __future__ import annotations

import re
import subprocess

import mlflow
import pytest
import torch

from helpers.runs import CONFIGS, VACO, fit_in_process, metric_histories
from vaco.population.module import MEMBER_TAG, POPULATION_TAG
from vaco.run.checkpoint import load_checkpoint

ENV = str(CONFIGS / "env" / "inverted_pendulum.yaml")
BATCH = 2 * 64


def _fit(tmp_path, algo: str, *args: str) -> None:
    fit_in_process(tmp_path, algo, *args)


def _runs(uri: str) -> list:
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("vaco")
    return client.search_runs([experiment.experiment_id], max_results=100)


def _state(ckpt, prefix: str = "") -> dict[str, torch.Tensor]:
    state = ckpt["state_dict"]
    return {
        k[len(prefix) :]: v
        for k, v in state.items()
        if k.startswith(prefix)
        and k[len(prefix) :].split(".")[0] in ("actor", "critic", "obs_rms", "version", "proximal_actor")
    }


def _last(tmp_path, run_id: str):
    return load_checkpoint(str(tmp_path / "checkpoints" / run_id / "last.ckpt"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo", ["vaco", "ppo_clip", "impala", "decoupled_ppo", "ppo_ewma", "ppo_clip_ess_step", "ppo_clip_lag_step"]
)
def test_each_member_is_its_seed_run_alone_bit_for_bit_and_across_a_resume(tmp_path, mlflow_uri, algo, monkeypatch):
    """A population of seeds 5 and 6 against the solo runs of 5 and 6: 2 iterations, then each
    extended to 3 by a resume. Weights, normaliser and every metric (but perf/) must be equal.
    IMPALA re-estimates V-trace before every optimiser step, from each member's current weights;
    decoupled PPO reads the recomputed proximal policy, PPO-EWMA each member's EWMA of its weights
    (stacked in the update, stepped after every optimiser step, in every member's checkpoint). The two
    step-size rules scale each member's step by its own factor (its minibatch's ESS, its batch's lag).
    The members' gymnasium envs step in lockstep (vaco.population.lockstep: one env step, one policy call
    for the members on several versions)."""
    from vaco.population.lockstep import Lockstep

    lockstep_rollouts = []
    original = Lockstep.rollout
    monkeypatch.setattr(Lockstep, "rollout", lambda self: lockstep_rollouts.append(1) or original(self))
    pop, solo = tmp_path / "pop", tmp_path / "solo"
    _fit(pop, algo, "--population", "2", "--seed_everything", "5", "--data.init_args.total_steps", str(2 * BATCH))
    assert len(lockstep_rollouts) == 2
    (population,) = {r.data.tags[POPULATION_TAG] for r in _runs(mlflow_uri)}
    members = sorted(_runs(mlflow_uri), key=lambda r: int(r.data.tags[MEMBER_TAG]))
    assert [r.data.params["seed"] for r in members] == ["5", "6"]
    assert [r.info.run_name for r in members] == [
        f"{members[0].data.params['algorithm']} InvertedPendulum-v5 K=3 s{s}" for s in (5, 6)
    ]
    assert all(r.info.status == "FINISHED" and r.data.params["population"] == "2" for r in members)
    ckpt_path = pop / "checkpoints" / members[0].info.run_id / "last.ckpt"
    _fit(
        pop,
        algo,
        "--population",
        "2",
        "--seed_everything",
        "5",
        "--ckpt_path",
        str(ckpt_path),
        "--data.init_args.total_steps",
        str(3 * BATCH),
    )
    for seed in (5, 6):
        _fit(solo / str(seed), algo, "--seed_everything", str(seed), "--data.init_args.total_steps", str(2 * BATCH))
    solo_runs = {r.data.params["seed"]: r for r in _runs(mlflow_uri) if POPULATION_TAG not in r.data.tags}
    for seed in (5, 6):
        run_id = solo_runs[str(seed)].info.run_id
        _fit(
            solo / str(seed),
            algo,
            "--seed_everything",
            str(seed),
            "--ckpt_path",
            str(solo / str(seed) / "checkpoints" / run_id / "last.ckpt"),
            "--data.init_args.total_steps",
            str(3 * BATCH),
        )
    together = load_checkpoint(str(ckpt_path))
    resumed = [r for r in _runs(mlflow_uri) if POPULATION_TAG in r.data.tags]
    assert sorted(r.info.run_id for r in resumed) == sorted(r.info.run_id for r in members)  # the same two runs
    assert {r.data.tags[POPULATION_TAG] for r in _runs(mlflow_uri) if POPULATION_TAG in r.data.tags} == {population}
    for m, seed in enumerate((5, 6)):
        alone = _last(solo / str(seed), solo_runs[str(seed)].info.run_id)
        mine, theirs = _state(together, f"members.{m}."), _state(alone)
        assert mine.keys() == theirs.keys() and int(theirs["version"]) == 3
        for key in theirs:
            same = (
                torch.equal(mine[key], theirs[key])
                if isinstance(theirs[key], torch.Tensor)
                else mine[key] == theirs[key]
            )
            assert same, (algo, seed, key)
        assert (algo == "ppo_ewma") == any(key.startswith("proximal_actor.") for key in theirs)
        member_histories = metric_histories(mlflow_uri, members[m].info.run_id)
        solo_histories = metric_histories(mlflow_uri, solo_runs[str(seed)].info.run_id)
        assert member_histories == solo_histories, (algo, seed)
        assert len(member_histories["eval/return"]) == 2  # iterations 2 and 3


@pytest.mark.slow
def test_vaco_evaluate_plays_one_member_and_names_the_choice(tmp_path, mlflow_uri):
    _fit(tmp_path, "vaco", "--population", "[7, 9]", "--data.init_args.total_steps", str(BATCH))
    (first,) = [r for r in _runs(mlflow_uri) if r.data.tags[MEMBER_TAG] == "0"]
    ckpt = str(tmp_path / "checkpoints" / first.info.run_id / "last.ckpt")
    out = subprocess.run(
        [VACO, "evaluate", "--ckpt", ckpt, "--member", "1", "--episodes", "2"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "member 1 (seed 9)" in out.stdout and "return" in out.stdout
    out = subprocess.run([VACO, "evaluate", "--ckpt", ckpt, "--episodes", "2"], capture_output=True, text=True)
    assert out.returncode == 2 and "population of 2 members" in out.stderr and "--member" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = subprocess.run([VACO, "evaluate", "--ckpt", ckpt, "--member", "2"], capture_output=True, text=True)
    assert out.returncode == 2 and "`--member` (2) must be in 0..1" in out.stderr


@pytest.mark.parametrize(
    "value,message",
    [
        ("0", r"`population` must be an integer >= 1 or a list of seeds, got 0"),
        ("[3, 3]", r"`population`: the members' seeds must differ, got \[3, 3\]"),
    ],
)
def test_a_bad_population_is_one_line_before_any_work(tmp_path, mlflow_uri, value, message):
    out = subprocess.run(
        [VACO, "fit", "--config", ENV, "--config", str(CONFIGS / "algo" / "vaco.yaml"), "--population", value],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), out.stderr
    assert "Seed set to" not in out.stdout + out.stderr and not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_a_member_whose_loss_turns_non_finite_stops_alone_and_the_others_are_still_their_solo_runs(
    tmp_path, mlflow_uri, capsys
):
    """Seed 7's batch of iteration 2 holds a NaN observation (tests/helpers/nan_collection.py): its
    member stops there, its run FAILED, one line names it; seed 5's member goes on to the end and is
    still seed 5's solo run bit for bit; `vaco fit` exits 1."""
    nan = ["--data.init_args.collection", '{"class_path": "helpers.nan_collection.NaNAt", "init_args": {"seed": 7}}']
    budget = ["--data.init_args.total_steps", str(3 * BATCH)]
    with pytest.raises(SystemExit) as stop:
        _fit(tmp_path / "pop", "vaco", "--population", "[5, 7]", *nan, *budget)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "population member 1 (seed 7) stopped" in line]
    assert len(lines) == 1 and "stopped at iteration 2: NonFiniteInputError" in lines[0], err
    assert "`values` contains 1 NaN" in lines[0] and "FAILED" in lines[0] and "the other 1 members go on" in lines[0]
    runs = {r.data.params["seed"]: r for r in _runs(mlflow_uri)}
    assert runs["7"].info.status == "FAILED" and runs["5"].info.status == "FINISHED"
    assert max(s for s, _ in metric_histories(mlflow_uri, runs["7"].info.run_id)["time/iteration"]) == BATCH
    _fit(tmp_path / "solo", "vaco", "--seed_everything", "5", *nan, *budget)
    solo = next(r for r in _runs(mlflow_uri) if POPULATION_TAG not in r.data.tags)
    assert metric_histories(mlflow_uri, runs["5"].info.run_id) == metric_histories(mlflow_uri, solo.info.run_id)
    together = _last(tmp_path / "pop", runs["5"].info.run_id)
    assert together["vaco"]["population_seeds"] == [5, 7]
    assert together["vaco"]["update_exact"] is True  # the CPU's layout, which a resume keeps on any device
    mine, theirs = _state(together, "members.0."), _state(_last(tmp_path / "solo", solo.info.run_id))
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


@pytest.mark.slow
def test_a_population_checkpoints_at_every_period_and_counts_its_steps_as_a_solo_run(tmp_path, mlflow_uri):
    """Lightning skips a checkpoint whose global step it has saved already: the population's
    optimiser steps must be counted (they were not: only the first periodic checkpoint was written,
    and a SIGTERM stop wrote none)."""
    from vaco.run.callbacks import IterationCheckpoint

    saved = []
    original = IterationCheckpoint._save_last_checkpoint

    def record(self, trainer, monitor):
        saved.append((int(trainer.lightning_module.version), trainer.global_step))
        return original(self, trainer, monitor)

    IterationCheckpoint._save_last_checkpoint = record
    try:
        _fit(tmp_path, "vaco", "--population", "2", "--data.init_args.total_steps", str(3 * BATCH))
    finally:
        IterationCheckpoint._save_last_checkpoint = original
    steps = 2 * 4  # update_epochs x num_minibatches, as a solo run counts them
    assert [v for v, _ in saved][:3] == [1, 2, 3] and [g for _, g in saved][:3] == [steps, 2 * steps, 3 * steps]


@pytest.mark.slow
def test_a_warp_population_steps_its_members_in_one_model_and_each_is_its_seed_run_alone(
    tmp_path, mlflow_uri, monkeypatch
):
    """On MuJoCo Warp (its CPU device) the members' worlds are blocks of one model stepped in lockstep
    (vaco.population.lockstep): seeds 5 and 6 together, 2 iterations then a resume to 3, against each seed's
    solo run: weights, normaliser and every metric but the timings equal."""
    from vaco.population.lockstep import Lockstep

    lockstep_rollouts = []
    original = Lockstep.rollout
    monkeypatch.setattr(Lockstep, "rollout", lambda self: lockstep_rollouts.append(1) or original(self))
    warp = [
        "--data.init_args.collection",
        '{"class_path": "vaco.data.warp.Warp", "init_args": {"evaluate_on": "gymnasium"}}',
        "--data.init_args.num_steps",
        "16",
    ]
    batch = 2 * 16
    pop, solo = tmp_path / "pop", tmp_path / "solo"
    _fit(
        pop,
        "vaco",
        *warp,
        "--population",
        "2",
        "--seed_everything",
        "5",
        "--data.init_args.total_steps",
        str(2 * batch),
    )
    members = sorted(_runs(mlflow_uri), key=lambda r: int(r.data.tags[MEMBER_TAG]))
    ckpt_path = pop / "checkpoints" / members[0].info.run_id / "last.ckpt"
    more = ["--data.init_args.total_steps", str(3 * batch)]
    _fit(pop, "vaco", *warp, "--population", "2", "--seed_everything", "5", "--ckpt_path", str(ckpt_path), *more)
    assert len(lockstep_rollouts) == 3  # every iteration collected both members in one model
    for seed in (5, 6):
        _fit(
            solo / str(seed),
            "vaco",
            *warp,
            "--seed_everything",
            str(seed),
            "--data.init_args.total_steps",
            str(2 * batch),
        )
    solo_runs = {r.data.params["seed"]: r for r in _runs(mlflow_uri) if POPULATION_TAG not in r.data.tags}
    together = load_checkpoint(str(ckpt_path))
    for m, seed in enumerate((5, 6)):
        run_id = solo_runs[str(seed)].info.run_id
        last = str(solo / str(seed) / "checkpoints" / run_id / "last.ckpt")
        _fit(solo / str(seed), "vaco", *warp, "--seed_everything", str(seed), "--ckpt_path", last, *more)
        mine, theirs = _state(together, f"members.{m}."), _state(_last(solo / str(seed), run_id))
        assert mine.keys() == theirs.keys() and int(theirs["version"]) == 3
        for key in theirs:
            assert torch.equal(mine[key], theirs[key]), (seed, key)
        assert metric_histories(mlflow_uri, members[m].info.run_id) == metric_histories(mlflow_uri, run_id), seed


@pytest.mark.slow
def test_an_envpool_population_is_each_seeds_run_alone(tmp_path, mlflow_uri):
    """On envpool's C++ pool the members collect one after another, each on its own pool: seeds 5
    and 6 together for 2 iterations, with evaluations on envpool, against each seed's solo run:
    weights, normaliser and every metric but the timings equal."""
    envpool = ["--config", str(CONFIGS / "collection" / "envpool.yaml"), "--data.init_args.total_steps", str(2 * BATCH)]
    pop, solo = tmp_path / "pop", tmp_path / "solo"
    _fit(pop, "vaco", *envpool, "--population", "2", "--seed_everything", "5")
    members = sorted(_runs(mlflow_uri), key=lambda r: int(r.data.tags[MEMBER_TAG]))
    together = load_checkpoint(str(pop / "checkpoints" / members[0].info.run_id / "last.ckpt"))
    for seed in (5, 6):
        _fit(solo / str(seed), "vaco", *envpool, "--seed_everything", str(seed))
    solo_runs = {r.data.params["seed"]: r for r in _runs(mlflow_uri) if POPULATION_TAG not in r.data.tags}
    for m, seed in enumerate((5, 6)):
        run_id = solo_runs[str(seed)].info.run_id
        mine, theirs = _state(together, f"members.{m}."), _state(_last(solo / str(seed), run_id))
        assert mine.keys() == theirs.keys() and int(theirs["version"]) == 2
        for key in theirs:
            assert torch.equal(mine[key], theirs[key]), (seed, key)
        histories = metric_histories(mlflow_uri, members[m].info.run_id)
        assert histories == metric_histories(mlflow_uri, run_id) and len(histories["eval/return"]) == 1, seed
