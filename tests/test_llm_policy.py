"""Sampling and re-scoring with a small random Llama: the behaviour log-probs recorded at
generation equal the learner's re-scored log-probs, padding changes nothing, masks mark the tokens."""

from __future__ import annotations

import math

import pytest
import torch

from vaco.llm.policy import (
    check_model_dir,
    completion_log_probs,
    encode_prompts,
    generate,
    sample_inverse_cdf,
    tiny_causal_lm,
)
from vaco.llm.synthetic import generate_problems
from vaco.llm.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    texts = [p["question"] + " " + p["answer"] for p in generate_problems(200, seed=0)]
    tok = train_tokenizer(texts, vocab_size=320)
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    return tiny_causal_lm(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64).eval()


PROMPTS = [
    "Question: Mia has 12 pens. How many?\nAnswer:",
    "Question: hi\nAnswer:",
    "Question: Tom buys 3 boxes.\nAnswer:",
]


def sample(model, tokenizer, prompts, temperature, seed=0, max_new_tokens=10):
    ids, mask, _ = encode_prompts(tokenizer, prompts, 64)
    out = generate(
        model,
        ids,
        mask,
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        temperature=temperature,
        generator=torch.Generator().manual_seed(seed),
    )
    return ids, mask, out


def test_left_padding_and_truncation(tokenizer):
    ids, mask, truncated = encode_prompts(tokenizer, PROMPTS, 64)
    assert truncated == 0 and mask[:, -1].all() and not mask[1, 0]  # padding on the left
    assert tokenizer.decode(ids[1][mask[1]]) == PROMPTS[1]
    ids, mask, truncated = encode_prompts(tokenizer, PROMPTS, 4)
    assert truncated == 3 and ids.shape == (3, 4) and "Answer:".endswith(tokenizer.decode(ids[0]))  # the end is kept


def test_behavior_log_probs_equal_the_learner_rescoring(model, tokenizer):
    ids, mask, out = sample(model, tokenizer, PROMPTS * 4, temperature=1.0)
    log_prob, entropy = completion_log_probs(
        model, ids.repeat(1, 1), mask, out["completion_ids"], out["completion_mask"], with_entropy=True
    )
    valid = out["completion_mask"]
    torch.testing.assert_close(log_prob[valid], out["behavior_log_prob"][valid], atol=1e-5, rtol=0)
    assert torch.all(log_prob[~valid] == 0) and torch.all(out["behavior_log_prob"][~valid] == 0)
    assert torch.all(entropy[valid] > 0) and not entropy.requires_grad
    # the same holds at another temperature: both sides use softmax(logits / T)
    ids, mask, out = sample(model, tokenizer, PROMPTS, temperature=0.7)
    log_prob, _ = completion_log_probs(model, ids, mask, out["completion_ids"], out["completion_mask"], temperature=0.7)
    torch.testing.assert_close(
        log_prob[out["completion_mask"]], out["behavior_log_prob"][out["completion_mask"]], atol=1e-5, rtol=0
    )


def test_completion_mask_ends_at_eos_and_truncation_is_reported(model, tokenizer):
    model_eos = tokenizer.eos_token_id
    _, _, out = sample(model, tokenizer, PROMPTS * 8, temperature=1.0, max_new_tokens=6)
    ids, valid = out["completion_ids"], out["completion_mask"]
    for row_ids, row_valid, truncated in zip(ids, valid, out["truncated"]):
        n = int(row_valid.sum())
        assert row_valid[:n].all() and not row_valid[n:].any()  # one block from the start
        assert (row_ids[n:] == tokenizer.pad_token_id).all()
        ended = bool((row_ids[:n] == model_eos).any())
        assert ended != bool(truncated) and (not ended or row_ids[n - 1] == model_eos)


def test_greedy_is_deterministic_and_unaffected_by_padding(model, tokenizer):
    _, _, alone = sample(model, tokenizer, PROMPTS[1:2], temperature=0.0, seed=0)
    _, _, batched = sample(model, tokenizer, PROMPTS, temperature=0.0, seed=1)  # PROMPTS[1] is left-padded here
    n = int(alone["completion_mask"].sum())
    assert torch.equal(batched["completion_ids"][1, :n], alone["completion_ids"][0, :n])


