"""The GSM8k verifiable reward on a table of tricky completions and references."""

from __future__ import annotations

from fractions import Fraction

import pytest

from vaco.llm.reward import answer_span, extract_answer, gsm8k_reward, last_number, parse_number, reference_answer

GSM8K_ANSWER = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.mark.parametrize(
    "completion,reference,expected",
    [
        (" 48 / 2 = 24\n24 + 48 = 72\n#### 72", GSM8K_ANSWER, 1.0),  # the format the policy is taught
        ("She sold 72 clips in total.", GSM8K_ANSWER, 1.0),  # no "####": the last number counts
        ("#### 72\nand then 5 more", GSM8K_ANSWER, 1.0),  # the ####-marked answer, not the last number
        ("#### 5\nso 72", GSM8K_ANSWER, 0.0),  # ... even when a later number is right
        ("#### $1,234", "#### 1234", 1.0),  # a marked answer with a currency sign and separators
        ("12 + 60 = 72\n#### 72\n\nQuestion: Tom has 5 apples.\nAnswer: #### 5", GSM8K_ANSWER, 1.0),  # run-on
        ("12 + 60 = 72\n\nQuestion: Tom has 5 apples and eats 3.", GSM8K_ANSWER, 1.0),  # run-on, no ####
        ("so 5\n\nQuestion: Tom has 72 apples.", GSM8K_ANSWER, 0.0),  # the run-on's number is not the answer
        ("the answer is 72<|im_end|>\n<|im_start|>user\n3", GSM8K_ANSWER, 1.0),  # a chat template's end
        ("The answer is 1,234.", "#### 1234", 1.0),  # thousands separator in the completion
        ("#### 1234", "#### 1,234", 1.0),  # ... or in the reference
        ("It costs $18.", "#### 18", 1.0),  # currency sign, sentence-final period
        ("3.50 dollars", "#### 3.5", 1.0),  # decimals compare as numbers
        ("#### 72.0", GSM8K_ANSWER, 1.0),
        ("#### 72.5", GSM8K_ANSWER, 0.0),
        ("#### .5", "#### 0.5", 1.0),
        ("the result is -7", "#### -7", 1.0),  # a sign
        ("the result is \u22127", "#### -7", 1.0),  # the Unicode minus
        ("the result is 7", "#### -7", 0.0),
        ("10 - 3 = 7", "#### 7", 1.0),  # a minus after a digit is an operator: the answer is 7, not -7
        ("+5", "#### 5", 1.0),
        ("42%", "#### 42", 1.0),
        ("007", "#### 7", 1.0),
        ("I do not know.", GSM8K_ANSWER, 0.0),  # no number: 0, no exception
        ("", GSM8K_ANSWER, 0.0),
        ("####", GSM8K_ANSWER, 0.0),
        (None, GSM8K_ANSWER, 0.0),  # not even a string
        ("72", "72", 1.0),  # a bare number as the reference
        ("72", Fraction(72), 1.0),  # a parsed reference
    ],
)
def test_reward_table(completion, reference, expected):
    assert gsm8k_reward(completion, reference) == expected


@pytest.mark.parametrize(
    "text,number",
    [
        ("a 1,000,000 b", Fraction(1_000_000)),
        ("x=3; y=-4.25", Fraction(-17, 4)),
        ("no digits", None),
        ("1.", Fraction(1)),
    ],
)
def test_last_number(text, number):
    assert last_number(text) == number


def test_parse_number_rejects_non_numbers():
    assert parse_number("12 apples") is None
    assert parse_number("") is None
    assert parse_number("$1,200") == 1200


@pytest.mark.parametrize("bad", ["#### many", "no answer here", "####", None])
def test_reference_without_a_number_raises(bad):
    with pytest.raises(ValueError, match="####"):
        reference_answer(bad)


def test_answer_span_cuts_at_the_first_stop_string():
    text = "a 1\nQuestion: b 2 <|im_end|> c 3"
    assert answer_span(text) == "a 1\n"
    assert answer_span(text, stop_strings=("<|im_end|>",)) == "a 1\nQuestion: b 2 "
    assert answer_span(text, stop_strings=()) == text
    assert extract_answer(text, stop_strings=()) == Fraction(3)
    assert extract_answer("####") is None and extract_answer(None) is None
