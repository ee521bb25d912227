"""A study plan's statistics (vaco.study.plan): group-sequential boundaries against published
constants and, independently, against the error rate they promise on simulated null studies and on
the committed runs with their labels swapped (where looking naively at every look does not keep it); Holm against a float64 step-down loop written
here; the plan block's one-line errors."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from scipy.stats import norm, trim_mean

from vaco.study.plan import (
    boundaries,
    crossing_probability,
    holm,
    holm_levels,
    load_plan,
    nominal_levels,
    schedule,
    sequential_holm,
    smallest_p,
    undecidable_looks,
)

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


@pytest.mark.slow
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
    from vaco.report.robustness import iqm, paired_bootstrap, paired_cells
    from vaco.report.runs import read_data_files

    runs, _ = read_data_files([str(REPO / "docs" / "data" / "lag_2x2.csv.gz")])
    report = R.build_report("null", runs, reps=10, seed=0)
    cells = [("vaco_tv_matched", 1), ("vaco_tv_matched", 4), ("ppo_clip_small_step", 1), ("ppo_clip_small_step", 4)]
    mats, _ = paired_cells(report, cells, report.tasks, runs=report.runs)
    assert mats[0].shape == (36, 2)
    # the vectorised bootstrap is the report's own, resample for resample
    mine = _bootstrap_differences(mats, 50, seed=3)
    theirs = paired_bootstrap(mats, lambda xr, xk, yr, yk: (iqm(yr) - iqm(yk)) - (iqm(xr) - iqm(xk)), 50, 3)
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


def test_holm_gives_statsmodels_adjusted_p_values():
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(8)
    for m in (1, 2, 3, 5, 8):  # a few calls: statsmodels runs gc.collect() on each
        p = rng.uniform(0, 0.1, m)
        p[rng.integers(m)] = p[0]  # a tie
        reject, adjusted, _, _ = multipletests(p, alpha=0.05, method="holm")
        ours = holm(list(p), 0.05)
        assert ours[0] == [bool(r) for r in reject]
        np.testing.assert_allclose(ours[1], adjusted, rtol=0, atol=1e-15)


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
    "test": "bootstrap",
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
        ({"family": [{"arm": "vaco", "against": "vaco", "K": 16}]}, r"`plan.family\[0\]` compares 'vaco' with itself"),
        ({"floor": 0}, r"`plan.floor` must be a normalised score in \(0, 1\)"),
        ({"test": None}, r"`plan.test` must be declared: randomisation .* or bootstrap"),
        ({"test": "t-test"}, r"`plan.test` must be declared: .*got 't-test'"),
        ({"score": "last-1"}, r"`plan.score` must be final .*, last-N .* or auc, got 'last-1'"),
        ({"score": "last-03"}, r"`plan.score` must be final .*got 'last-03'"),
        ({"score": "mean"}, r"`plan.score` must be final .*got 'mean'"),
        ({"looks": list(range(2, 13))}, r"`plan.looks`: 11 looks; a group-sequential plan takes at most 10"),
        # absurd values, each one line naming its field
        ({"alpha": 0.9}, r"`plan.alpha` must be a number in \(0, 0.5\), got 0.9"),
        ({"alpha": float("nan")}, r"`plan.alpha` must be a number in \(0, 0.5\), got nan"),
        ({"margin": float("nan")}, r"`plan.margin` must be a number in \(0, 1\)"),
        ({"looks": [1.5, 20]}, r"`plan.looks` must be increasing seed counts >= 2"),
        ({"looks": [True, 20]}, r"`plan.looks` must be increasing seed counts >= 2"),
        ({"looks": []}, r"`plan.looks` must be increasing seed counts >= 2"),
        ({"family": [PLAN["family"][0]] * 2}, r"`plan.family` lists a comparison twice"),
        ({"references": {"Hopper-v5": [float("nan"), 1]}}, r"`plan.references.Hopper-v5`: min \(nan\) must be below"),
        ({"floor": float("inf")}, r"`plan.floor` must be a normalised score in \(0, 1\)"),
        ({"estimand": "median"}, r"`plan.estimand` must be pooled .* or task-mean .*got 'median'"),
        ({"estimand": "task-mean"}, r"`plan.estimand: task-mean` .* declare `plan.references`"),
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


@pytest.mark.slow
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
        "plan": {
            "family": [{"arm": "vaco", "against": "ppo_clip", "K": 2}],
            "looks": [2],
            "margin": 0.05,
            "test": "bootstrap",
        },
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


def _sequential_holm_loop(p: list[float], looks: list[int], look: int, alpha: float, before: list[bool]) -> list[bool]:
    """The group-sequential Holm step-down written out here: the open hypotheses by p; the i-th of r
    is rejected if p <= 2 (1 - Phi(c)) where c is the Pocock constant for alpha / (r - i) over the
    looks (from :func:`boundaries`, checked against the published tables above)."""
    done = list(before)
    open_ = sorted([i for i in range(len(p)) if not done[i]], key=lambda i: p[i])
    for rank, i in enumerate(open_):
        c = boundaries(looks, alpha / (len(open_) - rank), "pocock")[look]
        if p[i] <= 2.0 * (1.0 - norm.cdf(c)):
            done[i] = True
        else:
            break
    return done


def test_sequential_holm_is_the_step_down_at_the_boundaries_for_alpha_over_r():
    looks = [10, 20, 28, 36]
    levels = holm_levels(looks, 0.05, "pocock", 4)
    assert [levels[r - 1][0] for r in (4, 3, 2, 1)] == pytest.approx([0.00429, 0.00581, 0.00893, 0.01876], abs=5e-6)
    rng = np.random.default_rng(11)
    for _ in range(300):
        p = list(rng.uniform(0, 0.03, 4) ** rng.uniform(0.5, 2))
        look = int(rng.integers(0, 4))
        before = list(rng.random(4) < 0.2)
        assert sequential_holm(p, levels, look, before) == _sequential_holm_loop(p, looks, look, 0.05, before), p
    assert sequential_holm([float("nan"), 0.0001], levels, 3) == [False, True]  # a NaN p rejects nothing
    assert schedule(looks, [10, 15], 20) == ([10, 15, 20, 28, 36], 2)  # a reading at 15 seeds was a look
    assert schedule(looks, [10, 20], 20) == ([10, 20, 28, 36], 1)  # a second reading at 20 is the same look
    assert schedule(looks, [], 8) == (looks, None)


def _family_rate(p: np.ndarray, levels) -> float:
    """The share of null studies (p: studies x comparisons x looks) in which vaco's rule says
    "differs" for any comparison at any look (a rejection stands; the study goes on to the last look)."""
    m, n_looks = p.shape[1], p.shape[2]
    false = 0
    for study in p:
        rejected = [False] * m
        for k in range(n_looks):
            rejected = sequential_holm(study[:, k].tolist(), levels, k, rejected)
        false += any(rejected)
    return false / len(p)


def _null_studies(rho: float, looks: list[int], m: int, studies: int, seed: int) -> np.ndarray:
    """Two-sided p of m comparisons at each look under the null (normal model): per seed, comparison j's
    paired difference is sqrt(1 - rho) e_j + sqrt(rho) c (c shared: a common baseline arm), Z at look k
    the standardised sum over the first n_k seeds."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(studies // 25_000):
        e = rng.standard_normal((25_000, m, looks[-1]))
        c = rng.standard_normal((25_000, 1, looks[-1]))
        sums = np.cumsum(np.sqrt(1 - rho) * e + np.sqrt(rho) * c, axis=2)
        z = np.stack([sums[:, :, n - 1] / np.sqrt(n) for n in looks], axis=2)
        out.append(2 * norm.sf(np.abs(z)))
    return np.concatenate(out)


