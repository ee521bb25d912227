"""Each algorithm's IQM normalised score at each K and its drop from K = 1, pooled and per task, from
committed data files, normalised by fixed references (a plan's): the exploratory table of a pilot.

    python scripts/drops_table.py --references '{"Hopper-v5": [300, 1500], "HalfCheetah-v5": [-300, 1800]}' \
        docs/data/second_wave_pilot.csv.gz

Prints a Markdown table: seeds at K = 1, the IQM of the final score at each K (over seeds x tasks,
rliable's IQM), the drops from K = 1 pooled and per task, and the IQM of the mean of the last three
evaluations. Exploratory: no interval, no test (``vaco report`` and a declared plan judge).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from vaco.report.robustness import iqm
from vaco.report.runs import read_runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="data files written by `vaco report --save-data`")
    ap.add_argument("--references", required=True, help='fixed [min, max] per task, JSON: {"Hopper-v5": [300, 1500]}')
    args = ap.parse_args(argv)
    references = {task: (float(lo), float(hi)) for task, (lo, hi) in json.loads(args.references).items()}
    runs = [r for f in args.files for r in read_runs(f) if r.status == "FINISHED" and r.env in references]
    ks = sorted({r.K for r in runs})

    def score(run, last: int) -> float:
        low, high = references[run.env]
        return (float(np.mean(run.score()[1][-last:])) - low) / (high - low)

    def level(algo, K, last=1, task=None) -> float:
        values = [score(r, last) for r in runs if r.algorithm == algo and r.K == K and task in (None, r.env)]
        return float(iqm(np.array(values).reshape(-1, 1))) if values else float("nan")

    head = ["algorithm", "seeds at K=1", f"IQM final, K = {' / '.join(map(str, ks))}"]
    head += [f"drop to K = {' / '.join(map(str, ks[1:]))}"] + [f"{t} drop" for t in references]
    head += [f"IQM last-3, K = {' / '.join(map(str, ks))}"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for algo in sorted({r.algorithm for r in runs}):
        seeds = len({r.seed for r in runs if r.algorithm == algo and r.K == ks[0]})
        cells = [f"`{algo}`", str(seeds), " / ".join(f"{level(algo, K):.2f}" for K in ks)]
        cells.append(" / ".join(f"{level(algo, ks[0]) - level(algo, K):+.2f}" for K in ks[1:]))
        for task in references:
            cells.append(" / ".join(f"{level(algo, ks[0], 1, task) - level(algo, K, 1, task):+.2f}" for K in ks[1:]))
        cells.append(" / ".join(f"{level(algo, K, 3):.2f}" for K in ks))
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
