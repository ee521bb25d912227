"""How long the paper's LLM grid would take on one machine: a projection from measured figures.

Nothing here is a measurement. The script multiplies out what one cell of
``configs/sweeps/llm_gsm8k.yaml`` does (its config read from the sweep's own files) by figures
measured on the machine in question, each given with its source:

    python scripts/llm_projection.py --inputs figures.json [--sweep configs/sweeps/llm_gsm8k.yaml]

``figures.json`` holds one entry per figure, ``{"value": <number>, "source": "<command, machine, date>"}``:

- ``decode_tokens_per_second``: kept completion tokens per second while generating a generation
  batch (``benchmarks/llm_decoding.py``'s ``decoders.<decoder>.tokens_per_second`` for the run's
  ``model.decoder``, at its ``--slots``);
- ``completion_tokens``: the mean completion length in tokens (a run's ``train/completion_length``);
- ``update_seconds_per_step``: one optimiser step on a minibatch, its forward and backward
  (a run's ``perf/update_seconds`` over its steps; re-scoring and the filter's pass are not in it);
- ``rescore_seconds_per_step``: the no-grad training forward that re-scores one minibatch's
  completions as the behaviour log-probs (``model.rescore_behavior``, on by default; in a run it
  is timed with generation, ``perf/generation_seconds``);
- ``tv_pass_seconds_per_step``: the no-grad pass over a minibatch that measures its TV before a
  micro-batched backward: only an objective that tests the whole minibatch (VACO-GRPO's filter,
  ``needs_minibatch_tv``) with ``model.micro_batch_size`` below the minibatch's sequences pays it;
- ``eval_tokens_per_second`` and ``eval_completion_tokens``: the same for the greedy evaluation;
- ``checkpoint_gb`` and ``checkpoint_write_gb_per_second``: a checkpoint's size and how fast the
  run's disk writes it;
- ``startup_seconds``: a cell's start (imports, model load; ``perf/startup_seconds``).

Per cell (N minibatches per generation batch, ``num_steps`` optimiser steps of ``P`` prompts x ``G``
completions): every step's completions are generated once, whatever N (``num_steps * P * G``
completions); ``num_steps / N`` generation batches, a checkpoint every ``every_n_iterations`` of
them and at the end; an evaluation at the start, then after each generation batch that passes a
multiple of ``eval_every`` steps or ends the run, of ``test_size`` prompts; every minibatch
re-scored once (when ``rescore_behavior``) and, for an algorithm that needs it, measured once more.
The result prints per algorithm and N, and for the grid run one cell at a time, marked projected.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

FIGURES = (
    "decode_tokens_per_second",
    "completion_tokens",
    "update_seconds_per_step",
    "rescore_seconds_per_step",
    "tv_pass_seconds_per_step",
    "eval_tokens_per_second",
    "eval_completion_tokens",
    "checkpoint_gb",
    "checkpoint_write_gb_per_second",
    "startup_seconds",
)
GSM8K_TEST = 1319  # problems in GSM8k's test split (the evaluation's prompts)


@dataclass(frozen=True)
class Cell:
    """What one run of the grid does (from its config)."""

    num_steps: int
    prompts_per_minibatch: int
    completions_per_prompt: int
    eval_every: int
    checkpoint_every: int
    rescore: bool = True
    micro_batched: bool = False
    test_size: int = GSM8K_TEST


def cell_seconds(cell: Cell, n: int, figures: dict[str, float], tv_pass: bool = False) -> dict[str, float]:
    """The projected seconds of one cell with ``n`` minibatches per generation batch, by part;
    ``tv_pass``: the algorithm measures a micro-batched minibatch's TV in a pass of its own."""
    completions = cell.num_steps * cell.prompts_per_minibatch * cell.completions_per_prompt
    generation_batches = math.ceil(cell.num_steps / n)
    # vaco.llm.RLVRModule: the supervised start at step 0, then after each generation batch that
    # passes a multiple of eval_every or ends the run
    evaluations = 1 + sum(
        1
        for b in range(1, generation_batches + 1)
        if b * n >= cell.num_steps or (cell.eval_every and (b * n) // cell.eval_every > (b * n - n) // cell.eval_every)
    )
    checkpoints = generation_batches // cell.checkpoint_every + (generation_batches % cell.checkpoint_every != 0)
    return {
        "generation": completions * figures["completion_tokens"] / figures["decode_tokens_per_second"],
        "update": cell.num_steps * figures["update_seconds_per_step"],
        "rescore": cell.num_steps * figures["rescore_seconds_per_step"] if cell.rescore else 0.0,
        "tv pass": cell.num_steps * figures["tv_pass_seconds_per_step"] if tv_pass and cell.micro_batched else 0.0,
        "evaluation": evaluations
        * cell.test_size
        * figures["eval_completion_tokens"]
        / figures["eval_tokens_per_second"],
        "checkpoints": checkpoints * figures["checkpoint_gb"] / figures["checkpoint_write_gb_per_second"],
        "startup": figures["startup_seconds"],
    }


def read_figures(path: Path) -> tuple[dict[str, float], dict[str, str]]:
    """The figures and their sources; a missing or unsourced one is refused in one line."""
    raw = json.loads(path.read_text())
    values, sources = {}, {}
    for name in FIGURES:
        entry = raw.get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("value"), (int, float)) or entry["value"] <= 0:
            raise SystemExit(f'--inputs: `{name}` must be {{"value": <a positive number>, "source": "..."}}')
        if not str(entry.get("source", "")).strip():
            raise SystemExit(f"--inputs: `{name}` has no source: say which command, machine and date measured it")
        values[name], sources[name] = float(entry["value"]), str(entry["source"])
    return values, sources


