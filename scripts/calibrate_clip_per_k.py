"""Issue 28, item 3: which clip range holds PPO-clip's step size at VACO's, per K?

    python scripts/calibrate_clip_per_k.py [--data docs/data/calibrate_clip_per_k.csv.gz]

Reads the per-K calibration runs (configs/sweeps/calibrate_clip_per_k.yaml: PPO-clip at K = 4 and 16,
clip in {0.25, 0.3, 0.35}, seed 1) and, from the committed lag-study data, VACO's and the clip-0.4
control's seed-1 runs at the same K. A run's step size is its mean ``lag/forward_tv`` over all
iterations (the TV of the policy after the iteration's epochs from the behaviour mixture), as
configs/sweeps/calibrate_clip.yaml chose clip 0.4 at K = 1. Prints, per K, each clip's TV over VACO's
on each task and averaged over the two, and the clip nearest VACO's (ratio nearest 1).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LAG = [REPO / "docs/data/five_tasks.csv.gz", REPO / "docs/data/lag_robustness.csv.gz"]
TASKS = ("Hopper-v5", "HalfCheetah-v5")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO / "docs/data/calibrate_clip_per_k.csv.gz"))
    args = parser.parse_args(argv)
    from vaco.report.report_cli import read_data_files

    def tv(run) -> float:
        return float(np.mean(run.histories["lag/forward_tv"][1]))

    lag, _ = read_data_files([str(p) for p in LAG])
    cal, _ = read_data_files([args.data])
    vaco = {(r.env, r.K): tv(r) for r in lag if r.algorithm == "vaco" and r.seed == 1 and r.env in TASKS}
    arms: dict[tuple[float, int], dict[str, float]] = {}
    for r in lag:
        if r.algorithm == "ppo_clip_tv_matched" and r.seed == 1 and r.env in TASKS:
            arms.setdefault((0.4, r.K), {})[r.env] = tv(r)
    for r in cal:
        found = re.search(r"clip_epsilon=([0-9.]+)", r.algorithm)  # a dotted-key variant: ppo_clip[clip_epsilon=0.3]
        if found is None or r.env not in TASKS:
            continue
        clip = float(found.group(1))
        arms.setdefault((clip, r.K), {})[r.env] = tv(r)
    for K in sorted({K for _, K in arms}):
        if K == 1:
            continue
        print(f"K = {K}: mean lag/forward_tv over VACO's (seed 1)")
        best = None
        for clip in sorted(c for c, k in arms if k == K):
            row = arms[(clip, K)]
            ratios = [row[t] / vaco[(t, K)] for t in TASKS if t in row and (t, K) in vaco]
            if len(ratios) < len(TASKS):
                continue
            mean = float(np.mean(ratios))
            cells = ", ".join(f"{t} {row[t]:.4f} / {vaco[(t, K)]:.4f} = {x:.3f}" for t, x in zip(TASKS, ratios))
            print(f"  clip {clip:.2f}: {cells}; mean {mean:.3f}")
            if best is None or abs(mean - 1) < abs(best[1] - 1):
                best = (clip, mean)
        if best:
            print(f"  nearest VACO's step: clip {best[0]:.2f} (mean ratio {best[1]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
