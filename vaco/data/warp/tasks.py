"""The six tasks' observation, reward and termination, from gymnasium's v5 sources, on batched
torch tensors (one row per world).

Each function reads the same simulator quantities gymnasium reads, at the same point: after a
step, ``qpos``/``qvel`` are the integrated state while ``xpos``, ``xipos``, ``cinert``, ``cvel``,
``qfrc_actuator`` and ``cfrc_ext`` come from the last substep's forward pass (before its
integration), in MuJoCo C as in MuJoCo Warp; after a reset they come from a forward pass at the
reset state (gymnasium's ``set_state`` calls ``mj_forward``). Default v5 arguments throughout
(``exclude_current_positions_from_observation=True``, the default weights and ranges).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

__all__ = ["TASKS", "Sim", "Task", "task"]


@dataclasses.dataclass
class Sim:
    """Torch views of one batch of worlds (``[W, ...]``), and the model constants the tasks use."""

    qpos: torch.Tensor
    qvel: torch.Tensor
    ctrl: torch.Tensor
    xpos: torch.Tensor  # [W, nbody, 3]
    xipos: torch.Tensor  # [W, nbody, 3]
    cinert: torch.Tensor  # [W, nbody, 10]
    cvel: torch.Tensor  # [W, nbody, 6]
    qfrc_actuator: torch.Tensor  # [W, nv]
    cfrc_ext: torch.Tensor  # [W, nbody, 6]
    body_mass: torch.Tensor  # [nbody]


@dataclasses.dataclass(frozen=True)
class Task:
    """One gymnasium v5 task as batched functions.

    ``position`` is what the forward velocity is measured on (x of the root, of the torso
    body's frame, or of the centre of mass); ``reward`` returns (reward, terminated) from the
    sim after a step, the forward velocity and the (clipped) action.
    """

    env_id: str
    xml: str
    frame_skip: int
    reset_noise: float
    qvel_noise: str  # "uniform" (U(-s, s)) or "normal" (s * N(0, 1)), as the v5 source draws it
    observation: Callable[[Sim], torch.Tensor]
    position: Callable[[Sim], torch.Tensor]
    reward: Callable[[Sim, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    contact_forces: bool = False  # reads cfrc_ext: Warp must run rne_postconstraint
    forward_on_reset: bool = False  # its observation or position needs more than qpos/qvel
    nconmax: int = 16  # contacts per world Warp allocates (a world may borrow from another)
    njmax: int = 64  # constraint rows per world (a hard limit per world)
    max_episode_steps: int = 1000


def _ctrl_cost(action: torch.Tensor, weight: float) -> torch.Tensor:
    return weight * action.square().sum(-1)


def _planar_obs(clip: bool):
    """qpos without x, then qvel (Hopper and Walker2d clip it to [-10, 10])."""

    def observation(sim: Sim) -> torch.Tensor:
        qvel = sim.qvel.clamp(-10.0, 10.0) if clip else sim.qvel
        return torch.cat([sim.qpos[:, 1:], qvel], dim=-1)

    return observation


def _root_x(sim: Sim) -> torch.Tensor:
    return sim.qpos[:, 0]


def _hopper_reward(sim: Sim, x_velocity: torch.Tensor, action: torch.Tensor):
    z, angle = sim.qpos[:, 1], sim.qpos[:, 2]
    state = torch.cat([sim.qpos, sim.qvel], dim=-1)[:, 2:]
    # gymnasium: 0.7 < z < inf (so z = +inf is unhealthy), -100 < state < 100, -0.2 < angle < 0.2
    healthy = (
        ((state > -100.0) & (state < 100.0)).all(-1) & (z > 0.7) & (z < float("inf")) & (angle > -0.2) & (angle < 0.2)
    )
    reward = x_velocity + healthy.float() - _ctrl_cost(action, 1e-3)
    return reward, ~healthy


def _walker_reward(sim: Sim, x_velocity: torch.Tensor, action: torch.Tensor):
    z, angle = sim.qpos[:, 1], sim.qpos[:, 2]
    healthy = (z > 0.8) & (z < 2.0) & (angle > -1.0) & (angle < 1.0)
    reward = x_velocity + healthy.float() - _ctrl_cost(action, 1e-3)
    return reward, ~healthy


def _cheetah_reward(sim: Sim, x_velocity: torch.Tensor, action: torch.Tensor):
    reward = x_velocity - _ctrl_cost(action, 0.1)
    return reward, torch.zeros_like(reward, dtype=torch.bool)


def _pendulum_obs(sim: Sim) -> torch.Tensor:
    return torch.cat([sim.qpos, sim.qvel], dim=-1)


def _pendulum_reward(sim: Sim, x_velocity: torch.Tensor, action: torch.Tensor):
    obs = _pendulum_obs(sim)
    terminated = ~torch.isfinite(obs).all(-1) | (obs[:, 1].abs() > 0.2)
    return (~terminated).float(), terminated


def _ant_obs(sim: Sim) -> torch.Tensor:
    contact = sim.cfrc_ext.clamp(-1.0, 1.0)[:, 1:].flatten(1)
    return torch.cat([sim.qpos[:, 2:], sim.qvel, contact], dim=-1)


def _ant_x(sim: Sim) -> torch.Tensor:
    return sim.xpos[:, 1, 0]  # main_body=1, the torso's frame


def _ant_reward(sim: Sim, x_velocity: torch.Tensor, action: torch.Tensor):
    state = torch.cat([sim.qpos, sim.qvel], dim=-1)
    z = sim.qpos[:, 2]
    healthy = torch.isfinite(state).all(-1) & (z >= 0.2) & (z <= 1.0)
    contact_cost = 5e-4 * sim.cfrc_ext.clamp(-1.0, 1.0).square().sum((-2, -1))
    reward = x_velocity + healthy.float() - _ctrl_cost(action, 0.5) - contact_cost
    return reward, ~healthy


def _humanoid_obs(sim: Sim) -> torch.Tensor:
    return torch.cat(
        [
            sim.qpos[:, 2:],
            sim.qvel,
            sim.cinert[:, 1:].flatten(1),
            sim.cvel[:, 1:].flatten(1),
            sim.qfrc_actuator[:, 6:],
            sim.cfrc_ext[:, 1:].flatten(1),
        ],
        dim=-1,
    )


def _mass_center_x(sim: Sim) -> torch.Tensor:
    return (sim.body_mass * sim.xipos[..., 0]).sum(-1) / sim.body_mass.sum()


def _humanoid_reward(sim: Sim, x_velocity: torch.Tensor, action: torch.Tensor):
    z = sim.qpos[:, 2]
    healthy = (z > 1.0) & (z < 2.0)
    ctrl_cost = 0.1 * sim.ctrl.square().sum(-1)  # v5 charges data.ctrl
    contact_cost = (5e-7 * sim.cfrc_ext.square().sum((-2, -1))).clamp(max=10.0)
    reward = 1.25 * x_velocity + 5.0 * healthy.float() - ctrl_cost - contact_cost
    return reward, ~healthy


TASKS: dict[str, Task] = {
    t.env_id: t
    for t in (
        Task(
            "InvertedPendulum-v5",
            "inverted_pendulum.xml",
            2,
            0.01,
            "uniform",
            _pendulum_obs,
            _root_x,
            _pendulum_reward,
            nconmax=4,
            njmax=16,
        ),
        Task("Hopper-v5", "hopper.xml", 4, 5e-3, "uniform", _planar_obs(True), _root_x, _hopper_reward),
        Task("Walker2d-v5", "walker2d_v5.xml", 4, 5e-3, "uniform", _planar_obs(True), _root_x, _walker_reward),
        Task(
            "HalfCheetah-v5",
            "half_cheetah.xml",
            5,
            0.1,
            "normal",
            _planar_obs(False),
            _root_x,
            _cheetah_reward,
            nconmax=32,
            njmax=128,
        ),
        Task(
            "Ant-v5",
            "ant.xml",
            5,
            0.1,
            "normal",
            _ant_obs,
            _ant_x,
            _ant_reward,
            contact_forces=True,
            forward_on_reset=True,
            nconmax=48,
            njmax=256,
        ),
        Task(
            "Humanoid-v5",
            "humanoid.xml",
            5,
            1e-2,
            "uniform",
            _humanoid_obs,
            _mass_center_x,
            _humanoid_reward,
            contact_forces=True,
            forward_on_reset=True,
            nconmax=48,
            njmax=256,
        ),
    )
}


def task(env_id: str, field: str = "env_id") -> Task:
    """The task of a gymnasium id, or a ValueError naming ``field`` and the ids there are."""
    if env_id not in TASKS:
        raise ValueError(f"`{field}`: the Warp backend has no task {env_id!r}; it has {', '.join(TASKS)}")
    return TASKS[env_id]
