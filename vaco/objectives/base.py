"""The objective contract: one base class, one policy surrogate per subclass.

The base class owns everything the objectives share: the ratio against the *behaviour* policy
(``r = pi_theta / beta``, never against a stale "old" learner), advantage normalisation, the
entropy bonus, the critic loss and the diagnostics. A subclass overrides only
:meth:`Objective.surrogate`. Adding an objective is therefore a dozen lines (see the README).

Keys read from the minibatch (a TensorDict with batch dims ``[B]`` or ``[B, L]`` for tokens):

==================== ======================================================================
key                  meaning
==================== ======================================================================
``log_prob``         learner's ``log pi_theta(a|s)`` now, with gradient
``behavior_log_prob`` ``log beta(a|s)`` of the policy that acted (stored at collection)
``advantage``        advantage (GAE, realigned V-trace, or group-relative)
``entropy``          (optional) learner's entropy, with gradient
``value``            (optional) critic's prediction now, with gradient; no critic loss if absent
``value_target``     (with ``value``) regression target of the critic
``state_value``      (with ``value`` and value clipping) critic's prediction at collection
``mask``             (optional, bool) valid entries, e.g. non-padding tokens
``proximal_log_prob`` (objectives whose :attr:`Objective.proximal` is set) ``log pi_prox(a|s)`` of
                     the proximal policy the learner provides: ``"recompute"``, the learner at
                     the start of the iteration; ``"ewma"``, an exponential moving average of
                     the actor's weights (:class:`vaco.learners.proximal.EWMAPolicy`)
==================== ======================================================================

:meth:`Objective.forward` returns a TensorDict: entries named ``loss_*`` carry gradient and
are summed by the trainer; every other entry is a detached scalar metric, identical across
objectives: ``tv``, ``filter_fraction``, ``clip_fraction``, ``approx_kl``, ``ratio_mean``,
``entropy``, and the lag diagnostics of the importance weights ``r``: ``ratio_max``, ``ratio_p99``
and ``ess`` (their normalised effective sample size), and ``ess_applied``, the effective sample size
of the weights the objective itself applies (:meth:`Objective.applied_weight`: TIS's ``min(r, C)``,
MIS's masked ``r``, IMPALA's ``min(r, rho_bar)``, CISPO's clipped ``r``; verl's
``rollout_is_eff_sample_size`` is this one), the raw ratio's where the objective applies no weight of
its own; and objective-specific extras such as ``kl``,
``cap_fraction`` (a weight capped, its gradient kept) or ``mask_fraction`` (a sample's gradient
removed by an importance-weight mask). :func:`metric_name` says under which name each is logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from vaco import _checks
from vaco.objectives.objective_math import effective_sample_size, masked_mean, masked_quantile, normalize

__all__ = ["LAG_OUTPUTS", "Objective", "metric_name"]

#: the outputs that describe the lag itself, whatever the objective (logged as ``lag/*``, not ``train/*``)
LAG_OUTPUTS = ("ess", "ess_applied", "ratio_p99", "ratio_max")


def metric_name(output: str) -> str:
    """The MLflow metric an objective's output is logged as: ``lag/ess``, ``train/clip_fraction``."""
    return f"lag/{output}" if output in LAG_OUTPUTS else f"train/{output}"


