"""GAE and V-trace against slow float64 loops written here from the definitions.

The reference V-trace below uses the *sum* form of the IMPALA definition (a double loop over
start and end times), not the backward recursion the library uses, so the two are independent.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives.value.functional import vtrace_advantage_estimate

from vaco.advantages import GAE, VTrace
from vaco.advantages.advantage_math import gae, group_relative, vtrace

pytestmark = pytest.mark.usefixtures("float64")  # reference math in float64 (conftest)


def make_batch(n_envs=4, T=12, seed=0, log_rho_scale=0.7):
    """Random rollout with terminations AND truncations inside the batch."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(n_envs, T, generator=g)
    values = torch.randn(n_envs, T, generator=g)
    next_values = torch.randn(n_envs, T, generator=g)
    # next_values[t] == values[t+1] inside a trajectory (same state), as a real critic gives
    next_values[:, :-1] = values[:, 1:]
    done = torch.zeros(n_envs, T, dtype=torch.bool)
    terminated = torch.zeros(n_envs, T, dtype=torch.bool)
    done[0, 3] = terminated[0, 3] = True  # termination
    done[1, 5] = True  # truncation: bootstrap from the final observation's value
    next_values[1, 5] = 10.0 + torch.randn((), generator=g)  # value of the final obs, not values[1, 6]
    done[2, 2] = terminated[2, 2] = True
    done[2, 8] = True  # truncation later in the same env
    next_values[2, 8] = -3.0
    done[3, T - 1] = terminated[3, T - 1] = True  # termination at the last step
    next_values[done] = torch.where(terminated[done], torch.full_like(next_values[done], 123.0), next_values[done])
    log_rhos = log_rho_scale * torch.randn(n_envs, T, generator=g)
    return log_rhos, rewards, values, next_values, done, terminated


def ref_gae(rewards, values, next_values, done, terminated, gamma, lmbda):
    n, T = rewards.shape
    adv = [[0.0] * T for _ in range(n)]
    for i in range(n):
        running = 0.0
        for t in reversed(range(T)):
            boot = 0.0 if terminated[i, t] else gamma * float(next_values[i, t])
            delta = float(rewards[i, t]) + boot - float(values[i, t])
            running = delta + (0.0 if done[i, t] else gamma * lmbda * running)
            adv[i][t] = running
    adv = torch.tensor(adv)
    return adv, adv + values


def ref_vtrace(log_rhos, rewards, values, next_values, done, terminated, gamma, lmbda, rho_bar, c_bar):
    """v_s = V(s) + sum_{t>=s} gamma^(t-s) (prod_{i=s}^{t-1} c_i) rho_t delta_t, inside the trajectory."""
    n, T = rewards.shape
    vs = [[0.0] * T for _ in range(n)]
    adv = [[0.0] * T for _ in range(n)]
    for i in range(n):
        ratio = [math.exp(float(x)) for x in log_rhos[i]]
        rho = [min(rho_bar, x) for x in ratio]
        c = [lmbda * min(c_bar, x) for x in ratio]
        delta = [
            rho[t]
            * (
                float(rewards[i, t])
                + (0.0 if terminated[i, t] else gamma * float(next_values[i, t]))
                - float(values[i, t])
            )
            for t in range(T)
        ]
        for s in range(T):
            total, coef = 0.0, 1.0
            for t in range(s, T):
                total += (gamma ** (t - s)) * coef * delta[t]
                if done[i, t]:
                    break
                coef *= c[t]
            vs[i][s] = float(values[i, s]) + total
        for s in range(T):
            v_next = float(next_values[i, s]) if (done[i, s] or s == T - 1) else vs[i][s + 1]
            boot = 0.0 if terminated[i, s] else gamma * v_next
            adv[i][s] = float(rewards[i, s]) + boot - float(values[i, s])
    return torch.tensor(adv), torch.tensor(vs)


