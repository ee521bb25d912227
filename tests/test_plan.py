"""A study plan's statistics (vaco.report.plan): group-sequential boundaries against published
constants and, independently, against the error rate they promise on simulated null studies and on
the committed runs with their labels swapped (where looking naively at every look does not keep it); Holm against a float64 step-down loop written
here; the plan block's one-line errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vaco.report.plan import boundaries, crossing_probability, holm, load_plan, nominal_levels

# Jennison and Turnbull (2000), Tables 2.1 and 2.3: two-sided alpha = 0.05, K equally spaced looks
POCOCK = {2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413}
OBRIEN_FLEMING = {2: 1.977, 3: 2.004, 4: 2.024, 5: 2.040}  # c_K, the last look's value


@pytest.mark.parametrize("looks", [2, 3, 4, 5])
def test_boundaries_match_the_published_constants(looks):
    seeds = list(range(1, looks + 1))
    assert boundaries(seeds, 0.05, "pocock") == pytest.approx([POCOCK[looks]] * looks, abs=1e-3)
    obf = boundaries(seeds, 0.05, "obrien-fleming")
    assert obf[-1] == pytest.approx(OBRIEN_FLEMING[looks], abs=1e-3)
    assert obf[0] == pytest.approx(OBRIEN_FLEMING[looks] * np.sqrt(looks), abs=2e-3)  # c / sqrt(t_1)
    assert boundaries([seeds[-1]], 0.05, "fixed") == pytest.approx([1.959964], abs=1e-5)


def test_one_look_spends_alpha_exactly():
    assert crossing_probability([10], [1.959964]) == pytest.approx(0.05, abs=1e-5)


def test_the_sequential_rule_keeps_its_error_rate_where_naive_looks_do_not():
    """The looks the 2x2 study actually had (10, 20, 28, 36 seeds): 40,000 simulated null studies
    (per-seed paired differences ~ N(0, 1), the normal model), each judged at every look."""
    looks = [10, 20, 28, 36]
    rng = np.random.default_rng(46)
    trials = 40_000
    diffs = rng.standard_normal((trials, looks[-1]))
    z = np.stack([diffs[:, :n].sum(1) / np.sqrt(n) for n in looks], axis=1)  # Z at each look
    se = np.sqrt(0.05 * 0.95 / trials)  # Monte Carlo error of a rate near alpha
    for spending in ("pocock", "obrien-fleming"):
        c = np.asarray(boundaries(looks, 0.05, spending))
        rate = float((np.abs(z) >= c).any(1).mean())
        assert abs(rate - 0.05) < 4 * se, (spending, rate)
    naive = float((np.abs(z) >= 1.959964).any(1).mean())  # "differs" at the first look where p < 0.05
    assert naive > 0.05 + 10 * se, naive
    levels = nominal_levels(looks, 0.05, "pocock")
    assert all(level == pytest.approx(levels[0]) for level in levels) and levels[0] < 0.02


def _iqm_rows(x: np.ndarray) -> np.ndarray:
    """rliable's IQM (scipy's 25% trimmed mean of all entries) of each leading row, vectorised."""
    flat = np.sort(x.reshape(x.shape[0], -1), axis=1)
    cut = int(0.25 * flat.shape[1])
    return flat[:, cut : flat.shape[1] - cut].mean(axis=1)


def _bootstrap_differences(cells: list[np.ndarray], reps: int, seed: int) -> np.ndarray:
    """vaco.report.robustness.paired_bootstrap of the IQM difference of drops, all resamples at once
    (the same draws: one (n x tasks) block of row indices per resample, shared by the four cells)."""
    n, tasks = cells[0].shape
    rows = np.random.default_rng(seed).integers(0, n, size=(reps, n, tasks))
    xr, xk, yr, yk = (_iqm_rows(c[rows, np.arange(tasks)]) for c in cells)
    return (yr - yk) - (xr - xk)


def test_on_the_committed_runs_with_labels_swapped_the_sequential_rule_keeps_its_rate():
    """Null studies made from the committed 2x2 runs (docs/data/lag_2x2.csv.gz, normalised as the
    report does): the small-step pair (vaco_tv_matched against ppo_clip_small_step) at K = 1 and 4,
    36 seeds x 2 tasks. In each of 600 studies the two arms' runs of every (seed, task) swap labels
    with probability 1/2 (with no difference of drops the labels are exchangeable; a task's runs are
    the units, as the report's bootstrap treats them: it resamples seeds per task) and the seeds come
    in a random order; the report's test (the paired bootstrap of the IQM difference of drops and its p-value,
    vaco.report.decision.bootstrap_p) is read at the study's real looks, 10, 20, 28 and 36 seeds.
    Against the Pocock boundary the false-"differs" rate stays within alpha + 3 Monte Carlo SE; one
    look at 36 seeds at alpha too; "differs at the first look with p < 0.05" exceeds alpha by more."""
    from helpers.runs import REPO
    from vaco import report as R
    from vaco.report.decision import bootstrap_p
    from vaco.report.report_cli import read_data_files
    from vaco.report.robustness import _iqm, paired_bootstrap, paired_cells

    runs, _ = read_data_files([str(REPO / "docs" / "data" / "lag_2x2.csv.gz")])
    report = R.build_report("null", runs, reps=10, seed=0)
    cells = [("vaco_tv_matched", 1), ("vaco_tv_matched", 4), ("ppo_clip_small_step", 1), ("ppo_clip_small_step", 4)]
    mats, _ = paired_cells(report, cells, report.tasks, runs=report.runs)
    assert mats[0].shape == (36, 2)
    # the vectorised bootstrap is the report's own, resample for resample
    mine = _bootstrap_differences(mats, 50, seed=3)
    theirs = paired_bootstrap(mats, lambda xr, xk, yr, yk: (_iqm(yr) - _iqm(yk)) - (_iqm(xr) - _iqm(xk)), 50, 3)
    np.testing.assert_allclose(mine, theirs[:, 0], rtol=0, atol=1e-12)

    looks, alpha, reps, studies = [10, 20, 28, 36], 0.05, 500, 600
    level = nominal_levels(looks, alpha, "pocock")[0]
    rng = np.random.default_rng(46)
    sequential = naive = fixed = 0
    for study in range(studies):
        swap = rng.random(mats[0].shape) < 0.5  # per run pair: (seed, task)
        order = rng.permutation(36)
        xr, xk = (np.where(swap, b, a)[order] for a, b in ((mats[0], mats[2]), (mats[1], mats[3])))
        yr, yk = (np.where(swap, a, b)[order] for a, b in ((mats[0], mats[2]), (mats[1], mats[3])))
        p = [
            bootstrap_p(_bootstrap_differences([c[:n] for c in (xr, xk, yr, yk)], reps, seed=study), 0.05)[0]
            for n in looks
        ]
        sequential += any(q <= level for q in p)
        naive += any(q < alpha for q in p)
        fixed += p[-1] < alpha
    se = np.sqrt(alpha * (1 - alpha) / studies)
    rates = {"pocock": sequential / studies, "naive": naive / studies, "fixed": fixed / studies}
    print(f"false-differs rates on label-swapped runs: {rates}")
    assert rates["pocock"] <= alpha + 3 * se, rates
    assert rates["fixed"] <= alpha + 3 * se, rates
    assert rates["naive"] > alpha + 3 * se, rates


def _holm_loop(p: list[float], alpha: float) -> list[bool]:
    """The textbook step-down: sort, reject p_(i) while p_(i) <= alpha / (m - i), stop at the first failure."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    rejected = [False] * m
    for rank, i in enumerate(order):
        if p[i] <= alpha / (m - rank):
            rejected[i] = True
        else:
            break
    return rejected


