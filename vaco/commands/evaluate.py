"""``vaco evaluate --ckpt PATH``: run a saved policy for E episodes, optionally write a video.

An LLM checkpoint (the ``RLVRModule`` of ``configs/llm/``) is scored on its run's test split
instead: greedy accuracy (the run's ``eval/accuracy``) and, with ``--samples k``, pass@k."""

from __future__ import annotations

import argparse
import os
import re
import sys

# torch, MuJoCo and the networks are imported inside the functions: `vaco evaluate --help` and a
# bad argument answer at once

__all__ = ["load_policy", "main"]


class _OneLineParser(argparse.ArgumentParser):
    """A bad argument is one line (``vaco evaluate: error: ...``), not the usage screen before it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def _member(text: str) -> int:
    """``--member``: a member's index (0, 1, ...); anything else is argparse's one-line error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a member's index (0, 1, ...), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a member's index (0, 1, ...), got {value}")
    return value


def load_policy(ckpt_path: str, member: int | None = None):
    """The learner of a checkpoint as ``(env_id, policy)``; ``policy`` maps raw obs to (loc, scale).
    A population's checkpoint (``vaco fit --population``) holds its members' learners: ``member``
    picks one (required there, refused elsewhere)."""
    from vaco.data.episodes import learner_policy
    from vaco.data.normalization import RunningMeanStd
    from vaco.learners.networks import GaussianActor
    from vaco.run.checkpoint import CheckpointError, load_checkpoint

    ckpt = load_checkpoint(ckpt_path, field="--ckpt")  # weights_only: never runs code from the file
    hparams = ckpt.get("hyper_parameters", {})
    spec = hparams.get("env_spec")
    if spec is None:
        raise CheckpointError(f"`--ckpt`: {ckpt_path} is not a vaco MuJoCo checkpoint (no env_spec)")
    actor = GaussianActor(spec["obs_dim"], spec["act_dim"], tuple(hparams.get("hidden_sizes", (64, 64))))
    state = ckpt["state_dict"]
    seeds = ckpt.get("vaco", {}).get("population_seeds")
    if seeds:
        if member is None:
            raise CheckpointError(
                f"`--ckpt`: {ckpt_path} is a population of {len(seeds)} members (seeds {seeds}); pass --member M "
                f"(0..{len(seeds) - 1}) to play one"
            )
        if not 0 <= member < len(seeds):
            raise CheckpointError(f"`--member` ({member}) must be in 0..{len(seeds) - 1} (the population's members)")
        prefix = f"members.{member}."
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    elif member is not None:
        raise CheckpointError(f"`--member`: {ckpt_path} is a single run, not a population; leave --member out")
    _load(actor, state, "actor.", ckpt_path)
    actor.eval()
    if hparams.get("normalize_observation", True):
        rms = RunningMeanStd(spec["obs_dim"])
        _load(rms, state, "obs_rms.", ckpt_path)
        return spec["env_id"], learner_policy(actor, rms.mean, rms.var)
    return spec["env_id"], actor


def _load(module, state: dict, prefix: str, ckpt_path: str) -> None:
    """``module``'s weights from the checkpoint's ``prefix`` entries; weights that do not fit the
    network its hyperparameters describe (an edited file, another version's) are one line naming
    the file and the first mismatch, not torch's traceback."""
    from vaco.run.checkpoint import CheckpointError

    try:
        module.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    except RuntimeError as err:
        details = [line.strip().rstrip(".") for line in str(err).splitlines()[1:] if line.strip()]
        first = details[0] if details else str(err).splitlines()[0]
        size = re.match(
            r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[.*?\])\) from "
            r"checkpoint, the shape in current model is torch\.Size\((\[.*?\])\)",
            first,
        )
        if size:
            first = f"`{prefix}{size[1]}` is {size[2]} in the file, {size[3]} in the network"
        raise CheckpointError(
            f"`--ckpt`: {ckpt_path}'s weights do not fit the network its hyperparameters describe "
            f"({first}); the file was changed after it was written, or by another vaco version"
        ) from None


VIDEO_FORMATS = (".mp4", ".gif")


