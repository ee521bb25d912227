"""Which clip range holds PPO-clip's step size at the TV filter's, per K?

    python scripts/calibrate_clip_per_k.py [--pair large] [--data docs/data/calibrate_clip_per_k.csv.gz]
    python scripts/calibrate_clip_per_k.py --pair small [--data docs/data/calibrate_small_pair.csv.gz]

The 2x2 design's two pairs. ``large``: VACO (delta 0.2) against clip ranges around 0.4, from the
per-K calibration runs (configs/sweeps/calibrate_clip_per_k.yaml: PPO-clip at K = 4 and 16, clip in
{0.25, 0.3, 0.35}, seed 1) and, from the committed lag-study data, VACO's and the clip-0.4 control's
seed-1 runs. ``small``: vaco_tv_matched (delta 0.1) against clip ranges around 0.2, from
configs/sweeps/calibrate_small_pair.yaml (vaco_tv_matched at every K; PPO-clip clip 0.225 at K = 1,
0.15 and 0.175 at K = 4 and 16; seed 1) and PPO-clip's own seed-1 runs (clip 0.2) from the lag-study
data. A run's step size is its mean ``lag/forward_tv`` over all iterations (the TV of the policy
after the iteration's epochs from the behaviour mixture), as configs/sweeps/calibrate_clip.yaml
chose clip 0.4 at K = 1. Prints, per K, each clip's TV over the filter's on each task and averaged
over the two, and the clip nearest the filter's (ratio nearest 1).
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
#: pair -> (filter arm, the clip arm of the lag data, its clip range, the calibration runs, skip K = 1)
PAIRS = {
    "large": ("vaco", "ppo_clip_tv_matched", 0.4, "docs/data/calibrate_clip_per_k.csv.gz", True),
    "small": ("vaco_tv_matched", "ppo_clip", 0.2, "docs/data/calibrate_small_pair.csv.gz", False),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=sorted(PAIRS), default="large", help="which step-size pair (default large)")
    parser.add_argument("--data", default=None, help="the calibration runs (default: the pair's file in docs/data)")
    args = parser.parse_args(argv)
    filter_arm, clip_arm, clip_value, default_data, skip_k1 = PAIRS[args.pair]
    args.data = args.data or str(REPO / default_data)
    from vaco.report.runs import read_data_files

    def tv(run) -> float:
        return float(np.mean(run.histories["lag/forward_tv"][1]))

    lag, _ = read_data_files([str(p) for p in LAG])
    cal, _ = read_data_files([args.data])
    vaco = {(r.env, r.K): tv(r) for r in [*lag, *cal] if r.algorithm == filter_arm and r.seed == 1 and r.env in TASKS}
    arms: dict[tuple[float, int], dict[str, float]] = {}
    for r in lag:
        if r.algorithm == clip_arm and r.seed == 1 and r.env in TASKS:
            arms.setdefault((clip_value, r.K), {})[r.env] = tv(r)
    for r in cal:
        found = re.search(r"clip_epsilon=([0-9.]+)", r.algorithm)  # a dotted-key variant: ppo_clip[clip_epsilon=0.3]
        if found is None or r.env not in TASKS:
            continue
        clip = float(found.group(1))
        arms.setdefault((clip, r.K), {})[r.env] = tv(r)
    for K in sorted({K for _, K in arms}):
        if K == 1 and skip_k1:  # calibrate_clip.yaml's
            continue
        print(f"K = {K}: mean lag/forward_tv over {filter_arm}'s (seed 1)")
        best = None
        for clip in sorted(c for c, k in arms if k == K):
            row = arms[(clip, K)]
            ratios = [row[t] / vaco[(t, K)] for t in TASKS if t in row and (t, K) in vaco]
            if len(ratios) < len(TASKS):
                continue
            mean = float(np.mean(ratios))
            cells = ", ".join(f"{t} {row[t]:.4f} / {vaco[(t, K)]:.4f} = {x:.3f}" for t, x in zip(TASKS, ratios))
            print(f"  clip {clip:.4g}: {cells}; mean {mean:.3f}")
            if best is None or abs(mean - 1) < abs(best[1] - 1):
                best = (clip, mean)
        if best:
            print(f"  nearest {filter_arm}'s step: clip {best[0]:.4g} (mean ratio {best[1]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
