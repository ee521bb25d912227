"""The opt-in envpool backend (vaco.data.envpool_backend) against gymnasium, the reference.

envpool runs the v5 tasks in C++ on its own MuJoCo build, so agreement is checked, not assumed:
one step from the same state gives the same observation and reward (gymnasium's env is put in
envpool's state, read back from the observation); the resets draw gymnasium's noise and episodes are
truncated at 1,000 steps; the adapter's same-step reset hands back the state the pool is
really in; a real `vaco fit` on it learns; its bad input is refused in one line; a resume warns
that the episodes in flight start over."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from vaco.data.envpool_backend import RESUME_WARNING, EnvPool, EnvPoolCollector, EnvPoolEnvs, import_envpool

try:
    envpool = import_envpool()
except ValueError:
    pytest.skip("the envpool extra (Python >= 3.11): pip install -e '.[envpool]'", allow_module_level=True)

# qpos without the x position (which the observation leaves out) comes first in both tasks' observations
NQ = {"Hopper-v5": 6, "HalfCheetah-v5": 9}


def _gym_step_from(g, obs: np.ndarray, action: np.ndarray, nq: int):
    """gymnasium's step from the state an observation shows (x = 0: the dynamics do not depend on it)."""
    g.set_state(np.concatenate([[0.0], obs[: nq - 1]]), obs[nq - 1 :])
    return g.step(action)


@pytest.mark.parametrize("env_id", ["Hopper-v5", "HalfCheetah-v5"])
def test_one_step_from_the_same_state_agrees_with_gymnasium(env_id):
    """Along envpool's own random-action trajectories (float64, resets included), every step agrees
    with gymnasium's from the same state: observations to 1e-9, rewards to 1e-6 (envpool's MuJoCo
    is 3.6, the project's 4.0), termination exactly."""
    nq = NQ[env_id]
    pool = envpool.make(env_id, env_type="gymnasium", num_envs=4, num_threads=1, seed=3)
    g = gym.make(env_id).unwrapped
    g.reset(seed=0)
    rng = np.random.default_rng(1)
    obs, _ = pool.reset()
    compared = 0
    for _ in range(150):
        action = rng.uniform(-1, 1, (4, pool.action_space.shape[0]))
        new_obs, reward, term, trunc, _ = pool.step(action)
        for i in range(4):
            if env_id == "Hopper-v5" and np.any(np.abs(obs[i, nq - 1 :]) >= 10):
                continue  # Hopper's observation clips velocities at +-10: the state is not recoverable
            g_obs, g_reward, g_term, _, _ = _gym_step_from(g, obs[i], action[i], nq)
            assert np.max(np.abs(g_obs - new_obs[i])) <= 1e-9
            assert abs(g_reward - reward[i]) <= 1e-6
            assert g_term == bool(term[i])
            compared += 1
        ended = np.flatnonzero(term | trunc)
        if ended.size:  # envpool resets an ended env on its next step
            reset_obs, *_ = pool.step(np.zeros((ended.size, action.shape[1])), ended)
            new_obs[ended] = reset_obs
        obs = new_obs
    pool.close()
    assert compared >= 400


def test_the_adapter_resets_an_ended_episode_in_the_same_step():
    """Where an episode ends, ``final_obs`` is its last observation and ``obs`` the reset one; the
    next step runs from that reset state (checked against gymnasium from it) and the pool's
    step counter restarts there."""
    envs = EnvPoolEnvs("Hopper-v5", 6)
    g = gym.make("Hopper-v5").unwrapped
    g.reset(seed=0)
    rng = np.random.default_rng(0)
    envs.reset(seed=1)
    ends = 0
    try:
        for _ in range(120):
            new_obs, _, term, trunc, final = envs.step(torch.as_tensor(rng.uniform(-1, 1, (6, 3)), dtype=torch.float32))
            done = (term | trunc).numpy()
            for i in np.flatnonzero(done):
                ends += 1
                assert not torch.equal(new_obs[i], final[i])
                assert abs(float(new_obs[i, 0]) - 1.25) <= 0.005  # Hopper's reset height, uniform noise +-0.005
            assert torch.equal(new_obs[~torch.as_tensor(done)], final[~torch.as_tensor(done)])
            if done.any():
                i = int(np.flatnonzero(done)[0])
                action = np.full((6, 3), 0.1, dtype=np.float32)
                after, reward, *_ = envs.step(torch.as_tensor(action))
                g_obs, g_reward, *_ = _gym_step_from(g, new_obs[i].double().numpy(), action[i].astype(np.float64), 6)
                # the observation is float32: the state read back from it is within rounding of the pool's
                assert np.max(np.abs(g_obs - after[i].double().numpy())) <= 1e-3
    finally:
        envs.close()
    assert ends >= 20


@pytest.mark.parametrize("env_id", ["Hopper-v5", "HalfCheetah-v5"])
def test_resets_draw_gymnasiums_noise(env_id):
    """The reset observations (qpos without x, then qvel) of 256 envs seeded as vaco seeds them,
    against gymnasium's init state and noise (read from its env): range and first two moments
    (tests/helpers/reset_noise.py); the velocities at a reset are far inside Hopper's +-10 clip."""
    from helpers.reset_noise import check_draws, gymnasium_reset

    init_qpos, init_qvel, scale, kind = gymnasium_reset(env_id)
    nq = NQ[env_id]
    envs = EnvPoolEnvs(env_id, 256)
    try:
        obs = envs.reset(seed=5).double().numpy()
    finally:
        envs.close()
    check_draws(obs[:, : nq - 1] - init_qpos[1:], scale, "uniform", f"{env_id} qpos")
    check_draws(obs[:, nq - 1 :] - init_qvel, scale, kind, f"{env_id} qvel")


