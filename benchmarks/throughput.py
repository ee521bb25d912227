"""Throughput of every stage against the simulator's own limit (``make bench``).

Prints one table, every figure measured in this run on this machine, and writes it as JSON:

1. the ceiling: gymnasium's own sync vector env stepping random actions (Hopper, HalfCheetah;
   1, 16, 64 envs);
2. vaco's collection alone, K = 1 and K = 16 policies in the buffer;
3. vaco's update phase alone (samples/s) for PPO-clip, VACO and IMPALA on the same batch;
4. end-to-end SPS of full training iterations: CleanRL's defaults (1 env x 2,048 steps) and a
   vectorised setting (64 envs x 128 steps), next to CleanRL's own loops run here;
5. peak resident memory for one paper-scale batch (500 envs x 1,000 steps on Humanoid-v5,
   advantage and one epoch of update), in a fresh process.

Then the targets, as ratios from this one run so that the machine's noise cancels.
torch uses one intra-op thread in every process here (see docs/performance.md for why).

    python benchmarks/throughput.py [--quick] [--out benchmarks/results/throughput.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import gymnasium as gym  # noqa: E402
import lightning as L  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cleanrl_reference  # noqa: E402
from vaco import RolloutDataModule, VacoModule  # noqa: E402
from vaco.advantages import GAE, VTrace  # noqa: E402
from vaco.data.collector import RolloutCollector  # noqa: E402
from vaco.data.envs import env_spec  # noqa: E402
from vaco.data.policy_buffer import PolicyVersionBuffer  # noqa: E402
from vaco.learners.networks import GaussianActor  # noqa: E402
from vaco.objectives import IMPALA, PPOClip, TVFilter  # noqa: E402

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = {
    "ppo_clip": lambda: (PPOClip(), GAE()),
    "vaco": lambda: (TVFilter(delta=0.2), VTrace()),
    "impala": lambda: (IMPALA(), VTrace()),
}


# ---------------------------------------------------------------------------------- 1. ceiling
def ceiling(env_id: str, num_envs: int, steps: int) -> float:
    """gymnasium's sync vector env (its defaults) stepping uniform random actions."""
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
    env.reset(seed=0)
    space = env.single_action_space
    actions = (
        np.random.default_rng(0).uniform(space.low, space.high, size=(64, num_envs, *space.shape)).astype(np.float32)
    )
    for i in range(20):
        env.step(actions[i % 64])
    start = time.perf_counter()
    for i in range(steps):
        env.step(actions[i % 64])
    elapsed = time.perf_counter() - start
    env.close()
    return steps * num_envs / elapsed


# ---------------------------------------------------------------------------------- 2. collection
def collection(env_id: str, num_envs: int, num_steps: int, K: int, rounds: int) -> float:
    spec = env_spec(env_id)
    torch.manual_seed(0)
    buffer = PolicyVersionBuffer(GaussianActor(spec.obs_dim, spec.act_dim), spec.obs_dim, K)
    for version in range(K):
        buffer.push(
            GaussianActor(spec.obs_dim, spec.act_dim), torch.zeros(spec.obs_dim), torch.ones(spec.obs_dim), version
        )
    collector = RolloutCollector(env_id, num_envs, num_steps, buffer, rounds + 1, seed=0)
    iterator = iter(collector)
    next(iterator)  # warm-up (env resets, allocations)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        next(iterator)
        times.append(time.perf_counter() - start)
    collector.shutdown()
    return num_envs * num_steps / statistics.median(times)


