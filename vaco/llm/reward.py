"""Verifiable rewards: a :class:`Reward` scores a completion against its problem's reference answer.

A reward is a class given by ``class_path`` under ``data.init_args.reward`` (as an objective is;
a module in the directory ``vaco`` runs in works too). Two ship: :class:`GSM8k` (the default, the
paper's) and :class:`BoxedMath` (a ``\\boxed{...}`` answer, MATH-style). A reward has two methods:
``reference(answer)`` reads a dataset record's answer once, when the data loads (a ``ValueError``
there refuses the file in one line naming the record), and ``__call__(completion, reference)``
scores the completion's *answer span* (the text before its first stop string) against what
``reference`` returned.

GSM8k (Cobbe et al. 2021, arXiv:2110.14168): 1 if the answer is right, else 0.

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
from typing import Any

__all__ = [
    "STOP_STRINGS",
    "answer_span",
    "extract_answer",
    "last_number",
    "parse_number",
    "reference_answer",
    "gsm8k_reward",
    "Reward",
    "GSM8k",
    "BoxedMath",
    "last_boxed",
    "normalise_math",
    "shipped_reward",
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


# ------------------------------------------------------------------------------ reward classes
class Reward:
    """A verifiable reward: subclass it and override :meth:`__call__` (and :meth:`reference` if
    the dataset's answers need reading).

    ``reference(answer)`` runs once per record when the data loads; what it returns is what
    ``__call__`` receives as ``reference``. Raise ``ValueError`` there for an answer the reward
    cannot use: the data module refuses the file in one line naming the record.
    ``__call__(completion, reference)`` gets the completion's answer span (the generated text
    before its first stop string, ``model.stop_strings``) and returns a float; it must not raise
    on any completion (a model writes anything). A completion counts as *solved* (pass@k) when its
    reward is at least :attr:`solved_at`: 1.0, full credit on a 0/1 reward; a reward with partial
    credit or another scale sets its own.
    """

    #: the reward at and above which a completion counts as solved (``vaco evaluate --samples``'s pass@k)
    solved_at: float = 1.0

    def reference(self, answer: Any) -> Any:
        return answer

    def __call__(self, completion: str, reference: Any) -> float:
        raise NotImplementedError(f"{type(self).__name__} must define __call__(completion, reference) -> float")

    def definition(self) -> dict[str, Any]:
        """What the run records (its checkpoint, its definition): the class path and the plain
        settings in ``vars(self)``."""
        settings = {k: v for k, v in vars(self).items() if isinstance(v, (bool, int, float, str, type(None)))}
        return {"class_path": class_path_of(type(self)), "init_args": settings}

    def __repr__(self) -> str:
        return f"{class_path_of(type(self))}()"


def class_path_of(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def shipped_reward(definition: Any, field: str) -> Reward:
    """The reward a checkpoint records, rebuilt only when it is one vaco ships: a checkpoint names
    no module vaco would import (``field``: the option that names another class instead)."""
    if definition is None:  # a run from before rewards were a field: GSM8k's
        return GSM8k()
    path = definition.get("class_path") if isinstance(definition, dict) else None
    shipped = {class_path_of(cls): cls for cls in (GSM8k, BoxedMath)}
    if path not in shipped:
        raise ValueError(
            f"the checkpoint's run scored with the reward {path!r}, not one vaco ships; vaco imports no module a "
            f"checkpoint names: give it with `{field} {path}` to load it from your code"
        )
    return shipped[path](**definition.get("init_args", {}))


class GSM8k(Reward):
    """GSM8k's reward (the default): the reference is the number after the answer's last ``####``;
    a completion scores 1 if its ``####``-marked number, else its last number, equals it exactly
    (:func:`gsm8k_reward`)."""

    def reference(self, answer: Any) -> Fraction:
        return reference_answer(answer)

    def __call__(self, completion: str, reference: Fraction) -> float:
        return gsm8k_reward(completion, reference, ())


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced;
    ``\\boxed 5`` (no braces) gives ``5``. None if there is none or its braces never close."""
    if not isinstance(text, str):
        return None
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start + (6 if text.startswith("\\boxed", start) else 5) :]
    if rest.startswith(" "):  # \boxed 5: up to the next space or $
        return re.split(r"[\s$]", rest.lstrip(), maxsplit=1)[0] or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        depth += (char == "{") - (char == "}")
        if depth == 0:
            return rest[1:i]
    return None


