"""``WarpVectorEnv``: ``num_worlds`` copies of a gymnasium v5 MuJoCo task stepped together by
MuJoCo Warp, every array a torch tensor on one device (``cpu`` or ``cuda``).

Semantics are gymnasium's, in its vector ``SAME_STEP`` autoreset mode as vaco's collector uses
it: a step that ends an episode (terminated, or truncated at 1,000 steps) returns the reset
observation for that world and hands the final one back separately. The models are the XML files
gymnasium ships; the reset draws the v5 noise around ``qpos0``.

Where MuJoCo Warp differs from the MuJoCo C that gymnasium steps, measured in docs/gpu.md:

* float32 throughout (MuJoCo C: float64);
* the solver tolerance is floored at 1e-6 (the XMLs ask for 1e-8);
* Humanoid's XML asks for the PGS solver, which Warp does not have: Newton is used;
* contact forces (``cfrc_ext``, in Ant's and Humanoid's observation and contact cost) are
  computed only with ``opt.run_rne_postconstraint``, which this env turns on for them;
* Ant and Humanoid's pyramidal friction cones orient their friction directions differently
  from C for steep contacts; ``cone="elliptic"`` switches both engines' model to elliptic cones.

No host round trip per step on a GPU: resets are masked writes, not branches, so a step is the
same sequence of kernels whatever happens. (On the CPU device, where a check is free, a step
without an episode end skips the reset kernels.)
"""

from __future__ import annotations

import ctypes.util
import gc
import os
import sys
import warnings
from collections import OrderedDict

import torch

from vaco.data.warp.tasks import Sim, Task, task

__all__ = ["WarpBlock", "WarpVectorEnv", "load_model"]


def _import_warp():
    try:
        import warp as wp

        # before anything initialises Warp (importing mujoco_warp does): no version banner, warnings kept
        wp.config.quiet = True
        wp.config.log_level = max(getattr(wp.config, "log_level", 0), getattr(wp, "LOG_WARNING", 30))
        _init_quietly(wp)
        import mujoco_warp as mjw
    except ImportError as err:  # the optional extra
        raise ImportError(
            "the Warp backend needs MuJoCo Warp: pip install -e '.[warp]' (mujoco-warp, warp-lang)"
        ) from err
    return wp, mjw


def _init_quietly(wp) -> None:
    """``wp.init()``; on a machine with no CUDA driver library at all, without Warp's native
    "Could not find or load the NVIDIA CUDA driver" line (printed by C code to fd 2, which says
    nothing to a CPU run). Where a driver is installed, its messages stay: they may explain a fault."""

    if ctypes.util.find_library("cuda") is not None:
        wp.init()
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            wp.init()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def load_model(spec: Task, cone: str | None = None):
    """gymnasium's own MjModel of the task, with what Warp needs changed (and nothing else)."""
    import gymnasium
    import mujoco

    path = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", spec.xml)
    model = mujoco.MjModel.from_xml_path(path)
    if model.opt.solver == mujoco.mjtSolver.mjSOL_PGS:  # Humanoid: Warp has CG and Newton only
        model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    if cone is not None:
        if cone not in ("pyramidal", "elliptic"):
            raise ValueError(f"`cone` must be 'pyramidal', 'elliptic' or null (the XML's), got {cone!r}")
        model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC if cone == "elliptic" else mujoco.mjtCone.mjCONE_PYRAMIDAL
    return model


def _nbytes(obj, seen: set | None = None) -> int:
    """Bytes of every Warp array reachable from ``obj`` (Warp's Data nests structs of arrays)."""
    import warp as wp

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, wp.array):
        return int(obj.capacity)
    if hasattr(obj, "__dict__"):
        return sum(_nbytes(v, seen) for v in vars(obj).values())
    return 0


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_worlds(env_id: str, num_worlds: int, device: str = "cpu", field: str = "data.num_envs") -> None:
    """Before anything is built: the extra is installed, the task exists, and ``num_worlds`` of it
    fit in the device's free memory (a ValueError naming ``field`` if not)."""
    import mujoco

    wp, mjw = _import_warp()
    spec = task(env_id, field="data.env_id")
    model = load_model(spec)
    with wp.ScopedDevice("cpu" if device == "cpu" else device):
        _check_memory(spec, model, mujoco.MjData(model), num_worlds, torch.device(device), wp, mjw, field)