class Objective(nn.Module):
    """Base class of the policy objectives.

    Args:
        entropy_coef: entropy bonus coefficient ``c_H`` (CleanRL's default 0.0).
        value_coef: critic loss coefficient (CleanRL: 0.5).
        clip_value_loss: clip the critic's change around ``state_value`` as CleanRL does.
        value_clip_epsilon: the value clipping range (CleanRL reuses the policy clip, 0.2).
        normalize_advantage: normalise advantages per minibatch (CleanRL's default). For the TV
            filter this also decides which samples are filtered, since it shifts signs.
    """

    #: the surrogate carries the entropy term itself (VACO's importance-weighted entropy)
    entropy_in_surrogate: ClassVar[bool] = False
    #: the trainer re-runs the advantage module before every optimisation step (IMPALA)
    reestimate_advantage: ClassVar[bool] = False
    #: the arguments a sweep may vary and a report compares, each with its short label in run
    #: ids (``{"delta": "delta"}`` makes ``vaco-hopper-K16-delta0.4-s1``); a sweep file's
    #: ``grid`` takes them as axes by name, and ``vaco report`` draws an ablation for each
    sweep_axes: ClassVar[dict[str, str]] = {}
    #: the per-batch fraction that says how much this surrogate intervened, as the report
    #: shows it: ``clip_fraction`` (a clip) or ``filter_fraction`` (the TV filter)
    fraction_metric: ClassVar[str] = "clip_fraction"
    #: the algorithm's name with each advantage family it is used with (the advantage module's
    #: ``family``: ``"gae"``, ``"vtrace"``, the LLM track's ``"group"``), e.g. TV filter + V-trace is
    #: ``"vaco"``. It is the run's ``algorithm`` param, its label in sweeps and its name in the report.
    #: Not inherited: a subclass is another algorithm until it names itself; an unnamed pair is
    #: ``"<Objective>+<Advantage>"``.
    names: ClassVar[dict[str, str]] = {}
    #: names in :attr:`names` that are ablations of another algorithm (name -> that algorithm's
    #: name): the run logs it as ``variant_of`` and the report keeps it out of a task's min and max
    variants: ClassVar[dict[str, str]] = {}
    #: the surrogate's test uses the whole minibatch's TV (the TV filter): a learner that splits a
    #: minibatch into micro-batches must compute that TV over the minibatch and pass it as ``minibatch_tv``
    needs_minibatch_tv: ClassVar[bool] = False
    #: where the proximal policy comes from, for an objective whose surrogate reads
    #: ``proximal_log_prob`` (decoupled PPO): ``"recompute"`` or ``"ewma"``; None: it needs none
    proximal: str | None = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for attribute in ("names", "variants"):  # a subclass names itself or goes by its class name
            if attribute not in vars(cls):
                setattr(cls, attribute, {})

    @classmethod
    def algorithm_name(cls, family: str, advantage_name: str | None = None) -> str:
        """The run's algorithm name with an advantage of ``family`` (class ``advantage_name``, left
        out of the fallback where the learner has one advantage only)."""
        fallback = f"{cls.__name__}+{advantage_name}" if advantage_name else cls.__name__
        return cls.names.get(family) or fallback

    def __init__(
        self,
        *,
        entropy_coef: float = 0.0,
        value_coef: float = 0.5,
        clip_value_loss: bool = True,
        value_clip_epsilon: float = 0.2,
        normalize_advantage: bool = True,
    ) -> None:
        super().__init__()
        if not (entropy_coef >= 0):
            raise ValueError(f"`entropy_coef` must be >= 0, got {entropy_coef!r}")
        if not (value_coef >= 0):
            raise ValueError(f"`value_coef` must be >= 0, got {value_coef!r}")
        _checks.positive(value_clip_epsilon=value_clip_epsilon)
        self.entropy_coef = float(entropy_coef)
        self.value_coef = float(value_coef)
        self.clip_value_loss = clip_value_loss
        self.value_clip_epsilon = float(value_clip_epsilon)
        self.normalize_advantage = normalize_advantage

    # ------------------------------------------------------------------ to override
    def surrogate(
        self,
        *,
        ratio: torch.Tensor,
        log_ratio: torch.Tensor,
        advantage: torch.Tensor,
        batch: TensorDictBase,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per-sample policy loss to *minimise*, and per-sample indicators.

        Args:
            ratio: ``pi_theta / beta`` (with gradient); ``log_ratio`` is its log.
            advantage: the advantage, already normalised if ``normalize_advantage``.
            batch: the minibatch, for anything else the surrogate needs (``log_prob``,
                distribution parameters, ``mask``).

        Returns:
            ``(loss, indicators)``: ``loss`` has the shape of ``ratio``. ``indicators`` maps
            names to per-sample tensors that are averaged into metrics: ``clipped`` and
            ``filtered`` (bool: the surrogate removed that sample's gradient) become
            ``clip_fraction`` and ``filter_fraction``, ``masked`` (an importance-weight mask
            removed it) ``mask_fraction``, ``capped`` (its weight was capped, its gradient kept)
            ``cap_fraction``; any other name is reported as is.
        """
        raise NotImplementedError

    def unsupported(self, learner: str) -> str | None:
        """Why this objective cannot train with ``learner`` (``"mujoco"``: a Gaussian policy on
        ``[B]`` minibatches; ``"llm"``: token-level ``[B, L]`` minibatches with no critic and no
        proximal policy), as the line a user is refused with before any work starts; None: it can."""
        if learner == "llm" and self.proximal is not None:
            return (
                f"{type(self).__name__} reads a proximal policy ({self.proximal!r}), which the LLM track does not "
                "provide (a second forward pass or copy of the model's weights); use a behaviour-ratio objective"
            )
        return None

    def update_coefficients(self, metrics: Mapping[str, float]) -> None:
        """Hook called by the trainer once per iteration with that iteration's mean metrics.

        Adaptive coefficients change here, never inside :meth:`forward`. Default: nothing.
        """

    # ------------------------------------------------------------------ shared
    def forward(self, batch: TensorDictBase | Mapping[str, torch.Tensor], check_finite: bool = True) -> TensorDictBase:
        """Losses and diagnostics of one minibatch (a TensorDict or a plain dict of tensors).

        ``check_finite``: raise, naming the input, if the loss is NaN or inf. That costs a host
        sync; the trainer turns it off and checks once per iteration on the device instead.
        """
        log_prob = batch.get("log_prob")
        behavior_log_prob = batch.get("behavior_log_prob")
        advantage = batch.get("advantage")
        mask = batch.get("mask", None)
        entropy = batch.get("entropy", None)
        value = batch.get("value", None)
        _checks.same_shape(
            log_prob=log_prob,
            behavior_log_prob=behavior_log_prob,
            advantage=advantage,
            mask=mask,
            entropy=entropy,
            value=value,
        )
        log_ratio = log_prob - behavior_log_prob
        ratio = log_ratio.exp()
        if self.normalize_advantage:
            advantage = normalize(advantage, mask)

        try:
            policy_loss, indicators = self.surrogate(ratio=ratio, log_ratio=log_ratio, advantage=advantage, batch=batch)
        except _checks.NonFiniteInputError:
            self._check_inputs(batch, value)  # name the minibatch input behind it
            raise
        out: dict[str, torch.Tensor] = {"loss_policy": masked_mean(policy_loss, mask)}

        if entropy is not None and self.entropy_coef > 0 and not self.entropy_in_surrogate:
            out["loss_entropy"] = -self.entropy_coef * masked_mean(entropy, mask)
        if value is not None:
            out["loss_value"] = self.value_coef * self._value_loss(value, batch, mask)
        # NaN/inf inputs make the loss non-finite: check that one number on every minibatch and
        # name the culprit only then (checking every input first costs a sync per tensor)
        if check_finite and not bool(torch.isfinite(sum(out.values()))):
            self._check_inputs(batch, value)

        with torch.no_grad():
            out.update(self._diagnostics(ratio, log_ratio, mask, entropy, indicators))
            applied = self.applied_weight(log_ratio.detach(), batch)
            out["ess_applied"] = out["ess"] if applied is None else effective_sample_size(applied, mask)
        return TensorDict(out, batch_size=[])

    def applied_weight(self, log_ratio: torch.Tensor, batch) -> torch.Tensor | None:
        """The per-sample importance weight the objective multiplies its gradient by, from the detached
        log ratio (and, for a sequence-level weight, the batch's mask); None where it applies none of
        its own (the ratio's own diagnostics then stand for it)."""
        return None

    @staticmethod
    def _check_inputs(batch, value) -> None:
        _checks.all_finite(
            log_prob=batch.get("log_prob").detach(),
            behavior_log_prob=batch.get("behavior_log_prob"),
            advantage=batch.get("advantage"),
            value=None if value is None else value.detach(),
            value_target=batch.get("value_target", None),
            state_value=batch.get("state_value", None),
        )

    def _value_loss(self, value, batch, mask) -> torch.Tensor:
        target = batch.get("value_target")
        _checks.same_shape(value=value, value_target=target)
        loss = (value - target) ** 2
        if self.clip_value_loss:
            old = batch.get("state_value")
            _checks.same_shape(value=value, state_value=old)
            clipped = old + (value - old).clamp(-self.value_clip_epsilon, self.value_clip_epsilon)
            loss = torch.maximum(loss, (clipped - target) ** 2)
        return 0.5 * masked_mean(loss, mask)

    def _diagnostics(self, ratio, log_ratio, mask, entropy, indicators) -> dict[str, torch.Tensor]:
        # one stacked reduction instead of a dozen tiny ones: this runs on every minibatch
        ratio, log_ratio = ratio.detach(), log_ratio.detach()
        renames = {
            "clipped": "clip_fraction",
            "filtered": "filter_fraction",
            "capped": "cap_fraction",
            "masked": "mask_fraction",
        }
        rows = {
            "tv": 0.5 * (ratio - 1).abs(),
            "approx_kl": (ratio - 1) - log_ratio,  # Schulman's k3 estimator
            "ratio_mean": ratio,
        }
        if entropy is not None:
            rows["entropy"] = entropy.detach()
        for name, per_sample in indicators.items():
            rows[renames.get(name, name)] = per_sample.detach().to(ratio.dtype)
        stacked = torch.stack(list(rows.values())).flatten(1)
        if mask is None:
            means = stacked.mean(1)
            ratio_max = ratio.max()
        else:
            weight = mask.flatten().to(ratio.dtype)
            means = (stacked * weight).sum(1) / weight.sum().clamp(min=1.0)
            ratio_max = ratio.masked_fill(~mask.bool(), float("-inf")).max()
        metrics = dict(zip(rows, means.unbind()))
        zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        metrics.setdefault("entropy", zero)
        metrics.setdefault("clip_fraction", zero)
        metrics.setdefault("filter_fraction", zero)
        metrics["ratio_max"] = ratio_max
        metrics["ratio_p99"] = masked_quantile(ratio, 0.99, mask)
        metrics["ess"] = effective_sample_size(ratio, mask)
        return metrics