@pytest.mark.parametrize("gamma,lmbda", [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_gae_matches_loop(gamma, lmbda):
    _, r, v, nv, d, te = make_batch()
    adv, target = gae(r, v, nv, d, te, gamma=gamma, lmbda=lmbda)
    ref_adv, ref_target = ref_gae(r, v, nv, d, te, gamma, lmbda)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(target, ref_target, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "gamma,lmbda,rho_bar,c_bar",
    [(0.99, 1.0, 1.0, 1.0), (0.99, 0.95, 1.0, 1.0), (0.9, 0.8, 2.0, 0.5), (0.99, 1.0, 0.5, 2.0), (0.97, 0.9, 1e9, 1e9)],
)
def test_vtrace_matches_loop(gamma, lmbda, rho_bar, c_bar):
    lr, r, v, nv, d, te = make_batch(log_rho_scale=1.0)
    # make sure both truncations (rho_bar/c_bar) are active somewhere
    assert (lr.exp() > 1).any() and (lr.exp() < 1).any()
    adv, vs = vtrace(lr, r, v, nv, d, te, gamma=gamma, lmbda=lmbda, rho_bar=rho_bar, c_bar=c_bar)
    ref_adv, ref_vs = ref_vtrace(lr, r, v, nv, d, te, gamma, lmbda, rho_bar, c_bar)
    torch.testing.assert_close(vs, ref_vs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-10, atol=1e-10)


def test_vtrace_clipping_changes_result():
    """Each knob is live on this batch: changing it moves the targets by far more than the
    tolerance, and to where the float64 loop says they go (not merely somewhere else)."""
    lr, r, v, nv, d, te = make_batch(log_rho_scale=1.0)
    base = vtrace(lr, r, v, nv, d, te, gamma=0.99, lmbda=1.0, rho_bar=1.0, c_bar=1.0)[1]
    for kwargs in ({"rho_bar": 0.5}, {"c_bar": 0.5}, {"lmbda": 0.5}):
        settings = {"lmbda": 1.0, "rho_bar": 1.0, "c_bar": 1.0, **kwargs}
        other = vtrace(lr, r, v, nv, d, te, gamma=0.99, **settings)[1]
        assert (base - other).abs().max() > 1e-2, kwargs
        expected = ref_vtrace(lr, r, v, nv, d, te, 0.99, settings["lmbda"], settings["rho_bar"], settings["c_bar"])[1]
        torch.testing.assert_close(other, expected, rtol=1e-10, atol=1e-10)


def test_vtrace_truncation_bootstraps_from_final_observation():
    lr, r, v, nv, d, te = make_batch()
    adv, _ = vtrace(lr, r, v, nv, d, te, gamma=0.9, lmbda=1.0)
    # env 1 truncated after step 5: A_5 = r_5 + gamma * V(final obs) - V(s_5)
    torch.testing.assert_close(adv[1, 5], r[1, 5] + 0.9 * nv[1, 5] - v[1, 5])
    # env 0 terminated after step 3: no bootstrap at all
    torch.testing.assert_close(adv[0, 3], r[0, 3] - v[0, 3])


@pytest.mark.parametrize("lmbda", [1.0, 0.95, 0.0])
def test_on_policy_vtrace_targets_equal_gae_targets(lmbda):
    lr, r, v, nv, d, te = make_batch()
    zero = torch.zeros_like(lr)
    _, vs = vtrace(zero, r, v, nv, d, te, gamma=0.99, lmbda=lmbda, rho_bar=1.0, c_bar=1.0)
    _, gae_targets = gae(r, v, nv, d, te, gamma=0.99, lmbda=lmbda)
    torch.testing.assert_close(vs, gae_targets, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (0.7, 1.3), (2.0, 0.5)])
def test_torchrl_functional_advantage_is_rho_weighted_ours(rho_bar, c_bar):
    """TorchRL's vtrace_advantage_estimate returns min(rho_bar, r) * our advantage (lambda = 1).

    Note its naming: the *first* log-prob argument is the learner's (rho = exp(log_pi - log_mu)).
    """
    lr, r, v, nv, d, te = make_batch(log_rho_scale=1.0)
    ours, vs = vtrace(lr, r, v, nv, d, te, gamma=0.99, lmbda=1.0, rho_bar=rho_bar, c_bar=c_bar)
    u = lambda x: x.unsqueeze(-1)  # noqa: E731 - TorchRL wants a trailing feature dim
    theirs, their_vs = vtrace_advantage_estimate(
        0.99, u(lr), u(torch.zeros_like(lr)), u(v), u(nv), u(r), u(d), u(te), rho_thresh=rho_bar, c_thresh=c_bar
    )
    torch.testing.assert_close(their_vs.squeeze(-1), vs)
    torch.testing.assert_close(theirs.squeeze(-1), lr.exp().clamp(max=rho_bar) * ours)


def test_leading_batch_dims_and_float32():
    lr, r, v, nv, d, te = make_batch()
    args = [x.reshape(2, 2, -1) for x in (lr, r, v, nv, d, te)]
    adv, vs = vtrace(*args, gamma=0.99, lmbda=0.9)
    flat_adv, flat_vs = vtrace(lr, r, v, nv, d, te, gamma=0.99, lmbda=0.9)
    torch.testing.assert_close(adv.reshape(4, -1), flat_adv)
    f32 = [x.float() if x.is_floating_point() else x for x in (lr, r, v, nv, d, te)]
    adv32, _ = vtrace(*f32, gamma=0.99, lmbda=0.9)
    assert adv32.dtype == torch.float32
    torch.testing.assert_close(adv32.double(), flat_adv, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- bad input
def _args():
    return list(make_batch())


def test_mismatched_shapes_raise_naming_the_argument():
    lr, r, v, nv, d, te = _args()
    with pytest.raises(ValueError, match="`values`"):
        gae(r, v[:, :-1], nv, d, te, gamma=0.99, lmbda=0.95)
    with pytest.raises(ValueError, match="`log_rhos`"):
        vtrace(lr[:2], r, v, nv, d, te, gamma=0.99)


def test_silent_broadcast_is_an_error():
    lr, r, v, nv, d, te = _args()
    with pytest.raises(ValueError, match="no broadcasting"):
        gae(r, v.unsqueeze(-1), nv, d, te, gamma=0.99, lmbda=0.95)
    with pytest.raises(ValueError, match="no broadcasting"):
        vtrace(lr.unsqueeze(-1), r, v, nv, d, te, gamma=0.99)


@pytest.mark.parametrize("name", ["rho_bar", "c_bar"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_nonpositive_truncation_raises(name, bad):
    with pytest.raises(ValueError, match=f"`{name}`"):
        vtrace(*_args(), gamma=0.99, **{name: bad})


@pytest.mark.parametrize("field", ["rewards", "values", "next_values", "log_rhos"])
def test_nan_input_raises(field):
    lr, r, v, nv, d, te = _args()
    named = dict(log_rhos=lr, rewards=r, values=v, next_values=nv)
    named[field] = named[field].clone()
    named[field][1, 2] = float("nan")
    with pytest.raises(ValueError, match=f"`{field}` contains 1 NaN"):
        vtrace(named["log_rhos"], named["rewards"], named["values"], named["next_values"], d, te, gamma=0.99)


def test_terminated_without_done_raises():
    lr, r, v, nv, d, te = _args()
    te = te.clone()
    te[0, 0] = True
    with pytest.raises(ValueError, match="implies"):
        gae(r, v, nv, d, te, gamma=0.99, lmbda=0.95)


def test_gamma_out_of_range_raises():
    with pytest.raises(ValueError, match="`gamma`"):
        gae(*_args()[1:], gamma=1.5, lmbda=0.95)


# ---------------------------------------------------------------- modules
def _rollout_td(trailing=True):
    lr, r, v, nv, d, te = make_batch()
    u = (lambda x: x.unsqueeze(-1)) if trailing else (lambda x: x)  # noqa: E731
    return TensorDict(
        {
            "state_value": v,
            "behavior_log_prob": torch.zeros_like(lr),
            "log_prob": lr,
            "next": {"reward": u(r), "done": u(d), "terminated": u(te), "state_value": nv},
        },
        batch_size=r.shape,
    ), (lr, r, v, nv, d, te)


@pytest.mark.parametrize("trailing", [True, False])
def test_modules_write_advantage_and_target(trailing):
    td, (lr, r, v, nv, d, te) = _rollout_td(trailing)
    GAE(gamma=0.99, lmbda=0.9)(td)
    exp = gae(r, v, nv, d, te, gamma=0.99, lmbda=0.9)
    torch.testing.assert_close(td["advantage"], exp[0])
    torch.testing.assert_close(td["value_target"], exp[1])
    VTrace(gamma=0.99, lmbda=0.9, rho_bar=1.0, c_bar=1.0)(td)
    exp = vtrace(lr, r, v, nv, d, te, gamma=0.99, lmbda=0.9)
    torch.testing.assert_close(td["advantage"], exp[0])
    torch.testing.assert_close(td["value_target"], exp[1])


def test_module_arguments_validated_at_construction():
    with pytest.raises(ValueError, match="`rho_bar`"):
        VTrace(rho_bar=0.0)
    with pytest.raises(ValueError, match="`lmbda`"):
        GAE(lmbda=1.2)


# ---------------------------------------------------------------- group relative
def test_group_relative_matches_loop():
    g = torch.Generator().manual_seed(3)
    rewards = (torch.rand(5, 8, generator=g) > 0.5).double()
    rewards[0] = 1.0  # all correct: zero advantage, no NaN
    adv = group_relative(rewards, eps=1e-6)
    for i in range(5):
        row = [float(x) for x in rewards[i]]
        mean = sum(row) / len(row)
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / (len(row) - 1))
        for j in range(8):
            assert abs(float(adv[i, j]) - (row[j] - mean) / (std + 1e-6)) < 1e-9
    assert torch.all(adv[0] == 0)
    with pytest.raises(ValueError, match="G >= 2"):
        group_relative(torch.ones(4, 1))
