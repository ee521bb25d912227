"""A population's collection on MuJoCo Warp: members in lockstep on one model, against each
member on its own model in turn.

For each population size S, S collectors (seeds 1..S, K = 4 stale versions of a random actor,
``--worlds`` worlds x ``--steps`` steps each) collect ``--iterations`` batches two ways, alternating
within each round:

* **in turn**: each member's :class:`~vaco.data.warp.warp_collector.WarpCollector` on its own
  :class:`~vaco.data.warp.env.WarpVectorEnv` (what a population did before ``vaco.population.lockstep``,
  and what S separate runs do);
* **lockstep**: the S collectors on blocks of one ``WarpVectorEnv(S x worlds, blocks=S)``,
  stepped once per step for all (:class:`~vaco.population.lockstep.Lockstep`), each member acting and
  recording in turn (``batched=False``);
* **lockstep, batched**: the same, with every member's envs acting in one policy call and recorded
  at once (``batched=True``, the default): on the CPU (``exact``) bit for bit the in-turn batches;
  on cuda equal to them to float rounding (bit for bit where a member's envs hold several versions).

The first iteration of each is a warm-up (kernel compilation, CUDA graph capture) and not timed.
Every lockstep batch is checked against the in-turn batch of the same member (``torch.equal`` on
every key: on Warp's CPU device they must be equal; on a GPU the check is reported, not required).
Prints seconds per iteration of all S members each way, the ratios, and aggregate env steps/s;
writes JSON.

    python benchmarks/population_collection.py [--device cpu] [--env Hopper-v5] [--members 1 2 4 8]
        [--worlds 4] [--steps 32] [--iterations 3] [--rounds 2] [--out population_collection.json]
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

from vaco.data.policy_buffer import PolicyVersionBuffer  # noqa: E402
from vaco.data.warp.env import WarpVectorEnv  # noqa: E402
from vaco.data.warp.warp_collector import WarpCollector  # noqa: E402
from vaco.learners.networks import GaussianActor  # noqa: E402
from vaco.population.lockstep import Lockstep  # noqa: E402

torch.set_num_threads(1)


def buffer(obs_dim: int, act_dim: int, device: str, K: int = 4) -> PolicyVersionBuffer:
    torch.manual_seed(0)
    out = None
    for v in range(K):
        actor = GaussianActor(obs_dim, act_dim)
        out = out or PolicyVersionBuffer(actor, obs_dim, K)
        out.push(actor, torch.zeros(obs_dim), torch.ones(obs_dim), version=v)
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def in_turn(args, S: int, dims) -> tuple[list[float], list[list]]:
    collectors = [
        WarpCollector(
            WarpVectorEnv(args.env, args.worlds, device=args.device, seed=s, cuda_graph=args.device != "cpu"),
            args.steps,
            buffer(*dims, args.device),
            args.iterations,
            seed=s,
        )
        for s in range(1, S + 1)
    ]
    times, batches = [], []
    for _ in range(args.iterations):
        sync(args.device)
        start = time.perf_counter()
        batches.append([c.rollout() for c in collectors])
        sync(args.device)
        times.append(time.perf_counter() - start)
    return times[1:], batches


def lockstep(args, S: int, dims, batched: bool = False) -> tuple[list[float], list[list]]:
    shared = WarpVectorEnv(
        args.env, args.worlds * S, device=args.device, seed=0, cuda_graph=args.device != "cpu", blocks=S
    )
    collectors = [
        WarpCollector(shared.block(m), args.steps, buffer(*dims, args.device), args.iterations, seed=m + 1)
        for m in range(S)
    ]
    loader = Lockstep(collectors, set(), batched=batched)
    times, batches = [], []
    for _ in range(args.iterations):
        sync(args.device)
        start = time.perf_counter()
        batches.append(loader.rollout())
        sync(args.device)
        times.append(time.perf_counter() - start)
    return times[1:], batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--worlds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="population_collection.json")
    args = parser.parse_args()
    probe = WarpVectorEnv(args.env, 1, device=args.device)
    dims = (probe.obs_dim, probe.act_dim)
    rows = []
    for r in range(args.rounds):
        for S in args.members:
            t_turn, b_turn = in_turn(args, S, dims)
            t_lock, b_lock = lockstep(args, S, dims)
            t_batch, b_batch = lockstep(args, S, dims, batched=True)
            gap = max(
                float((a[key].double() - b[key].double()).abs().max())
                for it_a, it_b in zip(b_turn, b_batch)
                for a, b in zip(it_a, it_b)
                for key in a.keys(True, True)
            )
            equal = all(
                torch.equal(a[key], b[key])
                for it_a, it_b in zip(b_turn, b_lock)
                for a, b in zip(it_a, it_b)
                for key in a.keys(True, True)
            )
            turn, lock, batch = sum(t_turn) / len(t_turn), sum(t_lock) / len(t_lock), sum(t_batch) / len(t_batch)
            steps = S * args.worlds * args.steps
            row = dict(
                round=r + 1,
                members=S,
                in_turn_s=turn,
                lockstep_s=lock,
                ratio=turn / lock,
                lockstep_sps=steps / lock,
                in_turn_sps=steps / turn,
                equal=equal,
                batched_s=batch,
                batched_ratio_over_lockstep=lock / batch,
                batched_sps=steps / batch,
                batched_max_abs_gap=gap,
            )
            rows.append(row)
            print(
                f"round {r + 1} S={S:3d}: in turn {turn:7.3f} s, lockstep {lock:7.3f} s an iteration of all members "
                f"({row['ratio']:.2f}x; env steps/s: {row['lockstep_sps']:,.0f} lockstep, {row['in_turn_sps']:,.0f} in turn); "
                f"batches equal: {equal}; batched lockstep {batch:7.3f} s ({lock / batch:.2f}x lockstep, "
                f"largest gap to in turn {gap:.1e})",
                flush=True,
            )
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu"
    meta = dict(
        vars(args),
        machine=f"{device}, {os.cpu_count()} cores",
        torch=torch.__version__,
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
