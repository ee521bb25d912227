"""How closely the MuJoCo Warp backend agrees with gymnasium's v5 envs (MuJoCo C), task by task.

1. One step from the same states and actions: the largest difference in qpos, qvel, observation
   and reward, from reset states and from states with floor contacts, with the XML's friction
   cones and with elliptic cones in both engines (Humanoid: Newton in both, as Warp has no PGS).
2. In distribution: a fixed controller (damping on the actuated joints; a balancing rule for the
   pendulum) run for ``--episodes`` episodes per engine from each engine's own reset noise;
   episode returns and lengths with a two-sample Kolmogorov-Smirnov p-value.

    python benchmarks/warp_agreement.py [--episodes 32] [--tasks Hopper-v5 Ant-v5] [--out benchmarks/results/warp_agreement.json]

Prints a Markdown table (docs/gpu.md has the one measured here) and writes JSON. On Warp's CPU
device the in-distribution part takes minutes (HalfCheetah and Ant run 1,000-step episodes).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
import torch
from scipy import stats

from vaco.data.warp.env import WarpVectorEnv
from vaco.data.warp.tasks import TASKS


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


# where each task's actuated joint velocities sit in its observation (the controller damps them)
ACTUATED_QVEL = {
    "Hopper-v5": slice(8, 11),
    "Walker2d-v5": slice(11, 17),
    "HalfCheetah-v5": slice(11, 17),
    "Ant-v5": slice(19, 27),
    "Humanoid-v5": slice(28, 45),
}


def controller(env_id: str):
    if env_id == "InvertedPendulum-v5":  # push the cart under the pole
        return lambda obs: (2.0 * obs[..., 1:2] + 0.3 * obs[..., 3:4]).clamp(-3.0, 3.0)
    s = ACTUATED_QVEL[env_id]
    high = 0.4 if env_id == "Humanoid-v5" else 1.0
    return lambda obs: (-0.3 * obs[..., s]).clamp(-high, high)


def gym_env(env_id: str, cone: str | None):
    env = gym.make(env_id).unwrapped
    if cone == "elliptic":
        env.model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
        env.model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    return env


def one_step(env_id: str, cone: str | None, contact: bool, n: int = 8) -> dict:
    rng = np.random.default_rng(0)
    g = gym_env(env_id, cone)
    states = []
    for k in range(n):
        g.reset(seed=k)
        for _ in range(200 if contact else 0):
            _, _, terminated, _, _ = g.step(rng.uniform(g.action_space.low, g.action_space.high))
            if terminated:
                g.reset(seed=100 + k)
            elif g.data.ncon > 0:
                break
        states.append((g.data.qpos.copy(), g.data.qvel.copy(), g.data.ncon))
    w = WarpVectorEnv(env_id, n, seed=0, cone=cone)
    qpos = torch.tensor(np.stack([s[0] for s in states]), dtype=torch.float32)
    qvel = torch.tensor(np.stack([s[1] for s in states]), dtype=torch.float32)
    actions = torch.as_tensor(
        rng.uniform(g.action_space.low, g.action_space.high, (n, g.action_space.shape[0])), dtype=torch.float32
    )
    w.set_state(qpos, qvel)
    _, reward, _, _, final = w.step(actions)
    w.set_state(qpos, qvel)  # again, for the integrated state before any reset
    w.sim.ctrl.copy_(actions)
    with w._wp.ScopedDevice(w._wp_device):
        for _ in range(w.spec.frame_skip):
            w._mjw.step(w.model, w.data)
    out = {"qpos": 0.0, "qvel": 0.0, "obs": 0.0, "reward": 0.0, "contacts": int(sum(s[2] > 0 for s in states))}
    for k in range(n):
        g.set_state(qpos[k].double().numpy(), qvel[k].double().numpy())
        obs, r, *_ = g.step(actions[k].numpy())
        out["qpos"] = max(out["qpos"], float(np.abs(w.sim.qpos[k].numpy() - g.data.qpos).max()))
        out["qvel"] = max(out["qvel"], float(np.abs(w.sim.qvel[k].numpy() - g.data.qvel).max()))
        out["obs"] = max(out["obs"], float(np.abs(final[k].numpy() - obs).max()))
        out["reward"] = max(out["reward"], abs(float(reward[k]) - r))
    return out


def episodes_warp(env_id: str, n: int, cone: str | None, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    act = controller(env_id)
    env = WarpVectorEnv(env_id, n, seed=seed, cone=cone)
    obs = env.reset(seed=seed)
    returns, lengths = torch.zeros(n, dtype=torch.float64), torch.zeros(n)
    finished = torch.zeros(n, dtype=torch.bool)
    for _ in range(1000):
        action = torch.maximum(torch.minimum(act(obs), env.action_high), env.action_low)
        obs, reward, term, trunc, _ = env.step(action)
        alive = ~finished
        returns += reward.double() * alive
        lengths += alive.float()
        finished |= term | trunc
        if bool(finished.all()):
            break
    return returns.numpy(), lengths.numpy()


def episodes_gym(env_id: str, n: int, cone: str | None) -> tuple[np.ndarray, np.ndarray]:
    act = controller(env_id)
    g = gym_env(env_id, cone)
    low, high = g.action_space.low, g.action_space.high
    returns, lengths = [], []
    for episode in range(n):
        obs, _ = g.reset(seed=1000 + episode)
        total, length = 0.0, 0
        while length < 1000:
            action = np.clip(act(torch.as_tensor(obs, dtype=torch.float32)).numpy(), low, high)
            obs, r, terminated, _, _ = g.step(action)
            total, length = total + r, length + 1
            if terminated:
                break
        returns.append(total)
        lengths.append(length)
    return np.asarray(returns), np.asarray(lengths, dtype=np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--out", default="benchmarks/results/warp_agreement.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {
        "machine": f"{_cpu_name()}, {torch.get_num_threads()} torch thread, Warp CPU device",
        "episodes": args.episodes,
        "tasks": {},
    }
    print(
        "| task | cones | one step from reset: qpos / qvel / obs / reward | from contact states (n with contact) | returns Warp | returns C | KS p (returns, lengths) |"
    )
    print("|---|---|---|---|---|---|---|")
    for env_id in args.tasks:
        cones = [None, "elliptic"] if env_id in ("Ant-v5", "Humanoid-v5") else [None]
        for cone in cones:
            start = time.perf_counter()
            reset, contact = one_step(env_id, cone, False), one_step(env_id, cone, True)
            rw, lw = episodes_warp(env_id, args.episodes, cone)
            rg, lg = episodes_gym(env_id, args.episodes, cone)
            p_ret, p_len = stats.ks_2samp(rw, rg).pvalue, stats.ks_2samp(lw, lg).pvalue
            row = dict(
                reset=reset,
                contact=contact,
                warp=dict(ret_mean=rw.mean(), ret_std=rw.std(), len_mean=lw.mean()),
                gym=dict(ret_mean=rg.mean(), ret_std=rg.std(), len_mean=lg.mean()),
                ks_returns=p_ret,
                ks_lengths=p_len,
                seconds=time.perf_counter() - start,
            )
            results["tasks"][f"{env_id}:{cone or 'xml'}"] = json.loads(json.dumps(row, default=float))
            f = lambda d: f"{d['qpos']:.1e} / {d['qvel']:.1e} / {d['obs']:.1e} / {d['reward']:.1e}"  # noqa: E731
            print(
                f"| {env_id} | {cone or 'XML (pyramidal)'} | {f(reset)} | {f(contact)} ({contact['contacts']}) | "
                f"{rw.mean():.1f} +- {rw.std():.1f} (len {lw.mean():.0f}) | {rg.mean():.1f} +- {rg.std():.1f} (len {lg.mean():.0f}) | "
                f"{p_ret:.2f}, {p_len:.2f} |",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1, default=float))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
