"""The update: epochs x minibatches of the objective on one iteration's batch, for a run or a population.

:func:`minibatch_epochs` is the one loop. What differs between a run and a population (S runs of
one config that differ by seed) is where the member dimension lives, and that is the *layout* the
loop is given (:class:`UpdateLayout`): :class:`MinibatchUpdate` is a run's (its networks and
Lightning's optimiser, no member dimension), :class:`vaco.population.layout.PopulationUpdate` a
population's (every tensor ``[S, ...]``, the objective vmapped). The loop draws the permutations,
gathers the minibatches, re-estimates IMPALA's advantage, keeps the non-finite record and the
outputs' sums; the layout computes the learner's quantities, the losses and the optimiser step.
Member ``m`` of a population is bit for bit its solo run on the CPU (``tests/test_population.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

from vaco._checks import NonFiniteInputError
from vaco.advantages import AdvantageModule
from vaco.learners.learner import NonFiniteLossError
from vaco.learners.networks import gaussian_entropy, gaussian_log_prob
from vaco.learners.step_size import StepSize, scaled_step
from vaco.objectives import Objective

__all__ = [
    "MinibatchUpdate",
    "TRAIN_KEYS",
    "UpdateLayout",
    "minibatch_epochs",
    "policy_quantities",
    "skip_step_on_device",
    "summed_losses",
    "train_keys",
]

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


#: the objective's outputs an iteration reports as their largest over its steps (the rest: their mean)
MAXIMA = ("ratio_max",)


def train_keys(objective: Objective) -> tuple[str, ...]:
    """The keys an update of ``objective`` trains on: :data:`TRAIN_KEYS`, and the iteration-start
    ``proximal_log_prob`` where the objective's proximal policy is recomputed (decoupled PPO)."""
    return TRAIN_KEYS + (("proximal_log_prob",) if objective.proximal == "recompute" else ())


