"""What `vaco sweep --save-data` costs a sweep: reading its FINISHED runs and writing the file.

A sweep with ``--save-data`` saves after every cell that finishes. The first save reads every run's
histories from the store; later ones read only the runs not read before (a FINISHED run does not
change) and rewrite the whole file. This times the three on a real store, through the functions the
sweep calls (``vaco.sweep.state.finished_runs`` and ``vaco.report.runs.save_runs``):

    python benchmarks/save_data.py --config configs/sweeps/lag_bench.yaml \\
        [--tracking-uri sqlite:///mlflow.db] [--finished-in RUNS.csv.gz ...] [--repeat 5] [--out RESULT.json]

It prints the number of runs, the first read, the median read with the cache (what a save after a
cell costs beyond the new cell's runs), the median write and the file's size, and checks that two
writes of the same runs give the same bytes. Run it with nothing else on the machine: the figures
are wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from vaco.report.runs import save_runs  # noqa: E402
from vaco.sweep import load_sweep  # noqa: E402
from vaco.sweep.state import carried_runs, finished_runs, resolve_tracking_uri  # noqa: E402


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the sweep file")
    parser.add_argument("--tracking-uri", default=None, help="the store (default: MLFLOW_TRACKING_URI, else vaco's)")
    parser.add_argument("--finished-in", nargs="*", default=[], help="data files whose runs the sweep carries")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = parser.parse_args(argv)

    uri = args.tracking_uri or resolve_tracking_uri()
    sweep = load_sweep(args.config)
    carried = carried_runs(sweep, args.finished_in)
    known: dict = {}
    first, runs = timed(lambda: finished_runs(sweep, uri, carried, known))
    if not runs:
        raise SystemExit(f"save_data.py: the sweep {sweep.experiment!r} has no FINISHED run in {uri} or the files")
    cached = [timed(lambda: finished_runs(sweep, uri, carried, known))[0] for _ in range(args.repeat)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.csv.gz"
        writes, contents = [], set()
        for _ in range(args.repeat):
            writes.append(timed(lambda: save_runs(runs, str(path)))[0])
            contents.add(path.read_bytes())
        size = path.stat().st_size
    result = {
        "sweep": sweep.experiment,
        "runs": len(runs),
        "first_read_s": first,
        "cached_read_s": statistics.median(cached),
        "write_s": statistics.median(writes),
        "file_bytes": size,
        "same_bytes_every_write": len(contents) == 1,
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(f"{result['runs']} FINISHED runs of {result['sweep']} ({result['machine']}, {result['date']})")
    print(f"  first read (every run's histories)  {first:7.2f} s")
    print(f"  read with the cache (median of {args.repeat})   {result['cached_read_s']:7.2f} s")
    print(f"  write (median of {args.repeat})                 {result['write_s']:7.2f} s  ({size / 1e3:,.0f} kB)")
    print(f"  the same bytes every write: {result['same_bytes_every_write']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
