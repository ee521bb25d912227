"""`vaco report`'s 2x2 step-size design (two `--step-pairs`): the five contrasts against float64
loops written here, their bootstrap against a loop that draws the same seeds, which pair is the
large step, the arm run at its own delta kept in the comparison, and the command line's lines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.report_runs import make_run
from vaco import report as R
from vaco.commands.report import main as report_main
from vaco.report.design import CONTRASTS, two_by_two

TASKS = (("Hopper-v5", 1000.0), ("HalfCheetah-v5", 3000.0))
SEEDS = tuple(range(1, 13))
# arm -> (objective, delta or None, variant_of, realised TV, K = 1 level, loss per unit of K)
ARMS = {
    "vaco": ("TVFilter", 0.2, None, 0.09, 0.80, 0.010),
    "ppo_clip_large_step": ("PPOClip", None, "ppo_clip", 0.09, 0.78, 0.030),
    "vaco_tv_matched": ("TVFilter", 0.1, "vaco", 0.045, 0.70, 0.012),
    "ppo_clip_small_step": ("PPOClip", None, "ppo_clip", 0.046, 0.70, 0.014),
    "ppo_clip": ("PPOClip", None, None, 0.05, 0.72, 0.020),
}


def _iqm(values) -> float:
    """Interquartile mean by hand: sort, drop int(n/4) values at each end, average the rest."""
    values = sorted(float(v) for v in np.ravel(values))
    cut = int(0.25 * len(values))
    kept = values[cut : len(values) - cut]
    return math.fsum(kept) / len(kept)


def _run(algo, env, K, seed, final) -> R.Run:
    objective, delta, variant_of, tv, _, _ = ARMS[algo]
    steps = np.array([1000.0, 2000.0])
    histories = {
        "eval/return": (steps, np.array([0.5 * final, final])),
        "lag/forward_tv": (steps, np.array([tv, tv])),
    }
    return make_run(
        algo,
        env,
        K,
        seed,
        histories,
        axes={"delta": delta} if delta is not None else {},
        realign=objective == "TVFilter",
        objective=objective,
        fraction_metric="train/clip_fraction",
        variant_of=variant_of,
    )


def _runs(seed: int = 0) -> list[R.Run]:
    rng = np.random.default_rng(seed)
    runs = []
    for env, scale in TASKS:
        seed_effect = {s: rng.normal(0, 0.08) for s in SEEDS}
        for algo, (*_, level, loss) in ARMS.items():
            for K in (1, 4, 16):
                for s in SEEDS:
                    value = scale * (level - loss * K + seed_effect[s] + rng.normal(0, 0.03))
                    runs.append(_run(algo, env, K, s, value))
    return runs


PAIRS = {"vaco_tv_matched": "ppo_clip_small_step", "vaco": "ppo_clip_large_step"}  # small declared first


def test_the_contrasts_equal_float64_loops_and_the_large_pair_is_read_from_the_data():
    runs = _runs()
    rep = R.build_report("design", runs, reps=200, seed=3, step_pairs=PAIRS)
    assert rep.reference["delta"] == 0.2  # vaco's, the most used value
    # the small filter arm runs at delta 0.1 only: a declared arm, so in the comparison at its own value
    assert {r.algorithm for r in rep.main_runs()} == set(ARMS)
    assert not R.build_report("design", runs, reps=10).is_reference(
        next(r for r in runs if r.algorithm == "vaco_tv_matched")
    )
    design = two_by_two(rep)
    assert design.large == ("vaco", "ppo_clip_large_step")  # the filter arm that moves further at K = 1
    assert design.small == ("vaco_tv_matched", "ppo_clip_small_step")
    tasks = sorted(env for env, _ in TASKS)
    x = {r.run_id: rep.normalized[r.run_id] for r in rep.runs}
    by = {(r.algorithm, r.K, r.env, r.seed): x[r.run_id] for r in rep.runs}

    def drop(algo, K):
        ref = [by[(algo, 1, t, s)] for t in tasks for s in SEEDS]
        cur = [by[(algo, K, t, s)] for t in tasks for s in SEEDS]
        return _iqm(ref) - _iqm(cur)

    order = ["vaco", "ppo_clip_large_step", "vaco_tv_matched", "ppo_clip_small_step"]
    assert [(c.K, c.name) for c in design.contrasts] == [(K, n) for K in (4, 16) for n in CONTRASTS]
    for c in design.contrasts:
        d = {a: drop(a, c.K) for a in order}
        a_large = d["ppo_clip_large_step"] - d["vaco"]
        a_small = d["ppo_clip_small_step"] - d["vaco_tv_matched"]
        expected = {
            "filter vs clip, large step": a_large,
            "filter vs clip, small step": a_small,
            "objective (main effect)": (a_large + a_small) / 2,
            "step size (main effect)": (
                d["vaco_tv_matched"] + d["ppo_clip_small_step"] - d["vaco"] - d["ppo_clip_large_step"]
            )
            / 2,
            "objective x step size": a_large - a_small,
        }[c.name]
        assert c.estimate == pytest.approx(expected, abs=1e-12)
        assert c.seeds == len(SEEDS) and c.tasks == 2
        assert c.interval[0] <= c.estimate <= c.interval[1]
        assert c.verdict.word in ("differs", "equivalent", "undecided")
    # the synthetic large clip arm loses 0.030 per unit of K against the filter's 0.010: the filter's
    # advantage at the large step is clear at K = 16 (about 0.3 of the K = 1 level), the small pair's is not
    at16 = {c.name: c for c in design.contrasts if c.K == 16}
    assert at16["filter vs clip, large step"].verdict.word == "differs"
    assert at16["filter vs clip, large step"].estimate > 0.2
    assert at16["objective x step size"].estimate > 0.15


def test_the_contrast_bootstrap_draws_one_set_of_seeds_per_task_for_all_eight_cells():
    runs = _runs(1)
    rep = R.build_report("design", runs, reps=50, seed=7, step_pairs=PAIRS)
    design = two_by_two(rep)
    tasks = sorted(env for env, _ in TASKS)
    by = {(r.algorithm, r.K, r.env, r.seed): rep.normalized[r.run_id] for r in rep.runs}
    order = ["vaco", "ppo_clip_large_step", "vaco_tv_matched", "ppo_clip_small_step"]
    K = 4
    cells = [np.array([[by[(a, k, t, s)] for t in tasks] for s in SEEDS]) for a in order for k in (1, K)]
    rng = np.random.default_rng(7)  # the draws paired_bootstrap makes: per resample, seeds x tasks
    samples = []
    for _ in range(50):
        rows = rng.integers(0, len(SEEDS), size=(len(SEEDS), len(tasks)))
        drawn = [np.array([[c[rows[i, j], j] for j in range(len(tasks))] for i in range(len(SEEDS))]) for c in cells]
        d = [_iqm(drawn[2 * i]) - _iqm(drawn[2 * i + 1]) for i in range(4)]
        samples.append((d[1] - d[0]) - (d[3] - d[2]))  # objective x step size
    mine = next(c for c in design.contrasts if c.K == K and c.name == "objective x step size")
    assert mine.interval == pytest.approx(np.percentile(samples, [2.5, 97.5]), abs=1e-12)


@pytest.mark.slow
def test_no_design_without_two_pairs_and_the_command_line_prints_it(tmp_path, capsys):
    runs = _runs(2)
    assert two_by_two(R.build_report("design", runs, reps=10, step_pairs={"vaco": "ppo_clip_large_step"})) is None
    assert two_by_two(R.build_report("design", runs, reps=10)) is None
    data = tmp_path / "runs.csv.gz"
    R.save_runs(runs, data)
    argv = ["--data", str(data), "--out", str(tmp_path / "out"), "--reps", "50", "--no-sensitivity"]
    argv += [f"--step-pairs={f}={c}" for f, c in PAIRS.items()]
    assert report_main(argv) == 0
    out = capsys.readouterr().out
    assert "the 2x2 design (large step vaco / ppo_clip_large_step, small vaco_tv_matched / ppo_clip_small_step)" in out
    assert out.count("  2x2 K=") == 2 * len(CONTRASTS)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "### The 2x2 design: objective x step size" in summary
    assert summary.count("| objective x step size |") == 2


@pytest.mark.slow
def test_the_contrasts_under_every_scoring_reproduce_the_headline_and_a_floor_free_mean_by_hand(tmp_path, capsys):
    runs = _runs(3)
    rep = R.build_report("design", runs, reps=100, seed=5, step_pairs=PAIRS)
    design = two_by_two(rep)
    sens = R.sensitivity(rep, R.robustness(rep), design=design)
    rows = sens.design
    assert len(rows) == 2 * len(CONTRASTS) * 3 * 2 * 2  # K 4/16 x contrasts x scores x aggregates x scales
    headline = {(c.K, c.name): c for c in design.contrasts}
    declared = [r for r in rows if r.declared]
    assert len(declared) == len(headline)
    for r in declared:  # the same cells, seeds and bootstrap draws as the design's own table
        c = headline[(r.K, r.algorithm)]
        assert (r.score, r.aggregate, r.scale) == ("final", "IQM", "min-max")
        assert r.difference == pytest.approx(c.estimate, abs=1e-12)
        assert r.interval == pytest.approx(tuple(c.interval), abs=1e-12) and r.verdict.word == c.verdict.word
    # final score, mean aggregate, floor-free scale (x / the best final of vaco and ppo_clip on the task),
    # the interaction at K = 16, by hand
    tasks = sorted(env for env, _ in TASKS)
    final = {(r.algorithm, r.K, r.env, r.seed): r.histories["eval/return"][1][-1] for r in runs}
    top = {t: max(v for (a, _, env, _), v in final.items() if env == t and a in ("vaco", "ppo_clip")) for t in tasks}

    def drop(algo, K):
        ref = [final[(algo, 1, t, s)] / top[t] for t in tasks for s in SEEDS]
        cur = [final[(algo, K, t, s)] / top[t] for t in tasks for s in SEEDS]
        return math.fsum(ref) / len(ref) - math.fsum(cur) / len(cur)

    d = {a: drop(a, 16) for a in ("vaco", "ppo_clip_large_step", "vaco_tv_matched", "ppo_clip_small_step")}
    expected = (d["ppo_clip_large_step"] - d["vaco"]) - (d["ppo_clip_small_step"] - d["vaco_tv_matched"])
    (mine,) = [
        r
        for r in rows
        if (r.algorithm, r.K, r.score, r.aggregate, r.scale)
        == ("objective x step size", 16, "final", "mean", "floor-free")
    ]
    assert mine.difference == pytest.approx(expected, abs=1e-12)
    assert mine.interval[0] <= mine.difference <= mine.interval[1]
    words = {}
    for r in rows:
        words.setdefault((r.algorithm, r.K), set()).add(r.verdict.word)
    assert set(sens.scale_dependent(design=True)) == {key for key, w in words.items() if len(w) > 1}
    # the command line prints and writes them
    data = tmp_path / "runs.csv.gz"
    R.save_runs(runs, data)
    argv = ["--data", str(data), "--out", str(tmp_path / "out"), "--reps", "50"]
    assert report_main([*argv, *(f"--step-pairs={f}={c}" for f, c in PAIRS.items())]) == 0
    assert "its contrasts under every scoring: " in capsys.readouterr().out
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "#### Do the contrasts depend on the scoring?" in summary
    assert summary.count("| objective x step size | 16 |") == 3 * 2  # a line per score x aggregate
    assert summary.count("| 16 | objective x step size |") == 1  # the headline table's
    table = __import__("pandas").read_csv(tmp_path / "out" / "sensitivity.csv")
    assert (table.algorithm == "objective (main effect)").sum() == 2 * 12
