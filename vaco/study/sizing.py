"""Sizing a study plan by simulating the test it declares, and the null simulations that check a
test holds its size.

**Power from a pilot, with the pilot's uncertainty** (:func:`simulate_plan`). A pilot is, for each
comparison, the paired units of its four cells, ``(x_ref, x_K, y_ref, y_K)`` per (seed, task), as
the report pairs them (normalised by the plan's fixed references). A simulated study first draws a
*world* from the pilot (each task's pilot units resampled with replacement: a pilot of 10 seeds
could have come from many worlds, and a world drawn this way is one of them), then draws the study's
seeds from that world (with replacement, each unit whole, so a seed's four runs stay together), and
judges each look exactly as the report does: the declared test's p (the studentised randomisation
test, or the percentile bootstrap) for every open comparison, the group-sequential Holm step-down
(:func:`vaco.study.plan.sequential_holm`), a comparison decided at a look staying decided and
later looks running only the open ones. With ``uncertainty=False`` the world is the pilot itself
(the usual plug-in power, optimistic when the pilot is small). The heavy tails and collapsing seeds
of the pilot are in every world; a normal model would leave them out.

Comparisons are simulated independently (Holm's error control holds under any dependence; power
with a shared control arm is close to this). A comparison whose arms ran on different seeds in the
pilot (different data files) draws each arm's (K_ref, K) pairs from its own pilot runs, which leaves
out the seed's correlation between arms.

**Size by label swaps** (:func:`null_study`, :func:`first_look_rates`): a null study gives every
(seed, task) unit of committed runs a random permutation of its arms' (K_ref, K) pairs, so every
comparison of a family with a shared control is null and keeps the heavy tails of the real data;
``shift`` adds a level to the non-control arms at both K (a null of equal drops, unequal levels).
``tests/test_plan_size.py`` uses them.

**Size of the whole rule where the arms differ in shape** (:func:`equal_drop_null`,
:func:`sequential_null_rates`): label swaps make every arm the control's distribution, which hides
what a swap test meets when the arms differ in spread and tails (a heavy-tailed correction against
PPO-clip). Here each arm keeps its own runs: a study draws each arm's ``(K_ref, K)`` pairs from that
arm's own committed seeds (with replacement, per task), and every arm but the control has its K
scores moved by one constant so that its drop (the IQM over its seeds x tasks at ``K_ref`` minus at
``K``, of the whole committed cell) equals the control's: equal drops, unequal levels, spreads and
tails. Each study is judged at every look by the group-sequential Holm rule, a comparison decided
at a look staying decided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from vaco.study.plan import holm_levels, sequential_holm

__all__ = [
    "Pilot",
    "equal_drop_null",
    "first_look_rates",
    "null_rates_by_test",
    "null_study",
    "plan_p",
    "plan_ps",
    "sequential_null_rates",
    "simulate_plan",
    "units",
]


@dataclasses.dataclass(frozen=True)
class Pilot:
    """One comparison's pilot: ``units`` is (4, seeds, tasks), the cells (x_ref, x_K, y_ref, y_K) paired
    by seed; or, for arms with no common seeds (``paired=False``), ``units`` holds the arm's two cells
    and ``control`` the other's (2, seeds, tasks) each, drawn independently of each other."""

    label: str
    units: np.ndarray
    control: np.ndarray | None = None

    @property
    def paired(self) -> bool:
        return self.control is None

    def draw(self, rng: np.random.Generator, seeds: int, uncertainty: bool) -> np.ndarray:
        """A study's (4, seeds, tasks) cells: a world resampled from the pilot (``uncertainty``),
        then the study's seeds from it, each unit whole (a seed's runs stay together)."""
        parts = [self.units] if self.paired else [self.units, self.control]
        out = []
        for part in parts:
            cells, n, tasks = part.shape
            world = part
            if uncertainty:
                world = np.take_along_axis(part, rng.integers(0, n, size=(1, n, tasks)).repeat(cells, axis=0), axis=1)
            rows = rng.integers(0, n, size=(1, seeds, tasks)).repeat(cells, axis=0)
            out.append(np.take_along_axis(world, rows, axis=1))
        return np.concatenate(out, axis=0)


def plan_p(test: str, *args, **kwargs) -> float:
    """The two-sided p of "no difference of drops" by ``test`` (one of the plan's tests): :func:`plan_ps`
    for that test alone (the same arguments after ``tests``)."""
    return plan_ps((test,), *args, **kwargs)[test]


TESTS = ("randomisation", "randomisation+bootstrap-t", "bootstrap", "bootstrap-t", "randomisation-raw")