def test_holm_matches_the_step_down_loop():
    rng = np.random.default_rng(7)
    for _ in range(500):
        m = int(rng.integers(1, 9))
        p = [float(x) for x in rng.uniform(0, 0.08, m) ** rng.uniform(0.5, 2)]
        rejected, adjusted = holm(p, 0.05)
        assert rejected == _holm_loop(p, 0.05), p
        assert all(a >= q for a, q in zip(adjusted, p)) and all(a <= 1 for a in adjusted)
    assert holm([0.01, 0.04, 0.03], 0.05) == ([True, False, False], [0.03, 0.06, 0.06])


# one iteration of 2 envs x 64 steps a cell: the sweep tests below run real cells, quickly
TINY_CELL = {
    "data.init_args.num_envs": 2,
    "data.init_args.num_steps": 64,
    "data.init_args.total_steps": 128,
    "data.init_args.eval_episodes": 2,
    "data.init_args.eval_envs": 2,
    "model.init_args.update_epochs": 1,
    "model.init_args.num_minibatches": 2,
}

PLAN = {
    "family": [{"arm": "vaco", "against": "ppo_clip", "K": 16}],
    "margin": 0.05,
    "alpha": 0.05,
    "looks": [10, 20],
    "spending": "pocock",
}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"looks": [20, 10]}, r"`plan.looks` must be increasing seed counts"),
        ({"looks": [10, 40]}, r"`plan.looks`: the last look needs 40 seeds a cell, the grid has 20"),
        ({"spending": "bonferroni"}, r"`plan.spending` must be one of pocock, obrien-fleming, fixed"),
        ({"family": [{"arm": "vaco", "against": "spo", "K": 16}]}, r"`plan.family\[0\].against` \('spo'\)"),
        ({"family": [{"arm": "vaco", "against": "ppo_clip", "K": 1}]}, r"`plan.family\[0\].K` \(1\)"),
        ({"margin": 0}, r"`plan.margin` must be a number in \(0, 1\)"),
        ({"alph": 0.05}, r"`plan.alph` is not a plan field"),
        ({"references": {"hopper": [3000, 10]}}, r"`plan.references.hopper`: min \(3000\) must be below max"),
    ],
)
def test_a_bad_plan_names_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        load_plan({**PLAN, **change}, ["vaco", "ppo_clip"], [1, 4, 16], seeds=20)