@pytest.mark.slow
def test_the_family_wise_rate_holds_over_correlated_comparisons_and_looks_and_the_test_catches_wrong_boundaries():
    """200,000 null studies of four correlated comparisons (rho 0.25) over four unequal looks: the
    rule's family-wise false-"differs" rate stays within alpha + 3 Monte Carlo SE. The same check
    fails for the rule with a boundary computed for three looks used at four, and, on independent
    comparisons, for Holm's adjusted p judged against the alpha-level boundary (the shortcut the
    report once took: about 5.3% here)."""
    looks, alpha, m, studies = [10, 20, 28, 36], 0.05, 4, 200_000
    limit = alpha + 3 * np.sqrt(alpha * (1 - alpha) / studies)
    right = holm_levels(looks, alpha, "pocock", m)
    fewer = [row + [row[-1]] for row in holm_levels(looks[:3], alpha, "pocock", m)]  # 3 looks' boundary at 4
    alpha_level = nominal_levels(looks, alpha, "pocock")
    shortcut = [[level / r for level in alpha_level] for r in range(1, m + 1)]  # adjusted p <= the alpha level
    correlated = _null_studies(0.25, looks, m, studies, seed=59)
    rates = {"right": _family_rate(correlated, right), "fewer looks": _family_rate(correlated, fewer)}
    independent = _null_studies(0.0, looks, m, studies, seed=60)
    rates["right, independent"] = _family_rate(independent, right)
    rates["shortcut, independent"] = _family_rate(independent, shortcut)
    print(f"family-wise false-differs rates (limit {limit:.4f}): {rates}")
    assert rates["right"] <= limit and rates["right, independent"] <= limit, rates
    assert rates["fewer looks"] > limit and rates["shortcut, independent"] > limit, rates


def test_a_look_that_cannot_decide_is_named_with_the_seeds_it_needs():
    assert smallest_p(3, 2) == pytest.approx(2 / 64) and smallest_p(12, 2, reps=2000) == pytest.approx(2 / 2001)
    plan = load_plan({**PLAN, "looks": [3, 10]}, ["vaco", "ppo_clip"], [1, 4, 16], seeds=20)
    (line,) = undecidable_looks(plan, tasks=2)
    level = nominal_levels([3, 10], 0.05, "pocock")[0]
    assert line.startswith("`plan.looks[0]` (3 seeds): with 2 tasks the smallest p") and f"{level:.3g}" in line
    least = min(n for n in range(3, 10) if 2 / 2 ** (2 * n) <= level)
    assert line.endswith(f"a look needs at least {least} seeds")
    assert undecidable_looks(load_plan(PLAN, ["vaco", "ppo_clip"], [1, 4, 16], seeds=20), tasks=2) == []


