"""Do two checkouts train to the same numbers? Tiny `vaco fit` runs of every algorithm (and a
population of two), the final weights of each hashed bit for bit.

A refactor that must not change numbers is checked by running this once per checkout and comparing
the two JSON files:

    .venv/bin/python benchmarks/same_numbers.py --out /tmp/new.json
    PYTHONPATH=/path/to/old/checkout .venv/bin/python benchmarks/same_numbers.py --out /tmp/old.json
    .venv/bin/python benchmarks/same_numbers.py --compare /tmp/old.json /tmp/new.json

``PYTHONPATH`` makes the `vaco` command import the other checkout's package (an editable install's
finder comes after it); the configs are always this checkout's. Each run is InvertedPendulum-v5 at
2 envs x 64 steps, 6 iterations, 2 epochs x 4 minibatches, K = 3, on the CPU: ~10 s a run.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
ALGOS = ("vaco", "ppo_clip", "ppo_kl", "spo", "impala", "vaco_no_realign")
TINY = [
    "--data.init_args.num_envs", "2",
    "--data.init_args.num_steps", "64",
    "--data.init_args.total_steps", "768",
    "--data.init_args.policy_buffer_size", "3",
    "--data.init_args.eval_every", "3",
    "--data.init_args.eval_episodes", "2",
    "--model.init_args.update_epochs", "2",
    "--model.init_args.num_minibatches", "4",
    "--seed_everything", "3",
    "--checkpoint.every_n_iterations", "3",
]  # fmt: skip


def digest(path: str) -> dict[str, str]:
    """SHA-256 of every tensor of a checkpoint's state_dict (the learner's weights and buffers)."""
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return {k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()[:16] for k, v in sorted(state.items())}


def run(name: str, extra: list[str], work: Path) -> dict[str, dict[str, str]]:
    folder = work / name
    folder.mkdir()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlflow.db", "OMP_NUM_THREADS": "1"}
    vaco = str(Path(sys.executable).with_name("vaco"))
    command = [vaco, "fit", "--config", str(REPO / "configs/env/inverted_pendulum.yaml"), *extra, *TINY]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: vaco fit exited {done.returncode}:\n{done.stderr[-3000:]}")
    found = sorted(glob.glob(str(folder / "checkpoints/*/last.ckpt")))
    return {Path(p).parent.name[:8] + f"#{i}": digest(p) for i, p in enumerate(found)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the digests here (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two outputs of --out")
    args = parser.parse_args()
    if args.compare:
        old, new = (json.loads(Path(p).read_text()) for p in args.compare)
        same = True
        for name in old:
            # run ids differ between stores: compare the members in order
            a, b = list(old[name].values()), list(new.get(name, {}).values())
            ok = a == b
            same &= ok
            print(
                f"{name:28s} {'same bits' if ok else 'DIFFERENT'} ({len(a)} checkpoint(s), {len(a[0]) if a else 0} tensors)"
            )
        raise SystemExit(0 if same else 1)
    import vaco

    print(f"vaco from {Path(vaco.__file__).parent}", flush=True)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algo in ALGOS:
            out[algo] = run(algo, ["--config", str(REPO / f"configs/algo/{algo}.yaml")], Path(tmp))
            print(algo, "done", flush=True)
        for algo in ("vaco", "ppo_kl", "impala"):
            name = f"population2_{algo}"
            extra = ["--config", str(REPO / f"configs/algo/{algo}.yaml"), "--population", "2"]
            out[name] = run(name, extra, Path(tmp))
            print(name, "done", flush=True)
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
