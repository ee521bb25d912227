"""The learner-side corrections (vaco.learners.step_size): VCPO's ESS-scaled step against a float64
transcription of its source, the staleness rule by hand, the scaled step against the optimiser's step at
the scaled learning rate, and real fits: a factor of 1 leaves a run's numbers bit for bit, a factor
below 1 changes them. (A population's members equal their solo runs with either rule:
tests/test_population_fit.py; the LLM track's fits: tests/test_llm_module.py.)

The transcription keeps VCPO's order of operations: mit-han-lab/vcpo
``recipe/fully_async_policy/staleness_utils.py`` (``seq_is = exp(sum(log_ratio * mask))`` per
completion; ``compute_ess_info``: ``ESS = (sum w)^2 / (sum w^2 + eps)``, ``ess_ratio = ESS / n``) and
``verl/workers/actor/megatron_actor.py::_optimizer_step_with_buffer`` (``lr_scale = min(1, ess_ratio /
max(base, 1e-8))``, ``lr * lr_scale ** 0.5`` under ``sqrt``, ``lr * lr_scale`` under ``linear``).
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers.runs import fit_in_process
from vaco.learners.step_size import ESSStepSize, StalenessStepSize, log_importance_weights, scale_step
from vaco.run.checkpoint import load_checkpoint


def vcpo_seq_is(log_ratio_row, mask_row) -> float:
    mask_float = mask_row.double()
    return float(torch.exp((log_ratio_row * mask_float).sum()))


def vcpo_lr_scale(weights: list[float], base_ess_ratio: float, scaling_rule: str, eps: float = 1e-8) -> float:
    IS_sum_unclipped = 0.0
    IS_sq_sum_unclipped = 0.0
    minibatch_size = 0
    for w in weights:
        IS_sum_unclipped += float(w)
        IS_sq_sum_unclipped += float(w) ** 2
        minibatch_size += 1
    ESS_unclipped = (IS_sum_unclipped) ** 2 / (IS_sq_sum_unclipped + eps)
    ess_ratio_unclipped = ESS_unclipped / minibatch_size
    base = max(float(base_ess_ratio), 1e-8)
    lr_scale = min(1.0, float(ess_ratio_unclipped) / base)
    return lr_scale**0.5 if scaling_rule == "sqrt" else lr_scale


@pytest.mark.parametrize("scaling_rule", ["sqrt", "linear"])
@pytest.mark.parametrize("base", [1.0, 0.5])
def test_the_ess_step_is_vcpos_learning_rate_scale(scaling_rule, base):
    """Per-sample weights of spreads from on-policy to e^+-3, and completions' sequence weights over
    padded token rows; the factor equals the source's ``lr_scale`` (under its rule) to 1e-14."""
    generator = torch.Generator().manual_seed(7)
    rule = ESSStepSize(scaling_rule=scaling_rule, base_ess_ratio=base)
    below_one = 0
    for spread in (0.0, 0.01, 0.3, 1.0, 3.0):
        log_ratio = spread * torch.randn(64, generator=generator, dtype=torch.float64)
        weights = log_importance_weights(log_ratio, None, "sequence").exp()
        ours = float(rule.factor(log_ratio, torch.tensor(0.0)))
        assert ours == pytest.approx(vcpo_lr_scale(weights.tolist(), base, scaling_rule), rel=1e-14, abs=1e-15)
        below_one += ours < 1
        # token rows, padded: the completion's weight is prod_t r_t over its valid tokens (VCPO's seq_is)
        rows = spread * 0.2 * torch.randn(8, 6, generator=generator, dtype=torch.float64)
        mask = torch.arange(6)[None, :] < torch.tensor([6, 5, 1, 3, 6, 2, 4, 6])[:, None]
        log_sequence = log_importance_weights(rows, mask, "sequence")
        sequence = log_sequence.exp()
        assert sequence.tolist() == pytest.approx([vcpo_seq_is(r, m) for r, m in zip(rows, mask)], rel=1e-14)
        ours = float(rule.factor(log_sequence, torch.tensor(0.0)))
        assert ours == pytest.approx(vcpo_lr_scale(sequence.tolist(), base, scaling_rule), rel=1e-14, abs=1e-15)
        assert log_importance_weights(rows, mask, "token").tolist() == pytest.approx(rows[mask].tolist(), rel=1e-15)
    assert below_one >= (3 if base == 1.0 else 1)  # the cap binds off-policy
    # a completion whose ratio overflows float64's square (log-ratio 400): the ratio from weights scaled by
    # their largest, finite, where the source's formula gives nan
    extreme = torch.tensor([400.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert float(rule.factor(extreme, torch.tensor(0.0))) == pytest.approx(
        min(1.0, 0.25 / base) ** (0.5 if scaling_rule == "sqrt" else 1.0), rel=1e-12
    )


def test_the_staleness_step_divides_by_the_lag_above_the_reference():
    lags = torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0, 15.0])
    assert StalenessStepSize().factor(None, lags).tolist() == pytest.approx([1, 1, 1, 1 / 2, 1 / 3, 1 / 15], rel=1e-7)
    assert StalenessStepSize(reference_lag=2.0).factor(None, lags).tolist() == pytest.approx(
        [1, 1, 1, 1, 2 / 3, 2 / 15], rel=1e-7
    )
    with pytest.raises(ValueError, match="`reference_lag` must be a finite number > 0"):
        StalenessStepSize(reference_lag=0)
    with pytest.raises(ValueError, match="`scaling_rule` must be 'sqrt' or 'linear'"):
        ESSStepSize(scaling_rule="cube")


