"""The population update (vaco.population) against each member's own solo update, bit for bit.

S real runs (tiny InvertedPendulum trainings with a Lightning Trainer, one per seed) record what
their update saw and what it produced; the population then updates the S members at once from the
same starting weights and data. Every member's weights after every iteration, and its averaged
outputs, must equal its solo run's exactly (``torch.equal``, not a tolerance): batching must not
change a run's numbers.
"""

from __future__ import annotations

import copy

import pytest
import torch

from helpers.runs import build_run
from vaco.advantages import GAE, VTrace
from vaco.data.normalization import OBS_CLIP
from vaco.objectives import PPOKL, SPO, PPOClip, TVFilter
from vaco.population import PopulationUpdate
from vaco.vaco_module import TRAIN_KEYS

SEEDS = (3, 4, 5, 6)
ITERATIONS = 3
ALGORITHMS = {
    "vaco": (lambda: TVFilter(delta=0.2), lambda: VTrace(gamma=0.99, lmbda=0.95)),
    "vaco_hopper": (lambda: TVFilter(delta=0.2), lambda: VTrace(gamma=0.99, lmbda=0.95)),
    "ppo_clip": (lambda: PPOClip(clip_epsilon=0.2), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "ppo_kl_adaptive": (lambda: PPOKL(kl_coef=1.0, target_kl=0.001), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "spo": (lambda: SPO(), lambda: GAE(gamma=0.99, lmbda=0.95)),
}


def _solo(tmp_path, uri, objective, advantage, seed: int, env: str) -> list[dict]:
    """One real run; for each iteration, what its update started from, saw and ended with."""
    module, data, trainer = build_run(
        tmp_path / f"s{seed}",
        uri,
        objective=objective(),
        advantage=advantage(),
        seed=seed,
        data_kwargs={"env_id": env, "total_steps": 2 * 64 * ITERATIONS, "policy_buffer_size": 3, "eval_every": 0},
        model_kwargs={"update_epochs": 2, "num_minibatches": 4},
    )
    records, update = [], module.update

    def recorded(batch, flat):
        nets = (("actor.", module.actor), ("critic.", module.critic))
        record = {
            "before": {p + n: v.detach().clone() for p, net in nets for n, v in net.named_parameters()},
            "generator": module._generator.get_state(),
            "norm": tuple(t.clone() for t in module._norm_cache),
            "lr": module.optimizers().param_groups[0]["lr"],
            "train": {key: flat[key].clone() for key in TRAIN_KEYS},
            "buffers": {n: b.clone() for n, b in module.objective.named_buffers()},
        }
        record["means"] = update(batch, flat)
        record["after"] = {p + n: v.detach().clone() for p, net in nets for n, v in net.named_parameters()}
        records.append(record)
        return record["means"]

    module.update = recorded  # the solo run's own update, recorded as it runs
    trainer.fit(module, datamodule=data)
    assert len(records) == ITERATIONS
    return records, module


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_each_member_of_a_population_updates_exactly_as_its_solo_run(tmp_path, mlflow_uri, algorithm):
    """Hopper's 3 actions make log_std and the output bias 3 numbers a member: stacked, a member's
    slice would start mid-vector in the fused Adam kernel and round otherwise (seen at 4 members)."""
    objective, advantage = ALGORITHMS[algorithm]
    env = "Hopper-v5" if algorithm.endswith("hopper") else "InvertedPendulum-v5"
    runs = [_solo(tmp_path, mlflow_uri, objective, advantage, seed, env) for seed in SEEDS]
    for size in (1, 2, len(SEEDS)):  # the population of one, and larger ones
        members = runs[:size]
        first = [records[0] for records, _ in members]
        actors, critics = [], []
        for record, (_, module) in zip(first, members):
            actor, critic = copy.deepcopy(module.actor), copy.deepcopy(module.critic)
            with torch.no_grad():
                for prefix, net in (("actor.", actor), ("critic.", critic)):
                    for name, p in net.named_parameters():
                        p.copy_(record["before"][prefix + name])
            actors.append(actor)
            critics.append(critic)
        objectives = [objective() for _ in members]
        generators = [torch.Generator() for _ in members]
        hp = members[0][1].hparams
        population = PopulationUpdate(
            actors,
            critics,
            objectives,
            generators,
            update_epochs=hp.update_epochs,
            num_minibatches=hp.num_minibatches,
            max_grad_norm=hp.max_grad_norm,
            lr=hp.lr,
            adam_eps=hp.adam_eps,
        )
        for it in range(ITERATIONS):
            records = [records[it] for records, _ in members]
            for generator, record in zip(generators, records):
                generator.set_state(record["generator"])
            for o, record in zip(objectives, records):  # the adaptive state carried from the last iteration
                for name, value in o.named_buffers():
                    assert torch.equal(value, record["buffers"][name]), (algorithm, size, it, name)
            population.set_lr(records[0]["lr"])
            train = {key: torch.stack([r["train"][key] for r in records]) for key in TRAIN_KEYS}
            shift = torch.stack([r["norm"][0] for r in records]).unsqueeze(1)
            inv_scale = torch.stack([r["norm"][1] for r in records]).unsqueeze(1)
            means, finite = population.update(
                train,
                lambda obs, shift=shift, inv_scale=inv_scale: ((obs - shift) * inv_scale).clamp(-OBS_CLIP, OBS_CLIP),
            )
            assert finite == [True] * size
            for m, record in enumerate(records):
                for name, value in record["after"].items():
                    assert torch.equal(population.params[name][m], value), (algorithm, size, it, m, name)
                assert means[m] == record["means"], (algorithm, size, it, m)
            population.write_back(actors, critics)
            assert all(torch.equal(a.log_std, r["after"]["actor.log_std"]) for a, r in zip(actors, records))


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        # the members' flags and the gather's indices on the GPU (a --population 16 on an H200 once
        # stopped on a CPU flag meeting the loss's on cuda: docs/gpu.md)
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")],
        ),
    ],
)
def test_a_member_whose_loss_is_not_finite_keeps_its_weights_and_the_others_update(tmp_path, device):
    torch.manual_seed(0)
    from vaco.networks import Critic, GaussianActor

    actors = [GaussianActor(4, 2).to(device) for _ in range(3)]
    critics = [Critic(4).to(device) for _ in range(3)]
    population = PopulationUpdate(
        actors,
        critics,
        [PPOClip() for _ in range(3)],
        [torch.Generator().manual_seed(i) for i in range(3)],
        update_epochs=1,
        num_minibatches=1,  # one step, the bad one for member 1 (a solo run skips that step only)
        max_grad_norm=0.5,
        lr=1e-3,
        adam_eps=1e-5,
    )
    g = torch.Generator().manual_seed(1)
    n = 16
    train = {
        "observation": torch.randn(3, n, 4, generator=g),
        "action": torch.randn(3, n, 2, generator=g),
        "behavior_log_prob": torch.randn(3, n, generator=g) - 2,
        "behavior_loc": torch.zeros(3, n, 2),
        "behavior_scale": torch.ones(3, n, 2),
        "advantage": torch.randn(3, n, generator=g),
        "value_target": torch.randn(3, n, generator=g),
        "state_value": torch.randn(3, n, generator=g),
    }
    train = {key: value.to(device) for key, value in train.items()}
    train["advantage"][1, 5] = float("nan")  # member 1 goes bad
    before = {name: p.detach().clone() for name, p in population.params.items()}
    _, finite = population.update(train, lambda obs: obs)
    assert finite == [True, False, True]
    for name, p in population.params.items():
        assert torch.equal(p[1], before[name][1]), name  # kept
        assert torch.isfinite(p).all(), name
    assert not torch.equal(population.params["actor.mean.0.weight"][0], before["actor.mean.0.weight"][0])
    assert not torch.equal(population.params["actor.mean.0.weight"][2], before["actor.mean.0.weight"][2])
