"""Which decoding path: vaco's own loop against what transformers provides, side by side.

Three measurements on the same prompts, in one process, one after another:

1. **End to end, greedy** (temperature 0, so every path must produce the same tokens, and does: checked
   row by row): ``vaco.llm.policy.generate`` (its eager loop with a dynamic KV cache and continuous
   batching over ``--slots``) against transformers' own continuous batching with a paged KV cache
   (``model.generate_batch``: its scheduler, ``paged|sdpa`` attention), and against plain
   ``model.generate`` (padded batches of ``--slots`` rows, the dynamic cache: a batch decodes until
   its last row ends). Kept tokens per second; the tokens compared row by row.
2. **One decoding step** at ``--slots`` rows, a fixed number of steps after the prompt pass: the
   dynamic cache (vaco's loop), transformers' ``StaticCache`` eager, and the ``StaticCache`` step
   under ``torch.compile`` (fixed shapes, what a compiled decode loop would run; its compile time is
   reported apart). Milliseconds per step.

vaco's loop keeps what the training needs and the others do not give as they are: each row samples
from its own random stream (samples do not depend on the batching), each drawn token's log-prob is
recorded as it is drawn, and a stop string ends a row. So a faster path would have to win by enough to
be worth rebuilding those; this measures whether it does on the machine at hand.

    python benchmarks/llm_decoding.py --model models/SmolLM2-135M-Instruct [--rows 16] [--slots 8] [--max-new-tokens 64] [--steps 48]

On a GPU, with no model files there: ``--architecture qwen2.5-0.5b`` builds the paper's model's
architecture (Qwen2.5-0.5B's published dimensions) with random weights and random prompt tokens: the
timing does not depend on the weights, and random weights rarely emit EOS, so every row decodes to
``--max-new-tokens`` (the worst case of a base model that runs on). On cuda the compiled step uses
``torch.compile(mode="reduce-overhead")`` (CUDA graphs). ``--layers N`` shrinks the architecture (a
CPU smoke test of the GPU command).

    python benchmarks/llm_decoding.py --architecture qwen2.5-0.5b --device cuda --dtype bfloat16 --rows 64 --slots 32 --max-new-tokens 256
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

from vaco.llm.policy import encode_prompts, generate, load_causal_lm, load_tokenizer  # noqa: E402

#: Qwen2.5-0.5B's published configuration (the paper's LLM), for random-weight timing
QWEN25_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=151643,
    eos_token_id=151643,
    pad_token_id=151643,
)


def random_model(name: str, layers: int | None, dtype: str, device: torch.device, seed: int):
    """The named architecture with random weights (no files needed), on ``device``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if name != "qwen2.5-0.5b":
        raise SystemExit(f"--architecture: only qwen2.5-0.5b is known, got {name!r}")
    config = dict(QWEN25_05B, **({"num_hidden_layers": layers} if layers else {}))
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**config))
    return model.to(device=device, dtype=getattr(torch, dtype)).eval(), config


