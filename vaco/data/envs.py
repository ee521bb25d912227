"""Environment factory, specs, exact simulator snapshots, and gymnasium's MuJoCo step for all envs at once.

Envs are gymnasium vector envs in ``SAME_STEP`` autoreset mode: the step that ends an episode
returns the *reset* observation and puts the final one in ``info["final_obs"]``, so every step
is a real transition. (gymnasium 1.x's default, ``NEXT_STEP``, inserts a fake step after each
episode end, which GAE code written for gym 0.x silently learns from.)

:class:`MujocoSteps` is gymnasium's own ``step`` of Hopper, Walker2d, HalfCheetah and
InvertedPendulum (v5) for every env of such a vector env at once, bit for bit: half of a
gymnasium step on this CPU is Python around MuJoCo's ``mj_step`` (the vector loop, three
wrappers, ``is_healthy`` twice, numpy on 11 numbers); here each env costs its ``mj_step`` and
two copies, and the observations, rewards and terminations are computed for all envs in one
numpy expression each.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np
import torch

__all__ = [
    "EnvSpec",
    "validate_env_id",
    "env_spec",
    "make_vector_env",
    "capture_envs",
    "restore_envs",
    "quiet_known_mujoco_warnings",
    "MujocoSteps",
]

#: MuJoCo warnings about gymnasium's own model files that a user can do nothing about (MuJoCo 4.0
#: on HalfCheetah-v5's XML, once per env made: six lines before a paper-grid dry run said anything)
KNOWN_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)


def _mujoco_warning(text: str) -> None:
    if not any(known in text for known in KNOWN_MUJOCO_WARNINGS):
        print(f"WARNING: {text}", file=sys.stderr, flush=True)  # as MuJoCo's own handler prints it


def quiet_known_mujoco_warnings() -> None:
    """Route MuJoCo's warnings through a handler that drops :data:`KNOWN_MUJOCO_WARNINGS` and
    prints every other one as MuJoCo would (a handler someone else installed is kept)."""
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


@dataclass(frozen=True)
class EnvSpec:
    """What the networks need to know about an env (kept in checkpoints)."""

    env_id: str
    obs_dim: int
    act_dim: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    max_episode_steps: int | None

    def to_dict(self) -> dict:
        return asdict(self)


def validate_env_id(env_id: str, field: str = "env_id") -> None:
    """Raise a ValueError naming ``field`` if ``env_id`` is not registered (starts nothing)."""
    if not isinstance(env_id, str) or env_id not in gym.registry:
        close = difflib.get_close_matches(str(env_id), list(gym.registry.keys()), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"`{field}`: unknown gymnasium env id {env_id!r}.{hint}")


def env_spec(env_id: str, env_kwargs: dict | None = None, field: str = "env_id") -> EnvSpec:
    """The task's sizes and bounds, read from one env made and closed here; a task vaco cannot
    train (not registered, a discrete action space, an image observation) is a ValueError naming
    ``field``."""
    validate_env_id(env_id, field)
    try:
        quiet_known_mujoco_warnings()
        env = gym.make(env_id, disable_env_checker=True, **(env_kwargs or {}))
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{field}`: {env_id} cannot be made with env_kwargs {env_kwargs or {}} ({err})") from None
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1:
            raise ValueError(
                f"`{field}`: {env_id} has the action space {act_space}; vaco's policies are Gaussian and need a "
                "1-D continuous (Box) one, as the MuJoCo tasks have (Hopper-v5, HalfCheetah-v5, ...)"
            )
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise ValueError(f"`{field}`: {env_id} must have a flat Box observation space, got {obs_space}")
        return EnvSpec(
            env_id=env_id,
            obs_dim=int(obs_space.shape[0]),
            act_dim=int(act_space.shape[0]),
            action_low=tuple(float(x) for x in act_space.low),
            action_high=tuple(float(x) for x in act_space.high),
            max_episode_steps=env.spec.max_episode_steps if env.spec else None,
        )
    finally:
        env.close()


class DropInfo(gym.Wrapper):
    """Return an empty info dict: the vector env would merge every sub-env's info (MuJoCo tasks
    report a handful of reward terms) at every step, ~20 us per env step we never read."""

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs, reward, terminated, truncated, {}


def make_vector_env(
    env_id: str, num_envs: int, env_kwargs: dict | None = None, keep_info: bool = False
) -> gym.vector.SyncVectorEnv:
    """``num_envs`` copies of ``env_id`` stepped in this process, SAME_STEP autoreset."""
    validate_env_id(env_id)
    quiet_known_mujoco_warnings()
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        disable_env_checker=True,
        wrappers=None if keep_info else [DropInfo],
        **(env_kwargs or {}),
    )


# ---------------------------------------------------------------------------------------------
# Exact snapshots. Neither gymnasium nor TorchRL serialise a running simulator, but a run that is
# stopped and resumed must continue bit for bit, mid-episode. For MuJoCo envs the complete
# integration state (qpos, qvel, act, warm-start, time, ...) plus the TimeLimit counter and the
# env's RNG (used by resets) is enough; anything else is refused loudly.


def _time_limit(env):
    while env is not None:
        if isinstance(env, gym.wrappers.TimeLimit):
            return env
        env = getattr(env, "env", None)
    return None


#: derived mjData fields a task reads before its step recomputes them (Ant's and Reacher's
#: ``get_body_com``, Humanoid's mass centre): after ``mj_step`` they hold the kinematics of the
#: last substep's start, which the integration state cannot give back, so a snapshot keeps them
KINEMATICS = ("xpos", "xquat", "xmat", "xipos", "ximat")


def capture_envs(venv: gym.vector.SyncVectorEnv) -> list[dict]:
    """Each MuJoCo env's exact state: MuJoCo's integration state, the body kinematics a step reads
    before recomputing them (:data:`KINEMATICS`), the ``TimeLimit`` counter and the reset RNG."""
    import mujoco

    states = []
    for env in venv.envs:
        base = env.unwrapped
        if not (hasattr(base, "model") and hasattr(base, "data")):
            raise TypeError(f"exact env snapshots need MuJoCo envs, {base} is not one")
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(base.model, spec))
        mujoco.mj_getState(base.model, base.data, state, spec)
        limit = _time_limit(env)
        states.append(
            {
                "mj_state": torch.from_numpy(state),
                "elapsed_steps": None if limit is None else limit._elapsed_steps,
                "rng": base.np_random.bit_generator.state,
                "kinematics": {name: torch.from_numpy(getattr(base.data, name).copy()) for name in KINEMATICS},
            }
        )
    return states


def restore_envs(venv: gym.vector.SyncVectorEnv, states: list[dict]) -> None:
    import mujoco

    if len(states) != len(venv.envs):
        raise ValueError(f"snapshot holds {len(states)} envs but the vector env has {len(venv.envs)}")
    for env, saved in zip(venv.envs, states):
        base = env.unwrapped
        mujoco.mj_setState(
            base.model, base.data, np.asarray(saved["mj_state"], dtype=np.float64), mujoco.mjtState.mjSTATE_INTEGRATION
        )
        for name, value in saved["kinematics"].items():  # the body kinematics mj_setState leaves stale
            getattr(base.data, name)[:] = np.asarray(value)
        limit = _time_limit(env)
        if limit is not None:
            limit._elapsed_steps = saved["elapsed_steps"]
        base.np_random.bit_generator.state = saved["rng"]


# ---------------------------------------------------------------------------------------------
# gymnasium's MuJoCo v5 step for all envs at once, bit for bit. Written by hand because neither
# gymnasium nor TorchRL steps a SyncVectorEnv's MuJoCo envs other than one Python step at a time.

#: gymnasium versions whose MuJoCo v5 ``step`` this was written from and tested against
#: (``tests/test_data.py``); another version steps through gymnasium's own code
TESTED_GYMNASIUM = ("1.4",)


@dataclass(frozen=True)
class _Task:
    """What a task's ``step`` computes after ``mj_step`` (gymnasium/envs/mujoco/<task>_v5.py)."""

    healthy: str | None  # "state" (Hopper: qpos[1:3] and the state range), "pose" (Walker2d: qpos[1:3]), None
    clip_velocity: bool  # the observation's qvel clipped to +-10 (Hopper, Walker2d)
    pendulum: bool = False  # InvertedPendulum: reward 1 while |qpos[1]| <= 0.2 and all finite