def _net():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()


@pytest.mark.parametrize("make", [lambda p, lr: torch.optim.Adam(p, lr=lr), lambda p, lr: torch.optim.AdamW(p, lr=lr)])
def test_a_scaled_step_is_the_optimisers_step_at_the_scaled_learning_rate(make):
    """Adam's and AdamW's steps are linear in the learning rate (their moments do not depend on it):
    ``w + f (w' - w)`` is the step at ``f * lr``, three steps in a row, to rounding."""
    x = torch.randn(16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    scaled, reference = _net(), _net()
    opt_scaled, opt_reference = make(scaled.parameters(), 1e-2), make(reference.parameters(), 1e-2)
    for f in (0.3, 0.8, 0.05):
        for net, opt in ((scaled, opt_scaled), (reference, opt_reference)):
            opt.zero_grad()
            net(x).pow(2).sum().backward()
        before = [p.detach().clone() for p in scaled.parameters()]
        opt_scaled.step()
        scale_step(list(scaled.parameters()), before, torch.tensor(f, dtype=torch.float64))
        for group in opt_reference.param_groups:
            group["lr"] = 1e-2 * f
        opt_reference.step()
        for a, b in zip(scaled.parameters(), reference.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


def test_a_factor_of_one_keeps_the_optimisers_numbers_and_a_population_row_its_own_factor():
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-1)
    net(torch.ones(3, 5, dtype=torch.float64)).sum().backward()
    before = [p.detach().clone() for p in net.parameters()]
    opt.step()
    after = [p.detach().clone() for p in net.parameters()]
    scale_step(list(net.parameters()), before, torch.tensor(1.0))
    assert all(torch.equal(a, p) for a, p in zip(after, net.parameters()))
    stacked_before, stacked = torch.zeros(3, 4), torch.ones(3, 4)
    scale_step([stacked], [stacked_before], torch.tensor([1.0, 0.5, 0.0]))
    assert stacked.tolist() == [[1.0] * 4, [0.5] * 4, [0.0] * 4]


def _weights(root) -> dict[str, torch.Tensor]:
    (ckpt,) = (root / "checkpoints").rglob("last.ckpt")
    state = load_checkpoint(str(ckpt))["state_dict"]
    return {k: v for k, v in state.items() if k.startswith(("actor.", "critic."))}


@pytest.mark.slow
def test_the_lag_step_is_the_plain_run_on_policy_and_smaller_steps_off_policy(tmp_path, mlflow_uri):
    """K = 1 (lag 0, factor 1): the run's weights are PPO-clip's bit for bit. K = 3 (lag 2 once the
    buffer is full, factor 1/2): they differ."""
    runs = {}
    for algo in ("ppo_clip", "ppo_clip_lag_step"):
        for K in (1, 3):
            root = tmp_path / f"{algo}-{K}"
            args = ("--data.init_args.policy_buffer_size", str(K), "--data.init_args.total_steps", str(4 * 128))
            fit_in_process(root, algo, *args, eval_every=0)
            runs[(algo, K)] = _weights(root)
    plain, scaled = runs[("ppo_clip", 1)], runs[("ppo_clip_lag_step", 1)]
    assert plain.keys() == scaled.keys() and all(torch.equal(plain[k], scaled[k]) for k in plain)
    plain, scaled = runs[("ppo_clip", 3)], runs[("ppo_clip_lag_step", 3)]
    assert any(not torch.equal(plain[k], scaled[k]) for k in plain)
    assert math.isfinite(sum(float(v.abs().sum()) for v in scaled.values()))
