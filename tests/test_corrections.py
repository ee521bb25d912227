"""The corrections asynchronous RL systems ship, each against a float64 transcription of its source's
formula written here, on minibatches captured from a real stale run (Hopper, K = 4 policy versions,
a high learning rate so that ratios and the EWMA proximal policy move): loss, gradient with respect
to the learner's log-probabilities, and the samples each mask or cap touches. Each test also asserts
that its branch was exercised (a cap that never bound would check nothing).

The transcriptions keep each source's own order of operations and names:

* AReaL ``areal/utils/functional/functional.py::ppo_actor_loss_fn`` (decoupled PPO);
* openai/ppo-ewma ``ppo_ewma/ppo.py::compute_losses`` and ``ppo_ewma/ppg.py::EwmaModel.update``;
* verl ``verl/trainer/ppo/rollout_corr_helper.py::compute_rollout_correction_weights`` (TIS and
  IcePop's MIS, token and sequence) with the bypass ``reinforce`` loss ``-w * A * log pi``;
* verl ``verl/trainer/ppo/core_algos.py::compute_policy_loss_cispo``;
* prime-rl ``src/prime_rl/trainer/rl/loss.py::default_loss_fn`` (DPPO-TV + (log r)^2);
* sample-factory ``sample_factory/algo/learning/learner.py::_calculate_losses`` (APPO's clip, the
  rho-weighted advantage);
* verl ``compute_policy_loss_gspo`` (GSPO's sequence ratio in token form);

and the second wave:

* AReaL ``areal/trainer/ppo/actor.py::_apply_m2po_masking`` and ``_get_m2po_loss_mask`` (M2PO, at 4aef98d);
* Trinity-RFT ``trinity/algorithm/policy_loss_fn/topr_policy_loss.py`` (TOPR, yanxi-chen/Trinity-RFT at 5b77c08);
* TRL ``trl/trainer/grpo_trainer.py::get_off_policy_mask`` (DeepSeek-V3.2's off-policy sequence mask, at
  f2cd577) on TRL's clipped token loss;
* prime-rl's default loss without its mask (the Kimi K2.5 loss).
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from helpers.runs import build_run, fit_in_process
from vaco.advantages import GAE
from vaco.learners.proximal import EWMAPolicy
from vaco.objectives import (
    APPO,
    CISPO,
    DPPOTV,
    GSPO,
    M2PO,
    MIS,
    PPOEWMA,
    TIS,
    TOPR,
    DecoupledPPO,
    KimiK25,
    OffPolicySequenceMask,
    OpenInstructRho,
    SequenceMIS,
    SequenceTIS,
)
from vaco.objectives.objective_math import effective_sample_size, masked_quantile, sequence_tv_filter_mask

KEYS = ("log_prob", "behavior_log_prob", "proximal_log_prob", "advantage")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """Every minibatch the objective saw in the last two iterations of a real PPO-EWMA run: Hopper-v5,
    K = 4, lr 3e-3, 4 epochs x 4 minibatches; float32 as trained, cast to float64 by the tests."""
    tmp = tmp_path_factory.mktemp("corrections")
    module, data, trainer = build_run(
        tmp,
        f"sqlite:///{tmp / 'mlflow.db'}",
        objective=PPOEWMA(ewma_decay=0.9),
        advantage=GAE(gamma=0.99, lmbda=0.95),
        data_kwargs={"env_id": "Hopper-v5", "total_steps": 2 * 64 * 5, "policy_buffer_size": 4, "eval_every": 0},
        model_kwargs={"update_epochs": 4, "num_minibatches": 4, "lr": 3e-3},
    )
    seen: list[dict[str, torch.Tensor]] = []
    forward = module.objective.forward

    def recording(batch, check_finite=True):
        seen.append({key: batch[key].detach().clone() for key in KEYS})
        return forward(batch, check_finite)

    module.objective.forward = recording
    trainer.fit(module, datamodule=data)
    return seen[-32:]


def _float64(mb):
    out = {key: value.double() for key, value in mb.items()}
    out["log_prob"] = out["log_prob"].clone().requires_grad_()
    return out


def _vaco(objective, mb):
    """vaco's policy loss and its gradient with respect to log pi, and its outputs."""
    td = TensorDict(mb, batch_size=mb["advantage"].shape)
    out = objective(td)
    (grad,) = torch.autograd.grad(out["loss_policy"], mb["log_prob"])
    return out["loss_policy"].detach(), grad, out


def _reference(loss, mb):
    (grad,) = torch.autograd.grad(loss, mb["log_prob"])
    return loss.detach(), grad


def _close(ours, theirs):
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-10, atol=1e-12)


def test_the_captured_minibatches_are_off_policy_and_off_proximal(captured):
    """The data the other tests run on: stale (ratio far from 1) and with an EWMA unlike the learner."""
    ratio = torch.cat([(mb["log_prob"] - mb["behavior_log_prob"]).exp() for mb in captured])
    gap = torch.cat([(mb["log_prob"] - mb["proximal_log_prob"]).abs() for mb in captured])
    assert float(ratio.max()) > 2.0 and float(ratio.min()) < 0.5
    assert float(gap.mean()) > 1e-3


