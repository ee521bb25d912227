"""The MuJoCo Warp backend against gymnasium's v5 envs (MuJoCo C), on Warp's CPU device.

One step from the same state and action must agree task by task within float32 tolerances, and
ten steps where the walkers touch the floor; the resets draw gymnasium's noise; the collector's batch must meet the CPU collector's contract; and a run on the
backend must actually learn. Warp compiles its kernels once per machine (~20 s per task cold,
cached under ~/.cache/warp), so each task is built once per session and with few worlds.
"""

from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch

from helpers.runs import REPO
from vaco.data.normalization import DeviceRewardScaler, RewardScaler
from vaco.data.policy_buffer import PolicyVersionBuffer
from vaco.data.warp import TASKS, Warp
from vaco.data.warp.env import WarpVectorEnv
from vaco.data.warp.warp_collector import WarpCollector
from vaco.learners.networks import GaussianActor, gaussian_log_prob

WORLDS = 4
_envs: dict[tuple, WarpVectorEnv] = {}


def warp_env(env_id: str, cone: str | None = None) -> WarpVectorEnv:
    key = (env_id, cone)
    if key not in _envs:
        _envs[key] = WarpVectorEnv(env_id, WORLDS, seed=0, cone=cone)
    env = _envs[key]
    # shared for its compiled kernels, not its episode clock: a world left at step 998 by an
    # earlier test in this process would truncate (and reset) inside the next one's comparison
    env.length.zero_()
    return env


def gym_env(env_id: str, cone: str | None = None):
    env = gym.make(env_id).unwrapped
    if cone == "elliptic":
        env.model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
        # and the solver Warp uses: Humanoid's PGS alone moves C's own trajectory (docs/gpu.md)
        env.model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    return env


def _states(env, rng, steps: list[int | str]) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """gymnasium states: a seeded reset, then after n random steps, or ("contact") after the
    first random step that leaves the body touching the floor."""
    out = []
    for k, n in enumerate(steps):
        env.reset(seed=k)
        for _ in range(200 if n == "contact" else n):
            _, _, terminated, _, _ = env.step(rng.uniform(env.action_space.low, env.action_space.high))
            if terminated:
                env.reset(seed=100 + k)
            elif n == "contact" and env.data.ncon > 0:
                break
        out.append((env.data.qpos.copy(), env.data.qvel.copy(), int(env.data.ncon)))
    return out


def _one_step(env_id: str, cone: str | None, steps: list[int]):
    """(gymnasium, warp) observation, reward, terminated, qpos, qvel after one step from each state."""
    rng = np.random.default_rng(0)
    g, w = gym_env(env_id, cone), warp_env(env_id, cone)
    states = _states(g, rng, steps)
    states += [states[-1]] * (w.num_worlds - len(states))  # every world gets a state
    qpos = torch.tensor(np.stack([s[0] for s in states]), dtype=torch.float32)
    qvel = torch.tensor(np.stack([s[1] for s in states]), dtype=torch.float32)
    low, high = g.action_space.low, g.action_space.high
    actions = rng.uniform(low, high, size=(len(states), low.size)).astype(np.float32)
    w.set_state(qpos, qvel)
    _, w_reward, w_term, _, w_obs = w.step(torch.as_tensor(actions))
    w_info = {k: v.clone() for k, v in w.info.items()}
    w_qpos, w_qvel = _after_step(w, qpos, qvel, torch.as_tensor(actions))
    rows = []
    for k in range(len(states)):
        g.set_state(qpos[k].double().numpy(), qvel[k].double().numpy())  # the float32 state, exactly
        obs, reward, terminated, _, info = g.step(actions[k])
        rows.append(
            dict(
                info={key: (info[key], float(w_info[key][k])) for key in ("x_position", "x_velocity") if key in info},
                ncon=states[k][2],
                obs=(obs, w_obs[k].numpy()),
                reward=(reward, float(w_reward[k])),
                terminated=(terminated, bool(w_term[k])),
                qpos=(g.data.qpos.copy(), w_qpos[k]),
                qvel=(g.data.qvel.copy(), w_qvel[k]),
            )
        )
    return rows


