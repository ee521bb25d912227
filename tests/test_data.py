"""Collection: normalisers against gymnasium's, the policy-version buffer, the collector's
transitions (SAME_STEP autoreset, truncation bootstraps), and exact snapshots. Real MuJoCo envs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.wrappers.utils import RunningMeanStd as GymRMS
from gymnasium.wrappers.vector import NormalizeReward

from vaco.data.collector import RolloutCollector
from vaco.data.envs import make_vector_env, validate_env_id
from vaco.data.normalization import RewardScaler, RunningMeanStd, batch_moments, normalize_observation
from vaco.data.policy_buffer import PolicyVersionBuffer
from vaco.learners.networks import GaussianActor, gaussian_entropy, gaussian_log_prob


def test_running_mean_std_matches_gymnasium():
    rng = np.random.default_rng(0)
    ours, theirs = RunningMeanStd(5), GymRMS(shape=(5,))
    for n in (1, 7, 100, 3):
        x = rng.normal(2.0, 3.0, size=(n, 5))
        ours.update(torch.from_numpy(x))
        theirs.update(x)
    np.testing.assert_allclose(ours.mean.numpy(), theirs.mean, rtol=1e-12)
    np.testing.assert_allclose(ours.var.numpy(), theirs.var, rtol=1e-12)
    assert float(ours.count) == pytest.approx(theirs.count)
    x = torch.randn(4, 5) * 50
    expect = np.clip((x.numpy() - theirs.mean) / np.sqrt(theirs.var + 1e-8), -10, 10)
    np.testing.assert_allclose(normalize_observation(x.double(), ours.mean, ours.var).numpy(), expect, rtol=1e-10)


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 1000])
def test_chunked_batch_moments_equal_a_float64_loop(chunk_rows):
    """Large batches are summarised in chunks (no float64 copy of the whole batch): same moments."""
    x = (torch.randn(250, 3) * torch.tensor([1.0, 10.0, 0.1]) + 5).float()
    rows = x.double().tolist()
    mean = [sum(r[j] for r in rows) / len(rows) for j in range(3)]
    var = [sum((r[j] - mean[j]) ** 2 for r in rows) / len(rows) for j in range(3)]
    m, v, count = batch_moments(x, chunk_rows=chunk_rows)
    assert count == 250 and m.dtype == torch.float64
    np.testing.assert_allclose(m.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(v.numpy(), var, rtol=1e-12)


def test_reward_scaler_matches_gymnasium_vector_normalize_reward():
    """Same actions into two identical vector envs: ours vs gymnasium's NormalizeReward (+ clip)."""
    n = 3
    plain = make_vector_env("Hopper-v5", n)
    wrapped = NormalizeReward(make_vector_env("Hopper-v5", n), gamma=0.99)
    scaler = RewardScaler(n, gamma=0.99)
    plain.reset(seed=[5, 6, 7])
    wrapped.reset(seed=[5, 6, 7])
    rng = np.random.default_rng(1)
    dones = 0
    for _ in range(400):
        action = rng.uniform(-1, 1, size=(n, 3)).astype(np.float32)
        _, r, term, trunc, _ = plain.step(action)
        _, r_gym, *_ = wrapped.step(action)
        dones += int((term | trunc).sum())
        # gymnasium accumulates the return in float32, we do in float64
        np.testing.assert_allclose(scaler(r, term, term | trunc), np.clip(r_gym, -10, 10), rtol=1e-5)
    assert dones > 0  # episode ends were exercised
    plain.close()
    wrapped.close()


def test_gaussian_helpers_match_torch_distributions():
    loc, scale, action = torch.randn(6, 3), torch.rand(6, 3) + 0.1, torch.randn(6, 3)
    dist = torch.distributions.Normal(loc, scale)
    torch.testing.assert_close(gaussian_log_prob(action, loc, scale), dist.log_prob(action).sum(-1))
    torch.testing.assert_close(gaussian_entropy(scale), dist.entropy().sum(-1))


