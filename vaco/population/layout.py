"""The update of a population: S runs of one config that differ only by seed, as one computation.

A population's members have their own weights, optimiser state and data; batching them puts a
leading member dimension ``S`` on every tensor, so that one kernel call does the work of S. The
point of this module is that it changes no member's numbers: member ``m``'s update here is **bit
for bit** :meth:`vaco.learners.update.MinibatchUpdate.run` of that run alone (tested in
``tests/test_population.py`` on VACO, PPO-clip, adaptive PPO-KL and SPO for S = 1, 2 and 4, and by
``benchmarks/population_update.py`` on the study cell's Hopper data for S = 1 to 8). Measured on
torch 2.13's CPU build on an AMD EPYC (AVX2) and on an Intel Xeon (AVX-512), that holds because
each piece keeps the solo path's arithmetic per member:

* **networks**: one ``baddbmm`` per ``Linear`` layer over the members' stacked weights, with the
  weight as the same transposed view ``nn.Linear`` multiplies by, and a backward written out
  (:class:`_BatchedLinear`) that computes each member's gradients as ``nn.Linear``'s does
  (autograd's own backward of ``baddbmm`` forms the first layer's weight gradient in another
  order: ~1e-8 apart); a layer with one output (the critic's head) multiplies member by member,
  forward and backward, as ``nn.Linear``'s matrix-vector products round otherwise than a batched
  product (its weight gradient only on AVX-512: the members' solo runs matched on the AVX2 CPU, and
  not on the Xeon, until that too went member by member);
* **objectives, unchanged**: written for one run, they reach the population through
  ``torch.func.vmap``, so every reduction is per member (``vmap`` of the objective alone is exact;
  ``vmap`` of ``functional_call`` on the networks is not);
* **minibatches**: each member draws its permutation from its own generator, in the solo order;
* **gradient clipping** per member, as ``torch.nn.utils.clip_grad_norm_`` computes it (the norms
  of the actor's then the critic's parameters, their norm, ``max_norm / (total + 1e-6)``);
* **Adam** (fused, as the learner's) on the stacked parameters: elementwise, so the same step as S
  optimisers, provided each member's slice meets the kernel's vector lanes as the solo tensor does:
  a parameter of fewer than :data:`ALIGN` numbers a member (``log_std``, the output biases) stays one
  tensor per member (stacked, Hopper's 3-number biases drifted ~1e-11 at 4 members); a member whose
  loss is not finite has its step undone alone (its weights and Adam state restored).

On a GPU none of that is bit for bit to begin with (a solo run there is not reproducible to the
last bit either: cuBLAS and MuJoCo Warp's atomics), so there the update takes the cheaper layout
(``exact=False``): every parameter one stacked tensor, the critic's head one batched product, and
no host sync per minibatch (a non-finite member's step is undone on the device with ``torch.where``,
as the solo run skips a step with the fused kernel's ``found_inf``). A member then equals its solo
run to float rounding (``tests/test_population.py`` checks both layouts on the CPU).

The epochs x minibatches loop is a run's (:func:`vaco.learners.update.minibatch_epochs`); this module is
the population's layout of it (:class:`PopulationUpdate`: where the member dimension lives).
``vaco fit --population`` (:mod:`vaco.population.module`) calls it once per iteration;
``benchmarks/population_update.py`` measures it against S solo updates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from vaco.learners.networks import gaussian_log_prob
from vaco.learners.proximal import ewma_weights
from vaco.learners.step_size import StepSize, scale_step
from vaco.learners.update import UpdateLayout, minibatch_epochs, policy_quantities, summed_losses

__all__ = ["BatchedMLP", "PopulationUpdate", "check_vmappable", "stack_parameters"]

#: members' slices of a stacked parameter must hold a multiple of this many numbers (the CPU
#: kernels' vector width, with room): see :class:`PopulationUpdate`
ALIGN = 64


class _BatchedLinear(torch.autograd.Function):
    """``y[s] = x[s] @ W[s].T + b[s]`` for every member s, with ``nn.Linear``'s backward per member
    (``dx = dy @ W``, ``dW = dy.T @ x``, ``db = dy.sum(0)``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, exact: bool = True) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.one_by_one = exact and weight.shape[1] == 1 and weight.shape[0] > 1
        if ctx.one_by_one:
            # a single output (the critic's head): nn.Linear's matrix-vector product rounds
            # otherwise than a batched product does, so each member takes its own
            return torch.stack([nn.functional.linear(x[s], weight[s], bias[s]) for s in range(weight.shape[0])])
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        if not ctx.needs_input_grad[1]:
            grad_weight = None
        elif ctx.one_by_one:  # its weight gradient too: a batched product rounds otherwise on AVX-512
            grad_weight = torch.stack([grad[s].T @ x[s] for s in range(x.shape[0])])
        else:
            grad_weight = torch.bmm(grad.transpose(1, 2), x)
        grad_bias = grad.sum(1) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None


