"""gymnasium's v5 MuJoCo tasks stepped by envpool's C++ pool (``pip install -e '.[envpool]'``):
an opt-in collection backend, chosen per config.

    data:
      init_args:
        collection:
          class_path: vaco.data.envpool_backend.EnvPool
          init_args: {num_threads: 1}

envpool (1.2.5) re-implements the tasks in C++ on its own MuJoCo build (3.6, against the project's
4.0): one step from the same state matches gymnasium's, runs are not bit for bit the same.
``tests/test_envpool.py`` has the agreement checks, and docs/performance.md the learning-equivalence
check (not passed: one of eight cells differs) that a study must cite before it uses this backend. What differs from the gymnasium backend:

* **Autoreset.** envpool resets an env on the step *after* its episode ended (that step ignores its
  action). The rollout loop wants gymnasium's ``SAME_STEP`` bookkeeping, so :class:`EnvPoolEnvs`
  steps the envs that just ended once more, alone (envpool's ``env_id`` argument), and returns
  their reset observations in the same step, with the final ones as ``final_obs``.
* **Seeding.** env ``i`` gets ``seed * 10_000 + i`` (modulo 2**31), as gymnasium's envs do, but through envpool's
  own generator: the same seed gives the same episodes on this backend, other ones than gymnasium's.
* **Resume is not exact.** envpool exposes no simulator state to checkpoint: a run resumed from a
  checkpoint starts new episodes (a seeded reset) where the interrupted one was mid-episode, and
  says so in a warning. Everything else in the checkpoint (weights, optimiser, policy buffer,
  reward scaler, generators) resumes exactly.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

from vaco.data.collection import Collection
from vaco.data.collector_base import CollectorBase
from vaco.data.normalization import RewardScaler

if TYPE_CHECKING:
    from vaco.data.collection import RolloutSettings

__all__ = ["EnvPool", "EnvPoolCollector", "EnvPoolEnvs", "envpool_tasks", "import_envpool"]

RESUME_WARNING = (
    "the envpool backend cannot restore its simulators' state: this resumed run starts new episodes "
    "where the interrupted one was mid-episode (seeded reset); weights, optimiser, policy buffer and reward "
    "scaler resume exactly"
)


def import_envpool(field: str = "data.collection"):
    """The ``envpool`` module, or a ValueError naming ``field`` if it is not installed.

    envpool 1.2.5 sets ``os.environ["MPLBACKEND"] = "Agg"`` when imported, which every process started
    afterwards inherits (a notebook kernel then draws nothing inline); the variable is put back as it was."""
    before = os.environ.get("MPLBACKEND")
    try:
        import envpool
    except ImportError as err:
        raise ValueError(f"`{field}`: envpool is not installed (pip install -e '.[envpool]'): {err}") from None
    finally:
        if before is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = before
    return envpool


def envpool_tasks() -> list[str]:
    """The gymnasium MuJoCo v5 tasks envpool can step (the ones this backend runs)."""
    import gymnasium as gym

    mujoco = {
        name
        for name, spec in gym.registry.items()
        if name.endswith("-v5") and "gymnasium.envs.mujoco" in str(spec.entry_point)
    }
    return sorted(mujoco & set(import_envpool().list_all_envs()))


class EnvPoolEnvs:
    """envpool's batched env as the rollout loop's :class:`~vaco.data.collector_base.VectorEnv`:
    numpy in, CPU tensors out, float32 observations, episodes reset in the step they end."""

    device = torch.device("cpu")

    def __init__(self, env_id: str, num_envs: int, num_threads: int = 1) -> None:
        envpool = import_envpool()
        self.env_id, self.num_envs, self.num_threads = env_id, num_envs, num_threads
        space = envpool.make_spec(env_id, num_envs=num_envs).action_space
        self.act_dim = int(space.shape[0])
        self.action_low = torch.as_tensor(space.low, dtype=torch.float32)
        self.action_high = torch.as_tensor(space.high, dtype=torch.float32)
        self._all = np.arange(num_envs, dtype=np.int32)
        self._idle = np.zeros((num_envs, self.act_dim), dtype=np.float64)
        self.pool = None

    def reset(self, seed: int) -> torch.Tensor:
        """A fresh pool whose env ``i`` is seeded ``seed * 10_000 + i`` modulo 2**31 (envpool seeds at
        construction, with int32 seeds)."""
        envpool = import_envpool()
        self.close()
        seeds = [(seed * 10_000 + i) % 2**31 for i in range(self.num_envs)]
        self.pool = envpool.make(
            self.env_id,
            env_type="gymnasium",
            num_envs=self.num_envs,
            num_threads=self.num_threads,
            seed=seeds[0],
            env_seed=seeds,
        )
        obs, _ = self.pool.reset(self._all)
        return torch.from_numpy(obs.astype(np.float32))

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        obs, reward, term, trunc, info = self.pool.step(action.numpy().astype(np.float64), self._all)
        order = info["env_id"]
        if not np.array_equal(order, self._all):  # results come back in env order in sync mode; be sure
            back = np.argsort(order)
            obs, reward, term, trunc = obs[back], reward[back], term[back], trunc[back]
        done = term | trunc
        final_obs = obs.astype(np.float32)
        new_obs = final_obs.copy()
        if done.any():  # envpool resets on the next step of an ended env: take that step now, for those envs only
            ended = np.flatnonzero(done).astype(np.int32)
            reset_obs, *_, reset_info = self.pool.step(self._idle[: ended.size], ended)
            new_obs[reset_info["env_id"]] = reset_obs.astype(np.float32)
        return (
            torch.from_numpy(new_obs),
            torch.as_tensor(reward, dtype=torch.float64),
            torch.as_tensor(term, dtype=torch.bool),
            torch.as_tensor(trunc, dtype=torch.bool),
            torch.from_numpy(final_obs),
        )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


class EnvPoolCollector(CollectorBase):
    """The rollout loop on envpool's envs: ``EnvPoolCollector(EnvPoolEnvs(env_id, num_envs),
    num_steps, policy_buffer, num_iterations, gamma=..., scale_reward=..., seed=...)``, the arguments
    :class:`~vaco.data.collector_base.CollectorBase`'s."""

    def _reward_scaler(self, gamma: float) -> RewardScaler:
        return RewardScaler(self.num_envs, gamma)

    def _assign_slots(self) -> torch.Tensor:
        return self.policy_buffer.assign(self.num_envs, self.generator)

    def _save_envs(self):
        return None  # envpool has no state to save; see load_state_dict

    def _restore_envs(self, state) -> None:
        pass

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        if self._obs is not None:  # saved mid-run: the episodes in flight cannot be restored
            warnings.warn(RESUME_WARNING, RuntimeWarning, stacklevel=2)
            self._obs = None
            self._ep_return.zero_()
            self._ep_length.zero_()