# ---------------------------------------------------------------- AReaL's decoupled PPO
def areal_ppo_actor_loss(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip, behav_imp_weight_cap):
    loss_mask = torch.ones_like(logprobs, dtype=torch.bool)
    loss_mask_count = loss_mask.count_nonzero()
    ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    clip_mask = pg_loss1.detach() < pg_loss2.detach()
    pg_loss = torch.max(pg_loss1, pg_loss2)
    behav_kl = proximal_logprobs - old_logprobs
    behav_imp_weight = behav_kl.exp()
    behav_mask = (
        (behav_imp_weight <= behav_imp_weight_cap).logical_and(loss_mask)
        if behav_imp_weight_cap not in (None, "none")
        else loss_mask
    )
    behav_imp_weight = torch.where(behav_mask, behav_imp_weight, 0.0)
    if behav_imp_weight_cap != "none":  # AReaL since April 2026: rejection_sampling None applies no weight
        pg_loss = pg_loss * behav_imp_weight
    pg_loss = torch.where(loss_mask, pg_loss, 0).sum() / loss_mask_count
    return pg_loss, clip_mask, ~behav_mask


@pytest.mark.parametrize("cap", [None, 5.0, 1.2, "none"])
def test_decoupled_ppo_is_areals_loss(captured, float64, cap):
    """``"none"``: no behaviour weight, AReaL's default since April 2026."""
    clipped = capped = 0
    for raw in captured:
        mb = _float64(raw)
        settings = {"behavior_weight": False} if cap == "none" else {"behavior_weight_cap": cap}
        ours = _vaco(DecoupledPPO(clip_epsilon=0.2, normalize_advantage=False, **settings), mb)
        loss, clip_mask, cap_mask = areal_ppo_actor_loss(
            mb["log_prob"], mb["proximal_log_prob"], mb["behavior_log_prob"], mb["advantage"], 0.2, cap
        )
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["clip_fraction"]) == pytest.approx(float(clip_mask.double().mean()))
        if cap not in (None, "none"):
            assert float(ours[2]["mask_fraction"]) == pytest.approx(float(cap_mask.double().mean()))
        clipped += int(clip_mask.sum())
        capped += int(cap_mask.sum())
    assert clipped > 0
    assert (capped > 0) == (cap == 1.2)


# ---------------------------------------------------------------- PPO-EWMA (Hilton et al.)
def ppo_ewma_pg_loss(newlogp, rec_logp, logp, adv, clip_param, imp_samp_max):
    logratio = newlogp - rec_logp
    logp_adj = logp
    if imp_samp_max > 0:
        logp_adj = torch.max(logp, newlogp.detach() - math.log(imp_samp_max))
    pg_losses = -adv * torch.exp(newlogp - logp_adj)
    if clip_param > 0:
        clipped_logratio = torch.clamp(logratio, math.log(1.0 - clip_param), math.log(1.0 + clip_param))
        pg_losses2 = -adv * torch.exp(clipped_logratio + rec_logp - logp_adj)
        pg_losses = torch.max(pg_losses, pg_losses2)
    imp_samp_clipfrac = (newlogp - logp > math.log(imp_samp_max)).double().mean()
    return pg_losses.mean(), imp_samp_clipfrac


@pytest.mark.parametrize("imp_samp_max", [100.0, 1.5])
def test_ppo_ewma_is_hilton_et_als_loss(captured, float64, imp_samp_max):
    capped = 0.0
    for raw in captured:
        mb = _float64(raw)
        ours = _vaco(PPOEWMA(clip_epsilon=0.2, imp_samp_max=imp_samp_max, normalize_advantage=False), mb)
        loss, fraction = ppo_ewma_pg_loss(
            mb["log_prob"], mb["proximal_log_prob"], mb["behavior_log_prob"], mb["advantage"], 0.2, imp_samp_max
        )
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["cap_fraction"]) == pytest.approx(float(fraction))
        capped += float(fraction)
    assert (capped > 0) == (imp_samp_max == 1.5)


def test_the_ewma_is_ppo_ewmas_debiased_average_and_its_closed_form(float64):
    """EwmaModel.update transcribed (W' = decay W + 1; p_ewma = p_ewma * decay W / W' + p / W'),
    and the closed form it computes: the decay^k-weighted mean of every weight seen, the first included."""
    torch.manual_seed(0)
    actor = torch.nn.Sequential(torch.nn.Linear(3, 2))
    decay = 0.8
    ewma = EWMAPolicy(actor, decay)
    reference = [p.detach().clone() for p in actor.parameters()]
    total = 1.0
    history = [[p.detach().clone() for p in actor.parameters()]]
    for _ in range(25):
        with torch.no_grad():
            for p in actor.parameters():
                p.add_(torch.randn_like(p))
        history.append([p.detach().clone() for p in actor.parameters()])
        ewma.update(actor.parameters())
        new_total = decay * total + 1
        ratio = decay * total / new_total
        for p_ewma, p in zip(reference, actor.parameters()):
            p_ewma.mul_(ratio).add_(p.data / new_total)
        total = new_total
    n = len(history) - 1
    weights = [decay ** (n - k) for k in range(n + 1)]
    for i, (ours, theirs) in enumerate(zip(ewma.average.parameters(), reference)):
        assert torch.equal(ours, theirs)
        closed = sum(w * h[i] for w, h in zip(weights, history)) / sum(weights)
        torch.testing.assert_close(ours, closed, rtol=1e-12, atol=1e-12)
    assert ewma.total_weight == pytest.approx(sum(weights))


