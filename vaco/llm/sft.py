"""The supervised start of the CPU setting: data, tokenizer, a tiny Llama, and a short imitation fit.

:func:`prepare_cpu_setting` writes everything an RL run reads from disk, in the same layout as
the paper's GPU setting (a model directory and GSM8k-format data files)::

    <out_dir>/train.jsonl   RL prompts with correct references (GSM8k format)
    <out_dir>/test.jsonl    held-out problems for eval/accuracy (GSM8k format)
    <out_dir>/model/        the supervised policy and its tokenizer (save_pretrained)
    <out_dir>/setting.json  the settings and the supervised policy's greedy test accuracy

It is cached: a second call with the same settings returns the stored summary, so every RL run
starts from the same supervised policy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vaco.llm.data import DEFAULT_PROMPT_TEMPLATE, format_prompt
from vaco.llm.policy import completion_log_probs, encode_prompts, generate, tiny_causal_lm
from vaco.llm.reward import gsm8k_reward
from vaco.llm.synthetic import DEFAULT_ERROR_RATES, FAMILIES, generate_splits, teacher_answer, write_jsonl
from vaco.llm.tokenizer import train_tokenizer
from vaco.objectives.objective_math import masked_mean

__all__ = ["CpuSetting", "prepare_cpu_setting", "supervised_finetune", "greedy_accuracy", "encode_pairs"]


@dataclass
class CpuSetting:
    """Everything that defines the supervised start (the cache key).

    Args:
        seed: seeds the problems, the teacher, the initial weights and the SFT batches.
        num_train: RL training prompts (GSM8k has ~7.5k).
        num_test: held-out test problems.
        num_sft: teacher demonstrations for the supervised fit (disjoint from both).
        families: problem families (see :mod:`vaco.llm.synthetic`).
        error_rates: the weak teacher's mistake rate per family.
        vocab_size: BPE vocabulary size (the synthetic corpus saturates near 440).
        hidden_size, num_layers, num_heads, intermediate_size: the Llama's size.
        sft_steps, sft_batch_size, sft_lr: the supervised fit (AdamW, linear warm-up and decay).
        prompt_template: how a question becomes a prompt (the RL configs must use the same).
    """

    seed: int = 0
    num_train: int = 8000
    num_test: int = 1000
    num_sft: int = 8000
    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    error_rates: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ERROR_RATES))
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    sft_steps: int = 2500
    sft_batch_size: int = 64
    sft_lr: float = 1e-3
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE

    def __post_init__(self) -> None:
        for name in (
            "num_train",
            "num_test",
            "num_sft",
            "sft_steps",
            "sft_batch_size",
            "hidden_size",
            "num_layers",
            "num_heads",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"`hidden_size` ({self.hidden_size}) must be a multiple of `num_heads` ({self.num_heads})")
        if not (self.sft_lr > 0 and math.isfinite(self.sft_lr)):
            raise ValueError(f"`sft_lr` must be > 0, got {self.sft_lr!r}")
        unknown = [f for f in self.error_rates if f not in FAMILIES]
        bad = {f: r for f, r in self.error_rates.items() if not (0.0 <= r <= 1.0)}
        if unknown or bad:
            raise ValueError(f"`error_rates` must map families of {sorted(FAMILIES)} to [0, 1]; bad: {unknown or bad}")
        format_prompt(self.prompt_template, "q")  # fails early on a broken template


def encode_pairs(tokenizer, prompts: Sequence[str], completions: Sequence[str], max_prompt_length: int = 512):
    """Left-padded prompts and right-padded completions (+ EOS), tokenized apart as in RL."""
    prompt_ids, prompt_mask, _ = encode_prompts(tokenizer, list(prompts), max_prompt_length)
    rows = [r + [tokenizer.eos_token_id] for r in tokenizer(list(completions), add_special_tokens=False)["input_ids"]]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return prompt_ids, prompt_mask, ids, mask


def supervised_finetune(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    log_every: int = 0,
) -> list[float]:
    """Maximise the token-mean log-likelihood of ``completions`` given ``prompts``; return the losses."""
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"need as many completions as prompts (>= 1), got {len(prompts)} and {len(completions)}")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min((i + 1) / warmup, max(0.0, (steps - i) / max(1, steps - warmup)))
    )
    model.train()
    losses: list[float] = []
    for step in range(steps):
        index = torch.randint(len(prompts), (batch_size,), generator=generator).tolist()
        batch = encode_pairs(tokenizer, [prompts[i] for i in index], [completions[i] for i in index])
        log_prob, _ = completion_log_probs(model, *batch)
        loss = -masked_mean(log_prob, batch[3])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if log_every and (step + 1) % log_every == 0:
            print(f"sft step {step + 1}/{steps}: loss {sum(losses[-log_every:]) / log_every:.4f}", flush=True)
    model.eval()
    return losses


@torch.no_grad()
def greedy_accuracy(
    model, tokenizer, prompts: Sequence[str], references: Sequence[str], *, max_new_tokens: int, batch_size: int = 256
) -> tuple[float, list[float]]:
    """Fraction of prompts whose greedy completion earns reward 1, and the per-prompt rewards."""
    ids, mask, _ = encode_prompts(tokenizer, list(prompts), 512)
    out = generate(
        model,
        ids,
        mask,
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        temperature=0.0,
        slots=batch_size,
    )
    texts = tokenizer.batch_decode(out["completion_ids"], skip_special_tokens=True)
    rewards = [gsm8k_reward(t, r) for t, r in zip(texts, references)]
    return sum(rewards) / len(rewards), rewards


def prepare_cpu_setting(out_dir: str, setting: CpuSetting | None = None, *, verbose: bool = True) -> dict:
    """Write (or reuse) the CPU setting's data and supervised policy under ``out_dir``; return its summary."""
    setting = setting or CpuSetting()
    summary_path = os.path.join(out_dir, "setting.json")
    wanted = dataclasses.asdict(setting)
    if os.path.isfile(summary_path):
        with open(summary_path, encoding="utf-8") as f:
            summary = json.load(f)
        if summary.get("setting") == wanted and os.path.isfile(os.path.join(out_dir, "model", "config.json")):
            if verbose:
                print(f"reusing the supervised policy in {out_dir} (test accuracy {summary['test_accuracy']:.3f})")
            return summary
    start = time.perf_counter()
    random.seed(setting.seed)
    torch.manual_seed(setting.seed)
    splits = generate_splits(setting.num_train, setting.num_test, setting.num_sft, setting.seed, setting.families)
    write_jsonl(splits["train"], os.path.join(out_dir, "train.jsonl"))
    write_jsonl(splits["test"], os.path.join(out_dir, "test.jsonl"))

    teacher = random.Random(setting.seed + 17)
    prompts = [format_prompt(setting.prompt_template, p["question"]) for p in splits["sft"]]
    completions = [" " + teacher_answer(p, teacher, setting.error_rates) for p in splits["sft"]]
    tokenizer = train_tokenizer([p + c for p, c in zip(prompts, completions)], setting.vocab_size)
    tokenizer.padding_side = "left"
    model = tiny_causal_lm(
        tokenizer,
        hidden_size=setting.hidden_size,
        num_layers=setting.num_layers,
        num_heads=setting.num_heads,
        intermediate_size=setting.intermediate_size,
    )
    losses = supervised_finetune(
        model,
        tokenizer,
        prompts,
        completions,
        steps=setting.sft_steps,
        batch_size=setting.sft_batch_size,
        lr=setting.sft_lr,
        seed=setting.seed,
        log_every=100 if verbose else 0,
    )
    model.save_pretrained(os.path.join(out_dir, "model"))
    tokenizer.save_pretrained(os.path.join(out_dir, "model"))

    test_prompts = [format_prompt(setting.prompt_template, p["question"]) for p in splits["test"]]
    accuracy, rewards = greedy_accuracy(
        model, tokenizer, test_prompts, [p["answer"] for p in splits["test"]], max_new_tokens=32
    )
    by_family: dict[str, list[float]] = {}
    for problem, reward in zip(splits["test"], rewards):
        by_family.setdefault(problem["family"], []).append(reward)
    summary = {
        "setting": wanted,
        "test_accuracy": accuracy,
        "test_accuracy_by_family": {k: sum(v) / len(v) for k, v in by_family.items()},
        "sft_final_loss": sum(losses[-50:]) / len(losses[-50:]),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "seconds": time.perf_counter() - start,
    }
    with open(summary_path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    if verbose:
        print(json.dumps({k: v for k, v in summary.items() if k != "setting"}, indent=2))
    return summary
