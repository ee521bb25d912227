"""Throughput: the single-process collector vs the sync multi-process pool (env steps/s).

    # collection alone
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python scripts/bench_parallel.py --env Hopper-v5 \
        --num-envs 64 --num-steps 128 --workers 2 --batches 10 --rounds 3
    # end to end: `vaco fit` with PPO-clip at CleanRL's update settings (10 epochs, 32 minibatches)
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python scripts/bench_parallel.py --fit --iterations 20

Both collect with the same K=1 policy buffer (CleanRL's 64-64 actor); the first batch of each
(process start, env reset) is excluded. Prints one line per setting and round, then a JSON
summary (lists over rounds). Every process uses one torch thread (`--threads` for this one).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this (learner) process")
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternate the settings this many times (shared machines)"
    )
    parser.add_argument("--fit", action="store_true", help="end to end: time `vaco fit` runs instead")
    parser.add_argument("--iterations", type=int, default=20, help="--fit: iterations per run")
    parser.add_argument("--settings", nargs="+", default=None, help="--fit: names from FIT_SETTINGS (default: all)")
    args = parser.parse_args()
    if args.fit:
        return fit(args)
    torch.set_num_threads(args.threads)

    from vaco.data.collector import RolloutCollector
    from vaco.data.envs import env_spec
    from vaco.data.parallel import ActorPool, ActorSpec, actor_seed
    from vaco.data.policy_buffer import PolicyVersionBuffer
    from vaco.learners.networks import GaussianActor

    spec = env_spec(args.env)
    actor = GaussianActor(spec.obs_dim, spec.act_dim)
    buffer = PolicyVersionBuffer(actor, spec.obs_dim, 1)
    buffer.push(actor, torch.zeros(spec.obs_dim), torch.ones(spec.obs_dim), 0)
    frames = args.num_envs * args.num_steps
    results = {}

    def timed(batches) -> float:
        next(batches)  # warm-up: process start, env reset
        start = time.perf_counter()
        for _ in range(args.batches):
            next(batches)
        return args.batches * frames / (time.perf_counter() - start)

    for _ in range(args.rounds):
        single = RolloutCollector(args.env, args.num_envs, args.num_steps, buffer, args.batches + 1, seed=1)
        results.setdefault("single_process", []).append(timed(iter(single)))
        single.shutdown()
        print(f"single process       : {results['single_process'][-1]:8.0f} env steps/s", flush=True)
        for workers in args.workers:
            n = args.num_envs // workers
            specs = [
                ActorSpec(args.env, n, args.num_steps, actor_seed(1, w), w * n, args.num_envs) for w in range(workers)
            ]
            pool = ActorPool(specs, buffer, args.batches + 1, mode="sync")
            try:
                results.setdefault(f"sync_{workers}_workers", []).append(timed(iter(pool)))
            finally:
                pool.shutdown()
            print(
                f"sync, {workers} actor procs  : {results[f'sync_{workers}_workers'][-1]:8.0f} env steps/s", flush=True
            )
    print(json.dumps({"env": args.env, "num_envs": args.num_envs, "num_steps": args.num_steps, **results}))


FIT_SETTINGS = {  # name: extra `vaco fit` arguments
    "single process, 1 thread": ["--torch_threads", "1"],
    "sync, 2 actor procs, learner 1 thread": ["--config", "configs/collection/sync2.yaml", "--torch_threads", "1"],
    "sync, 2 actor procs, learner 2 threads": ["--config", "configs/collection/sync2.yaml", "--torch_threads", "2"],
    # a different algorithm (the data is one update old), listed for its throughput
    "async, 2 actor procs, learner 1 thread": ["--config", "configs/collection/async2.yaml", "--torch_threads", "1"],
    "async, 1 actor proc, learner 1 thread": [
        "--config",
        "configs/collection/async2.yaml",
        "--data.init_args.collection.init_args.num_workers",
        "1",
        "--torch_threads",
        "1",
    ],
}


def fit(args) -> None:
    """Env steps per second of whole iterations (collect + update + logging), from the MLflow
    timestamps of the iterations (process start, first batch and final evaluation excluded)."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import mlflow

    repo = Path(__file__).resolve().parents[1]
    vaco = str(Path(sys.executable).with_name("vaco"))
    frames = args.num_envs * args.num_steps
    results = {}
    for _ in range(args.rounds):
        for name, extra in FIT_SETTINGS.items():
            if args.settings and name not in args.settings:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                uri = f"sqlite:///{tmp}/mlflow.db"
                cmd = [
                    vaco,
                    "fit",
                    "--config",
                    "configs/env/hopper.yaml",
                    "--config",
                    "configs/algo/ppo_clip.yaml",
                    "--data.init_args.env_id",
                    args.env,
                    "--data.init_args.num_envs",
                    str(args.num_envs),
                    "--data.init_args.num_steps",
                    str(args.num_steps),
                    "--data.init_args.total_steps",
                    str(args.iterations * frames),
                    "--data.init_args.eval_every",
                    "0",
                    "--data.init_args.eval_episodes",
                    "1",
                    "--model.init_args.update_epochs",
                    "10",
                    "--model.init_args.num_minibatches",
                    "32",
                    "--checkpoint.every_n_iterations",
                    "0",
                    "--progress_bar.refresh_rate",
                    "0",
                    "--trainer.default_root_dir",
                    tmp,
                    *extra,
                ]
                env = dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_TRACKING_URI=uri)
                subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True)
                client = mlflow.MlflowClient(tracking_uri=uri)
                (run,) = client.search_runs([client.get_experiment_by_name("vaco").experiment_id])
                stamps = sorted(m.timestamp for m in client.get_metric_history(run.info.run_id, "time/iteration"))
                phases = {
                    key: sorted(m.value for m in client.get_metric_history(run.info.run_id, f"perf/{key}_seconds"))
                    for key in ("collect", "update")
                }
            # iterations 2 .. n-1: the last one also runs the final evaluation
            sps = (len(stamps) - 2) * frames / ((stamps[-2] - stamps[0]) / 1000)
            results.setdefault(name, []).append(sps)
            median = {key: values[len(values) // 2] for key, values in phases.items()}
            print(
                f"{name:40s}: {sps:8.0f} env steps/s end to end (median s/iteration: collect "
                f"{median['collect']:.2f}, update {median['update']:.2f})",
                flush=True,
            )
    print(json.dumps({"env": args.env, "num_envs": args.num_envs, "num_steps": args.num_steps, **results}))


if __name__ == "__main__":
    main()