def test_rescoring_has_gradient_and_ignores_padding(model, tokenizer):
    ids, mask, out = sample(model, tokenizer, PROMPTS, temperature=1.0)
    completion = out["completion_ids"].clone()
    completion[~out["completion_mask"]] = 7  # garbage under the mask must not matter
    log_prob, _ = completion_log_probs(model, ids, mask, completion, out["completion_mask"])
    reference, _ = completion_log_probs(model, ids, mask, out["completion_ids"], out["completion_mask"])
    torch.testing.assert_close(log_prob, reference)
    assert log_prob.requires_grad
    model.zero_grad(set_to_none=True)
    log_prob.sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    try:
        assert grads, "no parameter received a gradient"
        assert all(torch.isfinite(g).all() for g in grads.values())
        nonzero = [name for name, g in grads.items() if g.abs().sum() > 0]
        # the last layer and the embeddings both move: the gradient flows through the whole model
        assert any("embed" in name for name in nonzero) and any("layers" in name for name in nonzero), sorted(grads)
    finally:
        model.zero_grad(set_to_none=True)


def test_model_dir_check_names_the_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="`model.model_path`: no directory"):
        check_model_dir(str(tmp_path / "Qwen2.5-0.5B"), "model.model_path")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        check_model_dir(str(tmp_path), "model.model_path")


def test_run_on_completions_end_at_their_stop_string(tokenizer):
    from vaco.llm.policy import cut_at_stop_strings

    texts = [" 3 + 4 = 7\n#### 7\n\nQuestion: Tom has 5 pens.", " 3 + 4 = 7\n#### 7", " no stop here, Question"]
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), True
    cut, stopped = cut_at_stop_strings(tokenizer, ids, mask, ("Question:",))
    assert stopped.tolist() == [True, False, False]
    assert torch.equal(cut[1:], mask[1:])  # no stop string: unchanged
    kept = tokenizer.decode(ids[0, cut[0]].tolist())
    assert kept.endswith("Question:") or kept.rstrip().endswith("Question:")  # the last kept token completes it
    shorter = tokenizer.decode(ids[0, : int(cut[0].sum()) - 1].tolist())
    assert "Question:" not in shorter  # ... and is the first that does
    assert "Tom" not in kept
    # the cut is a prefix of the mask, and nothing is cut with no stop strings
    assert not (cut & ~mask).any() and torch.equal(cut_at_stop_strings(tokenizer, ids, mask, ())[0], mask)


def _cut(tokenizer, out, stops):
    """What the learner keeps of a generation: each completion ended at its first stop string."""
    from vaco.llm.policy import cut_at_stop_strings

    mask, stopped = cut_at_stop_strings(tokenizer, out["completion_ids"], out["completion_mask"], stops)
    return {
        "completion_ids": out["completion_ids"].masked_fill(~mask, tokenizer.pad_token_id),
        "behavior_log_prob": out["behavior_log_prob"].masked_fill(~mask, 0.0),
        "completion_mask": mask,
        "truncated": out["truncated"] & ~stopped,
    }


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_rows_end_at_their_stop_string_during_generation_with_the_same_samples(model, tokenizer, temperature):
    """Generation used to run every row to max_new_tokens and cut at the stop strings afterwards.
    Now a row ends when its decoded text first holds a stop string, and the batch ends when every row
    has: the same tokens, log-probs and masks as the old path cut afterwards, for the same seed,
    in fewer decoding steps."""
    prompts = [p for p in PROMPTS for _ in range(3)]
    ids, mask, _ = encode_prompts(tokenizer, prompts, 64)

    def run(stops):
        return generate(
            model,
            ids,
            mask,
            max_new_tokens=40,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            temperature=temperature,
            generator=torch.Generator().manual_seed(3),
            tokenizer=tokenizer,
            stop_strings=stops,
        )

    full = run(())
    texts = [tokenizer.decode(r, skip_special_tokens=False) for r in full["completion_ids"].tolist()]
    # a stop string that ends row 0 early, and one that ends every row (the space nearly all have)
    early = texts[0][2:4]
    for stops in ((early,), (early, " ", "e")):
        ref = _cut(tokenizer, full, stops)
        out = run(stops)
        T = out["completion_ids"].shape[1]
        got = _cut(tokenizer, out, stops)
        assert torch.equal(got["completion_mask"], out["completion_mask"])  # already ended at the stops
        for key in ("completion_ids", "completion_mask"):
            assert torch.equal(got[key], ref[key][:, :T]), key
        # to float32 rounding: ended rows leave the batch, and a product over fewer rows may round differently
        assert torch.allclose(got["behavior_log_prob"], ref["behavior_log_prob"][:, :T], rtol=0, atol=1e-5)
        assert not ref["completion_mask"][:, T:].any()  # nothing kept was left out
        assert torch.equal(got["truncated"], ref["truncated"])
        assert int(ref["completion_mask"][0].sum()) < 40  # row 0 did end early
    assert T < full["completion_ids"].shape[1]  # every row ended: the batch stopped sooner
    with pytest.raises(ValueError, match="stop strings need the tokenizer"):
        generate(model, ids, mask, max_new_tokens=2, eos_token_id=0, pad_token_id=0, stop_strings=("x",))


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_rows_leave_the_batch_and_free_slots_refill_with_the_same_samples(model, tokenizer, temperature):
    """Continuous batching: with ``slots`` rows decoding at once, a row that ends leaves the batch
    and a waiting prompt takes its slot. Each row's tokens, mask and truncation are the same for
    every number of slots (each row samples from its own stream), its log-probs agree to float32
    rounding, and the model never decodes more rows than slots, nor a row that has ended."""
    prompts = [p for p in PROMPTS for _ in range(4)]  # 12 rows
    ids, mask, _ = encode_prompts(tokenizer, prompts, 64)
    seen: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )

    def run(slots, stops):
        seen.clear()
        out = generate(
            model,
            ids,
            mask,
            max_new_tokens=30,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            temperature=temperature,
            generator=torch.Generator().manual_seed(3),
            tokenizer=tokenizer,
            stop_strings=stops,
            slots=slots,
        )
        return out, list(seen)

    try:
        free, _ = run(None, ())
        texts = [tokenizer.decode(r, skip_special_tokens=False) for r in free["completion_ids"].tolist()]
        # stop strings that end rows at different steps (greedy rows may all say the same: then one length)
        stops = (texts[0][2:4], texts[5][6:8], texts[9][12:14])
        runs = {slots: run(slots, stops) for slots in (None, 5, 2, 1)}
    finally:
        hook.remove()
    ref, _ = runs[None]
    lengths = ref["completion_mask"].sum(-1)
    if temperature > 0:
        assert len(set(lengths.tolist())) > 2  # rows did end at different steps
    for slots, (out, calls) in runs.items():
        for key in ("completion_ids", "completion_mask", "truncated"):
            assert torch.equal(out[key], ref[key]), (slots, key)
        assert torch.allclose(out["behavior_log_prob"], ref["behavior_log_prob"], rtol=0, atol=1e-5), slots
        width = len(prompts) if slots is None else slots
        assert max(calls) <= width, (slots, calls)
        # every row is fed once per token but its last (prompt pass included): no ended row is decoded
        assert sum(calls) == int(lengths.sum()), (slots, sum(calls), int(lengths.sum()))
    # one row at a time takes as many forward passes as tokens; all at once, as the longest row
    assert len(runs[1][1]) == int(lengths.sum()) and len(runs[None][1]) < len(runs[1][1])