def check_video_writer(path: str) -> None:
    """Raise ``ValueError`` unless a writer for ``path``'s extension is installed (before rendering)."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in VIDEO_FORMATS:
        raise ValueError(f"`--video`: {path!r} must end in .mp4 or .gif")
    try:
        import imageio.v2  # noqa: F401
    except ImportError:
        raise ValueError("`--video` needs imageio: pip install -e '.[video]'") from None
    if ext == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise ValueError(
                f"`--video`: writing {path!r} needs ffmpeg: pip install -e '.[video]' (or write a .gif)"
            ) from None


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="vaco evaluate", description=__doc__)
    parser.add_argument(
        "--ckpt",
        required=True,
        help="a checkpoint written by `vaco fit` (loaded safely: tensors and plain values only)",
    )
    parser.add_argument(
        "--member",
        type=_member,
        default=None,
        help="a population's checkpoint (vaco fit --population): the member to play",
    )
    parser.add_argument("--episodes", type=int, default=10, help="episodes to run (E)")
    parser.add_argument("--envs", type=int, default=10, help="envs run side by side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true", help="act with the Gaussian's mean")
    parser.add_argument("--video", default=None, help="write one episode to this .mp4 or .gif")
    parser.add_argument(
        "--backend",
        choices=("gymnasium", "warp"),
        default="gymnasium",
        help="simulate on gymnasium (MuJoCo C) or on MuJoCo Warp (the video is drawn from the Warp state)",
    )
    parser.add_argument("--device", default="cpu", help="warp: the Warp device (cpu, cuda); LLM: the torch device")
    llm = parser.add_argument_group("LLM checkpoints (configs/llm/)")
    llm.add_argument("--samples", type=int, default=0, help="k: also sample k completions per prompt, report pass@k")
    llm.add_argument("--temperature", type=float, default=1.0, help="the sampling temperature of --samples")
    llm.add_argument("--num-eval", type=int, default=None, help="score the first N test prompts (default: the run's)")
    llm.add_argument("--test-path", default=None, help="another GSM8k-format test file (default: the run's)")
    llm.add_argument("--batch-size", type=int, default=None, help="prompts decoded at once (default: the run's)")
    llm.add_argument(
        "--reward",
        default=None,
        help="the run's own reward class (module.Class, imported from here); default: the run's, if vaco ships it",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("`--episodes` must be >= 1")
    for name in ("samples", "num_eval", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "samples" else 1):
            parser.error(f"`--{name.replace('_', '-')}` must be >= {0 if name == 'samples' else 1}")
    if not args.temperature > 0:
        parser.error("`--temperature` must be > 0")
    try:
        if args.video:  # before anything is loaded: a missing writer costs nothing
            check_video_writer(args.video)
        from vaco.run.checkpoint import is_llm_checkpoint, load_checkpoint

        ckpt = load_checkpoint(args.ckpt, field="--ckpt")  # weights_only: never runs code from the file
        if is_llm_checkpoint(ckpt):
            return _evaluate_llm(ckpt, args)
    except (ValueError, OSError, ImportError) as err:  # CheckpointError is a ValueError
        print(f"vaco evaluate: error: {err}", file=sys.stderr)
        return 2
    try:
        import torch

        torch.set_num_threads(1)
        env_id, policy = load_policy(args.ckpt, args.member)
        if args.backend == "warp":
            from vaco.data.warp.env import check_worlds

            check_worlds(env_id, min(args.envs, args.episodes), args.device, field="--envs")
    except (ValueError, ImportError) as err:  # CheckpointError is a ValueError
        print(f"vaco evaluate: error: {err}", file=sys.stderr)
        return 2
    from vaco.data.episodes import episode_returns

    num_envs = min(args.envs, args.episodes)
    seeds = ckpt.get("vaco", {}).get("population_seeds")
    who = f" member {args.member} (seed {seeds[args.member]})" if seeds else ""
    print(f"evaluating {env_id}{who}: {args.episodes} episodes on {num_envs} envs ...", flush=True)
    if args.backend == "warp":
        from vaco.data.warp.env import WarpVectorEnv

        env = WarpVectorEnv(env_id, num_envs, device=args.device, seed=args.seed)
    else:
        from vaco.data.collector import GymnasiumEnvs

        env = GymnasiumEnvs(env_id, num_envs)
    try:
        returns = episode_returns(env, policy, args.episodes, seed=args.seed, deterministic=args.deterministic)
    finally:
        env.close()
    where = f" on MuJoCo Warp ({args.device})" if args.backend == "warp" else ""
    print(
        f"{env_id}{where}: return {returns.mean():.1f} +- {returns.std():.1f} "
        f"(min {returns.min():.1f}, max {returns.max():.1f}) over {len(returns)} episodes"
    )
    if args.video:
        _write_video(args, env_id, policy)
    return 0


def _evaluate_llm(ckpt: dict, args) -> int:
    """Score an LLM checkpoint on its run's test split; one line per figure."""
    import torch

    try:
        from vaco.llm.evaluation import evaluate_checkpoint
    except ImportError as err:
        raise ImportError(
            f"--ckpt is an LLM checkpoint; scoring it needs the llm extra ({err.name or err} is missing): "
            "pip install -e '.[llm]'"
        ) from None

    torch.set_num_threads(1)
    if args.video or args.backend != "gymnasium":
        raise ValueError("`--video` and `--backend` are for MuJoCo checkpoints; this is an LLM checkpoint")
    hparams = ckpt["hyper_parameters"]
    print(f"evaluating {hparams['model_path']} with the checkpoint's weights on its test split ...", flush=True)
    settings = ("samples", "temperature", "test_path", "num_eval", "batch_size", "device", "seed", "reward")
    out = evaluate_checkpoint(ckpt, **{name: getattr(args, name) for name in settings})
    n = int(out["prompts"])
    print(
        f"greedy accuracy {out['eval/accuracy']:.3f} on {n} prompts (mean length {out['eval/completion_length']:.1f} tokens)"
    )
    if args.samples:
        k = args.samples
        print(
            f"pass@{k} {out[f'eval/pass@{k}']:.3f}, mean accuracy of the {k} samples {out['eval/sample_accuracy']:.3f} "
            f"(temperature {args.temperature:g}, seed {args.seed})"
        )
    return 0


