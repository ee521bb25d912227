"""Does new data reproduce committed data bit for bit? Compare the runs two data files share.

    python scripts/compare_runs.py --data docs/data/lag_2x2.csv.gz --reference docs/data/lag_robustness.csv.gz \\
        --same ppo_clip_large_step=ppo_clip_tv_matched --K 1

Runs are matched by (algorithm, env, K, seed); ``--same NEW=OLD`` says that arm NEW of ``--data``
is arm OLD of ``--reference`` (the same config under another name: the 2x2 study's step-matched
clip arm at K = 1 is ppo_clip_tv_matched's config). Every logged value of every metric both runs
have is compared for exact equality (the data files hold floats in full precision). Prints one
line per matched arm and cell count and exits 1 if any value differs.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", required=True, help="the new runs (vaco report --save-data files)")
    parser.add_argument("--reference", nargs="+", required=True, help="the committed runs")
    parser.add_argument("--same", action="append", default=[], metavar="NEW=OLD", help="arm NEW is arm OLD")
    parser.add_argument("--K", type=int, nargs="+", default=None, help="compare only these K")
    args = parser.parse_args(argv)
    from vaco.report.runs import read_data_files

    rename = dict(item.split("=", 1) for item in args.same)
    new, _ = read_data_files(args.data)
    old, _ = read_data_files(args.reference)
    reference = {(r.algorithm, r.env, r.K, r.seed): r for r in old}
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # arm -> runs, values, unequal values
    for r in new:
        if args.K and r.K not in args.K:
            continue
        match = reference.get((rename.get(r.algorithm, r.algorithm), r.env, r.K, r.seed))
        if match is None:
            continue
        counts = tally[f"{r.algorithm} = {match.algorithm}"]
        counts[0] += 1
        for key in sorted(set(r.histories) & set(match.histories)):
            (steps, values), (ref_steps, ref_values) = r.histories[key], match.histories[key]
            counts[1] += max(len(values), len(ref_values))
            if len(values) != len(ref_values) or (steps != ref_steps).any():
                counts[2] += max(len(values), len(ref_values))
                continue
            counts[2] += int((values != ref_values).sum())
    if not tally:
        print("no run of --data has a match in --reference")
        return 1
    for arm, (runs, values, unequal) in sorted(tally.items()):
        print(f"{arm}: {runs} runs, {values} values, {unequal} not bit-equal")
    return int(any(unequal for _, _, unequal in tally.values()))


if __name__ == "__main__":
    sys.exit(main())
