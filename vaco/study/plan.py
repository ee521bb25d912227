"""A study plan, declared before the runs: the primary family, the margin, alpha, the looks and the
spending rule; and the two pieces of statistics a plan needs beyond a single comparison.

* **Group-sequential boundaries** (:func:`boundaries`): a study that looks at its data at several
  seed counts and stops at the first "differs" has a false-"differs" rate above alpha unless each look
  is judged against a boundary that spends alpha across the looks. For two-sided tests with looks at
  information fractions ``t_k = n_k / n_K``, ``Z_k`` is a standardised Brownian motion at ``t_k``
  (``corr(Z_i, Z_j) = sqrt(t_i / t_j)``); the boundary ``c_k`` is found so that
  ``P(|Z_k| >= c_k for some k) = alpha`` under the null:

  - ``pocock``: the same ``c`` at every look (Pocock 1977);
  - ``obrien-fleming``: ``c_k = c / sqrt(t_k)``, strict early, nearly alpha at the end (O'Brien and
    Fleming 1979);
  - ``fixed``: one look, the last, at alpha.

  The crossing probability is computed exactly up to quadrature error by the recursive numerical
  integration of Armitage, McPherson and Rowe (1969) on a grid of the partial sums (no simulation),
  and ``c`` by bisection. The nominal level of look k is ``2 (1 - Phi(c_k))``: a comparison is decided
  at look k at that level. ``tests/test_plan.py`` checks the constants against Jennison and
  Turnbull's tables and, independently, the rule's error rate by simulation.

* **Holm's step-down correction at group-sequential levels** (:func:`sequential_holm`): the
  group-sequential Holm procedure of Ye, Li, Liu and Yao (2013, *Statistics in Medicine* 32:1112),
  the Holm graph of Maurer and Bretz (2013, *Statistics in Biopharmaceutical Research* 5:311). At a
  look, the ``r`` hypotheses not yet rejected are sorted by p; the i-th smallest (i = 0, 1, ...) is
  rejected when its p is at most the look's nominal level **of a boundary computed for alpha / (r - i)**
  (:func:`holm_levels`) and every smaller one was; a hypothesis rejected at a look stays rejected, and
  its share of alpha passes to the others at later looks. The family-wise error rate stays at alpha
  over every look and whatever the comparisons' dependence. (Holm's adjusted p-values judged against
  the alpha-level boundary, a tempting shortcut, do not: with four comparisons and four looks their
  family-wise rate is 5.4%; ``tests/test_plan.py`` shows both.) :func:`holm` is the one-look
  step-down, kept for the report's exploratory tables.

* **What a look can decide** (:func:`smallest_p`): with few seeds the report's exact sign-flip test
  cannot give a p below ``2 / 2^(seeds x tasks)``; a look whose first Holm level is below that can
  never say "differs". :func:`undecidable_looks` names such looks and the least seeds that could.

Everything outside the declared family is exploratory and is labelled so.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.stats import norm

from vaco.report.decision import holm  # the one-look step-down, kept for the report's exploratory tables

__all__ = [
    "SPENDING",
    "TESTS",
    "StudyPlan",
    "boundaries",
    "crossing_probability",
    "holm",
    "holm_levels",
    "load_plan",
    "nominal_levels",
    "schedule",
    "score_settings",
    "sequential_holm",
    "smallest_p",
    "undecidable_looks",
]

MAX_LOOKS = 10  # looks a plan may declare: 10 Pocock looks take ~1 s to bound, 200 took 27 s
SPENDING = ("pocock", "obrien-fleming", "fixed")
TESTS = (
    "randomisation",
    "randomisation+bootstrap-t",
    "bootstrap",
)  # what a look's p comes from (vaco.study.randomisation)
_GRID = 401  # quadrature points per look (Simpson's rule on the continuation region)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One primary comparison: ``arm``'s drop from its own K = 1 against ``against``'s, at ``K``."""

    arm: str
    against: str
    K: int

    def label(self) -> str:
        return f"{self.arm} vs {self.against} at K={self.K}"


