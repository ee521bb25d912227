"""One decoding step's sampling: one ``torch.multinomial`` call per row (each row its own generator)
against vaco's batched inverse-CDF draw (``vaco.llm.policy.sample_inverse_cdf``: one float64 cumsum
and search for all rows, each row's uniform from its own stream).

Both keep a row's samples independent of which rows share its step. They draw different tokens from
the same distribution (the test of the sampler checks the distribution). The two are timed
alternately, ``--repeats`` times each, on the same softmax rows of ``--vocab`` tokens (the default is
SmolLM2's 49,152; Qwen2.5's is 151,936), and the per-step median of each and their ratio are printed
(a ratio of medians measured side by side in one process, no interval).

    python benchmarks/llm_sampling.py [--rows 16 64 256] [--vocab 49152] [--repeats 30] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from vaco.llm.policy import sample_inverse_cdf  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    results = []
    for rows in args.rows:
        g = torch.Generator(device=device).manual_seed(0)
        probs = torch.randn(rows, args.vocab, generator=g, device=device).mul(3).softmax(-1)
        streams = [torch.Generator(device=device).manual_seed(i) for i in range(rows)]
        uniforms = torch.rand(rows, generator=g, device=device, dtype=torch.float64)
        times = {"per-row multinomial": [], "batched inverse cdf": []}
        for _ in range(args.repeats):
            _sync(device)
            t = time.perf_counter()
            torch.cat([torch.multinomial(probs[j], 1, generator=streams[j]) for j in range(rows)])
            _sync(device)
            times["per-row multinomial"].append(time.perf_counter() - t)
            t = time.perf_counter()
            sample_inverse_cdf(probs, uniforms)
            _sync(device)
            times["batched inverse cdf"].append(time.perf_counter() - t)
        medians = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        ratio = medians["per-row multinomial"] / medians["batched inverse cdf"]
        results.append({"rows": rows, "vocab": args.vocab, "median_ms": medians, "ratio": ratio})
        print(
            f"{rows:4d} rows x {args.vocab} tokens: per-row multinomial {medians['per-row multinomial']:.2f} ms, "
            f"batched inverse cdf {medians['batched inverse cdf']:.2f} ms a step ({ratio:.2f}x)"
        )
    meta = {"machine": platform.processor() or platform.machine(), "device": str(device), "torch": torch.__version__}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
