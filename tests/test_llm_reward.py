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


# ---------------------------------------------------------------- the \boxed{} reward
# references as MATH stores them (a worked solution ending in a box) or as MATH-500's `answer` column
# does (the bare answer), against completions a model writes
MATH_SOLUTION = (
    "If $x$ is the number of hours, then $\\frac{7}{3}x = 14$, so $x = 6$ and the rate is "
    "$\\frac{14}{6} = \\boxed{\\frac{7}{3}}$."
)


@pytest.mark.parametrize(
    "completion,reference,expected",
    [
        ("... so the rate is \\boxed{\\frac{7}{3}}.", MATH_SOLUTION, 1.0),
        ("the rate is $\\boxed{\\dfrac{7}{3}}$", MATH_SOLUTION, 1.0),  # \dfrac spells \frac
        ("\\boxed{7/3}", MATH_SOLUTION, 1.0),  # the same number written a/b
        ("\\boxed{2.3333}", MATH_SOLUTION, 0.0),  # a rounding is not the number
        ("the rate is 7/3", MATH_SOLUTION, 0.0),  # no box: 0
        ("\\boxed{\\frac{7}{3}} wait, \\boxed{3}", MATH_SOLUTION, 0.0),  # the last box counts
        ("\\boxed{3} no: \\boxed{\\frac{7}{3}}", MATH_SOLUTION, 1.0),
        ("\\boxed{\\frac{7}{3}", MATH_SOLUTION, 0.0),  # the box never closes
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{(3,\\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),  # spacing, \left \right
        ("\\boxed{35}", "3,5", 0.0),  # a list is not a number with a comma in it
        ("\\boxed{1000}", "1,000", 1.0),  # ... but digit groups are
        ("\\boxed{\\frac12}", "0.5", 1.0),  # \frac12 is \frac{1}{2}, and 1/2 = 0.5
        ("\\boxed{-\\frac{1}{2}}", "-0.5", 1.0),
        ("\\boxed{x = 5}", "5", 1.0),  # an equation's value
        ("\\boxed{10\\%}", "10", 1.0),
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{\\text{(C)}}", "\\text{(C)}", 1.0),
        ("\\boxed{(B)}", "\\text{(C)}", 0.0),
        ("\\fbox{12}", "12", 1.0),
        ("The answer is $\\boxed 4$.", "4", 1.0),  # \boxed without braces
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 0.0),  # no algebra: equal values spelled apart differ
        ("", "4", 0.0),
        (None, "4", 0.0),  # not a string: 0, no exception
    ],
)
def test_boxed_math_reward_table(completion, reference, expected):
    from vaco.llm.reward import BoxedMath

    reward = BoxedMath()
    assert reward(completion, reward.reference(reference)) == expected


def test_a_reward_refuses_answers_it_cannot_read():
    from vaco.llm.reward import BoxedMath, GSM8k

    with pytest.raises(ValueError, match="never closes"):
        BoxedMath().reference("so $\\boxed{\\frac{1}{2}$")
    with pytest.raises(ValueError, match="must be a string or a number"):
        BoxedMath().reference(None)
    with pytest.raises(ValueError, match="####"):
        GSM8k().reference("the answer is \\boxed{4}, with no number after a hash mark")
    assert GSM8k()("#### 72", GSM8k().reference(GSM8K_ANSWER)) == 1.0


def test_a_checkpoint_names_no_module_vaco_would_import():
    from vaco.llm.reward import BoxedMath, GSM8k, shipped_reward

    assert isinstance(shipped_reward(BoxedMath().definition(), "--reward"), BoxedMath)
    assert isinstance(shipped_reward(None, "--reward"), GSM8k)  # a run recorded before rewards were a field
    with pytest.raises(ValueError, match="`--reward os.system`"):
        shipped_reward({"class_path": "os.system", "init_args": {}}, "--reward")


def test_pass_at_k_counts_a_prompt_solved_only_at_full_credit_or_at_the_rewards_own_mark():
    """Partial credit (0.5, 0.9) solved nothing at a 0/1 reward's mark of 1.0; a reward that sets
    ``solved_at`` moves it."""
    from vaco.llm.evaluation import pass_at_k
    from vaco.llm.reward import GSM8k, Reward

    rewards = [0.5, 0.5, 1.0, 0.0, 0.2, 0.9]  # three prompts, two samples each
    assert GSM8k.solved_at == 1.0
    assert pass_at_k(rewards, 2) == pytest.approx(1 / 3)

    class Partial(Reward):
        solved_at = 0.5

        def __call__(self, completion, reference):
            return 0.5

    assert pass_at_k(rewards, 2, Partial.solved_at) == pytest.approx(1.0)
    assert pass_at_k([0.0, 0.0, 0.0, 0.0], 2) == 0.0