class BatchedMLP:
    """The members' copies of one ``nn.Sequential`` of ``Linear`` and ``Tanh`` layers, applied to
    ``[S, B, in]`` with the stacked parameters ``params[f"{prefix}{i}.weight"]`` (``[S, out, in]``)."""

    def __init__(self, template: nn.Sequential, prefix: str, exact: bool = True) -> None:
        for module in template:
            if not isinstance(module, (nn.Linear, nn.Tanh)) or (isinstance(module, nn.Linear) and module.bias is None):
                raise TypeError(
                    f"a population needs MLPs of Linear (with bias) and Tanh layers, got {type(module).__name__}"
                )
        self.layers = [(f"{prefix}{i}." if isinstance(m, nn.Linear) else None) for i, m in enumerate(template)]
        self.exact = exact  # False: a single-output layer is one batched product too (see PopulationUpdate)

    def __call__(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        for name in self.layers:
            x = (
                torch.tanh(x)
                if name is None
                else _BatchedLinear.apply(x, params[name + "weight"], params[name + "bias"], self.exact)
            )
        return x


def stack_parameters(modules: Sequence[nn.Module]) -> dict[str, torch.Tensor]:
    """The members' parameters stacked on a leading dimension, by ``named_parameters`` name."""
    names = [name for name, _ in modules[0].named_parameters()]
    return {name: torch.stack([dict(m.named_parameters())[name].detach() for m in modules]) for name in names}


def _member_losses(objective: nn.Module) -> Callable:
    """One member's summed ``loss_*`` and its outputs, with its own buffers: what a population vmaps."""

    def one(mb, own):
        out = torch.func.functional_call(objective, own, (mb,), {"check_finite": False})
        values = dict(out.items())
        return summed_losses(values), values

    return one


def check_vmappable(objective: nn.Module, field: str = "model.objective") -> None:
    """Refuse, in one line and before any env step, an objective a population cannot run: its
    forward on a small probe minibatch, vmapped over two members as the population's update does.
    ``torch.func.vmap`` forbids what depends on a tensor's *value* in Python (``if x.any():``,
    ``.item()``, ``.tolist()``, boolean-mask indexing whose shape depends on the data, in-place
    writes into an input); ``torch.where`` and masks multiplied in are fine (docs/extending.md)."""
    members, n, obs, act = 2, 8, 5, 3
    gen = torch.Generator().manual_seed(0)

    def draw(*shape, positive=False, grad=False):
        x = torch.randn(members, n, *shape, generator=gen)
        x = x.abs() + 0.1 if positive else x
        return x.requires_grad_() if grad else x

    # the keys a population's minibatch holds: vaco.learners.update.TRAIN_KEYS and the learner pass's outputs
    probe = {
        "observation": draw(obs),
        "action": draw(act),
        "behavior_log_prob": draw(),
        "behavior_loc": draw(act),
        "behavior_scale": draw(act, positive=True),
        "advantage": draw(),
        "value_target": draw(),
        "state_value": draw(),
        "loc": draw(act, grad=True),
        "scale": draw(act, positive=True, grad=True),
        "log_prob": draw(grad=True),
        "proximal_log_prob": draw(),
        "entropy": draw(positive=True, grad=True),
        "value": draw(grad=True),
    }
    buffers = {k: torch.stack([b] * members) for k, b in objective.named_buffers()}
    one = _member_losses(objective)
    try:  # one member alone first: a probe this objective cannot read is no evidence against vmap
        one({k: v[0] for k, v in probe.items()}, {k: b[0] for k, b in buffers.items()})
    except Exception:  # noqa: BLE001 - the real update reports what this objective needs
        return
    try:
        loss, _ = torch.func.vmap(one)(probe, buffers)
        loss.sum().backward()
    except Exception as err:  # noqa: BLE001 - whatever vmap refuses, said in one line
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"`{field}` ({type(objective).__name__}) cannot run in a population: torch.func.vmap refused its forward "
            f"({reason[:200]}); a surrogate may not branch on a tensor's value (use torch.where), call .item() or "
            "index by a data-dependent mask (docs/extending.md, 'In a population'); run it without --population"
        ) from None


