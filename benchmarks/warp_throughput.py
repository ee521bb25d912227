"""Throughput of the MuJoCo Warp backend on the device at hand, against the gymnasium CPU path.

1. env steps/s of the batched env alone (random actions in the bounds) against ``nworld``
   (64, 512, 4,096) for Hopper-v5 (``--tasks`` for others); on a CUDA device also with the
   physics replayed as a CUDA graph (``cuda_graph: true``);
2. end-to-end SPS of real training iterations (``vaco fit``, collection + update, as
   ``perf/sps`` logs it) at 500 envs x ``--num-steps`` steps for PPO-clip and VACO, on the Warp
   backend and on the gymnasium CPU path, in the same run.

    python benchmarks/warp_throughput.py [--device cuda] [--num-steps 1000] [--out benchmarks/results/warp_throughput.json]

Every figure is measured in this run; the machine is printed with them. On Warp's CPU device the
backend is slower than gymnasium (kernel launches dominate): that is expected and reported as is.
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

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

REPO = Path(__file__).resolve().parents[1]


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def env_steps_per_second(env_id: str, worlds: int, device: str, seconds: float, cuda_graph: bool = False) -> float:
    from vaco.data.warp.env import WarpVectorEnv

    env = WarpVectorEnv(env_id, worlds, device=device, seed=0, cuda_graph=cuda_graph)
    env.reset(seed=0)
    gen = torch.Generator(device=env.device).manual_seed(0)

    def step():
        u = torch.rand(worlds, env.act_dim, generator=gen, device=env.device)
        env.step(env.action_low + u * (env.action_high - env.action_low))

    for _ in range(3):  # warm-up: kernels compiled and loaded
        step()
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    start, n = time.perf_counter(), 0
    while n < 3 or time.perf_counter() - start < seconds:
        step()
        n += 1
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    return worlds * n / (time.perf_counter() - start)


def fit_sps(algo: str, warp: bool, device: str, num_envs: int, num_steps: int, iterations: int) -> dict:
    """One ``vaco fit`` at the given batch shape; the mean perf/* of its iterations from MLflow."""
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        args = [
            str(Path(sys.executable).with_name("vaco")),
            "fit",
            "--config",
            str(REPO / "configs" / "env" / "hopper.yaml"),
            "--config",
            str(REPO / "configs" / "algo" / f"{algo}.yaml"),
            "--data.init_args.num_envs",
            str(num_envs),
            "--data.init_args.num_steps",
            str(num_steps),
            "--data.init_args.total_steps",
            str(num_envs * num_steps * iterations),
            "--data.init_args.eval_every",
            "0",
            "--data.init_args.eval_episodes",
            "1",
            "--data.init_args.eval_envs",
            "1",
            "--trainer.default_root_dir",
            tmp,
            "--trainer.enable_progress_bar",
            "false",
            "--checkpoint.every_n_iterations",
            "0",
            "--trainer.logger.init_args.log_model",
            "false",
        ]
        if warp:
            args += [
                "--config",
                str(REPO / "configs" / "collection" / "warp.yaml"),
                "--data.init_args.collection.init_args.device",
                device,
                "--data.init_args.collection.init_args.evaluate_on",
                "gymnasium",
            ]
        if device.startswith("cuda"):
            args += ["--config", str(REPO / "configs" / "hardware" / "gpu.yaml")]
        start = time.perf_counter()
        out = subprocess.run(args, env={**os.environ, "MLFLOW_TRACKING_URI": uri}, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-3000:])
        client = mlflow.MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("vaco").experiment_id])

        def mean(key):
            values = [m.value for m in client.get_metric_history(run.info.run_id, key)]
            return sum(values) / len(values)

        return {
            "sps": mean("perf/sps"),
            "collect_sps": mean("perf/collect_sps"),
            "collect_s": mean("perf/collect_seconds"),
            "update_s": mean("perf/update_seconds"),
            "wall_s": wall,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tasks", nargs="+", default=["Hopper-v5"])
    parser.add_argument("--worlds", nargs="+", type=int, default=[64, 512, 4096])
    parser.add_argument("--seconds", type=float, default=5.0, help="per env-throughput measurement")
    parser.add_argument("--num-envs", type=int, default=500)
    parser.add_argument("--num-steps", type=int, default=1000, help="steps per iteration (the paper: 1,000)")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--skip-fit", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/warp_throughput.json")
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None
    machine = f"{_cpu_name()}, {os.cpu_count()} cores" + (f", {gpu}" if gpu else "")
    print(f"machine: {machine}; Warp device: {args.device}")
    results = {"machine": machine, "device": args.device, "env": {}, "fit": {}}
    graphs = args.device.startswith("cuda")
    print(
        "\n| task | worlds | env steps/s |"
        + (" with a CUDA graph |\n|---|---|---|---|" if graphs else "\n|---|---|---|")
    )
    for env_id in args.tasks:
        for worlds in args.worlds:
            sps = env_steps_per_second(env_id, worlds, args.device, args.seconds)
            results["env"][f"{env_id}:{worlds}"] = sps
            row = f"| {env_id} | {worlds:,} | {sps:,.0f} |"
            if graphs:
                graph_sps = env_steps_per_second(env_id, worlds, args.device, args.seconds, cuda_graph=True)
                results["env"][f"{env_id}:{worlds}:cuda_graph"] = graph_sps
                row += f" {graph_sps:,.0f} |"
            print(row, flush=True)
    if not args.skip_fit:
        shape = f"{args.num_envs} x {args.num_steps}"
        print(f"\nEnd to end, Hopper-v5, {shape} per iteration, {args.iterations} iteration(s) (perf/* means):\n")
        print(
            "| algorithm | collection | SPS | collect SPS | collect s | update s | wall s |\n|---|---|---|---|---|---|---|"
        )
        for algo in ("ppo_clip", "vaco"):
            for warp in (True, False):
                r = fit_sps(algo, warp, args.device if warp else "cpu", args.num_envs, args.num_steps, args.iterations)
                name = f"Warp ({args.device})" if warp else "gymnasium (CPU, in process)"
                results["fit"][f"{algo}:{'warp' if warp else 'gymnasium'}"] = r
                print(
                    f"| {algo} | {name} | {r['sps']:,.0f} | {r['collect_sps']:,.0f} | {r['collect_s']:.1f} | {r['update_s']:.1f} | {r['wall_s']:.0f} |",
                    flush=True,
                )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