def test_unknown_env_id_names_the_field():
    with pytest.raises(ValueError, match=r"`env_id`: unknown gymnasium env id 'Hoper-v5'.*Hopper-v5"):
        validate_env_id("Hoper-v5")


# ---------------------------------------------------------------- the policy-version buffer
class _OtherActor(GaussianActor):
    """Any actor other than vaco's own MLP: the mixture falls back to vmap over functional_call."""


def _filled_buffer(K=3, pushes=4, obs_dim=11, act_dim=3, actor_cls=GaussianActor):
    torch.manual_seed(0)
    actors, buffer = [], None
    for v in range(pushes):
        actor = actor_cls(obs_dim, act_dim)
        with torch.no_grad():
            actor.log_std.fill_(-0.1 * v)
        buffer = buffer or PolicyVersionBuffer(actor, obs_dim, K)
        buffer.push(actor, torch.full((obs_dim,), float(v)), torch.full((obs_dim,), 1.0 + v), version=v)
        actors.append(actor)
    return buffer, actors


def test_buffer_keeps_the_last_k_versions():
    buffer, _ = _filled_buffer(K=3, pushes=5)
    assert sorted(buffer.versions.tolist()) == [2, 3, 4]
    assert buffer.size == 3 and buffer.newest_version == 4
    with pytest.raises(ValueError, match="policy_buffer_size"):
        PolicyVersionBuffer(GaussianActor(2, 1), 2, 0)


def test_assignment_is_uniform_over_filled_slots():
    buffer, _ = _filled_buffer(K=4, pushes=2)  # two of four slots filled
    slots = buffer.assign(20_000, torch.Generator().manual_seed(0))
    versions = buffer.versions[slots]
    counts = torch.bincount(versions, minlength=2)
    assert set(versions.tolist()) == {0, 1}
    assert abs(int(counts[0]) - 10_000) < 400  # ~4 sigma