def plan_ps(
    tests: Sequence[str],
    cells,
    margin: float | None,
    seed: int,
    swaps: int = 999,
    reps: int = 2000,
    estimand: str = "pooled",
) -> dict[str, float]:
    """:func:`plan_p` of each of ``tests`` on the same cells, each part computed once:
    ``randomisation+bootstrap-t`` is :func:`~vaco.study.randomisation.agreement_p`'s larger p of its two
    parts, on the same patterns and resamples as each alone. ``bootstrap-t`` and ``randomisation-raw``
    (the unstudentised D) are measured for comparison only."""
    from vaco.study.randomisation import bootstrap_p, bootstrap_t_p, randomisation_p

    unknown = [t for t in tests if t not in TESTS]
    if unknown:
        raise ValueError(f"test must be randomisation, randomisation+bootstrap-t or bootstrap, got {unknown[0]!r}")
    e, parts = estimand, {}

    def part(name: str) -> float:
        if name not in parts:
            if name == "bootstrap":
                parts[name] = bootstrap_p(cells, 0.05 if margin is None else margin, reps=reps, seed=seed, estimand=e)[
                    0
                ]
            elif name == "bootstrap-t":
                parts[name] = bootstrap_t_p(cells, None, reps=swaps, seed=seed, estimand=e)[0]
            else:
                studentise = name == "randomisation"
                parts[name] = randomisation_p(cells, None, swaps, seed, studentise=studentise, estimand=e)[0]
        return parts[name]

    return {
        t: max(part("randomisation"), part("bootstrap-t")) if t == "randomisation+bootstrap-t" else part(t)
        for t in tests
    }


@dataclasses.dataclass(frozen=True)
class Power:
    looks: tuple[int, ...]
    differs: np.ndarray  # per comparison: P(differs by the last look)
    differs_at: np.ndarray  # (looks x comparisons): P(decided "differs" by look k)
    mean_stop: float  # the mean seeds a cell at which every comparison was decided (or the last look)


def simulate_plan(
    pilots: Sequence[Pilot],
    looks: Sequence[int],
    alpha: float = 0.05,
    spending: str = "pocock",
    test: str = "randomisation",
    studies: int = 400,
    seed: int = 0,
    uncertainty: bool = True,
    swaps: int = 999,
    estimand: str = "pooled",
) -> Power:
    """The plan's power: see the module docstring. ``swaps``: patterns per randomisation p (valid at
    any number; fewer make p coarser, so the power is, if anything, understated)."""
    rng = np.random.default_rng(seed)
    m = len(pilots)
    levels = holm_levels(list(looks), alpha, spending, m)
    last = looks[-1]
    hits = np.zeros((len(looks), m))
    stops = []
    for study in range(studies):
        data = [pilot.draw(rng, last, uncertainty) for pilot in pilots]
        rejected = [False] * m
        stop = last
        for k, n_k in enumerate(looks):
            p = [
                1.0
                if rejected[c]
                else plan_p(test, tuple(data[c][:, :n_k]), None, study * 31 + k, swaps, estimand=estimand)
                for c in range(m)
            ]
            rejected = sequential_holm(p, levels, k, rejected)
            hits[k] += rejected
            if all(rejected):
                stop = n_k
                hits[k + 1 :] += rejected
                break
        stops.append(stop)
    return Power(tuple(looks), hits[-1] / studies, hits / studies, float(np.mean(stops)))


def units(
    runs, arms: Sequence[str], ks: tuple[int, int], references: dict[str, tuple[float, float]], metric: str
) -> np.ndarray:
    """(arm, K, seed, task) final scores of ``metric`` normalised by fixed ``references`` ({task:
    (min, max)}), on the seeds every arm has at both K on every task (sorted)."""
    finals = {}
    for r in runs:
        if r.env in references and r.algorithm in arms and r.K in ks:
            low, high = references[r.env]
            finals[(r.algorithm, r.K, r.seed, r.env)] = (float(r.histories[metric][1][-1]) - low) / (high - low)
    tasks = list(references)
    seeds = sorted(
        s for s in {key[2] for key in finals} if all((a, k, s, t) in finals for a in arms for k in ks for t in tasks)
    )
    return np.array(
        [[[[finals[(a, k, s, t)] for t in tasks] for s in seeds] for k in ks] for a in arms], dtype=np.float64
    )


def null_study(rng: np.random.Generator, data: np.ndarray, shift: float = 0.0) -> np.ndarray:
    """``data`` (arm, K in (ref, K), seed, task) with every unit's arms permuted at random; ``shift``
    added to every arm but the first (the control) at both K: their levels differ, their drops do
    not (the IQM moves by exactly ``shift``)."""
    arms, _, seeds, tasks = data.shape
    order = rng.permuted(np.tile(np.arange(arms)[:, None, None], (1, seeds, tasks)), axis=0)
    out = np.take_along_axis(data, np.repeat(order[:, None], 2, axis=1), axis=0)
    return out + shift * (np.arange(arms) > 0)[:, None, None, None]