_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac(\d)(\d)")
_SPACING = re.compile(r"\\[,;:! ]|\\q?quad|\\left|\\right|\\displaystyle")


def normalise_math(answer: str) -> str:
    """A LaTeX answer in a canonical spelling, for exact comparison: spacing, ``\\left``/``\\right``,
    ``$``, degree marks, ``\\%``, a trailing period and ``\\text{...}`` wrappers go; ``\\dfrac`` and
    ``\\tfrac`` become ``\\frac`` and ``\\frac12`` becomes ``\\frac{1}{2}``; ``x = 5`` keeps ``5``;
    commas between digit groups go (``1,000``). The rules follow Hendrycks et al.'s MATH grader as
    verl's ``verl/utils/reward_score/math.py`` (``strip_string``) carries it."""
    s = str(answer).strip()
    s = _TEXT_WRAPPERS.sub(r"\1", s)
    s = _SPACING.sub("", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\circ", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = s.replace(" ", "").rstrip(".")
    if re.fullmatch(r"[A-Za-z]\w*=.+", s):  # "x=5": the value
        s = s.split("=", 1)[1]
    s = _THOUSANDS.sub("", s) if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s) else s
    return s


def _math_value(answer: str) -> Fraction | None:
    """A normalised answer as an exact number when it is one: ``0.5``, ``-3``, ``\\frac{1}{2}``, ``1/2``."""
    if "," in answer:  # a list or an interval, never one number here (1,000 lost its comma above)
        return None
    number = parse_number(answer)
    if number is not None:
        return number
    match = _FRAC.fullmatch(answer.lstrip("-")) or re.fullmatch(r"(\d+)/(\d+)", answer.lstrip("-"))
    if match:
        top, bottom = parse_number(match.group(1)), parse_number(match.group(2))
        if top is not None and bottom:
            return (-1 if answer.startswith("-") else 1) * top / bottom
    return None


class BoxedMath(Reward):
    """A ``\\boxed{...}`` answer (MATH, Hendrycks et al. 2021, and most reasoning datasets since).

    The reference is the last ``\\boxed{...}`` of the record's answer (a MATH solution) or, when it
    has none, the whole answer (a MATH-500 style ``answer`` column such as ``\\frac{14}{3}``). A
    completion scores 1 if its last ``\\boxed{...}`` equals the reference after
    :func:`normalise_math`, or when both are numbers (``0.5``, ``\\frac12``, ``1/2``) that are equal;
    a completion with no box scores 0. No symbolic algebra: ``2\\sqrt{2}`` and ``\\sqrt{8}`` differ
    (a ``math-verify`` reward is a subclass away).
    """

    def reference(self, answer: Any) -> str:
        if not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
            raise ValueError(f"a math answer must be a string or a number, got {type(answer).__name__}")
        text = str(answer)
        boxed = last_boxed(text) if ("\\boxed" in text or "\\fbox" in text) else text
        if boxed is None:
            raise ValueError(f"the answer's last \\boxed{{...}} never closes: {text[-60:]!r}")
        target = normalise_math(boxed)
        if not target:
            raise ValueError(f"the answer is empty after normalising: {text[-60:]!r}")
        return target

    def __call__(self, completion: str, reference: str) -> float:
        boxed = last_boxed(completion)
        if boxed is None:
            return 0.0
        answer = normalise_math(boxed)
        if answer == reference:
            return 1.0
        mine, theirs = _math_value(answer), _math_value(reference)
        return 1.0 if mine is not None and mine == theirs else 0.0
