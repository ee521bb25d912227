"""The policy language model: loading, a tiny model for CPU, sampling with recorded log-probs, re-scoring.

Shape contract: prompts are ``[B, Lp]`` token ids, **left**-padded (``prompt_mask`` False on
padding); completions are ``[B, T]``, **right**-padded after their end-of-sequence token
(``completion_mask`` True on generated tokens, EOS included). Log-probs are per completion
token, ``[B, T]``, under ``softmax(logits / temperature)``: the distribution the tokens were
sampled from, so the learner's ``log_prob`` and the stored ``behavior_log_prob`` are comparable.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Sequence

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

__all__ = [
    "DECODERS",
    "GenerationStopped",
    "check_model_dir",
    "load_tokenizer",
    "load_causal_lm",
    "tiny_causal_lm",
    "encode_prompts",
    "generate",
    "completion_log_probs",
    "cut_at_stop_strings",
    "resolve_compute_dtype",
    "sample_inverse_cdf",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_model_dir(path: str, field: str) -> None:
    """Fail before any work if ``path`` is not a saved ``transformers`` model, naming the config field."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"`{field}` must be a directory holding a transformers model, got {path!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"`{field}`: no directory {path!r}. Give the local path of a model saved with save_pretrained "
            "(e.g. a download of Qwen/Qwen2.5-0.5B), or create the CPU setting's model with "
            "`python scripts/llm_prepare.py`."
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"`{field}`: {path!r} has no config.json, so it is not a saved transformers model")


