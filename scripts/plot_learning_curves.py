"""Learning curves of one MLflow experiment: eval/return against env steps, one line per seed.

    python scripts/plot_learning_curves.py --experiment cleanrl-hopper --out docs/figures/hopper_ppo_clip.png

Prints the final return of each run and the mean over seeds (the table in docs/results.md).
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from vaco.report import load_runs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--uri", default=None, help="tracking URI (default: MLFLOW_TRACKING_URI or sqlite:///mlflow.db)"
    )
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    runs, notes = load_runs(args.experiment, args.uri)
    for note in notes:
        print("note:", note)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    finals, grid, curves = [], None, []
    for run in sorted(runs, key=lambda r: (r.algorithm, r.K, r.seed)):
        steps, values = run.history("eval/return")
        ax.plot(steps, values, alpha=0.5, lw=1, label=f"{run.algorithm} K={run.K} seed {run.seed}")
        finals.append(values[-1])
        grid = steps if grid is None else grid
        if len(steps) == len(grid):
            curves.append(values)
        print(
            f"{run.algorithm} {run.env} K={run.K} seed={run.seed}: final eval/return {values[-1]:.0f}, "
            f"mean of last 5 evaluations {values[-5:].mean():.0f}"
        )
    if curves:
        ax.plot(grid, np.mean(curves, axis=0), color="black", lw=2, label="mean over seeds")
    print(
        f"mean final eval/return over {len(finals)} runs: {np.mean(finals):.0f} (min {np.min(finals):.0f}, max {np.max(finals):.0f})"
    )
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval/return (mean of 10 episodes)")
    ax.set_title(args.title or args.experiment)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
