"""Run the LLM track's CPU grid: GRPO and VACO-GRPO x N in {1, 4, 16} x 3 seeds, one run at a time.

Every run is a plain `vaco fit` in a subprocess (niced, one torch thread), logged to MLflow
experiment `vaco-llm-cpu` of the store $MLFLOW_TRACKING_URI (default sqlite:///mlflow.db). Runs already FINISHED in that experiment are skipped, so an
interrupted grid can simply be restarted. Then `python scripts/llm_report.py` makes the table.

    python scripts/llm_prepare.py && python scripts/llm_grid.py
    python scripts/llm_grid.py --experiment vaco-llm-cpu-lr3e-4 -- --model.init_args.lr 3e-4
    python scripts/llm_grid.py --num-minibatches 1 4 --seeds 1 --dry-run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

CONFIGS = {"grpo": "configs/llm/grpo.yaml", "vaco_grpo": "configs/llm/vaco_grpo.yaml"}
EXPERIMENT = "vaco-llm-cpu"


def finished_runs(experiment: str) -> set[tuple[str, int, int]]:
    """(algorithm, N, seed) of the FINISHED runs already in the tracking store."""
    import mlflow

    from vaco.tracking import tracking_uri

    client = mlflow.MlflowClient(tracking_uri=tracking_uri())
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return set()
    runs = client.search_runs([found.experiment_id], filter_string="attributes.status = 'FINISHED'", max_results=10_000)
    return {
        (r.data.params["algorithm"], int(r.data.params["N"]), int(r.data.params["seed"]))
        for r in runs
        if {"algorithm", "N", "seed"} <= set(r.data.params)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--num-minibatches", nargs="+", type=int, default=[1, 4, 16], help="the values of N")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--config", default="configs/llm/cpu.yaml")
    parser.add_argument("--experiment", default=EXPERIMENT, help="MLflow experiment of the grid")
    parser.add_argument("--root", default="runs/llm/grid", help="trainer.default_root_dir (checkpoints, logs)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("extra", nargs="*", help="more `vaco fit` arguments, after --")
    args = parser.parse_args(argv)

    done = set() if args.dry_run else finished_runs(args.experiment)
    vaco = os.path.join(os.path.dirname(sys.executable), "vaco")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    logs = os.path.join(args.root, args.experiment)
    if not args.dry_run:
        os.makedirs(logs, exist_ok=True)
    for seed in args.seeds:  # seed-major: a partial grid is balanced across algorithms and N
        for n in args.num_minibatches:
            for algorithm in args.algorithms:
                name = f"{algorithm}-N{n}-s{seed}"
                if (algorithm, n, seed) in done:
                    print(f"skip {name}: finished", flush=True)
                    continue
                command = [
                    "nice", "-n", "10", vaco, "fit", "--config", args.config, "--config", CONFIGS[algorithm],
                    "--model.init_args.num_minibatches", str(n), "--seed_everything", str(seed),
                    "--trainer.logger.init_args.experiment_name", args.experiment,
                    "--trainer.logger.init_args.run_name", name,
                    "--trainer.default_root_dir", args.root, "--progress_bar.refresh_rate", "0", *args.extra,
                ]
                print(" ".join(command), flush=True)
                if args.dry_run:
                    continue
                start = time.perf_counter()
                with open(os.path.join(logs, f"{name}.log"), "w") as log:
                    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
                print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
