"""Synthetic grade-school word problems in GSM8k's format, and a weak teacher to imitate.

Every problem is a GSM8k record ``{"question": ..., "answer": "<reasoning>\\n#### <number>"}``.
Six families, one or two arithmetic steps each. The supervised start imitates a *weak teacher*
(:func:`teacher_answer`) that makes one characteristic mistake per family with a fixed rate:
a wrong operation in one-step problems, stopping after the first step of two-step problems.
Where the rate is above 1/2 the supervised policy's most likely answer is wrong (greedy
decoding fails) while the right answer keeps a fair share of its samples; reinforcement
learning with the verifiable reward can then move the mass, which is the situation RLVR on a
pretrained LLM is in. The correct references are used for the reward and the test split.

    >>> problems = generate_problems(4, seed=0)
    >>> problems[0]["answer"].splitlines()[-1].startswith("#### ")
    True
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["FAMILIES", "DEFAULT_ERROR_RATES", "generate_problems", "teacher_answer", "generate_splits", "write_jsonl"]

_NAMES = ["Mia", "Tom", "Ali", "Sara", "Ben", "Lena", "Omar", "Eva", "Noah", "Zoe", "Ravi", "Ana"]
_ITEMS = ["apples", "pens", "books", "cards", "eggs", "stickers", "marbles", "shells", "cookies", "stamps"]


def _steps_answer(lines: Sequence[str], result: int) -> str:
    return "\n".join([*lines, f"#### {result}"])


@dataclass(frozen=True)
class Family:
    """One kind of problem: how to draw its numbers, phrase it, solve it and get it wrong."""

    name: str
    sample: Callable[[random.Random], dict]
    question: str
    solve: Callable[[dict], tuple[list[str], int]]
    mistake: Callable[[dict], tuple[list[str], int]]


def _buy_more(r):
    return {"a": r.randint(5, 30), "b": r.randint(2, 20)}


def _give_away(r):
    a = r.randint(10, 50)
    return {"a": a, "b": r.randint(2, a - 1)}


def _boxes(r):
    return {"a": r.randint(2, 9), "b": r.randint(2, 9)}


def _buy_then_give(r):
    a, b = r.randint(5, 30), r.randint(2, 20)
    return {"a": a, "b": b, "c": r.randint(2, min(a + b - 1, 20))}


def _bags_and_loose(r):
    return {"a": r.randint(2, 9), "b": r.randint(2, 9), "c": r.randint(1, 20)}


def _change(r):
    return {"a": r.randint(2, 5), "b": r.randint(2, 9), "c": 50}


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "buy_more",
            _buy_more,
            "{name} has {a} {item}. {name} buys {b} more {item}. How many {item} does {name} have now?",
            lambda n: ([f"{n['a']} + {n['b']} = {n['a'] + n['b']}"], n["a"] + n["b"]),
            lambda n: ([f"{n['a']} - {n['b']} = {n['a'] - n['b']}"], n["a"] - n["b"]),
        ),
        Family(
            "give_away",
            _give_away,
            "{name} has {a} {item}. {name} gives {b} {item} to {friend}. How many {item} does {name} have left?",
            lambda n: ([f"{n['a']} - {n['b']} = {n['a'] - n['b']}"], n["a"] - n["b"]),
            lambda n: ([f"{n['a']} + {n['b']} = {n['a'] + n['b']}"], n["a"] + n["b"]),
        ),
        Family(
            "boxes",
            _boxes,
            "{name} buys {a} boxes of {item}. Each box has {b} {item}. How many {item} does {name} buy?",
            lambda n: ([f"{n['a']} * {n['b']} = {n['a'] * n['b']}"], n["a"] * n["b"]),
            lambda n: ([f"{n['a']} + {n['b']} = {n['a'] + n['b']}"], n["a"] + n["b"]),
        ),
        Family(
            "buy_then_give",
            _buy_then_give,
            "{name} has {a} {item}. {name} buys {b} more {item}. Then {name} gives {c} {item} to {friend}. "
            "How many {item} does {name} have now?",
            lambda n: (
                [
                    f"{n['a']} + {n['b']} = {n['a'] + n['b']}",
                    f"{n['a'] + n['b']} - {n['c']} = {n['a'] + n['b'] - n['c']}",
                ],
                n["a"] + n["b"] - n["c"],
            ),
            lambda n: ([f"{n['a']} + {n['b']} = {n['a'] + n['b']}"], n["a"] + n["b"]),
        ),
        Family(
            "bags_and_loose",
            _bags_and_loose,
            "{name} has {a} bags with {b} {item} in each bag and {c} loose {item}. How many {item} does {name} have?",
            lambda n: (
                [
                    f"{n['a']} * {n['b']} = {n['a'] * n['b']}",
                    f"{n['a'] * n['b']} + {n['c']} = {n['a'] * n['b'] + n['c']}",
                ],
                n["a"] * n["b"] + n["c"],
            ),
            lambda n: ([f"{n['a']} * {n['b']} = {n['a'] * n['b']}"], n["a"] * n["b"]),
        ),
        Family(
            "change",
            _change,
            "{name} buys {a} {item} for {b} dollars each and pays with a {c} dollar bill. "
            "How many dollars of change does {name} get?",
            lambda n: (
                [
                    f"{n['a']} * {n['b']} = {n['a'] * n['b']}",
                    f"{n['c']} - {n['a'] * n['b']} = {n['c'] - n['a'] * n['b']}",
                ],
                n["c"] - n["a"] * n["b"],
            ),
            lambda n: ([f"{n['a']} * {n['b']} = {n['a'] * n['b']}"], n["a"] * n["b"]),
        ),
    )
}

#: the weak teacher's mistake rate per family: greedy decoding of its imitation gets the
#: first three right and the last three wrong (rates above 1/2)
DEFAULT_ERROR_RATES: dict[str, float] = {
    "buy_more": 0.1,
    "give_away": 0.3,
    "boxes": 0.2,
    "buy_then_give": 0.7,
    "bags_and_loose": 0.6,
    "change": 0.8,
}


def _check_families(families: Iterable[str]) -> list[str]:
    families = list(families)
    unknown = [f for f in families if f not in FAMILIES]
    if not families or unknown:
        raise ValueError(f"`families` must be a non-empty subset of {sorted(FAMILIES)}, got {families!r}")
    return families


def generate_problems(
    n: int, seed: int, families: Iterable[str] | None = None, exclude: set[str] | None = None
) -> list[dict]:
    """``n`` distinct problems ``{"question", "answer", "family", "numbers"}``, families in turn.

    Args:
        n: how many problems.
        seed: seeds the draw.
        families: which families (default: all six), cycled through in order.
        exclude: questions not to produce (e.g. the test split's, so the splits are disjoint).
    """
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"`n` must be an integer >= 1, got {n!r}")
    names = _check_families(FAMILIES if families is None else families)
    rng = random.Random(seed)
    seen = set(exclude or ())
    problems: list[dict] = []
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 50 * n:
            raise ValueError(f"cannot draw {n} distinct problems from families {names}")
        family = FAMILIES[names[len(problems) % len(names)]]
        numbers = family.sample(rng)
        name, friend = rng.sample(_NAMES, 2)
        question = family.question.format(name=name, friend=friend, item=rng.choice(_ITEMS), **numbers)
        if question in seen:
            continue
        seen.add(question)
        lines, result = family.solve(numbers)
        problems.append(
            {"question": question, "answer": _steps_answer(lines, result), "family": family.name, "numbers": numbers}
        )
    return problems


def teacher_answer(problem: Mapping, rng: random.Random, error_rates: Mapping[str, float] | None = None) -> str:
    """The weak teacher's GSM8k-format answer: the family's mistake with its rate, else the solution."""
    rates = DEFAULT_ERROR_RATES if error_rates is None else error_rates
    family = FAMILIES[problem["family"]]
    wrong = rng.random() < rates.get(family.name, 0.0)
    lines, result = (family.mistake if wrong else family.solve)(problem["numbers"])
    return _steps_answer(lines, result)


def generate_splits(
    num_train: int, num_test: int, num_sft: int, seed: int, families: Iterable[str] | None = None
) -> dict[str, list[dict]]:
    """Disjoint ``test``, ``train`` (RL prompts) and ``sft`` (teacher demonstrations) problem sets."""
    test = generate_problems(num_test, seed * 3 + 1, families)
    taken = {p["question"] for p in test}
    train = generate_problems(num_train, seed * 3 + 2, families, exclude=taken)
    taken |= {p["question"] for p in train}
    sft = generate_problems(num_sft, seed * 3 + 3, families, exclude=taken)
    return {"train": train, "test": test, "sft": sft}


def write_jsonl(records: Iterable[Mapping], path: str, keys: Sequence[str] = ("question", "answer")) -> None:
    """Write GSM8k records (only ``keys``) one JSON object per line, as GSM8k's own files are."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps({k: record[k] for k in keys}) + "\n")