def test_a_plan_has_an_identity_and_finds_its_look():
    plan = load_plan(PLAN, ["vaco", "ppo_clip"], [1, 4, 16], seeds=20)
    assert plan.look_of(9) is None and plan.look_of(10) == 0 and plan.look_of(25) == 1
    other = load_plan({**PLAN, "margin": 0.1}, ["vaco", "ppo_clip"], [1, 4, 16], seeds=20)
    assert plan.digest != other.digest and len(plan.digest) == 12


def test_a_sweeps_plan_is_declared_with_its_first_run_and_cannot_change_after(tmp_path, mlflow_uri):
    """A real sweep (one tiny cell run): the parent run records the plan, its digest and when it was
    declared; the same file with another margin, or without its plan, is refused in one line before
    anything runs."""
    import subprocess

    import mlflow
    import yaml

    from helpers.runs import CONFIGS, VACO

    sweep = {
        "experiment": "planned",
        "jobs": 1,
        "configs_dir": str(CONFIGS),
        "overrides": TINY_CELL,
        "defaults": {"env": "inverted_pendulum", "K": [1, 2], "seed": [1, 2]},
        "grid": {"main": {"algorithm": ["vaco", "ppo_clip"]}},
        "plan": {"family": [{"arm": "vaco", "against": "ppo_clip", "K": 2}], "looks": [2], "margin": 0.05},
    }
    path = tmp_path / "planned.yaml"
    path.write_text(yaml.safe_dump(sweep))

    def run(*args):
        return subprocess.run(
            [VACO, "sweep", "--config", str(path), "--out", str(tmp_path / "out"), *args],
            capture_output=True,
            text=True,
        )

    first = run("--only", "vaco-inverted_pendulum-K1-s1")
    assert first.returncode == 0, first.stdout + first.stderr
    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("planned").experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.`vaco.sweep.parent` = 'true'")
    tags = parent.data.tags
    assert tags["vaco.plan.declared"].endswith("UTC") and len(tags["vaco.plan.digest"]) == 12
    assert '"looks": [2]' in tags["vaco.plan"] and '"spending": "fixed"' in tags["vaco.plan"]
    path.write_text(yaml.safe_dump({**sweep, "plan": {**sweep["plan"], "margin": 0.1}}))
    changed = run("--dry-run")
    assert changed.returncode == 2 and "`plan`: experiment 'planned' was declared with another plan" in changed.stderr
    assert tags["vaco.plan.digest"] in changed.stderr and len(changed.stderr.strip().splitlines()) == 1
    path.write_text(yaml.safe_dump({k: v for k, v in sweep.items() if k != "plan"}))
    dropped = run("--dry-run")
    assert dropped.returncode == 2 and "this file's is none" in dropped.stderr
    path.write_text(yaml.safe_dump(sweep))
    again = run("--dry-run")
    assert again.returncode == 0, again.stderr