# ---------------------------------------------------------------- verl's TIS and MIS (bypass reinforce)
def verl_is_weights(log_ratio, response_mask, rollout_is, upper, lower=None):
    if rollout_is == "token":
        raw = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        log_ratio_sum = (log_ratio * response_mask).sum(dim=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio_sum, min=-20.0, max=20.0)).expand_as(log_ratio)
    raw = raw * response_mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        kept = (raw >= lower) & (raw <= upper)
        weights = torch.where(kept, raw, torch.zeros_like(raw))
    return weights.detach(), raw


def bypass_reinforce(log_prob, weights, advantages, response_mask):
    pg_losses = -advantages * log_prob * weights
    return (pg_losses * response_mask).sum() / response_mask.sum()


@pytest.mark.parametrize(("upper", "lower"), [(2.0, None), (1.1, None), (5.0, 0.5), (1.3, 0.8)])
def test_token_tis_and_mis_are_verls_weights_on_the_reinforce_loss(captured, float64, upper, lower):
    touched = 0
    for raw_mb in captured:
        mb = _float64(raw_mb)
        mask = torch.ones_like(mb["advantage"])
        objective = TIS(truncation=upper) if lower is None else MIS(low=lower, high=upper)
        objective.normalize_advantage = False
        ours = _vaco(objective, mb)
        log_ratio = (mb["log_prob"] - mb["behavior_log_prob"]).detach()
        weights, raw = verl_is_weights(log_ratio, mask, "token", upper, lower)
        _close(ours[:2], _reference(bypass_reinforce(mb["log_prob"], weights, mb["advantage"], mask), mb))
        if lower is None:
            outside = raw > upper
            assert float(ours[2]["cap_fraction"]) == pytest.approx(float(outside.double().mean()))
        else:
            outside = (raw < lower) | (raw > upper)
            assert float(ours[2]["mask_fraction"]) == pytest.approx(float(outside.double().mean()))
        touched += int(outside.sum())
    assert touched > 0


def test_cispo_is_verls_clipped_weight_under_a_stop_gradient(captured, float64):
    clipped = 0
    for low, high in ((1.0, 5.0), (0.2, 0.2)):
        for raw_mb in captured:
            mb = _float64(raw_mb)
            ours = _vaco(CISPO(clip_epsilon_low=low, clip_epsilon_high=high, normalize_advantage=False), mb)
            ratio = torch.exp(torch.clamp(mb["log_prob"] - mb["behavior_log_prob"], min=-20.0, max=20.0))
            clamped_ratio = torch.clamp(ratio, 1 - low, 1 + high)
            loss = (-mb["advantage"] * clamped_ratio.detach() * mb["log_prob"]).mean()
            _close(ours[:2], _reference(loss, mb))
            is_clipped = (ratio < 1 - low) | (ratio > 1 + high)
            assert float(ours[2]["cap_fraction"]) == pytest.approx(float(is_clipped.double().mean()))
            clipped += int(is_clipped.sum())
    assert clipped > 0


# ---------------------------------------------------------------- prime-rl's DPPO-TV
def prime_rl_default_loss(trainer_logprobs, inference_logprobs, advantages, loss_mask, difference, cfg):
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    if difference == "probability":
        probs_diff = torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)
    else:  # vaco's continuous-action reading: the sample's term of the TV estimate
        probs_diff = importance_ratio - 1
    dppo_invalid_mask_high = probs_diff > cfg["dppo_mask_high"]
    dppo_invalid_mask_low = probs_diff < -cfg["dppo_mask_low"]
    positive_advantages = advantages > 0
    is_masked = torch.where(positive_advantages, dppo_invalid_mask_high, dppo_invalid_mask_low)
    keep_mask = loss_mask & ~is_masked
    advantages = cfg["adv_tau"] * advantages
    pg_loss = keep_mask * advantages * importance_ratio
    kl_loss = loss_mask * log_importance_ratio**2
    per_token_loss = -pg_loss + cfg["kl_tau"] * kl_loss
    return per_token_loss.sum() / loss_mask.sum(), (is_masked & loss_mask).sum() / loss_mask.sum()