@dataclasses.dataclass(frozen=True)
class StudyPlan:
    family: tuple[Comparison, ...]
    margin: float
    alpha: float
    looks: tuple[int, ...]
    spending: str
    score: str = "final"  # the report's score: "final" (last evaluation), "last-N" (mean of the last N) or "auc"
    references: tuple[tuple[str, float, float], ...] = ()  # (task, min, max): fixed normalisation
    floor: float | None = None  # both arms' IQM at K below this (normalised): "at the floor", not judged
    test: str = "bootstrap"  # one of TESTS: "randomisation", "randomisation+bootstrap-t" or "bootstrap" (percentile)
    estimand: str = "pooled"  # one of vaco.study.randomisation.ESTIMANDS: "pooled" IQM or "task-mean"

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["family"] = [dataclasses.asdict(c) for c in self.family]
        out["references"] = {task: [low, high] for task, low, high in self.references}
        if self.floor is None:  # a plan without a floor keeps the identity it had before the field existed
            del out["floor"]
        if self.test == "bootstrap":  # likewise a plan judged by the bootstrap, declared before `test` existed
            del out["test"]
        if self.estimand == "pooled":  # and a pooled plan, declared before `estimand` existed
            del out["estimand"]
        return out

    @property
    def digest(self) -> str:
        """The plan's identity: a change of any field is a different plan."""
        return hashlib.sha1(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def levels(self) -> list[float]:
        """The nominal two-sided level of each look (0 where a look cannot decide)."""
        return nominal_levels(self.looks, self.alpha, self.spending)

    def look_of(self, seeds: int) -> int | None:
        """The index of the last look that ``seeds`` per cell reach (None before the first)."""
        reached = [k for k, n in enumerate(self.looks) if seeds >= n]
        return reached[-1] if reached else None


def score_settings(score: str) -> tuple[str, int]:
    """A plan's ``score`` as the report's (score, last_evals): ``final`` -> ("final", 1), ``auc`` ->
    ("auc", 1), ``last-N`` (N >= 2) -> ("last-n", N). A ValueError for anything else."""
    if score in ("final", "auc"):
        return score, 1
    head, _, n = str(score).partition("-")
    if head == "last" and n.isdigit() and int(n) >= 2 and str(int(n)) == n:
        return "last-n", int(n)
    raise ValueError(f"not a plan score: {score!r}")


def load_plan(
    raw: Any,
    algorithms: Sequence[str],
    ks: Sequence[int],
    seeds: int,
    field: str = "plan",
    default_test: str | None = None,
) -> StudyPlan:
    """A plan from the sweep file's ``plan`` block; a bad value is a ValueError naming the field.
    ``algorithms`` and ``ks`` are the sweep's own (a comparison must be in the grid); ``seeds`` is
    the most seeds a cell of the grid has (the last look must not need more). A plan must declare its
    ``test``; ``default_test`` is for plans recorded before the field existed (they were judged by
    the bootstrap)."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"`{field}` must be a mapping (family, margin, alpha, looks, spending, test), got {raw!r}")
    known = {"family", "margin", "alpha", "looks", "spending", "score", "references", "floor", "test", "estimand"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"`{field}.{unknown[0]}` is not a plan field (fields: {', '.join(sorted(known))})")
    family_raw = raw.get("family")
    if not isinstance(family_raw, list) or not family_raw:
        raise ValueError(f"`{field}.family` must list the primary comparisons ({{arm, against, K}} each)")
    family = []
    for i, item in enumerate(family_raw):
        where = f"{field}.family[{i}]"
        if not isinstance(item, Mapping) or set(item) != {"arm", "against", "K"}:
            raise ValueError(f"`{where}` must be {{arm: ALGORITHM, against: ALGORITHM, K: INT}}, got {item!r}")
        for key in ("arm", "against"):
            if item[key] not in algorithms:
                raise ValueError(
                    f"`{where}.{key}` ({item[key]!r}) is not an algorithm of this sweep ({', '.join(algorithms)})"
                )
        if item["arm"] == item["against"]:
            raise ValueError(f"`{where}` compares {item['arm']!r} with itself; name two different arms")
        if item["K"] not in ks or item["K"] == 1:
            raise ValueError(f"`{where}.K` ({item['K']!r}) must be one of the sweep's K values other than 1 ({ks})")
        family.append(Comparison(str(item["arm"]), str(item["against"]), int(item["K"])))
    if len(set(family)) != len(family):
        raise ValueError(f"`{field}.family` lists a comparison twice")
    margin = raw.get("margin", 0.05)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < 1:
        raise ValueError(f"`{field}.margin` must be a number in (0, 1) (normalised score units), got {margin!r}")
    alpha = raw.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 0.5:
        raise ValueError(f"`{field}.alpha` must be a number in (0, 0.5), got {alpha!r}")
    looks = raw.get("looks")
    if (
        not isinstance(looks, list)
        or not looks
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 2 for n in looks)
        or any(b <= a for a, b in zip(looks, looks[1:]))
    ):
        raise ValueError(f"`{field}.looks` must be increasing seed counts >= 2 (e.g. [10, 20, 30]), got {looks!r}")
    if len(looks) > MAX_LOOKS:
        raise ValueError(
            f"`{field}.looks`: {len(looks)} looks; a group-sequential plan takes at most {MAX_LOOKS} (each look "
            "spends alpha, and the boundary of many looks takes minutes to compute): read the results less often"
        )
    if looks[-1] > seeds:
        raise ValueError(f"`{field}.looks`: the last look needs {looks[-1]} seeds a cell, the grid has {seeds}")
    spending = raw.get("spending", "pocock" if len(looks) > 1 else "fixed")
    if spending not in SPENDING:
        raise ValueError(f"`{field}.spending` must be one of {', '.join(SPENDING)}, got {spending!r}")
    if spending == "fixed" and len(looks) > 1:
        raise ValueError(f"`{field}.spending`: fixed is one look; with {len(looks)} looks use pocock or obrien-fleming")
    score = raw.get("score", "final")
    try:
        score_settings(score)
    except ValueError:
        raise ValueError(
            f"`{field}.score` must be final (the last evaluation), last-N (the mean of the last N >= 2 "
            f"evaluations, e.g. last-3) or auc, got {score!r}"
        ) from None
    references = []
    for task, bounds in (raw.get("references") or {}).items():
        if not (isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, (int, float)) for b in bounds)):
            raise ValueError(f"`{field}.references.{task}` must be [min, max] (fixed numbers), got {bounds!r}")
        if not bounds[0] < bounds[1]:
            raise ValueError(f"`{field}.references.{task}`: min ({bounds[0]}) must be below max ({bounds[1]})")
        references.append((str(task), float(bounds[0]), float(bounds[1])))
    floor = raw.get("floor")
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor < 1):
        raise ValueError(
            f"`{field}.floor` must be a normalised score in (0, 1) (both arms' IQM at K below it: not judged), "
            f"got {floor!r}"
        )
    test = raw.get("test", default_test)
    if test not in TESTS:
        raise ValueError(
            f"`{field}.test` must be declared: randomisation (studentised label swaps, exact under the sharp null), "
            f"randomisation+bootstrap-t (both must agree; holds its size for heavy-tailed arms too) or bootstrap "
            f"(percentile; liberal at small first looks), got {test!r}"
        )
    from vaco.study.randomisation import ESTIMANDS

    estimand = raw.get("estimand", "pooled")
    if estimand not in ESTIMANDS:
        raise ValueError(
            f"`{field}.estimand` must be pooled (one IQM over every seed and task of a cell) or task-mean (each "
            f"task's difference of drops over its own seeds, averaged over the tasks: every task weighs alike), "
            f"got {estimand!r}"
        )
    if estimand == "task-mean" and not references:
        raise ValueError(
            f"`{field}.estimand: task-mean` averages differences across tasks, so their units must not move with "
            f"the runs: declare `{field}.references` ({{task: [min, max]}}) for every task"
        )
    return StudyPlan(
        tuple(family),
        float(margin),
        float(alpha),
        tuple(looks),
        spending,
        score,
        tuple(references),
        None if floor is None else float(floor),
        str(test),
        str(estimand),
    )


# ------------------------------------------------------------------------------ boundaries
def _bounds(looks: Sequence[int], c: float, spending: str) -> np.ndarray:
    t = np.asarray(looks, dtype=np.float64) / looks[-1]
    if spending == "pocock":
        return np.full(len(looks), c)
    if spending == "obrien-fleming":
        return c / np.sqrt(t)
    return np.r_[np.full(len(looks) - 1, np.inf), c]  # fixed: only the last look decides


def crossing_probability(looks: Sequence[int], bounds: Sequence[float]) -> float:
    """``P(|Z_k| >= bounds[k] for some k)`` under the null for looks at seed counts ``looks``
    (Armitage-McPherson-Rowe recursion on the partial sums ``S_k ~ N(0, n_k)``, Simpson's rule)."""
    n = np.asarray(looks, dtype=np.float64)
    density = None
    grid = None
    for k, (nk, ck) in enumerate(zip(n, bounds)):
        half = min(ck, 12.0) * math.sqrt(nk)  # the continuation region |S_k| < c_k sqrt(n_k)
        points = np.linspace(-half, half, _GRID)
        if density is None:
            new = _pdf(points / math.sqrt(nk)) / math.sqrt(nk)
        else:
            step = math.sqrt(nk - n[k - 1])
            kernel = _pdf((points[:, None] - grid[None, :]) / step) / step
            new = kernel @ (density * _simpson_weights(grid))
        density, grid = new, points
    return float(1.0 - np.sum(density * _simpson_weights(grid)))


def _pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _simpson_weights(points: np.ndarray) -> np.ndarray:
    h = points[1] - points[0]
    w = np.ones(len(points))
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w * h / 3.0


def boundaries(looks: Sequence[int], alpha: float = 0.05, spending: str = "pocock") -> list[float]:
    """The two-sided critical values ``c_k`` of each look (``inf``: that look cannot decide)."""
    if spending not in SPENDING:
        raise ValueError(f"spending must be one of {SPENDING}, got {spending!r}")
    return list(_boundaries(tuple(int(n) for n in looks), float(alpha), spending))


@functools.lru_cache(maxsize=256)
def _boundaries(looks: tuple[int, ...], alpha: float, spending: str) -> tuple[float, ...]:
    low, high = norm.ppf(1 - alpha / 2), 6.0
    while high - low > 1e-7:  # bisection: the crossing probability falls as c grows
        mid = 0.5 * (low + high)
        if crossing_probability(looks, _bounds(looks, mid, spending)) > alpha:
            low = mid
        else:
            high = mid
    return tuple(float(b) for b in _bounds(looks, 0.5 * (low + high), spending))


def nominal_levels(looks: Sequence[int], alpha: float = 0.05, spending: str = "pocock") -> list[float]:
    """Each look's nominal two-sided level ``2 (1 - Phi(c_k))``."""
    return [0.0 if math.isinf(c) else float(2 * norm.sf(c)) for c in boundaries(looks, alpha, spending)]


# ------------------------------------------------------------------------------ Holm over looks
def holm_levels(looks: Sequence[int], alpha: float, spending: str, m: int) -> list[list[float]]:
    """``levels[r - 1][k]``: the nominal level at look ``k`` of a boundary computed for ``alpha / r``,
    for ``r = 1 .. m`` (the level a hypothesis meets at a step of the group-sequential Holm
    procedure where ``r`` hypotheses are still open)."""
    return [nominal_levels(looks, alpha / r, spending) for r in range(1, m + 1)]


def sequential_holm(
    pvalues: Sequence[float], levels: Sequence[Sequence[float]], look: int, rejected: Sequence[bool] = ()
) -> list[bool]:
    """The group-sequential Holm procedure at look ``look`` (Ye et al. 2013; module docstring).

    ``pvalues``: each hypothesis's p at this look; ``levels``: :func:`holm_levels` of the plan (``m``
    rows); ``rejected``: which were rejected at an earlier look (they stay so and are not retested).
    The open ones, sorted by p, are rejected in turn while ``p <= levels[r - i - 1][look]`` (``r``
    open, ``i`` the rank among them); the first that fails stops the step-down. Returns which
    hypotheses are rejected after this look (the earlier ones included)."""
    m = len(pvalues)
    done = list(rejected) if len(rejected) else [False] * m
    if len(done) != m or len(levels) < m:
        raise ValueError(f"sequential_holm: {m} p-values, {len(done)} earlier decisions, {len(levels)} level rows")
    p_of = [p if p == p else math.inf for p in pvalues]  # a NaN p sorts last and rejects nothing
    open_ = sorted((i for i in range(m) if not done[i]), key=lambda i: (p_of[i], i))
    r = len(open_)
    for rank, i in enumerate(open_):
        level = levels[r - rank - 1][look]
        if level > 0 and p_of[i] <= level:
            done[i] = True
        else:
            break
    return done


def schedule(declared: Sequence[int], taken: Sequence[int], seeds: int) -> tuple[list[int], int | None]:
    """The looks a judgement at ``seeds`` seeds is made against: the looks taken before (seed counts
    at which the plan was judged, from its record), this one, and the declared looks still ahead;
    and this look's index in them. Before the first declared look nothing is judged (``None``).
    A second reading at a seed count already taken is the same look."""
    if seeds < declared[0]:
        return list(declared), None
    earlier = sorted({n for n in taken if declared[0] <= n < seeds})
    ahead = [n for n in declared if n > seeds]
    looks = [*earlier, seeds, *ahead]
    return looks, len(earlier)


# ------------------------------------------------------------------------------ what a look can decide
def smallest_p(seeds: int, tasks: int, reps: int = 2000, test: str = "bootstrap") -> float:
    """The smallest two-sided p a test of a difference of drops can give with ``seeds`` paired seeds
    on ``tasks`` tasks. ``test="bootstrap"`` (the report's): ``2 / 2^(seeds x tasks)`` for the exact
    sign-flip test (below :data:`~vaco.report.decision.PERMUTATION_BELOW` seeds; ``2 / 2^20`` once the
    patterns are drawn), ``2 / (reps + 1)`` for the bootstrap's percentile p. ``test="randomisation"``:
    ``2 / 2^(seeds x tasks)`` with every swap pattern enumerated, ``1 / (SWAPS + 1)`` once drawn;
    ``"randomisation+bootstrap-t"``: the larger of that and the bootstrap-t's ``1 / (SWAPS + 1)``."""
    from vaco.report.decision import EXACT_PATTERNS, PERMUTATION_BELOW
    from vaco.study.randomisation import ENUMERATE, SWAPS

    if test.startswith("randomisation"):
        units = seeds * tasks
        swaps = 2.0 / 2.0**units if 2.0**units <= ENUMERATE else 1.0 / (SWAPS + 1)
        return swaps if test == "randomisation" else max(swaps, 1.0 / (SWAPS + 1))
    if seeds < PERMUTATION_BELOW:
        return 2.0 / min(2.0 ** (seeds * tasks), float(EXACT_PATTERNS))
    return 2.0 / (reps + 1)


def undecidable_looks(plan: StudyPlan, tasks: int, reps: int = 2000) -> list[str]:
    """One line for each look of ``plan`` at which no comparison could be declared "differs": the
    smallest attainable p (:func:`smallest_p`) is above the look's first Holm level (``alpha / m``'s
    boundary). Each names the look and the least seeds a look there would need. (The ``fixed`` rule's
    early looks decide nothing by design and are not listed.)"""
    m = len(plan.family)
    first = nominal_levels(plan.looks, plan.alpha / m, plan.spending)
    out = []

    def least_p(n: int) -> float:
        return smallest_p(n, tasks, reps, plan.test)

    for k, (n, level) in enumerate(zip(plan.looks, first)):
        if level == 0 or least_p(n) <= level:
            continue
        least = next((s for s in range(n + 1, 10_000) if least_p(s) <= level), None)
        out.append(
            f"`plan.looks[{k}]` ({n} seeds): with {tasks} task{'s' if tasks != 1 else ''} the smallest p the "
            f"plan's {plan.test} test can give is {least_p(n):.3g}, above the look's first Holm level "
            f"{level:.3g}: it can never decide 'differs'; a look needs at least {least} seeds"
        )
    return out