class EnvPool(Collection):
    """envpool's C++ pool stepping the task's envs in this process (see the module docstring).

    Args:
        num_threads: envpool's worker threads (1: one core per run, as a sweep's ``jobs`` assume).
        evaluate_on: ``envpool`` (evaluation episodes on the same backend) or ``gymnasium``.
    """

    def __init__(self, num_threads: int = 1, evaluate_on: str = "envpool") -> None:
        if not (isinstance(num_threads, int) and not isinstance(num_threads, bool) and num_threads >= 1):
            raise ValueError(f"`data.collection.num_threads` must be an integer >= 1, got {num_threads!r}")
        if evaluate_on not in ("envpool", "gymnasium"):
            raise ValueError(f"`data.collection.evaluate_on` must be 'envpool' or 'gymnasium', got {evaluate_on!r}")
        self.num_threads, self.evaluate_on = num_threads, evaluate_on

    def validate(self, data: RolloutSettings) -> None:
        super().validate(data)
        tasks = envpool_tasks()
        if data.env_id not in tasks:
            raise ValueError(
                f"`data.env_id`: the envpool backend has no {data.env_id!r}; its MuJoCo tasks are {', '.join(tasks)}"
            )
        if data.env_kwargs:
            raise ValueError(
                f"`data.env_kwargs`: the envpool backend runs the tasks with their default arguments; got {sorted(data.env_kwargs)}"
            )

    def collector(self, data: RolloutSettings, seed: int) -> EnvPoolCollector:
        return EnvPoolCollector(
            EnvPoolEnvs(data.env_id, data.num_envs, self.num_threads),
            data.num_steps,
            None,  # bound once the model has built its actor
            data.num_iterations(),
            gamma=data.gamma,
            scale_reward=data.scale_reward,
            seed=seed,
        )

    def eval_env(self, data: RolloutSettings, num_envs: int, seed: int):
        if self.evaluate_on == "gymnasium":
            return super().eval_env(data, num_envs, seed)
        return EnvPoolEnvs(data.env_id, num_envs, self.num_threads)

    def definition(self) -> dict:
        return {**super().definition(), "evaluate_on": self.evaluate_on}  # the thread count may change on resume