def test_dppo_tv_is_prime_rls_default_loss_on_ratios(captured, float64):
    cfg = {"dppo_mask_low": 0.2, "dppo_mask_high": 0.2, "adv_tau": 1.0, "kl_tau": 1e-3}
    masked = 0.0
    for raw_mb in captured:
        mb = _float64(raw_mb)
        ours = _vaco(DPPOTV(difference="ratio", normalize_advantage=False), mb)
        mask = torch.ones_like(mb["advantage"], dtype=torch.bool)
        loss, fraction = prime_rl_default_loss(
            mb["log_prob"], mb["behavior_log_prob"], mb["advantage"], mask, "ratio", cfg
        )
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["mask_fraction"]) == pytest.approx(float(fraction))
        masked += float(fraction)
    assert masked > 0


# ---------------------------------------------------------------- sample-factory's APPO
def sample_factory_appo(log_prob, behavior_log_prob, vtrace_adv, ppo_clip_ratio, vtrace_rho):
    ratio = torch.exp(log_prob - behavior_log_prob)
    ratio = torch.clamp(ratio, 0.05, 20.0)
    clip_ratio_high = 1.0 + ppo_clip_ratio
    clip_ratio_low = 1.0 / clip_ratio_high
    adv = torch.min(torch.tensor(vtrace_rho), ratio.detach()) * vtrace_adv
    policy_loss_1 = ratio * adv
    policy_loss_2 = torch.clamp(ratio, clip_ratio_low, clip_ratio_high) * adv
    return -torch.min(policy_loss_1, policy_loss_2).mean(), (policy_loss_2 < policy_loss_1).double().mean()


def test_appo_is_sample_factorys_clip_on_the_rho_weighted_advantage(captured, float64):
    """Also on a copy of a minibatch with two samples pushed past the source's ratio clamp [0.05, 20]."""
    extreme = dict(captured[0])
    extreme["behavior_log_prob"] = extreme["behavior_log_prob"].clone()
    extreme["behavior_log_prob"][:2] += torch.tensor([-6.0, 6.0])
    clipped = 0.0
    for raw_mb in [*captured, extreme]:
        mb = _float64(raw_mb)
        ours = _vaco(APPO(clip_epsilon=0.1, rho_bar=1.0, normalize_advantage=False), mb)
        loss, fraction = sample_factory_appo(mb["log_prob"], mb["behavior_log_prob"], mb["advantage"], 0.1, 1.0)
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["clip_fraction"]) == pytest.approx(float(fraction))
        clipped += float(fraction)
    assert clipped > 0


# ---------------------------------------------------------------- the lag diagnostics
def test_ess_and_the_ratios_99th_percentile_are_their_definitions(captured, float64):
    for raw_mb in captured:
        ratio = (raw_mb["log_prob"].double() - raw_mb["behavior_log_prob"].double()).exp()
        n = ratio.numel()
        assert float(effective_sample_size(ratio)) == pytest.approx(float(ratio.sum() ** 2 / (n * (ratio**2).sum())))
        # verl's form of the same number: 1 / mean((w / mean w)^2)
        assert float(effective_sample_size(ratio)) == pytest.approx(float(1 / ((ratio / ratio.mean()) ** 2).mean()))
        assert float(masked_quantile(ratio, 0.99)) == pytest.approx(float(torch.quantile(ratio, 0.99)))
        mask = torch.rand(ratio.shape, generator=torch.Generator().manual_seed(n)) < 0.6
        kept = ratio[mask]
        assert float(masked_quantile(ratio, 0.99, mask)) == pytest.approx(float(torch.quantile(kept, 0.99)))
        assert float(effective_sample_size(ratio, mask)) == pytest.approx(
            float(kept.sum() ** 2 / (kept.numel() * (kept**2).sum()))
        )


# ---------------------------------------------------------------- token level: sequences of an LLM batch
@pytest.fixture(scope="module")
def token_batches(captured):
    """Real log-probabilities laid out as [completions, tokens] with padding: each captured
    minibatch's 32 samples as 4 rows of 8, the last tokens of some rows masked off; a row's
    advantage is constant (GRPO's)."""
    out = []
    for raw in captured:
        rows = {key: value.double().reshape(4, 8) for key, value in raw.items()}
        mask = torch.ones(4, 8, dtype=torch.bool)
        for i, length in enumerate((8, 6, 3, 7)):
            mask[i, length:] = False
        rows["advantage"] = rows["advantage"][:, :1].expand(4, 8).clone()
        # probabilities of tokens (<= 1): log-probs shifted below 0, as a token's are
        shift = torch.maximum(rows["log_prob"], rows["behavior_log_prob"]).max() + 0.05
        rows["log_prob"], rows["behavior_log_prob"] = rows["log_prob"] - shift, rows["behavior_log_prob"] - shift
        rows["mask"] = mask
        out.append(rows)
    return out


def _token(rows):
    mb = dict(rows)
    mb["log_prob"] = mb["log_prob"].clone().requires_grad_()
    return mb


