"""Populations against separate runs, end to end: 8 seeds of the study cell (Hopper-v5, VACO, K = 4,
16 envs x 256 steps x 20 iterations, 10-episode evaluations every 10), two processes at a time, on
this machine, alternating in one run.

    python benchmarks/population_fit.py [--rounds 1] [--population 4] [--out benchmarks/results/population_fit.json]
        [--baseline DIR]    # also separate runs of another tree (a git worktree: the issue's 555f487)
        [--no-separate]     # with --baseline: leave out this tree's separate runs
        [--extra ARG ...]   # appended to every command: another backend or size, e.g. a Warp cell

For instance the cell on MuJoCo Warp's CPU device, where a population's members step in lockstep
(vaco.population.lockstep), at a size that device can step in minutes:

    python benchmarks/population_fit.py --population 4 --extra --data.init_args.collection \
        '{"class_path": "vaco.data.warp.Warp", "init_args": {"evaluate_on": "gymnasium"}}' \
        --data.init_args.num_envs 4 --data.init_args.num_steps 16 --data.init_args.total_steps 192 \
        --data.init_args.eval_every 0 --data.init_args.eval_episodes 2

Variants (each from scratch, its own SQLite store and folder, this interpreter and tree):

* ``separate``: 8 ``vaco fit`` processes (seeds 1..8), two at a time: today's sweep of the cell;
* ``populations of P``: 8 / P ``vaco fit --population [seeds]`` processes, two at a time;
* with ``--baseline DIR``, first ``separate at DIR``: the 8 separate runs with the vaco of DIR
  (``PYTHONPATH=DIR``, this interpreter), e.g. ``git worktree add /tmp/tree555 555f487``.

Both produce the same 8 runs (a member is its seed's run alone, bit for bit: tests/test_population_fit.py),
so the wall times compare the cost of the same answer. Reported per variant: the wall time, per seed
(wall x 2 / 8), and per seed the collect and update seconds the runs logged (``perf/*``; a member's
update is its share of the batched update plus its own learner pass), the evaluation and start-up
seconds where the tree logs them (``perf/eval_seconds``, ``perf/startup_seconds``: vaco after
2026-11-29; a population's start-up is its process's, shared by its members; in an older tree they
are in the rest), and the rest (logging, checkpoints, the end) as the remainder. This drives ``vaco fit`` directly (``vaco sweep`` packs a
cell's seeds into populations the same way, with its own bookkeeping around them).
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
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEEDS = list(range(1, 9))
JOBS = 2
CELL = [
    "--config",
    str(REPO / "configs/env/hopper.yaml"),
    "--config",
    str(REPO / "configs/algo/vaco.yaml"),
    "--data.init_args.policy_buffer_size",
    "4",
    "--data.init_args.num_envs",
    "16",
    "--data.init_args.num_steps",
    "256",
    "--data.init_args.total_steps",
    "81920",
    "--data.init_args.eval_every",
    "10",
    "--data.init_args.eval_episodes",
    "10",
    "--trainer.enable_progress_bar",
    "false",
]


def _variant(root: Path, groups: list[list[int]], extra: list[str], tree: str | None = None) -> dict:
    uri = f"sqlite:///{root / 'mlflow.db'}"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    if tree is not None:
        env["PYTHONPATH"] = tree
    # create the store once, before two processes race to create its tables
    import mlflow

    from vaco.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, artifact_location

    # and the runs' experiment, as `vaco sweep` does: two `vaco fit`s of a tree from before the
    # logger took the race in its stride (555f487) would both try to create it, and one would fail
    mlflow.MlflowClient(uri).create_experiment(
        "vaco", artifact_location=artifact_location(uri, "vaco"), tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
    )
    commands = []
    for group in groups:
        seeds = ["--seed_everything", str(group[0])]
        if len(group) > 1:
            seeds += ["--population", json.dumps(group)]
        commands.append([sys.executable, "-m", "vaco.commands.cli", "fit", *CELL, *extra, *seeds])
    start = time.perf_counter()
    running: list[subprocess.Popen] = []
    logs = []
    for i, command in enumerate(commands):
        while len(running) >= JOBS:
            _wait_one(running)
        log = open(root / f"job{i}.log", "w")  # noqa: SIM115 - closed below
        logs.append(log)
        running.append(subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT))
    while running:
        _wait_one(running)
    wall = time.perf_counter() - start
    for log in logs:
        log.close()
    client = mlflow.MlflowClient(uri)
    # seconds summed over the runs; start-up is the process's, shared by a population's members
    seconds = dict.fromkeys(("collect", "update", "eval", "startup"), 0.0)
    logged = set()
    found = [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]
    # a population's members share their process: its start-up is counted once (tag vaco.population)
    size = Counter(run.data.tags.get("vaco.population") or run.info.run_id for run in found)
    runs = len(found)
    for run in found:
        members = size[run.data.tags.get("vaco.population") or run.info.run_id]
        for stage in seconds:
            history = client.get_metric_history(run.info.run_id, f"perf/{stage}_seconds")
            logged |= {stage} if history else set()
            seconds[stage] += sum(m.value for m in history) / (members if stage == "startup" else 1)
    assert runs == len(SEEDS), f"{runs} runs in {root}"
    per_seed = wall * JOBS / len(SEEDS)
    out = {"wall_s": round(wall, 2), "per_seed_s": round(per_seed, 2)}
    # evaluation and start-up where the tree logs them (vaco after 2026-11-29; else they are in the rest)
    out |= {f"{stage}_s_per_seed": round(seconds[stage] / len(SEEDS), 2) for stage in seconds if stage in logged}
    out["rest_s_per_seed"] = round(per_seed - sum(seconds.values()) / len(SEEDS), 2)
    return out


def _wait_one(running: list[subprocess.Popen]) -> None:
    while True:
        for proc in running:
            if proc.poll() is not None:
                running.remove(proc)
                if proc.returncode != 0:
                    raise RuntimeError(f"{proc.args} exited {proc.returncode}")
                return
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of every variant")
    parser.add_argument("--population", type=int, default=4, help="members per population (divides 8)")
    parser.add_argument("--out", default="benchmarks/results/population_fit.json")
    parser.add_argument("--baseline", default=None, help="a tree whose separate runs are measured too")
    parser.add_argument(
        "--no-separate",
        action="store_true",
        help="leave out this tree's separate runs (with --baseline: the baseline against populations only)",
    )
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="arguments appended to every command")
    args = parser.parse_args(argv)
    if len(SEEDS) % args.population:
        parser.error("--population must divide 8")
    if args.no_separate and not args.baseline:
        parser.error("--no-separate needs --baseline (something to compare the populations with)")
    trees: dict[str, str | None] = {}
    variants: dict[str, list[list[int]]] = {}
    if args.baseline:
        name = f"separate at {Path(args.baseline).name}"
        variants[name], trees[name] = [[s] for s in SEEDS], str(Path(args.baseline).resolve())
    if not args.no_separate:
        variants["separate"] = [[s] for s in SEEDS]
    variants |= {
        f"populations of {args.population}": [
            SEEDS[i : i + args.population] for i in range(0, len(SEEDS), args.population)
        ],
    }
    work = Path(tempfile.mkdtemp(prefix="vaco-population-fit-"))
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, groups in variants.items():
            root = work / f"{name.replace(' ', '_')}-{round_}"
            root.mkdir()
            results[name].append(_variant(root, groups, args.extra, trees.get(name)))
            print(f"round {round_ + 1}: {name}: {results[name][-1]}", flush=True)
    summary = {
        name: {key: round(sum(r[key] for r in rows) / len(rows), 2) for key in rows[0]}
        for name, rows in results.items()
    }
    for name in summary:
        if "separate" in summary:
            summary[name]["wall_ratio_separate_over_this"] = round(
                summary["separate"]["wall_s"] / summary[name]["wall_s"], 3
            )
        for base in trees:
            summary[name][f"wall_ratio_{base.replace(' ', '_')}_over_this"] = round(
                summary[base]["wall_s"] / summary[name]["wall_s"], 3
            )
    report = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), {platform.platform()}",
        "processor": platform.processor(),
        "python": platform.python_version(),
        "rounds": args.rounds,
        "cell": " ".join(CELL[4:]),
        "extra": args.extra,
        "baseline": trees,
        "per_round": results,
        "mean": summary,
        "work_dir": str(work),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nstudy cell, 8 seeds, 2 processes at a time (means of {args.rounds} alternating rounds):")
    for name, row in summary.items():
        print(
            f"  {name:22s} wall {row['wall_s']:7.1f} s | per seed {row['per_seed_s']:6.1f} s | "
            + " | ".join(
                f"{stage} {row[f'{stage}_s_per_seed']:5.1f} s"
                for stage in ("collect", "update", "eval", "startup", "rest")
                if f"{stage}_s_per_seed" in row
            )
            + (f" | x{row['wall_ratio_separate_over_this']:.2f}" if "separate" in summary else "")
            + "".join(
                f" | {base}: x{row[f'wall_ratio_{base.replace(chr(32), chr(95))}_over_this']:.2f}" for base in trees
            )
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