def needs_tv_pass(sweep_path: Path, sweep: dict, algorithm: str) -> bool:
    """Whether ``algorithm``'s objective tests the whole minibatch (its config's class)."""
    import importlib

    import yaml

    config = yaml.safe_load((sweep_path.parent / sweep["configs_dir"] / "algo" / f"{algorithm}.yaml").read_text())
    module, _, name = config["model"]["init_args"]["objective"]["class_path"].rpartition(".")
    objective = getattr(importlib.import_module(module), name)
    init = config["model"]["init_args"]["objective"].get("init_args", {})
    return bool(objective(**init).needs_minibatch_tv)


def grid_of(sweep_path: Path) -> tuple[Cell, list[int], dict[str, bool], int]:
    """The cell's sizes, the N axis, each algorithm's TV pass and the cells per (algorithm, N)."""
    import yaml

    sweep = yaml.safe_load(sweep_path.read_text())
    env = yaml.safe_load(
        (sweep_path.parent / sweep["configs_dir"] / "env" / f"{sweep['defaults']['env']}.yaml").read_text()
    )
    data, model = env["data"]["init_args"], env["model"]["init_args"]
    cell = Cell(
        num_steps=data["num_steps"],
        prompts_per_minibatch=data["prompts_per_minibatch"],
        completions_per_prompt=model["completions_per_prompt"],
        eval_every=data["eval_every"],
        checkpoint_every=env["checkpoint"]["every_n_iterations"],
        rescore=model.get("rescore_behavior", True),
        micro_batched=(model.get("micro_batch_size") or math.inf)
        < data["prompts_per_minibatch"] * model["completions_per_prompt"],
    )
    algorithms = sweep["grid"]["main"]["algorithm"]
    algorithms = algorithms if isinstance(algorithms, list) else [algorithms]
    passes = {a: needs_tv_pass(sweep_path, sweep, a) for a in algorithms}
    return cell, list(sweep["defaults"]["K"]), passes, len(sweep["defaults"]["seed"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", required=True, type=Path, help="the measured figures (JSON, see above)")
    parser.add_argument("--sweep", type=Path, default=Path("configs/sweeps/llm_gsm8k.yaml"))
    args = parser.parse_args(argv)
    figures, sources = read_figures(args.inputs)
    cell, ns, passes, seeds = grid_of(args.sweep)
    print(f"PROJECTED (not measured): {args.sweep}, {seeds} seeds per (algorithm, N), one cell at a time, from:")
    for name in FIGURES:
        print(f"  {name} = {figures[name]:g}  ({sources[name]})")
    total = 0.0
    for algorithm, tv_pass in passes.items():
        for n in ns:
            parts = cell_seconds(cell, n, figures, tv_pass)
            seconds = sum(parts.values())
            total += seeds * seconds
            shares = ", ".join(f"{k} {v / seconds:.0%}" for k, v in parts.items() if v)
            print(f"  {algorithm} N = {n:>2}: {seconds / 3600:.2f} h a cell ({shares})")
    print(f"the grid: {total / 3600:.1f} h ({total / 86400:.2f} days) projected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