# ---------------------------------------------------------------------------------- 3-4. training
class IterationTimer(L.Callback):
    """Wall time of each training step (one iteration: collection + update). Lightning calls the
    batch hooks once more after the last batch (the learner's ``next(dataloader_iter)`` ends the
    epoch there): a call in which no optimiser step happened is not an iteration and is not timed."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_train_batch_start(self, trainer, *args) -> None:
        self._start, self._step = time.perf_counter(), trainer.global_step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step > self._step:
            self.seconds.append(time.perf_counter() - self._start)


class ReplayData(RolloutDataModule):
    """Collects one batch, then serves that same batch every iteration (update phase alone)."""

    def train_dataloader(self):
        batch = next(iter(self.collector))
        self.collector.last_collect_seconds = 0.0
        return _Repeat(batch, self.num_iterations())


class _Repeat:
    """An iterable of copies of one batch (a plain list would read as several dataloaders)."""

    def __init__(self, batch, times: int) -> None:
        self.batch, self.times = batch, times

    def __len__(self) -> int:
        return self.times

    def __iter__(self):
        return (self.batch.clone() for _ in range(self.times))


def _trainer(tmp: str, timer: IterationTimer) -> L.Trainer:
    return L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        callbacks=[timer],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp,
    )


def train(
    algorithm: str,
    data_cls,
    *,
    env_id="Hopper-v5",
    num_envs=1,
    num_steps=2048,
    iterations=4,
    data_kwargs: dict | None = None,
) -> dict[str, float]:
    """Median wall time per iteration of a real fit (first and last iterations excluded)."""
    L.seed_everything(1, verbose=False)
    objective, advantage = ALGORITHMS[algorithm]()
    module = VacoModule(objective=objective, advantage=advantage, update_epochs=10, num_minibatches=32)
    data = data_cls(
        env_id=env_id,
        num_envs=num_envs,
        num_steps=num_steps,
        total_steps=num_envs * num_steps * (iterations + 2),
        eval_every=0,
        eval_episodes=1,
        eval_envs=1,
        seed=1,
        **(data_kwargs or {}),
    )
    timer = IterationTimer()
    with tempfile.TemporaryDirectory() as tmp:
        _trainer(tmp, timer).fit(module, data)
    steady = timer.seconds[1:-1]  # skip warm-up and the final iteration (it evaluates)
    seconds = statistics.median(steady)
    return {"seconds_per_iteration": seconds, "samples_per_second": num_envs * num_steps / seconds}


# ---------------------------------------------------------------------------------- 5. memory
def memory_child(env_id: str, num_envs: int, num_steps: int) -> None:
    """One collection + advantage + one epoch of update; prints peak RSS in MiB."""
    L.seed_everything(1, verbose=False)
    module = VacoModule(objective=TVFilter(delta=0.2), advantage=VTrace(), update_epochs=1, num_minibatches=32)
    data = RolloutDataModule(
        env_id=env_id,
        num_envs=num_envs,
        num_steps=num_steps,
        total_steps=num_envs * num_steps,
        eval_every=0,
        eval_episodes=1,
        eval_envs=1,
        seed=1,
    )
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        _trainer(tmp, IterationTimer()).fit(module, data)
        elapsed = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(json.dumps({"peak_rss_mib": peak_mib, "seconds": elapsed}))


def memory(env_id: str, num_envs: int, num_steps: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", env_id, str(num_envs), str(num_steps)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------- report
def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gymnasium": gym.__version__,
        "mujoco": __import__("mujoco").__version__,
        "torch_threads": str(torch.get_num_threads()),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs, measures little")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "throughput.json"))
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-child", nargs=3, metavar=("ENV", "NUM_ENVS", "NUM_STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        env_id, n, t = args.memory_child
        memory_child(env_id, int(n), int(t))
        return 0

    q = args.quick
    envs = (1, 2) if q else (1, 16, 64)
    big = envs[-1]
    steps = 20 if q else 1000
    rounds = 1 if q else 3
    T_big = 32 if q else 128
    T_clean = 64 if q else 2048
    iters = 3 if q else 5
    results: dict = {"machine": machine(), "quick": q}
    rows: list[tuple[str, str, str]] = []

    def row(section: str, name: str, value: float, unit: str) -> None:
        rows.append((section, name, f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3f} {unit}"))
        print(f"  {section:<11} {name:<58} {rows[-1][2]}", flush=True)

    print(f"machine: {results['machine']}")
    # 1 + 2
    for env_id in ("Hopper-v5", "HalfCheetah-v5"):
        for n in envs:
            key = f"{env_id}/{n}"
            results[f"ceiling/{key}"] = c = ceiling(env_id, n, max(steps // n, 20) if n > 1 else steps * 2)
            row("ceiling", f"{env_id} gymnasium sync vector env, {n} envs", c, "steps/s")
            results[f"collect/{key}/K1"] = v = collection(env_id, n, T_clean if n == 1 else T_big, 1, rounds)
            row("collect", f"{env_id} vaco, {n} envs, K=1", v, "steps/s")
        results[f"collect/{env_id}/{big}/K16"] = v16 = collection(env_id, big, T_big, 16, rounds)
        row("collect", f"{env_id} vaco, {big} envs, K=16", v16, "steps/s")

    # 3: update alone on the same batch (CleanRL's 2048-sample batch and the 64 x 128 one)
    clean = f"1x{T_clean}"
    for label, n, t in ((clean, 1, T_clean), (f"{big}x{T_big}", big, T_big)):
        for algorithm in ALGORITHMS:
            r = train(algorithm, ReplayData, num_envs=n, num_steps=t, iterations=iters)
            results[f"update/{label}/{algorithm}"] = r["samples_per_second"]
            row(
                "update",
                f"{algorithm} update phase, batch {label}, 10 epochs x 32 mb",
                r["samples_per_second"],
                "samples/s",
            )
        ref = cleanrl_reference.run("Hopper-v5", n, t, iters)
        results[f"update/{label}/cleanrl"] = ref["update_samples_per_second"]
        row("update", f"CleanRL update loop, batch {label}", ref["update_samples_per_second"], "samples/s")
        results[f"e2e/{label}/cleanrl"] = ref["sps"]
        results[f"e2e/{label}/cleanrl_collect"] = ref["collect_sps"]

    # 4: end to end
    for label, n, t in ((clean, 1, T_clean), (f"{big}x{T_big}", big, T_big)):
        r = train("ppo_clip", RolloutDataModule, num_envs=n, num_steps=t, iterations=iters)
        results[f"e2e/{label}/vaco_ppo_clip"] = r["samples_per_second"]
        row("end-to-end", f"vaco PPO-clip, Hopper-v5 {label}, one process", r["samples_per_second"], "SPS")
        r = train("vaco", RolloutDataModule, num_envs=n, num_steps=t, iterations=iters)
        results[f"e2e/{label}/vaco_vaco"] = r["samples_per_second"]
        row("end-to-end", f"vaco VACO, Hopper-v5 {label}, one process", r["samples_per_second"], "SPS")
        row(
            "end-to-end",
            f"CleanRL ppo_continuous_action loops, Hopper-v5 {label}",
            results[f"e2e/{label}/cleanrl"],
            "SPS",
        )
    from vaco.data.parallel import Actors  # actor processes, mode sync (docs/async.md)

    label = f"{big}x{T_big}"
    actors = {"collection": Actors(num_workers=2, mode="sync")}
    r = train("ppo_clip", RolloutDataModule, num_envs=big, num_steps=T_big, iterations=iters, data_kwargs=actors)
    results[f"e2e/{label}/vaco_ppo_clip_2workers"] = r["samples_per_second"]
    row("end-to-end", f"vaco PPO-clip, Hopper-v5 {label}, 2 collector workers", r["samples_per_second"], "SPS")

    # 5: memory
    if not args.skip_memory:
        mem_args = ("Humanoid-v5", 8, 8) if q else ("Humanoid-v5", 500, 1000)
        m = memory(*mem_args)
        results["memory/paper_batch_peak_rss_mib"] = m["peak_rss_mib"]
        results["memory/paper_batch_seconds"] = m["seconds"]
        row(
            "memory",
            f"{mem_args[0]} {mem_args[1]} envs x {mem_args[2]} steps: collect + advantage + 1 epoch",
            m["peak_rss_mib"],
            "MiB peak RSS",
        )

    results["targets"] = targets(results, clean, f"{big}x{T_big}")
    print("\ntargets (ratios from this run):")
    for name, t in results["targets"].items():
        verdict = "met" if t["met"] else f"MISSED by {abs(t['ratio'] - t['target']) / t['target']:.0%}"
        print(f"  {name:<62} {t['ratio']:.2f} (target {t['comparison']} {t['target']}) {verdict}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    return 0


def targets(r: dict, clean: str, label: str) -> dict:
    def t(ratio: float, target: float, comparison: str = ">=") -> dict:
        met = ratio >= target if comparison == ">=" else ratio <= target
        return {"ratio": ratio, "target": target, "comparison": comparison, "met": bool(met)}

    big = int(label.split("x")[0])
    out = {}
    for env_id in ("Hopper-v5", "HalfCheetah-v5"):
        out[f"collection {big} envs / gymnasium ceiling ({env_id})"] = t(
            r[f"collect/{env_id}/{big}/K1"] / r[f"ceiling/{env_id}/{big}"], 0.8
        )
        out[f"collection K=16 / K=1 ({env_id}, {big} envs)"] = t(
            r[f"collect/{env_id}/{big}/K16"] / r[f"collect/{env_id}/{big}/K1"], 0.9
        )
    for batch in (clean, label):
        out[f"VACO update cost / PPO-clip ({batch})"] = t(
            r[f"update/{batch}/ppo_clip"] / r[f"update/{batch}/vaco"], 1.1, "<="
        )
        out[f"IMPALA update cost / VACO ({batch}) [reported]"] = {
            **t(r[f"update/{batch}/vaco"] / r[f"update/{batch}/impala"], 1.0),
            "met": True,
        }
    out[f"end-to-end vaco / CleanRL ({clean})"] = t(r[f"e2e/{clean}/vaco_ppo_clip"] / r[f"e2e/{clean}/cleanrl"], 1.0)
    best = max(v for k, v in r.items() if k.startswith(f"e2e/{label}/vaco_ppo_clip"))
    out[f"end-to-end vaco / CleanRL ({label})"] = t(best / r[f"e2e/{label}/cleanrl"], 2.0)
    if "memory/paper_batch_peak_rss_mib" in r:
        out["paper-scale batch peak RSS (GiB)"] = t(r["memory/paper_batch_peak_rss_mib"] / 1024, 4.0, "<=")
    return out


if __name__ == "__main__":
    sys.exit(main())
