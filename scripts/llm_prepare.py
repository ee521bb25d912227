"""Create the CPU setting of the LLM track: synthetic GSM8k-format data, a local tokenizer, and
a tiny Llama fitted to a weak teacher (docs/llm.md). Cached: rerunning with the same settings
reuses what is on disk.

    python scripts/llm_prepare.py                      # -> runs/llm/cpu/{train,test}.jsonl, model/
    python scripts/llm_prepare.py --out /tmp/x --sft-steps 200
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    from vaco.llm.sft import CpuSetting, prepare_cpu_setting

    defaults = CpuSetting()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/llm/cpu", help="output directory (the configs read runs/llm/cpu)")
    for f in dataclasses.fields(CpuSetting):
        value = getattr(defaults, f.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--error-rates", type=json.loads, default=defaults.error_rates, help="JSON: family -> rate")
    parser.add_argument("--families", nargs="+", default=defaults.families)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = vars(parser.parse_args(argv))
    torch.set_num_threads(args.pop("threads"))
    out = args.pop("out")
    summary = prepare_cpu_setting(out, CpuSetting(**args))
    print(f"supervised start: greedy test accuracy {summary['test_accuracy']:.3f} -> {os.path.join(out, 'model')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
