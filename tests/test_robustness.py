"""`vaco report`'s robustness-to-lag section: drops, ratios, the difference of drops and P(drop
smaller), checked against float64 loops written here; the paired bootstrap against a loop that
draws the same seeds; the paper's normalisation; several data files and a task filter."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from helpers.report_runs import make_run
from vaco import report as R
from vaco.commands.report import main as report_main

TASKS = (("Hopper-v5", 1000.0), ("HalfCheetah-v5", 3000.0))
SEEDS = (1, 2, 3, 4, 5, 6)


def _iqm(values) -> float:
    """Interquartile mean by hand: sort, drop int(n/4) values at each end, average the rest."""
    values = sorted(float(v) for v in np.ravel(values))
    cut = int(0.25 * len(values))
    kept = values[cut : len(values) - cut]
    return math.fsum(kept) / len(kept)


def _run(algo, env, K, seed, final, axes=None, realign=False) -> R.Run:
    steps = np.array([1000.0, 2000.0])
    constant = (steps, np.array([0.05, 0.05]))
    histories = {
        "eval/return": (steps, np.array([0.5 * final, final])),
        "lag/forward_tv": constant,
        "train/tv": constant,
        "train/clip_fraction": constant,
    }
    return make_run(
        algo,
        env,
        K,
        seed,
        histories,
        run_id=f"{algo}-{env}-{K}-{seed}-{axes}",
        axes=axes,
        realign=realign,
        fraction_metric="train/clip_fraction",
    )


def _runs(seed: int = 0) -> list[R.Run]:
    """Two algorithms x 2 tasks x K in {1, 4, 16} x 6 seeds; the seed shifts every cell of a task
    alike (paired), ppo_clip loses more with K; plus a control variant that scores far outside."""
    rng = np.random.default_rng(seed)
    runs = []
    for env, scale in TASKS:
        seed_effect = {s: rng.normal(0, 0.1) for s in SEEDS}
        for algo, level, loss in (("vaco", 0.8, 0.02), ("ppo_clip", 0.7, 0.04)):
            for K in (1, 4, 16):
                for s in SEEDS:
                    value = scale * (level - loss * K + seed_effect[s] + rng.normal(0, 0.03))
                    runs.append(_run(algo, env, K, s, value, {"delta": 0.2} if algo == "vaco" else None))
        for K in (1, 4, 16):
            for s in SEEDS:  # far above every main run: it must not set the scale
                runs.append(_run("ppo_clip_tv_matched", env, K, s, scale * 3 + rng.normal(0, 1)))
    return runs


def test_the_main_comparison_is_at_the_main_algorithms_delta_not_a_variants_with_more_seeds():
    """A study whose later looks ran only a delta-0.1 variant arm has more runs at 0.1 than at
    VACO's 0.2: the main comparison stays at 0.2 (the variant is scored, not the reference); with
    only a variant carrying the axis, its value is the reference."""
    runs = [r for r in _runs() if r.algorithm != "ppo_clip_tv_matched"]
    more = [
        make_run(
            "vaco_delta01",
            env,
            K,
            s,
            {"eval/return": (np.array([1000.0]), np.array([1.0]))},
            axes={"delta": 0.1},
            variant_of="vaco",
        )
        for env, _ in TASKS
        for K in (1, 4, 16)
        for s in range(1, 4 * len(SEEDS))
    ]
    rep = R.build_report("axes", runs + more, reps=10)
    assert rep.reference["delta"] == 0.2
    assert {r.algorithm for r in rep.main_runs()} == {"vaco", "ppo_clip"}
    alone = R.build_report("axes", [r for r in runs if r.algorithm == "ppo_clip"] + more, reps=10)
    assert alone.reference["delta"] == 0.1


def _normalised_by_hand(runs):
    """Per task min/max over the main algorithms' runs (vaco, ppo_clip), then every run on it."""
    out = {}
    for env, _ in TASKS:
        main = [r.score()[1][-1] for r in runs if r.env == env and r.algorithm in ("vaco", "ppo_clip")]
        low, high = min(main), max(main)
        for r in runs:
            if r.env == env:
                out[(r.algorithm, r.K, r.env, r.seed)] = (float(r.score()[1][-1]) - low) / (high - low)
    return out


