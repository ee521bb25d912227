"""`vaco report`: normalisation and rliable aggregates checked against rliable called directly and
float64 loops; every figure and section on runs built here; the report on a real tiny sweep."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib
import matplotlib.pyplot
import numpy as np
import pytest
from matplotlib import image as mpimg
from rliable import library, metrics

from helpers.report_runs import make_run
from helpers.tiny_sweep import FIRST, SECOND, full_sweep
from vaco import report as R
from vaco.commands.report import main as report_main

PNG = b"\x89PNG\r\n\x1a\n"


def _valid_png(path) -> bool:
    if not path.is_file() or path.read_bytes()[:8] != PNG:
        return False
    pixels = mpimg.imread(path)
    return pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50 and float(pixels.std()) > 0


def _iqm_loop(values) -> float:
    """Interquartile mean by hand: sort, drop int(n/4) values at each end, average the rest."""
    values = sorted(float(v) for v in np.ravel(values))
    cut = int(0.25 * len(values))
    kept = values[cut : len(values) - cut]
    return sum(kept) / len(kept)


# ---------------------------------------------------------------------------------------- math
def test_normalisation_is_min_max_over_all_algorithms_per_task():
    rng = np.random.default_rng(0)
    returns = {task: rng.normal(100 * (i + 1), 30, size=7).tolist() for i, task in enumerate(["Hopper-v5", "Ant-v5"])}
    bounds = R.normalization_bounds(returns)
    for task, values in returns.items():
        low, high = values[0], values[0]
        for v in values:
            low, high = min(low, v), max(high, v)
        assert bounds[task] == (low, high)
        for v, n in zip(values, R.normalize(values, bounds[task])):
            assert n == pytest.approx((v - low) / (high - low), abs=1e-12)
        assert R.normalize(values, bounds[task]).min() == 0.0 and R.normalize(values, bounds[task]).max() == 1.0
    assert R.normalize([5.0, 5.0], (5.0, 5.0)).tolist() == [1.0, 1.0]
    assert R.final_score([1.0, 2.0, 6.0], last=2) == 4.0


def test_score_matrix_is_runs_by_tasks_cut_to_the_smallest_count():
    m = R.score_matrix({"a": [1, 2, 3], "b": [4, 5]}, ["a", "b"])
    assert m.shape == (2, 2) and m.tolist() == [[1, 4], [2, 5]]


_AGGREGATE_FNS = (
    metrics.aggregate_median,
    metrics.aggregate_iqm,
    metrics.aggregate_mean,
    metrics.aggregate_optimality_gap,
)


def test_aggregates_and_intervals_equal_rliable_called_directly():
    rng = np.random.default_rng(1)
    scores = {
        "vaco K=4": rng.uniform(0.3, 1.0, size=(5, 3)),
        "ppo_clip K=4": rng.uniform(0.0, 0.8, size=(6, 3)),
    }
    ours = R.aggregate_estimates(scores, reps=300, seed=7, min_runs=3)

    def func(x):
        return np.array(
            [
                metrics.aggregate_median(x),
                metrics.aggregate_iqm(x),
                metrics.aggregate_mean(x),
                metrics.aggregate_optimality_gap(x),
            ]
        )

    np.random.seed(7)
    points, intervals = library.get_interval_estimates(scores, func, reps=300)
    for key in scores:
        np.testing.assert_allclose(ours[key].point, points[key], rtol=0, atol=1e-12)
        np.testing.assert_allclose(ours[key].interval, intervals[key], rtol=0, atol=1e-12)
        assert ours[key].interval.shape == (2, 4)
        assert np.all(ours[key].interval[0] <= ours[key].point + 1e-12)
        assert np.all(ours[key].point <= ours[key].interval[1] + 1e-12)
        # and the IQM against a hand-written loop
        assert ours[key].point[1] == pytest.approx(_iqm_loop(scores[key]), abs=1e-12)
        assert ours[key].point[2] == pytest.approx(float(np.mean(scores[key], dtype=np.float64)), abs=1e-12)
        assert ours[key].point[3] == pytest.approx(float(np.mean(1 - np.minimum(scores[key], 1))), abs=1e-12)


@pytest.mark.parametrize("runs", [3, 4])
def test_too_few_runs_for_a_bootstrap_give_the_runs_range_and_say_so(runs):
    rng = np.random.default_rng(runs)
    scores = {"a": rng.uniform(size=(runs, 2))}
    est = R.aggregate_estimates(scores, reps=100, min_runs=3)["a"]
    single = np.array([[f(scores["a"][i : i + 1]) for f in _AGGREGATE_FNS] for i in range(runs)])
    assert est.kind == "range" and est.runs_per_task == runs
    np.testing.assert_allclose(est.interval, [single.min(0), single.max(0)], rtol=0, atol=1e-12)
    assert "(range " in R.markdown.ci_text(est) and f"{runs} runs)" in R.markdown.ci_text(est)


def test_a_bootstrap_of_three_runs_is_their_range():
    """Why three runs show a range: rliable's 95% percentile interval of one task's three runs is
    the range of their values (each run alone is drawn three times with probability 1/27 > 2.5%)."""
    values = np.array([[0.2], [0.5], [0.9]])
    np.random.seed(0)
    _, intervals = library.get_interval_estimates(
        {"a": values}, lambda x: np.array([metrics.aggregate_mean(x)]), reps=2000
    )
    np.testing.assert_allclose(np.asarray(intervals["a"]).ravel(), [0.2, 0.9], atol=1e-12)


def test_too_few_runs_give_a_point_and_no_interval():
    scores = {"a": np.array([[0.2, 0.6], [0.4, 0.9]])}
    est = R.aggregate_estimates(scores, reps=100, min_runs=3)["a"]
    assert est.interval is None and est.runs_per_task == 2
    assert est.point[1] == pytest.approx(metrics.aggregate_iqm(scores["a"]))
    assert est.bounds().tolist() == [est.point.tolist(), est.point.tolist()]


def test_curve_iqm_and_auc_equal_rliable_and_a_trapezoid_loop():
    rng = np.random.default_rng(2)
    curves = {"vaco": rng.uniform(size=(6, 2, 6)), "spo": rng.uniform(size=(5, 2, 6))}
    ours = R.curve_iqm(curves, reps=200, seed=3)
    np.random.seed(3)
    points, intervals = library.get_interval_estimates(
        curves, lambda x: np.array([metrics.aggregate_iqm(x[..., j]) for j in range(x.shape[-1])]), reps=200
    )
    for key in curves:
        np.testing.assert_allclose(ours[key].point, points[key], atol=1e-12)
        np.testing.assert_allclose(ours[key].interval, intervals[key], atol=1e-12)
    steps, values = [0.0, 1.0, 3.0, 7.0], [0.0, 1.0, 0.5, 0.5]
    area = 0.0
    for i in range(1, len(steps)):
        area += (steps[i] - steps[i - 1]) * (values[i] + values[i - 1]) / 2
    assert R.area_under_curve(steps, values) == pytest.approx(area / 7.0, abs=1e-12)
    assert R.area_under_curve([5.0], [0.3]) == 0.3


def test_performance_profiles_equal_rliable():
    rng = np.random.default_rng(4)
    scores = {"a": rng.uniform(size=(5, 2)), "b": rng.uniform(size=(5, 2))}
    taus = np.linspace(0, 1, 11)
    ours, ours_ci = R.performance_profiles(scores, taus, reps=100, seed=5)
    np.random.seed(5)
    theirs, theirs_ci = library.create_performance_profile(scores, taus, reps=100)
    for key in scores:
        np.testing.assert_allclose(ours[key], theirs[key])
        np.testing.assert_allclose(ours_ci[key], theirs_ci[key])
        for j, tau in enumerate(taus):  # fraction of runs above tau, by hand
            assert ours[key][j] == pytest.approx(sum(float(v) > tau for v in scores[key].ravel()) / scores[key].size)
    # three runs a task: rliable's point profile and no band (a bootstrap of three runs is their range)
    few = {"c": rng.uniform(size=(3, 2))}
    profile, bands = R.performance_profiles(few, taus, reps=100, seed=5)
    np.random.seed(5)
    theirs, _ = library.create_performance_profile(few, taus, reps=100)
    np.testing.assert_allclose(profile["c"], theirs["c"], atol=1e-12)
    assert "c" not in bands


def test_probability_of_improvement_equals_a_pairwise_loop():
    """P(X > Y) over PPO-clip at each K: per task the fraction of (x, y) run pairs with x > y (ties
    count half), averaged over tasks; with 3 runs a task no interval (from 5 runs a task the
    interval is rliable's get_interval_estimates on the same pairs)."""
    rep = R.build_report("synthetic", _synthetic_runs(), reps=100, seed=3)
    got = R.probability_of_improvement(rep)
    assert set(got.estimates) == {
        "vaco K=1 vs ppo_clip K=1",
        "vaco K=4 vs ppo_clip K=4",
        "vaco_no_realign K=1 vs ppo_clip K=1",
        "vaco_no_realign K=4 vs ppo_clip K=4",
    }
    main = rep.main_runs()
    for key, estimate in got.estimates.items():
        (x_algo, k), (y_algo, _) = (part.split(" K=") for part in key.split(" vs "))
        per_task = []
        for task in rep.tasks:
            xs = [rep.normalized[r.run_id] for r in main if (r.algorithm, r.K, r.env) == (x_algo, int(k), task)]
            ys = [rep.normalized[r.run_id] for r in main if (r.algorithm, r.K, r.env) == (y_algo, int(k), task)]
            wins = 0.0
            for x in xs:
                for y in ys:
                    wins += 1.0 if x > y else 0.5 if x == y else 0.0
            per_task.append(wins / (len(xs) * len(ys)))
        assert estimate.point[0] == pytest.approx(float(np.mean(per_task)), abs=1e-12), key
        assert estimate.interval is None and estimate.runs_per_task == 3  # 3 runs a task: no bootstrap
    # the synthetic PPO-clip loses 5% per unit of K: at K = 4 every vaco run beats every PPO-clip run
    assert got.estimates["vaco K=4 vs ppo_clip K=4"].point[0] == 1.0


# ---------------------------------------------------------------------------------------- figures
def _synthetic_runs() -> list[R.Run]:
    """3 seeds x 2 tasks x K in {1, 4} for vaco, ppo_clip, vaco_no_realign, plus delta and rho_bar
    ablation cells of vaco at K=4: enough runs for every interval."""
    rng = np.random.default_rng(5)
    runs = []
    steps = np.arange(1, 6) * 1000.0
    iters = np.arange(1, 11) * 500.0
    specs = [
        ("vaco", "TVFilter", True, 0.2, 1.0, 1.0),
        ("ppo_clip", "PPOClip", False, None, None, 0.7),
        ("vaco_no_realign", "TVFilter", False, 0.2, None, 0.8),
    ]
    cells = [(a, o, re, d, rb, lvl, K) for a, o, re, d, rb, lvl in specs for K in (1, 4)]
    cells += [("vaco", "TVFilter", True, 0.4, 1.0, 0.9, 4), ("vaco", "TVFilter", True, 0.2, 2.0, 0.6, 4)]
    for algo, objective, realign, delta, rho_bar, level, K in cells:
        for task, scale in (("Hopper-v5", 1000.0), ("Walker2d-v5", 2000.0)):
            for seed in (1, 2, 3):
                ret = scale * level * (steps / steps[-1]) * (1 - 0.05 * K * (algo == "ppo_clip")) + rng.normal(0, 20, 5)
                tv = rng.uniform(0.02, 0.1, size=iters.size)
                histories = {
                    "eval/return": (steps, ret),
                    "lag/forward_tv": (iters, tv),
                    "train/tv": (iters, tv / 2),
                    "train/filter_fraction": (
                        iters,
                        rng.uniform(0, 0.3, iters.size) if objective == "TVFilter" else np.zeros(iters.size),
                    ),
                    "train/clip_fraction": (
                        iters,
                        rng.uniform(0, 0.2, iters.size) if objective != "TVFilter" else np.zeros(iters.size),
                    ),
                }
                runs.append(
                    make_run(
                        algo,
                        task,
                        K,
                        seed,
                        histories,
                        run_id=f"{algo}-{task}-{K}-{delta}-{rho_bar}-{seed}",
                        name=f"{algo}-{seed}",
                        axes={k: v for k, v in (("delta", delta), ("rho_bar", rho_bar)) if v is not None},
                        realign=realign,
                        objective=objective,
                        fraction_metric="train/filter_fraction" if objective == "TVFilter" else "train/clip_fraction",
                    )
                )
    return runs


@pytest.mark.slow
def test_report_draws_every_figure_with_its_brackets(tmp_path):
    """Every figure and section of a report on 3 seeds x 2 tasks: brackets everywhere, and since 3 runs
    a task are too few for a bootstrap, they are the runs' range and the summary says so."""
    runs = _synthetic_runs()
    rep = R.build_report("synthetic", runs, reps=200, seed=0)
    assert rep.reference.get("delta") == 0.2 and rep.reference.get("rho_bar") == 1.0
    for task in rep.tasks:  # the paper's: min and max over the main algorithms at the reference values
        finals = [
            rep.final[r.run_id]
            for r in runs
            if r.env == task
            and r.algorithm in ("vaco", "ppo_clip")
            and r.axes.get("delta") in (None, 0.2)
            and r.axes.get("rho_bar") in (None, 1.0)
        ]
        assert rep.bounds[task] == (min(finals), max(finals))
    summary = R.write_report(rep, tmp_path).read_text()
    for name in R.FIGURES:
        assert _valid_png(tmp_path / name), name
        assert f"({name})" in summary
    for section in R.SECTIONS:
        assert f"\n## {section}\n" in summary
    assert "Not in this experiment" not in summary
    head, _, tail = summary.partition("\n## Probability of improvement\n")
    improvement, _, rest = tail.partition("\n## ")
    elsewhere = head + rest
    assert "Too few runs for an interval" not in elsewhere and "(no CI)" not in elsewhere
    assert "Too few runs for a bootstrap in 6 of 6 groups (3 run(s) per task)" in summary
    assert "(range " in summary and ", 3 runs)" in summary
    # P(X > Y) of 3 runs against 3: the point, and why there is no interval
    assert "those show point estimates only, and an interval needs at least 5 runs per task" in improvement
    assert "vaco K=4 | 3 | 2 |" in summary  # 3 runs per task, 2 tasks
    frame = R.runs_frame(rep)
    main = frame[frame.algorithm.isin(["vaco", "ppo_clip"]) & frame.reference]
    assert len(frame) == len(runs) and set(main["normalized"].between(0, 1)) == {True}


def test_statistics_are_data_and_the_figures_draw_them(tmp_path):
    rep = R.build_report("synthetic", _synthetic_runs(), reps=100, seed=0)
    scores = R.aggregate_scores(rep)
    frame = scores.frame()
    assert set(frame["metric"]) == set(R.AGGREGATES) and len(frame) == 4 * len(scores.estimates)
    vaco = frame[(frame.group == "vaco K=4") & (frame.metric == "IQM")].iloc[0]
    finals = [
        [rep.normalized[r.run_id] for r in rep.main_runs() if r.algorithm == "vaco" and r.K == 4 and r.env == t]
        for t in rep.tasks
    ]
    assert vaco.point == pytest.approx(_iqm_loop(finals), abs=1e-12) and vaco.low <= vaco.point <= vaco.high
    _, drawn, _ = R.figure_aggregates(rep, scores)  # the figure draws exactly these numbers
    assert drawn is scores.estimates
    curves = R.sample_efficiency(rep).frame()
    assert set(curves["K"]) == {1, 4} and (curves["low"] <= curves["high"]).all()


@pytest.mark.slow
def test_a_data_file_gives_the_same_report_as_the_runs(tmp_path):
    """--save-data writes every run's coordinates and histories; --data reads them back exactly."""
    runs = _synthetic_runs()
    path = R.save_runs(runs, tmp_path / "runs.csv.gz")
    back = R.read_runs(path)
    assert len(back) == len(runs)
    for a, b in zip(runs, back):
        assert (a.run_id, a.algorithm, a.env, a.K, a.seed, a.axes, a.realign, a.objective, a.fraction_metric) == (
            b.run_id,
            b.algorithm,
            b.env,
            b.K,
            b.seed,
            b.axes,
            b.realign,
            b.objective,
            b.fraction_metric,
        )
        for key, (steps, values) in a.histories.items():
            assert b.history(key)[0].tolist() == steps.tolist() and b.history(key)[1].tolist() == values.tolist()
    first = R.write_report(R.build_report("x", runs, reps=50), tmp_path / "a").read_text()
    second = R.write_report(R.build_report("x", back, reps=50), tmp_path / "b").read_text()
    assert first == second
    assert report_main(["--data", str(path), "--out", str(tmp_path / "c"), "--reps", "50"]) == 0
    assert (tmp_path / "c" / "summary.md").read_text().replace("# Report: runs", "# Report: x") == first


@pytest.mark.slow
def test_an_axis_an_objective_declares_gets_its_own_ablation(tmp_path):
    """No edit of the report: runs that log a new axis (RatioCap's cap) are compared by it."""
    runs = [r for r in _synthetic_runs() if r.algorithm == "ppo_clip"]
    for r in list(runs):
        if r.K == 4:
            for value in (1.5, 4.0):
                runs.append(
                    dataclasses.replace(r, run_id=f"{r.run_id}-t{value}", algorithm="ratio_cap", axes={"cap": value})
                )
            runs.append(dataclasses.replace(r, run_id=f"{r.run_id}-t2", algorithm="ratio_cap", axes={"cap": 2.0}))
    rep = R.build_report("cap", runs, reps=50, reference={"cap": 2.0})
    assert rep.reference["cap"] == 2.0
    assert {r.algorithm for r in rep.main_runs()} == {"ppo_clip", "ratio_cap"}
    assert len([r for r in rep.main_runs() if r.algorithm == "ratio_cap"]) == 6  # only cap 2.0
    ablation = R.ablations(rep)["cap"]
    assert sorted(ablation.groups()) == [f"ratio_cap cap={t} K=4" for t in ("1.5", "2", "4")]
    summary = R.write_report(rep, tmp_path).read_text()
    assert "\n## Ablation: cap\n" in summary and "(ablation_cap.png)" in summary
    assert "## Ablation: delta" not in summary  # no run carries delta: no section for it (an LLM report's rho_bar)


# ---------------------------------------------------------------------------------------- the tiny sweep
@pytest.mark.slow
def test_report_on_the_tiny_sweep(tmp_path_factory, tmp_path, monkeypatch):
    import mlflow

    from vaco.commands.cli import main as vaco_main

    sweep = full_sweep(tmp_path_factory)
    assert sweep.full_rc == 0, sweep.full_log
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sweep.uri)
    out = tmp_path / "report"
    data = tmp_path / "runs.csv.gz"
    assert (
        vaco_main(
            ["report", "--experiment", sweep.experiment, "--out", str(out), "--reps", "200", "--save-data", str(data)]
        )
        == 0
    )
    summary = (out / "summary.md").read_text()
    # the data file alone (no MLflow store) gives the same report
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    again = tmp_path / "from_data"
    assert (
        vaco_main(["report", "--data", str(data), "--name", sweep.experiment, "--out", str(again), "--reps", "200"])
        == 0
    )
    assert (again / "summary.md").read_text() == summary and not (tmp_path / "elsewhere.db").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sweep.uri)
    for name in R.FIGURES:  # the tiny sweep has one K: no robustness figure, and the section says why
        assert _valid_png(out / name) == (name != "robustness.png"), name
    assert "it needs runs of an algorithm at two or more K" in summary
    for section in R.SECTIONS:
        assert f"\n## {section}\n" in summary, section
    assert "5 finished runs" in summary
    assert "Not in this experiment" not in summary  # the sweep has one cell of each ablation
    assert "Too few runs for an interval" in summary and "an interval needs at least 3 runs per task" in summary
    assert (
        "vaco delta=0.4 K=2" in summary and "vaco rho_bar=2 K=2" in summary and "vaco_no_realign (GAE) K=2" in summary
    )

    client = mlflow.MlflowClient(sweep.uri)
    exp = client.get_experiment_by_name(sweep.experiment)
    # the sweep is one parent run with its cells nested under it; the report lives on the parent
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`vaco.sweep.parent` = 'true'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    assert (
        parents[0].data.tags["vaco.sweep.name"] == sweep.experiment
        and "main" in parents[0].data.tags["vaco.sweep.grid"]
    )
    cells = client.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    assert len(cells) == 5 and {r.data.tags["vaco.sweep.cell"] for r in cells} >= {FIRST, SECOND}
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert {f"report/{n}" for n in (*R.FIGURES, "summary.md") if n != "robustness.png"} <= logged
    # a second report goes to the same parent run, and the parent is never read as a training run
    assert vaco_main(["report", "--experiment", sweep.experiment, "--out", str(out), "--reps", "50"]) == 0
    assert len(client.search_runs([exp.experiment_id], filter_string="tags.`vaco.sweep.parent` = 'true'")) == 1
    assert not client.search_runs([exp.experiment_id], filter_string="tags.`vaco.report` = 'true'")
    assert "5 finished runs" in (out / "summary.md").read_text()