@pytest.mark.parametrize(("cls", "upper", "lower"), [(SequenceTIS, 2.0, None), (SequenceMIS, 5.0, 0.5)])
def test_sequence_tis_and_mis_are_verls_sequence_weights(token_batches, float64, cls, upper, lower):
    touched = 0
    for rows in token_batches:
        mb = _token(rows)
        objective = cls(truncation=upper) if lower is None else cls(low=lower, high=upper)
        objective.normalize_advantage = False
        ours = _vaco(objective, mb)
        mask = mb["mask"].double()
        log_ratio = (mb["log_prob"] - mb["behavior_log_prob"]).detach()
        weights, raw = verl_is_weights(log_ratio, mask, "sequence", upper, lower)
        _close(ours[:2], _reference(bypass_reinforce(mb["log_prob"], weights, mb["advantage"], mask), mb))
        outside = (raw > upper) if lower is None else ((raw < lower) | (raw > upper))
        touched += int((outside & mb["mask"]).sum())
    assert touched > 0


def test_dppo_tv_is_prime_rls_default_loss_on_token_probabilities(token_batches, float64):
    cfg = {"dppo_mask_low": 0.2, "dppo_mask_high": 0.2, "adv_tau": 1.0, "kl_tau": 1e-3}
    masked = 0.0
    for rows in token_batches:
        mb = _token(rows)
        ours = _vaco(DPPOTV(normalize_advantage=False), mb)
        loss, fraction = prime_rl_default_loss(
            mb["log_prob"], mb["behavior_log_prob"], mb["advantage"], mb["mask"], "probability", cfg
        )
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["mask_fraction"]) == pytest.approx(float(fraction))
        masked += float(fraction)
    assert masked > 0


def verl_gspo(log_prob, old_log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high):
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
    seq_importance_ratio = torch.exp(log_seq_importance_ratio)
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    loss = (pg_losses * response_mask).sum() / response_mask.sum()
    return loss, ((pg_losses2 > pg_losses1) & response_mask.bool()).sum() / response_mask.sum()


@pytest.mark.parametrize(("low", "high"), [(3e-4, 4e-4), (0.05, 0.05)])
def test_gspo_is_verls_sequence_ratio_in_token_form(token_batches, float64, low, high):
    clipped = 0.0
    for rows in token_batches:
        mb = _token(rows)
        ours = _vaco(GSPO(clip_epsilon=low, clip_epsilon_high=high, normalize_advantage=False), mb)
        loss, fraction = verl_gspo(
            mb["log_prob"], mb["behavior_log_prob"], mb["advantage"], mb["mask"].double(), low, high
        )
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["clip_fraction"]) == pytest.approx(float(fraction))
        clipped += float(fraction)
    assert clipped > 0


def open_instruct_rho_dapo(new_logprobs, old_logprob, vllm_logprobs, advantages, response_mask, cfg):
    """allenai/open-instruct, open_instruct/grpo_utils.py: compute_rho_correction (rho_mask_tv_divergence)
    then compute_grpo_loss (loss_fn dapo) and its masked_mean over the response tokens, in float64."""
    logprob_diff = torch.where(
        response_mask, (old_logprob - vllm_logprobs).clamp(-10.0, 10.0), torch.zeros_like(old_logprob)
    )
    rho = torch.exp(logprob_diff)

    def seq_mean(values):
        valid = response_mask.double()
        return ((values * valid).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp_min(1.0)).expand_as(values)

    rho_effective = torch.exp(seq_mean(logprob_diff)) if cfg["rho_mask_sequence_level"] else rho
    tv_sequence_level = seq_mean(torch.abs(rho - 1.0))
    lower, upper = cfg["rho_mask_lower_bound"], cfg["rho_mask_upper_bound"]
    none = torch.zeros_like(response_mask)
    tv_dropped_low = (tv_sequence_level < lower) & response_mask if lower > 0.0 else none
    tv_dropped_high = (tv_sequence_level > upper) & response_mask if upper > 0.0 else none
    tokens_increase_tv = torch.sign(logprob_diff) * advantages > 0
    dropped_low, dropped_high = tv_dropped_low & tokens_increase_tv, tv_dropped_high & tokens_increase_tv
    in_range = response_mask & ~dropped_low & ~dropped_high
    rho_clamped = rho_effective
    if cfg["rho_clamp_lower_bound"] > 0.0:
        rho_clamped = torch.clamp(rho_clamped, min=cfg["rho_clamp_lower_bound"])
    if cfg["rho_clamp_upper_bound"] > 0.0:
        rho_clamped = torch.clamp(rho_clamped, max=cfg["rho_clamp_upper_bound"])
    rho_weights = torch.where(in_range, rho_clamped, torch.zeros_like(rho_clamped))

    ratio = torch.exp(new_logprobs - old_logprob)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cfg["clip_lower"], 1.0 + cfg["clip_higher"])
    clipfrac = (pg_losses2 > pg_losses).double()
    pg_loss = torch.max(pg_losses, pg_losses2) * rho_weights
    clipfrac = clipfrac * (rho_weights != 0).double()
    mask = response_mask.double()
    drop = (dropped_low | dropped_high).double()
    return (pg_loss * mask).sum() / mask.sum(), (drop * mask).sum() / mask.sum(), (clipfrac * mask).sum() / mask.sum()


