"""GSM8k-format data: plain JSONL/JSON/parquet readers and the LightningDataModule of prompt minibatches.

A GSM8k record is ``{"question": str, "answer": "<reasoning>\\n#### <number>"}`` (the files of
``openai/gsm8k``: ``train.jsonl``/``test.jsonl``, or the hub's parquet shards). The data module
yields one item per *generation batch*: N prompt minibatches of ``prompts_per_minibatch`` prompts
each, N being the model's ``num_minibatches``; there are ``num_steps / N`` items in a run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

import lightning as L
import torch

from vaco.llm.reward import reference_answer

__all__ = ["DEFAULT_PROMPT_TEMPLATE", "format_prompt", "read_gsm8k", "PromptStream", "GSM8kDataModule"]

DEFAULT_PROMPT_TEMPLATE = "Question: {question}\nAnswer:"


def format_prompt(template: str, question: str) -> str:
    """``template`` with ``{question}`` replaced (other braces are left alone)."""
    if not isinstance(template, str) or "{question}" not in template:
        raise ValueError(f"`prompt_template` must contain '{{question}}', got {template!r}")
    return template.replace("{question}", question)


def _read_records(path: str, field: str) -> list[dict]:
    if not isinstance(path, str) or not path:
        raise ValueError(f"`{field}` must be the path of a GSM8k .jsonl, .json or .parquet file, got {path!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`{field}`: no file {path!r}")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.endswith(".jsonl"):
        records = []
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise ValueError(f"`{field}`: {path} line {number} is not JSON ({err.msg})") from err
        return records
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
        if not isinstance(records, list):
            raise ValueError(f"`{field}`: {path} must hold a JSON list of records")
        return records
    raise ValueError(f"`{field}`: {path!r} must end in .jsonl, .json or .parquet")


def read_gsm8k(
    path: str, field: str = "data.train_path", question_key: str = "question", answer_key: str = "answer"
) -> list[dict]:
    """Records ``{"question", "answer", "target"}`` (``target``: the reference number) of a GSM8k file.

    Raises (naming ``field`` and the record): a missing file, an unknown format, a record without
    the question or answer key, an answer without ``#### <number>``.
    """
    records = _read_records(path, field)
    if not records:
        raise ValueError(f"`{field}`: {path} holds no records")
    out = []
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or question_key not in record or answer_key not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"`{field}`: record {number} of {path} needs keys {question_key!r} and {answer_key!r}, has {keys}"
            )
        try:
            target = reference_answer(record[answer_key])
        except ValueError as err:
            raise ValueError(f"`{field}`: record {number} of {path}: {err}") from None
        out.append({"question": str(record[question_key]), "answer": record[answer_key], "target": target})
    return out


class PromptStream:
    """``num_items`` generation batches, each ``minibatches`` lists of ``batch_size`` prompts.

    The prompts are one stream, shuffled anew on every pass over the data; prompt minibatch ``j``
    depends only on ``(seed, j)``, so a resumed run continues the same stream from item
    ``start``. Each item is a list of ``minibatches`` dicts ``{"prompt": [str], "target": [Fraction]}``.
    """

    def __init__(
        self,
        prompts: Sequence[str],
        targets: Sequence[Fraction],
        batch_size: int,
        minibatches: int,
        num_items: int,
        seed: int,
        start: int = 0,
    ) -> None:
        self.prompts, self.targets = list(prompts), list(targets)
        self.batch_size, self.minibatches, self.num_items, self.seed = batch_size, minibatches, num_items, seed
        self.position = start

    def __len__(self) -> int:
        return self.num_items

    def _order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.prompts), generator=generator).tolist()

    def minibatch(self, j: int) -> dict[str, list]:
        """Prompt minibatch ``j`` of the stream."""
        n = len(self.prompts)
        index, orders = [], {}
        for i in range(j * self.batch_size, (j + 1) * self.batch_size):
            epoch = i // n
            if epoch not in orders:
                orders[epoch] = self._order(epoch)
            index.append(orders[epoch][i % n])
        return {"prompt": [self.prompts[k] for k in index], "target": [self.targets[k] for k in index]}

    def __iter__(self) -> Iterator[list[dict[str, list]]]:
        while self.position < self.num_items:
            item = self.item(self.position)
            self.position += 1
            yield item

    def item(self, index: int) -> list[dict[str, list]]:
        """Generation batch ``index``: its ``minibatches`` minibatches (the same whenever it is asked for)."""
        first = index * self.minibatches
        return [self.minibatch(j) for j in range(first, first + self.minibatches)]


class GSM8kDataModule(L.LightningDataModule):
    """Prompts of a GSM8k-format train file for RL, and a held-out test file for ``eval/accuracy``.

    Args:
        train_path: GSM8k train file (``.jsonl``, ``.json`` or ``.parquet``; keys below).
        test_path: GSM8k test file, scored by greedy decoding.
        prompts_per_minibatch: prompts per optimiser step (the paper: 32; each gets G completions).
        num_steps: optimiser steps of the run (the paper: 256; with N minibatches per generation
            batch there are ``num_steps / N`` generation batches). Episodes = num_steps x prompts x G.
        eval_every: evaluate when the optimiser-step count passes a multiple of this (0: only at
            the start and the end). Evaluation happens between generation batches.
        num_eval: evaluate on the first ``num_eval`` test problems (default: all).
        prompt_template: how a question becomes a prompt; ``{question}`` is replaced.
        question_key, answer_key: the record's keys (GSM8k: ``question``, ``answer``).
        seed: shuffling seed (linked from ``seed_everything`` by the CLI).
    """

    # what a resumed run may not change (the learner adds its own); see RLVRModule.run_definition
    defining_fields = ("train_path", "prompts_per_minibatch", "prompt_template", "question_key", "answer_key", "seed")

    def __init__(
        self,
        train_path: str,
        test_path: str,
        prompts_per_minibatch: int = 32,
        num_steps: int = 256,
        eval_every: int = 32,
        num_eval: int | None = None,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        question_key: str = "question",
        answer_key: str = "answer",
        seed: int = 1,
    ) -> None:
        super().__init__()
        for name, value, low in (
            ("prompts_per_minibatch", prompts_per_minibatch, 1),
            ("num_steps", num_steps, 1),
            ("eval_every", eval_every, 0),
        ):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
                raise ValueError(f"`data.{name}` must be an integer >= {low}, got {value!r}")
        if num_eval is not None and not (isinstance(num_eval, int) and num_eval >= 1):
            raise ValueError(f"`data.num_eval` must be an integer >= 1 or null, got {num_eval!r}")
        if not (isinstance(prompt_template, str) and "{question}" in prompt_template):
            raise ValueError(f"`data.prompt_template` must contain '{{question}}', got {prompt_template!r}")
        for name, path in (("train_path", train_path), ("test_path", test_path)):
            if not (isinstance(path, str) and os.path.isfile(path)):
                raise FileNotFoundError(
                    f"`data.{name}`: no file {path!r}. Give a GSM8k .jsonl/.json/.parquet file, or create the "
                    "CPU setting's files with `python scripts/llm_prepare.py`."
                )
        self.save_hyperparameters()
        self.train_path, self.test_path = train_path, test_path
        self.prompts_per_minibatch, self.num_steps = prompts_per_minibatch, num_steps
        self.eval_every, self.num_eval = eval_every, num_eval
        self.prompt_template, self.seed = prompt_template, seed
        self.question_key, self.answer_key = question_key, answer_key
        self.train: list[dict] | None = None
        self.test: list[dict] | None = None
        self.stream: PromptStream | None = None
        self._position = 0
        self.learner = None  # bound by the learner's setup (bind)

    def setup(self, stage: str) -> None:
        if self.train is None:
            self.train = read_gsm8k(self.train_path, "data.train_path", self.question_key, self.answer_key)
            self.test = read_gsm8k(self.test_path, "data.test_path", self.question_key, self.answer_key)
            if self.num_eval is not None:
                self.test = self.test[: self.num_eval]

    def bind(self, learner) -> None:
        """Where the learner and this data module meet (the learner's ``setup`` calls it): the
        learner's cross-field checks run before any generation, and its N (minibatches per
        generation batch, which sets the forward lag) sizes the prompt stream."""
        learner.check_data(self)
        self.learner = learner

    def prompt(self, question: str) -> str:
        return format_prompt(self.prompt_template, question)

    def train_dataloader(self) -> PromptStream:
        # N (minibatches per generation batch) is the model's: it sets the forward lag
        minibatches = getattr(self.learner, "num_minibatches", 1)
        self.stream = PromptStream(
            [self.prompt(r["question"]) for r in self.train],
            [r["target"] for r in self.train],
            self.prompts_per_minibatch,
            minibatches,
            self.num_steps // minibatches,
            self.seed,
            start=self._position,
        )
        return self.stream

    def test_set(self) -> tuple[list[str], list[Fraction]]:
        """The evaluation prompts and their reference numbers."""
        return [self.prompt(r["question"]) for r in self.test], [r["target"] for r in self.test]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.stream.position if self.stream is not None else self._position}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._position = int(state_dict.get("position", 0))