@pytest.mark.slow
def test_the_report_judges_the_family_by_sequential_holm_and_splits_each_difference():
    """Synthetic runs (tests/test_robustness.py: ppo_clip loses 0.04 a unit of K, vaco 0.02, 6 seeds,
    2 tasks): the family's p-values are the difference-of-drops verdicts' own, judged by the step-down
    written above at the look 6 seeds reach; each difference is the gap at K plus the gap at K = 1
    (IQMs by hand)."""
    from test_robustness import _iqm, _runs
    from vaco import report as R
    from vaco.study.judge import Judgement, judge_plan, plan_lines

    report = R.build_report("planned", _runs(), reps=200, seed=0)
    raw = {
        "family": [{"arm": "vaco", "against": "ppo_clip", "K": k} for k in (4, 16)],
        "looks": [3, 6],
        "test": "bootstrap",
    }
    plan = load_plan({**raw, "spending": "pocock"}, ["vaco", "ppo_clip"], [1, 4, 16], seeds=6)
    judged = judge_plan(plan, report, declared="2026-11-28 00:00:00 UTC")
    assert judged.look == 1 and judged.seeds == 6 and judged.looks == (3, 6)
    lag = R.robustness(report, baseline="ppo_clip")
    raw_p = [lag.interactions[("vaco", k)].verdict.p_differs for k in (4, 16)]
    assert [v.p_differs for v in judged.verdicts] == raw_p
    rejected = _sequential_holm_loop(raw_p, [3, 6], 1, 0.05, [False, False])
    assert [v.word == "differs" for v in judged.verdicts] == rejected
    assert judged.verdicts[1].word == "differs" and judged.verdicts[1].estimate > 0
    score = {(r.algorithm, r.K, r.env, r.seed): report.normalized[r.run_id] for r in report.runs}
    for v, K in zip(judged.verdicts, (4, 16)):
        iqm = {
            (a, k): _iqm(
                [score[(a, k, t, s)] for t, _ in (("Hopper-v5", 0), ("HalfCheetah-v5", 0)) for s in range(1, 7)]
            )
            for a in ("vaco", "ppo_clip")
            for k in (1, K)
        }
        assert v.gap_at_k == pytest.approx(iqm[("vaco", K)] - iqm[("ppo_clip", K)], abs=1e-12)
        assert v.gap_at_ref == pytest.approx(iqm[("ppo_clip", 1)] - iqm[("vaco", 1)], abs=1e-12)
        assert v.gap_at_k + v.gap_at_ref == pytest.approx(v.estimate, abs=1e-12)
    lines = plan_lines(judged)
    assert "group-sequential Holm at look 2 of 2 (6 seeds)" in lines[0] and "declared 2026-11-28" in lines[0]
    assert "gap at K " in lines[1] and "gap at K=1 " in lines[1]
    assert lines[-1].startswith("every other verdict of this report is exploratory")
    early = load_plan({**raw, "looks": [8, 10]}, ["vaco", "ppo_clip"], [1, 4, 16], seeds=10)
    before = judge_plan(early, report, declared=None)
    assert before.look is None and {v.word for v in before.verdicts} == {"before the first look"}
    assert "declared after the runs: its verdicts are exploratory" in plan_lines(before)[0]
    # looks taken that the plan did not declare: the boundary is theirs, and the lines say so
    late = load_plan({**raw, "looks": [3, 10]}, ["vaco", "ppo_clip"], [1, 4, 16], seeds=10)
    read_at_4 = Judgement(4, "2026-11-28 01:00:00 UTC", "report", {})
    taken = judge_plan(late, report, declared="2026-11-28 00:00:00 UTC", earlier=[read_at_4])
    assert taken.looks == (4, 6, 10) and taken.look == 1
    assert any("the looks differ from the declared ones (3, 10)" in line for line in plan_lines(taken))
    # a verdict reached at an earlier look stands, and its alpha passes on
    decided = Judgement(4, "2026-11-28 01:00:00 UTC", "until-decided", {"vaco vs ppo_clip at K=16": "differs"})
    carried = judge_plan(late, report, declared="2026-11-28 00:00:00 UTC", earlier=[decided])
    assert carried.verdicts[1].word == "differs" and carried.verdicts[1].decided_at == 4
    expected = _sequential_holm_loop(raw_p, [4, 6, 10], 1, 0.05, [False, True])
    assert carried.verdicts[0].word == ("differs" if expected[0] else "undecided")


def _lag_runs(losses: dict[str, float], seeds: int, levels: dict[str, float] | None = None, seed: int = 0):
    """Runs of each arm on 2 tasks at K in {1, 4}, ``seeds`` seeds: normalised-scale level minus
    loss x K, with a shared per-seed effect (paired) and small noise; fixed references [0, 1000]."""
    from test_robustness import _run

    rng = np.random.default_rng(seed)
    runs = []
    for env in ("Hopper-v5", "HalfCheetah-v5"):
        effect = rng.normal(0, 0.05, seeds)
        for algo, loss in losses.items():
            for K in (1, 4):
                for s in range(seeds):
                    level = (levels or {}).get(algo, 0.6)
                    value = 1000 * (level - loss * K + effect[s] + rng.normal(0, 0.02))
                    runs.append(_run(algo, env, K, s + 1, value))
    return runs


