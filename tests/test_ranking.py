"""`vaco report`'s ranking by drop: the point ranks, the bootstrap rank intervals and P(first)
against a float64 loop written here that draws the same seeds; every algorithm on the seeds they
all have; the summary's table and the printed line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.report_runs import make_run
from vaco import report as R
from vaco.report.robustness_summary import ranking_lines, robustness_section

TASKS = (("Hopper-v5", 1000.0), ("HalfCheetah-v5", 3000.0))
SEEDS = (1, 2, 3, 4, 5, 6)
#: name, level at K = 1, loss per unit of K; "mid_a" and "mid_b" close enough that their ranks swap
ALGOS = (("vaco", 0.8, 0.02), ("ppo_clip", 0.7, 0.06), ("mid_a", 0.75, 0.04), ("mid_b", 0.75, 0.041))


def _run(algo, env, K, seed, final) -> R.Run:
    steps = np.array([1000.0, 2000.0])
    constant = (steps, np.array([0.05, 0.05]))
    histories = {"eval/return": (steps, np.array([0.5 * final, final])), "lag/forward_tv": constant}
    return make_run(algo, env, K, seed, histories, axes={"delta": 0.2} if algo == "vaco" else None)


def _runs(seed: int = 0) -> list[R.Run]:
    rng = np.random.default_rng(seed)
    runs = []
    for env, scale in TASKS:
        seed_effect = {s: rng.normal(0, 0.1) for s in SEEDS}
        for algo, level, loss in ALGOS:
            for K in (1, 4):
                # ppo_clip has two more seeds: the ranking must pair every algorithm on the six they share
                for s in SEEDS + ((7, 8) if algo == "ppo_clip" else ()):
                    value = scale * (level - loss * K + seed_effect.get(s, 0.0) + rng.normal(0, 0.03))
                    runs.append(_run(algo, env, K, s, value))
    return runs


def _iqm(values) -> float:
    values = sorted(float(v) for v in np.ravel(values))
    cut = int(0.25 * len(values))
    kept = values[cut : len(values) - cut]
    return math.fsum(kept) / len(kept)


def _quantile_that_occurred(values, q: float) -> int:
    """numpy's "inverted_cdf": the smallest value whose empirical CDF reaches q."""
    values = sorted(values)
    return values[max(math.ceil(q * len(values)) - 1, 0)]


@pytest.mark.parametrize("reps", [1, 300])
def test_ranks_rank_intervals_and_p_first_equal_a_float64_loop(reps):
    runs = _runs()
    rep = R.build_report("rank", runs, reps=reps, seed=3, baseline="ppo_clip")
    lag = R.robustness(rep)
    (ranking,) = R.rankings(rep, lag)
    tasks = list(rep.tasks)
    x = {}
    for r in runs:
        lo, hi = rep.bounds[r.env]
        x[(r.algorithm, r.K, r.env, r.seed)] = (r.histories["eval/return"][1][-1] - lo) / (hi - lo)
    names = [a for a, _, _ in ALGOS]

    def cell(algo, K, rows):
        return [[x[(algo, K, t, SEEDS[rows[j][i]])] for i in range(len(SEEDS))] for j, t in enumerate(tasks)]

    identity = [list(range(len(SEEDS)))] * len(tasks)
    point = {a: _iqm(cell(a, 1, identity)) - _iqm(cell(a, 4, identity)) for a in names}
    by_hand = {a: 1 + sum(point[b] < point[a] for b in names) for a in names}
    got = {r.algorithm: r for r in ranking.ranks}
    assert ranking.K == 4 and ranking.seeds == len(SEEDS) and set(got) == set(names)
    assert [r.rank for r in ranking.ranks] == sorted(by_hand.values())
    for a in names:
        assert got[a].rank == by_hand[a]
        assert got[a].drop == pytest.approx(point[a], abs=1e-12)
        assert got[a].level == pytest.approx(_iqm(cell(a, 4, identity)), abs=1e-12)
    # the bootstrap, drawn by hand: per resample and task one draw of seed rows for every cell
    rng = np.random.default_rng(3)
    draws = rng.integers(0, len(SEEDS), size=(reps, len(SEEDS), len(tasks)))
    ranks = {a: [] for a in names}
    for b in range(reps):
        rows = [[int(draws[b, i, j]) for i in range(len(SEEDS))] for j in range(len(tasks))]
        drop = {a: _iqm(cell(a, 1, rows)) - _iqm(cell(a, 4, rows)) for a in names}
        for a in names:
            ranks[a].append(1 + sum(drop[c] < drop[a] for c in names))
    for a in names:
        assert got[a].rank_interval == (
            _quantile_that_occurred(ranks[a], 0.025),
            _quantile_that_occurred(ranks[a], 0.975),
        )
        assert got[a].p_first == pytest.approx(sum(k == 1 for k in ranks[a]) / reps, abs=1e-12)
    assert math.fsum(r.p_first for r in ranking.ranks) >= 1.0 - 1e-12  # ties can share first place
    if reps > 1:  # the two close algorithms trade places across resamples; the clear ones do not
        assert got["vaco"].rank_interval == (1, 1) and got["ppo_clip"].rank_interval == (4, 4)
        assert got["mid_a"].rank_interval[0] < got["mid_a"].rank_interval[1]


