"""``vaco fit --population S``: S runs of one config that differ only by seed, trained in one process.

Member ``m`` is the run ``--seed_everything s_m`` alone, bit for bit (``tests/test_population_fit.py``):
its own actor and critic (initialised after ``seed_everything(s_m)``, as its solo run's), optimiser
state, policy-version buffer, observation normaliser, reward scaler, envs, random streams, MLflow run
and evaluation. What the members share is the work of one iteration:

1. **collection**: each member's own collector (its data module's, any backend) in turn;
2. **before the update**, per member: :meth:`vaco.VacoModule.begin_iteration` (the learner pass and
   the advantage: the solo code);
3. **the update**, batched: :class:`vaco.population.PopulationUpdate` (one ``baddbmm`` per layer for
   all members, the objective vmapped, Adam over the stacked parameters, clipping per member);
4. **after the update**, per member: :meth:`vaco.VacoModule.end_iteration` (forward lag, normaliser,
   the new policy version, metrics to the member's own MLflow run, its evaluation).

Where the member dimension lives: :class:`PopulationModule` holds the members (``members.{m}.*`` in
its state dict and checkpoint) and the stacked update; :class:`PopulationDataModule` holds each
member's :class:`~vaco.data.RolloutDataModule`. The checkpoint resumes every member; ``vaco evaluate
--ckpt ... --member m`` plays one. Each member's MLflow run is named and tagged as its solo run
would be, with the tags ``vaco.population`` (the population's id) and ``vaco.population_member``;
``vaco report`` reads them as any runs.

Not batched yet (each member in turn, exact either way): collection (one vector env of S x N envs and
one K-policy mixture call for all), the learner pass and the advantage. IMPALA (its advantage is
re-estimated before every optimiser step) and DDP are refused with one line.
"""

from __future__ import annotations

import copy
import math
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn

from vaco.checkpoint import reopen_finished_epoch
from vaco.data.normalization import OBS_CLIP
from vaco.learner import Learner, NonFiniteLossError
from vaco.population import PopulationUpdate
from vaco.update import TRAIN_KEYS
from vaco.vaco_module import VacoModule, _numpy_rng_state, _set_numpy_rng_state, _si

__all__ = ["PopulationModule", "PopulationDataModule", "population_seeds", "POPULATION_TAG", "MEMBER_TAG"]

#: the MLflow tags of a member's run: the population's id, and the member's index in it
POPULATION_TAG = "vaco.population"
MEMBER_TAG = "vaco.population_member"


def population_seeds(population: int | Sequence[int], seed: int) -> list[int]:
    """The members' seeds: ``population`` seeds from ``seed`` on (an int), or the given list.

    >>> population_seeds(3, 5)
    [5, 6, 7]
    """
    if isinstance(population, bool) or not isinstance(population, (int, list, tuple)):
        raise ValueError(f"`population` must be an integer >= 1 or a list of seeds, got {population!r}")
    if isinstance(population, int):
        if population < 1:
            raise ValueError(f"`population` must be an integer >= 1 or a list of seeds, got {population!r}")
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
    """The members' collectors as one loader: each ``next`` is every member's batch, collected in turn."""

    def __init__(self, collectors: Sequence[Any]) -> None:
        self.collectors = list(collectors)

    def __len__(self) -> int:
        return min(len(c) for c in self.collectors)

    def __iter__(self) -> Iterator[list]:
        iterators = [iter(c) for c in self.collectors]
        while True:
            try:
                yield [next(it) for it in iterators]
            except StopIteration:
                return