def _after_step(w: WarpVectorEnv, qpos, qvel, actions):
    """The integrated state before any reset (a terminated world is reset by ``step``)."""
    w.set_state(qpos, qvel)
    w.sim.ctrl.copy_(actions)
    with w._wp.ScopedDevice(w._wp_device):
        for _ in range(w.spec.frame_skip):
            w._mjw.step(w.model, w.data)
    return w.sim.qpos.numpy().copy(), w.sim.qvel.numpy().copy()


def _close(pair, atol, rtol=0.0):
    a, b = (np.asarray(x, dtype=np.float64) for x in pair)
    return bool(np.all(np.abs(a - b) <= atol + rtol * np.abs(a))), float(np.max(np.abs(a - b)))


# states: a reset state, then after 20 and 60 random steps (contacts for the walkers)
AGREE = {  # task -> (cone, random steps before each state)
    "InvertedPendulum-v5": (None, [0, 20, 60]),
    "Hopper-v5": (None, [0, 20, 60]),
    "Walker2d-v5": (None, [0, 20, 60]),
    "HalfCheetah-v5": (None, [0, 20, 60]),
    "Ant-v5": (None, [0]),  # contact-free: with the shipped (pyramidal) cones, contacts differ (below)
    "Humanoid-v5": (None, [0]),
}


@pytest.mark.slow
@pytest.mark.parametrize("env_id", list(AGREE))
def test_one_step_agrees_with_gymnasium(env_id):
    cone, steps = AGREE[env_id]
    for row in _one_step(env_id, cone, steps):
        where = f"{env_id} from a state with {row['ncon']} contacts"
        assert row["terminated"][0] == row["terminated"][1], where
        ok, err = _close(row["qpos"], 1e-5)
        assert ok, f"{where}: qpos differs by {err}"
        ok, err = _close(row["qvel"], 1e-3, 1e-4)
        assert ok, f"{where}: qvel differs by {err}"
        ok, err = _close(row["obs"], 1e-3, 1e-4)
        assert ok, f"{where}: observation differs by {err}"
        ok, err = _close(row["reward"], 1e-4, 1e-5)
        assert ok, f"{where}: reward differs by {err}"
        for key, pair in row["info"].items():  # gymnasium's info: the same numbers per world
            ok, err = _close(pair, 1e-4, 1e-5)
            assert ok, f"{where}: info[{key!r}] differs by {err}"
        assert env_id == "InvertedPendulum-v5" or "x_velocity" in row["info"]


@pytest.mark.parametrize("env_id", ["Ant-v5", "Humanoid-v5"])
def test_contact_states_agree_with_elliptic_cones(env_id):
    """With elliptic cones in both engines the friction frame no longer differs (docs/gpu.md)."""
    rows = _one_step(env_id, "elliptic", ["contact", "contact"])
    assert all(row["ncon"] > 0 for row in rows[:2])
    for row in rows:
        ok, err = _close(row["qvel"], 1e-2, 1e-3)
        assert ok, f"{env_id} ({row['ncon']} contacts): qvel differs by {err}"
        ok, err = _close(row["obs"], 1e-2, 1e-3)
        assert ok, f"{env_id} ({row['ncon']} contacts): observation differs by {err}"


def test_termination_truncation_and_the_final_observation():
    w = warp_env("Hopper-v5")
    g = gym_env("Hopper-v5")
    qpos = torch.tensor(g.init_qpos, dtype=torch.float32).repeat(WORLDS, 1)
    qpos[0, 1] = 0.5  # world 0: below the healthy height: terminates
    w.set_state(qpos, torch.zeros(WORLDS, w.sim.qvel.shape[1]))
    w.length[:] = torch.tensor([3, 999, 10, 998])  # world 1 reaches 1,000 steps now
    obs, reward, terminated, truncated, final = w.step(torch.zeros(WORLDS, w.act_dim))
    assert terminated.tolist() == [True, False, False, False]
    assert truncated.tolist() == [False, True, False, False]
    assert w.length.tolist() == [0, 0, 11, 999]
    for i in (0, 1):  # ended: the returned observation is a fresh reset, the final one is kept apart
        assert not torch.allclose(obs[i], final[i])
        assert (obs[i][:5] - torch.tensor(g.init_qpos[1:], dtype=torch.float32)).abs().max() <= 5e-3
    assert torch.equal(obs[2:], final[2:])
    assert abs(float(final[0, 0]) - 0.5) < 0.05  # the final observation is where it fell


