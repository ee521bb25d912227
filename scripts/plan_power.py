"""Size a study plan from a pilot by simulating the test it declares (vaco.study.sizing.simulate_plan):
for each candidate schedule of looks, each comparison's P(differs) by the last look, with the
pilot's uncertainty (a world drawn from the pilot before each study's seeds) and without it (the
pilot as the truth), and the mean seeds a cell at which the study stops.

A pilot is one comparison's runs in committed data files, normalised by the plan's fixed
references: ``--pilot ARM,AGAINST,K=FILE[,FILE...]`` (an arm named differently in the data:
``ARM:NAME``). Arms with no common seeds are drawn independently, each from its own runs (noted).

    python scripts/plan_power.py --references '{"Hopper-v5": [300, 1500], "HalfCheetah-v5": [-300, 1800]}' \\
      --pilot vaco,ppo_clip,4=docs/data/confirm_k4.csv.gz --looks 12,24,36 --looks 16,32
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from vaco import report as R
from vaco.report.robustness import paired_cells
from vaco.report.runs import read_data_files
from vaco.study.plan import TESTS, score_settings
from vaco.study.randomisation import ESTIMANDS
from vaco.study.sizing import Pilot, simulate_plan


def parse_pilot(spec: str) -> tuple[str, str, str, str, int, list[str]]:
    """``ARM[:NAME],AGAINST[:NAME],K=FILES`` -> (arm, arm's name in data, against, its name, K, files)."""
    try:
        head, files = spec.rsplit("=", 1)  # an arm's name may hold "=" (grpo[lr=0.0003])
        arm, against, k = head.split(",")
    except ValueError:
        raise SystemExit(f"--pilot {spec!r}: expected ARM,AGAINST,K=FILE[,FILE...]") from None
    arm, arm_name = (arm.split(":") + [arm])[:2]
    against, against_name = (against.split(":") + [against])[:2]
    return arm, arm_name, against, against_name, int(k), files.split(",")


def load_pilot(spec: str, references: dict[str, tuple[float, float]], score: str = "final") -> Pilot:
    arm, arm_name, against, against_name, K, files = parse_pilot(spec)
    try:
        runs, _ = read_data_files(files)
    except ValueError as err:  # the report's message names its own flag: say it of this one
        raise SystemExit(f"--pilot {spec!r}: {str(err).replace('`--data`: ', '')}") from None
    runs = [r for r in runs if r.env in references and r.status == "FINISHED"]
    name, last_evals = score_settings(score)
    report = R.build_report("pilot", runs, reps=10, fixed_bounds=references, score=name, last_evals=last_evals)
    tasks = list(references)
    cells = [(arm_name, 1), (arm_name, K), (against_name, 1), (against_name, K)]
    mats, _ = paired_cells(report, cells, tasks, runs=report.runs)
    label = f"{arm} vs {against} at K={K}"
    if mats[0].shape[0]:
        return Pilot(label, np.stack(mats))
    # no common seeds: each arm's (K_ref, K) pairs from its own runs, drawn independently
    x, _ = paired_cells(report, cells[:2], tasks, runs=report.runs)
    y, _ = paired_cells(report, cells[2:], tasks, runs=report.runs)
    if not (x[0].shape[0] and y[0].shape[0]):
        raise SystemExit(f"--pilot {spec!r}: no runs of {arm_name} or {against_name} at K=1 and K={K} in {files}")
    return Pilot(label, np.stack(x), control=np.stack(y))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pilot", action="append", required=True, help="ARM[:NAME],AGAINST[:NAME],K=FILE[,FILE...]")
    ap.add_argument("--references", required=True, help='fixed [min, max] per task, JSON: {"Hopper-v5": [300, 1500]}')
    ap.add_argument("--looks", action="append", required=True, help="a candidate schedule, e.g. 12,24,36")
    ap.add_argument("--test", default="randomisation", choices=TESTS)
    ap.add_argument("--estimand", default="pooled", choices=ESTIMANDS, help="the plan's estimand")
    ap.add_argument("--score", default="final", help="the plan's score: final, last-N or auc")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--spending", default="pocock")
    ap.add_argument("--studies", type=int, default=400)
    ap.add_argument("--swaps", type=int, default=999, help="patterns per randomisation p (the report uses 20,000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    references = {task: (float(lo), float(hi)) for task, (lo, hi) in json.loads(args.references).items()}
    try:
        score_settings(args.score)
    except ValueError:
        raise SystemExit(f"--score {args.score!r}: expected final, last-N (N >= 2, e.g. last-3) or auc") from None
    pilots = [load_pilot(spec, references, args.score) for spec in args.pilot]
    for p in pilots:
        x, y = (p.units[:2], p.units[2:]) if p.paired else (p.units, p.control)
        drop_x, drop_y = x[0] - x[1], y[0] - y[1]
        print(
            f"pilot {p.label}: {x.shape[1]} seeds of the arm, {y.shape[1]} of the control, {x.shape[2]} tasks"
            + ("" if p.paired else " (no common seeds: drawn independently)")
            + f"; mean drop per task: arm {np.round(drop_x.mean(axis=0), 3).tolist()}, control "
            f"{np.round(drop_y.mean(axis=0), 3).tolist()}; difference {np.round(drop_y.mean(0) - drop_x.mean(0), 3).tolist()}"
        )
    for looks in args.looks:
        schedule = [int(n) for n in looks.split(",")]
        start = time.time()
        out = {}
        for uncertainty in (True, False):
            out[uncertainty] = simulate_plan(
                pilots,
                schedule,
                args.alpha,
                args.spending,
                args.test,
                args.studies,
                args.seed,
                uncertainty=uncertainty,
                swaps=args.swaps,
                estimand=args.estimand,
            )
        with_u, plug_in = out[True], out[False]
        print(
            f"looks {schedule} ({args.test}, {args.estimand}, {args.score}, {args.studies} studies, {time.time() - start:.0f} s): P(differs by the "
            f"last look) with the pilot's uncertainty "
            + " / ".join(f"{v:.2f}" for v in with_u.differs)
            + f", mean stop {with_u.mean_stop:.1f} seeds; plug-in "
            + " / ".join(f"{v:.2f}" for v in plug_in.differs)
            + f", mean stop {plug_in.mean_stop:.1f}; at the first look (with uncertainty) "
            + " / ".join(f"{v:.2f}" for v in with_u.differs_at[0])
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