def test_report_on_a_missing_experiment_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert report_main(["--experiment", "nope", "--out", str(tmp_path / "r")]) == 2
    assert "no MLflow experiment named 'nope'" in capsys.readouterr().err


def test_the_five_task_study_figures_come_from_its_committed_data():
    """docs/figures/five_tasks/ was written by `vaco report --data docs/data/five_tasks.csv.gz`:
    the committed data file holds the 120 runs, and every seed's final return and every task's
    normalisation bounds in the committed summary are those of the data (no bootstrap needed)."""
    repo = Path(__file__).resolve().parents[1]
    runs = R.read_runs(repo / "docs" / "data" / "five_tasks.csv.gz")
    rep = R.build_report("vaco-five-tasks", runs, reps=1)
    assert len(rep.runs) == 120 and len(rep.tasks) == 5
    summary = (repo / "docs" / "figures" / "five_tasks" / "summary.md").read_text()
    rows = {}
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[5].startswith("s1: "):
            rows[(cells[0], cells[1], int(cells[2]))] = cells[5]
    expected = {}
    for r in sorted(rep.runs, key=lambda r: r.seed):
        expected.setdefault((r.env, r.algorithm, r.K), []).append(f"s{r.seed}: {rep.final[r.run_id]:.1f}")
    assert rows == {key: ", ".join(v) for key, v in expected.items()}
    for task, (low, high) in rep.bounds.items():
        assert f"| {task} | {low:.1f} | {high:.1f} |" in summary


