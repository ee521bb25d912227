"""A declared plan's family re-read at one look under each test (sensitivity, not verdicts): the
percentile bootstrap the report uses, the studentised randomisation test, the unstudentised one,
and sign flips of the per-seed paired differences (the untrimmed mean's test), each comparison on the first ``--seeds`` seeds of its cells, with the group-sequential Holm
step-down each test would give at that look (the plan's looks and spending; nothing is recorded).

    python scripts/plan_sensitivity.py --data docs/data/confirm_k4.csv.gz --seeds 12
"""

from __future__ import annotations

import argparse

from vaco import report as R
from vaco.report.decision import sign_flip_p
from vaco.report.robustness import paired_cells
from vaco.study.judge import plan_from_tags, read_record, record_path
from vaco.study.plan import holm_levels, sequential_holm
from vaco.study.randomisation import SWAPS, bootstrap_p, drop_difference, randomisation_p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a `vaco report --save-data` file with its plan record beside it")
    ap.add_argument("--seeds", type=int, required=True, help="the look: the first N seeds of every cell")
    ap.add_argument("--reps", type=int, default=2000, help="bootstrap resamples (the report's default)")
    args = ap.parse_args(argv)

    plan = plan_from_tags(read_record(record_path(args.data)))
    runs = [r for r in R.read_runs(args.data) if r.status == "FINISHED"]
    refs = {task: (low, high) for task, low, high in plan.references}
    report = R.build_report("sensitivity", runs, reps=args.reps, fixed_bounds=refs)
    look = plan.looks.index(args.seeds)
    levels = holm_levels(plan.looks, plan.alpha, plan.spending, len(plan.family))
    tests = {
        "bootstrap (percentile)": lambda c: bootstrap_p(c, plan.margin, reps=args.reps, seed=report.seed)[0],
        "randomisation (studentised)": lambda c: randomisation_p(c, None, SWAPS, report.seed)[0],
        "randomisation (raw D)": lambda c: randomisation_p(c, None, SWAPS, report.seed, studentise=False)[0],
        "sign flips (untrimmed mean)": lambda c: sign_flip_p(((c[2] - c[3]) - (c[0] - c[1])).ravel(), seed=report.seed)[
            0
        ],
    }
    cells = {}
    for c in plan.family:
        mats, _ = paired_cells(
            report, [(c.arm, 1), (c.arm, c.K), (c.against, 1), (c.against, c.K)], report.tasks, runs=report.runs
        )
        cells[c] = tuple(m[: args.seeds] for m in mats)
        assert cells[c][0].shape[0] == args.seeds, (c.label(), cells[c][0].shape)
    print(f"plan {plan.digest}, look {look + 1} ({args.seeds} seeds), {plan.spending} over {list(plan.looks)}")
    print(f"Holm step levels at this look (r open): {', '.join(f'{row[look]:.4g}' for row in levels)}")
    print("| comparison | estimate | " + " | ".join(tests) + " |")
    print("|---|---|" + "---|" * len(tests))
    ps = {name: [test(cells[c]) for c in plan.family] for name, test in tests.items()}
    for i, c in enumerate(plan.family):
        row = " | ".join(f"{ps[name][i]:.4f}" for name in tests)
        print(f"| {c.label()} | {float(drop_difference(*cells[c])):+.3f} | {row} |")
    for name in tests:
        words = sequential_holm(ps[name], levels, look)
        print(
            f"{name}: differs at this look -> " + ", ".join(c.label() for c, w in zip(plan.family, words) if w)
            or "none"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