def _check_memory(
    spec: Task, mj_model, mj_data, num_worlds: int, device: torch.device, wp, mjw, field: str = "data.num_envs"
) -> None:
    """Refuse, before allocating, a number of worlds the device cannot hold (measured per world
    from one- and two-world allocations; the collector's own buffers come on top)."""
    sizes = [_nbytes(mjw.put_data(mj_model, mj_data, nworld=n, nconmax=spec.nconmax, njmax=spec.njmax)) for n in (1, 2)]
    need = sizes[0] + (sizes[1] - sizes[0]) * (num_worlds - 1)
    free = _free_bytes(device)
    if need > 0.9 * free:
        raise ValueError(
            f"`{field}`: {num_worlds:,} worlds of {spec.env_id} need about {need / 2**30:.1f} GiB of "
            f"simulator state on {device}, and {free / 2**30:.1f} GiB are free; use fewer worlds"
        )


def _graphs_supported(wp, wp_device: str) -> bool:
    """CUDA graphs of MuJoCo Warp's step need Warp's memory pool (allocations inside the capture)
    and a driver with conditional nodes (CUDA 12.4: the solver's while loops)."""

    reasons = []
    if not wp.is_mempool_enabled(wp_device):
        reasons.append("Warp's memory pool is disabled")
    # Warp >= 1.10 has get_cuda_driver_version(); older ones kept it on the runtime object (the
    # attribute read alone, as this check first did, is None on Warp 1.19: graphs were silently off)
    get = getattr(wp, "get_cuda_driver_version", None)
    driver = get() if get else getattr(getattr(getattr(wp, "context", None), "runtime", None), "driver_version", None)
    if driver is None or tuple(driver) < (12, 4):
        reasons.append(f"CUDA driver {driver} < 12.4")
    if reasons:
        warnings.warn(f"CUDA graphs off: {', '.join(reasons)}", stacklevel=3)
    return not reasons