class UpdateLayout:
    """What :func:`minibatch_epochs` asks of a run or a population: where the member dimension lives.

    A run's tensors are ``[N, ...]`` and its loss a scalar; a population's are ``[S, N, ...]`` and
    its loss ``[S]`` (one per member). Everything else in the loop is the same for both.
    """

    def draw_order(self, n: int, device: torch.device) -> torch.Tensor:
        """An epoch's permutation of the ``n`` samples (``[n]``; ``[S, n]``, each member's from its own generator)."""
        raise NotImplementedError

    def gather(self, train: Mapping[str, torch.Tensor], idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The minibatch of samples ``idx`` (a slice of :meth:`draw_order`'s result), a plain dict."""
        raise NotImplementedError

    def shuffle(self, train: Mapping[str, torch.Tensor], order: torch.Tensor, num_minibatches: int, size: int):
        """An epoch's minibatches at once: ``{key: [num_minibatches, ...]}`` whose ``[k]`` holds the
        values :meth:`gather` gives for the ``k``-th slice of ``order``, each one contiguous block
        (one gather a key an epoch, not one a minibatch)."""
        raise NotImplementedError

    def learner(self, minibatch: dict[str, torch.Tensor]) -> None:
        """Add the learner's quantities, with gradient (:func:`policy_quantities` and ``value``)."""
        raise NotImplementedError

    def losses(self, minibatch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Mapping[str, torch.Tensor]]:
        """The summed ``loss_*`` (``[]``; ``[S]``) and the objective's outputs."""
        raise NotImplementedError

    def step(self, loss: torch.Tensor, finite: torch.Tensor, factor: torch.Tensor | None = None) -> bool:
        """``zero_grad``, backward, clipping and the optimiser step, skipped where ``finite`` is
        false, and scaled by ``factor`` (``[]``; ``[S]``) where a step-size rule gives one
        (:func:`vaco.learners.step_size.scale_step`). False: stop the epochs here (a run whose
        optimiser cannot skip on the device)."""
        raise NotImplementedError

    def finish(self) -> None:
        """After the last step (a run clears the fused kernel's skip flag)."""


@dataclass
class Epochs:
    """What :func:`minibatch_epochs` hands back."""

    #: the objective's outputs summed over the optimiser steps (``[]`` or ``[S]`` each; :data:`MAXIMA`: their largest)
    sums: dict[str, torch.Tensor]
    #: the optimiser steps taken (``update_epochs * num_minibatches`` unless a run stopped early)
    steps: int
    #: the first step whose loss was not finite, -1 for none (``[]``; ``[S]``, on the device)
    first_bad: torch.Tensor
    #: each epoch's permutation, and the minibatch size (to find a step's minibatch again)
    orders: list[torch.Tensor]
    size: int

    def means(self) -> dict[str, float] | list[dict[str, float]]:
        """The outputs averaged over the steps (:data:`MAXIMA`: their largest): one dict, or one per
        member (one transfer, then Python floats divided)."""
        totals = torch.stack([value.float() for value in self.sums.values()]).cpu()

        def mean(key, total):
            return total if key in MAXIMA else total / self.steps

        if totals.dim() == 1:
            return {key: mean(key, total) for key, total in zip(self.sums, totals.tolist())}
        return [{key: mean(key, total) for key, total in zip(self.sums, member)} for member in totals.T.tolist()]


def minibatch_epochs(
    layout: UpdateLayout,
    train: dict[str, torch.Tensor],
    *,
    update_epochs: int,
    num_minibatches: int,
    reestimate: Callable[[], Mapping[str, torch.Tensor]] | None = None,
    active: torch.Tensor | None = None,
    step_size: StepSize | None = None,
    lag: torch.Tensor | None = None,
) -> Epochs:
    """Epochs x minibatches of ``layout`` on ``train`` (the keys of :data:`TRAIN_KEYS`, ``[N]`` or ``[S, N]``).

    No host sync per minibatch: a non-finite loss is recorded on the device (``first_bad``) and its
    step skipped by the layout. ``reestimate`` (IMPALA): called before every step, it returns the
    new ``advantage``, ``value_target`` and ``state_value`` from the current weights. ``active``
    (``[S]`` bools): members whose every step is skipped, as a non-finite one is. ``step_size``
    (:mod:`vaco.learners.step_size`): each step scaled by its factor, from the minibatch's
    importance weights ``pi_theta / beta`` and the data's ``lag`` (``[]``; ``[S]``).
    """
    n = train["advantage"].shape[-1]
    size = n // num_minibatches
    device = train["observation"].device
    sums: dict[str, torch.Tensor] = {}
    first_bad: torch.Tensor | None = None
    orders: list[torch.Tensor] = []
    steps = 0
    for _epoch in range(update_epochs):
        # drawn on the CPU generator(s), whatever the device: the same run on any device
        order = layout.draw_order(n, device)
        orders.append(order)
        # the epoch's minibatches in one gather a key (the same values as one gather a minibatch);
        # IMPALA's advantage changes before every step, so it gathers each minibatch after that
        shuffled = None if reestimate is not None else layout.shuffle(train, order, num_minibatches, size)
        for k in range(num_minibatches):
            if shuffled is None:
                train.update(reestimate())
                minibatch = layout.gather(train, order[..., k * size : (k + 1) * size])
            else:
                minibatch = {key: value[k] for key, value in shuffled.items()}
            layout.learner(minibatch)
            loss, out = layout.losses(minibatch)
            finite = torch.isfinite(loss)
            if active is not None:
                finite = finite & active
            if first_bad is None:
                first_bad = torch.full(finite.shape, -1, dtype=torch.long, device=finite.device)
            first_bad = torch.where((first_bad < 0) & ~finite, steps, first_bad)
            factor = None
            if step_size is not None:
                weights = None
                if step_size.reads_weights:  # log r over the last dim ([B]; [S, B])
                    weights = minibatch["log_prob"].detach() - minibatch["behavior_log_prob"]
                factor = step_size.factor(weights, lag)
            if not layout.step(loss, finite, factor):
                return Epochs(sums, steps, first_bad, orders, size)
            for key, value in out.items():
                if key in MAXIMA:  # the iteration's largest, not the mean of the steps' largest
                    sums[key] = torch.maximum(sums[key], value.detach()) if key in sums else value.detach()
                else:
                    sums[key] = sums.get(key, 0.0) + value.detach()
            steps += 1
    layout.finish()
    return Epochs(sums, steps, first_bad, orders, size)


def policy_quantities(action: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """The learner policy's ``loc``, ``scale``, ``log_prob`` of the stored action and ``entropy``."""
    return {
        "loc": loc,
        "scale": scale,
        "log_prob": gaussian_log_prob(action, loc, scale),
        "entropy": gaussian_entropy(scale),
    }


def summed_losses(out: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The sum of an objective's ``loss_*`` outputs: what is differentiated."""
    return sum(v for key, v in out.items() if key.startswith("loss_"))


class MinibatchUpdate(UpdateLayout):
    """The update of one run: :func:`minibatch_epochs` with the run's networks and optimiser.

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
        proximal: the EWMA of the actor's weights (:class:`vaco.learners.proximal.EWMAPolicy`) for an
            objective whose proximal policy it is: evaluated on each minibatch, stepped after each
            optimiser step; None otherwise.
        step_size, lag: the learner's step-size rule (:mod:`vaco.learners.step_size`) and the batch's
            largest policy age; None for none.
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
        proximal: torch.nn.Module | None = None,
        step_size: StepSize | None = None,
        lag: torch.Tensor | None = None,
    ) -> None:
        self.objective, self.advantage, self.actor, self.critic = objective, advantage, actor, critic
        self.proximal = proximal
        self.normalize, self.learner_pass, self.generator = normalize, learner_pass, generator
        self.optimizer, self.backward, self.clip = optimizer, backward, clip
        self.update_epochs, self.num_minibatches, self.device = update_epochs, num_minibatches, device
        self.iteration, self.checkpoint = iteration, checkpoint
        self.step_size, self.lag = step_size, lag
        # a fused optimizer skips a step on the device (`found_inf`, as under AMP); any other (a
        # subclass's own `configure_optimizers`) is checked on the host before each step instead
        self.skips_on_device = bool(optimizer.optimizer.defaults.get("fused"))

    def run(self, batch: TensorDictBase, flat: TensorDictBase) -> dict[str, float]:
        """Epochs x minibatches on one batch; returns the objective's outputs averaged over the
        optimiser steps. A non-finite loss stops the run (see :meth:`_diagnose`)."""
        train = {key: flat[key] for key in train_keys(self.objective)}
        reestimate = None
        if self.objective.reestimate_advantage:
            reestimate = lambda: self._reestimate(batch, flat)  # noqa: E731
        done = minibatch_epochs(
            self,
            train,
            update_epochs=self.update_epochs,
            num_minibatches=self.num_minibatches,
            reestimate=reestimate,
            step_size=self.step_size,
            lag=self.lag,
        )
        if int(done.first_bad) >= 0:  # the iteration's one sync for the check
            raise self._diagnose(int(done.first_bad), done, train)
        means = done.means()
        self.objective.update_coefficients(means)
        return means

    # ------------------------------------------------------------------ the layout of a run
    def draw_order(self, n: int, device: torch.device) -> torch.Tensor:
        return torch.randperm(n, generator=self.generator).to(device, non_blocking=True)

    def gather(self, train, idx):
        # a plain dict: building a TensorDict per minibatch costs more than the gather
        return {key: value[idx] for key, value in train.items()}

    def shuffle(self, train, order, num_minibatches, size):
        idx = order[: num_minibatches * size]
        return {key: value[idx].view(num_minibatches, size, *value.shape[1:]) for key, value in train.items()}

    def learner(self, minibatch: dict[str, torch.Tensor]) -> None:
        obs = self.normalize(minibatch["observation"])
        minibatch.update(policy_quantities(minibatch["action"], *self.actor(obs)))
        minibatch["value"] = self.critic(obs)
        if self.proximal is not None:
            minibatch["proximal_log_prob"] = gaussian_log_prob(minibatch["action"], *self.proximal(obs))

    def losses(self, minibatch):
        out = self.objective(minibatch, check_finite=False)
        return summed_losses(out), out

    def step(self, loss: torch.Tensor, finite: torch.Tensor, factor: torch.Tensor | None = None) -> bool:
        optimizer = self.optimizer
        optimizer.zero_grad(set_to_none=True)
        self.backward(loss)
        if self.clip is not None:
            self.clip()
        if self.skips_on_device:
            skip_step_on_device(optimizer.optimizer, ~finite)
        elif not bool(finite):
            return False  # run() names the input that went bad
        if factor is None:
            optimizer.step()
        else:
            scaled_step(optimizer.step, optimizer.optimizer, factor)
        if self.proximal is not None:
            self.proximal.update(self.actor.parameters())
        return True

    def finish(self) -> None:
        if self.skips_on_device:
            skip_step_on_device(self.optimizer.optimizer, None)

    # ------------------------------------------------------------------ pieces
    @torch.no_grad()
    def _diagnose(self, step: int, done: Epochs, train) -> NonFiniteLossError:
        """Name what made step ``step``'s loss non-finite: rerun that minibatch with the checks on."""
        epoch, k = divmod(step, self.num_minibatches)
        minibatch = self.gather(train, done.orders[epoch][k * done.size : (k + 1) * done.size])
        self.learner(minibatch)
        try:
            out = self.objective(minibatch, check_finite=True)
            detail = f"loss {float(summed_losses(out))}, {_describe(out)}"
        except NonFiniteInputError as err:
            detail = str(err)
        kept = (
            f"the last good checkpoint is kept ({self.checkpoint})"
            if self.checkpoint
            else "no checkpoint was written before it (a run starts again from the beginning)"
        )
        return NonFiniteLossError(
            f"non-finite loss at iteration {self.iteration}, epoch {epoch}, minibatch {k}: "
            f"{detail}. That step was skipped and the run stops; {kept}."
        )

    def _reestimate(self, batch, flat) -> dict[str, torch.Tensor]:
        """IMPALA: V-trace for the current policy and critic, over the whole batch, every step."""
        self.learner_pass(batch, flat)
        self.advantage(batch)
        return {
            "advantage": batch["advantage"].reshape(-1),
            "value_target": batch["value_target"].reshape(-1),
            "state_value": flat["state_value"],
        }


def skip_step_on_device(optimizer: torch.optim.Optimizer, skip: torch.Tensor | None) -> None:
    """Make the next ``optimizer.step()`` of a fused torch optimizer a no-op on the device when
    ``skip`` (a bool tensor) is true, without a host sync; ``None`` clears it. This is the protocol
    torch's AMP ``GradScaler`` uses with ``fused=True`` Adam/AdamW/SGD (they read the optimizer's
    ``found_inf`` in ``step``); vaco uses it to skip a non-finite minibatch's step."""
    optimizer.found_inf = None if skip is None else skip.float()


def _describe(out: TensorDictBase) -> str:
    return ", ".join(f"{k}={float(v):.4g}" for k, v in out.items())