OPEN_INSTRUCT = {  # GRPOExperimentConfig's defaults, the mask's upper bound set
    "rho_clamp_lower_bound": 0.0,
    "rho_clamp_upper_bound": 2.0,
    "rho_mask_lower_bound": 0.0,
    "rho_mask_upper_bound": 0.05,
    "rho_mask_sequence_level": False,
    "clip_lower": 0.2,
    "clip_higher": 0.272,
}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"rho_mask_lower_bound": 0.02},
        {"rho_mask_sequence_level": True},
        {"rho_clamp_lower_bound": 0.9, "rho_clamp_upper_bound": 1.05},
    ],
    ids=["defaults", "lower-bound", "sequence-weight", "clamped"],
)
def test_the_open_instruct_arm_is_compute_rho_correction_on_vacos_ratio(token_batches, float64, changes):
    """open-instruct's rule with rho := pi_theta / beta (detached) and pi_old := beta: loss, gradient,
    dropped and clipped fractions on real log-probs; its mask is vaco_grpo_seq's at upper = delta."""
    cfg = {**OPEN_INSTRUCT, **changes}
    dropped, capped = 0.0, 0
    for rows in token_batches:
        # the captured ratios spread wide; halve the log-ratio so some completions sit under the bound
        rows = {**rows, "log_prob": rows["behavior_log_prob"] + 0.5 * (rows["log_prob"] - rows["behavior_log_prob"])}
        mb = _token(rows)
        objective = OpenInstructRho(
            upper=cfg["rho_mask_upper_bound"],
            lower=cfg["rho_mask_lower_bound"],
            clamp_low=cfg["rho_clamp_lower_bound"],
            clamp_high=cfg["rho_clamp_upper_bound"],
            clip_epsilon=cfg["clip_lower"],
            clip_epsilon_high=cfg["clip_higher"],
            sequence_level=cfg["rho_mask_sequence_level"],
            normalize_advantage=False,
        )
        ours = _vaco(objective, mb)
        behaviour = mb["behavior_log_prob"]
        loss, drop, clip = open_instruct_rho_dapo(
            mb["log_prob"],
            behaviour,
            behaviour - (mb["log_prob"] - behaviour).detach(),
            mb["advantage"],
            mb["mask"],
            cfg,
        )
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["filter_fraction"]) == pytest.approx(float(drop), abs=1e-12)
        assert float(ours[2]["clip_fraction"]) == pytest.approx(float(clip), abs=1e-12)
        dropped += float(drop)
        ratio = (mb["log_prob"] - behaviour).detach().exp()
        capped += int(
            (((ratio > cfg["rho_clamp_upper_bound"]) | (ratio < cfg["rho_clamp_lower_bound"])) & mb["mask"]).sum()
        )
        if not changes:  # the same tokens as vaco_grpo_seq's at delta = upper
            keep, _ = sequence_tv_filter_mask(
                (mb["log_prob"] - behaviour).detach(),
                mb["advantage"],
                delta=cfg["rho_mask_upper_bound"],
                mask=mb["mask"],
            )
            assert float(((~keep) & mb["mask"]).double().sum() / mb["mask"].sum()) == pytest.approx(float(drop))
    assert dropped > 0 and (capped > 0 or "rho_clamp_upper_bound" not in changes)  # the mask acts; a tight clamp too


# ---------------------------------------------------------------- every correction through `vaco fit`
# ---------------------------------------------------------------- the second wave
def areal_m2po_mask(old_logp, prox_logp, loss_mask, m2_threshold):
    """AReaL's ``_apply_m2po_masking`` with ``_get_m2po_loss_mask``, in their order of operations."""
    delta = old_logp - prox_logp
    m2 = delta * delta
    mask_flat = loss_mask.view(-1)
    m2_selected = m2.view(-1)[mask_flat]
    if m2_selected.numel() == 0:
        return loss_mask
    sorted_m2, indices = torch.sort(m2_selected, descending=True)
    restored_indices = torch.argsort(indices)
    n = sorted_m2.numel()
    suffix_sums = sorted_m2.flip(0).cumsum(0).flip(0)
    counts = torch.arange(n, 0, -1, dtype=sorted_m2.dtype)
    avg_m2_suffix = suffix_sums / counts
    below_threshold_indices = torch.where(avg_m2_suffix < m2_threshold)[0]
    num_to_mask = below_threshold_indices[0].item() if len(below_threshold_indices) > 0 else n - 1
    sorted_mask = torch.ones_like(sorted_m2, dtype=torch.bool)
    if num_to_mask > 0:
        sorted_mask[:num_to_mask] = False
    m2_full_flat = torch.zeros_like(mask_flat, dtype=torch.bool)
    m2_full_flat[mask_flat] = sorted_mask[restored_indices]
    return m2_full_flat.view_as(loss_mask)


