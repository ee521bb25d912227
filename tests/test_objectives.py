"""Objectives: hand-computed losses and gradients, the TV filter truth table, TorchRL parity,
the shared contract over every objective, and a user-defined objective written in this file."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import IndependentNormal, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss

from vaco.objectives import (
    APPO,
    CISPO,
    DPPOTV,
    GSPO,
    IMPALA,
    MIS,
    PPOEWMA,
    PPOKL,
    SPO,
    TIS,
    DecoupledPPO,
    Objective,
    PPOClip,
    SequenceMIS,
    SequenceTIS,
    TVFilter,
)
from vaco.objectives.objective_math import gaussian_kl, tv_filter_mask

pytestmark = pytest.mark.usefixtures("float64")  # reference math in float64 (conftest)


def minibatch(log_prob, behavior_log_prob, advantage, **extra):
    log_prob = torch.tensor(log_prob, requires_grad=True)
    td = TensorDict(
        {
            "log_prob": log_prob,
            "behavior_log_prob": torch.tensor(behavior_log_prob),
            "advantage": torch.tensor(advantage),
            **{k: torch.as_tensor(v) for k, v in extra.items()},
        },
        batch_size=[len(advantage)],
    )
    return td, log_prob


def grad_of(loss, leaf):
    (g,) = torch.autograd.grad(loss, leaf)
    return g


# ---------------------------------------------------------------- TV filter mask
LOG2 = math.log(2.0)


@pytest.mark.parametrize(
    "log_ratio,adv,delta,expect_keep,expect_tv",
    [
        # tv under delta/2: nothing is filtered whatever the signs
        ([0.01, -0.01, 0.0], [1.0, 1.0, -1.0], 0.2, [True, True, True], None),
        # tv over delta/2: filter A>0 & r>1 and A<0 & r<1; keep the opposite signs; r==1 kept
        (
            [LOG2, LOG2, -LOG2, -LOG2, 0.0, 0.0],
            [1.0, -1.0, 1.0, -1.0, 1.0, -1.0],
            0.2,
            [False, True, True, False, True, True],
            0.5 * (1 + 1 + 0.5 + 0.5) / 6,
        ),
        # A == 0 never raises the TV
        ([LOG2, -LOG2], [0.0, 0.0], 0.2, [True, True], 0.5 * 1.5 / 2),
    ],
)
def test_tv_filter_truth_table(log_ratio, adv, delta, expect_keep, expect_tv):
    keep, tv = tv_filter_mask(torch.tensor(log_ratio), torch.tensor(adv), delta=delta)
    assert keep.dtype == torch.bool
    assert keep.tolist() == expect_keep
    ratio = [math.exp(x) for x in log_ratio]
    ref_tv = 0.5 * sum(abs(r - 1) for r in ratio) / len(ratio)
    assert abs(float(tv) - ref_tv) < 1e-12
    if expect_tv is not None:
        assert abs(float(tv) - expect_tv) < 1e-12


def test_tv_filter_threshold_is_strict_and_half_delta():
    log_ratio = torch.tensor([math.log(1.2), math.log(0.8)])  # tv = 0.5 * 0.2 = 0.1
    adv = torch.tensor([1.0, -1.0])
    keep, tv = tv_filter_mask(log_ratio, adv, delta=0.2 + 1e-9)  # tv < delta/2 + eps: keep all
    assert keep.all()
    keep, _ = tv_filter_mask(log_ratio, adv, delta=0.2 - 1e-6)  # tv > delta/2: filter both
    assert not keep.any()


def test_tv_filter_mask_ignores_padding():
    log_ratio = torch.tensor([[LOG2, LOG2], [LOG2, 5.0]])
    adv = torch.ones(2, 2)
    mask = torch.tensor([[True, True], [True, False]])
    keep, tv = tv_filter_mask(log_ratio, adv, delta=0.2, mask=mask)
    assert abs(float(tv) - 0.5) < 1e-12  # the padded ratio e^5 is not counted
    assert keep.tolist() == [[False, False], [False, True]]


@pytest.mark.parametrize("bad", [0.0, -0.1, float("inf")])
def test_tv_filter_rejects_bad_delta(bad):
    with pytest.raises(ValueError, match="`delta`"):
        tv_filter_mask(torch.zeros(3), torch.zeros(3), delta=bad)
    with pytest.raises(ValueError, match="`delta`"):
        TVFilter(delta=bad)


def test_tv_filter_rejects_broadcast_and_nan():
    with pytest.raises(ValueError, match="no broadcasting"):
        tv_filter_mask(torch.zeros(4), torch.zeros(4, 1), delta=0.2)
    with pytest.raises(ValueError, match="`advantages` contains 1 NaN"):
        tv_filter_mask(torch.zeros(2), torch.tensor([0.0, float("nan")]), delta=0.2)


# ---------------------------------------------------------------- TV filter objective
def test_tv_filter_loss_and_exact_zero_gradient_on_filtered_samples():
    lp_b = [0.0, 0.0, 0.0, 0.0, 0.0]
    lp = [LOG2, LOG2, -LOG2, -LOG2, 0.0]  # r = 2, 2, .5, .5, 1 -> tv = 0.5*(1+1+.5+.5+0)/5 = 0.3
    adv = [1.0, -2.0, 3.0, -4.0, 5.0]
    td, leaf = minibatch(lp, lp_b, adv)
    obj = TVFilter(delta=0.2, normalize_advantage=False)
    out = obj(td)
    r = [math.exp(x) for x in lp]
    # the loss value is unchanged by detaching: -mean(r * A)
    ref_loss = -sum(ri * ai for ri, ai in zip(r, adv)) / 5
    assert abs(float(out["loss_policy"]) - ref_loss) < 1e-12
    g = grad_of(out["loss_policy"], leaf)
    # d/dlogp of -r*A/N is -r*A/N; filtered: samples 0 (A>0, r>1) and 3 (A<0, r<1)
    expected = [0.0, -r[1] * adv[1] / 5, -r[2] * adv[2] / 5, 0.0, -r[4] * adv[4] / 5]
    assert g.tolist() == pytest.approx(expected, abs=1e-12)
    assert g[0] == 0.0 and g[3] == 0.0  # exactly zero, not small
    assert float(out["filter_fraction"]) == pytest.approx(2 / 5)
    assert float(out["tv"]) == pytest.approx(0.3)


def test_tv_filter_inactive_below_threshold_is_plain_importance_sampling():
    lp = [0.05, -0.05, 0.02]
    adv = [1.0, -1.0, 2.0]
    td, leaf = minibatch(lp, [0.0] * 3, adv)
    out = TVFilter(delta=0.2, normalize_advantage=False)(td)
    g = grad_of(out["loss_policy"], leaf)
    assert g.tolist() == pytest.approx([-math.exp(x) * a / 3 for x, a in zip(lp, adv)], abs=1e-12)
    assert float(out["filter_fraction"]) == 0.0


def test_tv_filter_with_entropy_coef_exact_and_paper_sign_tests():
    c_h = 0.5
    # one sample, r = 2 (> 1), A = 0.4, log pi = -1.5
    # exact coefficient: A - c_H (1 + log pi) = 0.4 - 0.5*(-0.5) = 0.65 > 0 -> raises tv -> filtered
    # paper's Algorithm 1: A - c_H = -0.1 < 0 -> kept
    lp = [-1.5]
    lp_b = [-1.5 - LOG2]
    td, leaf = minibatch(lp, lp_b, [0.4])
    exact = TVFilter(delta=0.2, entropy_coef=c_h, normalize_advantage=False)(td)
    assert float(exact["filter_fraction"]) == 1.0
    td, leaf = minibatch(lp, lp_b, [0.4])
    paper = TVFilter(delta=0.2, entropy_coef=c_h, sign_test="paper", normalize_advantage=False)(td)
    assert float(paper["filter_fraction"]) == 0.0
    # loss: -r (A - c_H log pi) ; d/dlogp = -r (A - c_H log pi) + r c_H = -r (A - c_H (1 + log pi))
    r = 2.0
    assert float(paper["loss_policy"]) == pytest.approx(-r * (0.4 - c_h * -1.5))
    assert float(grad_of(paper["loss_policy"], leaf)) == pytest.approx(-r * (0.4 - c_h * (1 - 1.5)))
    # and the exact sign test is right: a gradient *descent* step on the kept sample raises tv
    assert "loss_entropy" not in paper.keys()  # the entropy lives in the surrogate


@pytest.mark.parametrize("normalize", [True, False])
def test_tv_filter_advantage_normalisation_changes_which_samples_are_filtered(normalize):
    # all raw advantages positive; normalised, the two smallest become negative
    adv = [1.0, 2.0, 3.0, 4.0]
    lp = [LOG2] * 4  # r = 2 everywhere, tv = 0.5 > 0.1
    td, leaf = minibatch(lp, [0.0] * 4, adv)
    out = TVFilter(delta=0.2, normalize_advantage=normalize)(td)
    g = grad_of(out["loss_policy"], leaf)
    if normalize:
        # normalised A = (a - 2.5)/std: samples 0, 1 negative -> kept (r>1, A<0 lowers tv)
        assert float(out["filter_fraction"]) == 0.5
        assert (g[:2] != 0).all() and (g[2:] == 0).all()
    else:
        assert float(out["filter_fraction"]) == 1.0
        assert (g == 0).all()


# ---------------------------------------------------------------- other objectives, by hand
def test_ppo_clip_loss_and_gradient_by_hand():
    lp = [math.log(1.5), math.log(1.5), math.log(0.5), math.log(0.5), math.log(1.1)]
    adv = [1.0, -1.0, 1.0, -1.0, 2.0]
    td, leaf = minibatch(lp, [0.0] * 5, adv)
    out = PPOClip(clip_epsilon=0.2, normalize_advantage=False)(td)
    # per sample -min(rA, clip(r)A):
    #  r=1.5,A=1 -> -1.2 (clipped)  r=1.5,A=-1 -> 1.5  r=.5,A=1 -> -.5  r=.5,A=-1 -> .8 (clipped)  r=1.1,A=2 -> -2.2
    assert float(out["loss_policy"]) == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8 - 2.2) / 5)
    g = grad_of(out["loss_policy"], leaf)
    assert g.tolist() == pytest.approx([0.0, 1.5 / 5, -0.5 / 5, 0.0, -2.2 / 5], abs=1e-12)
    assert float(out["clip_fraction"]) == pytest.approx(2 / 5)


def test_ppo_clip_higher_asymmetric_range():
    lp = [math.log(1.25), math.log(0.75)]
    adv = [1.0, -1.0]
    td, _ = minibatch(lp, [0.0, 0.0], adv)
    out = PPOClip(clip_epsilon=0.2, clip_epsilon_high=0.272, normalize_advantage=False)(td)
    # r = 1.25 < 1.272 not clipped above; r = .75 < .8 clipped below (A<0)
    assert float(out["loss_policy"]) == pytest.approx((-1.25 + 0.8) / 2)
    assert float(out["clip_fraction"]) == 0.5


def test_ppo_kl_penalty_by_hand_and_adaptive_hook():
    loc = torch.tensor([[0.5, 0.0]], requires_grad=True)
    scale = torch.tensor([[1.0, 2.0]])
    b_loc, b_scale = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]])
    td, leaf = minibatch([0.0], [0.0], [1.0], behavior_loc=b_loc, behavior_scale=b_scale, scale=scale)
    td.set("loc", loc)
    obj = PPOKL(kl_coef=1.0, target_kl=0.01, normalize_advantage=False)
    out = obj(td)
    # KL(N(0,1)||N(.5,1)) + KL(N(0,1)||N(0,2)) = .125 + (log 2 + 1/8 - 1/2)
    kl = 0.125 + (math.log(2.0) + 0.125 - 0.5)
    assert float(out["kl"]) == pytest.approx(kl)
    assert float(out["loss_policy"]) == pytest.approx(-1.0 + kl)
    (g_loc,) = torch.autograd.grad(out["loss_policy"], loc)
    # d/dloc_q of (m_p - m_q)^2 / (2 s_q^2) = (m_q - m_p) / s_q^2
    assert g_loc[0].tolist() == pytest.approx([0.5, 0.0])
    # forward has no side effects; the explicit hook adapts the coefficient
    assert float(obj.kl_coef) == 1.0
    obj.update_coefficients({"kl": 1.0})
    assert float(obj.kl_coef) == 2.0
    obj.update_coefficients({"kl": 1e-4})
    assert float(obj.kl_coef) == 1.0
    fixed = PPOKL(kl_coef=1.0)
    fixed.update_coefficients({"kl": 10.0})
    assert float(fixed.kl_coef) == 1.0


def test_gaussian_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(7, 3, generator=g) for _ in range(2)] + [torch.rand(7, 3, generator=g) + 0.1 for _ in range(2)]
    p = torch.distributions.Normal(a[0], a[2])
    q = torch.distributions.Normal(a[1], a[3])
    torch.testing.assert_close(gaussian_kl(a[0], a[2], a[1], a[3]), torch.distributions.kl_divergence(p, q).sum(-1))


def test_spo_loss_and_gradient_by_hand():
    lp = [math.log(1.5), math.log(0.5)]
    adv = [2.0, -1.0]
    td, leaf = minibatch(lp, [0.0, 0.0], adv)
    out = SPO(epsilon=0.2, normalize_advantage=False)(td)
    per = [-(a * r - abs(a) * (r - 1) ** 2 / 0.4) for r, a in zip([1.5, 0.5], adv)]
    assert float(out["loss_policy"]) == pytest.approx(sum(per) / 2)
    # d/dlogp = r * d/dr = -r (A - |A| (r-1)/eps) / N
    exp = [-r * (a - abs(a) * (r - 1) / 0.2) / 2 for r, a in zip([1.5, 0.5], adv)]
    assert grad_of(out["loss_policy"], leaf).tolist() == pytest.approx(exp)
    assert float(out["clip_fraction"]) == 0.0 and float(out["filter_fraction"]) == 0.0


def test_impala_loss_and_gradient_by_hand():
    lp = [math.log(2.0) - 1.0, math.log(0.5) - 2.0]
    lp_b = [-1.0, -2.0]  # r = 2, 0.5
    adv = [1.0, -3.0]
    td, leaf = minibatch(lp, lp_b, adv)
    obj = IMPALA(rho_bar=1.0, normalize_advantage=False)
    out = obj(td)
    # -min(1, r) A log pi: weight 1 and 0.5, treated as constants
    assert float(out["loss_policy"]) == pytest.approx(-(1.0 * 1.0 * lp[0] + 0.5 * -3.0 * lp[1]) / 2)
    assert grad_of(out["loss_policy"], leaf).tolist() == pytest.approx([-1.0 / 2, 1.5 / 2])
    assert IMPALA.reestimate_advantage and not TVFilter.reestimate_advantage


def test_value_loss_clipped_like_cleanrl():
    value = torch.tensor([1.0, 0.0], requires_grad=True)
    td, _ = minibatch(
        [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], value_target=torch.tensor([2.0, 0.1]), state_value=torch.tensor([0.5, 0.0])
    )
    td.set("value", value)
    out = PPOClip(value_coef=0.5, normalize_advantage=False)(td)
    # sample 0: unclipped (1-2)^2=1, clipped v=0.5+0.2=0.7 -> 1.69 -> max 1.69; sample 1: .01 vs .01
    assert float(out["loss_value"]) == pytest.approx(0.5 * 0.5 * (1.69 + 0.01) / 2)
    out = PPOClip(value_coef=0.5, clip_value_loss=False, normalize_advantage=False)(td)
    assert float(out["loss_value"]) == pytest.approx(0.5 * 0.5 * (1.0 + 0.01) / 2)


# ---------------------------------------------------------------- parity with TorchRL
def test_ppo_clip_equals_torchrl_clip_ppo_loss():
    torch.manual_seed(0)
    obs_dim, act_dim, B = 5, 2, 64
    net = nn.Sequential(nn.Linear(obs_dim, 2 * act_dim), NormalParamExtractor())
    actor = ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    critic = ValueOperator(nn.Linear(obs_dim, 1), in_keys=["observation"])
    obs = torch.randn(B, obs_dim)
    action = torch.randn(B, act_dim)
    behavior_log_prob = torch.randn(B) * 0.3 - 2.0
    advantage = torch.randn(B, 1)
    td = TensorDict(
        {
            "observation": obs,
            "action": action,
            "action_log_prob": behavior_log_prob,
            "advantage": advantage,
            "value_target": torch.randn(B, 1),
        },
        batch_size=[B],
    )
    loss = ClipPPOLoss(
        actor, critic, clip_epsilon=0.2, entropy_bonus=False, critic_coeff=0.0, normalize_advantage=False
    )
    loss.set_keys(sample_log_prob="action_log_prob")
    theirs = loss(td.clone())["loss_objective"]

    dist = actor.get_dist(td.clone())
    ours_td = TensorDict(
        {"log_prob": dist.log_prob(action), "behavior_log_prob": behavior_log_prob, "advantage": advantage.squeeze(-1)},
        batch_size=[B],
    )
    ours = PPOClip(clip_epsilon=0.2, normalize_advantage=False)(ours_td)["loss_policy"]
    torch.testing.assert_close(ours, theirs)
    g_ours = torch.autograd.grad(ours, list(net.parameters()))
    g_theirs = torch.autograd.grad(loss(td.clone())["loss_objective"], list(net.parameters()))
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------- a user objective, ~30 lines
class RatioCap(Objective):
    """Truncated importance sampling: -min(r, c) * A, with the weight's gradient kept below c."""

    def __init__(self, cap: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.cap = cap

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        capped = ratio > self.cap
        weight = torch.where(capped, ratio.detach().clamp(max=self.cap), ratio)
        return -weight * advantage, {"clipped": capped}


def test_user_defined_objective_gets_the_shared_contract():
    td, leaf = minibatch([math.log(3.0), 0.0], [0.0, 0.0], [1.0, 1.0])
    out = RatioCap(cap=2.0, normalize_advantage=False)(td)
    assert float(out["loss_policy"]) == pytest.approx(-(2.0 + 1.0) / 2)
    assert grad_of(out["loss_policy"], leaf).tolist() == pytest.approx([0.0, -0.5])
    assert float(out["clip_fraction"]) == 0.5
    assert set(METRICS) <= set(out.keys())


# ---------------------------------------------------------------- the contract, for every objective
METRICS = [
    "tv",
    "filter_fraction",
    "clip_fraction",
    "approx_kl",
    "ratio_mean",
    "ratio_max",
    "ratio_p99",
    "ess",
    "ess_applied",
    "entropy",
]
CORRECTIONS = [DecoupledPPO, PPOEWMA, TIS, MIS, CISPO, DPPOTV, APPO]
ALL = [PPOClip, PPOKL, SPO, IMPALA, TVFilter, RatioCap, *CORRECTIONS]
SEQUENCE_LEVEL = [GSPO, SequenceTIS, SequenceMIS]


def full_minibatch(B=32, A=3, seed=0, shape=None):
    g = torch.Generator().manual_seed(seed)
    shape = shape or (B,)
    loc = torch.randn(*shape, A, generator=g, requires_grad=True)
    td = TensorDict(
        {
            "log_prob": (torch.randn(*shape, generator=g) * 0.3).requires_grad_(),
            "behavior_log_prob": torch.randn(*shape, generator=g) * 0.3,
            "proximal_log_prob": torch.randn(*shape, generator=g) * 0.3,
            "advantage": torch.randn(*shape, generator=g),
            "entropy": torch.rand(*shape, generator=g).requires_grad_(),
            "value": torch.randn(*shape, generator=g).requires_grad_(),
            "value_target": torch.randn(*shape, generator=g),
            "state_value": torch.randn(*shape, generator=g),
            "loc": loc,
            "scale": torch.rand(*shape, A, generator=g) + 0.5,
            "behavior_loc": torch.randn(*shape, A, generator=g),
            "behavior_scale": torch.rand(*shape, A, generator=g) + 0.5,
        },
        batch_size=shape,
    )
    return td


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("normalize", [True, False])
def test_contract_every_objective(cls, normalize):
    td = full_minibatch()
    out = cls(entropy_coef=0.01, normalize_advantage=normalize)(td)
    losses = [k for k in out.keys() if k.startswith("loss_")]
    assert "loss_policy" in losses and "loss_value" in losses
    for k in METRICS:
        assert k in out.keys(), k
        assert not out[k].requires_grad and out[k].ndim == 0
    total = sum(out[k] for k in losses)
    assert torch.isfinite(total)
    grads = torch.autograd.grad(total, [td["log_prob"], td["value"]])
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    assert 0.0 <= float(out["filter_fraction"]) <= 1.0 and 0.0 <= float(out["clip_fraction"]) <= 1.0
    ratio = (td["log_prob"] - td["behavior_log_prob"]).exp()
    assert float(out["tv"]) == pytest.approx(0.5 * float((ratio - 1).abs().mean()))
    assert float(out["ratio_max"]) == pytest.approx(float(ratio.max()))


@pytest.mark.parametrize("cls", ALL + SEQUENCE_LEVEL)
def test_contract_token_level_with_mask(cls):
    """[B, L] token tensors with padding: padded entries change nothing."""
    td = full_minibatch(shape=(4, 6))
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[:, 4:] = False
    td.set("mask", mask)
    out = cls(normalize_advantage=False)(td)
    poisoned = td.clone()
    poisoned["log_prob"] = torch.where(mask, td["log_prob"], td["log_prob"] + 3.0).detach().requires_grad_()
    poisoned["advantage"] = torch.where(mask, td["advantage"], torch.full_like(td["advantage"], 50.0))
    out2 = cls(normalize_advantage=False)(poisoned)
    for k in ("loss_policy", "tv", "clip_fraction", "filter_fraction"):
        torch.testing.assert_close(out[k], out2[k])


@pytest.mark.parametrize("cls", ALL)
def test_contract_rejects_bad_input(cls):
    td = full_minibatch()
    bad = TensorDict(
        {
            "log_prob": td["log_prob"],
            "behavior_log_prob": td["behavior_log_prob"],
            "advantage": td["advantage"][:, None].clone(),
        },
        batch_size=[],
    )  # [B] vs [B, 1]
    with pytest.raises(ValueError, match="no broadcasting"):
        cls()(bad)
    td = full_minibatch()
    td["behavior_log_prob"][3] = float("nan")
    with pytest.raises(ValueError, match="`behavior_log_prob` contains 1 NaN"):
        cls()(td)


@pytest.mark.parametrize(
    "make, weight",
    [
        (lambda: TIS(truncation=1.2), lambda r: min(r, 1.2)),
        (lambda: MIS(low=0.8, high=1.25), lambda r: r if 0.8 <= r <= 1.25 else 0.0),
        (lambda: IMPALA(rho_bar=1.1), lambda r: min(r, 1.1)),
        (lambda: CISPO(clip_epsilon_low=0.1, clip_epsilon_high=0.15), lambda r: min(max(r, 0.9), 1.15)),
        (lambda: PPOClip(), lambda r: r),  # no weight of its own: the ratio's
    ],
)
def test_the_applied_ess_is_the_ess_of_the_weights_the_objective_applies(make, weight):
    """``ess_applied`` by hand in float64: ``(sum w)^2 / (N sum w^2)`` over the weights each objective
    applies (verl's ``rollout_is_eff_sample_size`` over its truncated weights), beside the raw ratio's."""
    td = full_minibatch(B=64, seed=3)
    out = make()(td)
    ratios = (td["log_prob"].detach() - td["behavior_log_prob"]).double().exp().tolist()
    w = [weight(r) for r in ratios]
    expected = sum(w) ** 2 / (len(w) * sum(x * x for x in w))
    raw = sum(ratios) ** 2 / (len(ratios) * sum(x * x for x in ratios))
    assert float(out["ess_applied"]) == pytest.approx(expected, rel=1e-5)
    assert float(out["ess"]) == pytest.approx(raw, rel=1e-5)