@pytest.mark.parametrize("actor_cls", [GaussianActor, _OtherActor], ids=["batched-matmul", "vmap"])
def test_mixture_equals_each_version_acting_alone(actor_cls):
    buffer, actors = _filled_buffer(K=4, pushes=4, actor_cls=actor_cls)
    slots = torch.tensor([0, 3, 1, 1, 2, 0])
    obs = torch.randn(6, 11) * 3
    loc, scale = buffer.mixture(slots)(obs)
    for i, slot in enumerate(slots.tolist()):
        v = int(buffer.versions[slot])
        o = normalize_observation(obs[i : i + 1], torch.full((11,), float(v)), torch.full((11,), 1.0 + v))
        ref_loc, ref_scale = actors[v](o)
        torch.testing.assert_close(loc[i], ref_loc[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(scale[i], ref_scale[0])
    # one distinct version takes the plain-module path and gives the same numbers
    same = torch.full((6,), 2)
    loc2, _ = buffer.mixture(same)(obs)
    v = int(buffer.versions[2])
    o = normalize_observation(obs, torch.full((11,), float(v)), torch.full((11,), 1.0 + v))
    torch.testing.assert_close(loc2, actors[v](o)[0])


# ---------------------------------------------------------------- the collector
def _collector(env_id="Hopper-v5", N=3, T=200, K=2, seed=0, **kw):
    obs_dim, act_dim = {"Hopper-v5": (11, 3), "Ant-v5": (105, 8)}.get(env_id, (4, 1))
    buffer, _ = _filled_buffer(K=K, pushes=K, obs_dim=obs_dim, act_dim=act_dim)
    return RolloutCollector(env_id, N, T, buffer, num_iterations=5, seed=seed, **kw), buffer


def test_collector_batch_layout_and_versions():
    collector, buffer = _collector()
    batch = next(iter(collector))
    assert batch.batch_size == torch.Size([3, 200])
    for key in ("observation", "action", "behavior_log_prob", "behavior_loc", "behavior_scale", "policy_version"):
        assert key in batch.keys()
    for key in ("observation", "reward", "done", "terminated", "truncated", "episode_return"):
        assert ("next", key) in batch.keys(True)
    # each actor keeps one version for the whole segment
    versions = batch["policy_version"]
    assert (versions == versions[:, :1]).all()
    assert set(versions[:, 0].tolist()) <= set(buffer.versions.tolist())
    # stored behaviour log-prob is the log-density of the stored action under the stored Gaussian
    torch.testing.assert_close(
        batch["behavior_log_prob"],
        gaussian_log_prob(batch["action"], batch["behavior_loc"], batch["behavior_scale"]),
        rtol=1e-4,
        atol=1e-4,
    )
    collector.shutdown()


def test_transitions_equal_a_plain_single_env_replay():
    """Replay the stored actions in plain single envs (reset by hand at every episode end):
    every stored transition must be a real one (gymnasium's default NEXT_STEP autoreset would
    insert a fake step after each episode end) and the next observation at an episode end must
    be the final one, not the reset one."""
    import gymnasium as gym

    collector, _ = _collector(N=2, T=300, scale_reward=False, seed=2)
    batch = next(iter(collector))
    done = batch["next", "done"]
    assert done.sum() >= 2  # several episode ends inside the batch
    for i in range(2):
        env = gym.make("Hopper-v5", disable_env_checker=True)
        obs, _ = env.reset(seed=2 * 10_000 + i)
        for t in range(300):
            torch.testing.assert_close(batch["observation"][i, t], torch.tensor(obs, dtype=torch.float32))
            action = np.clip(batch["action"][i, t].numpy(), -1, 1)
            obs, reward, term, trunc, _ = env.step(action)
            torch.testing.assert_close(batch["next", "observation"][i, t], torch.tensor(obs, dtype=torch.float32))
            assert float(batch["next", "reward"][i, t]) == pytest.approx(reward, rel=1e-6)
            assert bool(batch["next", "terminated"][i, t]) == term
            assert bool(batch["next", "truncated"][i, t]) == trunc
            if term or trunc:
                obs, _ = env.reset()
        env.close()
    # episode lengths count real steps only and restart after each end
    length = batch["next", "episode_length"]
    for i in range(2):
        previous = -1
        for t in done[i].nonzero().squeeze(-1).tolist():
            if previous >= 0:
                assert int(length[i, t]) == t - previous
            previous = t
    collector.shutdown()


def test_truncation_is_flagged_and_bootstrapped_from_the_final_observation():
    collector, _ = _collector("InvertedPendulum-v5", N=4, T=40, env_kwargs={"max_episode_steps": 5})
    batch = next(iter(collector))
    trunc, term, done = batch["next", "truncated"], batch["next", "terminated"], batch["next", "done"]
    length = batch["next", "episode_length"]
    assert trunc.sum() >= 4
    assert torch.equal(done, trunc | term)  # both can hold when the pole falls on the last step
    assert (length[trunc] == 5).all() and (length[term] <= 5).all()
    # the final observation of a truncated episode is a real next state, distinct from the reset one
    ends = (trunc & ~term)[:, :-1]
    assert (
        not torch.isclose(batch["next", "observation"][:, :-1][ends], batch["observation"][:, 1:][ends]).all(-1).any()
    )
    collector.shutdown()


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Ant-v5"])
def test_collector_snapshot_resumes_bit_exactly_mid_episode(env_id):
    """A collector restored from another's state collects its next batch bit for bit. Ant's reward
    reads the torso's position before its step, which MuJoCo's integration state does not hold: the
    snapshot keeps the body kinematics (without them the first reward after a resume differs)."""
    T = 150 if env_id == "Hopper-v5" else 20
    a, _ = _collector(env_id, N=2, T=T, seed=4)
    it = iter(a)
    next(it)
    state = a.state_dict()  # mid-episode: Hopper episodes outlast 150 random steps sometimes
    expected = next(it)
    b, buffer_b = _collector(env_id, N=2, T=T, seed=99)  # different seed: everything must come from the state
    b.load_state_dict(state)
    got = next(iter(b))
    for key in expected.keys(True, True):
        assert torch.equal(expected[key], got[key]), key
    a.shutdown()
    b.shutdown()


def test_environment_nan_stops_collection():
    collector, _ = _collector(N=1, T=10)
    collector._obs = collector.env.reset(seed=0)
    collector._obs[0, 3] = float("nan")
    with pytest.raises(FloatingPointError, match="NaN"):
        collector.rollout()
    collector.shutdown()


def test_halfcheetah_makes_no_settotalmass_warning_but_other_mujoco_warnings_still_print():
    """MuJoCo 4.0 warns about gymnasium's half_cheetah.xml once per env made (six lines before a
    paper-grid dry run said anything); vaco drops that one warning and prints every other."""
    import subprocess
    import sys

    code = (
        "from vaco.data.envs import make_vector_env, env_spec\n"
        "import mujoco\n"
        "env_spec('HalfCheetah-v5'); make_vector_env('HalfCheetah-v5', 2).close()\n"
        "mujoco.get_mju_user_warning()('another warning')\n"  # what MuJoCo calls for any other one
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "settotalmass" not in out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == ["WARNING: another warning"]


@pytest.mark.parametrize(
    "env_id, env_kwargs",
    [
        ("Hopper-v5", {"max_episode_steps": 15}),
        (
            "Hopper-v5",
            {
                "exclude_current_positions_from_observation": False,
                "healthy_z_range": (0.9, 1.9),
                "ctrl_cost_weight": 0.01,
                "forward_reward_weight": 2.0,
                "max_episode_steps": 15,
            },
        ),
        ("Walker2d-v5", {"max_episode_steps": 15}),
        ("HalfCheetah-v5", {"max_episode_steps": 50}),
        ("InvertedPendulum-v5", {}),
    ],
    ids=["hopper", "hopper-kwargs", "walker2d", "halfcheetah", "inverted-pendulum"],
)
def test_the_fast_mujoco_step_is_gymnasiums_own_step_bit_for_bit(env_id, env_kwargs):
    """GymnasiumEnvs steps these tasks' envs all at once (vaco.data.envs.MujocoSteps) instead of
    through gymnasium's vector loop: every output (observations, rewards, terminations,
    truncations, final observations) equals gymnasium's own step's, through episode ends, resets
    and truncations, with actions outside the bounds (as a Gaussian samples them); and so do the
    simulator states, the TimeLimit counters and the reset RNGs afterwards."""
    from vaco.data.collector import GymnasiumEnvs
    from vaco.data.envs import capture_envs

    fast, own = GymnasiumEnvs(env_id, 6, env_kwargs), GymnasiumEnvs(env_id, 6, env_kwargs)
    assert fast.fast is not None
    own.fast = None  # gymnasium's SyncVectorEnv.step
    assert torch.equal(fast.reset(seed=5), own.reset(seed=5))
    generator = torch.Generator().manual_seed(0)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(250):
        action = (torch.rand(6, fast.act_dim, generator=generator) * 3 - 1.5).float()
        got, expected = fast.step(action), own.step(action.clone())
        for name, a, b in zip(("obs", "reward", "terminated", "truncated", "final_obs"), got, expected):
            assert a.dtype == b.dtype and torch.equal(a, b), name
        ends["terminated"] += int(expected[2].sum())
        ends["truncated"] += int(expected[3].sum())
    if env_id != "HalfCheetah-v5":  # HalfCheetah never terminates
        assert ends["terminated"] >= 6, ends
    if env_id != "InvertedPendulum-v5":  # the pole falls long before its 1,000 steps
        assert ends["truncated"] >= 6, ends
    for a, b in zip(capture_envs(fast.vector), capture_envs(own.vector)):
        assert torch.equal(a["mj_state"], b["mj_state"])
        assert a["elapsed_steps"] == b["elapsed_steps"] and a["rng"] == b["rng"]


def test_tasks_without_a_fast_step_step_through_gymnasium():
    """Ant and Humanoid (contact forces in the observation) and any env vaco did not make with its
    own wrappers step through gymnasium's own code."""
    from vaco.data.collector import GymnasiumEnvs
    from vaco.data.envs import MujocoSteps

    assert GymnasiumEnvs("Ant-v5", 2).fast is None
    venv = make_vector_env("Hopper-v5", 2, keep_info=True)  # no DropInfo: other wrappers
    assert MujocoSteps.of(venv, "Hopper-v5") is None
    venv.close()


@pytest.mark.parametrize("env_id, K", [("Hopper-v5", 3), ("InvertedPendulum-v5", 3), ("Hopper-v5", 1), ("Ant-v5", 2)])
def test_a_populations_gymnasium_envs_in_lockstep_are_each_members_collector_alone(env_id, K):
    """A population's gymnasium envs (vaco.data.collection.InProcess.lockstep_envs: each member's own
    envs, blocks of one JointGymnasium) stepped by Lockstep (one env step for all members a step; the
    members whose envs hold several versions act in one call, a member on one version through its own
    plain module; each member's reward scaler), against each seed's collector alone: every key of
    every batch bit for bit over four rollouts (the pendulum's episodes end within a few steps, so
    envs reset while the others step on), with members on one version and on several in the same
    rollout; then again after the members' state is restored into a fresh population; then member 1
    stops and the others' batches are still their solo ones. Ant has no all-at-once step (contact
    forces in the observation): each block steps through gymnasium in turn."""
    from types import SimpleNamespace

    from vaco.data.collection import InProcess
    from vaco.data.collector import JointGymnasium
    from vaco.population.lockstep import Lockstep

    seeds, N, T = [4, 9, 2, 7], 2, (8 if env_id == "Ant-v5" else 24)
    obs_dim, act_dim = {"Hopper-v5": (11, 3), "InvertedPendulum-v5": (4, 1), "Ant-v5": (105, 8)}[env_id]
    settings = SimpleNamespace(env_id=env_id, num_envs=N, env_kwargs=None)

    def population():
        envs = InProcess().lockstep_envs([settings] * len(seeds), seeds)
        assert isinstance(envs[0].shared, JointGymnasium) and (envs[0].shared.fast is None) == (env_id == "Ant-v5")
        collectors = [
            RolloutCollector(env_id, N, T, _filled_buffer(K, K, obs_dim, act_dim)[0], 6, seed=s, env=env)
            for s, env in zip(seeds, envs)
        ]
        return collectors, Lockstep(collectors, stopped := set()), stopped

    collectors, lockstep, stopped = population()
    assert lockstep.batched and lockstep.exact  # the CPU's default
    alone = [RolloutCollector(env_id, N, T, _filled_buffer(K, K, obs_dim, act_dim)[0], 6, seed=s) for s in seeds]
    kinds, ended, saved, third = set(), 0, None, None
    for rollout in range(5):
        if rollout == 2:
            saved = [c.state_dict() for c in collectors]
        if rollout == 4:
            stopped.add(1)
        got = lockstep.rollout()
        third = got if rollout == 2 else third
        for m, solo in enumerate(alone):
            if rollout == 4 and m == 1:
                assert got[m] is None
                continue
            expected = solo.rollout()
            kinds.add(expected["policy_version"][:, 0].unique().numel() > 1)
            ended += int(expected["next", "done"].sum())
            for key in expected.keys(True, True):
                assert torch.equal(got[m][key], expected[key]), (rollout, m, key)
    assert kinds == ({False} if K == 1 else {False, True})  # one version and several, in one population
    if env_id == "InvertedPendulum-v5":
        assert ended >= 8
    resumed, lockstep, _ = population()
    for c, state in zip(resumed, saved):
        c.load_state_dict(state)
    again = lockstep.rollout()
    for m in range(len(seeds)):
        for key in third[m].keys(True, True):
            assert torch.equal(again[m][key], third[m][key]), (m, key)