def test_an_episode_is_truncated_at_1000_steps():
    """HalfCheetah never terminates: under random actions each env's episode is truncated at step
    1,000 exactly (gymnasium's TimeLimit), not before, and the next step starts a new one."""
    envs = EnvPoolEnvs("HalfCheetah-v5", 2)
    rng = np.random.default_rng(0)
    try:
        envs.reset(seed=1)
        for t in range(1, 1002):
            _, _, term, trunc, _ = envs.step(
                torch.as_tensor(rng.uniform(-1, 1, (2, envs.act_dim)), dtype=torch.float32)
            )
            assert not term.any()
            assert trunc.tolist() == [t == 1000] * 2, t
    finally:
        envs.close()


@pytest.mark.slow
def test_vaco_fit_on_envpool_learns_inverted_pendulum(tmp_path, mlflow_uri):
    """`vaco fit` with configs/collection/envpool.yaml (collection and evaluation on envpool)."""
    from helpers.runs import fit_inverted_pendulum_ppo

    run = fit_inverted_pendulum_ppo(tmp_path, mlflow_uri, "envpool")
    final = run.data.metrics["eval/return"]
    # a random policy scores ~5-10; as with gymnasium's envs, 12 iterations reach several hundred
    assert final > 300 and math.isfinite(final), final
    assert run.data.params["collection"] == "vaco.data.envpool_backend.EnvPool"
    assert run.info.run_name == "ppo_clip InvertedPendulum-v5 K=1 s1 [envpool]"  # the backend is in the name


@pytest.mark.slow
def test_importing_envpool_leaves_the_environment_as_it_was():
    """envpool sets MPLBACKEND=Agg on import; vaco's import puts it back (a later notebook kernel or
    subprocess would otherwise draw nothing inline). Checked in a fresh interpreter, both ways."""
    import subprocess
    import sys

    code = (
        "import os; from vaco.data.envpool_backend import import_envpool; import_envpool(); "
        "print(os.environ.get('MPLBACKEND'))"
    )
    for given, expected in ((None, "None"), ("module://custom", "module://custom")):
        env = {k: v for k, v in __import__("os").environ.items() if k != "MPLBACKEND"}
        if given:
            env["MPLBACKEND"] = given
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip().splitlines()[-1] == expected, out.stderr[-2000:]


def test_bad_envpool_settings_are_refused_in_one_line():
    from vaco.data import RolloutDataModule

    with pytest.raises(ValueError, match=r"^`data.collection.num_threads` must be an integer >= 1, got 0$"):
        EnvPool(num_threads=0)
    with pytest.raises(ValueError, match=r"^`data.collection.evaluate_on` must be 'envpool' or 'gymnasium'"):
        EnvPool(evaluate_on="warp")
    with pytest.raises(ValueError, match=r"^`data.env_kwargs`: the envpool backend runs the tasks with their default"):
        EnvPool().validate(RolloutDataModule(env_id="Hopper-v5", env_kwargs={"frame_skip": 2}))
    with pytest.raises(
        ValueError, match=r"^`data.env_id`: the envpool backend has no 'Pendulum-v1'; its MuJoCo tasks are Ant-v5, "
    ):
        EnvPool().validate(RolloutDataModule(env_id="Pendulum-v1"))  # envpool has it, but not as a MuJoCo task


def test_a_resumed_envpool_collector_warns_and_starts_new_episodes():
    """Everything but the simulators resumes: the iteration, generator and reward scaler come back,
    the episodes in flight start over from a seeded reset, and a warning says so."""
    from vaco.data.policy_buffer import PolicyVersionBuffer
    from vaco.learners.networks import GaussianActor

    torch.manual_seed(0)
    actor = GaussianActor(11, 3)
    buffer = PolicyVersionBuffer(actor, 11, 2)
    buffer.push(actor, torch.zeros(11), torch.ones(11), 1)
    first = EnvPoolCollector(EnvPoolEnvs("Hopper-v5", 4), 64, buffer, 4, seed=5)
    it = iter(first)
    next(it)
    state = first.state_dict()
    assert state["envs"] is None and state["obs"] is not None
    resumed = EnvPoolCollector(EnvPoolEnvs("Hopper-v5", 4), 64, buffer, 4, seed=0)
    with pytest.warns(RuntimeWarning, match="cannot restore its simulators' state"):
        resumed.load_state_dict(state)
    assert RESUME_WARNING.startswith("the envpool backend")
    assert resumed.iteration == 1 and torch.equal(resumed.generator.get_state(), first.generator.get_state())
    assert resumed.reward_scaler.state_dict().keys() == first.reward_scaler.state_dict().keys()
    batch = next(iter(resumed))
    assert batch.shape == (4, 64) and resumed.iteration == 2
    assert int(batch["next", "episode_length"][:, 0].max()) == 1  # every env starts a new episode
    first.shutdown()
    resumed.shutdown()
