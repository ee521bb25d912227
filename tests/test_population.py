"""The population update (vaco.population.layout) against each member's own solo update, bit for bit.

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
from vaco.learners.update import TRAIN_KEYS
from vaco.objectives import (
    APPO,
    CISPO,
    DPPOTV,
    M2PO,
    MIS,
    PPOKL,
    SPO,
    TIS,
    TOPR,
    KimiK25,
    OffPolicySequenceMask,
    PPOClip,
    TVFilter,
)
from vaco.population.layout import PopulationUpdate

SEEDS = (3, 4, 5, 6)
ITERATIONS = 3
ALGORITHMS = {
    "vaco": (lambda: TVFilter(delta=0.2), lambda: VTrace(gamma=0.99, lmbda=0.95)),
    "vaco_hopper": (lambda: TVFilter(delta=0.2), lambda: VTrace(gamma=0.99, lmbda=0.95)),
    "ppo_clip": (lambda: PPOClip(clip_epsilon=0.2), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "ppo_kl_adaptive": (lambda: PPOKL(kl_coef=1.0, target_kl=0.001), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "spo": (lambda: SPO(), lambda: GAE(gamma=0.99, lmbda=0.95)),
    # the per-sample corrections (the two with a proximal policy: tests/test_population_fit.py)
    "tis": (lambda: TIS(truncation=1.05), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "mis": (lambda: MIS(low=0.95, high=1.05), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "cispo": (lambda: CISPO(clip_epsilon_low=0.05, clip_epsilon_high=0.05), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "dppo_tv": (lambda: DPPOTV(difference="ratio", mask_low=0.05, mask_high=0.05), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "appo": (lambda: APPO(), lambda: VTrace(gamma=0.99, lmbda=0.95)),
    # the second wave (a minibatch-wide sort in M2PO's mask; thresholds that bind on these short runs)
    "m2po": (lambda: M2PO(m2_threshold=1e-4), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "topr": (lambda: TOPR(), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "ppo_opsm": (lambda: OffPolicySequenceMask(delta=0.01), lambda: GAE(gamma=0.99, lmbda=0.95)),
    "kimi_k25": (lambda: KimiK25(kl_tau=0.1), lambda: GAE(gamma=0.99, lmbda=0.95)),
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
            "generator": module.generator.get_state(),
            "norm": tuple(t.clone() for t in module.frozen_normalizer),
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


@pytest.mark.slow
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
    from vaco.learners.networks import Critic, GaussianActor

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


def _nan_population(exact: bool, host_sync: bool, members: int = 3) -> tuple[PopulationUpdate, dict]:
    """Hopper's sizes (3 actions: log_std and the output biases are list leaves in the exact layout),
    2 epochs x 4 minibatches; member 1 has one NaN advantage, so one minibatch an epoch is bad for
    it (after Adam has state to restore) and the others are good."""
    from vaco.learners.networks import Critic, GaussianActor

    torch.manual_seed(0)
    actors = [GaussianActor(11, 3) for _ in range(members)]
    critics = [Critic(11) for _ in range(members)]
    population = PopulationUpdate(
        actors,
        critics,
        [TVFilter(delta=0.2) for _ in range(members)],
        [torch.Generator().manual_seed(i) for i in range(members)],
        update_epochs=2,
        num_minibatches=4,
        max_grad_norm=0.5,
        lr=3e-4,
        adam_eps=1e-5,
        exact=exact,
        host_sync=host_sync,
    )
    g = torch.Generator().manual_seed(1)
    n = 64
    train = {
        "observation": torch.randn(members, n, 11, generator=g),
        "action": torch.randn(members, n, 3, generator=g),
        "behavior_log_prob": torch.randn(members, n, generator=g) - 4,
        "behavior_loc": torch.zeros(members, n, 3),
        "behavior_scale": torch.ones(members, n, 3),
        "advantage": torch.randn(members, n, generator=g),
        "value_target": torch.randn(members, n, generator=g),
        "state_value": torch.randn(members, n, generator=g),
    }
    train["advantage"][1, 5] = float("nan")
    return population, train


def test_the_sync_free_step_undoes_a_bad_members_steps_as_the_host_path_does_bit_for_bit():
    """The GPU's step (no host sync per minibatch; the bad member's weights and Adam state put back
    with torch.where) against the host's (its rows found with nonzero().tolist()), on the CPU: the
    same weights, Adam moments and means, bit for bit, with a member that is bad in one minibatch
    of each epoch and good in the others."""
    results = []
    for host_sync in (True, False):
        population, train = _nan_population(exact=True, host_sync=host_sync)
        means, finite = population.update(train, lambda obs: obs)
        state = [
            {k: v.clone() for k, v in population.optimizer.state[t].items()}
            for t in population.optimizer.param_groups[0]["params"]
        ]
        results.append((population.params, state, means, finite))
    (params, state, means, finite), (params2, state2, means2, finite2) = results
    assert finite == finite2 == [True, False, True]
    assert all(torch.equal(params[name], params2[name]) for name in params)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(state, state2) for k in a)
    assert str(means) == str(means2)  # NaN means compare equal as text
    # and the bad member did train in its good minibatches (its step was skipped, not the epoch)
    fresh, _ = _nan_population(exact=True, host_sync=True)
    assert not torch.equal(params["actor.mean.0.weight"][1], fresh.params["actor.mean.0.weight"][1])


def test_the_gpu_layout_equals_the_exact_one_to_float_rounding():
    """``exact=False`` (every parameter stacked, the critic's head batched: a GPU's layout) on the
    CPU against the exact layout: the same update to float rounding, the bad member's steps undone."""
    exact, train = _nan_population(exact=True, host_sync=True)
    fast, _ = _nan_population(exact=False, host_sync=False)
    assert all(not isinstance(leaf, list) for leaf in fast.leaves.values())
    assert any(isinstance(leaf, list) for leaf in exact.leaves.values())
    before = {name: p.detach().clone() for name, p in exact.params.items()}
    for _ in range(3):
        means, finite = exact.update(train, lambda obs: obs)
        means_fast, finite_fast = fast.update(train, lambda obs: obs)
        assert finite == finite_fast == [True, False, True]
        for m in (0, 2):
            assert means_fast[m] == pytest.approx(means[m], rel=1e-4, abs=1e-6)
    for name, p in exact.params.items():
        torch.testing.assert_close(fast.params[name], p, rtol=1e-4, atol=1e-6, msg=name)
        assert not torch.equal(p[0], before[name][0]) or "log_std" in name or name.endswith("bias"), name
