"""gymnasium's MuJoCo step for all envs at once (vaco.data.envs.MujocoSteps) against gymnasium's
own vector step, side by side in one process.

For each task, two :class:`~vaco.data.collector.GymnasiumEnvs` of ``--envs`` envs (one with the
fast step, one with it switched off, so ``SyncVectorEnv.step``) are reset with one seed and step
the same ``--steps`` actions (uniform in [-1.5, 1.5], beyond the bounds as a Gaussian policy's
samples are; episodes end and reset along the way), alternating within each round. Every output of
every step is checked equal (``torch.equal``). Prints env steps/s each way and the ratio per round;
writes JSON. The env stepping alone: no policy, no learner (a rollout adds the policy's calls and
the buffers, about 15% of collection in a cProfile of the study cell).

    python benchmarks/mujoco_steps.py [--envs 16] [--steps 256] [--rounds 3]
        [--tasks Hopper-v5 Walker2d-v5 HalfCheetah-v5 InvertedPendulum-v5] [--out mujoco_steps.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from vaco.data.collector import GymnasiumEnvs  # noqa: E402

TASKS = ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "InvertedPendulum-v5"]


def _run(envs: GymnasiumEnvs, actions: torch.Tensor, seed: int) -> tuple[float, list]:
    envs.reset(seed=seed)
    outputs = []
    start = time.perf_counter()
    for action in actions:
        outputs.append(envs.step(action))
    return time.perf_counter() - start, outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", nargs="+", default=TASKS)
    parser.add_argument("--out", default="benchmarks/results/mujoco_steps.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for task in args.tasks:
        fast, own = GymnasiumEnvs(task, args.envs), GymnasiumEnvs(task, args.envs)
        if fast.fast is None:
            raise SystemExit(f"{task}: no fast step (vaco.data.envs.MUJOCO_STEPS)")
        own.fast = None
        generator = torch.Generator().manual_seed(0)
        actions = torch.rand(args.steps, args.envs, fast.act_dim, generator=generator) * 3 - 1.5
        for round_ in range(args.rounds):
            seed = 1 + round_
            own_s, own_out = _run(own, actions, seed)
            fast_s, fast_out = _run(fast, actions, seed)
            equal = all(torch.equal(a, b) for x, y in zip(fast_out, own_out) for a, b in zip(x, y))
            ends = int(sum(int((y[2] | y[3]).sum()) for y in own_out))
            steps = args.envs * args.steps
            row = {
                "task": task,
                "round": round_ + 1,
                "gymnasium_s": round(own_s, 4),
                "fast_s": round(fast_s, 4),
                "gymnasium_steps_per_s": round(steps / own_s),
                "fast_steps_per_s": round(steps / fast_s),
                "ratio": round(own_s / fast_s, 3),
                "equal": equal,
                "episode_ends": ends,
            }
            rows.append(row)
            print(
                f"{task:20s} round {round_ + 1}: gymnasium {row['gymnasium_steps_per_s']:6d} steps/s, "
                f"all at once {row['fast_steps_per_s']:6d} steps/s: {row['ratio']:.2f}x, "
                f"equal {equal}, {ends} episode ends",
                flush=True,
            )
            if not equal:
                raise SystemExit(f"{task}: the fast step's outputs differ from gymnasium's")
        fast.close()
        own.close()
    report = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), {platform.platform()}",
        "processor": platform.processor(),
        "torch": torch.__version__,
        "settings": vars(args),
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(report, out, indent=2)
        out.write("\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