# ---------------------------------------------------------------------------------------- the 2x2 design's step size
def _tv_run(algorithm: str, env: str, K: int, seed: int, tv: list[float], final: float) -> R.Run:
    steps = np.arange(1.0, len(tv) + 1.0)
    histories = {"eval/return": (steps[-2:], np.array([0.0, final])), "lag/forward_tv": (steps, np.array(tv))}
    return make_run(algorithm, env, K, seed, histories, name=algorithm, objective="X")


@pytest.mark.slow
def test_step_size_pairs_are_compared_per_task_and_k_against_a_float64_loop(tmp_path):
    rng = np.random.default_rng(3)
    runs, tvs = [], {}
    for env in ("A-v0", "B-v0"):
        for K in (1, 16):
            for algorithm, scale in (("filter", 1.0), ("clip", 1.0 if K == 1 else 1.3), ("other", 2.0)):
                for seed in (1, 2, 3):
                    tv = list(0.1 * scale + 0.01 * rng.standard_normal(5))
                    tvs.setdefault((algorithm, env, K), []).append(tv)
                    runs.append(_tv_run(algorithm, env, K, seed, tv, float(rng.uniform(0, 100))))
    report = R.build_report("x", runs, reps=50, step_pairs={"filter": "clip"})
    got = {(m.task, m.K): m for m in R.step_size_matching(report)}
    assert sorted(got) == [("A-v0", 1), ("A-v0", 16), ("B-v0", 1), ("B-v0", 16)]
    for (env, K), m in got.items():
        expected = {}
        for arm in ("filter", "clip"):  # the mean over runs of each run's mean over iterations, by hand
            per_run = []
            for tv in tvs[(arm, env, K)]:
                total = 0.0
                for value in tv:
                    total += float(value)
                per_run.append(total / len(tv))
            expected[arm] = sum(per_run) / len(per_run)
        assert m.filter_tv == pytest.approx(expected["filter"], rel=1e-12)
        assert m.clip_tv == pytest.approx(expected["clip"], rel=1e-12)
        assert m.ratio == pytest.approx(expected["clip"] / expected["filter"], rel=1e-12)
        assert m.drifts == (abs(expected["clip"] / expected["filter"] - 1) > 0.10) and m.drifts == (K == 16)
        assert (m.filter_runs, m.clip_runs) == (3, 3)
    summary = R.write_report(report, tmp_path).read_text()
    assert "### Step size held at every K?" in summary and summary.count("| **drifts** |") == 2
    # without declared pairs the section is absent (reports read as before)
    plain = R.write_report(R.build_report("x", runs, reps=50), tmp_path / "plain").read_text()
    assert "Step size held" not in plain


