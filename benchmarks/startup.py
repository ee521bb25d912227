"""Start-up time of the `vaco` commands: how long a user waits for help or for an error.

    python benchmarks/startup.py [--repeat 3] [--source DIR]

Each command runs in a fresh interpreter (`python -c "from vaco.commands.cli import main; main([...])"`);
the table shows the median wall time over --repeat runs and whether torch / Lightning were
imported. --source DIR times another checkout of vaco (e.g. an older commit in a git worktree)
with the same environment, for a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "vaco --help": ["--help"],
    "vaco sweep --help": ["sweep", "--help"],
    "vaco report --help": ["report", "--help"],
    "vaco evaluate --help": ["evaluate", "--help"],
    "vaco ui --help": ["ui", "--help"],
    "vaco fit --help": ["fit", "--help"],
    "vaco fit <mistyped flag>": ["fit", "--config", str(REPO / "configs/demo.yaml"), "--data.init_args.num_envz", "3"],
    "vaco fit <bad value>": ["fit", "--config", str(REPO / "configs/demo.yaml"), "--data.init_args.num_envs", "abc"],
    "vaco fit <missing config file>": ["fit", "--config", "/nonexistent/missing.yaml"],
}
PROBE = """
import json, sys, time
sys.path.insert(0, {source!r})
start = time.perf_counter()
from vaco.commands.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
sys.stdout.flush()
print(json.dumps({{"torch": "torch" in sys.modules, "lightning": "lightning" in sys.modules}}), file=sys.stderr)
"""


def time_command(argv: list[str], source: str) -> tuple[float, dict]:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(source=source, argv=argv)], capture_output=True, text=True, cwd="/tmp"
    )
    elapsed = time.perf_counter() - start
    return elapsed, json.loads(out.stderr.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--source", default=str(REPO), help="the vaco checkout to time")
    args = parser.parse_args()
    print(f"start-up of the vaco commands ({args.source}), median of {args.repeat} runs, fresh interpreter each")
    print(f"{'command':<28} {'seconds':>8}  imports")
    for name, argv in COMMANDS.items():
        runs = [time_command(argv, args.source) for _ in range(args.repeat)]
        seconds = statistics.median(t for t, _ in runs)
        imported = [k for k, v in runs[-1][1].items() if v]
        print(f"{name:<28} {seconds:8.2f}  {', '.join(imported) or '-'}")


if __name__ == "__main__":
    main()
