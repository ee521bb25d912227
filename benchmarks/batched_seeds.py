"""The boldest lever of the population work, measured before building it: S seeds' updates as one batched update.

A study cell runs many seeds of one config. Its update (10 epochs x 32 minibatches of 128 on
16 x 256 samples, 64-64 tanh actor and critic, Adam with gradient clipping at 0.5) is bound by
per-call overhead on tiny tensors (docs/performance.md), so S seeds' networks stacked along a
leading dimension (``baddbmm``, the way the policy-version mixture already batches K policies)
might cost little more than one seed's. This script times, in one process and one torch thread:

* **sequential**: S separate networks and Adam optimisers, S x 320 minibatch steps of a PPO-clip
  loss (vaco's networks, ``vaco.learners.networks.GaussianActor`` / ``Critic``; torch's fused Adam, as the learner);
* **batched**: one stacked network of S seeds, 320 steps, each step every seed's own minibatch;
  the sum of the per-seed losses (so each seed's gradient is its own), gradient norms clipped per
  seed, and Adam on the stacked parameters (elementwise: the same update as S optimisers).

It prints the update time per seed per iteration and the ratio. It measures the update alone,
on synthetic data (collection, evaluation and the learner's bookkeeping are not in it), and it is
not vaco's learner: what it says is how much of the update's cost batching seeds could remove.

    python benchmarks/batched_seeds.py [--seeds 1 2 4 8] [--iterations 3] [--out benchmarks/results/batched_seeds.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from vaco.learners.networks import Critic, GaussianActor  # noqa: E402

torch.set_num_threads(1)
OBS, ACT, BATCH, MINIBATCH, EPOCHS, CLIP, MAX_NORM = 11, 3, 4096, 128, 10, 0.2, 0.5


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(BATCH, OBS, generator=g),
        "action": torch.randn(BATCH, ACT, generator=g),
        "logp": torch.randn(BATCH, generator=g) * 0.1 - 3.0,
        "adv": torch.randn(BATCH, generator=g),
        "ret": torch.randn(BATCH, generator=g),
    }


def _loss(loc, log_std, value, mb):
    logp = (-0.5 * ((mb["action"] - loc) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    ratio = (logp - mb["logp"]).exp()
    adv = mb["adv"]
    adv = (adv - adv.mean(-1, keepdim=True)) / (adv.std(-1, keepdim=True) + 1e-8)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
    return -surrogate.mean(-1) + 0.5 * ((value - mb["ret"]) ** 2).mean(-1) - 0.0 * log_std.sum(-1).mean(-1)


def sequential(seeds: int, iterations: int) -> float:
    """Seconds for ``iterations`` updates of ``seeds`` separate learners."""
    learners = []
    for s in range(seeds):
        torch.manual_seed(s)
        actor, critic = GaussianActor(OBS, ACT), Critic(OBS)
        params = [*actor.parameters(), *critic.parameters()]
        learners.append((actor, critic, params, torch.optim.Adam(params, lr=3e-4, eps=1e-5, fused=True), _data(s)))
    start = time.perf_counter()
    for it in range(iterations):
        for s, (actor, critic, params, opt, data) in enumerate(learners):
            g = torch.Generator().manual_seed(1000 * it + s)
            for _ in range(EPOCHS):
                for idx in torch.randperm(BATCH, generator=g).view(-1, MINIBATCH):
                    mb = {k: v[idx] for k, v in data.items()}
                    loc = actor.mean(mb["obs"])
                    value = critic.net(mb["obs"]).squeeze(-1)
                    loss = _loss(loc, actor.log_std.expand_as(loc), value, mb)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
                    opt.step()
    return time.perf_counter() - start


class _Stacked(torch.nn.Module):
    """S copies of a 64-64 tanh MLP as stacked weights: one ``baddbmm`` per layer for all seeds."""

    def __init__(self, seeds: int, sizes: list[int]):
        super().__init__()
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        for i, o in zip(sizes[:-1], sizes[1:]):
            w = torch.empty(seeds, i, o)
            for s in range(seeds):
                torch.nn.init.orthogonal_(w[s].T, math.sqrt(2))
            self.weights.append(torch.nn.Parameter(w))
            self.biases.append(torch.nn.Parameter(torch.zeros(seeds, 1, o)))

    def forward(self, x):  # x: S x B x in
        last = len(self.weights) - 1
        for n, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if n < last:
                x = torch.tanh(x)
        return x


def batched(seeds: int, iterations: int) -> float:
    """Seconds for ``iterations`` updates of ``seeds`` learners stacked into one."""
    actor, critic = _Stacked(seeds, [OBS, 64, 64, ACT]), _Stacked(seeds, [OBS, 64, 64, 1])
    log_std = torch.nn.Parameter(torch.zeros(seeds, 1, ACT))
    params = [*actor.parameters(), *critic.parameters(), log_std]
    opt = torch.optim.Adam(params, lr=3e-4, eps=1e-5, fused=True)
    data = [_data(s) for s in range(seeds)]
    stacked = {k: torch.stack([d[k] for d in data]) for k in data[0]}  # S x BATCH x ...
    rows = torch.arange(seeds)[:, None]
    start = time.perf_counter()
    for it in range(iterations):
        gens = [torch.Generator().manual_seed(1000 * it + s) for s in range(seeds)]
        for _ in range(EPOCHS):
            perms = torch.stack([torch.randperm(BATCH, generator=g) for g in gens]).view(seeds, -1, MINIBATCH)
            for m in range(perms.shape[1]):
                idx = perms[:, m]  # S x MINIBATCH: each seed its own minibatch
                mb = {k: v[rows, idx] for k, v in stacked.items()}
                loc = actor(mb["obs"])
                value = critic(mb["obs"]).squeeze(-1)
                loss = _loss(loc, log_std.expand_as(loc), value, mb).sum()  # each seed's gradient is its own
                opt.zero_grad(set_to_none=True)
                loss.backward()
                norms = torch.stack([p.grad.pow(2).flatten(1).sum(1) for p in params]).sum(0).sqrt()  # per seed
                scale = (MAX_NORM / (norms + 1e-6)).clamp(max=1.0)
                for p in params:
                    p.grad.mul_(scale.view(-1, *([1] * (p.grad.dim() - 1))))
                opt.step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    rows = []
    print(f"update time per seed per iteration ({EPOCHS} x {BATCH // MINIBATCH} minibatches of {MINIBATCH})")
    for s in args.seeds:
        seq = sequential(s, args.iterations) / (s * args.iterations)
        bat = batched(s, args.iterations) / (s * args.iterations)
        rows.append(
            {"seeds": s, "sequential_s": round(seq, 4), "batched_s": round(bat, 4), "ratio": round(seq / bat, 2)}
        )
        print(f"  S = {s}: sequential {seq:.3f} s, batched {bat:.3f} s -> {seq / bat:.2f}x")
    if args.out:
        result = {"machine": f"{platform.node()} ({os.cpu_count()} CPUs), {platform.platform()}", "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