def first_look_rates(
    data: np.ndarray,
    test: str,
    looks: Sequence[int],
    alpha: float,
    studies: int,
    seed: int,
    shift: float = 0.0,
    swaps: int = 499,
) -> tuple[int, np.ndarray, float]:
    """Label-swapped null studies of ``data`` (the control first) judged at the first of ``looks``
    (Pocock) with every other arm against the control: the studies with any "differs", every
    comparison's p, and the first Holm step's level."""
    m = data.shape[0] - 1
    levels = holm_levels(list(looks), alpha, "pocock", m)
    rng = np.random.default_rng(seed)
    family_hits, ps = 0, []
    for s in range(studies):
        study = null_study(rng, data, shift)
        p = [
            plan_p(test, (study[a, 0], study[a, 1], study[0, 0], study[0, 1]), 0.05, s, swaps) for a in range(1, m + 1)
        ]
        family_hits += any(sequential_holm(p, levels, 0))
        ps += p
    return family_hits, np.asarray(ps), levels[m - 1][0]


def equal_drop_null(data: np.ndarray, estimand: str = "pooled") -> np.ndarray:
    """``data`` (arm, K in (ref, K), seed, task), the control first, with every other arm's K scores
    moved by the constant that makes its drop (IQM of its whole cell at ref minus at K) the control's;
    for the ``task-mean`` estimand, each task's K scores by the constant that makes that task's drop
    (IQM over its seeds) the control's there, so every task is null, not only their mean."""
    from vaco.report.robustness import iqm

    out = data.copy()
    if estimand == "task-mean":
        by_task = np.swapaxes(data, -1, -2)[..., None]  # arm, K, task, seed, 1
        drops = iqm(by_task[:, 0]) - iqm(by_task[:, 1])  # (arm, task)
        out[1:, 1] += (drops[1:] - drops[0])[:, None, :]
        return out
    drops = iqm(data[:, 0]) - iqm(data[:, 1])  # per arm, over seeds x tasks
    out[1:, 1] += (drops[1:] - drops[0])[:, None, None]  # IQM(x + c) = IQM(x) + c
    return out


@dataclasses.dataclass(frozen=True)
class NullRates:
    """What :func:`sequential_null_rates` counts over its null studies."""

    studies: int
    family: int  # studies with any "differs" at any look
    per_look: np.ndarray  # (looks, comparisons): the studies whose comparison's p met the first Holm step's level there
    first_levels: tuple[float, ...]  # that level at each look (alpha / m's boundary)


def sequential_null_rates(data: np.ndarray, test: str, *args, **kwargs) -> NullRates:
    """Null studies of ``data`` (arm, K in (ref, K), seed, task; the control first), each arm drawing
    its own seeds (:func:`equal_drop_null`: equal drops), judged at every look (Pocock) by the
    group-sequential Holm rule with every other arm against the control, by ``test``: counts the
    studies with any "differs" and, per comparison, where its p met the smallest level the rule uses
    (the first Holm step's, alpha / m's boundary). :func:`null_rates_by_test` for one test (the same
    arguments after ``tests``: looks, alpha, studies, seed, swaps, estimand)."""
    return null_rates_by_test(data, (test,), *args, **kwargs)[test]


def null_rates_by_test(
    data: np.ndarray,
    tests: Sequence[str],
    looks: Sequence[int],
    alpha: float,
    studies: int,
    seed: int,
    swaps: int = 1999,
    estimand: str = "pooled",
) -> dict[str, NullRates]:
    """:func:`sequential_null_rates` of several tests on the same null studies (each its own Holm
    rule), each p's parts computed once (:func:`plan_ps`): what each test gives alone, at the cost
    of the tests' distinct parts. ``swaps``: patterns a p (and as many bootstrap-t resamples)."""
    null = equal_drop_null(np.asarray(data, dtype=np.float64), estimand)
    arms, _, seeds, tasks = null.shape
    m = arms - 1
    levels = holm_levels(list(looks), alpha, "pocock", m)
    first = levels[m - 1]
    rng = np.random.default_rng(seed)
    family = dict.fromkeys(tests, 0)
    per_look = {t: np.zeros((len(looks), m), dtype=int) for t in tests}
    for s in range(studies):
        # each arm's own seeds, drawn per task; a seed's (ref, K) pair stays together
        rows = rng.integers(0, seeds, size=(arms, looks[-1], tasks))
        study = null[np.arange(arms)[:, None, None], :, rows, np.arange(tasks)[None, None, :]]  # arm, n, task, K
        study = np.moveaxis(study, -1, 1)  # arm, K, n, task
        rejected = {t: [False] * m for t in tests}
        for k, n in enumerate(looks):
            cells = study[:, :, :n]
            ps = [
                plan_ps(tests, (cells[a, 0], cells[a, 1], cells[0, 0], cells[0, 1]), 0.05, s * len(looks) + k, swaps,
                        estimand=estimand)
                for a in range(1, m + 1)
            ]  # fmt: skip
            for t in tests:
                p = [by_test[t] for by_test in ps]
                per_look[t][k] += np.asarray(p) <= first[k]
                rejected[t] = sequential_holm(p, levels, k, rejected[t])
        for t in tests:
            family[t] += any(rejected[t])
    return {t: NullRates(studies, family[t], per_look[t], tuple(first)) for t in tests}
