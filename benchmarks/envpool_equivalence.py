"""The learning-unchanged check for the envpool backend: are final returns on envpool
equivalent to gymnasium's within a margin declared here, before the data?

    python benchmarks/envpool_equivalence.py [--new docs/data/envpool_equivalence.csv.gz] [--margin 0.1]

The gymnasium side is the committed section-6 data (docs/data/five_tasks.csv.gz seeds 1-3 and
docs/data/lag_robustness.csv.gz seeds 4-10), the envpool side the runs of
configs/sweeps/envpool_equivalence.yaml (the same setting, collection and evaluation on envpool).
A run's score is its final ``eval/return``, normalised on section 6's scale (per task, min and max
over the gymnasium side's main-algorithm runs, as ``vaco report`` normalises), so the margin is in
the report's normalised units. The two sides do not share trajectories (another simulator build),
so each (algorithm, task, K) cell is compared unpaired: Welch's difference of means (envpool minus
gymnasium), **differs** when its 95% interval excludes 0, **equivalent** when its 90% interval
lies inside +-M (two one-sided tests at 0.05), **undecided** otherwise. The pooled row averages
the cells' differences (each cell weighted alike; its variance the sum of the cells' over 64,
Welch-Satterthwaite degrees of freedom). Writes a JSON next to the data (``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
GYM = [REPO / "docs/data/five_tasks.csv.gz", REPO / "docs/data/lag_robustness.csv.gz"]
TASKS = ("Hopper-v5", "HalfCheetah-v5")
ALGORITHMS = ("vaco", "ppo_clip")
KS = (1, 16)
MARGIN = 0.1  # declared before the envpool runs: a tenth of section 6's normalised range


def _word(diff: float, se: float, df: float, margin: float) -> tuple[str, tuple[float, float], tuple[float, float]]:
    t95, t90 = stats.t.ppf(0.975, df), stats.t.ppf(0.95, df)
    i95 = (diff - t95 * se, diff + t95 * se)
    i90 = (diff - t90 * se, diff + t90 * se)
    if i95[0] > 0 or i95[1] < 0:
        return "differs", i95, i90
    if -margin < i90[0] and i90[1] < margin:
        return "equivalent", i95, i90
    return "undecided", i95, i90


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new", default=str(REPO / "docs/data/envpool_equivalence.csv.gz"))
    parser.add_argument("--margin", type=float, default=MARGIN)
    parser.add_argument("--out", default=str(REPO / "docs/data/envpool_equivalence.json"))
    args = parser.parse_args(argv)
    from vaco.report.runs import read_data_files
    from vaco.report.scores import build_report

    gym_runs, _ = read_data_files([str(p) for p in GYM])
    gym_runs = [r for r in gym_runs if r.env in TASKS]
    scale = build_report("gymnasium", gym_runs, reps=1).bounds  # section 6's normalisation
    new_runs, _ = read_data_files([args.new])

    def finals(runs) -> dict[tuple[str, str, int], list[float]]:
        out: dict[tuple[str, str, int], list[float]] = {}
        for r in runs:
            if r.algorithm in ALGORITHMS and r.env in TASKS and r.K in KS and 1 <= r.seed <= 10:
                low, high = scale[r.env]
                out.setdefault((r.algorithm, r.env, r.K), []).append((float(r.score()[1][-1]) - low) / (high - low))
        return out

    old, new = finals(gym_runs), finals(new_runs)
    rows, diffs, variances = [], [], []
    for algo in ALGORITHMS:
        for task in TASKS:
            for K in KS:
                a, b = np.array(new.get((algo, task, K), [])), np.array(old.get((algo, task, K), []))
                if len(a) < 2 or len(b) < 2:
                    print(f"{algo} {task} K={K}: {len(a)} envpool / {len(b)} gymnasium runs; left out", file=sys.stderr)
                    continue
                va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
                se = math.sqrt(va + vb)
                df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
                diff = float(a.mean() - b.mean())
                word, i95, i90 = _word(diff, se, df, args.margin)
                rows.append(
                    {
                        "algorithm": algo,
                        "task": task,
                        "K": K,
                        "envpool_mean": round(float(a.mean()), 4),
                        "gymnasium_mean": round(float(b.mean()), 4),
                        "difference": round(diff, 4),
                        "ci95": [round(v, 4) for v in i95],
                        "ci90": [round(v, 4) for v in i90],
                        "verdict": word,
                        "runs": [len(a), len(b)],
                    }
                )
                diffs.append(diff)
                variances.append((va, vb, len(a), len(b)))
    if not rows:
        print("no cell has runs on both sides", file=sys.stderr)
        return 2
    m = len(diffs)
    pooled = float(np.mean(diffs))
    var = sum(va + vb for va, vb, _, _ in variances) / m**2
    df = sum(va + vb for va, vb, _, _ in variances) ** 2 / sum(
        va**2 / (na - 1) + vb**2 / (nb - 1) for va, vb, na, nb in variances
    )
    word, i95, i90 = _word(pooled, math.sqrt(var), df, args.margin)
    report = {
        "margin": args.margin,
        "scale": {t: list(scale[t]) for t in TASKS},
        "cells": rows,
        "pooled": {
            "difference": round(pooled, 4),
            "ci95": [round(v, 4) for v in i95],
            "ci90": [round(v, 4) for v in i90],
            "verdict": word,
            "cells": m,
        },
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"final eval/return, normalised on section 6's scale; envpool - gymnasium; margin M = {args.margin}")
    for r in rows:
        print(
            f"  {r['algorithm']:8s} {r['task']:15s} K={r['K']:<2d} {r['envpool_mean']:.3f} vs {r['gymnasium_mean']:.3f}: "
            f"{r['difference']:+.3f} 95% [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}] 90% [{r['ci90'][0]:+.3f}, "
            f"{r['ci90'][1]:+.3f}] -> {r['verdict']} ({r['runs'][0]} / {r['runs'][1]} runs)"
        )
    p = report["pooled"]
    print(
        f"  pooled over {m} cells: {p['difference']:+.3f} 95% [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}] "
        f"90% [{p['ci90'][0]:+.3f}, {p['ci90'][1]:+.3f}] -> {p['verdict']}"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
