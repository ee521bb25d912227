"""Real async vs simulated async vs synchronous on Hopper-v5 (docs/async.md, "Results").

    OMP_NUM_THREADS=1 .venv/bin/python scripts/async_comparison.py run --out /tmp/async_cmp
    .venv/bin/python scripts/async_comparison.py summarize --out /tmp/async_cmp

`run` trains VACO once per setting, one run at a time under `nice -n 10`, same seed and budget:
`sync` (2 actor processes, on-policy, K=1), `simulated` (sync, 2 actors, K versions drawn per
env), `async` (2 actors keep collecting while the learner trains, K=1) and `async1` (the same
with one actor process). `summarize` reads the MLflow
store and prints wall-clock to a return, the final return, throughput and the lag distribution.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VACO = str(Path(sys.executable).with_name("vaco"))

COMMON = [
    "--config",
    "configs/env/hopper.yaml",
    "--config",
    "configs/algo/vaco.yaml",
    "--data.init_args.num_envs",
    "8",
    "--data.init_args.num_steps",
    "256",
    "--data.init_args.eval_every",
    "10",
    "--data.init_args.eval_episodes",
    "10",
    "--progress_bar.refresh_rate",
    "0",
]
SETTINGS = {
    "sync": ["--config", "configs/collection/sync2.yaml"],
    "simulated": ["--config", "configs/collection/sync2.yaml"],  # + --data.init_args.policy_buffer_size K
    "async": ["--config", "configs/collection/async2.yaml"],
    # one actor process: on two cores it collects on one while the learner trains on the other
    "async1": ["--config", "configs/collection/async2.yaml", "--data.init_args.collection.init_args.num_workers", "1"],
}


def command(name: str, total_steps: int, seed: int, k: int) -> list[str]:
    args = [
        "nice",
        "-n",
        "10",
        VACO,
        "fit",
        *COMMON,
        *SETTINGS[name],
        "--data.init_args.total_steps",
        str(total_steps),
        "--seed_everything",
        str(seed),
        "--trainer.logger.init_args.experiment_name",
        "async_comparison",
        "--trainer.logger.init_args.run_name",
        f"{name}-s{seed}",
    ]
    if name == "simulated":
        args += ["--data.init_args.policy_buffer_size", str(k)]
    return args


def run(args) -> None:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_TRACKING_URI=f"sqlite:///{out / 'mlflow.db'}")
    for name in args.settings:
        cmd = command(name, args.total_steps, args.seed, args.k)
        print("$", " ".join(cmd[3:]), flush=True)
        with open(out / f"{name}-s{args.seed}.log", "w") as log:
            subprocess.run(
                cmd + ["--trainer.default_root_dir", str(out)],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
            )


def summarize(args) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{Path(args.out).resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("async_comparison")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    print(
        f"| run | K | wall-clock (min) | to eval/return >= {args.threshold:g} (min / env steps) | final eval/return "
        "| mean perf/sps | policy age per iteration: mean (max) | ages seen (share of iterations) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run in runs:
        rid = run.info.run_id
        evals = client.get_metric_history(rid, "eval/return")
        iters = client.get_metric_history(rid, "time/iteration")
        if not evals or not iters:
            continue  # still starting
        start = run.info.start_time
        end = max(m.timestamp for m in iters)
        first = next((m for m in sorted(evals, key=lambda m: m.step) if m.value >= args.threshold), None)
        reach = f"{(first.timestamp - start) / 60_000:.1f} / {first.step / 1e3:.0f}k" if first else "not reached"
        final = sorted(evals, key=lambda m: m.step)[-1].value
        sps = [m.value for m in client.get_metric_history(rid, "perf/sps")][1:]
        ages = [m.value for m in client.get_metric_history(rid, "lag/policy_age_mean")]
        maxima = [m.value for m in client.get_metric_history(rid, "lag/policy_age_max")]
        share = collections.Counter(int(a) for a in maxima)
        seen = ", ".join(f"max {a}: {n / len(maxima):.0%}" for a, n in sorted(share.items()))
        print(
            f"| {run.info.run_name} | {run.data.params.get('K')} | {(end - start) / 60_000:.1f} | {reach} | {final:.0f} "
            f"| {sum(sps) / len(sps):.0f} | {sum(ages) / len(ages):.2f} ({max(maxima):.0f}) | {seen} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--out", required=True)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--total-steps", type=int, default=300_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--k", type=int, default=3, help="K of the simulated run")
    s = sub.add_parser("summarize")
    s.add_argument("--out", required=True)
    s.add_argument("--threshold", type=float, default=1000.0)
    args = parser.parse_args()
    run(args) if args.cmd == "run" else summarize(args)


if __name__ == "__main__":
    main()
