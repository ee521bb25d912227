"""The update of one iteration: epochs x minibatches of the objective, as :class:`MinibatchUpdate`,
the unit :class:`~vaco.vaco_module.VacoModule` inherits its optimisation from.

Per minibatch: the learner's log-prob, entropy and value on the stored samples (with gradient), the
objective's losses, ``manual_backward`` (DDP stays in sync), gradient-norm clipping and a fused
Adam step. A non-finite loss costs no host sync per step: its step is skipped on the device
(:func:`skip_step_on_device`) and the iteration's one sync finds it, reruns that minibatch with the
checks on and names the input that went bad (:meth:`MinibatchUpdate._diagnose`). IMPALA's
re-estimation of V-trace before every step lives here too (``Objective.reestimate_advantage``).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from vaco._checks import NonFiniteInputError
from vaco.learner import NonFiniteLossError
from vaco.networks import gaussian_entropy, gaussian_log_prob

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
    """Mixin of :class:`~vaco.vaco_module.VacoModule` (a LightningModule): :meth:`update` and what it
    needs. The host provides ``hparams`` (``update_epochs``, ``num_minibatches``, ``max_grad_norm``),
    ``objective``, ``advantage``, ``actor``, ``critic``, ``version``, ``_generator``, ``_normalize``,
    ``_learner_pass`` and Lightning's ``optimizers``, ``lr_schedulers``, ``manual_backward``,
    ``clip_gradients``, ``device`` and ``trainer``."""

    def update(self, batch: TensorDictBase, flat: TensorDictBase) -> dict[str, float]:
        """Epochs x minibatches of the objective on one batch; returns the objective's outputs
        averaged over the optimiser steps. Adam steps with gradient-norm clipping; the learning
        rate is annealed once per iteration; a non-finite loss stops the run (see :meth:`_diagnose`)."""
        train = {key: flat[key] for key in TRAIN_KEYS}
        sums: dict[str, torch.Tensor] = {}
        steps = 0
        optimizer = self.optimizers()
        size = flat.numel() // self.hparams.num_minibatches
        # no host sync per minibatch: a non-finite loss is found on the device, its step is skipped
        # by the fused Adam kernel (`found_inf`, as under AMP), and the run stops after the epochs
        first_bad = torch.full((), -1, dtype=torch.long, device=self.device)
        # a fused optimizer skips a step on the device (`found_inf`); any other (a subclass's own
        # `configure_optimizers`) is checked on the host before each step instead
        skips_on_device = bool(optimizer.optimizer.defaults.get("fused"))
        orders = []
        for _epoch in range(self.hparams.update_epochs):
            # drawn on the CPU generator, whatever the device: the same run on any device
            order = torch.randperm(flat.numel(), generator=self._generator).to(self.device, non_blocking=True)
            orders.append(order)
            for k in range(self.hparams.num_minibatches):
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
                self.manual_backward(loss)
                if self.hparams.max_grad_norm is not None:
                    self.clip_gradients(
                        optimizer, gradient_clip_val=self.hparams.max_grad_norm, gradient_clip_algorithm="norm"
                    )
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
        scheduler = self.lr_schedulers()
        if scheduler is not None:  # a subclass's own optimiser may come without one
            scheduler.step()
        totals = torch.stack([value.float() for value in sums.values()]).cpu().tolist()  # one transfer
        means = {key: total / steps for key, total in zip(sums, totals)}
        self.objective.update_coefficients(means)
        return means

    @torch.no_grad()
    def _diagnose(self, step: int, orders, size: int, train) -> NonFiniteLossError:
        """Name what made step ``step``'s loss non-finite: rerun that minibatch with the checks on."""
        epoch, k = divmod(step, self.hparams.num_minibatches)
        idx = orders[epoch][k * size : (k + 1) * size]
        minibatch = {key: value[idx] for key, value in train.items()}
        try:
            out = self.objective(self._minibatch(minibatch), check_finite=True)
            detail = f"loss {float(sum(v for key, v in out.items() if key.startswith('loss_')))}, {_describe(out)}"
        except NonFiniteInputError as err:
            detail = str(err)
        return self._non_finite(epoch, k, detail)

    def _non_finite(self, epoch: int, minibatch: int, detail: str) -> NonFiniteLossError:
        return NonFiniteLossError(
            f"non-finite loss at iteration {int(self.version) + 1}, epoch {epoch}, minibatch {minibatch}: "
            f"{detail}. That step was skipped and the run stops; the last good checkpoint is kept"
            f"{_checkpoint_hint(self.trainer)}."
        )

    def _reestimate(self, batch, flat, train) -> None:
        """IMPALA: V-trace for the current policy and critic, over the whole batch, every step."""
        self._learner_pass(batch, flat)
        self.advantage(batch)
        train["advantage"] = batch["advantage"].reshape(-1)
        train["value_target"] = batch["value_target"].reshape(-1)
        train["state_value"] = flat["state_value"]

    def _minibatch(self, mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Add the learner's current quantities (with gradient) to a minibatch."""
        obs = self._normalize(mb["observation"])
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


def _checkpoint_hint(trainer) -> str:
    callback = getattr(trainer, "checkpoint_callback", None)
    path = getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "")
    return f" ({path})" if path else ""