def _write_video(args, env_id: str, policy) -> None:
    """One episode rendered offscreen into ``args.video`` (a renderer failure is one line, not an error)."""
    backend = os.environ.setdefault("MUJOCO_GL", "egl")
    print(
        f"recording one episode for {args.video} (MUJOCO_GL={backend}; up to 1000 frames, a progress line every 100)",
        flush=True,
    )
    try:
        if args.backend == "warp":
            from vaco.data.warp import record_warp_episode

            frames = record_warp_episode(env_id, policy, args.seed, args.deterministic, args.device)
        else:
            frames = _record(env_id, policy, args.seed, args.deterministic, on_frame=_frame_progress)
    except Exception as err:  # noqa: BLE001 - report any renderer failure plainly
        print(
            f"no video: offscreen rendering is unavailable here (MUJOCO_GL={backend}): "
            f"{type(err).__name__}: {err}. Install an EGL or OSMesa driver and set MUJOCO_GL=egl or osmesa.",
            file=sys.stderr,
        )
        return
    import imageio.v2 as imageio

    print(f"  {len(frames)} frames rendered; encoding {args.video} ...", flush=True)

    imageio.mimsave(args.video, frames, fps=30) if args.video.endswith(".gif") else imageio.mimwrite(
        args.video, frames, fps=30
    )
    print(f"wrote {len(frames)} frames to {args.video} ({backend})")


def _frame_progress(count: int) -> None:
    if count % 100 == 0:
        print(f"  frame {count}", flush=True)


def _record(env_id: str, policy, seed: int, deterministic: bool, max_frames: int = 1000, on_frame=None) -> list:
    import gymnasium as gym
    import numpy as np
    import torch

    from vaco.data.envs import quiet_known_mujoco_warnings

    quiet_known_mujoco_warnings()
    env = gym.make(env_id, render_mode="rgb_array")
    try:
        obs, _ = env.reset(seed=seed)
        generator = torch.Generator().manual_seed(seed)
        frames = [env.render()]
        low, high = env.action_space.low, env.action_space.high
        for _ in range(max_frames):
            with torch.no_grad():
                loc, scale = policy(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0))
            action = loc if deterministic else loc + scale * torch.randn(loc.shape, generator=generator)
            obs, _, term, trunc, _ = env.step(np.clip(action.squeeze(0).numpy(), low, high))
            frames.append(env.render())
            if on_frame is not None:
                on_frame(len(frames) - 1)
            if term or trunc:
                break
        return frames
    finally:
        env.close()