class WarpVectorEnv:
    """Batched gymnasium v5 task on MuJoCo Warp.

    Args:
        env_id: one of the backend's tasks (``Hopper-v5``, ``HalfCheetah-v5``, ``Walker2d-v5``,
            ``Ant-v5``, ``Humanoid-v5``, ``InvertedPendulum-v5``).
        num_worlds: parallel copies (``nworld``).
        device: ``cpu`` or ``cuda[:i]``; the torch device of every tensor this env returns.
        seed: seeds the reset noise (a torch generator on ``device``).
        cone: friction cone for contacts: None keeps the XML's (pyramidal for all six).
        cuda_graph: on a CUDA device, capture an env step's ``frame_skip`` physics steps once
            (``wp.ScopedCapture``) and replay the graph (``wp.capture_launch``) instead of
            launching each kernel from Python, as mjlab does. Needs Warp's memory pool and a
            CUDA driver >= 12.4 (conditional graph nodes); where either is missing, or the capture
            fails, the env warns and launches the kernels one by one. On an H100: 12x the env steps/s
            of kernel-by-kernel stepping at 4,096 Hopper worlds (docs/gpu.md).
        blocks: split the worlds into this many equal blocks, each with its own reset generator
            (a population's members: :meth:`block` is member ``b``'s view, and the worlds of a
            block reset, draw their noise and checkpoint exactly as an env of
            ``num_worlds // blocks`` worlds alone would). Every block steps in one call.
    """

    def __init__(
        self,
        env_id: str,
        num_worlds: int,
        device: str = "cpu",
        seed: int = 0,
        cone: str | None = None,
        cuda_graph: bool = False,
        blocks: int = 1,
    ):
        import mujoco

        self.spec = task(env_id)
        if not (isinstance(num_worlds, int) and num_worlds >= 1):
            raise ValueError(f"`num_envs` must be an integer >= 1, got {num_worlds!r}")
        if not (isinstance(blocks, int) and blocks >= 1 and num_worlds % blocks == 0):
            raise ValueError(f"`blocks` must divide the {num_worlds} worlds into equal blocks, got {blocks!r}")
        self.blocks, self.block_size = blocks, num_worlds // blocks
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"`device`: {device!r} asked for, but torch sees no CUDA device")
        wp, mjw = _import_warp()
        self._wp, self._mjw = wp, mjw
        self.mj_model = load_model(self.spec, cone)
        self.num_worlds = self.num_envs = num_worlds  # num_envs: the rollout loop's VectorEnv name
        data = mujoco.MjData(self.mj_model)
        wp_device = "cpu" if self.device.type == "cpu" else f"cuda:{self.device.index or 0}"
        self._wp_device = wp_device
        with wp.ScopedDevice(wp_device):
            self.model = mjw.put_model(self.mj_model)
            if self.spec.contact_forces:
                self.model.opt.run_rne_postconstraint = True
            _check_memory(self.spec, self.mj_model, data, num_worlds, self.device, wp, mjw)
            self.data = mjw.put_data(
                self.mj_model, data, nworld=num_worlds, nconmax=self.spec.nconmax, njmax=self.spec.njmax
            )
        t = wp.to_torch
        d = self.data
        self.sim = Sim(
            qpos=t(d.qpos),
            qvel=t(d.qvel),
            ctrl=t(d.ctrl),
            xpos=t(d.xpos),
            xipos=t(d.xipos),
            cinert=t(d.cinert),
            cvel=t(d.cvel),
            qfrc_actuator=t(d.qfrc_actuator),
            cfrc_ext=t(d.cfrc_ext),
            body_mass=torch.as_tensor(self.mj_model.body_mass, dtype=torch.float32, device=self.device),
        )
        self._warmstart = t(d.qacc_warmstart)
        self._time = t(d.time)
        self.qpos0 = torch.as_tensor(self.mj_model.qpos0, dtype=torch.float32, device=self.device)
        self.dt = float(self.mj_model.opt.timestep) * self.spec.frame_skip
        self.obs_dim = int(self._observe().shape[-1])
        self.act_dim = int(self.mj_model.nu)
        low, high = self.mj_model.actuator_ctrlrange.T
        self.action_low = torch.as_tensor(low, dtype=torch.float32, device=self.device)
        self.action_high = torch.as_tensor(high, dtype=torch.float32, device=self.device)
        # one reset generator per block (a population member's), each drawing its own block's noise
        self.generators = [torch.Generator(device=self.device).manual_seed(int(seed)) for _ in range(blocks)]
        self.length = torch.zeros(num_worlds, dtype=torch.long, device=self.device)
        self._position = torch.zeros(num_worlds, dtype=torch.float32, device=self.device)
        self.info: dict[str, torch.Tensor] = {}  # after a step: x_position and x_velocity per world (gymnasium's info)
        self._mask = torch.zeros(num_worlds, dtype=torch.bool, device=self.device)
        # on the CPU a host check costs nothing and skips the reset kernels on most steps; on a
        # GPU the reset is masked writes with no check (no sync; one kernel sequence per step)
        self._skip_idle_resets = self.device.type == "cpu"
        self._wp_mask = wp.from_torch(self._mask)
        if cuda_graph and self.device.type != "cuda":
            raise ValueError(f"`cuda_graph`: CUDA graphs need a cuda device, got {device!r}")
        self._graph = None  # captured on the first step (see _physics)
        self._use_graph = bool(cuda_graph) and _graphs_supported(wp, wp_device)

    @property
    def generator(self) -> torch.Generator:
        """The reset generator (of an env of one block)."""
        if self.blocks != 1:
            raise AttributeError("an env of several blocks has one reset generator per block: `generators`")
        return self.generators[0]

    def block_rows(self, b: int) -> slice:
        return slice(b * self.block_size, (b + 1) * self.block_size)

    def block(self, b: int) -> WarpBlock:
        """Block ``b``'s worlds as an env of their own (reset, state), stepped with every block."""
        if not 0 <= b < self.blocks:
            raise IndexError(f"block {b} of {self.blocks}")
        return WarpBlock(self, b)

    # ------------------------------------------------------------------ gymnasium-like API
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every world; returns the observations ``[W, obs_dim]``."""
        if self.blocks != 1:
            raise RuntimeError("an env of several blocks resets block by block: `block(b).reset(seed)`")
        return self.reset_block(0, seed)

    def reset_block(self, b: int, seed: int | None = None) -> torch.Tensor:
        """Reset block ``b``'s worlds (reseeding its generator); returns their observations."""
        if seed is not None:
            self.generators[b].manual_seed(int(seed))
        self._mask.fill_(False)
        self._mask[self.block_rows(b)] = True
        self._reset_masked(draw=[b])
        return self._observe()[self.block_rows(b)]

    @torch.no_grad()
    def step(self, action: torch.Tensor):
        """One env step (``frame_skip`` physics steps) of every world with ``action`` ``[W, act]``
        (already inside the action bounds). Returns ``(obs, reward, terminated, truncated,
        final_obs)``: ``obs`` is the reset observation where an episode ended, ``final_obs`` the
        observation it ended on (equal to ``obs`` elsewhere)."""
        self.sim.ctrl.copy_(action)
        self._physics()
        position = self.spec.position(self.sim)
        # in float64, as gymnasium computes it (the positions themselves are Warp's float32)
        x_velocity = (position.double() - self._position.double()) / self.dt
        final_obs = self._observe()
        reward, terminated = self.spec.reward(self.sim, x_velocity, self.sim.ctrl)
        reward = reward.float()
        # gymnasium's info keys that every forward-moving task reports, per world, before any reset
        # (x_position is the root's qpos[0] in all of them; x_velocity is measured on `position`)
        self.info = {"x_position": self.sim.qpos[:, 0].double().clone(), "x_velocity": x_velocity}
        self.length += 1
        truncated = self.length >= self.spec.max_episode_steps
        self._mask.copy_(terminated | truncated)
        self._position.copy_(position)
        self._reset_masked()
        obs = torch.where(self._mask.unsqueeze(-1), self._observe(), final_obs)
        return obs, reward, terminated, truncated, final_obs

    def _physics(self) -> None:
        """``frame_skip`` physics steps of every world: kernel by kernel, or one CUDA graph replay.

        Warp's streams are blocking, so work on torch's (legacy) default stream orders with them
        either way: the ``ctrl`` written above is read by the step, and the state it writes is read
        by the torch code after it. The graph holds the addresses of ``self.data``'s arrays, which
        every write here keeps (all in place)."""
        wp, mjw = self._wp, self._mjw
        with wp.ScopedDevice(self._wp_device):
            if self._use_graph and self._graph is None:
                self._graph = self._capture()
            if self._graph is not None:
                wp.capture_launch(self._graph)
                return
            for _ in range(self.spec.frame_skip):
                mjw.step(self.model, self.data)

    def _capture(self):

        wp, mjw = self._wp, self._mjw
        enabled = gc.isenabled()
        gc.disable()  # a finaliser run during capture would be recorded into the graph (mjlab's note)
        try:
            with wp.ScopedCapture() as capture:
                for _ in range(self.spec.frame_skip):
                    mjw.step(self.model, self.data)
            return capture.graph
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to plain launches
            warnings.warn(f"CUDA graph capture of {self.spec.env_id} failed ({err}); stepping without it", stacklevel=3)
            self._use_graph = False
            return None
        finally:
            if enabled:
                gc.enable()

    def _observe(self) -> torch.Tensor:
        return self.spec.observation(self.sim)

    def _reset_masked(self, draw: list[int] | None = None) -> None:
        """gymnasium's reset for the worlds in ``self._mask``: clear the data (``mj_resetData``),
        draw ``qpos0 + U(-s, s)`` and ``U(-s, s)`` (or ``s * N(0, 1)``) velocities, and, where the
        task reads derived quantities, a forward pass (``set_state`` -> ``mj_forward``).

        Each block draws its own noise from its own generator, for its block of worlds: the blocks in
        ``draw``, or (None: a step) on a GPU every block, on the CPU the blocks where a world resets,
        which is what an env of that one block alone would draw. (The forward pass recomputes the
        derived quantities of every world from its state; a world that is not reset keeps its state.)"""
        mask = self._mask
        if draw is None:
            if self._skip_idle_resets:
                if self.blocks == 1:
                    draw = [0] if bool(mask.any()) else []
                else:
                    draw = torch.nonzero(mask.view(self.blocks, -1).any(-1)).flatten().tolist()
            else:
                draw = range(self.blocks)
        if self._skip_idle_resets and not draw:
            return
        s = self.spec.reset_noise
        shape_q, shape_v = (self.block_size, self.sim.qpos.shape[-1]), (self.block_size, self.sim.qvel.shape[-1])
        noise_q = torch.zeros(self.sim.qpos.shape, device=self.device)
        noise_v = torch.zeros(self.sim.qvel.shape, device=self.device)
        for b in draw:
            gen, rows = self.generators[b], self.block_rows(b)
            noise_q[rows] = torch.rand(shape_q, generator=gen, device=self.device) * (2 * s) - s
            if self.spec.qvel_noise == "normal":
                noise_v[rows] = s * torch.randn(shape_v, generator=gen, device=self.device)
            else:
                noise_v[rows] = torch.rand(shape_v, generator=gen, device=self.device) * (2 * s) - s
        with self._wp.ScopedDevice(self._wp_device):
            self._mjw.reset_data(self.model, self.data, reset=self._wp_mask)
        m = mask.unsqueeze(-1)
        self.sim.qpos.copy_(torch.where(m, self.qpos0 + noise_q, self.sim.qpos))
        self.sim.qvel.copy_(torch.where(m, noise_v, self.sim.qvel))
        if self.spec.forward_on_reset:
            with self._wp.ScopedDevice(self._wp_device):
                self._mjw.forward(self.model, self.data)
        self.length.masked_fill_(mask, 0)
        self._position.copy_(torch.where(mask, self.spec.position(self.sim), self._position))

    # ------------------------------------------------------------------ state
    def set_state(self, qpos: torch.Tensor, qvel: torch.Tensor) -> torch.Tensor:
        """Put every world in the given state (gymnasium's ``set_state``); returns the observations."""
        self._mask.fill_(True)
        return self._set_state(slice(None), qpos, qvel)

    def _set_state(self, rows: slice, qpos: torch.Tensor, qvel: torch.Tensor) -> torch.Tensor:
        """The worlds of ``rows`` (also marked in ``self._mask``) in the given state."""
        with self._wp.ScopedDevice(self._wp_device):
            self._mjw.reset_data(self.model, self.data, reset=self._wp_mask)
        self.sim.qpos[rows] = qpos
        self.sim.qvel[rows] = qvel
        with self._wp.ScopedDevice(self._wp_device):
            self._mjw.forward(self.model, self.data)
        self._position[rows] = self.spec.position(self.sim)[rows]
        return self._observe()

    def state_dict(self) -> OrderedDict:
        """What the next step depends on: the state, the solver's warm start, episode lengths,
        the reset RNG (tensors only; checkpoints load with ``weights_only=True``)."""
        if self.blocks != 1:
            raise RuntimeError("an env of several blocks is saved block by block: `block(b).state_dict()`")
        return self.block_state_dict(0)

    def load_state_dict(self, state: OrderedDict) -> None:
        if self.blocks != 1:
            raise RuntimeError("an env of several blocks is restored block by block: `block(b).load_state_dict()`")
        self.load_block_state_dict(0, state)

    def block_state_dict(self, b: int) -> OrderedDict:
        """Block ``b``'s :meth:`state_dict`: what an env of its worlds alone would save."""
        rows = self.block_rows(b)
        return OrderedDict(
            qpos=self.sim.qpos[rows].cpu().clone(),
            qvel=self.sim.qvel[rows].cpu().clone(),
            ctrl=self.sim.ctrl[rows].cpu().clone(),
            qacc_warmstart=self._warmstart[rows].cpu().clone(),
            time=self._time[rows].cpu().clone(),
            length=self.length[rows].cpu().clone(),
            position=self._position[rows].cpu().clone(),
            generator=self.generators[b].get_state(),
        )

    def load_block_state_dict(self, b: int, state: OrderedDict) -> None:
        rows = self.block_rows(b)
        if tuple(state["qpos"].shape) != tuple(self.sim.qpos[rows].shape):
            raise ValueError(
                f"the saved envs hold {tuple(state['qpos'].shape)} positions, these {tuple(self.sim.qpos[rows].shape)}"
            )
        self._mask.fill_(False)
        self._mask[rows] = True
        self._set_state(rows, state["qpos"].to(self.device), state["qvel"].to(self.device))
        self.sim.ctrl[rows] = state["ctrl"].to(self.device)
        self._warmstart[rows] = state["qacc_warmstart"].to(self.device)
        self._time[rows] = state["time"].to(self.device)
        self.length[rows] = state["length"].to(self.device)
        self._position[rows] = state["position"].to(self.device)
        self.generators[b].set_state(state["generator"])

    def close(self) -> None:
        pass


