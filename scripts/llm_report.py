"""Tables and a figure from the LLM track's grid (scripts/llm_grid.py): eval accuracy against N
per algorithm, and the clip/filter fractions per minibatch.

    MLFLOW_TRACKING_URI=sqlite:///runs/llm/mlflow.db python scripts/llm_report.py \
        --experiments vaco-llm-cpu vaco-llm-cpu-lr3e-4 --figure docs/figures/llm_forward_lag.png

Prints Markdown. "final" is eval/accuracy after the last step; "late" is the mean of the evaluations
in the second half of the run (less noisy). Fractions are token fractions per minibatch; a minibatch
is "active" when any of its tokens was clipped (GRPO) or filtered (VACO-GRPO).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from statistics import mean

ALGORITHMS = ("grpo", "vaco_grpo")
LABELS = {"grpo": "GRPO (clip 0.2/0.272)", "vaco_grpo": "VACO-GRPO (TV filter, delta 0.05)"}
FRACTION = {"grpo": "train/clip_fraction", "vaco_grpo": "train/filter_fraction"}


def load_runs(client, experiment: str) -> dict[tuple[str, int, int], dict]:
    """(algorithm, N, seed) -> metric histories of the latest FINISHED run with those coordinates."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no MLflow experiment {experiment!r} in this tracking store")
    runs = client.search_runs(
        [found.experiment_id], filter_string="attributes.status = 'FINISHED'", order_by=["attributes.start_time ASC"]
    )
    out = {}
    for run in runs:
        p = run.data.params
        key = (p["algorithm"], int(p["N"]), int(p["seed"]))
        histories = {}
        for name in ("eval/accuracy", "train/clip_fraction", "train/filter_fraction", "train/tv", "lag/steps_behind"):
            histories[name] = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        histories["num_steps"] = int(p["num_steps"])
        histories["lr"] = p.get("lr")
        out[key] = histories  # later runs replace earlier ones
    return out


def summarise(runs: dict) -> dict:
    table: dict = defaultdict(dict)
    for (algorithm, n, seed), h in sorted(runs.items()):
        accuracy = dict(h["eval/accuracy"])
        half = h["num_steps"] / 2
        row = table[(algorithm, n)].setdefault("seeds", {})
        row[seed] = {
            "start": accuracy[0],
            "final": accuracy[h["num_steps"]],
            "late": mean(v for s, v in accuracy.items() if s > half),
        }
        fractions = [v for _, v in h[FRACTION[algorithm]]]
        lag = [int(v) for _, v in h["lag/steps_behind"]]
        tv = [v for _, v in h["train/tv"]]
        stats = table[(algorithm, n)].setdefault("fractions", defaultdict(list))
        stats["fraction"] += fractions
        stats["lag"] += lag
        stats["tv"] += tv
    for value in table.values():
        seeds = value["seeds"]
        for metric in ("start", "final", "late"):
            value[metric] = mean(s[metric] for s in seeds.values())
        f = value.pop("fractions")
        active = [x for x in f["fraction"] if x > 0]
        value["mean_fraction"] = mean(f["fraction"])
        value["active_minibatches"] = len(active) / len(f["fraction"])
        value["fraction_when_active"] = mean(active) if active else 0.0
        n = max(f["lag"]) + 1
        value["fraction_by_lag"] = [mean(x for x, k in zip(f["fraction"], f["lag"]) if k == j) for j in range(n)]
        value["tv_by_lag"] = [mean(x for x, k in zip(f["tv"], f["lag"]) if k == j) for j in range(n)]
    return table


