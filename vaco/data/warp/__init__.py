"""The paper's tasks as GPU-batched simulations on MuJoCo Warp (``pip install -e '.[warp]'``).

    data:
      init_args:
        env_id: Hopper-v5
        num_envs: 4096                 # worlds
        collection:
          class_path: vaco.data.warp.Warp
          init_args: {device: cuda}

:mod:`~vaco.data.warp.tasks` holds each task's observation, reward and termination (gymnasium's
v5 code on batched tensors), :mod:`~vaco.data.warp.env` the batched env, and
:mod:`~vaco.data.warp.warp_collector` the collector. docs/gpu.md says what matches gymnasium and what
does not, with measurements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vaco.data.collection import Collection
from vaco.data.warp.tasks import TASKS, task

if TYPE_CHECKING:
    from vaco.data.collection import RolloutSettings

__all__ = ["TASKS", "Warp", "record_warp_episode"]


class Warp(Collection):
    """Collect on MuJoCo Warp: ``num_envs`` worlds of the task on ``device``.

    Args:
        device: ``cpu`` (slow, for tests and laptops) or ``cuda`` / ``cuda:i``.
        cone: friction cones: null keeps the XML's (pyramidal), ``elliptic`` switches them (see
            docs/gpu.md for the measured effect on Ant and Humanoid).
        evaluate_on: ``warp`` (evaluation episodes on the same backend) or ``gymnasium`` (MuJoCo C,
            the reference the paper's numbers come from).
        cuda_graph: replay each env step's physics as one captured CUDA graph. ``null`` (the
            default): on where ``device`` is cuda, off on the CPU; ``true`` needs ``device: cuda``;
            ``false`` launches each kernel from Python. On an H100 the graph stepped Hopper 12x
            faster at 4,096 worlds (docs/gpu.md): without it every solver iteration waits on the host.
    """

    def __init__(
        self,
        device: str = "cpu",
        cone: str | None = None,
        evaluate_on: str = "warp",
        cuda_graph: bool | None = None,
    ) -> None:
        if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda")):
            raise ValueError(f"`data.collection.device` must be 'cpu' or 'cuda[:i]', got {device!r}")
        if cone not in (None, "pyramidal", "elliptic"):
            raise ValueError(f"`data.collection.cone` must be null, 'pyramidal' or 'elliptic', got {cone!r}")
        if evaluate_on not in ("warp", "gymnasium"):
            raise ValueError(f"`data.collection.evaluate_on` must be 'warp' or 'gymnasium', got {evaluate_on!r}")
        if cuda_graph is not None and not isinstance(cuda_graph, bool):
            raise ValueError(f"`data.collection.cuda_graph` must be null, true or false, got {cuda_graph!r}")
        if cuda_graph and not device.startswith("cuda"):
            raise ValueError(f"`data.collection.cuda_graph`: CUDA graphs need `device: cuda`, got {device!r}")
        self.device, self.cone, self.evaluate_on, self.cuda_graph = device, cone, evaluate_on, cuda_graph

    @property
    def uses_graph(self) -> bool:
        """Whether env steps replay a CUDA graph: ``cuda_graph``, or with null, whether the device is cuda."""
        return self.device.startswith("cuda") if self.cuda_graph is None else self.cuda_graph

    def validate(self, data: RolloutSettings) -> None:
        task(data.env_id, field="data.env_id")
        if data.env_kwargs:
            raise ValueError(
                "`data.env_kwargs`: the Warp backend runs the v5 tasks with their default arguments; "
                f"got {sorted(data.env_kwargs)}"
            )
        if self.device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise ValueError(f"`data.collection.device`: {self.device!r}, but torch sees no CUDA device")
        from vaco.data.warp.env import check_worlds

        sizes = [("data.num_envs", data.num_envs)]
        if self.evaluate_on == "warp":
            sizes.append(("data.eval_envs", data.eval_envs))
        for field, worlds in sizes:
            check_worlds(data.env_id, worlds, self.device, field=field)  # the extra is installed; memory

    def _env(self, data: RolloutSettings, num_worlds: int, seed: int):
        from vaco.data.warp.env import WarpVectorEnv

        return WarpVectorEnv(
            data.env_id, num_worlds, device=self.device, seed=seed, cone=self.cone, cuda_graph=self.uses_graph
        )

    def check_members(self, data: RolloutSettings, members: int) -> None:
        from vaco.data.warp.env import check_worlds

        # a population's members share one model of members x num_envs worlds (lockstep_envs)
        check_worlds(data.env_id, members * data.num_envs, self.device, field="population` x `data.num_envs")

    def lockstep_envs(self, datas: list[RolloutSettings], seeds: list[int]) -> list:
        """One model of ``len(datas) x num_envs`` worlds, member ``m``'s block ``m`` (its own reset
        generator, seeded by its collector's first reset): every member's worlds step in one call."""
        from vaco.data.warp.env import WarpVectorEnv

        data = datas[0]
        env = WarpVectorEnv(
            data.env_id,
            len(datas) * data.num_envs,
            device=self.device,
            seed=seeds[0],
            cone=self.cone,
            cuda_graph=self.uses_graph,
            blocks=len(datas),
        )
        return [env.block(m) for m in range(len(datas))]

    def collector(self, data: RolloutSettings, seed: int, env=None):
        from vaco.data.warp.warp_collector import WarpCollector

        return WarpCollector(
            env if env is not None else self._env(data, data.num_envs, seed),
            data.num_steps,
            None,
            data.num_iterations(),
            gamma=data.gamma,
            scale_reward=data.scale_reward,
            seed=seed,
        )

    def eval_env(self, data: RolloutSettings, num_envs: int, seed: int):
        """Warp worlds (replaying a CUDA graph as the collector does: without one a step of a few
        worlds costs as long as one of thousands, ~90 ms for Hopper on an H100), or gymnasium's
        envs with ``evaluate_on: gymnasium``."""
        if self.evaluate_on == "gymnasium":
            return super().eval_env(data, num_envs, seed)
        from vaco.data.warp.env import WarpVectorEnv

        return WarpVectorEnv(
            data.env_id, num_envs, device=self.device, seed=seed, cone=self.cone, cuda_graph=self.uses_graph
        )

    def definition(self) -> dict[str, Any]:
        return {**super().definition(), "cone": self.cone}  # the device may change on resume


@torch.no_grad()
def record_warp_episode(
    env_id: str, policy, seed: int = 0, deterministic: bool = False, device: str = "cpu", max_frames: int = 1000
) -> list:
    """Frames of one episode simulated on Warp, each drawn by MuJoCo's renderer from the Warp
    world's state (qpos, qvel copied into gymnasium's MjData, then ``mj_forward``)."""
    import gymnasium as gym

    from vaco.data.warp.env import WarpVectorEnv

    env = WarpVectorEnv(env_id, 1, device=device, seed=seed)
    from vaco.data.envs import quiet_known_mujoco_warnings

    quiet_known_mujoco_warnings()
    view = gym.make(env_id, render_mode="rgb_array")
    try:
        view.reset(seed=seed)
        generator = torch.Generator(device=env.device).manual_seed(seed)
        obs = env.reset(seed=seed)

        def frame(t: int):
            view.unwrapped.data.time = t * env.dt  # the tracking camera follows the body over time
            view.unwrapped.set_state(env.sim.qpos[0].double().cpu().numpy(), env.sim.qvel[0].double().cpu().numpy())
            return view.render()

        frames = [frame(0)]
        for t in range(1, max_frames + 1):
            loc, scale = (x.to(env.device) for x in policy(obs.cpu()))
            action = (
                loc if deterministic else loc + scale * torch.randn(loc.shape, generator=generator, device=env.device)
            )
            obs, _, term, trunc, _ = env.step(torch.maximum(torch.minimum(action, env.action_high), env.action_low))
            if bool((term | trunc)[0]):  # the world has been reset already: the episode's last state is gone
                break
            frames.append(frame(t))
        return frames
    finally:
        view.close()
