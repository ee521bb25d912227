"""The lag benchmark's stage-2 cell as the sweep runs it, split by stage and put beside the machine's floor.

    python benchmarks/stage2_cell.py [--iterations 240] [--rounds 1] [--seeds 12] [--population 12] [--env hopper]
        [--baseline DIR] [--baseline-population 4]   # the same cell with the vaco of DIR (a git worktree), alternating
        [--floor-only]                                # only the floor
        [--out benchmarks/results/stage2_cell.json]

The cell: 16 envs x 256 steps an iteration (``--iterations`` of them; 240 is the stage-2 budget,
983,040 env steps a run), 10 epochs x 32 minibatches, K = 4, evaluation every 10 iterations (20
episodes on 10 envs), VACO and PPO-clip, ``--seeds`` seeds each (12: a look's cell), packed as the
sweep packs them: populations of ``--population`` (this tree's ``population: auto`` makes one of
12; 100b5ac's made three of 4), two ``vaco fit --population`` processes at a time, one a core. A
variant is this tree or ``--baseline``'s (``PYTHONPATH=DIR``, this interpreter), in alternating
rounds; both train the same runs (a member is its seed's run alone, bit for bit).

Measured per variant: the wall time and each process's CPU seconds (user + system, from the
kernel's accounting of the child), the env steps its members took (training only), and the
seconds its runs logged (``perf/collect_seconds``, ``perf/update_seconds``, ``perf/eval_seconds``,
``perf/startup_seconds``; a population's start-up once); the rest is the CPU time none of them
covers (logging, checkpoints, the end). Everything is also given per 1M training env steps on one
core: what a 983,040-step run costs.

The floor, measured in the same run:

* **physics**: MuJoCo's step alone for Hopper, Walker2d and HalfCheetah over 16 envs: one
  ``mujoco.rollout.rollout`` call in C over the 16 envs' states and random controls for 256 env
  steps (``frame_skip`` physics steps each; no Python per env or step), started from gymnasium's
  reset states. An untrained policy's states (falls, contacts) may cost otherwise than a trained
  one's; the figure is what the simulator itself costs for these tasks.
* **matrix work of the update**: the multiply-adds of the actor's and critic's layers for every
  minibatch step (forward, and a backward of twice the forward's) and the learner's pass over the
  batch, at this core's single-thread GEMM speed (a 512 x 512 float32 ``torch.mm``, its best of 20).

The floor per 1M env steps is physics + update matrix work: what no Python, no tiny-kernel overhead
and no bookkeeping would cost. The end-to-end figure is reported as a multiple of it.
"""

from __future__ import annotations

import argparse
import datetime
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
NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES, HIDDEN = 16, 256, 10, 32, 64
JOBS = 2  # processes at a time, as `vaco sweep` runs a two-core machine's cells
ALGORITHMS = ("vaco", "ppo_clip")
TASKS = {"hopper": "Hopper-v5", "walker2d": "Walker2d-v5", "halfcheetah": "HalfCheetah-v5"}


def cell(env: str, algorithm: str, iterations: int) -> list[str]:
    return [
        "--config",
        str(REPO / f"configs/env/{env}.yaml"),
        "--config",
        str(REPO / f"configs/algo/{algorithm}.yaml"),
        "--data.init_args.policy_buffer_size",
        "4",
        "--data.init_args.num_envs",
        str(NUM_ENVS),
        "--data.init_args.num_steps",
        str(NUM_STEPS),
        "--data.init_args.total_steps",
        str(NUM_ENVS * NUM_STEPS * iterations),
        "--data.init_args.eval_every",
        "10",
        "--data.init_args.eval_episodes",
        "20",
        "--data.init_args.eval_envs",
        "10",
        "--checkpoint.every_n_iterations",
        "10",
        "--trainer.enable_progress_bar",
        "false",
    ]


