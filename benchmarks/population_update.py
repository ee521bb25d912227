"""The population update against the solo update it replaces, on the study cell's real data.

S real solo runs (Hopper-v5, VACO K = 4, the study cell's 16 envs x 256 steps, 10 epochs x 32
minibatches, one torch thread) train ``--iterations`` iterations each under a Lightning Trainer;
every call of their own update (``MinibatchUpdate.update``) is timed and its inputs recorded. The
recorded iterations are then replayed through :class:`vaco.population.layout.PopulationUpdate` for
populations of 1, 2, 4, ... members, timed, and checked bit for bit against the solo results.

It prints, per population size, the update's seconds per member per iteration and the speed-up
over the solo update, and writes a JSON file. The update only: collection, evaluation and start-up
are the rest of a study cell's cost (docs/performance.md).

    python benchmarks/population_update.py [--seeds 8] [--iterations 3] [--out benchmarks/results/population_update.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import lightning as L  # noqa: E402
import torch  # noqa: E402

from vaco import RolloutDataModule, VacoModule  # noqa: E402
from vaco.advantages import VTrace  # noqa: E402
from vaco.data.normalization import OBS_CLIP  # noqa: E402
from vaco.learners.update import TRAIN_KEYS  # noqa: E402
from vaco.objectives import TVFilter  # noqa: E402
from vaco.population.layout import PopulationUpdate

torch.set_num_threads(1)


def solo_run(seed: int, iterations: int) -> tuple[list[dict], VacoModule]:
    """One real run of the study cell's settings; each update timed and recorded."""
    L.seed_everything(seed, verbose=False)
    module = VacoModule(
        objective=TVFilter(delta=0.2), advantage=VTrace(gamma=0.99, lmbda=0.95), update_epochs=10, num_minibatches=32
    )
    data = RolloutDataModule(
        env_id="Hopper-v5",
        num_envs=16,
        num_steps=256,
        total_steps=16 * 256 * iterations,
        policy_buffer_size=4,
        eval_every=0,
        eval_episodes=1,
        eval_envs=1,
        seed=seed,
    )
    records, update = [], module.update

    def timed(batch, flat):
        nets = (("actor.", module.actor), ("critic.", module.critic))
        record = {
            "before": {p + n: v.detach().clone() for p, net in nets for n, v in net.named_parameters()},
            "generator": module.generator.get_state(),
            "norm": tuple(t.clone() for t in module.frozen_normalizer),
            "lr": module.optimizers().param_groups[0]["lr"],
            "train": {key: flat[key].clone() for key in TRAIN_KEYS},
        }
        start = time.perf_counter()
        record["means"] = update(batch, flat)
        record["seconds"] = time.perf_counter() - start
        record["after"] = {p + n: v.detach().clone() for p, net in nets for n, v in net.named_parameters()}
        records.append(record)
        return record["means"]

    module.update = timed
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=data)
    return records, module


def population_replay(runs: list[tuple[list[dict], VacoModule]]) -> tuple[float, bool]:
    """Every recorded iteration of ``runs`` replayed as one population: seconds per iteration, exact?"""
    actors, critics = [], []
    for records, module in runs:
        actor, critic = copy.deepcopy(module.actor), copy.deepcopy(module.critic)
        with torch.no_grad():
            for prefix, net in (("actor.", actor), ("critic.", critic)):
                for name, p in net.named_parameters():
                    p.copy_(records[0]["before"][prefix + name])
        actors.append(actor)
        critics.append(critic)
    hp = runs[0][1].hparams
    generators = [torch.Generator() for _ in runs]
    population = PopulationUpdate(
        actors,
        critics,
        [TVFilter(delta=0.2) for _ in runs],
        generators,
        update_epochs=hp.update_epochs,
        num_minibatches=hp.num_minibatches,
        max_grad_norm=hp.max_grad_norm,
        lr=hp.lr,
        adam_eps=hp.adam_eps,
    )
    seconds, exact = [], True
    for it in range(len(runs[0][0])):
        records = [records[it] for records, _ in runs]
        for generator, record in zip(generators, records):
            generator.set_state(record["generator"])
        population.set_lr(records[0]["lr"])
        train = {key: torch.stack([r["train"][key] for r in records]) for key in TRAIN_KEYS}
        shift = torch.stack([r["norm"][0] for r in records]).unsqueeze(1)
        inv_scale = torch.stack([r["norm"][1] for r in records]).unsqueeze(1)
        start = time.perf_counter()
        means, _ = population.update(
            train, lambda obs, shift=shift, inv_scale=inv_scale: ((obs - shift) * inv_scale).clamp(-OBS_CLIP, OBS_CLIP)
        )
        seconds.append(time.perf_counter() - start)
        exact &= all(
            torch.equal(population.params[name][m], value) and means[m] == record["means"]
            for m, record in enumerate(records)
            for name, value in record["after"].items()
        )
    # the first iteration warms allocations up, as the solo timing's first does
    timed = seconds[1:] if len(seconds) > 1 else seconds
    return sum(timed) / len(timed), exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=8, help="solo runs recorded; populations of 1, 2, 4, ... up to it")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/population_update.json")
    args = parser.parse_args()
    runs = [solo_run(seed, args.iterations) for seed in range(1, args.seeds + 1)]
    solo = [r["seconds"] for records, _ in runs for r in records[1:]]  # the first iteration warms up
    solo_mean = sum(solo) / len(solo)
    print(f"solo update (MinibatchUpdate, the learner's own): {solo_mean:.3f} s per iteration ({len(solo)} timed)")
    rows = [{"members": 0, "seconds_per_iteration": solo_mean, "per_member": solo_mean, "speedup": 1.0, "exact": True}]
    size = 1
    while size <= args.seeds:
        seconds, exact = population_replay(runs[:size])
        row = {
            "members": size,
            "seconds_per_iteration": seconds,
            "per_member": seconds / size,
            "speedup": solo_mean / (seconds / size),
            "exact": exact,
        }
        rows.append(row)
        print(
            f"population of {size}: {seconds:.3f} s per iteration, {seconds / size:.3f} s per member, "
            f"{row['speedup']:.2f}x the solo update per member, bit-exact: {exact}"
        )
        size *= 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                "torch": torch.__version__,
                "setting": "Hopper-v5, VACO K=4, 16 envs x 256 steps, 10 epochs x 32 minibatches, 1 torch thread",
                "iterations": args.iterations,
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
