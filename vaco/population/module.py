"""``vaco fit --population S``: S runs of one config that differ only by seed, trained in one process.

Member ``m`` is the run ``--seed_everything s_m`` alone, bit for bit (``tests/test_population_fit.py``):
its own actor and critic (initialised after ``seed_everything(s_m)``, as its solo run's), optimiser
state, policy-version buffer, observation normaliser, reward scaler, envs, random streams, MLflow run
and evaluation. What the members share is the work of one iteration:

1. **collection**: each member's own collector (its data module's), on MuJoCo Warp in lockstep
   (every member's worlds are blocks of one model, stepped in one call: :mod:`vaco.population.lockstep`),
   on the other backends in turn;
2. **before the update**, per member: :meth:`vaco.VacoModule.begin_iteration` (the learner pass and
   the advantage: the solo code);
3. **the update**, batched: :class:`vaco.population.layout.PopulationUpdate` (one ``baddbmm`` per layer for
   all members, the objective vmapped, Adam over the stacked parameters, clipping per member);
4. **after the update**, per member: :meth:`vaco.VacoModule.end_iteration` (forward lag, normaliser,
   the new policy version, metrics to the member's own MLflow run, its evaluation).

Where the member dimension lives: :class:`PopulationModule` holds the members (``members.{m}.*`` in
its state dict and checkpoint) and the stacked update; :class:`PopulationDataModule` holds each
member's :class:`~vaco.data.RolloutDataModule`. The checkpoint resumes every member; ``vaco evaluate
--ckpt ... --member m`` plays one. Each member's MLflow run is named and tagged as its solo run
would be, with the tags ``vaco.population`` (the population's id) and ``vaco.population_member``;
``vaco report`` reads them as any runs.

A member that meets non-finite values (its envs' output, its advantage's inputs, its loss) stops
alone, as its solo run would: one line names it and its seed, its MLflow run is FAILED, its row of
the stacked update is frozen from then on, and the others go on (``vaco fit`` then exits 1).

Not batched yet (each member in turn, exact either way): the policy calls while collecting (one call
per member and step, not one K-policy mixture call for all), collection on gymnasium and envpool
(one vector env per member), the learner pass and the advantage (IMPALA re-estimates it before
every optimiser step: each member's learner pass and V-trace in turn, then the batched step). DDP
is refused with one line.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import random
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn

from vaco._checks import NonFiniteInputError
from vaco.data.normalization import apply_normalizer
from vaco.learners.learner import Learner, NonFiniteLossError, short_count
from vaco.learners.update import train_keys
from vaco.learners.vaco_module import VacoModule, last_checkpoint
from vaco.lightning_private import reopen_finished_epoch, set_logged_hparam
from vaco.population.layout import PopulationUpdate
from vaco.population.lockstep import Lockstep, shares_one_simulator
from vaco.run.checkpoint import numpy_rng_state, set_numpy_rng_state

__all__ = ["PopulationModule", "PopulationDataModule", "population_seeds", "POPULATION_TAG", "MEMBER_TAG"]

#: the MLflow tags of a member's run: the population's id, and the member's index in it
POPULATION_TAG = "vaco.population"
MEMBER_TAG = "vaco.population_member"


MAX_MEMBERS = 1_000_000  # members one process may hold (memory is checked separately, per backend)


def population_seeds(population: int | Sequence[int], seed: int) -> list[int]:
    """The members' seeds: ``population`` seeds from ``seed`` on (an int), or the given list.

    >>> population_seeds(3, 5)
    [5, 6, 7]
    """
    if isinstance(population, bool) or not isinstance(population, (int, list, tuple)):
        raise ValueError(f"`population` must be an integer >= 1 or a list of seeds, got {population!r}")
    size = population if isinstance(population, int) else len(population)
    if size > MAX_MEMBERS:  # before any list of that size is built
        raise ValueError(
            f"`population` {size:,} is past the {MAX_MEMBERS:,} members one process may hold; spread the seeds "
            "over processes (a sweep's `population:` packs a cell's seeds that way)"
        )
    if isinstance(population, int):
        if population < 1:
            raise ValueError(f"`population` must be an integer >= 1 or a list of seeds, got {population!r}")
        if seed + population - 1 >= 2**32:
            raise ValueError(
                f"`population`: seed {seed + population - 1} is past 2^32 - 1 (seed_everything + population - 1)"
            )
        seeds = [seed + m for m in range(population)]
    else:
        seeds = list(population)
        if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**32 for s in seeds):
            raise ValueError(f"`population` must list seeds (integers in [0, 2^32 - 1]), got {population!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"`population`: the members' seeds must differ, got {seeds}")
    if max(seeds) >= 2**32:
        raise ValueError(f"`population`: seed {max(seeds)} is past 2^32 - 1 (seed_everything + population - 1)")
    return seeds


class _Members:
    """The members' collectors as one loader: each ``next`` is every member's batch, collected in
    turn (None for a member in ``stopped``: it collects no more)."""

    def __init__(self, collectors: Sequence[Any], stopped: set[int]) -> None:
        self.collectors = list(collectors)
        self.stopped = stopped

    def __len__(self) -> int:
        return min(len(c) for c in self.collectors)

    def __iter__(self) -> Iterator[list]:
        iterators = [iter(c) for c in self.collectors]
        while True:
            try:
                yield [None if m in self.stopped else _collect(it) for m, it in enumerate(iterators)]
            except StopIteration:
                return


def _collect(iterator):
    """A member's next batch, or the error its envs raised (NaN observations: that member stops alone)."""
    try:
        return next(iterator)
    except FloatingPointError as err:
        return err