def random_prompts(rows: int, length: int, vocab: int, eos: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts of ``length // 2`` to ``length`` tokens (never EOS)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 2, length + 1, (rows,), generator=gen)
    ids = torch.full((rows, length), eos, dtype=torch.long)
    mask = torch.zeros(rows, length, dtype=torch.bool)
    for i, n in enumerate(lengths.tolist()):
        tokens = torch.randint(0, vocab - 1, (n,), generator=gen)
        ids[i, length - n :] = torch.where(tokens == eos, tokens + 1, tokens)
        mask[i, length - n :] = True
    return ids, mask


def _until_eos(tokens: list[int], eos: int) -> list[int]:
    """A completion's tokens up to and with its first EOS (as vaco's loop keeps them)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=48, help="decoding steps timed per variant (after 4 untimed)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--skip-compile", action="store_true", help="leave out the torch.compile step (minutes to compile on a CPU)"
    )
    parser.add_argument(
        "--architecture", default=None, help="qwen2.5-0.5b: random weights of that architecture, random prompts"
    )
    parser.add_argument("--layers", type=int, default=None, help="with --architecture: fewer layers (a smoke test)")
    parser.add_argument("--prompt-tokens", type=int, default=192, help="with --architecture: the longest prompt")
    parser.add_argument("--out", default="benchmarks/results/llm_decoding.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import GenerationConfig, StaticCache

    device = torch.device(args.device)
    if args.architecture:
        model, config = random_model(args.architecture, args.layers, args.dtype, device, args.seed)
        eos = pad = config["eos_token_id"]
        ids, mask = random_prompts(args.rows, args.prompt_tokens, config["vocab_size"], eos, args.seed)
    else:
        from vaco.llm.data import DEFAULT_PROMPT_TEMPLATE, format_prompt
        from vaco.llm.synthetic import generate_problems

        tokenizer = load_tokenizer(args.model)
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        model = load_causal_lm(args.model, args.dtype).to(device).eval()
        prompts = [
            format_prompt(DEFAULT_PROMPT_TEMPLATE, p["question"]) for p in generate_problems(args.rows, seed=args.seed)
        ]
        ids, mask, _ = encode_prompts(tokenizer, prompts, 512)
    ids, mask = ids.to(device), mask.to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    result: dict = {}
    # -------------------------------------------------------------- 1. end to end, greedy
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        mine = generate(
            model,
            ids,
            mask,
            max_new_tokens=args.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            temperature=0.0,
            slots=args.slots,
        )
    sync()
    vaco_s = time.perf_counter() - start
    vaco_rows = [mine["completion_ids"][i][mine["completion_mask"][i]].tolist() for i in range(args.rows)]
    inputs = [ids[i][mask[i].bool()].tolist() for i in range(args.rows)]
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    sync()
    start = time.perf_counter()
    theirs = model.generate_batch(inputs, generation_config=config, warmup=False)
    sync()
    hf_s = time.perf_counter() - start
    by_index = sorted(theirs.values(), key=lambda out: int(str(out.request_id).rsplit("_", 1)[-1]))
    hf_rows = [list(out.generated_tokens) for out in by_index]
    # plain `model.generate`: padded batches of `--slots` rows, the dynamic cache, every row of a
    # batch decoding until the batch's last one ends (what a trainer calling transformers gets)
    sync()
    start = time.perf_counter()
    plain_rows = []
    with torch.no_grad():
        for first in range(0, args.rows, args.slots):
            part_ids, part_mask = ids[first : first + args.slots], mask[first : first + args.slots]
            width = int(part_mask.sum(-1).max())  # the batch's own left padding
            out = model.generate(
                input_ids=part_ids[:, -width:],
                attention_mask=part_mask[:, -width:].long(),
                generation_config=config,
            )
            plain_rows += [_until_eos(row[width:].tolist(), eos) for row in out]
    sync()
    plain_s = time.perf_counter() - start
    tokens = sum(len(r) for r in vaco_rows)
    same = sum(a == b for a, b in zip(vaco_rows, hf_rows))
    same_plain = sum(a == b for a, b in zip(vaco_rows, plain_rows))
    full = sum(len(r) >= args.max_new_tokens for r in vaco_rows)
    result["end_to_end"] = {
        "vaco_seconds": vaco_s,
        "vaco_tokens_per_second": tokens / vaco_s,
        "transformers_generate_batch_seconds": hf_s,
        "transformers_generate_batch_tokens_per_second": sum(len(r) for r in hf_rows) / hf_s,
        "transformers_generate_seconds": plain_s,
        "transformers_generate_tokens_per_second": sum(len(r) for r in plain_rows) / plain_s,
        "tokens": tokens,
        "rows_to_max_new_tokens": full,
        "rows_with_identical_tokens": same,
        "rows_with_identical_tokens_generate": same_plain,
        "rows": args.rows,
    }
    print(
        f"end to end, greedy, {args.rows} rows ({full} to the maximum), {args.slots} slots, <= {args.max_new_tokens} "
        f"new tokens: vaco {vaco_s:.1f} s ({tokens / vaco_s:.1f} tokens/s); transformers generate {plain_s:.1f} s "
        f"({sum(len(r) for r in plain_rows) / plain_s:.1f} tokens/s: their time / vaco's {plain_s / vaco_s:.2f}); "
        f"generate_batch {hf_s:.1f} s "
        f"({sum(len(r) for r in hf_rows) / hf_s:.1f} tokens/s); rows with identical tokens: {same_plain} (generate), "
        f"{same} (generate_batch) of {args.rows}",
        flush=True,
    )

    # -------------------------------------------------------------- 2. one decoding step
    B = args.slots
    step_ids, step_mask = ids[:B], mask[:B].long()
    L, N = step_ids.shape[1], args.steps + 4

    @torch.no_grad()
    def dynamic_steps() -> list[float]:
        out = model(input_ids=step_ids, attention_mask=step_mask, use_cache=True, logits_to_keep=1)
        cache, att, token, times = out.cache, step_mask, out.logits[:, -1].argmax(-1), []
        for _ in range(N):
            att = torch.cat([att, att.new_ones(B, 1)], -1)
            sync()
            t0 = time.perf_counter()
            out = model(input_ids=token[:, None], attention_mask=att, cache=cache, use_cache=True)
            token = out.logits[:, -1].argmax(-1)
            sync()
            times.append(time.perf_counter() - t0)
            cache = out.cache
        return times[4:]

    @torch.no_grad()
    def static_steps(forward) -> tuple[list[float], float]:
        cache = StaticCache(config=model.config, max_cache_len=L + N)
        att = torch.cat([step_mask, step_mask.new_zeros(B, N)], -1)
        out = model(
            input_ids=step_ids,
            attention_mask=att[:, :L],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            cache_position=torch.arange(L, device=device),
        )
        token, times = out.logits[:, -1].argmax(-1), []
        for i in range(N):
            att[:, L + i] = 1
            sync()
            t0 = time.perf_counter()
            out = forward(
                input_ids=token[:, None],
                attention_mask=att,
                cache=cache,
                use_cache=True,
                cache_position=torch.tensor([L + i], device=device),
            )
            token = out.logits[:, -1].argmax(-1)
            sync()
            times.append(time.perf_counter() - t0)
        return times[4:], times[0]

    def ms(times: list[float]) -> float:
        return 1000 * sum(times) / len(times)

    steps = {"dynamic_cache_eager_ms": ms(dynamic_steps())}
    steps["static_cache_eager_ms"] = ms(static_steps(model.forward)[0])
    if not args.skip_compile:
        mode = "reduce-overhead" if device.type == "cuda" else "default"  # CUDA graphs on a GPU
        compiled = torch.compile(model.forward, dynamic=False, mode=mode)
        steps["compile_mode"] = mode
        start = time.perf_counter()
        times, first = static_steps(compiled)
        steps["static_cache_compiled_ms"] = ms(times)
        steps["compile_seconds"] = first
        steps["compiled_variant_seconds_in_all"] = time.perf_counter() - start
    result["decoding_step"] = {"rows": B, "prompt_columns": L, "timed_steps": args.steps, **steps}
    print(
        f"one decoding step, {B} rows: dynamic cache {steps['dynamic_cache_eager_ms']:.1f} ms, static cache "
        f"{steps['static_cache_eager_ms']:.1f} ms"
        + (
            f", static cache compiled {steps['static_cache_compiled_ms']:.1f} ms "
            f"(its first step, the compilation: {steps['compile_seconds']:.1f} s)"
            if "static_cache_compiled_ms" in steps
            else ""
        ),
        flush=True,
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    result["meta"] = {
        "machine": f"{name}, {os.cpu_count()} cores, {args.threads} torch thread(s)",
        "device": str(device),
        "dtype": args.dtype,
        "model": args.architecture and f"{args.architecture} (random weights)" or args.model,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **{k: v for k, v in vars(args).items() if k not in ("out",)},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