def test_step_size_by_phase_flags_an_arm_that_matches_on_average_but_not_early_or_late(tmp_path):
    """The clip arm moves 30% further in the first third of each run and 30% less in the last: its
    run average matches the filter arm's (held), its thirds do not. Checked against thirds and
    ratios computed here in float64 loops (7 iterations: thirds of 3, 2 and 2)."""
    rng = np.random.default_rng(5)
    runs, tvs = [], {}
    shape = {"filter": [1.0] * 7, "clip": [1.3, 1.3, 1.3, 1.0, 1.0, 0.55, 0.55]}  # mean ~1.0 over the run
    for algorithm in ("filter", "clip"):
        for seed in (1, 2, 3, 4):
            tv = [0.1 * f * (1 + 0.02 * rng.standard_normal()) for f in shape[algorithm]]
            tvs[(algorithm, seed)] = tv
            runs.append(_tv_run(algorithm, "A-v0", 4, seed, tv, float(rng.uniform(0, 100))))
    report = R.build_report("x", runs, reps=50, step_pairs={"filter": "clip"})
    (average,) = R.step_size_matching(report)
    assert not average.drifts  # the run average hides it
    phases = R.step_size_by_phase(report)
    assert [p.phase for p in phases] == list(R.PHASES)
    bounds = [(0, 3), (3, 5), (5, 7)]
    for p, (lo, hi) in zip(phases, bounds):
        per_seed = {}
        for arm in ("filter", "clip"):
            for seed in (1, 2, 3, 4):
                total = 0.0
                for value in tvs[(arm, seed)][lo:hi]:
                    total += float(value)
                per_seed[(arm, seed)] = total / (hi - lo)
        filter_tv = sum(per_seed[("filter", s)] for s in (1, 2, 3, 4)) / 4
        clip_tv = sum(per_seed[("clip", s)] for s in (1, 2, 3, 4)) / 4
        ratios = [per_seed[("clip", s)] / per_seed[("filter", s)] for s in (1, 2, 3, 4)]
        mean = sum(ratios) / 4
        sd = (sum((r - mean) ** 2 for r in ratios) / 3) ** 0.5
        assert p.filter_tv == pytest.approx(filter_tv, rel=1e-12) and p.clip_tv == pytest.approx(clip_tv, rel=1e-12)
        assert p.ratio_sd == pytest.approx(sd, rel=1e-9) and p.seeds == 4
        assert p.drifts == (abs(clip_tv / filter_tv - 1) > 0.10)
    assert [p.drifts for p in phases] == [True, False, True]
    summary = R.write_report(report, tmp_path).read_text()
    assert "By phase" in summary and summary.count("| **leaves +-10%** |") == 2