def m2po_loss(log_prob, behavior_log_prob, advantages, loss_mask, m2_threshold):
    """AReaL's M2PO page: ``M * pi_theta / pi_old * A`` over the tokens, the masked ones kept in the
    denominator (AReaL's ``loss_mask_count`` is taken before its masks). The proximal policy is the
    learner at the step (``log_prob``, detached)."""
    keep = areal_m2po_mask(behavior_log_prob, log_prob.detach(), loss_mask, m2_threshold)
    ratio = torch.exp(log_prob - behavior_log_prob)
    return -(torch.where(keep, ratio * advantages, 0.0)).sum() / loss_mask.sum(), keep


@pytest.mark.parametrize("threshold", [0.04, 0.2, 1e-300])
def test_m2po_is_areals_second_moment_mask_on_the_unclipped_weighted_advantage(
    captured, token_batches, float64, threshold
):
    """On MuJoCo minibatches and padded token rows; at 1e-300 only exact zeros can stay below the
    threshold, so the rule's last branch (no suffix below it: all but the smallest dropped) runs too."""
    dropped, last_branch = 0, False
    for mb in [_float64(raw) for raw in captured] + [_token(rows) for rows in token_batches]:
        mask = mb.get("mask", torch.ones_like(mb["advantage"], dtype=torch.bool))
        ours = _vaco(M2PO(m2_threshold=threshold, normalize_advantage=False), mb)
        loss, keep = m2po_loss(mb["log_prob"], mb["behavior_log_prob"], mb["advantage"], mask, threshold)
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["mask_fraction"]) == pytest.approx(float((mask & ~keep).sum() / mask.sum()))
        m2 = (mb["log_prob"] - mb["behavior_log_prob"]).detach() ** 2
        if bool((mask & ~keep).any()):  # the dropped are the largest
            assert float(m2[keep].max()) <= float(m2[mask & ~keep].min())
        if threshold == 1e-300 and not bool((m2[mask] == 0).any()):
            assert int(keep.sum()) == 1
            last_branch = True
        dropped += int((mask & ~keep).sum())
    assert dropped > 0 and (last_branch or threshold != 1e-300)


def trinity_topr_loss(logprob, old_logprob, action_mask, advantages, advantage_threshold):
    rewards = advantages
    log_ratio = logprob - old_logprob
    ratio = torch.exp(log_ratio)
    ratio_clamped = torch.clamp(ratio, min=0.0, max=1.0)
    alpha = torch.where(rewards <= advantage_threshold, ratio_clamped, torch.ones_like(ratio))
    topr_loss = -alpha.detach() * rewards * logprob
    return (topr_loss * action_mask).sum() / action_mask.sum()  # token-mean


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_topr_is_trinitys_tapered_reinforce_loss(captured, token_batches, float64, threshold):
    tapered = 0
    for mb in [_float64(raw) for raw in captured] + [_token(rows) for rows in token_batches]:
        mask = mb.get("mask", torch.ones_like(mb["advantage"], dtype=torch.bool))
        ours = _vaco(TOPR(advantage_threshold=threshold, normalize_advantage=False), mb)
        loss = trinity_topr_loss(mb["log_prob"], mb["behavior_log_prob"], mask.double(), mb["advantage"], threshold)
        _close(ours[:2], _reference(loss, mb))
        ratio = (mb["log_prob"] - mb["behavior_log_prob"]).detach().exp()
        tapered += int(((mb["advantage"] <= threshold) & (ratio > 1) & mask).sum())
    assert tapered > 0


def trl_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
    kl_div = sampling_per_token_logps - per_token_logps.detach()
    seq_kl_sum = (kl_div * mask).sum(dim=1, keepdim=True)
    avg_seq_kl = seq_kl_sum / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    is_pos_adv = advantages >= 0
    is_low_kl = avg_seq_kl <= off_policy_threshold
    return (is_pos_adv | is_low_kl).to(dtype=mask.dtype)


def trl_masked_clip_loss(per_token_logps, old_per_token_logps, advantages, mask, eps_low, eps_high, threshold):
    """TRL's token loss (``loss_type="dapo"``: the sum over valid tokens over their count) with its
    clipped ratio and the off-policy mask. A [B] minibatch is B one-token sequences."""
    if per_token_logps.dim() == 1:
        per_token_logps, old_per_token_logps = per_token_logps[:, None], old_per_token_logps[:, None]
        advantages, mask = advantages[:, None], mask[:, None]
    off_policy_mask = trl_off_policy_mask(
        advantages[:, :1], per_token_logps, old_per_token_logps, mask.double(), threshold
    )
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages) * off_policy_mask
    return (per_token_loss * mask).sum() / mask.sum(), (off_policy_mask == 0) & mask


