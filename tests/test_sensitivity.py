"""`vaco report`'s declared score and the verdicts under every scoring: each score and scale
against float64 loops written here, the declared scoring reproducing the headline, a verdict that
changes with the scoring flagged, and the two-way model's interaction against the contrasts of a
balanced 2x2 design computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.report_runs import make_run
from vaco import report as R
from vaco.commands.report import main as report_main
from vaco.report.sensitivity import run_scores, sensitivity

TASKS = (("Hopper-v5", 1000.0), ("HalfCheetah-v5", 3000.0))
SEEDS = tuple(range(1, 11))
STEPS = np.arange(1.0, 11.0) * 1000.0  # ten evaluations


def _run(algo, env, K, seed, curve) -> R.Run:
    constant = (STEPS, np.full(STEPS.size, 0.05))
    histories = {"eval/return": (STEPS, np.asarray(curve, dtype=np.float64)), "lag/forward_tv": constant}
    return make_run(
        algo, env, K, seed, histories, realign=algo == "vaco", objective="TVFilter" if algo == "vaco" else "PPOClip"
    )


def _runs(collapse: float = 0.0, seed: int = 0) -> list[R.Run]:
    """vaco and ppo_clip at K 1 and 4, ten seeds, two tasks: learning curves that rise to a level.
    ppo_clip's K = 4 runs keep their K = 1 curve; vaco's K = 4 runs do too, except that their last
    evaluation falls by ``collapse`` (of the task's scale) and the one before rises by half that:
    a drop the final score sees in full and the area under the curve not at all."""
    rng = np.random.default_rng(seed)
    runs = []
    ramp = np.minimum(1.0, np.arange(1, 11) / 6)
    for env, scale in TASKS:
        for algo, level in (("vaco", 0.8), ("ppo_clip", 0.7)):
            for s in SEEDS:
                base = scale * (level + rng.normal(0, 0.05)) * ramp
                for K in (1, 4):
                    curve = base + scale * rng.normal(0, 0.01, size=base.size)
                    if algo == "vaco" and K == 4:  # the trapezoid's area is unchanged
                        curve[-1] -= scale * collapse
                        curve[-2] += scale * collapse / 2
                    runs.append(_run(algo, env, K, s, curve))
    return runs


def _trapezoid_mean(steps, values) -> float:
    total = 0.0
    for i in range(1, len(steps)):
        total += 0.5 * (values[i] + values[i - 1]) * (steps[i] - steps[i - 1])
    return total / (steps[-1] - steps[0])


@pytest.mark.parametrize("score", ["final", "last-n", "auc"])
@pytest.mark.parametrize("scale", ["min-max", "floor-free"])
def test_every_score_and_scale_equals_a_float64_loop(score, scale):
    runs = _runs(collapse=0.2)
    rep = R.build_report("s", runs, reps=10)
    got, notes = run_scores(rep, score, scale, last_n=3)
    assert notes == []
    for env, _ in TASKS:
        mine = [r for r in runs if r.env == env]
        ends = {
            r.run_id: (
                sum(r.histories["eval/return"][1][-3:]) / 3 if score == "last-n" else r.histories["eval/return"][1][-1]
            )
            for r in mine
        }
        finals = {r.run_id: r.histories["eval/return"][1][-1] for r in mine}
        scale_of = finals if score == "auc" else ends  # the AUC takes the final score's scale
        low, high = min(scale_of.values()), max(scale_of.values())

        def scaled(x, low=low, high=high):
            return x / high if scale == "floor-free" else (x - low) / (high - low)

        for r in mine:
            if score == "auc":
                values = [scaled(v) for v in r.histories["eval/return"][1]]
                expected = _trapezoid_mean(list(STEPS), values)
            else:
                expected = scaled(ends[r.run_id])
            assert math.isclose(got[r.run_id], expected, rel_tol=1e-12, abs_tol=1e-12), (r.name, score, scale)


def test_the_declared_scoring_reproduces_the_headline_and_auc_can_be_declared():
    runs = _runs(collapse=0.3)
    for score in ("final", "auc"):
        rep = R.build_report("s", runs, reps=200, score=score)
        lag = R.robustness(rep)
        found = sensitivity(rep, lag)
        declared = [r for r in found.rows if r.declared]
        assert len(declared) == len(lag.interactions) == 1
        row, headline = declared[0], lag.interactions[("vaco", 4)]
        assert (row.score, row.aggregate, row.scale) == (score, "IQM", "min-max")
        assert row.difference == headline.difference and row.interval == tuple(headline.difference_interval)
        assert row.verdict.word == headline.verdict.word
        # the headline decides on the declared score: its drop is the IQM of that score's values
        values = rep.auc if score == "auc" else rep.normalized
        by = {(r.algorithm, r.K): [] for r in rep.runs}
        for r in rep.runs:
            by[(r.algorithm, r.K)].append(values[r.run_id])
        iqm = {key: float(np.mean(sorted(v)[len(v) // 4 : len(v) - len(v) // 4])) for key, v in by.items()}
        expected = (iqm[("ppo_clip", 1)] - iqm[("ppo_clip", 4)]) - (iqm[("vaco", 1)] - iqm[("vaco", 4)])
        assert math.isclose(headline.difference, expected, abs_tol=1e-12)


@pytest.mark.parametrize("fixed", ["references", "accuracy"])
def test_fixed_bounds_scale_every_scoring_so_the_declared_row_is_the_headline(fixed):
    """Where the report's bounds are fixed numbers (a study plan's references, or an accuracy scored
    as it is), every score of the sensitivity table is scaled by them, not by the runs' own min and
    max: the declared row and the two-way model reproduce the headline, and a last-3 score is the
    fixed scale's mean of the last three evaluations (a float64 loop here)."""
    if fixed == "references":
        runs = _runs(collapse=0.3)
        bounds = {env: (-0.1 * scale, 1.2 * scale) for env, scale in TASKS}
        rep = R.build_report("s", runs, reps=200, fixed_bounds=bounds)
        metric = "eval/return"
    else:
        rng = np.random.default_rng(5)
        runs, metric, bounds = [], "eval/accuracy", {"gsm8k": (0.0, 1.0)}
        for algo, loss in (("grpo", 0.010), ("vaco_grpo", 0.003)):
            for K in (1, 16):
                for s in SEEDS:
                    curve = np.clip(0.9 - loss * (K > 1) + rng.normal(0, 0.004, STEPS.size), 0, 1)
                    runs.append(make_run(algo, "gsm8k", K, s, {metric: (STEPS, curve)}, score_metric=metric))
        rep = R.build_report("llm", runs, reps=200)
    assert rep.scale == ("fixed" if fixed == "references" else "as is")
    lag = R.robustness(rep)
    found = sensitivity(rep, lag)
    (key,) = lag.interactions
    headline = lag.interactions[key]
    (row,) = [r for r in found.rows if r.declared]
    assert row.difference == headline.difference and row.interval == tuple(headline.difference_interval)
    (model,) = found.models
    by = {}
    for r in rep.runs:
        by.setdefault((r.algorithm, r.K), []).append(rep.normalized[r.run_id])
    mean = {k: float(np.mean(v)) for k, v in by.items()}
    algo, K = key
    base = headline.baseline
    expected = (mean[(base, 1)] - mean[(base, K)]) - (mean[(algo, 1)] - mean[(algo, K)])
    assert math.isclose(model.estimate, expected, abs_tol=1e-9)
    got, _ = run_scores(rep, "last-n", "min-max", last_n=3)
    for r in rep.runs:
        low, high = bounds[r.env]
        values = r.histories[metric][1]
        expected = (sum(float(v) for v in values[-3:]) / 3 - low) / (high - low)
        assert math.isclose(got[r.run_id], expected, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.slow
def test_a_verdict_that_changes_with_the_scoring_is_flagged_scale_dependent(tmp_path, capsys):
    """vaco's K = 4 runs collapse at their last evaluation only: the final score says vaco loses
    more than ppo_clip (differs), the area under the curve says they lose the same (equivalent)."""
    runs = _runs(collapse=0.3)
    rep = R.build_report("s", runs, reps=300, margin=0.05)
    found = sensitivity(rep, R.robustness(rep))
    words = {(r.score, r.aggregate, r.scale): r.verdict.word for r in found.rows}
    assert words[("final", "IQM", "min-max")] == "differs"
    assert words[("auc", "mean", "min-max")] == "equivalent"
    assert ("vaco", 4) in found.scale_dependent()
    # without the collapse nothing depends on the scoring
    steady = R.build_report("s", _runs(collapse=0.0), reps=300, margin=0.1)
    assert sensitivity(steady, R.robustness(steady)).scale_dependent() == {}
    # the CLI prints the flag, and the summary and its CSV carry the table
    data = R.save_runs(runs, tmp_path / "runs.csv.gz")
    assert report_main(["--data", str(data), "--reps", "100", "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "robustness to lag (final score)" in out and "vaco K=4: scale-dependent" in out
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "### Does the verdict depend on the scoring?" in summary and "Scale-dependent: **vaco K=4**" in summary
    frame = __import__("pandas").read_csv(tmp_path / "rep" / "sensitivity.csv")
    assert len(frame) == 12 and frame["declared"].sum() == 1
    assert "Under Holm's correction over all 12 of them" in summary
    # 100 resamples: the smallest bootstrap p is 2/101, and Holm over 12 cannot go below 0.238
    assert "**Too coarse to judge**" in summary and "`--reps` of at least 480" in summary
    assert report_main(["--data", str(data), "--reps", "20", "--no-sensitivity", "--out", str(tmp_path / "r2")]) == 0
    assert "Does the verdict depend" not in (tmp_path / "r2" / "summary.md").read_text()


def test_the_tables_verdicts_under_holm_equal_a_step_down_loop():
    """Every verdict of the sensitivity table re-decided with Holm over the whole table: the
    adjusted p-values equal Holm's step-down loop written here, the words follow them, and a
    correction only ever weakens a verdict ("differs" or "equivalent" to "undecided")."""
    rep = R.build_report("s", _runs(collapse=0.3), reps=300, margin=0.05)
    found = sensitivity(rep, R.robustness(rep))
    rows = [*found.rows, *found.design]
    corrected = found.under_holm(0.05)

    def step_down(p):
        order = sorted(range(len(p)), key=lambda i: (p[i], i))
        adjusted, running = [0.0] * len(p), 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (len(p) - rank) * p[i]))
            adjusted[i] = running
        return adjusted

    p_d = step_down([r.verdict.p_differs for r in rows])
    p_e = step_down([r.verdict.p_equivalent for r in rows])
    assert [c[0] for c in corrected] == pytest.approx(p_d) and [c[1] for c in corrected] == pytest.approx(p_e)
    for row, (d, e, word) in zip(rows, corrected):
        assert word == ("differs" if d <= 0.05 else "equivalent" if e <= 0.05 else "undecided")
        assert word == row.verdict.word or word == "undecided"
    counts = found.holm_counts(0.05)
    assert sum(alone for alone, _ in counts.values()) == len(rows)
    assert counts == {
        w: (sum(r.verdict.word == w for r in rows), sum(r.verdict.word == w == c[2] for r, c in zip(rows, corrected)))
        for w in {r.verdict.word for r in rows}
    }


def test_the_two_way_model_interaction_equals_the_contrasts_of_the_2x2_design():
    """OLS with a unit per (task, seed): the interaction is the mean per-unit contrast
    (xk - xr) - (yk - yr), and its standard error comes from the residuals of the three per-unit
    contrasts (algorithm, lag, interaction) about their means, on 3U - 3 degrees of freedom."""
    runs = _runs(collapse=0.1, seed=4)
    rep = R.build_report("s", runs, reps=50)
    found = sensitivity(rep, R.robustness(rep))
    (model,) = found.models
    units = []
    for env, _ in TASKS:
        for s in SEEDS:
            cell = {(r.algorithm, r.K): rep.normalized[r.run_id] for r in rep.runs if r.env == env and r.seed == s}
            xr, xk, yr, yk = cell[("vaco", 1)], cell[("vaco", 4)], cell[("ppo_clip", 1)], cell[("ppo_clip", 4)]
            units.append(
                ((xr + xk - yr - yk) / 2, (xr - xk + yr - yk) / 2, (xr - xk - yr + yk) / 2, (xk - xr) - (yk - yr))
            )
    U = len(units)
    estimate = math.fsum(u[3] for u in units) / U
    rss = 0.0
    for c in range(3):
        mean = math.fsum(u[c] for u in units) / U
        rss += math.fsum((u[c] - mean) ** 2 for u in units)
    se = 2 * math.sqrt(rss / (3 * U - 3) / U)
    assert model.observations == 4 * U
    assert math.isclose(model.estimate, estimate, abs_tol=1e-10)
    assert math.isclose(model.se, se, rel_tol=1e-8)
    assert math.isclose(model.t, estimate / se, rel_tol=1e-8)


def test_a_score_declared_wrongly_is_refused_in_one_line(tmp_path, capsys):
    data = R.save_runs(_runs(), tmp_path / "runs.csv.gz")
    assert report_main(["--data", str(data), "--score", "final", "--last-evals", "3", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "`--last-evals` is the n of `--score last-n`" in err
    with pytest.raises(SystemExit):
        report_main(["--data", str(data), "--score", "median", "--out", str(tmp_path)])
    assert "--score" in capsys.readouterr().err
    # --last-evals alone declares the last-n score, as it always averaged the last n
    assert R.build_report("s", _runs(), last_evals=3).score == "last-n"