class WarpBlock:
    """Block ``b`` of a :class:`WarpVectorEnv`'s worlds as a :class:`~vaco.data.collector_base.VectorEnv`
    of its own for reset and state (one population member's envs). Its worlds step with every
    block's, in one call of the whole env (:class:`~vaco.population.lockstep.Lockstep`), not alone."""

    def __init__(self, env: WarpVectorEnv, b: int) -> None:
        self.shared, self.index = env, b
        self.rows = env.block_rows(b)
        self.device, self.num_envs = env.device, env.block_size
        self.spec, self.dt, self.obs_dim, self.act_dim = env.spec, env.dt, env.obs_dim, env.act_dim
        self.action_low, self.action_high = env.action_low, env.action_high

    def reset(self, seed: int | None = None) -> torch.Tensor:
        return self.shared.reset_block(self.index, seed)

    def step(self, action: torch.Tensor):
        raise RuntimeError(
            "a block's worlds step with the whole env's (vaco.population.lockstep.Lockstep steps every block at once)"
        )

    def state_dict(self) -> OrderedDict:
        return self.shared.block_state_dict(self.index)

    def load_state_dict(self, state: OrderedDict) -> None:
        self.shared.load_block_state_dict(self.index, state)

    def close(self) -> None:
        pass  # the whole env is closed by its owner