def test_step_pairs_naming_no_runs_are_refused_in_one_line(tmp_path):
    import subprocess

    from helpers.runs import REPO, VACO

    out = subprocess.run(
        [VACO, "report", "--data", str(REPO / "docs" / "data" / "lag_robustness_long.csv.gz"), "--no-mlflow"]
        + ["--out", str(tmp_path), "--step-pairs", "vaco=ppo_clip_tv_matchd"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 2 and "`--step-pairs`: no runs of 'ppo_clip_tv_matchd'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not list(tmp_path.glob("*.png"))
    bad = subprocess.run([VACO, "report", "--data", "x.csv", "--step-pairs", "vaco"], capture_output=True, text=True)
    assert bad.returncode == 2 and "`--step-pairs` takes FILTER=CLIP" in bad.stderr
    for pairs, problem in (
        (["vaco=vaco"], "'vaco=vaco': an arm cannot be its own partner"),
        (["vaco=ppo_clip", "vaco=ppo_clip_tv_matched"], "'vaco=ppo_clip_tv_matched': each arm may be in one pair only"),
        (["vaco=ppo_clip", "vaco_tv_matched=ppo_clip"], "'vaco_tv_matched=ppo_clip': each arm may be in one pair only"),
    ):
        argv = [VACO, "report", "--data", "x.csv", *(f"--step-pairs={p}" for p in pairs)]
        bad = subprocess.run(argv, capture_output=True, text=True)
        assert bad.returncode == 2 and f"`--step-pairs` {problem}" in bad.stderr.strip().splitlines()[0], bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1


def test_a_normalisation_that_cannot_carry_the_differences_is_flagged_first(tmp_path):
    """Two algorithms, one seed each, 28.5 and 32.5 (the README's tiny sweep): the min-max scale
    makes them 0 and 1, which says nothing; the report leads with why. Three seeds a cell whose
    spread is as wide as the range: flagged as seed noise. Three seeds a cell well apart: no flag."""
    import numpy as np

    from helpers.report_runs import make_run
    from vaco.report import build_report, write_report

    def run(algo, seed, final):
        steps = np.array([1000.0, 2000.0])
        return make_run(algo, "Hopper-v5", 1, seed, {"eval/return": (steps, np.array([final / 2, final]))})

    tiny = build_report("tiny", [run("vaco", 1, 28.5), run("ppo_clip", 1, 32.5)], reps=50)
    (line,) = tiny.weak_scale
    assert line.startswith("Hopper-v5: one seed a cell, so the min-max range (28.5 to 32.5)") and line in tiny.notes
    summary = write_report(tiny, tmp_path / "tiny").read_text()
    assert summary.split("\n## ")[0].count("Read with care") == 1 and line in summary.split("\n## ")[0]
    # the figures that draw the 0 and the 1 carry the warning too
    from vaco.report import figure_aggregates, figure_iqm_vs_k

    for fig in (figure_aggregates(tiny)[0], figure_iqm_vs_k(tiny)[0]):
        title = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
        assert "Hopper-v5: the normalising range cannot be told from seed noise" in title, title

    noisy = [run("vaco", s, v) for s, v in enumerate((10.0, 30.0, 20.0))] + [
        run("ppo_clip", s, v) for s, v in enumerate((12.0, 29.0, 25.0))
    ]
    (line,) = build_report("noisy", noisy, reps=50).weak_scale
    assert "under 4 times the seeds' own spread" in line
    apart = [run("vaco", s, 1000.0 + s) for s in range(3)] + [run("ppo_clip", s, 100.0 + s) for s in range(3)]
    assert build_report("apart", apart, reps=50).weak_scale == []


def test_no_algorithms_curve_hides_under_anothers():
    """Two algorithms with the same returns (one seed a cell, a filter that never fired: the README's
    tiny sweep) draw the same curve: each must still be seen in the plot itself, not only in its
    legend. The figure is rendered without its legends and every algorithm's line colour is looked
    for among the pixels (drawn in one style, the algorithm drawn last covered the other)."""
    steps = np.arange(1, 6) * 1000.0
    runs = []
    for algo, level in (("vaco", 0.6), ("ppo_clip", 1.0), ("vaco_no_realign", 1.0)):
        for K in (1, 4):
            for seed in (1, 2, 3):
                ret = 1000.0 * level * steps / steps[-1] + 10.0 * seed  # the same for ppo_clip and vaco_no_realign
                runs.append(make_run(algo, "Hopper-v5", K, seed, {"eval/return": (steps, ret)}))
    rep = R.build_report("twins", runs, reps=50, seed=0)
    figures = {
        "returns": R.figure_returns(rep),
        "sample efficiency": R.figure_sample_efficiency(rep)[0],
        "performance profiles": R.figure_performance_profiles(rep)[0],
    }
    for name, fig in figures.items():
        colours = {}
        for ax in fig.axes:
            for line in ax.get_lines():
                label = str(line.get_label()).split(" (n=")[0]
                if label in ("vaco", "ppo_clip", "vaco_no_realign"):
                    colours[label] = np.array(matplotlib.colors.to_rgb(line.get_color()))
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        for legend in list(fig.legends):
            legend.remove()
        assert set(colours) == {"vaco", "ppo_clip", "vaco_no_realign"}, (name, colours)
        fig.canvas.draw()
        pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0
        for algo, rgb in colours.items():
            seen = int((np.abs(pixels - rgb).max(-1) < 0.03).sum())
            assert seen > 30, f"{name}: {algo}'s curve is hidden ({seen} pixels of its colour)"
        matplotlib.pyplot.close(fig)


def test_a_single_run_shows_no_spread_rather_than_plus_minus_zero():
    from vaco.report.markdown import mean_sd_text

    assert mean_sd_text([1.0], 2) == "1.00 (1 run)"
    assert mean_sd_text([1.0, 3.0], 1) == "2.0 +- 1.4"  # the sample SD, ddof = 1


def test_the_score_against_k_figure_names_the_score_it_draws():
    """`--score last-n` or `auc` draws that score against K; the axis and title say which, not "final"."""
    from vaco.report import figure_iqm_vs_k
    from vaco.report.figures import use_file_backend

    use_file_backend()
    steps = np.array([1000.0, 2000.0, 3000.0])
    runs = [
        make_run(algo, env, K, seed, {"eval/return": (steps, np.array([100.0, 200.0 + seed, 300.0 - 10 * K + seed]))})
        for algo in ("vaco", "ppo_clip")
        for env in ("Hopper-v5", "Walker2d-v5")
        for K in (1, 4)
        for seed in range(3)
    ]
    for kwargs, words in (
        ({}, "final score"),
        ({"score": "last-n", "last_evals": 2}, "mean of the last 2 evaluations"),
        ({"score": "auc"}, "AUC"),
    ):
        (ax,) = figure_iqm_vs_k(R.build_report("named", runs, reps=20, **kwargs))[0].axes
        assert ax.get_ylabel() == f"IQM normalised {words}"
        assert ax.get_title().startswith(f"{words[0].upper()}{words[1:]} against K"), ax.get_title()
