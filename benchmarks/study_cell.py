"""The study cell, side by side: a sweep of 4 seeds (Hopper-v5, VACO, K = 4, 16 envs x 256
steps x 20 iterations, 10-episode evaluations every 10, two cells at a time) run by a baseline
commit and by this tree, alternating, on this machine, in one run.

    python benchmarks/study_cell.py [--baseline cd057c1] [--rounds 2] [--out benchmarks/results/study_cell.json]

Each variant runs `vaco sweep --config benchmarks/sweeps/study_cell.yaml` from scratch (its own
SQLite store and folder): the baseline from a `git worktree` of the baseline commit (its code and
configs, this interpreter and packages), this tree as it is (the cells forked by the sweep's
zygote), and this tree with `VACO_SWEEP_ZYGOTE=0` (every cell a fresh interpreter) to show where
the difference comes from. Reported per variant: the sweep's wall time, per seed (wall / 4 x 2
jobs: the cost of one seed on one of the two cores), and the cells' own collect / update seconds
(their `perf/*` metrics) with the rest (start-up, evaluation, logging) as the remainder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEP = Path("benchmarks/sweeps/study_cell.yaml")
ENVPOOL_SWEEP = Path("benchmarks/sweeps/study_cell_envpool.yaml")  # the same cell on the opt-in envpool backend
SEEDS, JOBS = 4, 2


def _run(root: Path, tree: Path, env_extra: dict[str, str], sweep: Path = SWEEP) -> dict:
    out = root / "out"
    uri = f"sqlite:///{root / 'mlflow.db'}"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", **env_extra)
    if tree != REPO:
        env["PYTHONPATH"] = str(tree)  # the baseline's vaco package ahead of this tree's editable install
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "vaco.commands.cli", "sweep", "--config", str(tree / sweep), "--out", str(out)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"sweep failed in {root}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    import mlflow

    client = mlflow.MlflowClient(uri)
    collect = update = 0.0
    runs = 0
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            if run.data.tags.get("vaco.sweep.cell"):
                runs += 1
                for key in ("perf/collect_seconds", "perf/update_seconds"):
                    total = sum(m.value for m in client.get_metric_history(run.info.run_id, key))
                    collect, update = (collect + total, update) if "collect" in key else (collect, update + total)
    assert runs == SEEDS, f"{runs} cells ran in {root}"
    return {
        "wall_s": round(wall, 2),
        "per_seed_s": round(wall * JOBS / SEEDS, 2),
        "collect_s_per_seed": round(collect / SEEDS, 2),
        "update_s_per_seed": round(update / SEEDS, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="cd057c1", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of every variant")
    parser.add_argument("--out", default="benchmarks/results/study_cell.json")
    parser.add_argument(
        "--no-zygote-row", action="store_true", help="leave out the VACO_SWEEP_ZYGOTE=0 variant (saves a third)"
    )
    parser.add_argument(
        "--envpool",
        action="store_true",
        help="add the same cell on the opt-in envpool backend (study_cell_envpool.yaml)",
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vaco-study-cell-"))
    base = work / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.baseline], check=True)
    (base / SWEEP).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / SWEEP, base / SWEEP)  # the same sweep file, read with the baseline's configs
    variants = {
        f"baseline {args.baseline}": (base, {}, SWEEP),
        "this tree": (REPO, {}, SWEEP),
    }
    if not args.no_zygote_row:
        variants["this tree, VACO_SWEEP_ZYGOTE=0"] = (REPO, {"VACO_SWEEP_ZYGOTE": "0"}, SWEEP)
    if args.envpool:
        variants["this tree, envpool backend"] = (REPO, {}, ENVPOOL_SWEEP)
    results: dict[str, list[dict]] = {name: [] for name in variants}
    try:
        for round_ in range(args.rounds):
            for name, (tree, extra, sweep) in variants.items():
                root = work / f"{name.split()[0]}-{len(results[name])}-{round_}-{abs(hash(name)) % 997}"
                root.mkdir()
                results[name].append(_run(root, tree, extra, sweep))
                print(f"round {round_ + 1}: {name}: {results[name][-1]}", flush=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for name, rows in results.items():
        summary[name] = {key: round(sum(r[key] for r in rows) / len(rows), 2) for key in rows[0]}
    base_name = f"baseline {args.baseline}"
    for name in summary:
        summary[name]["speed_up_vs_baseline"] = round(summary[base_name]["wall_s"] / summary[name]["wall_s"], 3)
    report = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), {platform.platform()}",
        "python": platform.python_version(),
        "baseline": args.baseline,
        "rounds": args.rounds,
        "per_round": results,
        "mean": summary,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nstudy cell (4 seeds, 2 at a time; means of {args.rounds} alternating rounds):")
    for name, row in summary.items():
        print(
            f"  {name:34s} wall {row['wall_s']:7.1f} s | per seed {row['per_seed_s']:6.1f} s | collect "
            f"{row['collect_s_per_seed']:5.1f} s | update {row['update_s_per_seed']:5.1f} s | x{row['speed_up_vs_baseline']:.2f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