# ---------------------------------------------------------------------------------- end to end
def run_variant(root: Path, env: str, iterations: int, seeds: int, population: int, tree: str | None) -> dict:
    """Both algorithms' ``seeds`` seeds as populations of ``population``, two processes at a time;
    their CPU seconds and logged stages."""
    import mlflow

    from vaco.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, artifact_location

    uri = f"sqlite:///{root / 'mlflow.db'}"
    environ = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if tree is not None:
        environ["PYTHONPATH"] = tree
    # the store and experiment made once, before two processes race to make them
    mlflow.MlflowClient(uri).create_experiment(
        "vaco", artifact_location=artifact_location(uri, "vaco"), tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
    )
    jobs = []
    for algorithm in ALGORITHMS:
        for first in range(1, seeds + 1, population):
            group = list(range(first, min(first + population, seeds + 1)))
            command = [sys.executable, "-m", "vaco", "fit", *cell(env, algorithm, iterations)]
            command += ["--seed_everything", str(group[0])]
            command += ["--population", json.dumps(group)] if len(group) > 1 else []
            jobs.append((f"{algorithm}-s{group[0]}", command))
    running: dict[int, tuple[str, subprocess.Popen, object]] = {}
    cpu: dict[str, float] = {}
    start = time.perf_counter()
    while jobs or running:
        while jobs and len(running) < JOBS:
            name, command = jobs.pop(0)
            log = open(root / f"{name}.log", "w")  # noqa: SIM115 - closed when the process ends
            proc = subprocess.Popen(command, cwd=root, env=environ, stdout=log, stderr=subprocess.STDOUT)
            running[proc.pid] = (name, proc, log)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        name, proc, log = running.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.close()
        if proc.returncode != 0:
            raise RuntimeError(f"{name} exited {proc.returncode}: see {root / (name + '.log')}")
        cpu[name] = usage.ru_utime + usage.ru_stime
    wall = time.perf_counter() - start

    client = mlflow.MlflowClient(uri)
    found = [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]
    if len(found) != seeds * len(ALGORITHMS):
        raise RuntimeError(f"{len(found)} runs in {root}, expected {seeds * len(ALGORITHMS)}")
    members = Counter(run.data.tags.get("vaco.population") or run.info.run_id for run in found)
    stages = dict.fromkeys(("collect", "update", "eval", "startup"), 0.0)
    for run in found:
        for stage in stages:
            values = [m.value for m in client.get_metric_history(run.info.run_id, f"perf/{stage}_seconds")]
            share = members[run.data.tags.get("vaco.population") or run.info.run_id] if stage == "startup" else 1
            stages[stage] += sum(values) / share
    total_cpu = sum(cpu.values())
    steps = NUM_ENVS * NUM_STEPS * iterations * seeds * len(ALGORITHMS)
    out = {
        "wall_s": round(wall, 2),
        "population": population,
        "cpu_s": {a: round(c, 2) for a, c in cpu.items()},
        "cpu_s_total": round(total_cpu, 2),
        "env_steps": steps,
        "stages_s": {k: round(v, 2) for k, v in stages.items()} | {"rest": round(total_cpu - sum(stages.values()), 2)},
    }
    per_m = 1e6 / steps
    out["per_1M_steps_core_s"] = {k: round(v * per_m, 2) for k, v in out["stages_s"].items()}
    out["per_1M_steps_core_s"]["total"] = round(total_cpu * per_m, 2)
    out["env_steps_per_core_s"] = round(steps / total_cpu, 1)
    # what a longer run tends to: its processes' start-up spread over more steps
    out["cpu_s_without_startup"] = round(total_cpu - stages["startup"], 2)
    return out


