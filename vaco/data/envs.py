"""Environment factory, specs and exact simulator snapshots.

Envs are gymnasium vector envs in ``SAME_STEP`` autoreset mode: the step that ends an episode
returns the *reset* observation and puts the final one in ``info["final_obs"]``, so every step
is a real transition. (gymnasium 1.x's default, ``NEXT_STEP``, inserts a fake step after each
episode end, which GAE code written for gym 0.x silently learns from.)
"""

from __future__ import annotations

import difflib
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


def capture_envs(venv: gym.vector.SyncVectorEnv) -> list[dict]:
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
        limit = _time_limit(env)
        if limit is not None:
            limit._elapsed_steps = saved["elapsed_steps"]
        base.np_random.bit_generator.state = saved["rng"]