def test_a_look_after_a_decision_counts_the_seeds_of_the_open_comparisons_only():
    """A comparison decided at look 1 (12 seeds) gets no more seeds: at look 2 its arm has 12 while
    the open comparison's arms have 24. The look is the 24-seed one (the open comparison is judged at
    look 2's Holm level for a family of one open hypothesis), the decided verdict is carried; counting
    the fewest seeds of any comparison would read it as look 1 again. The sweep's look runs the open
    comparison's arms only, at its K and the reference K."""
    from vaco import report as R
    from vaco.study.judge import Judgement, judge_plan
    from vaco.study.looks import look_needs
    from vaco.sweep.grid import Cell

    refs = {"Hopper-v5": (0.0, 1000.0), "HalfCheetah-v5": (0.0, 1000.0)}
    runs = _lag_runs({"vaco": 0.02, "ppo_clip": 0.045, "spo": 0.04}, seeds=24)
    runs = [r for r in runs if not (r.algorithm == "vaco" and r.seed > 12)]
    report = R.build_report("pruned", runs, reps=2000, fixed_bounds=refs)
    family = [{"arm": a, "against": "ppo_clip", "K": 4} for a in ("vaco", "spo")]
    raw = {"family": family, "looks": [12, 24, 36], "spending": "pocock", "margin": 0.05, "test": "bootstrap"}
    plan = load_plan(raw, ["vaco", "ppo_clip", "spo"], [1, 4], seeds=36)
    look1 = Judgement(12, "2026-12-01 00:00:00 UTC", "until-decided", {"vaco vs ppo_clip at K=4": "differs"})
    judged = judge_plan(plan, report, declared="2026-11-30 00:00:00 UTC", earlier=[look1])
    assert judged.seeds == 24 and judged.look == 1 and judged.looks == (12, 24, 36)
    carried, spo = judged.verdicts
    assert carried.word == "differs" and carried.decided_at == 12 and carried.seeds == 12
    assert spo.seeds == 24 and spo.level_differs == pytest.approx(holm_levels([12, 24, 36], 0.05, "pocock", 1)[0][1])
    assert judged.open == ([] if spo.word in ("differs", "equivalent") else [plan.family[1]])
    # without the record of look 1 nothing is carried: the fewest seeds (12) are the look
    assert judge_plan(plan, report, declared="2026-11-30 00:00:00 UTC", earlier=[]).seeds == 12

    def cell(algorithm, K):
        return Cell(algorithm, algorithm, "Hopper-v5", K, 1, (), True)

    open_ = [plan.family[1]]
    assert [look_needs(cell(a, k), open_, 1) for a in ("vaco", "ppo_clip", "spo") for k in (1, 4, 16)] == [
        False, False, False, True, True, False, True, True, False,
    ]  # fmt: skip


def test_status_says_which_look_runs_and_how_much_of_it_has_finished():
    """`vaco sweep --status` of a planned sweep (the lag benchmark's file): the look --until-decided
    runs is the first not recorded, counted over that look's cells only (the first 12 seeds of every
    cell at look 1; at look 2 the first 24 of the open comparisons' arms at K = 4 and 1, nothing at
    K = 16), with the running ones; a `vaco report` reading is not a look; a settled family or the
    last look runs nothing. The counts here come from the cells' coordinates, not from look_cells."""
    from helpers.runs import REPO
    from vaco import sweep as S
    from vaco.study.judge import Judgement
    from vaco.study.looks import look_progress

    sweep = S.load_sweep(REPO / "configs/sweeps/lag_bench.yaml")
    plan, cells = sweep.plan, S.expand(sweep)
    labels = [c.label() for c in plan.family]
    states = {c.id: "finished" if c.seed <= 4003 else "running" if c.seed == 4004 else "new" for c in cells}
    states.update({c.id: "finished" for c in cells if c.algorithm == "ppo_clip" and c.seed <= 4020})
    look1 = [c for c in cells if c.seed <= 4012]
    assert len(look1) == 12 * 2 * (2 * 12 + 8)
    done1 = sum(c.seed <= 4003 or c.algorithm == "ppo_clip" for c in look1)
    running1 = sum(c.seed == 4004 and c.algorithm != "ppo_clip" for c in look1)
    said = (
        f"look 1 of 3 (12 seeds): {done1} of its {len(look1)} cells finished, {running1} running; looks recorded: none"
    )
    report = Judgement(12, "2026-12-05 00:00:00 UTC", "report", dict.fromkeys(labels, "differs"))
    assert look_progress(plan, cells, states, []) == said
    assert look_progress(plan, cells, states, [report]) == said

    # look 1 recorded: VACO vs PPO-clip differs, the other three go on to look 2 with their arms only
    words = {labels[0]: "differs", **dict.fromkeys(labels[1:], "undecided")}
    recorded = [Judgement(12, "2026-12-05 00:00:00 UTC", "until-decided", words), report]
    arms = {"vaco", "decoupled_ppo", "ppo_clip", "ppo_ewma"}
    look2 = [c for c in cells if c.algorithm in arms and c.K in (1, 4) and c.seed <= 4024]
    assert len(look2) == 4 * 2 * 2 * 24
    done2 = sum(c.seed <= 4003 or (c.algorithm == "ppo_clip" and c.seed <= 4020) for c in look2)
    running2 = sum(c.seed == 4004 and c.algorithm != "ppo_clip" for c in look2)
    assert look_progress(plan, cells, states, recorded) == (
        f"look 2 of 3 (24 seeds, the arms of {'; '.join(labels[1:])}): {done2} of its {len(look2)} cells finished, "
        f"{running2} running; looks recorded: 12 seeds"
    )
    settled = Judgement(
        24, "2026-12-06 00:00:00 UTC", "until-decided", {**words, **dict.fromkeys(labels[1:], "equivalent")}
    )
    assert look_progress(plan, cells, states, [*recorded, settled]).startswith(
        "every primary comparison is decided (looks recorded: 12 seeds, 24 seeds)"
    )
    last = [Judgement(s, "2026-12-06 00:00:00 UTC", "until-decided", words) for s in (12, 24, 36)]
    assert look_progress(plan, cells, states, last).startswith("the last look (36 seeds) is recorded")