def test_the_report_judges_the_family_with_holm_at_the_look_reached():
    """Synthetic runs (tests/test_robustness.py: ppo_clip loses 0.04 a unit of K, vaco 0.02, 6 seeds,
    2 tasks): the family's p-values are the difference-of-drops verdicts' own, Holm-adjusted here by
    the loop above, and judged at the nominal level of the look that 6 seeds reach."""
    from test_robustness import _runs
    from vaco import report as R
    from vaco.report.planned import judge_plan, plan_lines

    report = R.build_report("planned", _runs(), reps=200, seed=0)
    raw = {"family": [{"arm": "vaco", "against": "ppo_clip", "K": k} for k in (4, 16)], "looks": [3, 6]}
    plan = load_plan({**raw, "spending": "pocock"}, ["vaco", "ppo_clip"], [1, 4, 16], seeds=6)
    judged = judge_plan(plan, report, declared="2026-11-28 00:00:00 UTC")
    level = nominal_levels([3, 6], 0.05, "pocock")[1]
    assert judged.look == 1 and judged.seeds == 6 and judged.level == pytest.approx(level)
    lag = R.robustness(report, baseline="ppo_clip")
    raw_p = [lag.interactions[("vaco", k)].verdict.p_differs for k in (4, 16)]
    assert [v.p_differs for v in judged.verdicts] == raw_p
    m = len(raw_p)
    by_loop = sorted(range(m), key=lambda i: raw_p[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(by_loop):
        running = max(running, min(1.0, (m - rank) * raw_p[i]))
        adjusted[i] = running
    assert [v.p_differs_holm for v in judged.verdicts] == pytest.approx(adjusted)
    assert [v.word for v in judged.verdicts] == ["differs" if a <= level else "undecided" for a in adjusted]
    assert judged.verdicts[1].word == "differs" and judged.verdicts[1].estimate > 0
    lines = plan_lines(judged)
    assert "Holm at look 2 of 2 (6 seeds" in lines[0] and "declared 2026-11-28" in lines[0]
    assert lines[-1].startswith("every other verdict of this report is exploratory")
    early = load_plan({**raw, "looks": [8, 10]}, ["vaco", "ppo_clip"], [1, 4, 16], seeds=10)
    before = judge_plan(early, report, declared=None)
    assert before.look is None and {v.word for v in before.verdicts} == {"before the first look"}
    assert "declared after the runs: its verdicts are exploratory" in plan_lines(before)[0]


def test_until_decided_runs_the_looks_in_turn_and_keeps_each_looks_verdicts(tmp_path, mlflow_uri):
    """A small plan end to end (real cells, populations of 2): look 1 runs the first 2 seeds of every
    cell and is judged before any cell of look 2 starts; with 2 and then 4 seed pairs nothing can be
    decided at the Pocock level, so both looks run and the last one ends it; each look's verdicts are
    a tag and an artifact of the parent run; a rerun skips every finished cell."""
    import subprocess

    import mlflow
    import yaml

    from helpers.runs import CONFIGS, VACO

    sweep = {
        "experiment": "looks",
        "jobs": 2,
        "population": 2,
        "configs_dir": str(CONFIGS),
        "overrides": TINY_CELL,
        "defaults": {"env": "inverted_pendulum", "K": [1, 2], "seed": [1, 2, 3, 4]},
        "grid": {"main": {"algorithm": ["vaco", "ppo_clip"]}},
        "plan": {"family": [{"arm": "vaco", "against": "ppo_clip", "K": 2}], "looks": [2, 4], "spending": "pocock"},
    }
    path = tmp_path / "looks.yaml"
    path.write_text(yaml.safe_dump(sweep))
    command = [VACO, "sweep", "--config", str(path), "--out", str(tmp_path / "out"), "--until-decided"]
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    text = out.stdout
    first, second = text.index("look 1 of 2: the first 2 seeds"), text.index("look 2 of 2: the first 4 seeds")
    judged_first = text.index("study plan", first)
    assert first < judged_first < second  # look 1 judged before look 2 starts
    assert "-s3" not in text[first:second] and "-s1+2" in text[first:second]
    assert "Holm at look 1 of 2 (2 seeds" in text and "Holm at look 2 of 2 (4 seeds" in text
    assert "the last look (4 seeds) is reached" in text
    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("looks").experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.`vaco.sweep.parent` = 'true'")
    assert parent.data.tags["vaco.plan.look1"].startswith("2 seeds: vaco vs ppo_clip at K=2: ")
    assert parent.data.tags["vaco.plan.look2"].startswith("4 seeds: ")
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "plan")}
    assert artifacts == {"plan/look1.md", "plan/look2.md"}
    runs = [r for r in client.search_runs([experiment]) if "vaco.sweep.cell" in r.data.tags]
    assert len(runs) == 16 and {r.info.status for r in runs} == {"FINISHED"}
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0 and "start " not in again.stdout, again.stdout[-3000:]