def test_the_paper_normalisation_leaves_variants_out_of_min_and_max():
    runs = _runs()
    rep = R.build_report("robust", runs, reps=10)
    assert rep.normalization == "main"
    by_hand = _normalised_by_hand(runs)
    for r in rep.runs:
        assert rep.normalized[r.run_id] == pytest.approx(by_hand[(r.algorithm, r.K, r.env, r.seed)], abs=1e-12)
    assert all(rep.normalized[r.run_id] > 1.5 for r in rep.runs if r.algorithm == "ppo_clip_tv_matched")
    everything = R.build_report("robust", runs, reps=10, normalization="all")
    for env, _ in TASKS:
        finals = [float(r.score()[1][-1]) for r in runs if r.env == env]
        assert everything.bounds[env] == (min(finals), max(finals))
    with pytest.raises(ValueError, match="normalize-over"):
        R.build_report("robust", runs, normalization="some")
    assert R.is_variant("vaco_no_realign") and R.is_variant("vaco[normalize_advantage=false]")
    assert R.is_variant("ppo_clip+realign") and not R.is_variant("vaco") and not R.is_variant("my_objective")


@pytest.mark.slow
def test_drops_ratios_and_the_interaction_equal_float64_loops():
    runs = _runs()
    rep = R.build_report("robust", runs, reps=300, seed=4)
    got = R.robustness(rep, baseline="ppo_clip")
    x = _normalised_by_hand(runs)
    tasks = sorted(env for env, _ in TASKS)

    def cell(algo, K):
        return [[x[(algo, K, t, s)] for s in SEEDS] for t in tasks]

    assert got.k_ref == 1 and got.baseline == "ppo_clip"
    for algo in ("vaco", "ppo_clip", "ppo_clip_tv_matched"):
        for K in (4, 16):
            d = got.drops[(algo, K)]
            ref, cur = _iqm(cell(algo, 1)), _iqm(cell(algo, K))
            assert (d.level_ref, d.level) == (pytest.approx(ref, abs=1e-12), pytest.approx(cur, abs=1e-12))
            assert d.drop == pytest.approx(ref - cur, abs=1e-12)
            assert d.ratio == pytest.approx(cur / ref, abs=1e-12)
            assert d.seeds == len(SEEDS) and d.tasks == 2
            assert d.drop_interval[0] <= d.drop <= d.drop_interval[1]
    for K in (4, 16):
        i = got.interactions[("vaco", K)]
        drop_v = _iqm(cell("vaco", 1)) - _iqm(cell("vaco", K))
        drop_p = _iqm(cell("ppo_clip", 1)) - _iqm(cell("ppo_clip", K))
        assert i.difference == pytest.approx(drop_p - drop_v, abs=1e-12)
        # P(a vaco run's drop < a ppo_clip run's drop): per task over all pairs of seeds, ties half
        per_task = []
        for t in tasks:
            dv = [x[("vaco", 1, t, s)] - x[("vaco", K, t, s)] for s in SEEDS]
            dp = [x[("ppo_clip", 1, t, s)] - x[("ppo_clip", K, t, s)] for s in SEEDS]
            wins = sum(1.0 if a < b else 0.5 if a == b else 0.0 for a in dv for b in dp)
            per_task.append(wins / (len(dv) * len(dp)))
        assert i.p_smaller == pytest.approx(sum(per_task) / len(per_task), abs=1e-12)
        assert i.difference > 0  # the synthetic ppo_clip loses 0.04 per unit of K, vaco 0.02
    # per task: means, the mean paired drop and its sample SD (ddof = 1)
    for t in got.per_task:
        drops = [x[(t.algorithm, 1, t.task, s)] - x[(t.algorithm, t.K, t.task, s)] for s in SEEDS]
        mean = math.fsum(drops) / len(drops)
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in drops) / (len(drops) - 1))
        assert t.drop == pytest.approx(mean, abs=1e-12) and t.drop_sd == pytest.approx(sd, abs=1e-12)
    frame = got.frame()
    assert len(frame) == 6 and set(frame.columns) >= {"drop", "ratio", "difference", "p_smaller"}


