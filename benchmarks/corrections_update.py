"""The learner's cost per iteration of every shipped correction against PPO-clip's, side by side,
on the study cell's batch (docs/performance.md, "The corrections' update cost").

Each algorithm's config (``configs/algo/<name>.yaml``) trains on one collected Hopper-v5 batch of
the study cell (16 envs x 256 steps, K = 4), replayed every iteration so that only the learner is
timed: the learner pass and the advantage, 10 epochs x 32 minibatches, the new policy version and
the metrics (throughput.py's update-phase measurement). The algorithms run in a new shuffled order
in each round, one process, nothing else running; each round gives every algorithm's median
seconds per iteration (warm-up and the final iteration left out), and its ratio to PPO-clip's of
the same round. Descriptive: no interval, no margin.

    python benchmarks/corrections_update.py [--rounds 3] [--iterations 4] [--out docs/data/corrections_update_<date>.json]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import yaml  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402

torch.set_num_threads(1)
CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "algo"
ALGORITHMS = ["ppo_clip", "vaco", "decoupled_ppo", "ppo_ewma", "tis", "mis", "cispo", "dppo_tv", "appo"]


def _build(spec: dict):
    module, _, name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**spec.get("init_args", {}))


def from_config(name: str):
    """``() -> (objective, advantage)`` as ``configs/algo/<name>.yaml`` builds them."""
    model = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["model"]["init_args"]
    return lambda: (_build(model["objective"]), _build(model["advantage"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=4, help="timed iterations per fit (plus 2 not timed)")
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if "ppo_clip" not in args.algorithms:
        parser.error("--algorithms must include ppo_clip (every ratio is against it)")
    for name in args.algorithms:
        throughput.ALGORITHMS[name] = from_config(name)
    order_rng = random.Random(0)
    rounds: list[dict[str, float]] = []
    start = time.time()
    for r in range(args.rounds):
        order = list(args.algorithms)
        order_rng.shuffle(order)
        seconds = {}
        for name in order:
            out = throughput.train(
                name,
                throughput.ReplayData,
                num_envs=16,
                num_steps=256,
                iterations=args.iterations,
                data_kwargs={"policy_buffer_size": 4},
            )
            seconds[name] = out["seconds_per_iteration"]
            print(f"round {r + 1} {name:14s} {seconds[name]:.3f} s/iteration", flush=True)
        rounds.append(seconds)
    table = {}
    for name in args.algorithms:
        each = [r[name] for r in rounds]
        ratios = [r[name] / r["ppo_clip"] for r in rounds]
        table[name] = {
            "seconds_per_iteration_median": statistics.median(each),
            "seconds_per_iteration": each,
            "ratio_to_ppo_clip_median": statistics.median(ratios),
            "ratio_to_ppo_clip": ratios,
        }
    print(f"\n{'algorithm':14s} {'s/iteration':>12s} {'x PPO-clip':>11s}  (per round)")
    for name, row in table.items():
        per_round = ", ".join(f"{x:.2f}" for x in row["ratio_to_ppo_clip"])
        print(
            f"{name:14s} {row['seconds_per_iteration_median']:12.3f} {row['ratio_to_ppo_clip_median']:11.2f}  ({per_round})"
        )
    record = {
        "benchmark": "benchmarks/corrections_update.py",
        "command": "python benchmarks/corrections_update.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": throughput.machine(),
        "torch": torch.__version__,
        "setting": "Hopper-v5, 16 envs x 256 steps (4,096 samples), K = 4, 10 epochs x 32 minibatches, one torch thread",
        "rounds": args.rounds,
        "iterations_timed_per_fit": args.iterations,
        "wall_seconds": round(time.time() - start, 1),
        "results": table,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