def markdown(experiment: str, table: dict) -> str:
    ns = sorted({n for _, n in table})
    lines = [f"### {experiment}", "", "| algorithm | N | final accuracy, mean | per seed | late accuracy, mean | per seed |",
             "|---|---|---|---|---|---|"]
    for algorithm in ALGORITHMS:
        for n in ns:
            row = table.get((algorithm, n))
            if row is None:
                continue
            seeds = row["seeds"]
            per = lambda m: ", ".join(f"{seeds[s][m]:.3f}" for s in sorted(seeds))  # noqa: E731
            lines.append(f"| {algorithm} | {n} | {row['final']:.3f} | {per('final')} | {row['late']:.3f} | {per('late')} |")
    start = mean(row["start"] for row in table.values())
    lines += ["", f"Supervised start (step 0, greedy): {start:.3f}.", "",
              "| algorithm | N | tokens clipped/filtered per minibatch | minibatches with any | share when any "
              "| share at lag 0 / N/2 / N-1 | TV at lag 0 / N-1 |", "|---|---|---|---|---|---|---|"]
    for n in ns:
        if n == 1:
            continue
        for algorithm in ALGORITHMS:
            row = table.get((algorithm, n))
            if row is None:
                continue
            by_lag, tv = row["fraction_by_lag"], row["tv_by_lag"]
            lines.append(
                f"| {algorithm} | {n} | {row['mean_fraction']:.4f} | {row['active_minibatches']:.2f} | "
                f"{row['fraction_when_active']:.4f} | {by_lag[0]:.4f} / {by_lag[len(by_lag) // 2]:.4f} / {by_lag[-1]:.4f} | "
                f"{tv[0]:.4f} / {tv[-1]:.4f} |"
            )
    return "\n".join(lines)


def figure(path: str, experiments: list[str], tables: dict, runs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"grpo": "tab:red", "vaco_grpo": "tab:blue"}
    fig, axes = plt.subplots(len(experiments), 3, figsize=(13, 3.4 * len(experiments)), squeeze=False)
    for row, experiment in enumerate(experiments):
        table, run = tables[experiment], runs[experiment]
        lr = next(iter(run.values()))["lr"]
        ax = axes[row][0]
        for algorithm in ALGORITHMS:
            ns = sorted(n for a, n in table if a == algorithm)
            ax.plot(ns, [table[(algorithm, n)]["final"] for n in ns], "-o", color=colors[algorithm], label=algorithm)
            for n in ns:
                values = [s["final"] for s in table[(algorithm, n)]["seeds"].values()]
                ax.scatter([n] * len(values), values, color=colors[algorithm], alpha=0.35, s=14)
        start = mean(r["start"] for r in table.values())
        ax.axhline(start, color="gray", ls=":", label="supervised start")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (minibatches per generation batch)")
        ax.set_ylabel("final eval accuracy")
        ax.set_title(f"{experiment} (lr {lr})")
        ax.legend(fontsize=8)
        ax = axes[row][1]
        for algorithm in ALGORITHMS:
            for n, style in ((4, ":"), (16, "-")):
                h = run.get((algorithm, n, 1))
                if h is None:
                    continue
                steps, values = zip(*h[FRACTION[algorithm]])
                ax.plot(steps, values, style, color=colors[algorithm], lw=0.8,
                        label=f"{'clip' if algorithm == 'grpo' else 'filter'} N={n}")
        ax.set_xlabel("optimiser step (seed 1)")
        ax.set_ylabel("fraction of tokens per minibatch")
        ax.set_title("clipped (GRPO) / filtered (VACO-GRPO)")
        ax.legend(fontsize=8)
        ax = axes[row][2]
        for algorithm in ALGORITHMS:
            if (algorithm, 16) in table:
                by_lag = table[(algorithm, 16)]["fraction_by_lag"]
                ax.plot(range(len(by_lag)), by_lag, "-o", ms=3, color=colors[algorithm],
                        label=f"{'clip' if algorithm == 'grpo' else 'filter'} fraction")
        ax.set_xlabel("steps behind beta (minibatch k - 1), N = 16")
        ax.set_ylabel("mean fraction of tokens")
        ax.set_title("by forward lag, all seeds")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    import mlflow

    from vaco.tracking import tracking_uri

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", nargs="+", default=["vaco-llm-cpu"])
    parser.add_argument("--figure", default=None, help="write a PNG here")
    parser.add_argument("--json", default=None, help="write the summary here")
    args = parser.parse_args(argv)
    client = mlflow.MlflowClient(tracking_uri=tracking_uri())
    runs = {e: load_runs(client, e) for e in args.experiments}
    tables = {e: summarise(runs[e]) for e in args.experiments}
    print("\n\n".join(markdown(e, tables[e]) for e in args.experiments))
    if args.figure:
        figure(args.figure, args.experiments, tables, runs)
        print(f"\nfigure: {args.figure}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({e: {f"{a}/N{n}": v for (a, n), v in t.items()} for e, t in tables.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