class PopulationDataModule(L.LightningDataModule):
    """The members' own :class:`~vaco.data.RolloutDataModule` s (one per seed), as one data module."""

    def __init__(self, members: Sequence[L.LightningDataModule]) -> None:
        super().__init__()
        self.members = list(members)

    def __getattr__(self, name: str):
        # what is the same for every member (env_id, sizes, the budget): member 0's
        if name != "members" and "members" in self.__dict__:
            return getattr(self.__dict__["members"][0], name)
        raise AttributeError(name)

    @property
    def batch_size(self) -> int:
        return self.members[0].batch_size

    def num_iterations(self) -> int:
        return self.members[0].num_iterations()

    def train_dataloader(self):
        return _Members([m.collector for m in self.members])

    def teardown(self, stage: str) -> None:
        for member in self.members:
            member.teardown(stage)

    def on_exception(self, exception: BaseException) -> None:
        for member in self.members:
            member.on_exception(exception)

    def state_dict(self) -> dict[str, Any]:
        return {"members": [member.state_dict() for member in self.members]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("members", [])
        if len(saved) != len(self.members):
            raise ValueError(
                f"the checkpoint holds {len(saved)} members' data, this population has {len(self.members)}"
            )
        for member, state in zip(self.members, saved):
            member.load_state_dict(state)


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
        self._saved_budget: int | None = None

    @staticmethod
    def check_model(model) -> None:
        """Refuse, in one line naming ``population``, a model a population cannot train."""
        if not isinstance(model, VacoModule):
            raise ValueError(
                f"`population`: populations train vaco.VacoModule runs (MuJoCo), not {type(model).__name__}"
            )
        if model.objective.reestimate_advantage:
            raise ValueError(
                f"`population`: {type(model.objective).__name__} (IMPALA) re-estimates its advantage before every "
                "optimiser step and is not batched yet; run its seeds as separate runs (population 1)"
            )

    @classmethod
    def from_run(cls, model: VacoModule, data, seeds: Sequence[int]) -> tuple[PopulationModule, PopulationDataModule]:
        """The population of ``seeds`` from one run's model and data module (before any fit)."""
        cls.check_model(model)
        members, datas = [], []
        for seed in seeds:
            member, member_data = copy.deepcopy(model), copy.deepcopy(data)
            member_data.seed = seed
            member_data.hparams["seed"] = seed
            if getattr(member_data, "_hparams_initial", None) is not None:  # what Lightning logs as params
                member_data._hparams_initial["seed"] = seed
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
            [m._generator for m in self.members],
            update_epochs=hp.update_epochs,
            num_minibatches=hp.num_minibatches,
            max_grad_norm=hp.max_grad_norm,
            lr=hp.lr,
            adam_eps=hp.adam_eps,
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
        for member in self.members:  # each member's own start: its generator, version 0, its params
            member.on_fit_start()
            if member.logger is not None:
                member.logger.log_hyperparams(dict(member.data.hparams_initial))

    # ------------------------------------------------------------------ the iteration
    def training_step(self, dataloader_iter) -> None:
        batches, _, _ = next(dataloader_iter)
        members = list(self.members)
        steps = [member.begin_iteration(batch) for member, batch in zip(members, batches)]
        lr = self.optimizers().param_groups[0]["lr"]
        start = time.perf_counter()
        train = {key: torch.stack([step.flat[key] for step in steps]) for key in TRAIN_KEYS}
        normalize = self._normalizer(members)
        means, finite = self.updater.update(train, normalize)
        bad = [m for m, ok in enumerate(finite) if not ok]
        if bad:
            raise NonFiniteLossError(
                f"non-finite loss at iteration {int(self.version) + 1} in population member(s) "
                f"{', '.join(f'{m} (seed {self.seeds[m]})' for m in bad)}: that step was skipped and the population "
                "stops; the last good checkpoint is kept"
            )
        self.updater.write_back([m.actor for m in members], [m.critic for m in members])
        self.lr_schedulers().step()
        shared = (time.perf_counter() - start) / len(members)
        for member, step, member_means in zip(members, steps, means):
            step.seconds += shared
            member.end_iteration(step, member_means, lr)
        self.version += 1
        self.last_metrics = _mean_metrics([m.last_metrics for m in members])
        self.progress = self._progress(members)

    @staticmethod
    def _normalizer(members: Sequence[VacoModule]):
        """Each member's frozen normaliser applied to its ``[S, B, obs]`` rows, as ``_normalize`` is."""
        if not members[0].hparams.normalize_observation:
            return lambda obs: obs
        shift = torch.stack([m._norm_cache[0] for m in members]).unsqueeze(1)
        inv_scale = torch.stack([m._norm_cache[1] for m in members]).unsqueeze(1)
        return lambda obs: ((obs - shift) * inv_scale).clamp(-OBS_CLIP, OBS_CLIP)

    def _progress(self, members: Sequence[VacoModule]) -> dict[str, str]:
        data = members[0].data
        steps = int(self.version) * data.batch_size
        sps = sum(float(m.last_metrics.get("perf/sps", 0.0)) for m in members)
        progress = {"steps": f"{_si(steps)}/{_si(data.num_iterations() * data.batch_size)} x{len(members)}"}
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
        scores = [m.last_eval_return for m in self.members]
        if any(math.isnan(s) for s in scores):
            return None
        each = ", ".join(f"s{seed} {score:.1f}" for seed, score in zip(self.seeds, scores))
        return f"final {self.score_metric} of {len(scores)} members: mean {np.mean(scores):.1f} ({each})"

    # ------------------------------------------------------------------ checkpoints
    def _budget(self) -> int:
        return self.members[0]._budget()

    def extra_state(self) -> dict[str, Any]:
        members = []
        for member in self.members:
            state = member.extra_state()
            state["torch_rng"] = torch.get_rng_state()
            state["mlflow_run_id"] = getattr(member.logger, "run_id", None)
            members.append(state)
        return {
            "numpy_rng": _numpy_rng_state(),
            "python_rng": members[0]["python_rng"],
            "total_steps": self._budget(),
            "population_id": self.population_id,
            "population_seeds": list(self.seeds),
            "members": members,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        spec = checkpoint["hyper_parameters"]["env_spec"]
        for member in self.members:
            if member.actor is None:
                member._build(spec)
        super().on_load_checkpoint(checkpoint)
        if self._restored and self._trainer is not None and self._saved_budget is not None:
            if self._budget() > self._saved_budget:
                reopen_finished_epoch(checkpoint)

    def restore_state(self, state: dict[str, Any]) -> None:
        import random

        saved = state["members"]
        if len(saved) != len(self.members):
            raise ValueError(f"the checkpoint holds {len(saved)} members, this population has {len(self.members)}")
        for member, member_state in zip(self.members, saved):
            member.restore_state(member_state)
        super().restore_state(state)
        _set_numpy_rng_state(state["numpy_rng"])
        random.setstate((3, tuple(state["python_rng"]), None))
        self.population_id = state["population_id"]
        self._saved_budget = state.get("total_steps")


def _mean_metrics(each: Sequence[dict[str, float]]) -> dict[str, float]:
    """The members' metrics averaged, key by key, where every member logged the key (for the log line)."""
    keys = set.intersection(*(set(m) for m in each)) if each else set()
    return {key: float(np.mean([m[key] for m in each])) for key in keys}