def test_the_summary_and_the_printed_line_give_the_ranking():
    rep = R.build_report("rank", _runs(), reps=200, baseline="ppo_clip")
    lag = R.robustness(rep)
    (ranking,) = R.rankings(rep, lag)
    text = "\n".join(robustness_section(rep, lag, None))
    assert "Ranked by drop (exploratory" in text and "At K = 4 (6 paired seeds per task" in text
    for r in ranking.ranks:
        interval = f"{r.rank_interval[0]}-{r.rank_interval[1]}"
        assert f"| {r.rank} | {r.algorithm} | {r.drop:.3f} [" in text and f"| {interval} | {r.p_first:.2f} |" in text
    (line,) = ranking_lines(rep, lag)
    assert line.index("1. vaco") < line.index("4. ppo_clip")
    # no seed that every algorithm ran: no ranking, and the summary says why instead of a table
    apart = [r for r in _runs() if r.algorithm != "mid_b"]
    apart += [_run("mid_b", r.env, r.K, r.seed + 100, 1000.0) for r in _runs() if r.algorithm == "mid_b"]
    rep = R.build_report("apart", apart, reps=10, baseline="ppo_clip")
    (ranking,) = R.rankings(rep, R.robustness(rep))
    assert ranking.ranks == [] and "no seed has runs of every algorithm at K=1 and K=4" in ranking.notes[0]
    text = "\n".join(robustness_section(rep, R.robustness(rep), None))
    assert "- K=4: no seed has runs of every algorithm" in text and "At K = 4 (" not in text
    # two algorithms: the difference of drops is the comparison, no ranking
    two = R.build_report("two", [r for r in _runs() if r.algorithm in ("vaco", "ppo_clip")], reps=10)
    assert R.rankings(two, R.robustness(two)) == [] and "Ranked by drop" not in "\n".join(
        robustness_section(two, R.robustness(two), None)
    )


def test_an_algorithm_below_the_floor_at_k_ref_is_listed_apart_not_ranked():
    """An algorithm that learned little before any lag (IQM at K = 1 under the floor) has little to
    lose: its small drop is shown apart and marked, and the others are ranked among themselves as
    they would be without it."""
    rng = np.random.default_rng(1)
    stuck = [
        _run("stuck", env, K, s, scale * (0.02 + rng.normal(0, 0.005)))
        for env, scale in TASKS
        for K in (1, 4)
        for s in SEEDS
    ]
    rep = R.build_report("floor", _runs() + stuck, reps=100, baseline="ppo_clip")
    lag = R.robustness(rep)
    (ranking,) = R.rankings(rep, lag)
    assert [x.algorithm for x in ranking.apart] == ["stuck"] and ranking.floor == R.FLOOR == 0.1
    assert ranking.apart[0].level_ref < 0.1 and ranking.apart[0].rank_interval is None
    assert "stuck" not in [x.algorithm for x in ranking.ranks]
    assert abs(ranking.apart[0].drop) < min(abs(x.drop) for x in ranking.ranks)  # it would have ranked first
    (everyone,) = R.rankings(rep, lag, floor=None)
    assert everyone.ranks[0].algorithm == "stuck" and everyone.apart == []
    others = [x.algorithm for x in everyone.ranks if x.algorithm != "stuck"]
    assert [x.algorithm for x in ranking.ranks] == others and [x.rank for x in ranking.ranks] == [1, 2, 3, 4]
    text = "\n".join(robustness_section(rep, lag, None))
    assert "Below the floor at K = 1 (IQM under 0.1: little to lose; **not ranked**): stuck drop" in text
    (line,) = ranking_lines(rep, lag)
    assert line.endswith("below the floor at K=1, not ranked: stuck")


@pytest.mark.slow
def test_many_algorithms_get_one_panel_each_with_the_baseline_in_grey_and_their_own_iqms():
    from vaco.report.figures import PANELS_ABOVE, figure_iqm_vs_k, use_file_backend

    use_file_backend()
    names = [f"algo{i}" for i in range(PANELS_ABOVE + 1)] + ["ppo_clip"]
    runs = []
    for env, scale in TASKS:
        for i, algo in enumerate(names):
            for K in (1, 4):
                runs += [_run(algo, env, K, s, scale * (0.9 - 0.05 * i * (K > 1) + 0.01 * s)) for s in SEEDS]
    rep = R.build_report("panels", runs, reps=20, baseline="ppo_clip")
    fig, estimates, _ = figure_iqm_vs_k(rep)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == rep.algorithms and "grey, dashed: ppo_clip" in fig._suptitle.get_text()
    for ax in panels:
        lines = {str(line.get_label()): line for line in ax.get_lines()}
        name = ax.get_title()
        assert set(lines) == ({name} if name == "ppo_clip" else {name, "ppo_clip"})
        if name != "ppo_clip":  # the baseline dashed and beside the arm: equal values keep both in sight
            own, grey = lines[name].get_xdata(), lines["ppo_clip"].get_xdata()
            assert lines["ppo_clip"].get_linestyle() == "--" and all(g < o for g, o in zip(grey, own))
        for label, line in lines.items():  # every line draws that algorithm's IQM at K = 1 and 4, no other
            assert list(line.get_ydata()) == pytest.approx([estimates[f"{label} K={K}"].point[0] for K in (1, 4)])
    few = R.build_report("few", [r for r in runs if r.algorithm in names[:PANELS_ABOVE]], reps=20)
    assert len(figure_iqm_vs_k(few)[0].axes) == 1  # up to PANELS_ABOVE algorithms share one axes
    # the robustness figure: each algorithm's drop at K = 4 with its interval, smallest at the top
    lag = R.robustness(rep)
    (ax,) = R.figure_robustness(rep, lag).axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    drops = [lag.drops[(name, 4)].drop for name in labels]
    points = sorted((line.get_ydata()[0], line.get_xdata()[0]) for line in ax.get_lines() if len(line.get_xdata()) == 1)
    assert labels == [d.algorithm for d in sorted((lag.drops[(a, 4)] for a in names), key=lambda d: d.drop)]
    assert [x for _, x in reversed(points)] == pytest.approx(drops)  # top (highest y) first
