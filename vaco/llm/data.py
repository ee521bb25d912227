"""Problems with verifiable answers: readers for local files and the LightningDataModule of prompt minibatches.

A record holds a question and an answer under keys the config names (``question_key``,
``answer_key``; GSM8k's ``{"question", "answer": "<reasoning>\\n#### <number>"}`` by default). A
file is JSONL, JSON (a list of records), parquet, or a folder written by ``datasets``'
``Dataset.save_to_disk``. The reward (``data.reward``, :mod:`vaco.llm.reward`) reads every answer
when the data loads. The data module yields one item per *generation batch*: N prompt
minibatches of ``prompts_per_minibatch`` prompts each, N being the model's ``num_minibatches``;
there are ``num_steps / N`` items in a run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

import lightning as L
import torch

from vaco import _checks
from vaco.llm.reward import GSM8k, Reward

__all__ = [
    "DEFAULT_PROMPT_TEMPLATE",
    "format_prompt",
    "read_problems",
    "read_gsm8k",
    "PromptStream",
    "GSM8kDataModule",
]

FORMATS = "a .jsonl, .json or .parquet file, or a folder written by datasets' save_to_disk"

DEFAULT_PROMPT_TEMPLATE = "Question: {question}\nAnswer:"


def format_prompt(template: str, question: str) -> str:
    """``template`` with ``{question}`` replaced (other braces are left alone)."""
    if not isinstance(template, str) or "{question}" not in template:
        raise ValueError(f"`prompt_template` must contain '{{question}}', got {template!r}")
    return template.replace("{question}", question)


def _read_saved_dataset(path: str, field: str) -> list[dict]:
    """The rows of a ``datasets`` ``Dataset.save_to_disk`` folder (arrow files; no code runs)."""
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        splits = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
        raise ValueError(
            f"`{field}`: {path} holds a DatasetDict with splits {splits}; give one split's folder, "
            f"e.g. {os.path.join(path, splits[0] if splits else 'train')}"
        )
    if not os.path.isfile(os.path.join(path, "state.json")):
        raise ValueError(f"`{field}`: {path} is a folder but not one written by datasets' save_to_disk (no state.json)")
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"`{field}`: reading the datasets folder {path} needs the `datasets` package: pip install -e '.[llm]'"
        ) from None
    return datasets.load_from_disk(path, keep_in_memory=True).to_list()


#: the most a data file's records may hold, uncompressed (GSM8k's train split is 4 MB): a larger file,
#: or a parquet file that decompresses past it, is refused before it is read
MAX_DATA_BYTES = 1 << 30
#: the longest question a record may hold, in characters: a prompt keeps at most ``max_prompt_length``
#: tokens, and tokenizing a longer one whole first costs memory without bound
MAX_QUESTION_CHARS = 1_000_000


def _data_bytes(path: str) -> int:
    """What ``path``'s records hold uncompressed: a parquet file's row groups by its metadata (read
    without decompressing), a folder's files, else the file's size."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(path).metadata
        return sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return os.path.getsize(path)


def _read_records(path: str, field: str) -> list[dict]:
    if not isinstance(path, str) or not path:
        raise ValueError(f"`{field}` must be the path of {FORMATS}, got {path!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"`{field}`: no file {path!r}")
    try:
        size = _data_bytes(path)
    except OSError:
        size = 0  # unreadable: the reader below says so
    except Exception as err:  # noqa: BLE001 - pyarrow's error for a file that is no parquet
        raise ValueError(f"`{field}`: {path} is not a readable parquet file ({type(err).__name__})") from None
    if size > MAX_DATA_BYTES:
        raise ValueError(
            f"`{field}`: {path} holds {size:,} bytes of records uncompressed, more than vaco reads "
            f"({MAX_DATA_BYTES:,}); split it or keep the problems you train on"
        )
    if os.path.isdir(path):
        return _read_saved_dataset(path, field)
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
    raise ValueError(f"`{field}`: {path!r} must be {FORMATS}")


def read_problems(
    path: str,
    field: str = "data.train_path",
    question_key: str = "question",
    answer_key: str = "answer",
    reward: Reward | None = None,
) -> list[dict]:
    """Records ``{"question", "answer", "target"}`` of a file (``target``: ``reward.reference(answer)``).

    Raises (naming ``field`` and the record): a missing file, an unknown format, a record without
    the question or answer key, an answer the reward cannot read.
    """
    reward = GSM8k() if reward is None else reward
    records = _read_records(path, field)
    if not records:
        raise ValueError(f"`{field}`: {path} holds no records")
    out = []
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or question_key not in record or answer_key not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"`{field}`: record {number} of {path} needs keys {question_key!r} and {answer_key!r} "
                f"(data.question_key, data.answer_key), has {keys}"
            )
        try:
            target = reward.reference(record[answer_key])
        except ValueError as err:
            raise ValueError(
                f"`{field}`: record {number} of {path}: {type(reward).__name__} cannot read its {answer_key!r}: {err}"
            ) from None
        question = str(record[question_key])
        if len(question) > MAX_QUESTION_CHARS:
            raise ValueError(
                f"`{field}`: record {number} of {path}: its {question_key!r} is {len(question):,} characters, over the "
                f"{MAX_QUESTION_CHARS:,} a prompt may have (it keeps at most model.max_prompt_length tokens); cut it"
            )
        out.append({"question": question, "answer": record[answer_key], "target": target})
    return out