@pytest.mark.slow
def test_the_equivalent_branch_and_the_floor_rule():
    """Equivalent: two arms that lose the same (12 seeds, 2 tasks, margin 0.05) are declared
    equivalent by the step-down on the TOST p; an arm that loses 0.075 more at K = 4 differs. The floor: a
    comparison whose arms both score below the plan's floor at K is "at the floor: uninformative",
    counts as p = 1 in the family (its alpha is not freed), and the other is judged as before."""
    from vaco import report as R
    from vaco.study.judge import FLOOR_WORD, judge_plan

    refs = {"Hopper-v5": (0.0, 1000.0), "HalfCheetah-v5": (0.0, 1000.0)}
    runs = _lag_runs({"vaco": 0.02, "ppo_clip": 0.02, "spo": 0.045}, seeds=12)
    report = R.build_report("eq", runs, reps=2000, fixed_bounds=refs)
    family = [{"arm": a, "against": "ppo_clip", "K": 4} for a in ("vaco", "spo")]
    plan = load_plan(
        {"family": family, "looks": [12], "margin": 0.05, "test": "bootstrap"},
        ["vaco", "ppo_clip", "spo"],
        [1, 4],
        seeds=12,
    )
    same, worse = judge_plan(plan, report, declared="now").verdicts
    assert same.word == "equivalent" and same.p_equivalent <= same.level_equivalent, same
    assert worse.word == "differs" and worse.estimate == pytest.approx(-0.075, abs=0.02), worse
    # at K = 4 the third arm sits near 0: with a floor of 0.1 its comparison is not judged
    low = _lag_runs({"vaco": 0.02, "ppo_clip": 0.02, "a2c": 0.148}, seeds=12, levels={"a2c": 0.6})
    floor_runs = [r for r in low if r.algorithm != "ppo_clip"] + [
        dataclasses.replace(
            r,
            algorithm="ppo_clip",
            run_id=r.run_id + "-low",
            histories={
                **r.histories,
                "eval/return": (r.score()[0], r.score()[1] * 0 + 30.0 if r.K == 4 else r.score()[1]),
            },
        )
        for r in low
        if r.algorithm == "ppo_clip"
    ]
    report = R.build_report("floor", floor_runs, reps=2000, fixed_bounds=refs)
    family = [{"arm": a, "against": "ppo_clip", "K": 4} for a in ("vaco", "a2c")]
    raw = {"family": family, "looks": [12], "margin": 0.05, "test": "bootstrap"}
    floored = load_plan({**raw, "floor": 0.1}, ["vaco", "ppo_clip", "a2c"], [1, 4], seeds=12)
    judged = judge_plan(floored, report, declared="now")
    assert judged.verdicts[1].word == FLOOR_WORD and max(judged.verdicts[1].levels_at_k) < 0.1
    assert judged.verdicts[0].word != FLOOR_WORD
    # the judged one met the level of a family of two (the floored one kept its share)
    assert judged.verdicts[0].level_differs == pytest.approx(holm_levels([12], 0.05, "fixed", 2)[1][0])
    plain = judge_plan(load_plan(raw, ["vaco", "ppo_clip", "a2c"], [1, 4], seeds=12), report, declared="now")
    assert plain.verdicts[1].word != FLOOR_WORD
    with pytest.raises(ValueError, match=r"`plan.floor` must be a normalised score in \(0, 1\)"):
        load_plan({**raw, "floor": 2}, ["vaco", "ppo_clip", "a2c"], [1, 4], seeds=12)


