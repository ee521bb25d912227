"""The verifiable reward of GSM8k (Cobbe et al. 2021, arXiv:2110.14168): 1 if the answer is right, else 0.

The reference answer is the number after the last ``####`` (GSM8k's answer format). The model's
answer is read from the *answer span* of its completion: the text before the first stop string
(:data:`STOP_STRINGS`: a base model that runs on into a new ``Question:`` has ended its answer
there). In that span, the number right after the last ``####`` if there is one (GSM8k's marked
answer, as verl's and lm-eval's GSM8k scorers read it), else the span's last number. Both are
compared as exact rationals, so ``3.50`` equals ``3.5`` and ``1,000`` equals ``1000``. Parsing a
completion never raises: a completion with no number scores 0.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "STOP_STRINGS",
    "answer_span",
    "extract_answer",
    "last_number",
    "parse_number",
    "reference_answer",
    "gsm8k_reward",
]

#: where a completion's answer ends: a new question (the few-shot / base-model run-on) or a chat
#: template's end-of-turn marker left in the text
STOP_STRINGS: tuple[str, ...] = ("Question:", "<|im_end|>", "<|endoftext|>", "<|eot_id|>")

# a sign counts only where it cannot be a binary operator: not right after a digit ("5-3" is 5 minus 3)
_NUMBER = re.compile(r"(?<![\d.])[-+]?(?:\d+(?:\.\d+)?|\.\d+)|(?:\d+(?:\.\d+)?|\.\d+)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d)")
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-"})


def _normalise(text: str) -> str:
    return _THOUSANDS.sub("", text.translate(_MINUS_SIGNS))


def parse_number(text: str) -> Fraction | None:
    """``text`` as an exact rational (commas between digits dropped, ``$``/``%``/spaces ignored); None if it is no number."""
    if not isinstance(text, str):
        return None
    cleaned = _normalise(text).strip().strip("$%").replace(" ", "")
    if not re.fullmatch(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)", cleaned):
        return None
    try:
        return Fraction(Decimal(cleaned))
    except (InvalidOperation, ValueError):  # pragma: no cover - the regex admits only valid decimals
        return None


def last_number(text: str) -> Fraction | None:
    """The last number written in ``text`` (a completion), or None if there is none."""
    if not isinstance(text, str):
        return None
    matches = _NUMBER.findall(_normalise(text))
    return parse_number(matches[-1]) if matches else None


def answer_span(text: str, stop_strings: tuple[str, ...] | list[str] = STOP_STRINGS) -> str:
    """``text`` up to (not including) the first occurrence of any stop string."""
    if not isinstance(text, str):
        return ""
    cut = min((i for i in (text.find(s) for s in stop_strings if s) if i >= 0), default=len(text))
    return text[:cut]


_MARKED = re.compile(r"####\s*([-+\u2212]?\$?\s*[\d.,]*\d)")


def extract_answer(completion: str, stop_strings: tuple[str, ...] | list[str] = STOP_STRINGS) -> Fraction | None:
    """The completion's answer: in its answer span, the ``####``-marked number, else the last number."""
    span = answer_span(completion, stop_strings)
    if "####" in span:
        marked = _MARKED.match(span[span.rindex("####") :])
        return parse_number(marked.group(1).replace("$", "").replace(" ", "")) if marked else None
    return last_number(span)


def reference_answer(answer: str) -> Fraction:
    """The number after the last ``####`` of a GSM8k answer (or the whole string if it has no ``####``).

    Raises:
        ValueError: the reference holds no number (a broken data file, reported at load time).
    """
    tail = answer.rsplit("####", 1)[-1] if isinstance(answer, str) else answer
    value = parse_number(tail) if isinstance(tail, str) else None
    if value is None:
        raise ValueError(f"a GSM8k answer must end with '#### <number>', got {answer!r}")
    return value


def gsm8k_reward(
    completion: str, reference: str | Fraction, stop_strings: tuple[str, ...] | list[str] = STOP_STRINGS
) -> float:
    """``1.0`` if the answer of ``completion`` (:func:`extract_answer`) equals the reference answer, else ``0.0``.

    Args:
        completion: the generated text (anything: no number, or not a string, scores 0).
        reference: a GSM8k answer (``... #### 72``), a number string, or a parsed Fraction.
        stop_strings: where the answer span ends (default :data:`STOP_STRINGS`).
    """
    target = reference if isinstance(reference, Fraction) else reference_answer(reference)
    answer = extract_answer(completion, stop_strings)
    return 1.0 if answer is not None and answer == target else 0.0