def test_a_plans_fixed_references_normalise_every_score_and_do_not_move_as_runs_are_added(tmp_path):
    """A plan's ``references`` (task -> [min, max], fixed numbers) replace the report's own rule for
    the tasks they name: every run's normalised score is (final - min) / (max - min) with the plan's
    numbers (checked here by hand), and a run added far above the others leaves every other run's
    score where it was (the runs' own rule rescales them all). `vaco report --data --plan` applies
    them and says so."""
    import yaml

    from test_robustness import _runs
    from vaco import report as R

    runs = [r for r in _runs() if r.algorithm in ("vaco", "ppo_clip")]
    refs = {"Hopper-v5": (100.0, 900.0), "HalfCheetah-v5": (-50.0, 2500.0)}
    report = R.build_report("fixed", runs, reps=50, fixed_bounds=refs)
    for run in runs:
        low, high = refs[run.env]
        assert report.normalized[run.run_id] == pytest.approx((run.score()[1][-1] - low) / (high - low), rel=1e-12)
    steps, values = runs[0].score()
    outlier = dataclasses.replace(
        runs[0], run_id="far-above", seed=99, histories={**runs[0].histories, "eval/return": (steps, values * 10)}
    )
    again = R.build_report("fixed", [*runs, outlier], reps=50, fixed_bounds=refs)
    assert {k: v for k, v in again.normalized.items() if k != "far-above"} == report.normalized
    own = R.build_report("own", runs, reps=50)
    own_again = R.build_report("own", [*runs, outlier], reps=50)
    moved = [k for k in own.normalized if own.normalized[k] != own_again.normalized[k]]
    assert len(moved) > len(runs) // 3  # the runs' own rule: the outlier rescales its task

    data = R.save_runs(runs, tmp_path / "runs.csv.gz")
    plan = tmp_path / "plan.yaml"
    family = [{"arm": "vaco", "against": "ppo_clip", "K": 16}]
    references = {task: list(bounds) for task, bounds in refs.items()}
    plan.write_text(yaml.safe_dump({"plan": {"family": family, "looks": [6], "references": references}}))
    out = tmp_path / "report"
    argv = ["--data", str(data), "--plan", str(plan), "--reps", "50", "--no-sensitivity", "--no-mlflow"]
    assert R.main([*argv, "--out", str(out)]) == 0
    plan_md = (out / "plan.md").read_text()
    assert (
        "scores normalised by the plan's fixed references: HalfCheetah-v5 [-50, 2500], Hopper-v5 [100, 900]" in plan_md
    )
    assert "Hopper-v5: normalised by the plan's fixed references [100, 900]" in (out / "summary.md").read_text()
