"""Scoring a policy on GSM8k-format prompts: greedy accuracy and pass@k.

:func:`answer` decodes a list of prompts (greedy, or sampled at a temperature), cuts each
completion at its first stop string and scores it with the data's reward (:mod:`vaco.llm.reward`): what
the learner's in-run evaluation does (``RLVRModule.evaluate``) and what ``vaco evaluate --ckpt``
does with an LLM checkpoint (:func:`evaluate_checkpoint`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vaco.llm.policy import cut_at_stop_strings, encode_prompts, generate
from vaco.llm.reward import STOP_STRINGS, GSM8k, Reward, answer_span, shipped_reward
from vaco.run.checkpoint import is_llm_checkpoint  # noqa: F401  (re-exported: the LLM track's public name)

__all__ = ["Answers", "answer", "pass_at_k", "evaluate_checkpoint", "is_llm_checkpoint"]


@dataclass
class Answers:
    """Per completion (in prompt order, ``samples`` per prompt): its reward (1 correct, 0 not) and length in tokens."""

    rewards: list[float]
    lengths: list[int]


@torch.no_grad()
def answer(
    policy: torch.nn.Module,
    tokenizer,
    prompts: list[str],
    targets: list,
    *,
    max_prompt_length: int,
    max_new_tokens: int,
    stop_strings,
    batch_size: int,
    decoder: str = "vaco",
    device: torch.device | str = "cpu",
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    temperature: float = 0.0,
    samples: int = 1,
    generator: torch.Generator | None = None,
    should_stop: Callable[[], bool] | None = None,
    reward: Callable[[str, Any], float] | None = None,
) -> Answers:
    """Decode ``samples`` completions of each prompt (``temperature`` 0: greedy) and score each
    answer span with ``reward`` (:class:`vaco.llm.reward.GSM8k` by default)."""
    reward = GSM8k() if reward is None else reward
    prompts = [p for p in prompts for _ in range(samples)]
    targets = [t for t in targets for _ in range(samples)]
    was_training = policy.training
    policy.eval()
    rewards, lengths = [], []
    try:
        ids, mask, _ = encode_prompts(tokenizer, prompts, max_prompt_length)
        with autocast():
            out = generate(
                policy,
                ids.to(device),
                mask.to(device),
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                temperature=temperature,
                generator=generator,
                tokenizer=tokenizer,
                stop_strings=stop_strings,
                slots=batch_size,  # continuous batching: a finished answer's slot takes the next prompt
                should_stop=should_stop,
                decoder=decoder,
            )
        cut, _ = cut_at_stop_strings(tokenizer, out["completion_ids"], out["completion_mask"], stop_strings)
        completion_ids = out["completion_ids"].masked_fill(~cut, tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        rewards += [float(reward(answer_span(x, stop_strings), t)) for x, t in zip(texts, targets)]
        lengths += cut.sum(-1).tolist()
    finally:
        policy.train(was_training)
    return Answers(rewards, lengths)


def pass_at_k(rewards: list[float], samples: int, solved_at: float = 1.0) -> float:
    """The fraction of prompts with at least one solved completion among their ``samples``
    (``rewards`` in prompt order, ``samples`` per prompt; solved: a reward of at least ``solved_at``,
    the reward's :attr:`~vaco.llm.reward.Reward.solved_at`): pass@k with k = n = ``samples``. Partial
    credit below ``solved_at`` solves nothing."""
    rows = [rewards[i : i + samples] for i in range(0, len(rewards), samples)]
    return sum(any(r >= solved_at for r in row) for row in rows) / len(rows)


def evaluate_checkpoint(
    ckpt: dict,
    *,
    samples: int = 0,
    temperature: float = 1.0,
    test_path: str | None = None,
    num_eval: int | None = None,
    batch_size: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    reward: str | None = None,
) -> dict[str, float]:
    """Greedy accuracy of an LLM checkpoint's policy on its run's test split (``eval/accuracy``, as
    in the run), and with ``samples`` = k > 0, pass@k and the mean accuracy of k completions sampled
    at ``temperature``. The base model's files (tokenizer, config) come from the run's
    ``model_path``; the weights from the checkpoint. The run's reward is rebuilt when vaco ships it;
    ``reward`` (a class path, ``--reward``) names the run's own reward class, imported from the
    working directory (a checkpoint alone never makes vaco import a module). Raises ``ValueError``
    naming the field."""
    from vaco.llm.data import GSM8kDataModule
    from vaco.llm.policy import check_model_dir, load_causal_lm, load_tokenizer, resolve_compute_dtype

    hparams = ckpt["hyper_parameters"]
    data_hparams = {k: v for k, v in ckpt.get("datamodule_hyper_parameters", {}).items() if not k.startswith("_")}
    if not data_hparams:
        raise ValueError("`--ckpt`: the checkpoint holds no data module settings (no test split to evaluate on)")
    if test_path is not None:
        data_hparams["test_path"] = test_path
    if num_eval is not None:
        data_hparams["num_eval"] = num_eval
    check_model_dir(hparams["model_path"], "the checkpoint's model.model_path")
    data_hparams["reward"] = _reward(data_hparams.get("reward"), reward)
    data = GSM8kDataModule(**data_hparams)
    tokenizer = load_tokenizer(hparams["model_path"])
    data.tokenizer = tokenizer  # the chat template, as the run applied it
    prompts, targets = data.test_set()

    device = torch.device(device)
    policy = load_causal_lm(hparams["model_path"], "float32").to(device)
    state = {k[len("policy.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("policy.")}
    policy.load_state_dict(state)
    dtype = resolve_compute_dtype(hparams.get("dtype", "float32"), device.type)
    autocast = (
        contextlib.nullcontext
        if dtype == torch.float32
        else (lambda: torch.autocast(device_type=device.type, dtype=dtype))
    )
    stops = STOP_STRINGS if hparams.get("stop_strings") is None else tuple(hparams["stop_strings"])
    common = dict(
        max_prompt_length=hparams["max_prompt_length"],
        max_new_tokens=hparams.get("eval_max_completion_length") or hparams["max_completion_length"],
        stop_strings=stops,
        batch_size=batch_size or hparams.get("eval_batch_size", 256),
        device=device,
        autocast=autocast,
    )
    greedy = answer(policy, tokenizer, prompts, targets, reward=data.reward, **common)
    out = {
        "prompts": float(len(prompts)),
        "eval/accuracy": sum(greedy.rewards) / len(greedy.rewards),
        "eval/completion_length": sum(greedy.lengths) / len(greedy.lengths),
    }
    if samples > 0:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        sampled = answer(
            policy,
            tokenizer,
            prompts,
            targets,
            temperature=temperature,
            samples=samples,
            generator=generator,
            reward=data.reward,
            **common,
        )
        out[f"eval/pass@{samples}"] = pass_at_k(sampled.rewards, samples, getattr(data.reward, "solved_at", 1.0))
        out["eval/sample_accuracy"] = sum(sampled.rewards) / len(sampled.rewards)
    return out


def _reward(definition, class_path: str | None):
    """The run's reward: a shipped one from its definition, or ``class_path`` (``--reward``) imported."""

    if class_path is None:
        return shipped_reward(definition, "--reward")

    module_name, _, name = class_path.rpartition(".")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `vaco fit` finds a module in the directory it runs in
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"`--reward`: cannot import {class_path!r} ({err})") from None
    if not (isinstance(cls, type) and issubclass(cls, Reward)):
        raise ValueError(f"`--reward`: {class_path} is not a subclass of vaco.llm.reward.Reward")
    saved = definition if isinstance(definition, dict) and definition.get("class_path") == class_path else {}
    return cls(**saved.get("init_args", {}))