def test_the_paired_bootstrap_draws_one_set_of_seeds_per_task_for_every_cell():
    """A loop that draws the same indices by hand: the four cells move together."""
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    samples = R.paired_bootstrap(
        [a, b], lambda p, q: np.stack([(p - q).sum(axis=(-2, -1)), p.sum(axis=(-2, -1))], axis=-1), reps=50, seed=11
    )
    draw = np.random.default_rng(11)
    for rep in range(50):
        rows = draw.integers(0, 5, size=(5, 2))
        diff = sum(a[rows[i, j], j] - b[rows[i, j], j] for i in range(5) for j in range(2))
        total = sum(a[rows[i, j], j] for i in range(5) for j in range(2))
        assert samples[rep, 0] == pytest.approx(diff, abs=1e-12)
        assert samples[rep, 1] == pytest.approx(total, abs=1e-12)
    # pairing matters: b = a + 1 exactly, so every paired resample of mean(a - b) is -1
    paired = R.paired_bootstrap([a, a + 1.0], lambda p, q: (p - q).mean(axis=(-2, -1)), reps=200, seed=0)
    assert paired.shape == (200, 1) and np.allclose(paired, -1.0)


def test_the_batched_iqm_and_p_smaller_are_rliables_on_each_resample():
    """The statistics the bootstrap computes for all resamples at once equal rliable's called on one
    resample at a time (scipy's trim_mean; Mann-Whitney U over pairs, ties a half)."""
    from rliable import metrics

    rng = np.random.default_rng(3)
    x = rng.normal(size=(20, 7, 3)).round(1)  # rounded: ties between runs
    y = rng.normal(size=(20, 7, 3)).round(1)
    from vaco.report.robustness import iqm, p_smaller

    batched_iqm, batched_p = iqm(x), p_smaller(x, y)
    for i in range(20):
        assert batched_iqm[i] == pytest.approx(metrics.aggregate_iqm(x[i]), abs=1e-12)
        assert batched_p[i] == pytest.approx(metrics.probability_of_improvement(-x[i], -y[i]), abs=1e-12)


def test_distinct_resamples_are_multisets_counted_by_hand():
    for n in range(1, 7):
        by_hand = len({tuple(sorted(c)) for c in itertools.product(range(n), repeat=n)})
        assert R.distinct_resamples(n) == by_hand
    assert R.distinct_resamples(3) == 10 and R.distinct_resamples(10) == 92378


@pytest.mark.slow
def test_the_summary_leads_with_robustness_and_warns_of_few_resamples(tmp_path):
    runs = [r for r in _runs() if r.seed <= 3]
    rep = R.build_report("robust", runs, reps=100)
    summary = R.write_report(rep, tmp_path).read_text()
    assert summary.index("## Robustness to lag") < summary.index("## Final scores")
    assert "difference of drops" in summary and "| vaco | 4 |" in summary
    assert "3 seeds per task give 10 per task" in summary and "**Warning:**" in summary
    assert "sample SD (ddof = 1)" in summary and "ppo_clip_tv_matched" in summary.split("## Normalisation")[1]
    assert (tmp_path / "robustness.png").is_file()
    # one K only: the section says what it needs
    one_k = R.build_report("one", [r for r in runs if r.K == 1], reps=10)
    text = R.write_report(one_k, tmp_path / "one").read_text()
    assert "needs runs of an algorithm at two or more K" in text


