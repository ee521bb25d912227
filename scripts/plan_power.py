"""Size a study plan's looks from a pilot: the power of vaco's rule (group-sequential Holm over the
family, vaco.report.plan) for candidate look schedules, by simulation of the normal model.

The pilot is the committed data: per task, the mean and the sample SD (ddof 1) of the per-seed
paired differences of drops, ``(clip(1) - clip(K)) - (arm(1) - arm(K))``, of each pilot arm against
``ppo_clip`` at K, normalised by the plan's fixed references. An arm with no pilot data borrows
the smallest pilot effect and the largest pilot SD (``--assume``). Each simulated study draws, per
seed and task, the comparisons' differences with the pilot's means and SDs and correlation
``--rho`` between comparisons (they share the PPO-clip arm), and judges each look by the rule with
a z-test on the mean (the report's bootstrap is close to it at these seed counts).

    python scripts/plan_power.py --looks 10,20,30 --looks 10,20,30,40 --looks 15,30,45
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy.stats import norm

from vaco.report.plan import holm_levels, sequential_holm

PILOT = {  # arm -> the committed data that has it against ppo_clip at the lag study's budget
    "vaco": ["docs/data/five_tasks.csv.gz", "docs/data/lag_robustness.csv.gz"],
    "vaco_delta01": ["docs/data/lag_2x2.csv.gz"],  # as vaco_tv_matched: VACO with delta 0.1
}
ALIAS = {"vaco_delta01": "vaco_tv_matched"}
TASKS = ("Hopper-v5", "HalfCheetah-v5")


def pilot(arm: str, references: dict[str, tuple[float, float]], K: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Per task (mean, SD) of the paired differences of drops of ``arm`` against ppo_clip, and the seeds."""
    from vaco import report as R
    from vaco.report.report_cli import read_data_files
    from vaco.report.robustness import paired_cells

    runs, _ = read_data_files(PILOT[arm])
    runs = [r for r in runs if r.env in TASKS]
    report = R.build_report("pilot", runs, reps=10, fixed_bounds=references)
    name = ALIAS.get(arm, arm)
    cells = [(name, 1), (name, K), ("ppo_clip", 1), ("ppo_clip", K)]
    (xr, xk, yr, yk), _ = paired_cells(report, cells, list(TASKS), runs=report.runs)
    d = (yr - yk) - (xr - xk)
    return d.mean(axis=0), d.std(axis=0, ddof=1), d.shape[0]


def power(means, sds, rho, looks, alpha, studies, seed):
    """P(differs) per comparison by the last look, and the mean seeds a cell at which the study stops."""
    rng = np.random.default_rng(seed)
    m, tasks = means.shape
    levels = holm_levels(looks, alpha, "pocock", m)
    wins = np.zeros(m)
    stopped = []
    for _ in range(studies):
        e = rng.standard_normal((m, tasks, looks[-1]))
        c = rng.standard_normal((1, tasks, looks[-1]))
        x = means[:, :, None] + sds[:, :, None] * (np.sqrt(1 - rho) * e + np.sqrt(rho) * c)
        rejected = [False] * m
        at = looks[-1]
        for k, n in enumerate(looks):
            d = x[:, :, :n].mean(axis=(1, 2))
            se = np.sqrt((x[:, :, :n].var(axis=2, ddof=1)).mean(axis=1) / (n * tasks))
            p = (2 * norm.sf(np.abs(d / se))).tolist()
            rejected = sequential_holm(p, levels, k, rejected)
            if all(rejected):
                at = n
                break
        wins += rejected
        stopped.append(at)
    return wins / studies, float(np.mean(stopped))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="vaco,vaco_delta01,vaco_delta04", help="arms against ppo_clip")
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--references", default='{"Hopper-v5": [300, 1500], "HalfCheetah-v5": [-300, 1800]}')
    ap.add_argument("--looks", action="append", default=None, help="a candidate schedule, e.g. 10,20,30")
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--studies", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    refs = {k: tuple(v) for k, v in json.loads(args.references).items()}
    arms = args.family.split(",")
    found = {a: pilot(a, refs, args.K) for a in arms if a in PILOT}
    for a, (mu, sd, n) in found.items():
        print(f"pilot {a} vs ppo_clip at K={args.K} ({n} seeds): mean {np.round(mu, 3)}, SD {np.round(sd, 3)} per task")
    low = min(found.values(), key=lambda f: f[0].mean())[0]
    wide = max(found.values(), key=lambda f: f[1].mean())[1]
    for a in arms:
        if a not in found:
            found[a] = (low, wide, 0)
            print(
                f"pilot {a}: none; assumed the smallest pilot effect {np.round(low, 3)} with the widest SD {np.round(wide, 3)}"
            )
    means = np.array([found[a][0] for a in arms])
    sds = np.array([found[a][1] for a in arms])
    for looks in args.looks or ["10,20,30"]:
        schedule = [int(n) for n in looks.split(",")]
        p, stop = power(means, sds, args.rho, schedule, args.alpha, args.studies, args.seed)
        print(
            f"looks {schedule}: P(differs by the last look) "
            + ", ".join(f"{a} {q:.2f}" for a, q in zip(arms, p))
            + f"; mean stop at {stop:.1f} seeds"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
