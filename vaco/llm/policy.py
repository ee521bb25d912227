"""The policy language model: loading, a tiny model for CPU, sampling with recorded log-probs, re-scoring.

Shape contract: prompts are ``[B, Lp]`` token ids, **left**-padded (``prompt_mask`` False on
padding); completions are ``[B, T]``, **right**-padded after their end-of-sequence token
(``completion_mask`` True on generated tokens, EOS included). Log-probs are per completion
token, ``[B, T]``, under ``softmax(logits / temperature)``: the distribution the tokens were
sampled from, so the learner's ``log_prob`` and the stored ``behavior_log_prob`` are comparable.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

__all__ = [
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
    compact: bool = True,
) -> dict[str, torch.Tensor]:
    """Sample completions (``temperature`` 0: greedy) and record each token's log-prob when it was drawn.

    A row ends at EOS or, with ``tokenizer`` and ``stop_strings``, at the token whose decoded prefix
    first holds a stop string (the decode of the whole prefix, as :func:`cut_at_stop_strings` does:
    tokenizer-safe where a character spans tokens); the loop ends when every row has ended.

    With ``compact`` (the default) a row that ended **leaves the batch**: the next forward passes,
    and the KV cache, hold only the rows still running, so a chunk whose rows end at different
    lengths costs what its running rows cost. The samples do not depend on it: every token is
    drawn by one ``torch.multinomial`` over all ``B`` rows (an ended row keeps its last
    distribution, and its draw is discarded), which consumes the generator by ``B x V`` whatever
    the rows hold, so each row's draw is the one it gets without compaction (tested: the same
    tokens and log-probs with and without). ``compact=False`` keeps ended rows in the batch as
    padding (for measuring the difference).

    ``should_stop`` is asked before every token: when it answers true, generation is abandoned
    (:class:`GenerationStopped`; a stop signal arrived, and a preemption warning does not wait for
    a whole rollout).

    Returns:
        ``completion_ids`` and ``behavior_log_prob`` ``[B, T]``, ``completion_mask`` ``[B, T]``
        (bool, EOS included), ``truncated`` ``[B]`` (neither EOS nor a stop string within
        ``max_new_tokens``).
    """
    stops = [text for text in stop_strings if text]
    if stops and tokenizer is None:
        raise ValueError("generate: stop strings need the tokenizer that decodes the completions")
    B = prompt_ids.shape[0]
    attention = prompt_mask.long()
    positions = _positions(prompt_mask)
    out = model(
        input_ids=prompt_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    cache, logits = out.cache, out.logits[:, -1].float()  # logits: [B, V], every row's latest
    next_position = positions[:, -1] + 1
    running = torch.arange(B, device=prompt_ids.device)  # the rows in the batch the model sees
    finished = torch.zeros(B, dtype=torch.bool, device=prompt_ids.device)
    tokens, log_probs, valid = [], [], []
    for step in range(max_new_tokens):
        if should_stop is not None and should_stop():
            raise GenerationStopped("generation abandoned: a stop was requested")
        if temperature > 0:
            dist = (logits / temperature).log_softmax(-1)
            token = torch.multinomial(dist.exp(), 1, generator=generator).squeeze(-1)
        else:
            dist = logits.log_softmax(-1)
            token = dist.argmax(-1)
        log_prob = dist.gather(-1, token[:, None]).squeeze(-1)
        tokens.append(torch.where(finished, pad_token_id, token))
        log_probs.append(torch.where(finished, 0.0, log_prob))
        valid.append(~finished)
        ended = token == eos_token_id
        if stops:
            ended = ended | _completes_a_stop(tokenizer, tokens, finished | ended, stops)
        finished = finished | ended
        if bool(finished.all()) or step == max_new_tokens - 1:  # no forward pass for a token never drawn
            break
        if compact and bool(finished[running].any()):
            keep = (~finished[running]).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            attention, next_position, running = attention[keep], next_position[keep], running[keep]
        attention = torch.cat([attention, attention.new_ones(attention.shape[0], 1)], dim=-1)
        out = model(
            input_ids=tokens[-1][running, None],
            attention_mask=attention,
            position_ids=next_position[:, None],
            cache=cache,
            use_cache=True,
        )
        cache = out.cache
        step_logits = out.logits[:, -1].float()
        if compact:
            logits = logits.index_copy(0, running, step_logits)
        else:
            logits = step_logits
        next_position = next_position + 1
    return {
        "completion_ids": torch.stack(tokens, -1),
        "behavior_log_prob": torch.stack(log_probs, -1),
        "completion_mask": torch.stack(valid, -1),
        "truncated": ~finished,
    }


def _completes_a_stop(tokenizer, tokens: list[torch.Tensor], skip: torch.Tensor, stops: list[str]) -> torch.Tensor:
    """``[B]``: whether each row not in ``skip`` holds a stop string in the decode of its tokens so far
    (its previous prefix did not, or the row would have ended there)."""
    found = torch.zeros_like(skip)
    rows = [i for i in range(skip.shape[0]) if not bool(skip[i])]
    if not rows:
        return found
    so_far = torch.stack(tokens, -1)[rows].tolist()
    for i, row in zip(rows, so_far):
        text = tokenizer.decode(row, skip_special_tokens=False)
        found[i] = any(stop in text for stop in stops)
    return found


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