class PopulationDataModule(L.LightningDataModule):
    """The members' own :class:`~vaco.data.RolloutDataModule` s (one per seed), as one data module."""

    def __init__(self, members: Sequence[L.LightningDataModule]) -> None:
        super().__init__()
        self.members = list(members)
        #: the members that stopped alone (a non-finite loss): they collect and train no more
        self.stopped: set[int] = set()

    # what is the same for every member (the task, the sizes, the backend): member 0's
    env_id = property(lambda self: self.members[0].env_id)
    num_envs = property(lambda self: self.members[0].num_envs)
    num_steps = property(lambda self: self.members[0].num_steps)
    batch_size = property(lambda self: self.members[0].batch_size)
    policy_buffer_size = property(lambda self: self.members[0].policy_buffer_size)
    eval_every = property(lambda self: self.members[0].eval_every)
    collection = property(lambda self: self.members[0].collection)
    defining_fields = property(lambda self: self.members[0].defining_fields)

    def num_iterations(self) -> int:
        return self.members[0].num_iterations()

    def share_simulator(self) -> None:
        """Where the backend can (:meth:`~vaco.data.collection.Collection.lockstep_envs`: gymnasium in
        process, Warp), put
        every member's envs in one simulator, member ``m``'s collector on its block ``m``; called
        before the members bind (which build their own collectors otherwise)."""
        if any(member.collector is not None for member in self.members):
            return
        first = self.members[0]
        if "env" not in inspect.signature(first.collection.collector).parameters:
            return  # a backend whose collector builds its own envs (envpool, actor processes): members in turn
        seeds = [member.seed for member in self.members]  # the collector's seed of a rank-0 run (no DDP)
        envs = first.collection.lockstep_envs(self.members, seeds)
        if envs is None:
            return
        for member, env, seed in zip(self.members, envs, seeds):
            member.collector = member.collection.collector(member, seed=seed, env=env)

    def train_dataloader(self):
        collectors = [m.collector for m in self.members]
        if shares_one_simulator(collectors):
            return Lockstep(collectors, self.stopped)
        return _Members(collectors, self.stopped)

    def teardown(self, stage: str) -> None:
        for member in self.members:
            member.teardown(stage)

    def on_exception(self, exception: BaseException) -> None:
        for member in self.members:
            member.on_exception(exception)

    def state_dict(self) -> dict[str, Any]:
        return {"members": [member.state_dict() for member in self.members], "stopped": sorted(self.stopped)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("members", [])
        if len(saved) != len(self.members):
            raise ValueError(
                f"the checkpoint holds {len(saved)} members' data, this population has {len(self.members)}"
            )
        for member, state in zip(self.members, saved):
            member.load_state_dict(state)
        self.stopped.clear()
        self.stopped.update(int(m) for m in state_dict.get("stopped", []))


class PopulationModule(Learner):
    """S :class:`~vaco.VacoModule` members trained as one (see the module docstring).

    Built by ``vaco fit --population S`` (or a list of seeds) from the config's model and data:
    :meth:`from_run` copies them once per member, each data module with its member's seed.
    """

    lag_key = VacoModule.lag_key
    score_metric = VacoModule.score_metric
    resumable_hparams = VacoModule.resumable_hparams
    evaluable = True

    def __init__(self, members: Sequence[VacoModule], seeds: Sequence[int], population_id: str | None = None) -> None:
        first = members[0]
        super().__init__(first.objective, first.algorithm, first.variant_of)
        self.members = nn.ModuleList(members)
        self.seeds = list(seeds)
        self.population_id = population_id or uuid.uuid4().hex[:12]
        # the members' shared hyperparameters (every member's are the same), and the population's size:
        # logged as each member run's params; env_spec is filled in on the first fit (vaco evaluate reads it)
        self.save_hyperparameters({**dict(first.hparams), "population": len(members)})
        self.updater: PopulationUpdate | None = None
        # the update's layout (PopulationUpdate's ``exact``): the device's default, or a resumed
        # checkpoint's (its Adam state is laid out by it: a GPU population resumed on a CPU keeps it)
        self._update_exact: bool | None = None
        self._saved_budget: int | None = None

    @staticmethod
    def check_model(model) -> None:
        """Refuse, in one line naming ``population``, a model a population cannot train."""
        if not isinstance(model, VacoModule):
            raise ValueError(
                f"`population`: populations train vaco.VacoModule runs (MuJoCo), not {type(model).__name__}"
            )
        from vaco.population.layout import check_vmappable

        check_vmappable(model.objective)

    @classmethod
    def from_run(cls, model: VacoModule, data, seeds: Sequence[int]) -> tuple[PopulationModule, PopulationDataModule]:
        """The population of ``seeds`` from one run's model and data module (before any fit)."""
        cls.check_model(model)
        members, datas = [], []
        for seed in seeds:
            member, member_data = copy.deepcopy(model), copy.deepcopy(data)
            member_data.seed = seed
            member_data.hparams["seed"] = seed
            set_logged_hparam(member_data, "seed", seed)  # what Lightning logs as params
            members.append(member)
            datas.append(member_data)
        return cls(members, seeds), PopulationDataModule(datas)

    # ------------------------------------------------------------------ the members
    def member_data(self) -> list:
        return self.data.members if self.data is not None else []

    def setup(self, stage: str) -> None:
        """Each member meets its own data module; its networks are initialised after
        ``seed_everything(seed)``, as its solo run's are."""
        data = self.trainer.datamodule
        if self.trainer.world_size > 1:
            raise ValueError(
                "`population`: a population trains in one process; DDP (trainer.devices > 1) is not supported"
            )
        data.share_simulator()
        for member, member_data in zip(self.members, data.members):
            member.trainer = self.trainer
            member_data.trainer = self.trainer
            if member.actor is None:
                L.seed_everything(member_data.seed, verbose=False)
            member.build(member_data)
            member_data.bind(member)
            member.data = member_data
        self.hparams.env_spec = self.members[0].hparams.env_spec
        self.data = data

    def check_data(self, data) -> None:
        for member, member_data in zip(self.members, data.members):
            member.check_data(member_data)

    def default_run_name(self, data) -> str:
        return self.members[0].default_run_name(data.members[0])

    def run_params(self) -> dict[str, Any]:
        return self.members[0].run_params()

    def run_definition(self, data) -> dict[str, Any]:
        """Member 0's definition (the others differ only by seed), the population's size and seeds."""
        out = self.members[0].run_definition(data.members[0])
        out["population"] = list(self.seeds)
        return out

    def total_iterations(self) -> int | None:
        return self.data.num_iterations() if self.data is not None else None

    def defining_modules(self) -> dict[str, nn.Module]:
        return self.members[0].defining_modules()

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        hp = self.members[0].hparams
        self.updater = PopulationUpdate(
            [m.actor for m in self.members],
            [m.critic for m in self.members],
            [m.objective for m in self.members],
            [m.generator for m in self.members],
            exact=self._update_exact,
            proximals=self._proximals(),
            step_size=self.members[0].step_size,
            **{name: hp[name] for name in ("update_epochs", "num_minibatches", "max_grad_norm", "lr", "adam_eps")},
        )
        iterations = self.data.num_iterations()
        anneal = hp.anneal_lr
        schedule = torch.optim.lr_scheduler.LambdaLR(
            self.updater.optimizer, lambda i: max(0.0, 1.0 - i / iterations) if anneal else 1.0
        )
        return [self.updater.optimizer], [schedule]

    def on_train_start(self) -> None:
        VacoModule.on_train_start(self)  # a resumed population steps at its schedule's rate at once

    def on_fit_start(self) -> None:
        for m, member in enumerate(self.members):  # each member's own start: its generator, version 0, its params
            member.on_fit_start()
            if member.logger is not None:
                member.logger.log_hyperparams(dict(member.data.hparams_initial))
            if m in self.data.stopped and hasattr(member.logger, "final_status"):  # resumed: it stays stopped
                member.logger.final_status = "failed"
                member.logger.experiment.set_terminated(member.logger.run_id, "FAILED")

    # ------------------------------------------------------------------ the iteration
    def training_step(self, dataloader_iter) -> None:
        batches, _, _ = next(dataloader_iter)
        members = list(self.members)
        stopped = self.data.stopped
        steps = []
        for m, (member, batch) in enumerate(zip(members, batches)):
            step = None
            if isinstance(batch, Exception):  # its envs returned NaN
                self._stop_member(m, str(batch))
            elif m not in stopped:
                try:
                    step = member.begin_iteration(batch)
                except (FloatingPointError, NonFiniteInputError) as err:  # NaN values reached the advantage
                    self._stop_member(m, f"{type(err).__name__}: {err}")
            steps.append(step)
        if all(step is None for step in steps):
            raise NonFiniteLossError(self._all_stopped())
        active = [m not in stopped for m in range(len(members))]
        for member, on in zip(members, active):
            if not on:
                member.freeze_normalizer()  # its row is normalised (and discarded) with the rest
        lr = self.optimizers().param_groups[0]["lr"]
        start = time.perf_counter()
        # a stopped member's row holds another member's batch with every step undone (the stacked
        # update keeps its shape; its weights and Adam state stay as they were)
        stand_in = next(step for step in steps if step is not None).flat
        train = {
            key: torch.stack([(step.flat if step is not None else stand_in)[key] for step in steps])
            for key in train_keys(members[0].objective)
        }
        normalize = self._normalizer(members)
        # through Lightning's wrapper: it counts the optimiser steps (global_step), as the solo run's do
        self.updater.step_optimizer = self.optimizers().step
        reestimate = None
        if members[0].objective.reestimate_advantage:  # IMPALA: V-trace again before every step
            reestimate = functools.partial(self._reestimate, members, steps, active, train)
        lag = None
        if self.updater.step_size is not None:  # each member's batch's largest policy age, as its solo run takes it
            lag = torch.stack(
                [member.batch_lag(step.flat if step is not None else stand_in) for member, step in zip(members, steps)]
            )
        means, finite = self.updater.update(train, normalize, active, reestimate, lag)
        self.updater.write_back([m.actor for m in members], [m.critic for m in members], self._proximals())
        self.lr_schedulers().step()
        going = [m for m in range(len(members)) if active[m] and finite[m]]
        shared = (time.perf_counter() - start) / max(1, len(going))
        for m in range(len(members)):
            if active[m] and not finite[m]:
                self._stop_member(m, "non-finite loss (that step was skipped)")
        if not going:
            raise NonFiniteLossError(self._all_stopped())
        for m in going:
            steps[m].seconds += shared
            members[m].end_iteration(steps[m], means[m], lr)
        self.version += 1
        self.last_metrics = _mean_metrics([members[m].last_metrics for m in going])
        self.progress = self._progress([members[m] for m in going])

    @torch.no_grad()
    def _reestimate(self, members, steps, active, train) -> dict[str, torch.Tensor]:
        """IMPALA's re-estimation for every member, as its solo update makes it before each step
        (``vaco.learners.update.MinibatchUpdate._reestimate``): the members' current weights into their own modules,
        then each active member's learner pass and V-trace on its own batch. A stopped member's rows
        stay as they were."""
        self.updater.write_back([m.actor for m in members], [m.critic for m in members], self._proximals())
        rows: dict[str, list[torch.Tensor]] = {"advantage": [], "value_target": [], "state_value": []}
        for m, (member, step) in enumerate(zip(members, steps)):
            if step is None or not active[m]:
                for key in rows:
                    rows[key].append(train[key][m])
                continue
            member.learner_pass(step.batch, step.flat)
            member.advantage(step.batch)
            rows["advantage"].append(step.batch["advantage"].reshape(-1))
            rows["value_target"].append(step.batch["value_target"].reshape(-1))
            rows["state_value"].append(step.flat["state_value"])
        return {key: torch.stack(values) for key, values in rows.items()}

    def _proximals(self) -> list[nn.Module] | None:
        """Each member's EWMA proximal policy, where the objective reads one (vaco.learners.proximal)."""
        proximals = [m.proximal_actor for m in self.members]
        return None if proximals[0] is None else proximals

    def _all_stopped(self) -> str:
        ckpt = last_checkpoint(self.trainer)
        kept = f"the last good checkpoint is kept ({ckpt})" if ckpt else "no checkpoint was written before it"
        return f"iteration {int(self.version) + 1}: every member of the population has stopped on non-finite values; {kept}"

    def _stop_member(self, m: int, reason: str) -> None:
        """Member ``m`` met non-finite values (its loss, its envs' output): it stops alone, as its
        solo run would (its run FAILED), and the others go on."""
        member = self.members[m]
        self.data.stopped.add(m)
        run_id = getattr(member.logger, "run_id", None)
        print(
            f"vaco: population member {m} (seed {self.seeds[m]}) stopped at iteration {int(self.version) + 1}: "
            f"{reason}; its MLflow run {run_id} is FAILED; the other "
            f"{len(self.members) - len(self.data.stopped)} members go on",
            file=sys.stderr,
            flush=True,
        )
        logger = member.logger
        if logger is not None and hasattr(logger, "final_status"):
            logger.final_status = "failed"
            if run_id is not None and not getattr(logger, "refused", False):
                try:
                    logger.experiment.set_terminated(run_id, "FAILED")
                except Exception as err:  # noqa: BLE001 - training goes on; finalize marks it again
                    print(f"vaco: could not mark the MLflow run {run_id} FAILED: {err}", file=sys.stderr, flush=True)

    @property
    def stopped_members(self) -> list[int]:
        """The members that stopped alone (a non-finite loss)."""
        return sorted(self.data.stopped) if self.data is not None else []

    @staticmethod
    def _normalizer(members: Sequence[VacoModule]):
        """Each member's frozen normaliser applied to its ``[S, B, obs]`` rows, as ``_normalize`` is."""
        if not members[0].hparams.normalize_observation:
            return lambda obs: obs
        shift = torch.stack([m.frozen_normalizer[0] for m in members]).unsqueeze(1)
        inv_scale = torch.stack([m.frozen_normalizer[1] for m in members]).unsqueeze(1)
        return lambda obs: apply_normalizer(obs, shift, inv_scale)

    def _progress(self, members: Sequence[VacoModule]) -> dict[str, str]:
        data = members[0].data
        steps = int(self.version) * data.batch_size
        sps = sum(float(m.last_metrics.get("perf/sps", 0.0)) for m in members)
        progress = {
            "steps": f"{short_count(steps)}/{short_count(data.num_iterations() * data.batch_size)} x{len(members)}"
        }
        progress["sps"] = f"{sps:.0f}"
        scores = [m.last_eval_return for m in members if not math.isnan(m.last_eval_return)]
        if scores:
            progress["eval"] = f"{np.mean(scores):.1f} [{min(scores):.1f}, {max(scores):.1f}]"
        return progress

    # ------------------------------------------------------------------ evaluation (per member, in end_iteration)
    def should_evaluate(self) -> bool:
        return self.members[0].should_evaluate()

    def evaluate(self) -> dict[str, float]:
        scores = [member.evaluate()["eval/return"] for member in self.members]
        return {"eval/return": float(np.mean(scores))}

    @property
    def last_score(self) -> float:
        scores = [m.last_eval_return for m in self.members]
        return float("nan") if any(math.isnan(s) for s in scores) else float(np.mean(scores))

    def summary(self) -> str | None:
        stopped = set(self.stopped_members)
        scores = [m.last_eval_return for i, m in enumerate(self.members) if i not in stopped]
        failed = [f"s{self.seeds[m]} FAILED" for m in sorted(stopped)]
        if not scores or any(math.isnan(s) for s in scores):
            return None
        each = [f"s{seed} {m.last_eval_return:.1f}" for i, (seed, m) in enumerate(zip(self.seeds, self.members))]
        each = [text if i not in stopped else f"s{self.seeds[i]} FAILED" for i, text in enumerate(each)]
        done = f"{len(scores)} members" + (f" ({len(failed)} stopped on a non-finite loss)" if failed else "")
        return f"final {self.score_metric} of {done}: mean {np.mean(scores):.1f} ({', '.join(each)})"

    # ------------------------------------------------------------------ checkpoints
    def budget(self) -> int:
        return self.members[0].budget()

    def extra_state(self) -> dict[str, Any]:
        members = []
        for member in self.members:
            state = member.extra_state()
            state["torch_rng"] = torch.get_rng_state()
            state["mlflow_run_id"] = getattr(member.logger, "run_id", None)
            members.append(state)
        return {
            "numpy_rng": numpy_rng_state(),
            "python_rng": members[0]["python_rng"],
            "total_steps": self.budget(),
            "population_id": self.population_id,
            "population_seeds": list(self.seeds),
            "members": members,
            "update_exact": None if self.updater is None else self.updater.exact,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        spec = checkpoint["hyper_parameters"]["env_spec"]
        for member in self.members:
            if member.actor is None:
                member.build_networks(spec)
        super().on_load_checkpoint(checkpoint)
        if self._restored and self._trainer is not None and self._saved_budget is not None:
            if self.budget() > self._saved_budget:
                reopen_finished_epoch(checkpoint)

    def restore_state(self, state: dict[str, Any]) -> None:

        saved = state["members"]
        if len(saved) != len(self.members):
            raise ValueError(f"the checkpoint holds {len(saved)} members, this population has {len(self.members)}")
        for member, member_state in zip(self.members, saved):
            member.restore_state(member_state)
        super().restore_state(state)
        set_numpy_rng_state(state["numpy_rng"])
        random.setstate((3, tuple(state["python_rng"]), None))
        self.population_id = state["population_id"]
        self._saved_budget = state.get("total_steps")
        saved_exact = state["update_exact"]  # None: saved before the first update chose a layout
        self._update_exact = saved_exact if saved_exact is not None else self._update_exact


def _mean_metrics(each: Sequence[dict[str, float]]) -> dict[str, float]:
    """The members' metrics averaged, key by key, where every member logged the key (for the log line)."""
    keys = set.intersection(*(set(m) for m in each)) if each else set()
    return {key: float(np.mean([m[key] for m in each])) for key in keys}
