"""Which decoding path: vaco's own loop against transformers' ``model.generate``, side by side.

1. **The two decoders training can use** (``model.decoder``), sampled as training samples
   (``--temperature`` 1.0, the same row seeds, the trainer's stop strings where there is a
   tokenizer): ``vaco`` (its loop: continuous batching over ``--slots``, a finished row's slot
   refilled) and ``transformers`` (``model.generate`` on padded chunks of ``--slots`` rows, vaco's
   per-row draw and stop check as its logits processor and stopping criterion). They draw the same
   tokens up to float32 rounding of the logits (counted row by row here, tested in
   ``tests/test_llm_policy.py``), so only time differs.
   One untimed run of each, then ``--repeats`` pairs, alternating which runs first. Reported: each
   decoder's median seconds and tokens/s, its **host share** (the time outside the model's
   forward passes: sampling, stop checks, cache bookkeeping, Python), and its forward time split into
   prompt passes and decoding steps (calls, median seconds), from forward hooks.

   **The rule** (declared with the benchmark, before its runs): a decoder *wins* a regime when its
   median time is at least 5% below the other's (:data:`MARGIN`) and it is faster in every pair;
   otherwise the regime is *undecided*.
2. ``--extras``: transformers' paged continuous batching (``model.generate_batch``) against vaco's
   loop, greedy (its sampling has no per-row streams, so it is no candidate for training); and one
   decoding step at ``--slots`` rows with the dynamic cache, transformers' ``StaticCache`` eager, and
   the ``StaticCache`` step under ``torch.compile`` (``--skip-compile`` leaves it out).

    python benchmarks/llm_decoding.py --model runs/llm/cpu/model --rows 512 --slots 64 --max-new-tokens 128

On a GPU, with no model files there: ``--architecture qwen2.5-0.5b`` builds the paper's model's
architecture (Qwen2.5-0.5B's published dimensions) with random weights and random prompt tokens: the
timing does not depend on the weights, and random weights rarely emit EOS, so every row decodes to
``--max-new-tokens`` (the worst case of a base model that runs on). On cuda the compiled step uses
``torch.compile(mode="reduce-overhead")`` (CUDA graphs). ``--layers N`` shrinks the architecture (a
CPU run of the GPU command).

    python benchmarks/llm_decoding.py --architecture qwen2.5-0.5b --device cuda --dtype bfloat16 --rows 64 --slots 32 --max-new-tokens 256 --extras
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

import torch  # noqa: E402

from vaco.llm.policy import DECODERS, encode_prompts, generate, load_causal_lm, load_tokenizer  # noqa: E402
from vaco.llm.reward import STOP_STRINGS  # noqa: E402

#: a decoder wins a regime when its median time is at least this fraction below the other's (and it is
#: faster in every alternating pair)
MARGIN = 0.05

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


def decide(ratio: float, pairs: list[tuple[float, float]]) -> str:
    """The declared rule on ``ratio`` (transformers' median time over vaco's) and the ``(vaco,
    transformers)`` seconds of each alternating pair."""
    edge = 1 - MARGIN + 1e-9  # at the margin counts, whatever the rounding of the ratio
    if ratio <= edge and all(theirs < mine for mine, theirs in pairs):
        return "transformers wins"
    if 1 / ratio <= edge and all(mine < theirs for mine, theirs in pairs):
        return "vaco wins"
    return "undecided"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="alternating timed pairs of the two decoders")
    parser.add_argument("--temperature", type=float, default=1.0, help="the decoders' sampling (0: greedy)")
    parser.add_argument("--extras", action="store_true", help="also transformers' paged batching and step timings")
    parser.add_argument("--steps", type=int, default=48, help="with --extras: decoding steps timed (after 4 untimed)")
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
        tokenizer = None
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
    stops = tuple(STOP_STRINGS) if tokenizer is not None else ()

    # -------------------------------------------------------------- 1. the two decoders, sampled, alternating
    forward_seconds = [0.0]
    prompt_pass = []  # per forward call: whether it was a prompt pass (more than one new token a row)

    def before(_module, args, kwargs):
        sync()
        ids = kwargs.get("input_ids", args[0] if args else None)
        prompt_pass.append(ids is not None and ids.shape[-1] > 1)
        forward_seconds.append(-time.perf_counter())

    def after(*_):
        sync()
        forward_seconds[-1] += time.perf_counter()

    def decode(decoder: str) -> tuple[dict, float, float]:
        """One generation of every row (the same row seeds each time): output, seconds, seconds in forward
        (:data:`last_forwards` then holds the call's prompt passes and decoding steps: count, seconds)."""
        del forward_seconds[:], prompt_pass[:]
        sync()
        start = time.perf_counter()
        out = generate(
            model,
            ids,
            mask,
            max_new_tokens=args.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            temperature=args.temperature,
            generator=torch.Generator().manual_seed(args.seed),
            tokenizer=tokenizer,
            stop_strings=stops,
            slots=args.slots,
            decoder=decoder,
        )
        sync()
        for kind, is_prompt in (("prompt_passes", True), ("steps", False)):
            times = [t for t, p in zip(forward_seconds, prompt_pass) if p == is_prompt]
            last_forwards[kind] = (len(times), sum(times))
        return out, time.perf_counter() - start, sum(forward_seconds)

    last_forwards: dict[str, tuple[int, float]] = {}
    hooks = [model.register_forward_pre_hook(before, with_kwargs=True), model.register_forward_hook(after)]
    forwards: dict[str, list[dict[str, tuple[int, float]]]] = {name: [] for name in DECODERS}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in DECODERS}
    outputs = {}
    with torch.no_grad():
        for name in DECODERS:  # one untimed run each: first-call costs (allocator, kernels) out of the pairs
            outputs[name] = decode(name)[0]
        for pair in range(args.repeats):
            order = DECODERS if pair % 2 == 0 else DECODERS[::-1]  # alternating which goes first
            for name in order:
                _, seconds, in_forward = decode(name)
                runs[name].append((seconds, in_forward))
                forwards[name].append(dict(last_forwards))
    for hook in hooks:
        hook.remove()
    mine, theirs = outputs["vaco"], outputs["transformers"]
    same = sum(
        torch.equal(
            mine["completion_ids"][i][mine["completion_mask"][i]],
            theirs["completion_ids"][i][theirs["completion_mask"][i]],
        )
        for i in range(args.rows)
    )
    lengths = mine["completion_mask"].sum(-1)
    tokens = int(lengths.sum())
    decoders = {}
    for name, timed in runs.items():
        seconds = [t for t, _ in timed]
        decoders[name] = {
            "seconds": seconds,
            "median_seconds": statistics.median(seconds),
            "tokens_per_second": tokens / statistics.median(seconds),
            "host_share": [1 - f / t for t, f in timed],  # time outside the model's forward passes
            "median_host_share": statistics.median(1 - f / t for t, f in timed),
            # where the forward time goes: prompt passes (a chunk's, or a refill's joining rows') and
            # decoding steps, each as (calls, median seconds over the timed runs)
            **{
                kind: (forwards[name][0][kind][0], statistics.median(f[kind][1] for f in forwards[name]))
                for kind in ("prompt_passes", "steps")
            },
        }
    ratio = decoders["transformers"]["median_seconds"] / decoders["vaco"]["median_seconds"]
    pairs = list(zip(decoders["vaco"]["seconds"], decoders["transformers"]["seconds"]))
    verdict = decide(ratio, pairs)
    result["decoders"] = {
        "temperature": args.temperature,
        "rows": args.rows,
        "slots": args.slots,
        "tokens": tokens,
        "mean_completion_length": tokens / args.rows,
        "rows_to_max_new_tokens": int((lengths >= args.max_new_tokens).sum()),
        "stop_strings": list(stops),
        "repeats": args.repeats,
        "rows_with_identical_tokens": same,
        "transformers_over_vaco_median_seconds": ratio,
        "pairs_vaco_faster": sum(v < t for v, t in pairs),
        "verdict": verdict,
        **decoders,
    }
    print(
        f"decoders, temperature {args.temperature}, {args.rows} rows in {args.slots} slots, <= {args.max_new_tokens} "
        f"new tokens ({tokens / args.rows:.1f} a row, {result['decoders']['rows_to_max_new_tokens']} to the maximum), "
        f"{args.repeats} alternating pairs: vaco {decoders['vaco']['median_seconds']:.2f} s "
        f"({decoders['vaco']['tokens_per_second']:.1f} tokens/s, host {decoders['vaco']['median_host_share']:.0%}), "
        f"transformers {decoders['transformers']['median_seconds']:.2f} s "
        f"({decoders['transformers']['tokens_per_second']:.1f} tokens/s, host "
        f"{decoders['transformers']['median_host_share']:.0%}); transformers / vaco {ratio:.2f}, vaco faster in "
        f"{result['decoders']['pairs_vaco_faster']} of {len(pairs)} pairs: {verdict}; identical tokens in {same} of "
        f"{args.rows} rows",
        flush=True,
    )
    for name, d in decoders.items():
        (n_prompt, s_prompt), (n_step, s_step) = d["prompt_passes"], d["steps"]
        print(
            f"  {name}: {n_prompt} prompt passes {s_prompt:.2f} s, {n_step} decoding steps {s_step:.2f} s", flush=True
        )

    if args.extras:
        # ---------------------------------------------------------- 2. greedy: transformers' paged continuous batching
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            greedy = generate(
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
        vaco_rows = [greedy["completion_ids"][i][greedy["completion_mask"][i]].tolist() for i in range(args.rows)]
        inputs = [ids[i][mask[i].bool()].tolist() for i in range(args.rows)]
        config = GenerationConfig(
            max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad
        )
        sync()
        start = time.perf_counter()
        paged = model.generate_batch(inputs, generation_config=config, warmup=False)
        sync()
        hf_s = time.perf_counter() - start
        by_index = sorted(paged.values(), key=lambda out: int(str(out.request_id).rsplit("_", 1)[-1]))
        hf_rows = [list(out.generated_tokens) for out in by_index]
        greedy_tokens = sum(len(r) for r in vaco_rows)
        result["paged_greedy"] = {
            "vaco_seconds": vaco_s,
            "vaco_tokens_per_second": greedy_tokens / vaco_s,
            "transformers_generate_batch_seconds": hf_s,
            "transformers_generate_batch_tokens_per_second": sum(len(r) for r in hf_rows) / hf_s,
            "rows_with_identical_tokens": sum(a == b for a, b in zip(vaco_rows, hf_rows)),
        }
        print(
            f"greedy, no stop strings: vaco {vaco_s:.1f} s ({greedy_tokens / vaco_s:.1f} tokens/s); generate_batch "
            f"(paged) {hf_s:.1f} s ({sum(len(r) for r in hf_rows) / hf_s:.1f} tokens/s); identical tokens in "
            f"{result['paged_greedy']['rows_with_identical_tokens']} of {args.rows} rows",
            flush=True,
        )
    if not args.extras:
        write(result, args, device)
        return
        # ---------------------------------------------------------- 3. one decoding step
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
    write(result, args, device)


def write(result: dict, args, device: torch.device) -> None:
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