class PopulationUpdate(UpdateLayout):
    """Epochs x minibatches of one objective for S members at once: the population's layout of
    :func:`vaco.learners.update.minibatch_epochs`, the loop a run's update runs (see the module docstring).

    Args:
        actors, critics: each member's ``GaussianActor`` and ``Critic`` (their weights are read once
            here and written back by :meth:`write_back`).
        objectives: each member's objective module: one class and settings; its adaptive state
            (PPO-KL's ``kl_coef`` buffer) is the member's own and adapts in
            ``update_coefficients`` with the member's own means, as in a solo run.
        generators: each member's CPU generator (the minibatch permutations).
        update_epochs, num_minibatches, max_grad_norm, lr, adam_eps: the run's hyperparameters.
        exact: each member's arithmetic as its solo run's, bit for bit (the layout described in the
            module docstring); False: every parameter stacked and the critic's head batched (equal
            to float rounding). None (default): exact on a CPU, not on a GPU.
        host_sync: find the members whose loss is not finite on the host, each minibatch (cheap on a
            CPU); False: undo their steps on the device with no sync (a GPU's queue keeps running).
            Bit for bit the same result. None (default): True on a CPU, False on a GPU.
        proximals: each member's EWMA of its actor's weights (:class:`vaco.learners.proximal.EWMAPolicy`)
            where the objective's proximal policy is one: stacked here, evaluated on each minibatch
            and stepped after each optimiser step as the solo run's (elementwise, so bit for bit);
            :meth:`write_back` gives each member its own. None: no EWMA.
    """

    def __init__(
        self,
        actors: Sequence[nn.Module],
        critics: Sequence[nn.Module],
        objectives: Sequence[nn.Module],
        generators: Sequence[torch.Generator],
        *,
        update_epochs: int,
        num_minibatches: int,
        max_grad_norm: float | None,
        lr: float,
        adam_eps: float,
        exact: bool | None = None,
        host_sync: bool | None = None,
        proximals: Sequence[nn.Module] | None = None,
        step_size: StepSize | None = None,
    ) -> None:
        if not (len(actors) == len(critics) == len(objectives) == len(generators) >= 1):
            raise ValueError(
                f"a population needs one actor, critic, objective and generator per member, got {len(actors)}, "
                f"{len(critics)}, {len(objectives)}, {len(generators)}"
            )
        self.size = len(actors)
        self.step_size = step_size  # the members' step-size rule (vaco.learners.step_size), one config's
        self.objectives = list(objectives)
        self.generators = list(generators)
        self.update_epochs, self.num_minibatches, self.max_grad_norm = update_epochs, num_minibatches, max_grad_norm
        on_cpu = next(actors[0].parameters()).device.type == "cpu"
        self.exact = on_cpu if exact is None else bool(exact)
        self.host_sync = on_cpu if host_sync is None else bool(host_sync)
        self.actor_net = BatchedMLP(actors[0].mean, "actor.mean.", self.exact)
        self.critic_net = BatchedMLP(critics[0].net, "critic.net.", self.exact)
        actor, critic = stack_parameters(actors), stack_parameters(critics)
        # the solo optimiser's order: the actor's parameters, then the critic's
        self.names = [f"actor.{n}" for n in actor] + [f"critic.{n}" for n in critic]
        stacked = {**{f"actor.{n}": p for n, p in actor.items()}, **{f"critic.{n}": p for n, p in critic.items()}}
        # a parameter whose member slices hold a multiple of ALIGN numbers is one stacked leaf; a
        # smaller one (log_std, the output biases) stays one leaf per member, so that the fused
        # Adam kernel runs its vector lanes and scalar tail over each member's numbers exactly as
        # over the solo tensor (a slice that starts mid-lane rounds otherwise: ~1e-11 apart); not
        # exact: every parameter one stacked leaf (a GPU's kernel computes each number on its own)
        self.leaves: dict[str, torch.Tensor | list[torch.Tensor]] = {
            name: (
                stacked[name].clone().requires_grad_()
                if not self.exact or stacked[name][0].numel() % ALIGN == 0
                else [row.clone().requires_grad_() for row in stacked[name]]
            )
            for name in self.names
        }
        tensors = [t for leaf in self.leaves.values() for t in (leaf if isinstance(leaf, list) else [leaf])]
        self.optimizer = torch.optim.Adam(tensors, lr=lr, eps=adam_eps, fused=True)
        self.proximal: dict[str, torch.Tensor] | None = None
        if proximals is not None:
            if len(proximals) != self.size or len({p.total_weight for p in proximals}) != 1:
                raise ValueError("a population's EWMA proximal policies must be one per member, at the same step")
            self.proximal = {f"actor.{n}": p for n, p in stack_parameters([p.average for p in proximals]).items()}
            self.proximal_decay, self.proximal_total = proximals[0].decay, proximals[0].total_weight
        #: how a step is taken: the optimizer's own, or (vaco.population.module) Lightning's wrapper of
        #: it, which also counts the step (the trainer's global_step, which checkpoints are keyed by)
        self.step_optimizer: Callable[[], object] = self.optimizer.step

    @property
    def params(self) -> dict[str, torch.Tensor]:
        """Every parameter stacked ``[S, ...]`` (with gradient: the networks' inputs)."""
        return {name: torch.stack(leaf) if isinstance(leaf, list) else leaf for name, leaf in self.leaves.items()}

    # ------------------------------------------------------------------ one iteration
    def update(
        self,
        train: Mapping[str, torch.Tensor],
        normalize: Callable[[torch.Tensor], torch.Tensor],
        active: Sequence[bool] | None = None,
        reestimate: Callable[[], Mapping[str, torch.Tensor]] | None = None,
        lag: torch.Tensor | None = None,
    ):
        """Epochs x minibatches on ``train`` (``{key: [S, N, ...]}``, the keys of :data:`vaco.learners.update.TRAIN_KEYS`):
        :func:`vaco.learners.update.minibatch_epochs`, the loop a run's update runs, with this layout.
        ``normalize`` maps raw ``[S, B, obs]`` observations to the networks' inputs, per member.
        Returns each member's outputs averaged over the steps (a dict per member, as the solo
        update returns) and whether each member's every step was finite (a member that was not
        stops, as its solo run would: its Adam step count is shared with the others from then on).
        Each member's objective then adapts its coefficients to its own means. A member that is not
        ``active`` (stopped earlier) has every step undone, as a non-finite one is.

        ``reestimate`` (required when the objective re-estimates its advantage, IMPALA): called
        before every minibatch, as the solo update re-estimates before every step; it returns the
        members' new ``advantage``, ``value_target`` and ``state_value`` (``[S, N]``) from their
        current weights (:meth:`write_back` gives them to the members' own modules first)."""
        if self.objectives[0].reestimate_advantage and reestimate is None:
            raise ValueError(
                f"{type(self.objectives[0]).__name__} re-estimates its advantage every step: pass reestimate"
            )
        device = train["observation"].device
        self.normalize = normalize
        self.buffers = {
            name: torch.stack([dict(o.named_buffers())[name] for o in self.objectives])
            for name, _ in self.objectives[0].named_buffers()
        }
        # the gather's indices live where the batch does: on a GPU no host-to-device copy per key and minibatch
        self.member_index = torch.arange(self.size, device=device).unsqueeze(1)
        going = None if active is None else torch.as_tensor(list(active), dtype=torch.bool, device=device)
        done = minibatch_epochs(
            self,
            dict(train),
            update_epochs=self.update_epochs,
            num_minibatches=self.num_minibatches,
            reestimate=reestimate,
            active=going,
            step_size=self.step_size,
            lag=lag,
        )
        means = done.means()
        for objective, member_means in zip(self.objectives, means):
            objective.update_coefficients(member_means)
        return means, (done.first_bad < 0).tolist()

    # ------------------------------------------------------------------ the layout of a population
    def draw_order(self, n: int, device: torch.device) -> torch.Tensor:
        # each member's permutation from its own generator, drawn as its solo run draws it
        return torch.stack([torch.randperm(n, generator=g) for g in self.generators]).to(device)

    def gather(self, train, idx):
        return {key: value[self.member_index, idx] for key, value in train.items()}

    def shuffle(self, train, order, num_minibatches, size):
        # [M, S, size]: minibatch k of every member one contiguous block [S, size, ...]
        idx = order[:, : num_minibatches * size].reshape(self.size, num_minibatches, size).transpose(0, 1)
        members = self.member_index.view(1, self.size, 1)
        return {key: value[members, idx] for key, value in train.items()}

    def learner(self, minibatch: dict[str, torch.Tensor]) -> None:
        """The learner's quantities on ``[S, B, ...]`` minibatches, as a run's layout computes them."""
        params = self.params
        obs = self.normalize(minibatch["observation"])
        loc = self.actor_net(params, obs)
        scale = params["actor.log_std"].exp().unsqueeze(1).expand_as(loc)
        minibatch.update(policy_quantities(minibatch["action"], loc, scale))
        minibatch["value"] = self.critic_net(params, obs).squeeze(-1)
        if self.proximal is not None:
            with torch.no_grad():
                loc = self.actor_net(self.proximal, obs)
                scale = self.proximal["actor.log_std"].exp().unsqueeze(1).expand_as(loc)
                minibatch["proximal_log_prob"] = gaussian_log_prob(minibatch["action"], loc, scale)

    def losses(self, minibatch):
        """Each member's summed ``loss_*`` ``[S]`` and its outputs ``{key: [S]}``: the objective,
        written for one run, vmapped over the members (with each member's own buffers)."""
        return torch.func.vmap(_member_losses(self.objectives[0]))(minibatch, self.buffers)

    def step(self, loss: torch.Tensor, finite: torch.Tensor, factor: torch.Tensor | None = None) -> bool:
        self.optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()  # each member's gradient is its own loss's
        if self.max_grad_norm is not None:
            self._clip(self.max_grad_norm)
        if factor is None:
            self._step(~finite)
        else:  # each member's step scaled by its own factor, the solo run's arithmetic row by row
            before = {name: [t.detach().clone() for t in self._rows(leaf)] for name, leaf in self.leaves.items()}
            self._step(~finite)
            for name, leaf in self.leaves.items():
                if isinstance(leaf, list):
                    for m, (t, old) in enumerate(zip(leaf, before[name])):
                        scale_step([t], [old], factor[m])
                else:
                    scale_step([leaf], before[name], factor)
        if self.proximal is not None:
            self._step_proximal()
        return True

    @torch.no_grad()
    def _step_proximal(self) -> None:
        """Every member's EWMA one step towards its weights: the solo update's arithmetic
        (:meth:`vaco.learners.proximal.EWMAPolicy.update`), elementwise on the stacked tensors."""
        keep, _, new_total = ewma_weights(self.proximal_total, self.proximal_decay)
        params = self.params
        for name, average in self.proximal.items():
            average.mul_(keep).add_(params[name].detach() / new_total)
        self.proximal_total = new_total

    @torch.no_grad()
    def _clip(self, max_norm: float) -> None:
        """``clip_grad_norm_`` per member: the norm of the norms, in the solo optimiser's order."""
        norms = []
        for name in self.names:
            leaf = self.leaves[name]
            if isinstance(leaf, list):
                norms.append(torch.stack([torch.linalg.vector_norm(t.grad, 2) for t in leaf]))
            else:
                norms.append(torch.linalg.vector_norm(leaf.grad.flatten(1), 2, dim=1))
        total = torch.linalg.vector_norm(torch.stack(norms, dim=1), 2, dim=1)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for leaf in self.leaves.values():
            if isinstance(leaf, list):
                for m, t in enumerate(leaf):
                    t.grad.mul_(coef[m])
            else:
                leaf.grad.mul_(coef.view(-1, *[1] * (leaf.dim() - 1)))

    def _step(self, bad: torch.Tensor) -> None:
        """Adam on the stacked parameters; a member whose loss was not finite (``bad``, ``[S]`` on
        the device) keeps its weights and Adam state, as the solo run skips that step on the device:
        every member's are kept before the step and put back with ``torch.where`` where ``bad``
        says so (a good member's new values are selected, not recomputed). With ``host_sync``, one
        look at ``bad`` on the host spares that when every member is finite (a CPU's usual case)."""
        if self.host_sync and not bool(bad.any()):
            self.step_optimizer()
            return
        kept = []  # (tensor, its rows' flags, broadcastable)
        for leaf in self.leaves.values():
            if isinstance(leaf, list):
                kept += [(t, bad[m]) for m, t in enumerate(leaf)]
            else:
                kept.append((leaf, bad.view(-1, *[1] * (leaf.dim() - 1))))
        saved = [
            (t.detach().clone(), {k: v.clone() for k, v in self.optimizer.state.get(t, {}).items() if v.dim() > 0})
            for t, _ in kept
        ]
        with torch.no_grad():
            for t, rows in kept:
                if t.grad is not None:
                    t.grad.masked_fill_(rows, 0.0)  # NaN gradients would poison the fused kernel's shared arithmetic
        self.step_optimizer()
        with torch.no_grad():
            for (t, rows), (weights, state) in zip(kept, saved):
                t.copy_(torch.where(rows, weights, t))
                for k, v in state.items():
                    now = self.optimizer.state[t][k]
                    now.copy_(torch.where(rows, v, now))

    @staticmethod
    def _rows(leaf):
        return leaf if isinstance(leaf, list) else [leaf]

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next iteration (the members share the config's schedule)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @torch.no_grad()
    def write_back(
        self, actors: Sequence[nn.Module], critics: Sequence[nn.Module], proximals: Sequence[nn.Module] | None = None
    ) -> None:
        """Copy the members' updated weights (and EWMA proximal policies) into their own modules
        (for collection, evaluation, checkpoints)."""
        for m, (actor, critic) in enumerate(zip(actors, critics)):
            for prefix, module in (("actor.", actor), ("critic.", critic)):
                for name, p in module.named_parameters():
                    leaf = self.leaves[prefix + name]
                    p.copy_(leaf[m])
        if self.proximal is not None and proximals is not None:
            for m, proximal in enumerate(proximals):
                for name, p in proximal.average.named_parameters():
                    p.copy_(self.proximal[f"actor.{name}"][m])
                proximal.total_weight = self.proximal_total