def has_chat_template(path: str) -> bool:
    """Whether the tokenizer saved in ``path`` has a chat template, read from its files (no
    tokenizer is built): ``chat_template.jinja`` / ``chat_template.json``, or a non-empty
    ``chat_template`` in ``tokenizer_config.json``."""
    if any(os.path.isfile(os.path.join(path, name)) for name in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            return bool(json.load(f).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def resolve_compute_dtype(dtype: str, device_type: str) -> torch.dtype:
    """The forward passes' dtype for ``model.dtype`` on a device: bfloat16 falls back to float32 on a CPU, with a warning."""
    if dtype == "float32":
        return torch.float32
    if device_type == "cpu":
        warnings.warn(
            "`model.dtype: bfloat16` on a CPU: computing in float32 instead (bfloat16 matmuls on a CPU are many "
            "times slower; one generation batch of a 135M model did not finish in 7.5 min). The weights are "
            "float32 either way.",
            stacklevel=2,
        )
        return torch.float32
    return torch.bfloat16


def load_tokenizer(path: str):
    """``AutoTokenizer`` from a local directory, left padding, pad = EOS if the tokenizer has no pad token."""
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer in {path!r} has no end-of-sequence token; generation could not stop")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(path: str, dtype: str = "float32") -> torch.nn.Module:
    """``AutoModelForCausalLM`` from a local directory (no hub access)."""
    if dtype not in _DTYPES:
        raise ValueError(f"`dtype` must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype], local_files_only=True)


def tiny_causal_lm(
    tokenizer,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 256,
    max_positions: int = 256,
) -> LlamaForCausalLM:
    """A small Llama (RMSNorm, RoPE, SwiGLU) with tied embeddings, sized for a CPU core."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def encode_prompts(tokenizer, prompts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-padded ``(ids, mask, n_truncated)``; prompts over ``max_length`` tokens keep their end."""
    rows = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    if any(len(r) == 0 for r in rows):
        raise ValueError("an empty prompt cannot be completed")
    truncated = sum(len(r) > max_length for r in rows)
    rows = [r[-max_length:] for r in rows]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = True
    return ids, mask, truncated


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


#: the decoders :func:`generate` runs (``model.decoder``)
DECODERS = ("vaco", "transformers")


class GenerationStopped(Exception):
    """:func:`generate` was asked to stop (``should_stop``) before its rows ended."""


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    tokenizer=None,
    stop_strings: Sequence[str] = (),
    should_stop: Callable[[], bool] | None = None,
    slots: int | None = None,
    row_seeds: Sequence[int] | None = None,
    decoder: str = "vaco",
) -> dict[str, torch.Tensor]:
    """Sample completions (``temperature`` 0: greedy) and record each token's log-prob when it was drawn.

    A row ends at EOS, at ``max_new_tokens``, or, with ``tokenizer`` and ``stop_strings``, at the
    token whose decoded prefix first holds a stop string (the decode of the whole prefix, as
    :func:`cut_at_stop_strings` does: tokenizer-safe where a character spans tokens).

    **Continuous batching.** At most ``slots`` rows decode together (default: all of them). A row
    that ends leaves the batch at once (the forward passes and the KV cache hold only running
    rows), and its slot is refilled from the waiting prompts: their prompt pass runs, their cache
    joins the batch's (left-padded to a common length; columns no running row attends to are
    dropped). So a generation costs about its total tokens over ``slots`` steps, not ``slots``
    times its longest row per chunk of rows.

    **Samples do not depend on the batching.** Row ``i`` samples with its own random stream, seeded
    from one draw of ``generator`` per call (``B`` seeds): its ``k``-th token is drawn by
    :func:`sample_inverse_cdf` with the stream's ``k``-th uniform, all running rows in one batched
    search. So its tokens are the same whatever
    ``slots`` is and whichever rows share its steps (tested; ``row_seeds`` gives the seeds instead,
    to generate some rows of a batch apart); its log-probs agree to float32
    rounding (a matrix product over other rows may round differently). Caches other than
    transformers' plain ``DynamicCache`` layers are not merged: with them every row decodes at once.

    ``should_stop`` is asked before every token: when it answers true, generation is abandoned
    (:class:`GenerationStopped`; a stop signal arrived, and a preemption warning does not wait for
    a whole rollout).

    **Two decoders, the same draws.** ``decoder="vaco"`` is the loop above. ``decoder="transformers"``
    runs ``model.generate`` (its KV cache and loop, greedy over forced logits) on padded chunks of
    ``slots`` rows, with what training needs around it: a logits processor that draws each row's token
    by the same per-row stream and records its log-prob, a stopping criterion that ends a row at its
    stop string, and ``should_stop`` asked before every token. A chunk lasts as long as its longest
    row (no refill). Both give the same tokens, masks and truncation, log-probs to float32 rounding
    (tested), except where a logit that rounds differently in the two batch layouts moves a uniform
    across a boundary of the cumulative distribution (rare: 2 of 32 rows in the longest benchmarked
    regime, none in the others; the row differs from there on); ``benchmarks/llm_decoding.py`` times them side by side.

    Returns:
        ``completion_ids`` and ``behavior_log_prob`` ``[B, T]`` (T: the longest completion),
        ``completion_mask`` ``[B, T]`` (bool, EOS included), ``truncated`` ``[B]`` (neither EOS nor
        a stop string within ``max_new_tokens``).
    """
    stops = [text for text in stop_strings if text]
    stop_window = stop_tokens_window(stops)
    if stops and tokenizer is None:
        raise ValueError("generate: stop strings need the tokenizer that decodes the completions")
    if max_new_tokens < 1:
        raise ValueError(f"generate: `max_new_tokens` must be >= 1, got {max_new_tokens}")
    if decoder not in DECODERS:
        raise ValueError(f"generate: `decoder` must be one of {list(DECODERS)}, got {decoder!r}")
    B, device = prompt_ids.shape[0], prompt_ids.device
    slots = B if slots is None else max(1, min(int(slots), B))
    if temperature > 0:
        if row_seeds is None:
            seed_device = generator.device if generator is not None else torch.device("cpu")
            seeds = torch.randint(2**62, (B,), generator=generator, device=seed_device).tolist()
        elif len(row_seeds) != B:
            raise ValueError(f"generate: {len(row_seeds)} `row_seeds` for {B} rows")
        else:
            seeds = list(row_seeds)
        # row i's uniforms, one per token it may draw, from its own stream: a [B, max_new_tokens] table
        uniforms = torch.stack(
            [
                torch.rand(
                    max_new_tokens,
                    generator=torch.Generator(device=device).manual_seed(int(seed)),
                    device=device,
                    dtype=torch.float64,
                )
                for seed in seeds
            ]
        )
    tokens: list[list[int]] = [[] for _ in range(B)]
    drawn: list[tuple[list[int], list[int], torch.Tensor]] = []  # per step: rows, token indices, log-probs
    truncated = [False] * B

    def draw(logits: torch.Tensor, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of ``rows`` (their logits ``[R, V]``) and its log-prob: row i's k-th uniform."""
        if temperature > 0:
            dist = (logits / temperature).log_softmax(-1)
            at = torch.tensor([len(tokens[row]) for row in rows], device=device)
            token = sample_inverse_cdf(dist.exp(), uniforms[torch.tensor(rows, device=device), at])
        else:
            dist = logits.log_softmax(-1)
            token = dist.argmax(-1)
        return token, dist.gather(-1, token[:, None]).squeeze(-1)

    def ends(row: int) -> bool:
        """Whether ``row``'s newest token ends it (EOS, a stop string, or the length; the last sets ``truncated``)."""
        if tokens[row][-1] == eos_token_id:
            return True
        if stops and _holds_a_stop(tokenizer, tokens[row][-stop_window:], stops):
            return True
        if len(tokens[row]) >= max_new_tokens:
            truncated[row] = True
            return True
        return False

    run = _decode_vaco if decoder == "vaco" else _decode_transformers
    run(model, prompt_ids, prompt_mask, slots, draw, ends, tokens, drawn, should_stop, max_new_tokens, pad_token_id)
    T = max(len(t) for t in tokens)
    completion_ids = torch.full((B, T), pad_token_id, dtype=torch.long, device=device)
    behavior_log_prob = torch.zeros(B, T, dtype=torch.float32, device=device)
    completion_mask = torch.zeros(B, T, dtype=torch.bool, device=device)
    for row in range(B):
        n = len(tokens[row])
        completion_ids[row, :n] = torch.tensor(tokens[row], dtype=torch.long, device=device)
        completion_mask[row, :n] = True
    for rows, at, log_prob in drawn:
        behavior_log_prob[torch.tensor(rows, device=device), torch.tensor(at, device=device)] = log_prob
    return {
        "completion_ids": completion_ids,
        "behavior_log_prob": behavior_log_prob,
        "completion_mask": completion_mask,
        "truncated": torch.tensor(truncated, dtype=torch.bool, device=device),
    }


def _decode_vaco(model, prompt_ids, prompt_mask, slots, draw, ends, tokens, drawn, should_stop, max_new_tokens, pad):
    """vaco's loop: continuous batching over ``slots`` (see :func:`generate`)."""
    B = prompt_ids.shape[0]
    waiting = list(range(B))
    batch: _Rows | None = None
    refill = True  # until a prompt pass shows a cache that cannot be merged
    while waiting or batch is not None:
        if waiting and (batch is None or (refill and len(batch.rows) < slots)):
            room = slots - (0 if batch is None else len(batch.rows))
            joining, waiting = waiting[:room], waiting[room:]
            new = _Rows.prompt(model, prompt_ids, prompt_mask, joining)
            refill = refill and new.mergeable()
            batch = new if batch is None else batch.merge(new)
        if should_stop is not None and should_stop():
            raise GenerationStopped("generation abandoned: a stop was requested")
        token, log_prob = draw(batch.logits, batch.rows)
        token_list = token.tolist()
        drawn.append((batch.rows, [len(tokens[row]) for row in batch.rows], log_prob))
        running = []
        for j, row in enumerate(batch.rows):
            tokens[row].append(token_list[j])
            if not ends(row):
                running.append(j)
        if not running:
            batch = None
            continue
        if len(running) < len(batch.rows):
            batch.select(torch.tensor(running, device=prompt_ids.device))
        batch.step(model, token[running] if len(running) < len(token) else token)


def _decode_transformers(
    model, prompt_ids, prompt_mask, slots, draw, ends, tokens, drawn, should_stop, max_new_tokens, pad
):
    """``model.generate`` on padded chunks of ``slots`` rows, driven by vaco's draw and end checks (see
    :func:`generate`). The model's own generation config is set aside for the call (a fresh
    ``GenerationConfig``), so no repetition penalty or other processor of the checkpoint's touches the
    logits before the draw; the draw's token is forced (every other logit ``-inf``) and generate's
    greedy step takes it."""
    B = prompt_ids.shape[0]
    for first in range(0, B, slots):
        chunk = _Chunk(list(range(first, min(first + slots, B))), draw, ends, tokens, drawn, should_stop, pad)
        mask = prompt_mask[first : first + len(chunk.rows)]
        lead = int(mask.any(0).long().argmax())  # columns that are padding in every row of the chunk
        own, model.generation_config = model.generation_config, GenerationConfig()
        try:
            model.generate(
                input_ids=prompt_ids[first : first + len(chunk.rows), lead:],
                attention_mask=mask[:, lead:].long(),
                generation_config=GenerationConfig(
                    max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, pad_token_id=pad, eos_token_id=None
                ),
                logits_processor=LogitsProcessorList([chunk.processor]),
                stopping_criteria=StoppingCriteriaList([chunk.criterion]),
            )
        finally:
            model.generation_config = own


class _Chunk:
    """One padded chunk of rows under ``model.generate``: its logits processor draws the running rows'
    tokens (vaco's draw, recorded) and forces them; its stopping criterion ends rows by vaco's checks."""

    def __init__(self, rows, draw, ends, tokens, drawn, should_stop, pad) -> None:
        self.rows, self.running = rows, [True] * len(rows)
        self._draw, self._ends, self._tokens, self._drawn = draw, ends, tokens, drawn
        self._should_stop, self._pad = should_stop, pad
        chunk = self

        class Draw(LogitsProcessor):
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
                return chunk.draw(scores)

        class End(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.BoolTensor:
                return chunk.end(input_ids.device)

        self.processor, self.criterion = Draw(), End()

    def draw(self, scores: torch.Tensor) -> torch.Tensor:
        if self._should_stop is not None and self._should_stop():
            raise GenerationStopped("generation abandoned: a stop was requested")
        live = [j for j, on in enumerate(self.running) if on]
        rows = [self.rows[j] for j in live]
        index = torch.tensor(live, device=scores.device)
        token, log_prob = self._draw(scores[index].float(), rows)
        self._drawn.append((rows, [len(self._tokens[row]) for row in rows], log_prob))
        for row, t in zip(rows, token.tolist()):
            self._tokens[row].append(t)
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self._pad] = 0.0  # ended rows: generate writes the pad token there anyway
        forced[index] = float("-inf")
        forced[index, token] = 0.0
        return forced

    def end(self, device) -> torch.Tensor:
        for j, row in enumerate(self.rows):
            if self.running[j] and self._ends(row):
                self.running[j] = False
        return torch.tensor([not on for on in self.running], device=device)


def sample_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` ``[R, V]`` by inverse-CDF sampling with ``uniforms`` ``[R]`` in
    [0, 1): the first token whose float64 cumulative probability exceeds ``u`` times the row's total
    (so an unnormalised row and float rounding cannot pick past its last token, and a token of
    probability 0 is never drawn). One batched cumsum and search for all rows, where
    ``torch.multinomial`` with a row's own generator is one call per row."""
    cdf = probs.to(torch.float64).cumsum(-1)
    target = (uniforms.to(torch.float64) * cdf[:, -1])[:, None]
    token = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return token.clamp_(max=probs.shape[-1] - 1)


class _Rows:
    """The rows decoding together: their ids (rows of the whole generation), KV cache, attention
    mask over the cache's columns, next positions, and the logits of their next token."""

    def __init__(self, rows: list[int], cache, attention: torch.Tensor, next_position: torch.Tensor, logits):
        self.rows, self.cache, self.attention = rows, cache, attention
        self.next_position, self.logits = next_position, logits
        self._mergeable = _plain_dynamic(cache)  # decided once: the cache's layout does not change

    @classmethod
    def prompt(cls, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, rows: list[int]) -> "_Rows":
        """The prompt pass of ``rows`` (without the left columns that are padding in all of them)."""
        index = torch.tensor(rows, device=prompt_ids.device)
        mask = prompt_mask[index]
        first = int(mask.any(0).long().argmax())
        ids, mask = prompt_ids[index, first:], mask[:, first:]
        positions = _positions(mask)
        out = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions, use_cache=True, logits_to_keep=1)
        return cls(list(rows), out.cache, mask.long(), positions[:, -1] + 1, out.logits[:, -1].float())

    def mergeable(self) -> bool:
        """Whether the cache is transformers' plain ``DynamicLayer``s (full attention), which merge and trim."""
        return self._mergeable

    def merge(self, other: "_Rows") -> "_Rows":
        """These rows and ``other``'s as one batch: each side's cache and mask left-padded to the longer one."""
        width = max(self.attention.shape[1], other.attention.shape[1])

        def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
            missing = width - t.shape[dim]
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[dim] = missing
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([pad(mine.keys, -2), pad(theirs.keys, -2)], dim=0)
            mine.values = torch.cat([pad(mine.values, -2), pad(theirs.values, -2)], dim=0)
        self.attention = torch.cat([pad(self.attention, 1), pad(other.attention, 1)], dim=0)
        self.next_position = torch.cat([self.next_position, other.next_position])
        self.logits = torch.cat([self.logits, other.logits])
        self.rows = self.rows + other.rows
        return self

    def select(self, keep: torch.Tensor) -> None:
        """Keep the rows at ``keep`` (positions in this batch); drop the cache columns none of them attends to."""
        self.cache.batch_select_indices(keep)
        self.attention, self.next_position = self.attention[keep], self.next_position[keep]
        self.rows = [self.rows[j] for j in keep.tolist()]
        first = int(self.attention.any(0).long().argmax())
        if first > 0 and self.mergeable():
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]
            self.attention = self.attention[:, first:]

    def step(self, model, token: torch.Tensor) -> None:
        """Feed each row its sampled token; keep the logits of the next one."""
        self.attention = torch.cat([self.attention, self.attention.new_ones(len(self.rows), 1)], dim=-1)
        out = model(
            input_ids=token[:, None],
            attention_mask=self.attention,
            position_ids=self.next_position[:, None],
            cache=self.cache,
            use_cache=True,
        )
        self.cache, self.logits = out.cache, out.logits[:, -1].float()
        self.next_position = self.next_position + 1


def _plain_dynamic(cache) -> bool:
    from transformers.cache_utils import DynamicLayer

    layers = list(getattr(cache, "layers", []))
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def stop_tokens_window(stops: Sequence[str]) -> int:
    """How many of a row's last tokens the stop check decodes: a stop string the newest token
    completes lies in them. Its characters are the ones that changed with that token or the ones
    before them, at most ``len(stop)`` characters of at most 4 bytes, and a token holds at least one
    byte; so ``4 * len(stop) + 4`` tokens hold it whole, and a decode of them gives its characters
    as the whole prefix's decode does (only the window's first character may differ: a byte-level
    token that starts mid-character, a word-start marker). The earlier prefix held no stop string,
    or the row would have ended there. Checked against the whole-prefix decode in
    ``tests/test_llm_policy.py``."""
    return 4 * max((len(stop) for stop in stops), default=0) + 4


def _holds_a_stop(tokenizer, row: list[int], stops: list[str]) -> bool:
    """Whether the decode of the row's last tokens (:func:`stop_tokens_window`) holds a stop string
    (its previous prefix did not, or the row would have ended there)."""
    text = tokenizer.decode(row, skip_special_tokens=False)
    return any(stop in text for stop in stops)


def completion_log_probs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's ``log_prob`` ``[B, T]`` of the completion tokens, with gradient, and the token entropy.

    The entropy (if ``with_entropy``) carries gradient only with ``entropy_grad`` (an entropy
    bonus); as a metric it is computed without building a graph over the vocabulary.
    Entries where ``completion_mask`` is False are 0 (finite, so masked means stay finite).
    """
    T = completion_ids.shape[-1]
    mask = torch.cat([prompt_mask, completion_mask], dim=-1)
    logits = (
        model(
            input_ids=torch.cat([prompt_ids, completion_ids], dim=-1),
            attention_mask=mask.long(),
            position_ids=_positions(mask),
            logits_to_keep=T + 1,
        )
        .logits[:, :-1]
        .float()
    )
    log_dist = (logits / (temperature if temperature > 0 else 1.0)).log_softmax(-1)
    log_prob = log_dist.gather(-1, completion_ids[..., None]).squeeze(-1)
    log_prob = torch.where(completion_mask, log_prob, torch.zeros_like(log_prob))
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(log_dist.exp() * log_dist).sum(-1)
            entropy = torch.where(completion_mask, entropy, torch.zeros_like(entropy))
    return log_prob, entropy


def cut_at_stop_strings(
    tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor, stop_strings
) -> tuple[torch.Tensor, torch.Tensor]:
    """End each completion at the token that completes its first stop string (e.g. a new ``Question:``).

    A generation-time stop string, applied after sampling: the tokens after the one that completes
    the stop string leave ``completion_mask`` (they are neither trained on nor scored), as if
    sampling had stopped there. The token holding the stop string stays (it was sampled, and its
    log-prob is part of the completion's). Returns the new mask and ``stopped`` ``[B]`` (bool).

    Per row with a stop string, a binary search over prefix decodes (about log2 T of them).
    """
    mask = completion_mask.clone()
    stopped = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    stops = [s for s in stop_strings if s]
    if not stops:
        return mask, stopped
    lengths = mask.sum(-1).tolist()
    rows = completion_ids.tolist()
    for i, (row, n) in enumerate(zip(rows, lengths)):

        def has_stop(j: int, row=row) -> bool:
            text = tokenizer.decode(row[:j], skip_special_tokens=False)
            return any(s in text for s in stops)

        if n == 0 or not has_stop(n):
            continue
        lo, hi = 1, n  # the smallest prefix length that holds a stop string
        while lo < hi:
            mid = (lo + hi) // 2
            if has_stop(mid):
                hi = mid
            else:
                lo = mid + 1
        mask[i, lo:] = False
        stopped[i] = True
    return mask, stopped