def test_hopper_at_infinite_height_is_unhealthy_as_in_gymnasium():
    """gymnasium's healthy z range is (0.7, inf): z = +inf ends the episode; a finite z does not."""
    from vaco.data.warp.tasks import Sim, task

    spec = task("Hopper-v5")
    qpos = torch.zeros(3, 6)
    qpos[:, 1] = torch.tensor([1.25, float("inf"), 0.5])
    sim = Sim(
        qpos,
        torch.zeros(3, 6),
        torch.zeros(3, 3),
        *(torch.zeros(3, 4, 3),) * 2,
        torch.zeros(3, 4, 10),
        torch.zeros(3, 4, 6),
        torch.zeros(3, 6),
        torch.zeros(3, 4, 6),
        torch.ones(4),
    )
    _, terminated = spec.reward(sim, torch.zeros(3, dtype=torch.float64), torch.zeros(3, 3))
    assert terminated.tolist() == [False, True, True]


@pytest.mark.parametrize("env_id", list(AGREE))
def test_resets_draw_gymnasiums_noise(env_id):
    """The reset distribution against gymnasium's own (its init state and noise scale read from its
    env; uniform or normal velocities per its source): every coordinate's deviation pooled over
    many seeded resets, its range and first two moments (tests/helpers/reset_noise.py)."""
    from helpers.reset_noise import check_draws, gymnasium_reset

    init_qpos, init_qvel, scale, kind = gymnasium_reset(env_id)
    w = warp_env(env_id)
    qpos, qvel = [], []
    for seed in range(max(2, -(-1200 // (w.num_worlds * init_qvel.size)))):
        w.reset(seed=seed)
        qpos.append(w.sim.qpos.double().numpy() - init_qpos)
        qvel.append(w.sim.qvel.double().numpy() - init_qvel)
    check_draws(np.concatenate(qpos), scale, "uniform", f"{env_id} qpos")
    check_draws(np.concatenate(qvel), scale, kind, f"{env_id} qvel")


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5"])
def test_ten_steps_from_the_same_state_agree_with_gymnasium(env_id):
    """Ten steps of the same random actions from the same states (a reset, after 20 and 60 random
    steps, and a first contact): the rewards agree step by step to 2e-3 (float32 against float64
    drifts ~1e-4 in ten steps, more after: measured) and the episodes end at the same step. One
    step cannot show a fault that builds up over steps (a state not carried from step to step, a
    warm start lost); whole episodes cannot be compared step by step (the engines part ways)."""
    rng = np.random.default_rng(0)
    g, w = gym_env(env_id), warp_env(env_id)
    states = _states(g, rng, [0, 20, 60, "contact"])
    qpos = torch.tensor(np.stack([s[0] for s in states]), dtype=torch.float32)
    qvel = torch.tensor(np.stack([s[1] for s in states]), dtype=torch.float32)
    T = 10
    actions = rng.uniform(g.action_space.low, g.action_space.high, (T, len(states), g.action_space.shape[0]))
    actions = actions.astype(np.float32)
    w.set_state(qpos, qvel)
    w_rewards, w_ends = [], []
    for t in range(T):
        _, reward, terminated, _, _ = w.step(torch.as_tensor(actions[t]))
        w_rewards.append(reward.numpy().copy())
        w_ends.append(terminated.numpy().copy())
    compared = 0
    for k in range(len(states)):
        g.set_state(qpos[k].double().numpy(), qvel[k].double().numpy())
        for t in range(T):
            _, reward, terminated, _, _ = g.step(actions[t, k])
            assert abs(reward - w_rewards[t][k]) <= 2e-3, f"state {k}, step {t + 1}: {reward} vs {w_rewards[t][k]}"
            assert terminated == bool(w_ends[t][k]), f"state {k}: gymnasium ends at step {t + 1}: {terminated}"
            compared += 1
            if terminated:
                break
    assert compared >= 2 * T


# ---------------------------------------------------------------- the collector's contract
def _buffer(obs_dim: int, act_dim: int, K: int = 2) -> PolicyVersionBuffer:
    torch.manual_seed(0)
    buffer = None
    for v in range(K):
        actor = GaussianActor(obs_dim, act_dim)
        with torch.no_grad():
            actor.log_std.fill_(-0.1 * v)
        buffer = buffer or PolicyVersionBuffer(actor, obs_dim, K)
        buffer.push(actor, torch.full((obs_dim,), 0.1 * v), torch.full((obs_dim,), 1.0 + v), version=v)
    return buffer


def test_the_batch_meets_the_cpu_collectors_contract():
    from vaco.data.collector import RolloutCollector

    buffer = _buffer(11, 3)
    warp = WarpCollector(WarpVectorEnv("Hopper-v5", 4, seed=1), 16, buffer, num_iterations=2, seed=1)
    cpu = RolloutCollector("Hopper-v5", 4, 16, _buffer(11, 3), num_iterations=2, seed=1)
    got, ref = next(iter(warp)), next(iter(cpu))
    assert got.batch_size == ref.batch_size == torch.Size([4, 16])
    assert set(got.keys(True, True)) == set(ref.keys(True, True))
    for key in ref.keys(True, True):
        assert got[key].dtype == ref[key].dtype and got[key].shape == ref[key].shape, key
    assert torch.equal(got["next", "done"], got["next", "terminated"] | got["next", "truncated"])
    versions = got["policy_version"]
    assert (versions == versions[:, :1]).all() and set(versions[:, 0].tolist()) <= {0, 1}
    # every world's behaviour log-prob is its own version's density of its action
    for i in range(4):
        v = int(versions[i, 0])
        slot = int((buffer.versions == v).nonzero())
        actor = GaussianActor(11, 3)
        for name, value in buffer.params(slot).items():
            actor.get_parameter(name).data.copy_(value)
        norm = (
            (got["observation"][i] - buffer.obs_mean[slot].float()) * (buffer.obs_var[slot] + 1e-8).rsqrt().float()
        ).clamp(-10, 10)
        loc, scale = actor(norm)
        torch.testing.assert_close(got["behavior_loc"][i], loc, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            got["behavior_log_prob"][i],
            gaussian_log_prob(got["action"][i], loc, scale.expand_as(loc)),
            rtol=1e-4,
            atol=1e-4,
        )
    # where an episode ended, the next observation is the final one, not the reset that follows
    done = got["next", "done"][:, :-1]
    if done.any():
        assert (
            not torch.isclose(got["next", "observation"][:, :-1][done], got["observation"][:, 1:][done]).all(-1).any()
        )
    cpu.shutdown()


@pytest.mark.slow
def test_the_collector_resumes_exactly():
    buffer = _buffer(4, 1)
    a = WarpCollector(WarpVectorEnv("InvertedPendulum-v5", 4, seed=3), 24, buffer, num_iterations=3, seed=3)
    it = iter(a)
    next(it)
    state = a.state_dict()
    expected = next(it)
    b = WarpCollector(WarpVectorEnv("InvertedPendulum-v5", 4, seed=99), 24, _buffer(4, 1), num_iterations=3, seed=99)
    b.load_state_dict(state)
    got = b.rollout()
    for key in expected.keys(True, True):
        assert torch.equal(expected[key], got[key]), key


def test_the_device_reward_scaler_is_the_cpu_one():
    rng = np.random.default_rng(0)
    cpu, dev = RewardScaler(5, 0.99), DeviceRewardScaler(5, 0.99)
    for _ in range(50):
        r = rng.normal(size=5)
        term, done = rng.random(5) < 0.1, rng.random(5) < 0.2
        done |= term
        a = cpu(r, term, done)
        b = dev(torch.as_tensor(r), torch.as_tensor(term), torch.as_tensor(done))
        np.testing.assert_allclose(b.numpy(), a.astype(np.float32), rtol=1e-6)


# ---------------------------------------------------------------- bad input
def test_bad_input_names_the_field_before_any_step():
    from vaco.data.datamodule import RolloutDataModule

    with pytest.raises(
        ValueError, match=r"`data.env_id`: the Warp backend has no task 'Pusher-v5'; it has InvertedPendulum-v5"
    ):
        RolloutDataModule(env_id="Pusher-v5", collection=Warp())
    with pytest.raises(ValueError, match=r"`data.num_envs`: 1,000,000,000 worlds of Hopper-v5 need about"):
        RolloutDataModule(env_id="Hopper-v5", num_envs=10**9, num_steps=1, total_steps=10**9, collection=Warp())
    with pytest.raises(ValueError, match=r"`data.env_kwargs`"):
        RolloutDataModule(env_id="Hopper-v5", env_kwargs={"ctrl_cost_weight": 0.0}, collection=Warp())
    with pytest.raises(ValueError, match=r"`data.collection.device`"):
        Warp(device="tpu")
    with pytest.raises(ValueError, match=r"`data.collection.cuda_graph`: CUDA graphs need `device: cuda`, got 'cpu'"):
        Warp(device="cpu", cuda_graph=True)
    assert not Warp(device="cpu").uses_graph and Warp(device="cuda").uses_graph  # null: on cuda only
    assert not Warp(device="cuda", cuda_graph=False).uses_graph
    with pytest.raises(ValueError, match=r"`data.collection.cuda_graph` must be null, true or false, got 'yes'"):
        Warp(device="cuda", cuda_graph="yes")
    with pytest.raises(ValueError, match=r"`cuda_graph`: CUDA graphs need a cuda device"):
        WarpVectorEnv("Hopper-v5", 2, device="cpu", cuda_graph=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"torch sees no CUDA device"):
            RolloutDataModule(env_id="Hopper-v5", collection=Warp(device="cuda"))


def test_the_backend_is_saved_as_plain_values():
    from vaco.data.datamodule import RolloutDataModule

    data = RolloutDataModule(env_id="Hopper-v5", collection=Warp(cone="elliptic"))
    assert data.hparams["collection"] == {
        "class_path": "vaco.data.warp.Warp",
        "init_args": {"device": "cpu", "cone": "elliptic", "evaluate_on": "warp", "cuda_graph": None},
    }


def test_every_task_has_gymnasiums_spaces():
    for env_id in TASKS:
        w, g = warp_env(env_id), gym.make(env_id)
        assert w.obs_dim == g.observation_space.shape[0] and w.act_dim == g.action_space.shape[0], env_id
        np.testing.assert_allclose(w.action_low.numpy(), g.action_space.low)
        assert g.spec.max_episode_steps == w.spec.max_episode_steps == 1000


# ---------------------------------------------------------------- learning
@pytest.mark.slow
def test_learns_inverted_pendulum_on_warp(tmp_path, mlflow_uri):
    """VACO at K = 4 on 32 Warp worlds x 16 steps, 25.6k env steps; evaluated on gymnasium
    (MuJoCo C): a random policy scores < 30, 800 means the pole stays up 80% of 1,000 steps."""
    from helpers.runs import build_run, metric_histories
    from vaco.advantages import VTrace
    from vaco.objectives import TVFilter

    module, data, trainer = build_run(
        tmp_path,
        mlflow_uri,
        objective=TVFilter(),
        advantage=VTrace(),
        seed=1,
        data_kwargs=dict(
            num_envs=32,
            num_steps=16,
            total_steps=25_600,
            eval_every=0,
            eval_episodes=10,
            eval_envs=5,
            policy_buffer_size=4,
            collection=Warp(evaluate_on="gymnasium"),
        ),
        model_kwargs=dict(update_epochs=10, num_minibatches=4),
        every_n_iterations=0,
    )
    trainer.fit(module, data)
    history = metric_histories(mlflow_uri, trainer.logger.run_id)
    assert history["train/episode_return"][0][1] < 100
    assert module.last_eval_return >= 800, history["eval/return"]
    assert max(v for _, v in history["lag/policy_age_max"]) == 3


@pytest.mark.slow
def test_the_paper_grid_on_the_gpu_backend_is_a_valid_sweep():
    from vaco import sweep as S

    sweep = S.load_sweep(REPO / "configs" / "sweeps" / "paper_gpu.yaml")
    cells = S.expand(sweep)
    assert len(cells) == 5 * 5 * 5 * 10
    S.validate_with_cli(sweep, cells, "sqlite:////nonexistent/mlflow.db")  # parses; builds nothing
    config = S.cell_config(sweep, cells[0], "sqlite:////nonexistent/mlflow.db")
    assert config["data"]["init_args"]["collection"]["class_path"] == "vaco.data.warp.Warp"
    assert config["data"]["init_args"]["num_envs"] == 500 and config["trainer"]["accelerator"] == "gpu"
    # a cell's ten seeds are one population (one model of 5,000 worlds), every algorithm's
    jobs, _ = S.pack(sweep, cells, {cell.id: "new" for cell in cells})
    assert all(isinstance(job, S.PopulationCell) for job in jobs)
    assert len(jobs) == 5 * 5 * 5 and {len(job.members) for job in jobs} == {10}


def test_the_warp_config_instantiates_through_the_cli(mlflow_uri):
    from vaco.commands.fit import VacoCLI
    from vaco.data import RolloutDataModule

    configs = REPO / "configs"
    cli = VacoCLI(
        args=[
            "--config",
            str(configs / "env/inverted_pendulum.yaml"),
            "--config",
            str(configs / "algo/vaco.yaml"),
            "--config",
            str(configs / "collection/warp.yaml"),
        ],
        run=False,
    )
    assert type(cli.datamodule) is RolloutDataModule and isinstance(cli.datamodule.collection, Warp)
    assert cli.datamodule.collection.device == "cpu" and cli.datamodule.collector is None  # nothing built yet


@pytest.mark.slow
def test_a_run_trained_on_warp_is_evaluated_and_filmed_on_warp(tmp_path):
    """`vaco fit` on the backend, then `vaco evaluate --backend warp --video`: the episodes run on
    Warp and the frames are drawn by MuJoCo's renderer from the Warp world's state."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    vaco = str(Path(sys.executable).with_name("vaco"))
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
        "OMP_NUM_THREADS": "1",
        "MUJOCO_GL": "egl",
    }
    fit = subprocess.run(
        [
            vaco,
            "fit",
            "--config",
            str(REPO / "configs/env/inverted_pendulum.yaml"),
            "--config",
            str(REPO / "configs/algo/vaco.yaml"),
            "--config",
            str(REPO / "configs/collection/warp.yaml"),
            "--data.init_args.num_envs",
            "4",
            "--data.init_args.num_steps",
            "16",
            "--data.init_args.total_steps",
            "128",
            "--data.init_args.eval_every",
            "0",
            "--data.init_args.eval_episodes",
            "2",
            "--data.init_args.eval_envs",
            "2",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.enable_progress_bar",
            "false",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    ckpt = str(next(tmp_path.glob("checkpoints/*/last.ckpt")))
    out = subprocess.run(
        [
            vaco,
            "evaluate",
            "--ckpt",
            ckpt,
            "--backend",
            "warp",
            "--episodes",
            "3",
            "--envs",
            "3",
            "--video",
            str(tmp_path / "warp.gif"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "InvertedPendulum-v5 on MuJoCo Warp (cpu): return" in out.stdout and "over 3 episodes" in out.stdout
    if "no video" not in out.stderr:  # a machine without an offscreen GL driver says so and writes none
        import imageio.v2 as imageio

        frames = imageio.mimread(tmp_path / "warp.gif")
        assert len(frames) >= 2 and frames[0].shape[0] > 50
        assert any(not np.array_equal(frames[0], f) for f in frames[1:])  # the pole moves
    bad = subprocess.run(
        [vaco, "evaluate", "--ckpt", ckpt, "--backend", "warp", "--envs", str(10**9), "--episodes", str(10**9)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "`--envs`: 1,000,000,000 worlds of InvertedPendulum-v5 need about" in bad.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_a_cuda_graph_replays_the_same_physics_as_kernel_by_kernel_stepping():
    """``cuda_graph`` (on by default on cuda) replays the kernels that plain stepping launches,
    the solver's loop as a conditional graph node: from the same reset and actions, 30 steps of
    64 Hopper worlds (some falling and resetting) agree to 1e-3 (float32 arithmetic whose order
    atomics may change), terminations exactly."""
    plain, graph = (WarpVectorEnv("Hopper-v5", 64, device="cuda", seed=0, cuda_graph=g) for g in (False, True))
    torch.testing.assert_close(plain.reset(seed=0), graph.reset(seed=0), rtol=0, atol=0)
    assert graph._use_graph and not plain._use_graph
    gen = torch.Generator(device="cuda").manual_seed(0)
    ended = 0
    for _ in range(30):
        u = torch.rand(64, plain.act_dim, generator=gen, device="cuda")
        action = plain.action_low + u * (plain.action_high - plain.action_low)
        a, b = plain.step(action), graph.step(action)
        assert graph._graph is not None  # captured, not fallen back
        obs, reward, terminated, truncated, final_obs = a
        torch.testing.assert_close(b[0], obs, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(b[1], reward, rtol=1e-3, atol=1e-3)
        assert torch.equal(b[2], terminated) and torch.equal(b[3], truncated)
        torch.testing.assert_close(b[4], final_obs, rtol=1e-3, atol=1e-3)
        ended += int(terminated.sum())
    assert ended > 0  # random actions topple some Hoppers within 30 steps: the resets were compared too


def test_the_h100_figures_in_the_docs_are_its_measurements():
    """docs/gpu.md's table of env steps/s on the H100 is docs/data/gpu_h100_2026-11-27's JSON, row
    for row, with the ratios; the JSON names the card."""
    import json
    import re

    data = json.loads((REPO / "docs/data/gpu_h100_2026-11-27/warp_throughput.json").read_text())
    assert "H100" in data["machine"] and data["device"] == "cuda"
    text = (REPO / "docs/gpu.md").read_text()
    for worlds in (64, 512, 4096):
        plain, graph = data["env"][f"Hopper-v5:{worlds}"], data["env"][f"Hopper-v5:{worlds}:cuda_graph"]
        row = f"| {worlds:,} | {plain:,.0f} | {graph:,.0f} | {graph / plain:.1f}x |"
        assert row in text, row
    stale = json.loads((REPO / "docs/data/gpu_h100_2026-11-27/warp_throughput_graphs_not_engaged.json").read_text())
    first = ", ".join(
        f"{stale['env'][f'Hopper-v5:{w}']:,.0f} / {stale['env'][f'Hopper-v5:{w}:cuda_graph']:,.0f}" for w in (64, 512)
    )
    assert re.sub(r"\s+", " ", f"({first}") in re.sub(r"\s+", " ", text)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["Hopper-v5", "InvertedPendulum-v5"])  # contacts; episodes that end
def test_a_populations_members_stepped_in_one_model_are_their_collectors_alone(env_id):
    """Two members' collectors on blocks of one model of 2 x 2 worlds, stepped in lockstep
    (vaco.population.lockstep), against each seed's collector on its own 2 worlds: the same batches bit
    for bit (Hopper: worlds in contact share the model's contact arrays; the pendulum: it tips
    within a few steps, so a block's worlds reset, drawing their own noise, while the others step
    on), and again after the members' collectors are restored from a checkpoint into a fresh
    population. (Warp's CPU device: ~0.1-0.25 s an env step, so the runs are short.)"""
    from vaco.population.lockstep import Lockstep

    obs_dim, act_dim = (11, 3) if env_id == "Hopper-v5" else (4, 1)
    seeds, N, T = [4, 9], 2, 12

    def population(seeds):
        shared = WarpVectorEnv(env_id, N * len(seeds), seed=0, blocks=len(seeds))
        collectors = [
            WarpCollector(shared.block(m), T, _buffer(obs_dim, act_dim, K=3), num_iterations=4, seed=s)
            for m, s in enumerate(seeds)
        ]
        return collectors, Lockstep(collectors, set())

    collectors, lockstep = population(seeds)
    together = iter(lockstep)
    first = next(together)
    saved = [c.state_dict() for c in collectors]
    second = next(together)
    ended = 0
    for m, seed in enumerate(seeds):
        alone = WarpCollector(WarpVectorEnv(env_id, N, seed=seed), T, _buffer(obs_dim, act_dim, K=3), 4, seed=seed)
        for got in (first[m], second[m]):
            expected = alone.rollout()
            ended += int(expected["next", "done"].sum())
            for key in expected.keys(True, True):
                assert torch.equal(got[key], expected[key]), (env_id, seed, key)
    if env_id == "InvertedPendulum-v5":
        assert ended >= 2  # resets happened while the other block stepped on
    resumed, lockstep = population(seeds)
    for c, state in zip(resumed, saved):
        c.load_state_dict(state)
    again = lockstep.rollout()
    for m in range(len(seeds)):
        for key in second[m].keys(True, True):
            assert torch.equal(again[m][key], second[m][key]), (env_id, m, key)


@pytest.mark.slow
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "gpu-layout"])
@pytest.mark.parametrize("K", [1, 3])
def test_the_batched_lockstep_records_what_the_members_record_one_by_one(K, exact):
    """The batched lockstep (one policy call and one record per step for all members, a member's
    noise still from its own generator) on Warp's CPU device, against the members acting and
    recording one by one, over two rollouts and a checkpoint of the members' state. Exact (the CPU's
    default): bit for bit, also at K = 1 (a member on one version acts through its own plain
    module). The GPU's layout (``exact=False``): with K = 3 every env acts through per-env weights
    either way, and the batches, reward scaling and episode counters are bit for bit the same; with
    K = 1 a member's solo act is one plain product, the batched one a per-env product, equal to
    float rounding. Then member 1 stops: its worlds act with zeros and member 0's batch is still its
    one-by-one batch."""
    from vaco.population.lockstep import Lockstep

    seeds, N, T = [4, 9, 2], 2, 6

    def population(batched):
        shared = WarpVectorEnv("Hopper-v5", N * len(seeds), seed=0, blocks=len(seeds))
        collectors = [
            WarpCollector(shared.block(m), T, _buffer(11, 3, K=K), num_iterations=4, seed=s)
            for m, s in enumerate(seeds)
        ]
        return collectors, Lockstep(collectors, stopped := set(), batched=batched, exact=exact), stopped

    (one, by_one, stopped_one), (all_, batched, stopped_all) = population(False), population(True)
    assert not by_one.batched and batched.batched
    identical, rounded = 0, [False] * len(seeds)
    for rollout in range(3):
        if rollout == 2:
            stopped_one.add(1)
            stopped_all.add(1)
        expected, got = by_one.rollout(), batched.rollout()
        for m in range(len(seeds)):
            if rollout == 2 and m == 1:
                assert expected[m] is None and got[m] is None
                continue
            # bit for bit while every rollout of the member so far had envs on different versions
            rounded[m] = not exact and (
                rounded[m] or K == 1 or expected[m]["policy_version"][:, 0].unique().numel() == 1
            )
            identical += not rounded[m]
            for key in expected[m].keys(True, True):
                if not rounded[m]:
                    assert torch.equal(got[m][key], expected[m][key]), (rollout, m, key)
                else:
                    torch.testing.assert_close(got[m][key], expected[m][key], rtol=1e-4, atol=1e-5, msg=key)
        for a, b in zip(one, all_):  # the members' state the next rollout (and a checkpoint) starts from
            state_a, state_b = a.state_dict(), b.state_dict()
            for key in ("obs", "ep_return", "ep_length"):
                close = dict(rtol=0.0, atol=0.0) if exact else dict(rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(state_b[key], state_a[key], **close, msg=key)
            for key, value in state_a["reward_scaler"].items():
                close = dict(rtol=0.0, atol=0.0) if exact else dict(rtol=1e-6, atol=0.0)
                torch.testing.assert_close(state_b["reward_scaler"][key], value, **close, msg=key)
    assert identical >= (6 if exact else 0 if K == 1 else 2)  # the bit-for-bit comparison happened


@pytest.mark.slow
def test_a_member_whose_worlds_turn_nan_stops_alone_and_the_others_step_on_unchanged():
    """Member 1's Hopper worlds are set to NaN mid-run (as a simulator blow-up would leave them): its
    next lockstep batch is a FloatingPointError, member 0's is still its solo collector's bit for bit
    (the worlds share the model's contact arrays and solver); once member 1 is stopped its worlds are
    reset from its seed and act with zeros, and member 0 goes on unchanged."""
    from vaco.population.lockstep import Lockstep

    N, T = 2, 8
    shared = WarpVectorEnv("Hopper-v5", 2 * N, seed=0, blocks=2)
    collectors = [WarpCollector(shared.block(m), T, _buffer(11, 3), 4, seed=s) for m, s in enumerate((3, 8))]
    lockstep = Lockstep(collectors, stopped := set())
    alone = WarpCollector(WarpVectorEnv("Hopper-v5", N, seed=3), T, _buffer(11, 3), 4, seed=3)
    first = lockstep.rollout()
    shared.sim.qpos[N:] = float("nan")  # member 1's worlds only
    second = lockstep.rollout()
    assert isinstance(second[1], FloatingPointError) and not isinstance(second[0], Exception)
    stopped.add(1)
    third = lockstep.rollout()
    assert third[1] is None and torch.isfinite(shared.sim.qpos[N:]).all()
    for got in (first[0], second[0], third[0]):
        expected = alone.rollout()
        for key in expected.keys(True, True):
            assert torch.equal(got[key], expected[key]), key