# ---------------------------------------------------------------------------------- the floor
def physics_floor(env_id: str, seconds: float = 3.0) -> dict:
    """MuJoCo's step alone, 16 envs, in one ``mujoco.rollout`` call (C, no Python per env or step)."""
    import warnings

    import gymnasium as gym
    import mujoco
    import numpy as np
    from mujoco import rollout

    warnings.filterwarnings("ignore", message=".*settotalmass.*")

    envs = [gym.make(env_id) for _ in range(NUM_ENVS)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    model, frame_skip = envs[0].unwrapped.model, envs[0].unwrapped.frame_skip
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state = np.stack([_state(e.unwrapped.model, e.unwrapped.data, spec) for e in envs])
    rng = np.random.default_rng(0)
    nstep = NUM_STEPS * frame_skip
    # gymnasium holds each action for frame_skip physics steps
    control = np.repeat(rng.uniform(-1, 1, (NUM_ENVS, NUM_STEPS, model.nu)), frame_skip, axis=1)
    datas = [mujoco.MjData(model) for _ in range(1)]
    best, calls = float("inf"), 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or calls < 3:
        t = time.perf_counter()
        rollout.rollout(model, datas[0], state, control, nstep=nstep, skip_checks=False)
        best, calls = min(best, time.perf_counter() - t), calls + 1
    for e in envs:
        e.close()
    env_steps = NUM_ENVS * NUM_STEPS
    return {
        "env_steps_per_call": env_steps,
        "calls": calls,
        "us_per_env_step": round(best / env_steps * 1e6, 2),
        "core_s_per_1M_env_steps": round(best / env_steps * 1e6, 2),
        "frame_skip": frame_skip,
        "integrator": int(model.opt.integrator),
    }


def _state(model, data, spec):
    import mujoco
    import numpy as np

    out = np.empty(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, data, out, spec)
    return out


def gemm_gflops() -> float:
    """This core's single-thread float32 GEMM speed (a 512 x 512 x 512 ``torch.mm``, best of 20)."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    best = float("inf")
    for _ in range(20):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * 512**3 / best / 1e9


def update_floor(env_id: str, gflops: float) -> dict:
    """The update's matrix work per 1M env steps (each env step's sample is used EPOCHS times, and
    once in the learner's pass) at ``gflops``."""
    import gymnasium as gym

    env = gym.make(env_id)
    obs, act = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    # multiply-adds of one sample's forward: actor obs-64-64-act, critic obs-64-64-1
    macs = (obs * HIDDEN + HIDDEN * HIDDEN + HIDDEN * act) + (obs * HIDDEN + HIDDEN * HIDDEN + HIDDEN)
    flops_per_step = 2 * macs * (3 * EPOCHS + 1)  # forward + backward (2x) per epoch, and the learner's pass
    seconds = flops_per_step * 1e6 / (gflops * 1e9)
    return {"flops_per_env_step": flops_per_step, "core_s_per_1M_env_steps": round(seconds, 3)}


def floor(env: str) -> dict:
    gflops = gemm_gflops()
    out = {"gemm_gflops_1_thread": round(gflops, 1), "physics": {}, "update": {}}
    for name, env_id in TASKS.items():
        out["physics"][name] = physics_floor(env_id)
        out["update"][name] = update_floor(env_id, gflops)
    out["total_core_s_per_1M_env_steps"] = {
        name: round(out["physics"][name]["core_s_per_1M_env_steps"] + out["update"][name]["core_s_per_1M_env_steps"], 2)
        for name in TASKS
    }
    return out


# ---------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=240, help="iterations of 16 x 256 a run (240: stage 2)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of every variant")
    parser.add_argument("--seeds", type=int, default=12, help="seeds an algorithm (12: a stage-2 look's cell)")
    parser.add_argument(
        "--population", type=int, default=12, help="seeds a process, this tree (the sweep's auto packing: 12)"
    )
    parser.add_argument(
        "--baseline-population", type=int, default=4, help="seeds a process, --baseline (its auto packing: 4)"
    )
    parser.add_argument("--env", default="hopper", choices=sorted(TASKS))
    parser.add_argument("--baseline", default=None, help="a tree (git worktree) measured beside this one")
    parser.add_argument("--floor-only", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/stage2_cell.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report: dict = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), {platform.platform()}",
        "processor": _cpu_name(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cell": {
            "env": args.env,
            "iterations": args.iterations,
            "seeds": args.seeds,
            "population": args.population,
            "algorithms": list(ALGORITHMS),
            "command": " ".join(cell(args.env, "ALGO", args.iterations)),
        },
        "floor": floor(args.env),
    }
    print(json.dumps(report["floor"], indent=1), flush=True)
    if not args.floor_only:
        variants = {"this tree": (None, args.population)}
        if args.baseline:
            base = (str(Path(args.baseline).resolve()), args.baseline_population)
            variants = {f"baseline {Path(args.baseline).name}": base, **variants}
        work = Path(tempfile.mkdtemp(prefix="vaco-stage2-cell-"))
        report["work_dir"], report["baseline"] = str(work), args.baseline
        report["per_round"] = {name: [] for name in variants}
        for round_ in range(args.rounds):
            for name, (tree, population) in variants.items():
                root = work / f"{name.replace(' ', '_')}-{round_}"
                root.mkdir()
                result = run_variant(root, args.env, args.iterations, args.seeds, population, tree)
                report["per_round"][name].append(result)
                print(f"round {round_ + 1}: {name}: {json.dumps(result)}", flush=True)
        floor_total = report["floor"]["total_core_s_per_1M_env_steps"][args.env]
        summary = {}
        for name, rows in report["per_round"].items():
            total = [r["per_1M_steps_core_s"]["total"] for r in rows]
            summary[name] = {
                "core_s_per_1M_env_steps": total,
                "x_floor": [round(t / floor_total, 2) for t in total],
            }
        if args.baseline:
            base, this = (report["per_round"][n] for n in variants)
            summary["cpu_ratio_this_over_baseline"] = [
                round(t["cpu_s_total"] / b["cpu_s_total"], 3) for b, t in zip(base, this)
            ]
            summary["cpu_ratio_without_startup"] = [
                round(t["cpu_s_without_startup"] / b["cpu_s_without_startup"], 3) for b, t in zip(base, this)
            ]
        report["summary"] = summary
        print(json.dumps(summary, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