def read_gsm8k(
    path: str, field: str = "data.train_path", question_key: str = "question", answer_key: str = "answer"
) -> list[dict]:
    """:func:`read_problems` with GSM8k's reward (``target``: the number after ``####``)."""
    return read_problems(path, field, question_key, answer_key, GSM8k())


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
    """Prompts of a train file for RL, and a held-out test file for ``eval/accuracy`` (GSM8k's format by default).

    Args:
        train_path: the train problems: a ``.jsonl``, ``.json`` or ``.parquet`` file, or a folder
            written by ``datasets``' ``Dataset.save_to_disk`` (keys below).
        test_path: the test problems (the same formats), scored by greedy decoding.
        prompts_per_minibatch: prompts per optimiser step (the paper: 32; each gets G completions).
        num_steps: optimiser steps of the run (the paper: 256; with N minibatches per generation
            batch there are ``num_steps / N`` generation batches). Episodes = num_steps x prompts x G.
        eval_every: evaluate when the optimiser-step count passes a multiple of this (0: only at
            the start and the end). Evaluation happens between generation batches.
        num_eval: evaluate on the first ``num_eval`` test problems (default: all).
        prompt_template: how a question becomes a prompt; ``{question}`` is replaced.
        question_key, answer_key: the record's keys (GSM8k: ``question``, ``answer``; MATH:
            ``problem``, ``solution``).
        reward: the verifiable reward (``class_path`` in YAML; :mod:`vaco.llm.reward`):
            ``vaco.llm.reward.GSM8k`` (default), ``vaco.llm.reward.BoxedMath``, or a subclass of
            ``vaco.llm.reward.Reward`` in your own module. It reads every answer at load time.
        chat_template: wrap each prompt (after ``prompt_template``) as one user turn of the
            tokenizer's chat template, with the assistant's turn opened (``add_generation_prompt``).
            Default ``null``: when the tokenizer has a template; ``false``: never; ``true``: always
            (a tokenizer without one is refused).
        seed: shuffling seed (linked from ``seed_everything`` by the CLI).
    """

    # what a resumed run may not change (the learner adds its own); see RLVRModule.run_definition
    defining_fields = (
        "train_path",
        "prompts_per_minibatch",
        "prompt_template",
        "question_key",
        "answer_key",
        "reward",
        "chat_template",
        "seed",
    )

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
        reward: Reward | None = None,
        chat_template: bool | None = None,
        seed: int = 1,
    ) -> None:
        super().__init__()
        _checks.integers(
            "data",
            ("prompts_per_minibatch", prompts_per_minibatch, 1),
            ("num_steps", num_steps, 1),
            ("eval_every", eval_every, 0),
        )
        if num_eval is not None and not (isinstance(num_eval, int) and num_eval >= 1):
            raise ValueError(f"`data.num_eval` must be an integer >= 1 or null, got {num_eval!r}")
        if not (isinstance(prompt_template, str) and "{question}" in prompt_template):
            raise ValueError(f"`data.prompt_template` must contain '{{question}}', got {prompt_template!r}")
        for name, path in (("train_path", train_path), ("test_path", test_path)):
            if not (isinstance(path, str) and os.path.exists(path)):
                raise FileNotFoundError(
                    f"`data.{name}`: no file {path!r}. Give {FORMATS}, or create the CPU setting's GSM8k files "
                    "with `python scripts/llm_prepare.py`."
                )
        reward = GSM8k() if reward is None else reward
        if not isinstance(reward, Reward):
            raise ValueError(
                f"`data.reward` must be a vaco.llm.reward.Reward (a class_path to a subclass), got {type(reward).__name__}"
            )
        if chat_template not in (None, True, False):
            raise ValueError(f"`data.chat_template` must be true, false or null, got {chat_template!r}")
        self.save_hyperparameters(ignore=["reward"])
        self.hparams["reward"] = reward.definition()  # plain values: the checkpoint holds no object
        self.reward, self.chat_template = reward, chat_template
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
        self.tokenizer = None  # the learner's, once its model is loaded (or set by vaco evaluate)
        # read now: a file the reward cannot read is refused before any model loads
        self.train = read_problems(train_path, "data.train_path", question_key, answer_key, reward)
        self.test = read_problems(test_path, "data.test_path", question_key, answer_key, reward)
        if num_eval is not None:
            self.test = self.test[:num_eval]

    def setup(self, stage: str) -> None:
        """The problems were read by ``__init__``."""

    def bind(self, learner) -> None:
        """Where the learner and this data module meet (the learner's ``setup`` calls it): the
        learner's cross-field checks run before any generation, and its N (minibatches per
        generation batch, which sets the forward lag) sizes the prompt stream."""
        learner.check_data(self)
        self.learner = learner

    def _tokenizer(self):
        if self.tokenizer is None and self.learner is not None:
            self.tokenizer = getattr(self.learner, "tokenizer", None)
        return self.tokenizer

    def uses_chat_template(self) -> bool:
        """Whether prompts go through the tokenizer's chat template (``chat_template`` and the tokenizer)."""
        tokenizer = self._tokenizer()
        has_one = bool(getattr(tokenizer, "chat_template", None))
        if self.chat_template is True and tokenizer is not None and not has_one:
            raise ValueError(
                "`data.chat_template` is true but the model's tokenizer has no chat template: set it to false "
                "or null, or add `chat_template` to the tokenizer's files"
            )
        return has_one if self.chat_template is None else bool(self.chat_template)

    def prompt(self, question: str) -> str:
        text = format_prompt(self.prompt_template, question)
        if not self.uses_chat_template():
            return text
        # transformers renders the template in its sandboxed Jinja environment
        return self._tokenizer().apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )

    def score(self, completions: Sequence[str], targets: Sequence[Any]) -> list[float]:
        """The reward of each completion's answer span against its target."""
        return [float(self.reward(c, t)) for c, t in zip(completions, targets)]

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
