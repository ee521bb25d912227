"""The stop-string check of one running row: the decode of its last tokens (vaco's, the
``stop_tokens_window``) against the decode of its whole prefix (the check before it), per token.

For each ``--length`` and each tokenizer, a row of that many tokens is made from the CPU setting's
synthetic GSM8k answers (decoded text re-encoded, so it is text the model could write), and both
checks are timed alternately, ``--repeats`` times each over every prefix end of the last 64 tokens
(what a row growing to that length costs at its last steps). Printed: microseconds per check, the
median over repeats of each, and their ratio (side by side in one process, no interval). Both
checks find the same stop in the test (``tests/test_llm_policy.py``); here the stop strings are
the trainer's defaults and the row holds none (the common case: the check runs and finds nothing).

    python benchmarks/llm_stop_check.py --tokenizer runs/llm/cpu/model models/SmolLM2-135M-Instruct [--length 128 512]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from vaco.llm.policy import _holds_a_stop, load_tokenizer, stop_tokens_window  # noqa: E402
from vaco.llm.reward import STOP_STRINGS  # noqa: E402
from vaco.llm.synthetic import generate_problems  # noqa: E402


def _row(tokenizer, length: int) -> list[int]:
    """``length`` tokens of synthetic answers (no stop string in them)."""
    text, ids = "", []
    seed = 0
    while len(ids) < length:
        text += " ".join(p["answer"].replace("####", "so") for p in generate_problems(20, seed=seed)) + " "
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        seed += 1
    return ids[:length]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", nargs="+", default=["runs/llm/cpu/model"])
    parser.add_argument("--length", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/results/llm_stop_check.json")
    args = parser.parse_args()
    stops = list(STOP_STRINGS)
    window = stop_tokens_window(stops)
    results = []
    for path in args.tokenizer:
        tokenizer = load_tokenizer(path)
        for length in args.length:
            row = _row(tokenizer, length)
            ends = range(max(1, length - 64), length + 1)
            if any(_holds_a_stop(tokenizer, row[:end], stops) for end in ends):
                raise SystemExit(f"the benchmark row of {path} holds a stop string; it should not")
            checks = {
                "window": lambda end, row=row, tok=tokenizer: _holds_a_stop(
                    tok, row[max(0, end - window) : end], stops
                ),
                "whole_prefix": lambda end, row=row, tok=tokenizer: _holds_a_stop(tok, row[:end], stops),
            }
            times: dict[str, list[float]] = {name: [] for name in checks}
            for repeat in range(args.repeats + 1):
                for name in checks if repeat % 2 == 0 else list(checks)[::-1]:
                    start = time.perf_counter()
                    for end in ends:
                        checks[name](end)
                    if repeat:  # the first round is untimed
                        times[name].append((time.perf_counter() - start) / len(ends) * 1e6)
            window_us, whole_us = (statistics.median(times[name]) for name in checks)
            results.append(
                {
                    "tokenizer": path,
                    "vocab": len(tokenizer),
                    "length": length,
                    "window_tokens": window,
                    "window_us": window_us,
                    "whole_prefix_us": whole_us,
                    "ratio": whole_us / window_us,
                }
            )
            print(
                f"{path} ({len(tokenizer)} tokens), a row of {length}: window of {window} tokens {window_us:.1f} us, "
                f"whole prefix {whole_us:.1f} us a check ({whole_us / window_us:.1f}x)",
                flush=True,
            )
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "stop_strings": stops,
        "repeats": args.repeats,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"results": results, "meta": meta}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