@pytest.mark.slow
def test_vaco_report_reads_several_data_files_and_filters_tasks(tmp_path, capsys):
    runs = _runs()
    first = R.save_runs([r for r in runs if r.seed <= 3], tmp_path / "part1.csv.gz")
    second = R.save_runs([r for r in runs if r.seed >= 3], tmp_path / "part2.csv.gz")  # seed 3 in both
    out = tmp_path / "report"
    code = report_main(
        [
            "--data",
            str(first),
            str(second),
            "--tasks",
            "Hopper-v5",
            "--baseline",
            "ppo_clip",
            "--reps",
            "50",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    summary = (out / "summary.md").read_text()
    assert "1 task(s) (Hopper-v5)" in summary and f"{len(runs) // 2} finished runs" in summary
    assert "| vaco | 4 |" in summary
    assert report_main(["--data", str(first), "--tasks", "Ant-v5", "--out", str(out)]) == 2
    assert "`--tasks`: no runs of Ant-v5" in capsys.readouterr().err
    kept = tmp_path / "kept"
    argv = ["--data", str(first), str(second), "--algorithms", "vaco", "ppo_clip", "--reps", "50"]
    assert report_main([*argv, "--out", str(kept)]) == 0, capsys.readouterr().err
    summary = (kept / "summary.md").read_text()
    assert "ppo_clip_tv_matched" not in summary and "| vaco | 4 |" in summary
    assert f"{len([r for r in runs if r.algorithm != 'ppo_clip_tv_matched'])} finished runs" in summary
    assert report_main(["--data", str(first), "--algorithms", "vaco", "spo", "--out", str(out)]) == 2
    assert "`--algorithms`: no runs of spo; the algorithms are ppo_clip, ppo_clip_tv_matched, vaco" in (
        capsys.readouterr().err
    )
    assert report_main(["--data", str(tmp_path / "missing.csv.gz"), "--out", str(out)]) == 2
    assert "`--data`: no data file at" in capsys.readouterr().err
    # a cell run twice (another run id: rerun in a second store, exported again) is refused, not paired twice
    again = dataclasses.replace(next(r for r in runs if r.seed == 1 and r.algorithm == "vaco"), run_id="rerun")
    twice = R.save_runs([again], tmp_path / "rerun.csv.gz")
    assert report_main(["--data", str(first), str(twice), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("vaco report: `--data`: two different runs of one cell: vaco")
    assert f"seed 1 ({first} and {twice})" in err and not (tmp_path / "never").exists()


def _assert_summary_is_the_datas(rep, path: Path) -> None:
    """A committed summary's bounds, differences of drops and drops are those of ``rep``."""
    summary = path.read_text()
    for task, (low, high) in rep.bounds.items():
        assert f"| {task} | {low:.1f} | {high:.1f} |" in summary
    lag = R.robustness(rep)
    for (algo, K), x in lag.interactions.items():
        assert f"| {algo} | {K} | {x.difference:.3f} [" in summary, (algo, K)
    for (algo, K), d in lag.drops.items():
        assert f"| {algo} | {K} | {d.level_ref:.3f} | {d.level:.3f} | {d.drop:.3f} [" in summary, (algo, K)


def test_the_lag_robustness_study_figures_come_from_its_committed_data():
    """docs/figures/lag_robustness/ was written by `vaco report --data five_tasks.csv.gz
    lag_robustness.csv.gz --tasks Hopper-v5 HalfCheetah-v5`: the committed data hold the study's
    runs (10 seeds per cell), and the summary's bounds and point estimates are the data's."""
    from vaco.report.runs import read_data_files

    repo = Path(__file__).resolve().parents[1]
    runs, _ = read_data_files(
        [str(repo / "docs/data/five_tasks.csv.gz"), str(repo / "docs/data/lag_robustness.csv.gz")]
    )
    runs = [r for r in runs if r.env in ("Hopper-v5", "HalfCheetah-v5")]
    rep = R.build_report("lag_robustness", runs, reps=1, baseline="ppo_clip")
    cells = {}
    for r in rep.runs:
        cells.setdefault((r.algorithm, r.K, r.env), set()).add(r.seed)
    for algo in ("vaco", "ppo_clip", "ppo_clip_tv_matched", "vaco_no_realign"):
        for K in (1, 4, 16):
            for env in ("Hopper-v5", "HalfCheetah-v5"):
                assert cells[(algo, K, env)] == set(range(1, 11)), (algo, K, env)
    _assert_summary_is_the_datas(rep, repo / "docs/figures/lag_robustness/summary.md")


ARMS_2X2 = ("vaco", "ppo_clip", "ppo_clip_large_step", "vaco_tv_matched", "ppo_clip_small_step")


def _two_by_two_report(name: str, files: list[str]):
    """The report section 8's commands write from these committed data files: the 2x2's five arms on
    Hopper and HalfCheetah, both step pairs; with the seeds each (algorithm, K, task) cell holds."""
    from vaco.report.runs import read_data_files

    repo = Path(__file__).resolve().parents[1]
    runs, _ = read_data_files([str(repo / f"docs/data/{f}.csv.gz") for f in files])
    runs = [r for r in runs if r.env in ("Hopper-v5", "HalfCheetah-v5") and r.algorithm in ARMS_2X2]
    pairs = {"vaco": "ppo_clip_large_step", "vaco_tv_matched": "ppo_clip_small_step"}
    rep = R.build_report(name, runs, reps=1, baseline="ppo_clip", step_pairs=pairs)
    cells: dict[tuple, set[int]] = {}
    for r in rep.runs:
        cells.setdefault((r.algorithm, r.K, r.env), set()).add(r.seed)
    return rep, cells


@pytest.mark.slow
def test_the_2x2_study_figures_come_from_its_committed_data():
    """docs/figures/lag_2x2/ was written by the `vaco report` command in docs/results.md section 8
    from the committed data (the five arms at >= 20 seeds a cell, both tasks, K 1/4/16, and at K 1/4
    the two sizing steps' 36 seeds of the four 2x2 arms and 28 of PPO-clip): its bounds, drops,
    differences of drops and 2x2 contrasts are the data's."""
    repo = Path(__file__).resolve().parents[1]
    rep, cells = _two_by_two_report("lag_2x2", ["five_tasks", "lag_robustness", "lag_2x2"])
    for algo in ARMS_2X2:
        for K in (1, 4, 16):
            for env in ("Hopper-v5", "HalfCheetah-v5"):
                assert cells[(algo, K, env)] >= set(range(1, 21)), (algo, K, env)
    for K in (1, 4):  # the two sizing steps at K 1 and 4 (section 8, point 5)
        for env in ("Hopper-v5", "HalfCheetah-v5"):
            assert cells[("ppo_clip", K, env)] >= set(range(1, 29)), ("ppo_clip", K, env)
            for algo in ("vaco", "ppo_clip_large_step", "vaco_tv_matched", "ppo_clip_small_step"):
                assert cells[(algo, K, env)] >= set(range(1, 37)), (algo, K, env)
    _assert_summary_is_the_datas(rep, repo / "docs/figures/lag_2x2/summary.md")
    design = R.two_by_two(rep)
    assert design.large == ("vaco", "ppo_clip_large_step") and design.small == (
        "vaco_tv_matched",
        "ppo_clip_small_step",
    )
    summary = (repo / "docs/figures/lag_2x2/summary.md").read_text()
    assert len(design.contrasts) == 2 * len(R.CONTRASTS)  # K = 4 and 16
    for c in design.contrasts:
        assert f"| {c.K} | {c.name} | {c.estimate:.3f} [" in summary, (c.K, c.name)
    rows = R.design_rows(rep, design)  # the contrasts under every scoring: the min-max column's estimates
    assert len(rows) == 2 * len(R.CONTRASTS) * 12
    for r in (r for r in rows if r.scale == "min-max"):
        score = r.score if r.score != "last-n" else "last-3"
        assert f"| {r.algorithm} | {r.K} | {score} | {r.aggregate} | {r.difference:.3f} [" in summary, r


def test_the_long_2x2_figures_come_from_its_committed_data():
    """docs/figures/lag_2x2_long/ was written by the `vaco report` command of results.md section 8's
    ~1M-step part from the committed data (the five arms at 10 seeds a cell, both tasks, K 1/16:
    VACO's and PPO-clip's seeds 1-3 from lag_robustness_long.csv.gz, the rest from lag_2x2_long.csv.gz):
    its bounds, drops, differences of drops and the K = 16 2x2 contrasts are the data's."""
    repo = Path(__file__).resolve().parents[1]
    rep, cells = _two_by_two_report("lag_2x2_long", ["lag_robustness_long", "lag_2x2_long"])
    assert set(cells) == {(a, K, e) for a in ARMS_2X2 for K in (1, 16) for e in ("Hopper-v5", "HalfCheetah-v5")}
    for key, seeds in cells.items():
        assert seeds == set(range(1, 11)), key
    _assert_summary_is_the_datas(rep, repo / "docs/figures/lag_2x2_long/summary.md")
    design = R.two_by_two(rep)
    summary = (repo / "docs/figures/lag_2x2_long/summary.md").read_text()
    assert len(design.contrasts) == len(R.CONTRASTS)  # K = 16 only
    for c in design.contrasts:
        assert c.K == 16 and f"| {c.K} | {c.name} | {c.estimate:.3f} [" in summary, (c.K, c.name)


def _assert_finished_runs_of(runs, cells: dict, evaluations: list[int]) -> None:
    """Each run is a cell of ``cells`` (by name), once, FINISHED, with the cell's coordinates and a
    finite ``eval/return`` at exactly ``evaluations``."""
    names = [r.name for r in runs]
    assert len(names) == len(set(names)) and set(names) <= set(cells), sorted(set(names) - set(cells))
    for r in runs:
        cell = cells[r.name]
        assert (r.algorithm, r.K, r.seed, r.status) == (cell.algorithm, cell.K, cell.seed, "FINISHED"), r.name
        steps, values = r.histories["eval/return"]
        assert list(steps) == evaluations and np.isfinite(values).all(), r.name


def test_the_long_2x2_data_are_finished_runs_of_its_sweep_file():
    """docs/data/lag_2x2_long.csv.gz, the ~1M-step part of results.md section 8 (filled in blocks
    across sessions), holds only cells of configs/sweeps/lag_2x2_long.yaml, each once, finished and
    evaluated every 20 iterations up to 983,040 steps; results.md states how many of the sweep's
    cells it holds."""
    from vaco import sweep as S

    repo = Path(__file__).resolve().parents[1]
    cells = {c.id: c for c in S.expand(S.load_sweep(repo / "configs/sweeps/lag_2x2_long.yaml"))}
    runs = R.read_runs(repo / "docs/data/lag_2x2_long.csv.gz")
    _assert_finished_runs_of(runs, cells, [81_920 * i for i in range(1, 13)])
    text = (repo / "docs/results.md").read_text()
    assert f"**{len(runs)} of the {len(cells)} runs**" in text


@pytest.mark.slow
def test_the_2x2_data_are_every_cell_of_its_sweep_file():
    """docs/data/lag_2x2.csv.gz (results.md section 8, filled in blocks across sessions; the second
    sizing step's 192 runs kept apart until all were in, then merged in one step) holds every cell of
    configs/sweeps/lag_2x2.yaml once, finished and evaluated 6 times to 245,760 steps, and nothing
    else; results.md states the count."""
    from vaco import sweep as S

    repo = Path(__file__).resolve().parents[1]
    cells = {c.id: c for c in S.expand(S.load_sweep(repo / "configs/sweeps/lag_2x2.yaml"))}
    runs = R.read_runs(repo / "docs/data/lag_2x2.csv.gz")
    _assert_finished_runs_of(runs, cells, [40_960 * i for i in range(1, 7)])
    assert len(runs) == len(cells) == 768
    assert f"**all {len(cells)} runs of its sweep file**" in (repo / "docs/results.md").read_text()


def test_an_llm_report_asks_the_papers_question_on_accuracy_as_accuracy():
    """On the LLM track's runs (scored by eval/accuracy, GRPO and VACO-GRPO at N = 1 and 16) the
    report's default baseline is GRPO, so the VACO-GRPO against GRPO difference of drops is there
    with no flag; accuracy is not min-max stretched (a 0.007 gap stays 0.007, where the runs' own
    min and max made it 1.0): each normalised score is the accuracy itself."""
    steps = np.array([10.0, 20.0])
    rng = np.random.default_rng(3)
    runs = []
    for algo, loss in (("grpo", 0.010), ("vaco_grpo", 0.003)):
        for N in (1, 16):
            for s in range(1, 7):
                acc = 0.92 - loss * (N > 1) + rng.normal(0, 0.002)
                runs.append(
                    make_run(
                        algo,
                        "gsm8k",
                        N,
                        s,
                        {"eval/accuracy": (steps, np.array([0.5, acc]))},
                        score_metric="eval/accuracy",
                    )
                )
    report = R.build_report("llm", runs, reps=200)
    assert all(report.normalized[r.run_id] == r.score()[1][-1] for r in report.runs)
    assert any("scored as it is" in n for n in report.notes)
    lag = R.robustness(report)
    assert lag.baseline == "grpo" and ("vaco_grpo", 16) in lag.interactions
    by_hand = (
        _iqm([r.score()[1][-1] for r in runs if (r.algorithm, r.K) == ("grpo", 1)])
        - _iqm([r.score()[1][-1] for r in runs if (r.algorithm, r.K) == ("grpo", 16)])
    ) - (
        _iqm([r.score()[1][-1] for r in runs if (r.algorithm, r.K) == ("vaco_grpo", 1)])
        - _iqm([r.score()[1][-1] for r in runs if (r.algorithm, r.K) == ("vaco_grpo", 16)])
    )
    assert lag.interactions[("vaco_grpo", 16)].difference == pytest.approx(by_hand, abs=1e-12)
    assert abs(by_hand) < 0.02


def _judged_from_committed(study: str, sweep_file: str):
    """A confirmatory study's committed data and plan record (``docs/data/<study>.csv.gz`` and
    ``<study>_record.json``): every run a finished cell of its sweep file, once, evaluated 6 times to
    245,760 steps; the plan declared (and its sweep file committed) before the first run started; and
    the plan judged on the data against the record's looks, as `vaco report --data` judges it
    (normalised by the plan's references). Returns the judgement, the record's judgements and the
    report judged."""
    import json
    from datetime import datetime

    from vaco import sweep as S
    from vaco.study.judge import judge_plan, plan_from_tags, read_judgements

    repo = Path(__file__).resolve().parents[1]
    cells = {c.id: c for c in S.expand(S.load_sweep(repo / sweep_file))}
    runs = R.read_runs(repo / f"docs/data/{study}.csv.gz")
    _assert_finished_runs_of(runs, cells, [40_960 * i for i in range(1, 7)])
    record = json.loads((repo / f"docs/data/{study}_record.json").read_text())
    tags = record["parent_run_tags"]
    utc = "%Y-%m-%d %H:%M:%S UTC"
    declared = datetime.strptime(tags["vaco.plan.declared"], utc)
    committed = datetime.strptime(tags["vaco.plan.commit"].split(" ", 1)[1], utc)
    assert committed <= declared < datetime.strptime(record["first_run_start"], utc)
    plan = plan_from_tags(tags)
    fixed = {task: (low, high) for task, low, high in plan.references}
    report = R.build_report(study, runs, score=plan.score, margin=plan.margin, fixed_bounds=fixed)
    earlier = read_judgements(tags)
    return judge_plan(plan, report, tags["vaco.plan.declared"], earlier, tags["vaco.plan.commit"]), earlier, report


def test_the_lag_benchmarks_kept_runs_are_its_declared_cells_and_no_look_was_read_early():
    """docs/data/lag_bench_runs.csv.gz, the benchmark's runs kept between blocks, and its record: every
    run a finished cell of configs/sweeps/lag_bench.yaml, once, evaluated 6 times to 245,760 steps; the
    record is the sweep file's plan (same digest), declared after its commit and before the first run;
    no look is recorded before all of look 1's cells have finished, and every recorded look was taken
    by `--until-decided`; results.md states how many of look 1's runs the file holds."""
    import json
    from datetime import datetime

    from vaco import sweep as S
    from vaco.study.judge import read_judgements
    from vaco.study.looks import look_cells

    repo = Path(__file__).resolve().parents[1]
    sweep = S.load_sweep(repo / "configs/sweeps/lag_bench.yaml")
    cells = {c.id: c for c in S.expand(sweep)}
    runs = R.read_runs(repo / "docs/data/lag_bench_runs.csv.gz")
    _assert_finished_runs_of(runs, cells, [40_960 * i for i in range(1, 7)])
    record = json.loads((repo / "docs/data/lag_bench_runs_record.json").read_text())
    tags = record["parent_run_tags"]
    assert tags["vaco.plan.digest"] == sweep.plan.digest and record["finished_runs"] == len(runs)
    utc = "%Y-%m-%d %H:%M:%S UTC"
    declared = datetime.strptime(tags["vaco.plan.declared"], utc)
    committed = datetime.strptime(tags["vaco.plan.commit"].split(" ", 1)[1], utc)
    assert committed <= declared < datetime.strptime(record["first_run_start"], utc)
    look1 = {c.id for c in look_cells(list(cells.values()), sweep.plan.looks[0])}
    looks = read_judgements(tags)
    assert all(j.by == "until-decided" for j in looks)
    if not look1 <= {r.name for r in runs}:
        assert not looks, "a look was recorded before look 1's runs were all in"
        kept = sum(r.name in look1 for r in runs)
        assert f"{kept} of its {len(look1)} runs" in (repo / "docs/results.md").read_text()
    else:
        assert sweep.plan.looks[0] in {j.seeds for j in looks}, "look 1's runs are all in, but no look was judged"


def _assert_verdicts_stated(judged, earlier) -> None:
    """Every family verdict judged from a study's committed data is the one its sweep recorded at its
    last look (``--until-decided``) and the one the table of results.md states, with the look its
    seeds make it; and each task's split (IQM and untrimmed mean, HalfCheetah then Hopper) is in
    results.md beside it."""
    last = [j for j in earlier if j.by == "until-decided"][-1]
    assert {v.comparison.label(): v.word for v in judged.verdicts} == last.words
    text = (Path(__file__).resolve().parents[1] / "docs/results.md").read_text()
    table = text.split("# Exploratory evidence")[0]
    for v in judged.verdicts:
        look = judged.plan.looks.index(v.seeds) + 1
        stated = (
            f"**{v.word}** (look {look}, {v.seeds} seeds): {v.estimate:+.3f} [{v.interval[0]:.3f}, {v.interval[1]:.3f}]"
        )
        assert stated in table, (v.comparison.label(), stated)
        hc, hop = (
            dict((task, (iqm, mean)) for task, iqm, mean in v.per_task)[t] for t in ("HalfCheetah-v5", "Hopper-v5")
        )
        assert f"| {hc[0]:+.3f} ({hc[1]:+.3f}) | {hop[0]:+.3f} ({hop[1]:+.3f}) |" in text, v.comparison.label()


@pytest.mark.slow
def test_the_confirmatory_studys_verdicts_come_from_its_committed_data_and_record():
    """docs/data/confirm_k4.csv.gz and its record (see :func:`_judged_from_committed`): every family
    verdict judged from them alone is the one the table of results.md states, with the look its
    seeds make it and the words the sweep recorded at its last look; and each task's split (IQM and
    untrimmed mean) is results.md's sensitivity table."""
    judged, earlier, _ = _judged_from_committed("confirm_k4", "configs/sweeps/confirm_lag.yaml")
    assert len(judged.verdicts) == 3 and not judged.missing
    _assert_verdicts_stated(judged, earlier)


@pytest.mark.slow
def test_the_lag_benchmarks_verdicts_and_figures_come_from_its_committed_data_and_record():
    """docs/data/lag_bench_runs.csv.gz and its record (see :func:`_judged_from_committed`), once a
    look has been judged: its four verdicts, judged from them alone, are the words `--until-decided`
    recorded at its last look and the ones results.md's table states with each task's split; and
    docs/figures/lag_bench/summary.md (the exploratory drops and differences of drops) is the data's."""
    judged, earlier, report = _judged_from_committed("lag_bench_runs", "configs/sweeps/lag_bench.yaml")
    assert earlier and len(judged.verdicts) == 4 and not judged.missing
    _assert_verdicts_stated(judged, earlier)
    _assert_summary_is_the_datas(report, Path(__file__).resolve().parents[1] / "docs/figures/lag_bench/summary.md")


def test_the_llm_cpu_grids_accuracies_in_llm_md_come_from_its_committed_data():
    """docs/data/llm_cpu.csv.gz holds the 45 cells of configs/sweeps/llm_cpu.yaml, finished; the
    accuracy table of docs/llm.md's results is each arm's mean final eval/accuracy over its seeds."""
    from vaco import sweep as S

    repo = Path(__file__).resolve().parents[1]
    cells = {c.id: c for c in S.expand(S.load_sweep(repo / "configs/sweeps/llm_cpu.yaml"))}
    runs = R.read_runs(repo / "docs/data/llm_cpu.csv.gz")
    assert sorted(r.name for r in runs) == sorted(cells) and {r.status for r in runs} == {"FINISHED"}
    rows = {
        "grpo": "| 1e-4 | GRPO |",
        "vaco_grpo": "| 1e-4 | VACO-GRPO |",
        "vaco_grpo_seq": "| 1e-4 | VACO-GRPO, per-completion filter |",
        "grpo[lr=0.0003]": "| 3e-4 (stress) | GRPO |",
        "vaco_grpo[lr=0.0003]": "| 3e-4 (stress) | VACO-GRPO |",
    }
    text = (repo / "docs/llm.md").read_text()
    for algo, row in rows.items():
        means = []
        for K in (1, 4, 16):
            finals = [float(r.histories["eval/accuracy"][1][-1]) for r in runs if (r.algorithm, r.K) == (algo, K)]
            assert len(finals) == 3, (algo, K)
            means.append(f"{math.fsum(finals) / 3:.3f}")
        assert f"{row} {' | '.join(means)} |" in text, (algo, means)


def test_a_console_verdict_names_the_test_that_gave_it():
    """6 seeds a cell: the verdicts come from the exact sign-flip test, the intervals beside them from the
    bootstrap; the console line says both, so an undecided word is not read off the interval."""
    from vaco.report.robustness_summary import verdict_lines

    lines = verdict_lines(R.robustness(R.build_report("six", _runs(), reps=50)))
    flips = [line for line in lines if "(by the sign-flip (exact) test; the interval is the bootstrap's)" in line]
    assert flips and all("->" in line for line in flips), lines
