"""The update of one run: epochs x minibatches of the objective on one iteration's batch.

:class:`MinibatchUpdate` is an object whose every input is an argument; :meth:`vaco.vaco_module.VacoModule.update`
builds one per iteration. A population's update (:class:`vaco.population.PopulationUpdate`) is each
member's :meth:`MinibatchUpdate.run` alone, bit for bit, on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase

from vaco._checks import NonFiniteInputError
from vaco.advantages import AdvantageModule
from vaco.learner import NonFiniteLossError
from vaco.networks import gaussian_entropy, gaussian_log_prob
from vaco.objectives import Objective

__all__ = ["MinibatchUpdate", "TRAIN_KEYS", "skip_step_on_device"]

#: the per-sample quantities an update trains on (``[N, ...]`` per run; ``[S, N, ...]`` in a population)
TRAIN_KEYS = (
    "observation",
    "action",
    "behavior_log_prob",
    "behavior_loc",
    "behavior_scale",
    "advantage",
    "value_target",
    "state_value",
)


class MinibatchUpdate:
    """Epochs x minibatches of the objective on one iteration's batch: the update of one run.

    Per minibatch: the learner's log-prob, entropy and value on the stored samples (with gradient),
    the objective's losses, ``backward``, gradient-norm clipping and a fused Adam step. A
    non-finite loss costs no host sync per step: its step is skipped on the device
    (:func:`skip_step_on_device`) and the iteration's one sync finds it, reruns that minibatch with
    the checks on and names the input that went bad (:meth:`_diagnose`). IMPALA re-estimates
    V-trace before every step (``Objective.reestimate_advantage``). :meth:`VacoModule.update`
    builds one per iteration; everything it reads is an argument here.

    Args:
        objective: the policy objective; it adapts its coefficients to the iteration's means at the end.
        advantage: the advantage module (IMPALA's re-estimation before every step).
        actor, critic: the learner's networks, trained in place.
        normalize: raw observations -> the networks' inputs (the iteration's frozen statistics).
        learner_pass: ``(batch, flat)``: writes the critic's values and pi_T's ``log_prob`` into the
            batch (IMPALA's re-estimation).
        generator: the CPU generator the minibatch permutations are drawn from (the same run on
            any device).
        optimizer: the learner's optimiser as Lightning hands it (``step`` also counts the trainer's
            steps; the torch optimiser is ``optimizer.optimizer``).
        backward: ``loss -> None`` (Lightning's ``manual_backward``: DDP's gradients stay in sync).
        clip: the gradient-norm clipping, called after each backward; None for none.
        update_epochs, num_minibatches: passes over the batch and minibatches per pass.
        device: the learner's device (the permutations are moved there).
        iteration, checkpoint: the iteration's number (from 1) and the last checkpoint's path (or
            ""), for the error a non-finite loss stops the run with.
    """

    def __init__(
        self,
        objective: Objective,
        advantage: AdvantageModule,
        actor: torch.nn.Module,
        critic: torch.nn.Module,
        *,
        normalize: Callable[[torch.Tensor], torch.Tensor],
        learner_pass: Callable[[TensorDictBase, TensorDictBase], None],
        generator: torch.Generator,
        optimizer,
        backward: Callable[[torch.Tensor], None],
        clip: Callable[[], None] | None,
        update_epochs: int,
        num_minibatches: int,
        device: torch.device,
        iteration: int,
        checkpoint: str = "",
    ) -> None:
        self.objective, self.advantage, self.actor, self.critic = objective, advantage, actor, critic
        self.normalize, self.learner_pass, self.generator = normalize, learner_pass, generator
        self.optimizer, self.backward, self.clip = optimizer, backward, clip
        self.update_epochs, self.num_minibatches, self.device = update_epochs, num_minibatches, device
        self.iteration, self.checkpoint = iteration, checkpoint

    def run(self, batch: TensorDictBase, flat: TensorDictBase) -> dict[str, float]:
        """Epochs x minibatches on one batch; returns the objective's outputs averaged over the
        optimiser steps. A non-finite loss stops the run (see :meth:`_diagnose`)."""
        train = {key: flat[key] for key in TRAIN_KEYS}
        sums: dict[str, torch.Tensor] = {}
        steps = 0
        optimizer = self.optimizer
        size = flat.numel() // self.num_minibatches
        # no host sync per minibatch: a non-finite loss is found on the device, its step is skipped
        # by the fused Adam kernel (`found_inf`, as under AMP), and the run stops after the epochs
        first_bad = torch.full((), -1, dtype=torch.long, device=self.device)
        # a fused optimizer skips a step on the device (`found_inf`); any other (a subclass's own
        # `configure_optimizers`) is checked on the host before each step instead
        skips_on_device = bool(optimizer.optimizer.defaults.get("fused"))
        orders = []
        for _epoch in range(self.update_epochs):
            # drawn on the CPU generator, whatever the device: the same run on any device
            order = torch.randperm(flat.numel(), generator=self.generator).to(self.device, non_blocking=True)
            orders.append(order)
            for k in range(self.num_minibatches):
                if self.objective.reestimate_advantage:
                    self._reestimate(batch, flat, train)
                idx = order[k * size : (k + 1) * size]
                # a plain dict: building a TensorDict per minibatch costs more than the gather
                minibatch = {key: value[idx] for key, value in train.items()}
                out = self.objective(self._minibatch(minibatch), check_finite=False)
                loss = sum(v for key, v in out.items() if key.startswith("loss_"))
                finite = torch.isfinite(loss)
                first_bad = torch.where((first_bad < 0) & ~finite, steps, first_bad)
                optimizer.zero_grad(set_to_none=True)
                self.backward(loss)
                if self.clip is not None:
                    self.clip()
                if skips_on_device:
                    skip_step_on_device(optimizer.optimizer, ~finite)
                elif not bool(finite):
                    raise self._diagnose(steps, orders, size, train)
                optimizer.step()
                for key, value in out.items():
                    sums[key] = sums.get(key, 0.0) + value.detach()
                steps += 1
        if skips_on_device:
            skip_step_on_device(optimizer.optimizer, None)
        if int(first_bad) >= 0:  # the iteration's one sync for the check
            raise self._diagnose(int(first_bad), orders, size, train)
        totals = torch.stack([value.float() for value in sums.values()]).cpu().tolist()  # one transfer
        means = {key: total / steps for key, total in zip(sums, totals)}
        self.objective.update_coefficients(means)
        return means

    @torch.no_grad()
    def _diagnose(self, step: int, orders, size: int, train) -> NonFiniteLossError:
        """Name what made step ``step``'s loss non-finite: rerun that minibatch with the checks on."""
        epoch, k = divmod(step, self.num_minibatches)
        idx = orders[epoch][k * size : (k + 1) * size]
        minibatch = {key: value[idx] for key, value in train.items()}
        try:
            out = self.objective(self._minibatch(minibatch), check_finite=True)
            detail = f"loss {float(sum(v for key, v in out.items() if key.startswith('loss_')))}, {_describe(out)}"
        except NonFiniteInputError as err:
            detail = str(err)
        where = f" ({self.checkpoint})" if self.checkpoint else ""
        return NonFiniteLossError(
            f"non-finite loss at iteration {self.iteration}, epoch {epoch}, minibatch {k}: "
            f"{detail}. That step was skipped and the run stops; the last good checkpoint is kept{where}."
        )

    def _reestimate(self, batch, flat, train) -> None:
        """IMPALA: V-trace for the current policy and critic, over the whole batch, every step."""
        self.learner_pass(batch, flat)
        self.advantage(batch)
        train["advantage"] = batch["advantage"].reshape(-1)
        train["value_target"] = batch["value_target"].reshape(-1)
        train["state_value"] = flat["state_value"]

    def _minibatch(self, mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Add the learner's current quantities (with gradient) to a minibatch."""
        obs = self.normalize(mb["observation"])
        loc, scale = self.actor(obs)
        mb["loc"], mb["scale"] = loc, scale
        mb["log_prob"] = gaussian_log_prob(mb["action"], loc, scale)
        mb["entropy"] = gaussian_entropy(scale)
        mb["value"] = self.critic(obs)
        return mb


def skip_step_on_device(optimizer: torch.optim.Optimizer, skip: torch.Tensor | None) -> None:
    """Make the next ``optimizer.step()`` of a fused torch optimizer a no-op on the device when
    ``skip`` (a bool tensor) is true, without a host sync; ``None`` clears it. This is the protocol
    torch's AMP ``GradScaler`` uses with ``fused=True`` Adam/AdamW/SGD (they read the optimizer's
    ``found_inf`` in ``step``); vaco uses it to skip a non-finite minibatch's step."""
    optimizer.found_inf = None if skip is None else skip.float()


def _describe(out: TensorDictBase) -> str:
    return ", ".join(f"{k}={float(v):.4g}" for k, v in out.items())
