"""The false-"differs" rates of a plan's first look under the null, by label swaps of committed
runs (vaco.study.sizing.first_look_rates), for each test: the percentile bootstrap the report
uses, the studentised randomisation test a plan can declare, and the unstudentised one. The data
are the confirmatory study's 12 seeds of four arms (docs/data/confirm_k4.csv.gz), the family its
three arms against PPO-clip, the looks [12, 24, 36] (Pocock, alpha 0.05); ``--shift`` adds a level
to the three arms at both K (equal drops, unequal levels).

    python scripts/plan_size.py --studies 4000 --shift 0 --shift 0.3
"""

from __future__ import annotations

import argparse
import math

from vaco.report.runs import read_runs
from vaco.study.sizing import first_look_rates, units

ARMS = ("ppo_clip", "vaco", "vaco_delta01", "vaco_delta04")  # the control first
REFERENCES = {"Hopper-v5": (300.0, 1500.0), "HalfCheetah-v5": (-300.0, 1800.0)}  # the study's fixed references


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=4000)
    ap.add_argument("--shift", type=float, action="append", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--swaps", type=int, default=999)
    args = ap.parse_args(argv)
    data = units(read_runs("docs/data/confirm_k4.csv.gz"), ARMS, (1, 4), REFERENCES, "eval/return")
    print(
        "| test | shift | family-wise at look 1 (nominal <= m x level) | one comparison p <= first Holm level | p <= 0.05 |"
    )
    print("|---|---|---|---|---|")
    for shift in args.shift or [0.0]:
        for test in ("bootstrap", "randomisation-raw", "randomisation"):
            fam, p, first = first_look_rates(data, test, [12, 24, 36], 0.05, args.studies, args.seed, shift, args.swaps)
            n = args.studies

            def rate(k: float, trials: int, nominal: float) -> str:
                return f"{k / trials:.2%} +- {math.sqrt(k / trials * (1 - k / trials) / trials):.2%} ({nominal:.2%})"

            print(
                f"| {test} | {shift:g} | {rate(fam, n, 3 * first)} | {rate(float((p <= first).sum()), p.size, first)} "
                f"| {rate(float((p <= 0.05).sum()), p.size, 0.05)} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
