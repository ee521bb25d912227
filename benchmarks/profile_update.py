"""Where the update phase's time goes: a profile of real training iterations (docs/performance.md).

Runs the update alone (one collected batch replayed, as in throughput.py's item 3) under
cProfile and torch.profiler and prints:

1. wall time per iteration and per minibatch step;
2. Python self time by package (torch, lightning, vaco, tensordict, ...): the framework overhead
   around the math;
3. torch's top operators by self CPU time.

    python benchmarks/profile_update.py [--algorithm ppo_clip] [--num-envs 64 --num-steps 128] [--iterations 3]
    # the paper's update (500 envs x 1,000 steps, 10 x 32 minibatches), timed without profilers:
    python benchmarks/profile_update.py --algorithm vaco --num-envs 500 --num-steps 1000 --iterations 2 --no-profile [--device cuda --collect-on warp]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import lightning as L  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import ALGORITHMS, ReplayData  # noqa: E402
from vaco import VacoModule  # noqa: E402
from vaco.data.warp import Warp  # noqa: E402

torch.set_num_threads(1)


class _Profile(L.Callback):
    """Times (and profiles) iterations 1..``iterations``; iteration 0 warms up allocations and
    caches, and one more iteration after them (which evaluates) is not measured."""

    def __init__(self, torch_profiler, iterations: int, profile: bool) -> None:
        self.cprofile = cProfile.Profile()
        self.torch_profiler = torch_profiler
        self.iterations, self.profile = iterations, profile
        self.seconds: list[float] = []
        self.iteration = -1  # counted here: with the `dataloader_iter` step flavour Lightning's
        # batch_idx differs between the start and end hooks (which broke --iterations 1)

    def _measured(self) -> bool:
        return 1 <= self.iteration <= self.iterations

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.iteration += 1
        if not self._measured():
            return
        if self.profile:
            if self.iteration == 1:
                self.torch_profiler.__enter__()
            self.cprofile.enable()
        _synchronize(pl_module.device)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._measured():
            return
        _synchronize(pl_module.device)
        self.seconds.append(time.perf_counter() - self._start)
        if self.profile:
            self.cprofile.disable()
            if self.iteration == self.iterations:
                self.torch_profiler.__exit__(None, None, None)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _package(filename: str) -> str:
    for name in ("lightning", "torch", "tensordict", "torchrl", "vaco", "numpy"):
        if f"/{name}/" in filename:
            return name
    return "builtins (C calls)" if filename.startswith("~") else "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="ppo_clip", choices=list(ALGORITHMS))
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=3, help="measured iterations (after one warm-up)")
    parser.add_argument("--device", default="cpu", help="the learner's device: cpu, cuda, mps")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="time only (no profilers)")
    parser.add_argument(
        "--collect-on",
        choices=("gymnasium", "warp"),
        default="gymnasium",
        help="where the one replayed batch is collected: gymnasium on the CPU (the default; ~60 s for the paper's "
        "500 x 1,000 on one core) or MuJoCo Warp on --device (~10 s on an H100)",
    )
    args = parser.parse_args()
    if args.iterations < 1:
        parser.error("--iterations must be >= 1")

    L.seed_everything(1, verbose=False)
    objective, advantage = ALGORITHMS[args.algorithm]()
    module = VacoModule(objective=objective, advantage=advantage, update_epochs=10, num_minibatches=32)
    n, t = args.num_envs, args.num_steps
    data = ReplayData(
        env_id="Hopper-v5",
        num_envs=n,
        num_steps=t,
        total_steps=n * t * (args.iterations + 2),
        eval_every=0,
        eval_episodes=1,
        eval_envs=1,
        seed=1,
        **(
            {"collection": Warp(device="cuda" if args.device == "cuda" else "cpu")} if args.collect_on == "warp" else {}
        ),
    )
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with tempfile.TemporaryDirectory() as tmp:
        profiler = torch.profiler.profile(activities=activities)
        callback = _Profile(profiler, args.iterations, args.profile)
        trainer = L.Trainer(
            max_epochs=1,
            accelerator=args.device,
            devices=1,
            logger=False,
            enable_checkpointing=False,
            callbacks=[callback],
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=tmp,
        )
        trainer.fit(module, data)

    steps = 10 * 32
    seconds = sum(callback.seconds) / len(callback.seconds)
    device = (
        torch.cuda.get_device_name()
        if args.device == "cuda"
        else f"{args.device}, torch threads {torch.get_num_threads()}"
    )
    print(f"{args.algorithm}, batch {n}x{t} ({n * t} samples), 10 epochs x 32 minibatches, on {device}")
    print(
        f"  {seconds:.3f} s per iteration ({'profilers on' if args.profile else 'no profilers'}), "
        f"{1e6 * seconds / steps:.0f} us per minibatch step, {10 * n * t / seconds:,.0f} sample-gradients/s "
        f"(mean of {len(callback.seconds)})\n"
    )
    if not args.profile:
        return

    stats = pstats.Stats(callback.cprofile)
    by_package: dict[str, float] = collections.Counter()
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():
        by_package[_package(filename)] += tottime
    total = sum(by_package.values())
    print("Python self time by package (cProfile; C calls are torch kernels and builtins):")
    for name, value in sorted(by_package.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<22} {100 * value / total:5.1f} %")
    print("\ntorch operators by self CPU time (torch.profiler):")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=40))


if __name__ == "__main__":
    main()