@pytest.mark.slow
def test_until_decided_stops_early_resumes_and_normalises_by_the_references(tmp_path, mlflow_uri):
    """A small plan end to end (real cells, populations): 7 seeds a cell at look 1 of [7, 14]. One
    iteration a cell: the two arms' drops are equal seed by seed, so at look 1 they are equivalent
    within 0.05 (the exact sign-flip TOST p is 1/128) and the sweep stops before any seed of look 2
    starts. The look is scored by the plan's fixed references ([-10000, 10000] on a task whose runs
    score 4-16: every normalised score is 0.500), where the runs' own min-max rule gives other
    scores. A first call stopped by --stop-after leaves look 1 part run; the next resumes it, judges
    it, stops; the judgement is on the parent run (tag and artifact), and a `vaco report` of the
    experiment is recorded as a second reading of the same look."""
    import subprocess

    import mlflow
    import yaml

    from helpers.runs import CONFIGS, VACO

    sweep = {
        "experiment": "looks",
        "jobs": 2,
        "population": 7,
        "configs_dir": str(CONFIGS),
        "overrides": TINY_CELL,
        "defaults": {"env": "inverted_pendulum", "K": [1, 2], "seed": list(range(1, 15))},
        "grid": {"main": {"algorithm": ["vaco", "ppo_clip"]}},
        "plan": {
            "family": [{"arm": "vaco", "against": "ppo_clip", "K": 2}],
            "looks": [7, 14],
            "spending": "pocock",
            "test": "bootstrap",
            "references": {"InvertedPendulum-v5": [-10000, 10000]},
        },
    }
    path = tmp_path / "looks.yaml"
    path.write_text(yaml.safe_dump(sweep))
    command = [VACO, "sweep", "--config", str(path), "--out", str(tmp_path / "out"), "--until-decided"]
    stopped = subprocess.run([*command, "--jobs", "1", "--stop-after", "1"], capture_output=True, text=True)
    assert stopped.returncode == 124, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    part = subprocess.run([*command[:-1], "--status"], capture_output=True, text=True)
    said = re.search(r"look 1 of 2 \(7 seeds\): (\d+) of its 28 cells finished; looks recorded: none", part.stdout)
    assert part.returncode == 0 and said and int(said[1]) < 28, part.stdout[-3000:]
    narrowed = subprocess.run([*command[:-1], "--status", "--only", "vaco-*"], capture_output=True, text=True)
    assert narrowed.returncode == 0 and "look 1 of 2 (" not in narrowed.stdout  # a look is over all the cells
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    text = out.stdout
    assert "look 1 of 2: the first 7 seeds" in text and "look 2 of 2" not in text
    assert "-s8" not in text and "resume" in text
    assert "**equivalent**" in text and "scores normalised by the plan's fixed references" in text
    assert "IQM at K 0.500 / 0.500" in text  # the references, applied at the look
    assert "every primary comparison is decided at look 1 (7 seeds): stopping before the next look" in text
    status = subprocess.run([*command[:-1], "--status"], capture_output=True, text=True)
    assert status.returncode == 0 and "looks recorded: 7 seeds): --until-decided runs nothing more" in status.stdout
    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("looks").experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.`vaco.sweep.parent` = 'true'")
    from vaco.study.judge import read_judgements

    (judged,) = read_judgements(parent.data.tags)
    assert (
        judged.seeds == 7 and judged.by == "until-decided" and judged.words == {"vaco vs ppo_clip at K=2": "equivalent"}
    )
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "plan")}
    assert artifacts == {"plan/judgement001.md"}
    runs = [r for r in client.search_runs([experiment]) if "vaco.sweep.cell" in r.data.tags]
    assert len(runs) == 28 and {r.info.status for r in runs} == {"FINISHED"}
    report = subprocess.run(
        [VACO, "report", "--experiment", "looks", "--no-sensitivity", "--reps", "200", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert "group-sequential Holm at look 1 of 2 (7 seeds)" in report.stdout
    assert "recorded on the sweep's parent run" in report.stdout
    tags = client.get_run(parent.info.run_id).data.tags
    assert [j.by for j in read_judgements(tags)] == ["until-decided", "report"]
    (tmp_path / "own.yaml").write_text(yaml.safe_dump({"plan": {**sweep["plan"], "references": {}}}))
    own = subprocess.run(
        [VACO, "report", "--experiment", "looks", "--no-sensitivity", "--reps", "200", "--no-mlflow"]
        + ["--plan", str(tmp_path / "own.yaml"), "--out", str(tmp_path / "r2")],
        capture_output=True,
        text=True,
    )
    assert own.returncode == 0, own.stderr[-3000:]
    assert "declared after the runs" in own.stdout and "IQM at K 0.500 / 0.500" not in own.stdout
    _continued_in_a_new_store(tmp_path, path, client, parent.info.run_id)


def _continued_in_a_new_store(tmp_path, sweep_file, old_client, old_parent):
    """The study's store is lost; its export (``--save-data`` writes the plan's record beside the
    data) continues it in a new one: the look's cells count as finished, the new parent run carries
    the declaration and the looks (not declared anew), the look is judged on the exported runs and
    not recorded twice; a report of the store plus the data is a recorded reading of the same look,
    and a report of the data file alone reads the plan from its record. A record of another plan is
    one line."""
    import json
    import os
    import subprocess

    import mlflow

    from helpers.runs import VACO
    from vaco.study.judge import read_judgements

    data = tmp_path / "looks.csv.gz"
    saved = subprocess.run(
        [VACO, "report", "--experiment", "looks", "--no-sensitivity", "--reps", "200", "--no-mlflow"]
        + ["--save-data", str(data), "--out", str(tmp_path / "r3")],
        capture_output=True,
        text=True,
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    record = tmp_path / "looks_record.json"
    assert f"the plan's record -> {record}" in saved.stdout
    old_tags = old_client.get_run(old_parent).data.tags
    new_uri = f"sqlite:///{tmp_path / 'new.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": new_uri}
    command = [VACO, "sweep", "--config", str(sweep_file), "--out", str(tmp_path / "out2"), "--until-decided"]
    ledger = tmp_path / "ledger.csv.gz"  # the next block's file: the runs and the record carried on again
    out = subprocess.run(
        [*command, "--finished-in", str(data), "--save-data", str(ledger)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    assert "28 of them finished in" in out.stdout and f"the plan's record comes from {record}" in out.stdout
    assert f"declared {old_tags['vaco.plan.declared']}" in out.stdout and "**equivalent**" in out.stdout
    assert "was judged at" in out.stdout and "not recorded again" in out.stdout and "look 2 of 2" not in out.stdout
    client = mlflow.MlflowClient(new_uri)
    experiment = client.get_experiment_by_name("looks").experiment_id
    (parent,) = client.search_runs([experiment])  # the parent only: no cell ran again
    tags = parent.data.tags
    for key in ("vaco.plan", "vaco.plan.digest", "vaco.plan.declared"):
        assert tags[key] == old_tags[key], key
    assert tags["vaco.plan.carried_from"] == str(record)
    assert [j.by for j in read_judgements(tags)] == ["until-decided", "report"]
    from vaco.report.runs import read_runs
    from vaco.study.judge import read_record

    assert sorted(r.name for r in read_runs(ledger)) == sorted(r.name for r in read_runs(data))
    assert read_record(tmp_path / "ledger_record.json") == {k: v for k, v in tags.items() if k.startswith("vaco.plan")}
    both = subprocess.run(
        [VACO, "report", "--experiment", "looks", "--data", str(data), "--no-sensitivity", "--reps", "200"]
        + ["--out", str(tmp_path / "r4")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert both.returncode == 0, both.stderr[-3000:]
    assert (
        "group-sequential Holm at look 1 of 2 (7 seeds)" in both.stdout
        and "recorded on the sweep's parent" in both.stdout
    )
    assert len(read_judgements(client.get_run(parent.info.run_id).data.tags)) == 3
    # another score than the plan's: the rule's reading of it, labelled sensitivity and never recorded as a look
    other_score = subprocess.run(
        [VACO, "report", "--experiment", "looks", "--data", str(data), "--no-sensitivity", "--reps", "200"]
        + ["--score", "auc", "--out", str(tmp_path / "r6")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert other_score.returncode == 0, other_score.stderr[-3000:]
    assert "score sensitivity, not verdicts: the plan's rule and references on the auc score" in other_score.stdout
    assert "recorded on the sweep's parent" not in other_score.stdout
    assert (tmp_path / "r6" / "plan.md").read_text().startswith("# The study plan's rule on another score")
    assert len(read_judgements(client.get_run(parent.info.run_id).data.tags)) == 3
    alone = subprocess.run(
        [VACO, "report", "--data", str(data), "--no-sensitivity", "--reps", "200", "--out", str(tmp_path / "r5")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert f"declared {old_tags['vaco.plan.declared']}" in alone.stdout and "**equivalent**" in alone.stdout
    assert f"the plan's record is {record}" in alone.stdout
    other = json.loads(record.read_text())
    other["parent_run_tags"]["vaco.plan.digest"] = "0123456789ab"
    record.write_text(json.dumps(other))
    refused = subprocess.run(
        [*command, "--finished-in", str(data), "--dry-run"], capture_output=True, text=True, env=env
    )
    err = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(err) == 1, refused.stderr
    assert err[0].startswith(f"vaco sweep: `--finished-in {data}`: its plan record") and "0123456789ab" in err[0]


@pytest.mark.slow
def test_a_plans_fixed_references_normalise_every_score_and_do_not_move_as_runs_are_added(tmp_path):
    """A plan's ``references`` (task -> [min, max], fixed numbers) replace the report's own rule for
    the tasks they name: every run's normalised score is (final - min) / (max - min) with the plan's
    numbers (checked here by hand), and a run added far above the others leaves every other run's
    score where it was (the runs' own rule rescales them all). `vaco report --data --plan` applies
    them and says so."""
    import yaml

    from test_robustness import _runs
    from vaco import report as R
    from vaco.commands.report import main as report_main

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
    plan.write_text(
        yaml.safe_dump({"plan": {"family": family, "looks": [6], "references": references, "test": "bootstrap"}})
    )
    out = tmp_path / "report"
    argv = ["--data", str(data), "--plan", str(plan), "--reps", "50", "--no-sensitivity", "--no-mlflow"]
    assert report_main([*argv, "--out", str(out)]) == 0
    plan_md = (out / "plan.md").read_text()
    assert (
        "scores normalised by the plan's fixed references: HalfCheetah-v5 [-50, 2500], Hopper-v5 [100, 900]" in plan_md
    )
    assert "Hopper-v5: normalised by the plan's fixed references [100, 900]" in (out / "summary.md").read_text()
    page = (out / "benchmark.html").read_text()  # the page to click through, its plan section included
    assert '"declared_score":"final"' in page and "vaco vs ppo_clip at K=16" in page

    # a plan declaring last-N: the report scores by it without flags; another score is sensitivity
    from vaco.study.judge import judge_plan, plan_lines

    raw = {"family": family, "looks": [6], "references": references, "test": "bootstrap", "score": "last-2"}
    plan.write_text(yaml.safe_dump({"plan": raw}))
    assert report_main([*argv, "--out", str(tmp_path / "last2")]) == 0
    lines = (tmp_path / "last2" / "plan.md").read_text().splitlines()
    assert "last-2 score" in lines[2] and not any("score sensitivity" in line for line in lines)
    by_hand = R.build_report("fixed", runs, reps=50, score="last-n", last_evals=2, fixed_bounds=refs)
    declared = load_plan(raw, ["vaco", "ppo_clip"], [1, 4, 16], 6)
    expected = plan_lines(judge_plan(declared, by_hand, declared=None))
    comparison = next(line for line in expected if line.startswith("  vaco vs ppo_clip at K=16"))
    assert comparison in lines  # the estimate, IQMs and p's of the last-2 score
    assert report_main([*argv, "--out", str(tmp_path / "final"), "--score", "final"]) == 0
    assert "score sensitivity, not verdicts" in (tmp_path / "final" / "plan.md").read_text()

    # a plan declaring the task-mean estimand: the mean of each task's difference of drops, by hand;
    # the pooled estimate beside it as sensitivity; a pooled plan keeps the identity it had
    from vaco.report.robustness import paired_cells

    tasked = load_plan({**raw, "estimand": "task-mean"}, ["vaco", "ppo_clip"], [1, 4, 16], 6)
    assert tasked.digest != declared.digest
    assert load_plan({**raw, "estimand": "pooled"}, ["vaco", "ppo_clip"], [1, 4, 16], 6).digest == declared.digest
    judged = judge_plan(tasked, by_hand, declared=None)
    (v,) = judged.verdicts
    cells, _ = paired_cells(
        by_hand, [("vaco", 1), ("vaco", 16), ("ppo_clip", 1), ("ppo_clip", 16)], by_hand.tasks, runs=by_hand.runs
    )
    per_task = [tuple(trim_mean(c[:, t], 0.25) for c in cells) for t in range(len(by_hand.tasks))]  # each task's IQMs
    by_task = [(yr - yk) - (xr - xk) for xr, xk, yr, yk in per_task]
    assert v.estimate == pytest.approx(sum(by_task) / len(by_task), abs=1e-12)
    assert v.estimate == pytest.approx(v.gap_at_k + v.gap_at_ref, abs=1e-12)
    assert v.pooled == pytest.approx(judge_plan(declared, by_hand, declared=None).verdicts[0].estimate, abs=1e-15)
    text = "\n".join(plan_lines(judged))
    assert "each task weighed alike" in text and f"(pooled) gives {v.pooled:+.3f}" in text


@pytest.mark.slow
def test_a_non_finite_score_is_left_out_by_a_stated_rule_and_never_becomes_a_verdict(tmp_path):
    """One seed's final eval/return NaN (another's inf) made every robustness line "nan [nan, nan] ->
    differs" and a declared plan's comparison "+nan ... -> differs". Now the runs are left out and
    named, their seeds drop out of the paired comparisons, the plan says how many it left out, and
    the verdict is the one the data without them gives."""
    from test_robustness import _run
    from vaco import report as R
    from vaco.study.judge import judge_plan, plan_lines

    refs = {"Hopper-v5": (0.0, 1000.0), "HalfCheetah-v5": (0.0, 1000.0)}
    runs = _lag_runs({"vaco": 0.02, "ppo_clip": 0.04}, seeds=12)
    bad = [_run("vaco", "Hopper-v5", 4, 5, float("nan")), _run("ppo_clip", "HalfCheetah-v5", 1, 7, float("inf"))]
    kept = [
        r for r in runs if (r.algorithm, r.env, r.K, r.seed) not in {(b.algorithm, b.env, b.K, b.seed) for b in bad}
    ]
    plan = load_plan(
        {"family": [{"arm": "vaco", "against": "ppo_clip", "K": 4}], "looks": [10], "test": "bootstrap"},
        ["vaco", "ppo_clip"],
        [1, 4],
        12,
    )
    with_bad = R.build_report("nan", [*kept, *bad], reps=500, fixed_bounds=refs)
    without = R.build_report("nan", kept, reps=500, fixed_bounds=refs)
    assert set(with_bad.excluded) == {b.name for b in bad}
    assert any("left out for a non-finite score" in n and bad[0].name in n for n in with_bad.notes)
    judged, clean = judge_plan(plan, with_bad, declared="now"), judge_plan(plan, without, declared="now")
    (v,), (w,) = judged.verdicts, clean.verdicts
    assert math.isfinite(v.estimate) and v.estimate == w.estimate and v.word == w.word and v.seeds == 11
    assert "2 runs left out for a non-finite score" in "\n".join(plan_lines(judged))
    lag = R.robustness(with_bad, baseline="ppo_clip")
    assert all(math.isfinite(i.difference) for i in lag.interactions.values())
    with pytest.raises(ValueError, match=r"has no finished run with eval/return to report on \(2 left out"):
        R.build_report("nan", bad)


def test_an_undecided_comparison_names_the_seeds_it_needs_at_the_level_the_rule_holds_it_to():
    """A plan's undecided comparison is sized at its Holm step's level, not at 0.05: more seeds the
    smaller the level, the report's normal approximation on the paired seeds' spread."""
    import types

    from vaco.report.decision import seeds_needed
    from vaco.study.judge import _seeds_needed

    rng = np.random.default_rng(4)
    cells = tuple(rng.normal(0.5, 0.2, size=(12, 2)) for _ in range(4))
    xr, xk, yr, yk = cells
    paired = (yr - yk) - (xr - xk)
    found = types.SimpleNamespace(cells=cells, difference=0.06, seeds=12)
    at_005 = seeds_needed(paired, 0.06, 0.05, alpha=0.05)
    at_plan = _seeds_needed(found, 0.05, 0.0221)
    assert at_plan == seeds_needed(paired, 0.06, 0.05, alpha=0.0221) and at_plan > at_005 > 12
    assert _seeds_needed(found, 0.05, 0.0) is None  # a look whose level is 0 cannot decide


@pytest.mark.slow
def test_the_sizing_script_says_a_missing_pilot_file_in_one_line_naming_its_own_flag(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "plan_power.py"
    missing = tmp_path / "pilot.csv.gz"
    out = subprocess.run(
        [sys.executable, str(script), "--references", '{"Hopper-v5": [0, 1]}', "--looks", "4"]
        + ["--pilot", f"vaco,ppo_clip,4={missing}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip() == f"--pilot 'vaco,ppo_clip,4={missing}': no data file at {missing}"
