"""GRPO's group advantage and the token-level objectives (GRPO = PPO-clip with clip-higher,
VACO-GRPO = TV filter) against values computed by hand, with a padding mask."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from vaco.llm.advantage import GroupRelative
from vaco.objectives import PPOClip, TVFilter

pytestmark = pytest.mark.usefixtures("float64")  # reference math in float64 (conftest)


# ---------------------------------------------------------------- group advantage
def test_group_relative_module_matches_loop():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0], [1.0] * 8, [0.0] * 7 + [1.0]])
    td = GroupRelative(eps=1e-6)(TensorDict({"reward": rewards}, batch_size=rewards.shape))
    for i, row in enumerate(rewards.tolist()):
        mean = sum(row) / len(row)
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / (len(row) - 1))
        for j, r in enumerate(row):
            assert td["advantage"][i, j].item() == pytest.approx((r - mean) / (std + 1e-6), abs=1e-12)
    assert torch.all(td["advantage"][1] == 0)  # all correct: no signal, no NaN
    # 1 of 8 correct: the correct one gets (1 - 1/8) / std with std = sqrt(7/64 * 8/7) = sqrt(1/8)
    assert td["advantage"][2, 7].item() == pytest.approx((7 / 8) / (math.sqrt(1 / 8) + 1e-6))


def test_per_token_advantage_is_shared_by_the_tokens_and_zero_on_padding():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    out = GroupRelative.per_token(torch.tensor([0.5, -2.0]), mask)
    assert out.tolist() == [[0.5, 0.5, 0.0], [-2.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="advantage"):
        GroupRelative.per_token(torch.zeros(3), mask)


# ---------------------------------------------------------------- token-level objectives
# Two completions, [B, L] = [2, 3]; the second has one padding token (ratio 5 and advantage 50
# there, which must change nothing). Completion 0 has advantage +1, completion 1 has -1.
RATIOS = [[1.0, 1.25, 0.7], [1.3, 0.6, 5.0]]
MASK = [[True, True, True], [True, True, False]]


def token_batch(ratios=RATIOS):
    behavior = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.3, -2.0]])
    log_prob = (behavior + torch.tensor(ratios).log()).requires_grad_()
    mask = torch.tensor(MASK)
    advantage = GroupRelative.per_token(torch.tensor([1.0, -1.0]), mask)
    advantage = torch.where(mask, advantage, torch.full_like(advantage, 50.0))  # poisoned padding
    td = TensorDict(
        {"log_prob": log_prob, "behavior_log_prob": behavior, "advantage": advantage, "mask": mask}, batch_size=[2, 3]
    )
    return td, log_prob


def loss_and_grad(objective, td, log_prob):
    out = objective(td)
    loss = sum(v for k, v in out.items() if k.startswith("loss_"))
    (grad,) = torch.autograd.grad(loss, log_prob)
    return out, loss, grad


def test_grpo_clip_higher_by_hand():
    td, log_prob = token_batch()
    out, loss, grad = loss_and_grad(
        PPOClip(clip_epsilon=0.2, clip_epsilon_high=0.272, normalize_advantage=False), td, log_prob
    )
    # per valid token -min(r A, clip(r, 0.8, 1.272) A):
    #   A=+1: r=1 -> -1; r=1.25 (inside the high clip 1.272) -> -1.25; r=0.7 -> -0.7 (min picks r A)
    #   A=-1: r=1.3 -> +1.3 (min picks r A = -1.3); r=0.6 -> +0.8 (clipped to 0.8, no gradient)
    assert "loss_value" not in out  # no critic
    assert loss.item() == pytest.approx((-1 - 1.25 - 0.7 + 1.3 + 0.8) / 5)
    # d/dlog_prob of -r A is -r A on unclipped tokens, 0 on clipped ones and on padding; / 5 tokens
    expected = torch.tensor([[-1.0, -1.25, -0.7], [1.3, 0.0, 0.0]]) / 5
    torch.testing.assert_close(grad, expected)
    assert out["clip_fraction"].item() == pytest.approx(1 / 5)
    assert out["filter_fraction"].item() == 0.0
    assert out["tv"].item() == pytest.approx(0.5 * (0 + 0.25 + 0.3 + 0.3 + 0.4) / 5)
    assert out["ratio_max"].item() == pytest.approx(1.3)  # the padding's 5.0 is ignored


def test_grpo_clips_above_the_high_range_only():
    td, log_prob = token_batch([[1.0, 1.3, 0.7], [1.3, 0.6, 5.0]])  # 1.3 > 1.272 with A > 0
    out, loss, grad = loss_and_grad(
        PPOClip(clip_epsilon=0.2, clip_epsilon_high=0.272, normalize_advantage=False), td, log_prob
    )
    assert loss.item() == pytest.approx((-1 - 1.272 - 0.7 + 1.3 + 0.8) / 5)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0, -0.7], [1.3, 0.0, 0.0]]) / 5)
    assert out["clip_fraction"].item() == pytest.approx(2 / 5)


def test_vaco_grpo_tv_filter_by_hand():
    td, log_prob = token_batch()
    out, loss, grad = loss_and_grad(TVFilter(delta=0.05, normalize_advantage=False), td, log_prob)
    # tv = 0.125 > delta / 2 = 0.025: tokens with A * sign(r - 1) > 0 lose their gradient:
    #   r=1.25 with A=+1 and r=0.6 with A=-1. r=1 is never filtered; r=1.3 with A=-1 is kept.
    assert out["tv"].item() == pytest.approx(0.125)
    assert loss.item() == pytest.approx(-(1 + 1.25 + 0.7 - 1.3 - 0.6) / 5)  # values stay, -r A
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0, -0.7], [1.3, 0.0, 0.0]]) / 5)
    assert out["filter_fraction"].item() == pytest.approx(2 / 5)
    assert out["clip_fraction"].item() == 0.0


def test_vaco_grpo_does_not_filter_under_the_threshold():
    td, log_prob = token_batch()
    out, loss, grad = loss_and_grad(TVFilter(delta=0.3, normalize_advantage=False), td, log_prob)  # 0.125 < 0.15
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -1.25, -0.7], [1.3, 0.6, 0.0]]) / 5)
    assert out["filter_fraction"].item() == 0.0


def test_on_policy_tokens_give_the_policy_gradient_for_both():
    """At r = 1 (the first minibatch, no lag) GRPO and VACO-GRPO are the same: -A / n_tokens."""
    td, log_prob = token_batch([[1.0, 1.0, 1.0], [1.0, 1.0, 5.0]])
    for objective in (
        PPOClip(clip_epsilon=0.2, clip_epsilon_high=0.272, normalize_advantage=False),
        TVFilter(delta=0.05, normalize_advantage=False),
    ):
        out, loss, grad = loss_and_grad(objective, td, log_prob)
        torch.testing.assert_close(grad, torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 0.0]]) / 5)
        assert out["tv"].item() == 0.0


# ---------------------------------------------------------------- the sequence-level variant
def _sequence_filter_reference(ratios, advantages, mask, delta):
    """open-instruct's ``vaco`` rule, written as loops in float64: per completion, the mean of
    0.5 * |r - 1| over its valid tokens; over delta / 2, its tokens with A * sign(r - 1) > 0 are
    dropped. Returns the kept flags and each completion's divergence."""
    keep, tvs = [], []
    for row_r, row_a, row_m in zip(ratios, advantages, mask):
        valid = [0.5 * abs(r - 1.0) for r, m in zip(row_r, row_m) if m]
        tv = sum(valid) / max(len(valid), 1)
        tvs.append(tv)
        keep.append(
            [not (m and tv > delta / 2 and a * ((r > 1.0) - (r < 1.0)) > 0) for r, a, m in zip(row_r, row_a, row_m)]
        )
    return keep, tvs