@pytest.mark.parametrize("delta", [0.5, 0.05])
def test_the_off_policy_sequence_mask_is_trls_on_its_clipped_loss(captured, token_batches, float64, delta):
    """GRPO's advantage is constant in a row, so TRL's (B, 1) advantage is each row's first token's."""
    masked = 0
    for mb in [_float64(raw) for raw in captured] + [_token(rows) for rows in token_batches]:
        mask = mb.get("mask", torch.ones_like(mb["advantage"], dtype=torch.bool))
        ours = _vaco(OffPolicySequenceMask(delta=delta, clip_epsilon_high=0.272, normalize_advantage=False), mb)
        loss, dropped = trl_masked_clip_loss(
            mb["log_prob"], mb["behavior_log_prob"], mb["advantage"], mask, 0.2, 0.272, delta
        )
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["mask_fraction"]) == pytest.approx(float(dropped.sum() / mask.sum()))
        masked += int(dropped.sum())
    assert masked > 0


def test_the_kimi_k25_loss_is_prime_rls_default_loss_without_its_mask(captured, token_batches, float64):
    inf = float("inf")
    cfg = {"dppo_mask_low": inf, "dppo_mask_high": inf, "adv_tau": 1.0, "kl_tau": 1e-3}
    for mb in [_float64(raw) for raw in captured] + [_token(rows) for rows in token_batches]:
        mask = mb.get("mask", torch.ones_like(mb["advantage"], dtype=torch.bool))
        ours = _vaco(KimiK25(normalize_advantage=False), mb)
        loss, fraction = prime_rl_default_loss(
            mb["log_prob"], mb["behavior_log_prob"], mb["advantage"], mask, "ratio", cfg
        )
        _close(ours[:2], _reference(loss, mb))
        assert float(ours[2]["mask_fraction"]) == 0.0 == float(fraction)


def _fit(root, algo: str, *args: str) -> None:
    fit_in_process(root, algo, *args, eval_every=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo",
    ["decoupled_ppo", "ppo_ewma", "tis", "mis", "cispo", "dppo_tv", "appo", "m2po", "topr", "ppo_opsm", "kimi_k25"],
)
def test_every_correction_fits_in_a_population_and_logs_the_lag_diagnostics(tmp_path, mlflow_uri, algo):
    """A population of 2 from the shipped config (its member == solo property is
    tests/test_population_fit.py's for the two proximal sources); every member's run has the ESS
    and the ratio's tail as lag/ metrics, and the objective's intervention fraction."""
    import mlflow

    _fit(tmp_path, algo, "--population", "2", "--data.init_args.total_steps", str(2 * 128))
    client = mlflow.MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("vaco").experiment_id])
    assert len(runs) == 2 and {r.data.params["algorithm"] for r in runs} == {algo}
    for run in runs:
        assert run.info.status == "FINISHED"
        metrics = run.data.metrics
        assert {"lag/ess", "lag/ratio_p99", "lag/ratio_max", run.data.params["fraction_metric"]} <= set(metrics)
        assert 0 < metrics["lag/ess"] <= 1 and metrics["lag/ratio_p99"] <= metrics["lag/ratio_max"]


@pytest.mark.slow
def test_an_ewma_run_resumed_equals_the_uninterrupted_run(tmp_path, mlflow_uri):
    """PPO-EWMA's average (weights and total weight) is in the checkpoint: 2 iterations then a
    resume to 3 equals 3 iterations straight, the EWMA and every metric but the timings included."""
    from helpers.runs import metric_histories
    from vaco.run.checkpoint import load_checkpoint

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    constant = ("--model.init_args.anneal_lr", "false")  # an extended budget re-plans an annealed schedule
    _fit(straight, "ppo_ewma", *constant, "--data.init_args.total_steps", str(3 * 128))
    _fit(resumed, "ppo_ewma", *constant, "--data.init_args.total_steps", str(2 * 128))
    (first,) = list((resumed / "checkpoints").glob("*/last.ckpt"))
    _fit(resumed, "ppo_ewma", *constant, "--data.init_args.total_steps", str(3 * 128), "--ckpt_path", str(first))
    ours = load_checkpoint(str(first))
    (theirs_path,) = list((straight / "checkpoints").glob("*/last.ckpt"))
    theirs = load_checkpoint(str(theirs_path))
    assert int(ours["state_dict"]["version"]) == 3
    keys = [k for k in theirs["state_dict"] if k.split(".")[0] in ("actor", "critic", "proximal_actor", "obs_rms")]
    assert any(k.startswith("proximal_actor.average.") for k in keys) and "proximal_actor._extra_state" in keys
    for key in keys:
        a, b = ours["state_dict"][key], theirs["state_dict"][key]
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, key
    assert ours["state_dict"]["proximal_actor._extra_state"]["total_weight"] > 1.0
    run_ids = {p.parent.name: p for p in (first, theirs_path)}
    assert len(run_ids) == 2
    ours, theirs = (metric_histories(mlflow_uri, p.parent.name) for p in (first, theirs_path))
    # the first budget's end evaluated and logged its budget: the only entries a straight run lacks
    assert ours.pop("time/total_steps") == [(0, 256.0), (256, 384.0)] and theirs.pop("time/total_steps") == [(0, 384.0)]
    for key in ("eval/return", "eval/return_std"):
        assert ours.pop(key)[1:] == theirs.pop(key)
    assert ours == theirs and {"train/cap_fraction", "lag/ess"} <= set(ours)