def test_a_row_generated_apart_with_its_seed_is_the_row_of_the_batch(model, tokenizer):
    """The documented stream: a call draws its B row seeds with ``randint(2**62, (B,))`` from its
    generator; row i generated alone with ``row_seeds=[seed_i]`` is row i of the batch."""
    ids, mask, _ = encode_prompts(tokenizer, PROMPTS, 64)
    kwargs = dict(max_new_tokens=12, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    together = generate(model, ids, mask, generator=torch.Generator().manual_seed(9), **kwargs)
    seeds = torch.randint(2**62, (len(PROMPTS),), generator=torch.Generator().manual_seed(9)).tolist()
    for i, seed in enumerate(seeds):
        alone = generate(model, ids[i : i + 1], mask[i : i + 1], row_seeds=[seed], **kwargs)
        n = int(together["completion_mask"][i].sum())
        assert int(alone["completion_mask"].sum()) == n
        assert torch.equal(alone["completion_ids"][0, :n], together["completion_ids"][i, :n]), i
    with pytest.raises(ValueError, match="2 `row_seeds` for 3 rows"):
        generate(model, ids, mask, row_seeds=[1, 2], **kwargs)


def test_the_stop_check_on_a_rows_last_tokens_finds_what_the_whole_prefix_decode_finds(tokenizer):
    """Generation checks a row for stop strings on its last tokens only (stop_tokens_window), not on
    a decode of its whole prefix per token. On random rows of this byte-level BPE's tokens (texts
    with multi-byte characters among them), the first token at which a stop string appears is the
    same both ways, for every row."""
    from vaco.llm.policy import _holds_a_stop, stop_tokens_window

    texts = ["Question: Tom has 5 pens.\n#### 7", "prix: 3 € et 4 €, café ☕ Question", "a Q b Qu c Question:"]
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    gen = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    compared = 0
    for stops in (["Question:"], ["€ et"], ["☕", "\n####"], ["Qu"]):
        window = stop_tokens_window(stops)
        for _ in range(60):
            # random tokens (random bytes split characters), one text's own tokens, random tokens
            before, after = (
                torch.randint(0, vocab, (int(n),), generator=gen).tolist()
                for n in torch.randint(0, 12, (2,), generator=gen)
            )
            row = before + encoded[int(torch.randint(0, len(texts), (1,), generator=gen))] + after
            whole = next((t for t in range(1, len(row) + 1) if _holds_a_stop(tokenizer, row[:t], stops)), None)
            last = next((t for t in range(1, len(row) + 1) if _holds_a_stop(tokenizer, row[:t][-window:], stops)), None)
            assert last == whole, (stops, row, whole, last)
            compared += whole is not None
    assert compared >= 40  # most rows do meet a stop string


def _inverse_cdf_by_hand(row: list[float], u: float) -> int:
    """The first index whose running float64 sum exceeds u * the row's total."""
    total = math.fsum(row)
    running = 0.0
    for k, p in enumerate(row):
        running += p
        if running > u * total:
            return k
    return len(row) - 1


def test_the_batched_sampler_is_the_inverse_cdf_of_each_row_and_draws_its_distribution():
    """sample_inverse_cdf equals a float64 loop on unnormalised rows with zeros (a zero-probability
    token never drawn, u = 0 included), and its draws match the probabilities (a chi-square test at
    200k draws: an off-by-one search or a cdf not scaled by the row's total fails it)."""
    from scipy.stats import chisquare

    g = torch.Generator().manual_seed(0)
    probs = torch.rand(64, 11, generator=g, dtype=torch.float64) * 3
    probs[probs < 0.6] = 0.0
    probs[:, 0] = 0.0
    probs[0] = 0.0
    probs[0, 5] = 2.0
    u = torch.rand(64, generator=g, dtype=torch.float64)
    u[1] = 0.0
    got = sample_inverse_cdf(probs.float(), u).tolist()
    for r in range(64):
        assert got[r] == _inverse_cdf_by_hand(probs[r].float().double().tolist(), float(u[r])), r
        assert probs[r, got[r]] > 0, r
    p = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05])
    n = 200_000
    draws = sample_inverse_cdf(p.expand(n, -1), torch.rand(n, generator=g))
    counts = torch.bincount(draws, minlength=5).double()
    assert counts[1] == 0
    keep = p > 0
    assert chisquare(counts[keep].numpy(), (p[keep].double() * n).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_transformers_decoder_gives_vaco_loops_samples_whatever_the_checkpoints_generation_config(
    model, tokenizer, temperature
):
    """``decoder="transformers"`` runs ``model.generate`` on padded chunks with vaco's per-row draw
    and stop check around it: the same tokens, masks and truncation as vaco's loop at every number
    of slots, log-probs to float32 rounding, with stop strings that end rows at different steps. A
    checkpoint's own generation config (a repetition penalty, sampling settings) does not reach the
    draw, and it is put back after the call. ``should_stop`` abandons either decoder before a token."""
    from transformers import GenerationConfig

    from vaco.llm.policy import GenerationStopped

    prompts = [p for p in PROMPTS for _ in range(4)]  # 12 rows
    ids, mask, _ = encode_prompts(tokenizer, prompts, 64)

    def run(decoder, slots, stops, should_stop=None):
        return generate(
            model,
            ids,
            mask,
            max_new_tokens=30,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            temperature=temperature,
            generator=torch.Generator().manual_seed(4),
            tokenizer=tokenizer,
            stop_strings=stops,
            slots=slots,
            decoder=decoder,
            should_stop=should_stop,
        )

    free = run("vaco", None, ())
    texts = [tokenizer.decode(r, skip_special_tokens=False) for r in free["completion_ids"].tolist()]
    stops = (texts[0][2:4], texts[5][6:8], texts[9][12:14])
    ref = run("vaco", None, stops)
    if temperature > 0:
        assert len(set(ref["completion_mask"].sum(-1).tolist())) > 2  # rows did end at different steps
    own = model.generation_config
    model.generation_config = GenerationConfig(repetition_penalty=3.0, do_sample=True, top_k=2, temperature=0.3)
    try:
        for slots in (None, 5, 1):
            out = run("transformers", slots, stops)
            for key in ("completion_ids", "completion_mask", "truncated"):
                assert torch.equal(out[key], ref[key]), (slots, key)
            assert torch.allclose(out["behavior_log_prob"], ref["behavior_log_prob"], rtol=0, atol=1e-5), slots
        assert model.generation_config.repetition_penalty == 3.0  # the checkpoint's config is back
    finally:
        model.generation_config = own
    for decoder in ("vaco", "transformers"):
        asked: list[int] = []

        def should_stop(asked=asked):
            asked.append(1)
            return len(asked) > 3

        with pytest.raises(GenerationStopped):
            run(decoder, 5, stops, should_stop=should_stop)
        assert len(asked) == 4, decoder  # asked before every token, and the fourth answer stopped it
    with pytest.raises(ValueError, match="`decoder` must be one of"):
        run("vllm", None, ())
