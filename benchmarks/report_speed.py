"""`vaco report` on the lag benchmark's data, this tree against an earlier commit, side by side.

Each round runs the same command with each tree's code (the earlier one from a `git worktree` of
``--base``, both with this environment's packages), one after the other, and times it end to end:

    python benchmarks/report_speed.py [--base 100b5ac] [--data docs/data/lag_bench_runs.csv.gz]
        [--rounds 1] [--out RESULT.json]

The command is `python -m vaco report --data DATA --no-mlflow --out DIR` (every section, the
sensitivity rows included, as a researcher runs it). It prints each round's wall seconds for both,
and the ratio base / this tree. Run it with nothing else on the machine: the figures are wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _time(tree: Path, data: Path, out: Path) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    found = subprocess.run([sys.executable, "-c", "import vaco; print(vaco.__file__)"], cwd=tree, env=env,
                           capture_output=True, text=True).stdout  # fmt: skip
    if not found.startswith(str(tree)):
        raise SystemExit(f"{tree}: python imports vaco from {found.strip()}, not this tree")
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "vaco", "report", "--data", str(data), "--no-mlflow", "--out", str(out)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the report failed in {tree}: {done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="100b5ac", help="the earlier commit (default: 100b5ac)")
    parser.add_argument("--data", default=str(REPO / "docs/data/lag_bench_runs.csv.gz"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    data = Path(args.data).resolve()
    with tempfile.TemporaryDirectory(prefix="report-speed-") as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.base], check=True,
                       capture_output=True)  # fmt: skip
        try:
            rounds = []
            for r in range(args.rounds):
                old = _time(base, data, Path(scratch) / f"old{r}")
                new = _time(REPO, data, Path(scratch) / f"new{r}")
                rounds.append({"base_s": round(old, 1), "this_s": round(new, 1), "ratio": round(old / new, 2)})
                print(f"round {r + 1}: {args.base} {old:.1f} s, this tree {new:.1f} s: {old / new:.2f}x", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    result = {"base": args.base, "this": commit.stdout.strip(), "data": str(data), "rounds": rounds,
              "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d", time.gmtime())}  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