def test_the_sequence_level_filter_tests_each_completion_on_its_own():
    """Completion 0 (A = +1) has a TV of 0.092 (0.5 * (0 + 0.25 + 0.3) / 3), completion 1 (A = -1)
    of 0.175 (0.5 * (0.3 + 0.4) / 2): with delta 0.26 (threshold 0.13) only completion 1 is over
    it, so only its raising token (r = 0.6, A = -1) is dropped, while the paper's minibatch test
    (tv 0.125) drops nothing; at delta 0.05 both are over it; at 2.0 neither."""
    from vaco.objectives import SequenceTVFilter
    from vaco.objectives.objective_math import sequence_tv_filter_mask

    ratios = [[1.0, 1.25, 0.7, 1.9], [1.3, 0.6, 5.0, 1.0]]
    mask = [[True, True, True, False], [True, True, False, False]]
    advantages = [[1.0] * 4, [-1.0] * 4]
    for delta in (0.26, 0.05, 2.0):
        keep, tvs = sequence_tv_filter_mask(
            torch.tensor(ratios).log(), torch.tensor(advantages), delta=delta, mask=torch.tensor(mask)
        )
        want_keep, want_tv = _sequence_filter_reference(ratios, advantages, mask, delta)
        assert keep.tolist() == want_keep
        torch.testing.assert_close(tvs, torch.tensor(want_tv))
    assert _sequence_filter_reference(ratios, advantages, mask, 0.26)[0] == [[True] * 4, [True, False, True, True]]

    behavior = torch.tensor([[-1.0, -2.0, -0.5, -1.0], [-1.5, -0.3, -2.0, -1.0]])
    log_prob = (behavior + torch.tensor(ratios).log()).requires_grad_()
    td = TensorDict(
        {
            "log_prob": log_prob,
            "behavior_log_prob": behavior,
            "advantage": torch.tensor(advantages),
            "mask": torch.tensor(mask),
        },
        batch_size=[2, 4],
    )
    out, loss, grad = loss_and_grad(SequenceTVFilter(delta=0.26, normalize_advantage=False), td, log_prob)
    # -r A on the 5 valid tokens; the dropped token keeps its value and loses its gradient
    assert loss.item() == pytest.approx(-(1 + 1.25 + 0.7 - 1.3 - 0.6) / 5)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -1.25, -0.7, 0.0], [1.3, 0.0, 0.0, 0.0]]) / 5)
    assert out["filter_fraction"].item() == pytest.approx(1 / 5)
    minibatch = TVFilter(delta=0.26, normalize_advantage=False)(td)  # the paper's test: tv 0.125 < 0.13
    assert minibatch["filter_fraction"].item() == 0.0
    assert SequenceTVFilter.algorithm_name("group") == "vaco_grpo_seq" and not SequenceTVFilter().needs_minibatch_tv
    with pytest.raises(ValueError, match="sequences, tokens"):
        sequence_tv_filter_mask(torch.zeros(3), torch.zeros(3), delta=0.1)
