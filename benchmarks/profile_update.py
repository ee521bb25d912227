"""Where the update phase's time goes: a profile of real training iterations (docs/performance.md).

Runs the update alone (one collected batch replayed, as in throughput.py's item 3) under
cProfile and torch.profiler and prints:

1. wall time per iteration and per minibatch step;
2. Python self time by package (torch, lightning, vaco, tensordict, ...): the framework overhead
   around the math;
3. torch's top operators by self CPU time.

    python benchmarks/profile_update.py [--algorithm ppo_clip] [--num-envs 64 --num-steps 128] [--iterations 3]
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

torch.set_num_threads(1)


class _Profile(L.Callback):
    """Profiles iterations 2.. (the first one warms up allocations and caches)."""

    def __init__(self, torch_profiler) -> None:
        self.cprofile = cProfile.Profile()
        self.torch_profiler = torch_profiler
        self.seconds: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 1:
            self.torch_profiler.__enter__()
        if batch_idx >= 1:
            self.cprofile.enable()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx >= 1:
            self.cprofile.disable()
            self.seconds.append(time.perf_counter() - self._start)


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
    parser.add_argument("--iterations", type=int, default=3, help="profiled iterations (after one warm-up)")
    args = parser.parse_args()

    L.seed_everything(1, verbose=False)
    objective, advantage = ALGORITHMS[args.algorithm]()
    module = VacoModule(objective=objective, advantage=advantage, update_epochs=10, num_minibatches=32)
    n, t = args.num_envs, args.num_steps
    data = ReplayData(env_id="Hopper-v5", num_envs=n, num_steps=t, total_steps=n * t * (args.iterations + 1),
                      eval_every=0, eval_episodes=1, eval_envs=1, seed=1)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with tempfile.TemporaryDirectory() as tmp:
        profiler = torch.profiler.profile(activities=activities)
        callback = _Profile(profiler)
        trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0, default_root_dir=tmp)
        trainer.fit(module, data)
        profiler.__exit__(None, None, None)

    steps = 10 * 32
    seconds = sum(callback.seconds[:-1]) / max(len(callback.seconds) - 1, 1)  # the last one evaluates
    print(f"{args.algorithm}, batch {n}x{t} ({n * t} samples), 10 epochs x 32 minibatches, torch threads 1")
    print(f"  {seconds:.3f} s per iteration (profilers on), {1e6 * seconds / steps:.0f} us per minibatch step\n")

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
