"""The LightningModule: one rollout batch per training step, advantage once, then epochs x minibatches.

Algorithm 1 of the paper, generalised over the advantage module (GAE or V-trace realignment) and
the objective module (PPO-clip, PPO-KL, SPO, IMPALA, TV filter):

1. collect a batch with the mixture of stale policies (the data module does this on ``next``);
2. evaluate the critic and the learner pi_T on the whole batch, once;
3. run the advantage module once (IMPALA: before every optimisation step instead);
4. epochs x minibatches of the objective with manual optimisation (``manual_backward`` keeps DDP
   in sync), Adam with linear annealing and gradient-norm clipping, CleanRL's defaults
   (:class:`vaco.learners.update.MinibatchUpdate`, an object whose every input is an argument, built per
   iteration by :meth:`VacoModule.update`);
5. update the observation statistics, store the new policy version in the buffer, evaluate.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import math
import random
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase

from vaco.advantages import AdvantageModule
from vaco.data.episodes import learner_policy
from vaco.data.normalization import RunningMeanStd, apply_normalizer, batch_moments, normalizer
from vaco.learners.learner import Learner, NonFiniteLossError, plain_fields, short_count, startup_seconds
from vaco.learners.networks import Critic, GaussianActor, gaussian_log_prob
from vaco.learners.proximal import EWMAPolicy
from vaco.learners.step_size import StepSize
from vaco.learners.update import MinibatchUpdate
from vaco.lightning_private import reopen_finished_epoch
from vaco.objectives import Objective, metric_name
from vaco.run.checkpoint import numpy_rng_state, set_numpy_rng_state
from vaco.tracking import AXES_PARAM, FRACTION_PARAM, PAPER_AXES, REALIGNED_PARAM, SCORE_PARAM, declared_axes

__all__ = [
    "VacoModule",
    "IterationData",
    "NonFiniteLossError",
    "default_algorithm_name",
    "last_checkpoint",
    "plain_fields",
]

# the chunk of the batch evaluated at once outside the minibatch loop (bounds peak memory)
_CHUNK = 65_536


@dataclasses.dataclass
class IterationData:
    """What :meth:`VacoModule.begin_iteration` hands the update and :meth:`VacoModule.end_iteration`:
    the batch (``[N, T]`` and flat), the iteration's lag and value figures, and the seconds spent
    (collection, and the learner's own so far)."""

    batch: TensorDictBase
    flat: TensorDictBase
    backward_tv: float
    explained_var: float
    collect_seconds: float
    seconds: float


def default_algorithm_name(objective: Objective, advantage: AdvantageModule, step_size: StepSize | None = None) -> str:
    """The pair's name as the objective declares it (``Objective.names``), or ``Objective+Advantage``;
    with a step-size rule, its suffix after it (``ppo_clip_ess_step``)."""
    name = objective.algorithm_name(advantage.family, type(advantage).__name__)
    return name if step_size is None else f"{name}_{step_size.suffix}"


class VacoModule(Learner):
    """Asynchronous on-policy training with swappable advantage and objective modules.

    Args:
        objective: the policy objective (``class_path`` in YAML), e.g. ``vaco.objectives.TVFilter``.
        advantage: the advantage module, ``vaco.advantages.GAE`` or ``vaco.advantages.VTrace``.
        lr: Adam learning rate (CleanRL: 3e-4).
        anneal_lr: anneal the learning rate linearly to 0 over the run (CleanRL: true).
        adam_eps: Adam epsilon (CleanRL: 1e-5).
        update_epochs: passes over each batch (CleanRL: 10).
        num_minibatches: minibatches per pass; must divide the per-rank batch (CleanRL: 32).
        max_grad_norm: global gradient-norm clip (CleanRL: 0.5).
        hidden_sizes: widths of the actor's and critic's tanh MLPs (CleanRL: 64, 64).
        normalize_observation: normalise observations with running statistics (CleanRL: true).
        algorithm_name: the ``algorithm`` param recorded in MLflow; by default the name the objective
            declares for its advantage's family (``Objective.names``: ``vaco``, ``vaco_no_realign``,
            ``ppo_clip``, ``ppo_kl``, ``spo``, ``impala``), else ``Objective+Advantage``.
        variant_of: the algorithm this run is an ablation or control of (``ppo_clip_tv_matched``:
            ``ppo_clip``); the report keeps variants out of a task's min and max. By default what
            the objective declares (``Objective.variants``: ``vaco_no_realign`` is one of ``vaco``).
        env_spec: filled in from the data module on the first fit and kept in checkpoints.
        step_size: a learner-side correction, a factor on each optimiser step from the data
            (``vaco.learners.step_size``: ``ESSStepSize``, VCPO's; ``StalenessStepSize``); None for none.
    """

    #: the config key a sweep's ``K`` axis sets: the degree of asynchrony, K policies in the buffer
    lag_key: ClassVar[str] = "data.init_args.policy_buffer_size"
    #: the metric a run is scored by (the report's final score)
    score_metric: ClassVar[str] = "eval/return"
    #: filled in from the data module (env_spec) or derived (algorithm_name): not the run's definition
    resumable_hparams: ClassVar[tuple[str, ...]] = ("env_spec", "algorithm_name", "variant_of")
    evaluable: ClassVar[bool] = True

    def __init__(
        self,
        objective: Objective,
        advantage: AdvantageModule,
        lr: float = 3e-4,
        anneal_lr: bool = True,
        adam_eps: float = 1e-5,
        update_epochs: int = 10,
        num_minibatches: int = 32,
        max_grad_norm: float | None = 0.5,
        hidden_sizes: Sequence[int] = (64, 64),
        normalize_observation: bool = True,
        algorithm_name: str | None = None,
        variant_of: str | None = None,
        env_spec: dict | None = None,
        step_size: StepSize | None = None,
    ) -> None:
        super().__init__(
            objective, algorithm_name or default_algorithm_name(objective, advantage, step_size), variant_of
        )
        if not isinstance(advantage, AdvantageModule):
            raise TypeError(
                f"`model.advantage` must be a vaco.advantages.AdvantageModule, got {type(advantage).__name__}"
            )
        for name, value in (("update_epochs", update_epochs), ("num_minibatches", num_minibatches)):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"`model.{name}` must be an integer >= 1, got {value!r}")
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"`model.lr` must be > 0, got {lr!r}")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"`model.max_grad_norm` must be > 0 or null, got {max_grad_norm!r}")
        problem = objective.unsupported("mujoco")
        if problem is not None:
            raise ValueError(f"`model.objective`: {problem}")
        if objective.reestimate_advantage and not advantage.realigns:
            raise ValueError(
                f"`model.advantage`: {type(objective).__name__} re-estimates the realigned advantage every step "
                f"and needs a realigning module such as vaco.advantages.VTrace, got {type(advantage).__name__}"
            )
        for axis in objective.sweep_axes.keys() & advantage.sweep_axes.keys():  # one value, two modules
            if getattr(objective, axis) != getattr(advantage, axis):
                raise ValueError(
                    f"`model.objective.init_args.{axis}` ({getattr(objective, axis)}) must equal "
                    f"`model.advantage.init_args.{axis}` ({getattr(advantage, axis)})"
                )
        if step_size is not None and not isinstance(step_size, StepSize):
            raise TypeError(
                f"`model.step_size` must be a vaco.learners.step_size.StepSize, got {type(step_size).__name__}"
            )
        self.save_hyperparameters(ignore=["objective", "advantage", "step_size"])
        self.advantage = advantage
        #: the learner-side correction: a factor on each optimiser step (vaco.learners.step_size); None for none
        self.step_size = step_size
        self.actor: GaussianActor | None = None
        self.critic: Critic | None = None
        self.obs_rms: RunningMeanStd | None = None
        #: the EWMA of the actor's weights, for an objective whose proximal policy it is (vaco.learners.proximal)
        self.proximal_actor: EWMAPolicy | None = None
        self.generator = torch.Generator()
        self._saved_budget: int | None = None
        self.last_eval_return = float("nan")
        self._startup_logged = False  # perf/startup_seconds goes with this process's first iteration
        if env_spec is not None:
            self.build_networks(env_spec)

    # ------------------------------------------------------------------ construction
    def build_networks(self, spec: dict) -> None:
        hidden = tuple(self.hparams.hidden_sizes)
        self.actor = GaussianActor(spec["obs_dim"], spec["act_dim"], hidden)
        self.critic = Critic(spec["obs_dim"], hidden)
        self.obs_rms = RunningMeanStd(spec["obs_dim"])
        if self.objective.proximal == "ewma":
            self.proximal_actor = EWMAPolicy(self.actor, self.objective.ewma_decay)

    def build(self, data) -> None:
        """The networks for the data module's task (before :meth:`~vaco.data.RolloutDataModule.bind`
        hands the data module the actor)."""
        if self.actor is None:
            spec = data.env_spec.to_dict()
            self.hparams.env_spec = spec
            self.build_networks(spec)

    def defining_modules(self) -> dict[str, torch.nn.Module]:
        out = {"objective": self.objective, "advantage": self.advantage}
        if self.step_size is not None:  # a run without one keeps the definition it had before the setting existed
            out["step_size"] = self.step_size
        return out

    def batch_lag(self, flat: TensorDictBase) -> torch.Tensor:
        """The batch's largest policy age in policy versions (what a step-size rule reads as its lag)."""
        return (self.version - flat["policy_version"]).max().float()

    def total_iterations(self) -> int | None:
        return self.data.num_iterations() if self.data is not None else None

    @property
    def last_score(self) -> float:
        return self.last_eval_return

    def check_data(self, data) -> None:
        """Cross-field checks between this module and the data module (before any env starts)."""
        if data.batch_size % self.hparams.num_minibatches:
            raise ValueError(
                f"`model.num_minibatches` ({self.hparams.num_minibatches}) must divide the batch "
                f"(data.num_envs * data.num_steps = {data.batch_size})"
            )
        if not math.isclose(data.gamma, self.advantage.gamma):
            raise ValueError(
                f"`data.gamma` ({data.gamma}) (reward scaling) must equal "
                f"`model.advantage.init_args.gamma` ({self.advantage.gamma})"
            )

    def configure_optimizers(self):
        params = list(self.actor.parameters()) + list(self.critic.parameters())
        # the fused kernel makes Adam's step ~2x cheaper on CPU than the per-tensor default
        optimizer = torch.optim.Adam(params, lr=self.hparams.lr, eps=self.hparams.adam_eps, fused=True)
        iterations = self.data.num_iterations()
        anneal = self.hparams.anneal_lr
        # CleanRL: iteration i (0-based) uses lr * (1 - i / iterations)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda i: max(0.0, 1.0 - i / iterations) if anneal else 1.0
        )
        return [optimizer], [schedule]

    # ------------------------------------------------------------------ fit hooks
    def on_train_start(self) -> None:
        """A resumed run steps at its schedule's learning rate from its first iteration.

        Lightning restores the optimiser with the rate the old schedule set after the saved
        iteration; an extended run's schedule is the new budget's (iteration i of N uses
        ``lr * (1 - i / N)``, as a run planned with N iterations from the start would at i), so the
        rate is set again from the schedule of this run's budget (after a finished run it was 0)."""
        startup_seconds()  # training starts: the process's start-up ends here
        scheduler = self.lr_schedulers()
        if scheduler is None or not self._restored:
            return
        for group, base, factor in zip(self.optimizers().param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * factor(scheduler.last_epoch)

    def on_fit_start(self) -> None:
        data = self.data
        if not self._restored:  # a resumed run keeps the generator state of its checkpoint
            self.generator.manual_seed(data.seed + 7_919 * self.global_rank)
        if data.policy_buffer.size == 0:  # a fresh run: version 0 is the initial policy
            data.push_policy(self.actor, self.obs_rms.mean, self.obs_rms.var, int(self.version))
        self.log_run_params()
        if self.logger is not None and self.global_rank == 0:
            # the budget can grow on resume: its history is a metric (logged where it changes), not
            # an immutable param
            budget = self.budget()
            if budget != self._saved_budget:
                steps = int(self.version) * data.batch_size * self.trainer.world_size
                self.logger.log_metrics({"time/total_steps": float(budget)}, step=steps)

    def budget(self) -> int:
        data = self.data
        return data.num_iterations() * data.batch_size * self.trainer.world_size

    def default_run_name(self, data) -> str:
        """The MLflow run's name from its coordinates: ``vaco Hopper-v5 K=4 s3``; delta and rho_bar
        appear where they differ from their defaults (``vaco Hopper-v5 K=4 delta=0.4 s3``)."""
        parts = [self.algorithm, data.env_id, f"K={data.policy_buffer_size}"]
        parts += axis_labels(self.objective, self.advantage)
        return " ".join(parts) + f" s{data.seed}"

    def run_params(self) -> dict[str, Any]:
        """The coordinates a user compares runs by, as flat MLflow params."""
        data = self.data
        params: dict[str, Any] = {
            "algorithm": self.algorithm,
            "objective": type(self.objective).__name__,
            "advantage_estimator": type(self.advantage).__name__,
            REALIGNED_PARAM: self.advantage.realigns,
            "env": data.env_id,
            "K": data.policy_buffer_size,
            "seed": data.seed,
            # the collection backend (its class path): which simulator produced the run
            "collection": data.collection.definition()["class_path"],
            "world_size": self.trainer.world_size,
            **dict.fromkeys(PAPER_AXES),  # delta and rho_bar always (None where they do not apply)
            **declared_axes(self.objective, self.advantage),
            AXES_PARAM: ",".join(declared_axes(self.objective, self.advantage)),
            FRACTION_PARAM: f"train/{self.objective.fraction_metric}",
            SCORE_PARAM: self.score_metric,
            "c_bar": getattr(self.advantage, "c_bar", None),
            "lambda": getattr(self.advantage, "lmbda", None),
        }
        modules = [("objective", self.objective), ("advantage_module", self.advantage)]
        if self.step_size is not None:
            params["step_size"] = type(self.step_size).__name__
            modules.append(("step_size", self.step_size))
        for prefix, module in modules:
            for key, value in plain_fields(module, buffers=True).items():
                params[f"{prefix}.{key}"] = value
        return params

    # ------------------------------------------------------------------ the iteration
    def training_step(self, dataloader_iter) -> None:
        """One iteration of Algorithm 1: the learner pass and the advantage once
        (:meth:`begin_iteration`), the update (:meth:`update`: :class:`MinibatchUpdate`), then a new policy version and the
        iteration's metrics (:meth:`end_iteration`). A population (:mod:`vaco.population.module`)
        runs the same two halves per member around one batched update."""
        # no prefetching: the next batch is collected only after this update has been pushed
        batch, _, _ = next(dataloader_iter)
        step = self.begin_iteration(batch)
        lr = self.optimizers().param_groups[0]["lr"]  # the rate this iteration's update steps at
        start = time.perf_counter()
        means = self.update(step.batch, step.flat)
        step.seconds += time.perf_counter() - start
        self.end_iteration(step, means, lr)

    def update(self, batch: TensorDictBase, flat: TensorDictBase) -> dict[str, float]:
        """Epochs x minibatches on one batch (:class:`MinibatchUpdate`, with everything it reads
        named here), then the learning rate's annealing step; returns the objective's outputs
        averaged over the optimiser steps."""
        hp = self.hparams
        optimizer = self.optimizers()
        clip = None
        if hp.max_grad_norm is not None:
            clip = functools.partial(
                self.clip_gradients, optimizer, gradient_clip_val=hp.max_grad_norm, gradient_clip_algorithm="norm"
            )
        means = MinibatchUpdate(
            self.objective,
            self.advantage,
            self.actor,
            self.critic,
            normalize=self._normalize,
            learner_pass=self.learner_pass,
            generator=self.generator,
            optimizer=optimizer,
            backward=self.manual_backward,
            clip=clip,
            update_epochs=hp.update_epochs,
            num_minibatches=hp.num_minibatches,
            device=self.device,
            iteration=int(self.version) + 1,
            checkpoint=last_checkpoint(self.trainer),
            proximal=self.proximal_actor,
            step_size=self.step_size,
            lag=None if self.step_size is None else self.batch_lag(flat),
        ).run(batch, flat)
        scheduler = self.lr_schedulers()
        if scheduler is not None:  # a subclass's own optimiser may come without one
            scheduler.step()
        return means

    def begin_iteration(self, batch: TensorDictBase) -> IterationData:
        """Before the update: the batch on the learner's device, the normaliser frozen, critic
        values and pi_T's log-probs once, backward lag and the advantage (``advantage``,
        ``value_target`` on the flat batch)."""
        collect_seconds = self.data.collector.last_collect_seconds
        start = time.perf_counter()
        batch = self.transfer_batch(batch)
        flat = batch.reshape(-1)
        self.freeze_normalizer()

        # -- once per iteration: critic values and the learner pi_T on the stored actions
        self.learner_pass(batch, flat)
        backward_tv = self._tv(flat["log_prob"], flat["behavior_log_prob"])
        self.advantage(batch)
        flat.set("advantage", batch["advantage"].reshape(-1))
        flat.set("value_target", batch["value_target"].reshape(-1))
        if self.objective.proximal == "recompute":  # decoupled PPO's proximal policy: pi_T, from the pass above
            flat.set("proximal_log_prob", flat["log_prob"])
        explained_var = _explained_variance(flat["state_value"], flat["value_target"])
        return IterationData(batch, flat, backward_tv, explained_var, collect_seconds, time.perf_counter() - start)

    def end_iteration(self, step: IterationData, means: dict[str, float], lr: float) -> None:
        """After the update: forward lag, new normaliser statistics, a new policy version, the
        iteration's metrics (:meth:`telemetry`), the evaluation when due, and the log."""
        start = time.perf_counter()
        flat = step.flat
        with torch.no_grad():
            final_log_prob = self._log_prob(flat["observation"], flat["action"])
        forward_tv = self._tv(final_log_prob, flat["behavior_log_prob"])
        age = (self.version - flat["policy_version"]).float()
        if self.hparams.normalize_observation:
            self._update_obs_rms(flat["observation"])
        self.version += 1
        self.data.push_policy(self.actor, self.obs_rms.mean, self.obs_rms.var, int(self.version))
        update_seconds = step.seconds + time.perf_counter() - start

        lag = {
            "train/explained_variance": step.explained_var,
            "train/lr": lr,
            "lag/backward_tv": step.backward_tv,
            "lag/forward_tv": forward_tv,
            "lag/policy_age_mean": float(age.mean()),
            "lag/policy_age_max": float(age.max()),
        }
        metrics, env_steps = self.telemetry(flat, means, lag, step.collect_seconds, update_seconds)
        if self.should_evaluate():
            metrics.update(self.evaluate())
        self.log_metrics(metrics, env_steps)

    def telemetry(
        self, flat: TensorDictBase, means: dict[str, float], lag: dict[str, float], collect: float, update: float
    ) -> tuple[dict[str, float], int]:
        """The iteration's metrics (``train/*``, ``lag/*``, ``perf/*``, ``time/*``) and its env step."""
        world = self.trainer.world_size
        rows = flat.numel()  # N x T of this rank
        env_steps = int(self.version) * rows * world
        done = flat["next", "done"]
        metrics = {metric_name(k): v for k, v in means.items()}
        metrics.update(
            {
                "train/explained_variance": lag["train/explained_variance"],
                "train/lr": lag["train/lr"],
                "train/advantage_std": float(flat["advantage"].std()),
                **{key: value for key, value in lag.items() if key.startswith("lag/")},
                "perf/sps": rows * world / (collect + update),
                "perf/collect_sps": rows / max(collect, 1e-9),
                "perf/collect_seconds": collect,
                "perf/update_seconds": update,
                "time/iteration": int(self.version),
                "time/env_steps": env_steps,
            }
        )
        if not self._startup_logged:
            if startup_seconds() is not None:
                metrics["perf/startup_seconds"] = startup_seconds()
            self._startup_logged = True
        if done.any():
            returns = flat["next", "episode_return"][done]
            metrics["train/episode_return"] = float(returns.mean())
            metrics["train/episode_length"] = float(flat["next", "episode_length"][done].float().mean())
        if world > 1:
            metrics["ddp/max_param_divergence"] = self._check_ranks_in_sync()
        return metrics, env_steps

    # ------------------------------------------------------------------ pieces
    def transfer_batch(self, batch: TensorDictBase) -> TensorDictBase:
        """The rollout batch on the learner's device, once per iteration; the advantage and every
        epoch run there. Collection stays on the CPU (see ``PolicyVersionBuffer``). From pinned
        memory the copy to a GPU is asynchronous; on the CPU this is a no-op move."""
        if self.device.type == "cuda" and (batch.device is None or batch.device.type == "cpu"):
            batch = batch.pin_memory()  # (a batch collected on the GPU, by the Warp backend, is already there)
        return batch.to(self.device, non_blocking=True)

    def _normalize(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.hparams.normalize_observation:
            return obs
        return apply_normalizer(obs, *self._norm_cache)

    def freeze_normalizer(self) -> None:
        """The statistics are fixed for the whole iteration: cache them as float32 shift/scale."""
        self._norm_cache = normalizer(self.obs_rms.mean, self.obs_rms.var)

    @property
    def frozen_normalizer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The iteration's frozen ``(shift, inv_scale)`` (:meth:`freeze_normalizer`), as the learner applies them."""
        return self._norm_cache

    def _log_prob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        out = []
        for o, a in zip(obs.split(_CHUNK), action.split(_CHUNK)):
            loc, scale = self.actor(self._normalize(o))
            out.append(gaussian_log_prob(a, loc, scale))
        return torch.cat(out)

    def _values(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.critic(self._normalize(o)) for o in obs.split(_CHUNK)])

    @torch.no_grad()
    def learner_pass(self, batch: TensorDictBase, flat: TensorDictBase) -> None:
        """``state_value``, ``("next", "state_value")`` and pi_T's ``log_prob`` for the whole batch."""
        values = self._values(flat["observation"]).view(batch.batch_size)
        done = batch["next", "done"]
        # V(s_{t+1}) is V of the next row inside a trajectory; evaluate the critic only where the
        # trajectory ends (final observation) or the rollout does (bootstrap observation)
        need = done.clone()
        need[:, -1] = True
        next_values = torch.empty_like(values)
        next_values[:, :-1] = values[:, 1:]
        next_values[need] = self._values(batch["next", "observation"][need])
        batch.set("state_value", values)
        batch.set(("next", "state_value"), next_values)
        flat.set("state_value", values.reshape(-1))
        log_prob = self._log_prob(flat["observation"], flat["action"])
        flat.set("log_prob", log_prob)
        batch.set("log_prob", log_prob.view(batch.batch_size))

    @staticmethod
    def _tv(log_prob: torch.Tensor, behavior_log_prob: torch.Tensor) -> float:
        return float(0.5 * ((log_prob - behavior_log_prob).exp() - 1).abs().mean())

    def _update_obs_rms(self, obs: torch.Tensor) -> None:
        """Fold this iteration's observations into the statistics; identical on every DDP rank."""
        mean, var, rows = batch_moments(obs)
        moments = torch.stack([mean, var])
        count = torch.tensor(rows, dtype=torch.float64, device=moments.device)
        if self.trainer.world_size > 1:
            all_moments = self.all_gather(moments)  # [world, 2, obs_dim]
            all_counts = self.all_gather(count)
            for m, c in zip(all_moments, all_counts):
                self.obs_rms.update_from_moments(m[0], m[1], float(c))
        else:
            self.obs_rms.update_from_moments(moments[0], moments[1], float(count))

    @torch.no_grad()
    def _check_ranks_in_sync(self) -> float:
        """Largest difference between DDP ranks in the weights and normaliser of the new version.

        Gradients are all-reduced and the normaliser statistics merged identically, so the ranks
        must agree exactly; anything else (a rank that skipped a step, an unsynced statistic)
        would silently train different policies, so it stops the run.
        """
        state = torch.cat(
            [p.detach().double().flatten() for p in (*self.actor.parameters(), *self.critic.parameters())]
            + [self.obs_rms.mean, self.obs_rms.var]
        )
        gathered = self.all_gather(state)  # [world, n]
        divergence = float((gathered - gathered[0]).abs().max())
        if divergence > 1e-6:
            raise RuntimeError(
                f"DDP ranks diverged by {divergence:.3g} at iteration {int(self.version)}: the ranks no "
                "longer train the same policy"
            )
        return divergence

    # ------------------------------------------------------------------ evaluation and logging
    def should_evaluate(self) -> bool:
        if self.global_rank != 0:
            return False
        version, last = int(self.version), self.data.num_iterations()
        return version == last or (self.data.eval_every > 0 and version % self.data.eval_every == 0)

    def policy(self):
        """The learner as a function of raw observations -> (loc, scale), on the CPU where the
        evaluation envs step (a copy when the learner is on an accelerator)."""
        actor = self.actor if self.device.type == "cpu" else copy.deepcopy(self.actor).cpu()
        if self.hparams.normalize_observation:
            return learner_policy(actor, self.obs_rms.mean.cpu(), self.obs_rms.var.cpu())
        return actor

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        data, start = self.data, time.perf_counter()
        returns = data.evaluate(self.policy(), seed=data.seed + 104_729 * int(self.version))
        self.last_eval_return = float(returns.mean())
        return {
            "eval/return": self.last_eval_return,
            "eval/return_std": float(returns.std()),
            "perf/eval_seconds": time.perf_counter() - start,
        }

    def progress_fields(self, metrics: dict[str, float], step: int) -> dict[str, str]:
        """Env steps done/total, SPS and the latest eval return (``step`` is env steps)."""
        progress = {"steps": f"{short_count(step)}/{short_count(self.budget())}", "sps": f"{metrics['perf/sps']:.0f}"}
        if not math.isnan(self.last_eval_return):
            progress["eval"] = f"{self.last_eval_return:.1f}"
        return progress

    # ------------------------------------------------------------------ checkpoints
    def extra_state(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "last_eval_return": self.last_eval_return,
            "numpy_rng": numpy_rng_state(),
            "python_rng": list(random.getstate()[1]),
            "total_steps": self.budget(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.actor is None:
            self.build_networks(checkpoint["hyper_parameters"]["env_spec"])
        super().on_load_checkpoint(checkpoint)
        if self._restored and self._trainer is not None and self._saved_budget is not None:
            if self.budget() > self._saved_budget:
                reopen_finished_epoch(checkpoint)

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        self.generator.set_state(state["generator"])
        self.last_eval_return = state["last_eval_return"]
        set_numpy_rng_state(state["numpy_rng"])
        random.setstate((3, tuple(state["python_rng"]), None))
        self._saved_budget = state.get("total_steps")


def last_checkpoint(trainer) -> str:
    """The path of the run's last checkpoint so far, or ""."""
    callback = getattr(trainer, "checkpoint_callback", None)
    return getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "") or ""


def axis_labels(*modules) -> list[str]:
    """``name=value`` for each declared sweep axis whose value differs from its class default."""
    out = []
    for axis, value in declared_axes(*modules).items():
        defaults = [inspect.signature(type(m).__init__).parameters.get(axis) for m in modules if axis in m.sweep_axes]
        default = defaults[0].default if defaults and defaults[0] is not None else None
        if value is not None and default is not None and value != default:
            out.append(f"{axis}={value:g}")
    return out


def _explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    var = target.var()
    return float("nan") if var == 0 else float(1 - (target - pred).var() / var)
