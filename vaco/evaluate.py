"""``vaco evaluate --ckpt PATH``: run a saved policy for E episodes, optionally write a video."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

from vaco.data.module import learner_policy, run_episodes
from vaco.data.normalization import RunningMeanStd
from vaco.networks import GaussianActor

__all__ = ["load_policy", "main"]


def load_policy(ckpt_path: str):
    """The learner of a checkpoint as ``(env_id, policy)``; ``policy`` maps raw obs to (loc, scale)."""
    if not os.path.isfile(ckpt_path):
        raise FileNotFoundError(f"`--ckpt`: no checkpoint at {ckpt_path}")
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    hparams = ckpt.get("hyper_parameters", {})
    spec = hparams.get("env_spec")
    if spec is None:
        raise ValueError(f"`--ckpt`: {ckpt_path} is not a vaco MuJoCo checkpoint (no env_spec)")
    actor = GaussianActor(spec["obs_dim"], spec["act_dim"], tuple(hparams.get("hidden_sizes", (64, 64))))
    state = ckpt["state_dict"]
    actor.load_state_dict({k[len("actor."):]: v for k, v in state.items() if k.startswith("actor.")})
    actor.eval()
    if hparams.get("normalize_observation", True):
        rms = RunningMeanStd(spec["obs_dim"])
        rms.load_state_dict({k[len("obs_rms."):]: v for k, v in state.items() if k.startswith("obs_rms.")})
        return spec["env_id"], learner_policy(actor, rms.mean, rms.var)
    return spec["env_id"], actor


def _video_writer(path: str):
    """A frame recorder, or a clear reason why none is available here."""
    backend = os.environ.get("MUJOCO_GL")
    if backend is None:
        os.environ["MUJOCO_GL"] = backend = "egl"
    try:
        import imageio.v2 as imageio  # noqa: F401
    except ImportError as err:
        raise RuntimeError("--video needs imageio: pip install 'vaco[video]'") from err
    return backend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vaco evaluate", description=__doc__)
    parser.add_argument("--ckpt", required=True, help="a checkpoint written by `vaco fit`")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to run (E)")
    parser.add_argument("--envs", type=int, default=10, help="envs run side by side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true", help="act with the Gaussian's mean")
    parser.add_argument("--video", default=None, help="write one episode to this .mp4 or .gif")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("`--episodes` must be >= 1")
    torch.set_num_threads(1)
    env_id, policy = load_policy(args.ckpt)
    returns = run_episodes(env_id, policy, args.episodes, num_envs=args.envs, seed=args.seed, deterministic=args.deterministic)
    print(
        f"{env_id}: return {returns.mean():.1f} +- {returns.std():.1f} "
        f"(min {returns.min():.1f}, max {returns.max():.1f}) over {len(returns)} episodes"
    )
    if args.video:
        try:
            backend = _video_writer(args.video)
            frames = _record(env_id, policy, args.seed, args.deterministic)
        except Exception as err:  # noqa: BLE001 - report any renderer failure plainly
            print(
                f"no video: offscreen rendering is unavailable here (MUJOCO_GL={os.environ.get('MUJOCO_GL')}): "
                f"{type(err).__name__}: {err}. Install an EGL or OSMesa driver and set MUJOCO_GL=egl or osmesa.",
                file=sys.stderr,
            )
            return 0
        import imageio.v2 as imageio

        imageio.mimsave(args.video, frames, fps=30) if args.video.endswith(".gif") else imageio.mimwrite(args.video, frames, fps=30)
        print(f"wrote {len(frames)} frames to {args.video} ({backend})")
    return 0


@torch.no_grad()
def _record(env_id: str, policy, seed: int, deterministic: bool, max_frames: int = 1000) -> list[np.ndarray]:
    import gymnasium as gym

    env = gym.make(env_id, render_mode="rgb_array")
    try:
        obs, _ = env.reset(seed=seed)
        generator = torch.Generator().manual_seed(seed)
        frames = [env.render()]
        low, high = env.action_space.low, env.action_space.high
        for _ in range(max_frames):
            loc, scale = policy(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0))
            action = loc if deterministic else loc + scale * torch.randn(loc.shape, generator=generator)
            obs, _, term, trunc, _ = env.step(np.clip(action.squeeze(0).numpy(), low, high))
            frames.append(env.render())
            if term or trunc:
                break
        return frames
    finally:
        env.close()