#: the tasks :class:`MujocoSteps` steps, by id and gymnasium class
MUJOCO_STEPS = {
    "Hopper-v5": ("gymnasium.envs.mujoco.hopper_v5", "HopperEnv", _Task("state", True)),
    "Walker2d-v5": ("gymnasium.envs.mujoco.walker2d_v5", "Walker2dEnv", _Task("pose", True)),
    "HalfCheetah-v5": ("gymnasium.envs.mujoco.half_cheetah_v5", "HalfCheetahEnv", _Task(None, False)),
    "InvertedPendulum-v5": (
        "gymnasium.envs.mujoco.inverted_pendulum_v5",
        "InvertedPendulumEnv",
        _Task(None, False, pendulum=True),
    ),
}


def _envs_of(venv: gym.vector.SyncVectorEnv | list[gym.vector.SyncVectorEnv]) -> list[gym.Env]:
    """The envs of a vector env, or of several in order (a population's members' envs, stepped in lockstep)."""
    return [env for v in (venv if isinstance(venv, list) else [venv]) for env in v.envs]


class MujocoSteps:
    """gymnasium's ``step`` for every env of ``venv`` (made by :func:`make_vector_env`) at once,
    with its ``SAME_STEP`` autoreset and ``TimeLimit``, bit for bit (``tests/test_data.py``
    compares every output and the simulator states with gymnasium's own step, on each task, with
    resets, truncations and changed ``env_kwargs``).

    Per env: the action into ``data.ctrl``, ``mj_step`` for ``frame_skip`` steps and
    ``mj_rnePostConstraint`` (as ``MujocoEnv.do_simulation``), ``qpos``/``qvel`` copied out, the
    ``TimeLimit`` counter advanced. Then for all envs at once, as the task's ``step`` computes
    them one at a time and in the same dtypes: the observation, the reward (``forward_reward_weight
    * x_velocity + healthy_reward - ctrl_cost_weight * sum(action^2)``, the control cost in the
    action's dtype as numpy 2 computes it), termination. An env that ends is reset through its own
    wrappers (gymnasium's ``reset``, its own RNG), as the vector env would. The task's settings are
    read from each env, so ``env_kwargs`` apply. :meth:`of` returns None where this does not apply
    (another task, another gymnasium, other wrappers, rendering, envs not yet reset), and the
    caller steps through gymnasium."""

    def __init__(self, venv: gym.vector.SyncVectorEnv | list[gym.vector.SyncVectorEnv], task: _Task) -> None:
        self.task = task
        self.envs = _envs_of(venv)
        self.limits = [_time_limit(env) for env in self.envs]
        self.bases = [env.unwrapped for env in self.envs]
        self.sims = [(base.model, base.data) for base in self.bases]
        first = self.bases[0]
        self.frame_skip, self.dt = first.frame_skip, first.dt
        self.num_envs = len(self.envs)
        self.qpos = np.empty((self.num_envs, first.model.nq))
        self.qvel = np.empty((self.num_envs, first.model.nv))
        self.x_before = np.empty(self.num_envs)
        # every env's settings (env_kwargs apply to all envs of one vector env alike; checked)
        self.settings = _settings(first, task)
        if any(
            _settings(b, task) != self.settings or (b.frame_skip, b.dt) != (self.frame_skip, self.dt)
            for b in self.bases
        ):
            raise ValueError("the envs of one vector env differ in their task settings")

    @classmethod
    def of(cls, venv, env_id: str) -> MujocoSteps | None:
        """The fast step for ``venv``'s envs (or for the envs of a list of vector envs, in order),
        or None where gymnasium's own step must run."""

        if env_id not in MUJOCO_STEPS or not gym.__version__.startswith(TESTED_GYMNASIUM):
            return None
        module, name, task = MUJOCO_STEPS[env_id]
        cls_ = getattr(importlib.import_module(module), name)
        envs = _envs_of(venv)
        for env in envs:
            chain = []
            while env is not None:
                chain.append(type(env))
                env = getattr(env, "env", None)
            if chain != [DropInfo, gym.wrappers.TimeLimit, gym.wrappers.OrderEnforcing, cls_]:
                return None
        if any(env.unwrapped.render_mode is not None for env in envs):
            return None
        return cls(venv, task)

    def ready(self) -> bool:
        """Every env has been reset (gymnasium's OrderEnforcing refuses a step before that)."""
        return all(env.env.env._has_reset for env in self.envs)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One step of every env: the next observations (after any reset), rewards, terminations,
        truncations and the final observations (the next ones where no episode ended)."""
        import mujoco

        frame_skip, qpos, qvel, x_before = self.frame_skip, self.qpos, self.qvel, self.x_before
        truncated = np.zeros(self.num_envs, dtype=bool)
        for i, ((model, data), limit) in enumerate(zip(self.sims, self.limits)):
            x_before[i] = data.qpos[0]
            data.ctrl[:] = actions[i]
            mujoco.mj_step(model, data, nstep=frame_skip)
            mujoco.mj_rnePostConstraint(model, data)
            qpos[i] = data.qpos
            qvel[i] = data.qvel
            limit._elapsed_steps += 1
            truncated[i] = limit._elapsed_steps >= limit._max_episode_steps
        obs, reward, terminated = self._after(actions)
        final = obs.copy()
        for i in np.flatnonzero(terminated | truncated):
            obs[i], _ = self.envs[i].reset()
        return obs, reward, terminated, truncated, final

    def _after(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The task's observation, reward and termination for all envs (its ``step`` after
        ``do_simulation``), in gymnasium's order of operations and dtypes."""
        task, s, qpos, qvel = self.task, self.settings, self.qpos, self.qvel
        if task.pendulum:
            obs = np.concatenate((qpos, qvel), axis=1)
            terminated = ~np.isfinite(obs).all(axis=1) | (np.abs(obs[:, 1]) > 0.2)
            return obs, (~terminated).astype(np.float64), terminated
        velocity = np.clip(qvel, -10, 10) if task.clip_velocity else qvel
        position = qpos[:, 1:] if s["exclude_current_positions"] else qpos
        obs = np.concatenate((position, velocity), axis=1)
        x_velocity = (qpos[:, 0] - self.x_before) / self.dt
        # numpy 2: a Python float times a float32 array stays float32, as in the task's control_cost
        ctrl_cost = s["ctrl_cost_weight"] * np.sum(np.square(actions), axis=1)
        forward = s["forward_reward_weight"] * x_velocity
        if task.healthy is None:
            return obs, forward - ctrl_cost, np.zeros(self.num_envs, dtype=bool)
        z, angle = qpos[:, 1], qpos[:, 2]
        (min_z, max_z), (min_angle, max_angle) = s["healthy_z_range"], s["healthy_angle_range"]
        healthy = (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)
        if task.healthy == "state":
            state = np.concatenate((qpos, qvel), axis=1)[:, 2:]
            min_state, max_state = s["healthy_state_range"]
            healthy &= np.all((min_state < state) & (state < max_state), axis=1)
        reward = (forward + healthy * s["healthy_reward"]) - ctrl_cost
        return obs, reward, ~healthy & bool(s["terminate_when_unhealthy"])


def _settings(base, task: _Task) -> dict:
    """The task settings a step reads (gymnasium's private attributes of the v5 envs)."""
    if task.pendulum:
        return {}
    names = ["forward_reward_weight", "ctrl_cost_weight", "exclude_current_positions_from_observation"]
    if task.healthy is not None:
        names += ["healthy_reward", "terminate_when_unhealthy", "healthy_z_range", "healthy_angle_range"]
    if task.healthy == "state":
        names.append("healthy_state_range")
    out = {name: getattr(base, f"_{name}") for name in names}
    out["exclude_current_positions"] = out.pop("exclude_current_positions_from_observation")
    return out
