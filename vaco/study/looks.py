"""The looks of a study: which cells a look runs, and the plan judged on the runs of the looks so far.

``vaco sweep --until-decided`` (:mod:`vaco.sweep.sweep_cli`) runs the cells :func:`look_cells`
names, look after look, and judges each look with :func:`judge_look`; the rule itself is
:func:`vaco.study.judge.judge_plan`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from vaco.tracking import PLAN_TAG

__all__ = ["judge_look", "look_cells", "look_needs", "look_progress", "seed_ranks", "trajectory"]

TRAJECTORY_RESAMPLES = 1000  # bootstrap resamples of each look's interval on the benchmark page


def seed_ranks(cells: Sequence) -> dict[str, int]:
    """Each cell's rank among the cells that differ from it only by seed (the sweep's seed order)."""
    ranks, seen = {}, {}
    for cell in cells:
        key = cell.id[: -len(f"s{cell.seed}")]
        ranks[cell.id] = seen.get(key, 0)
        seen[key] = ranks[cell.id] + 1
    return ranks


def look_needs(cell, comparisons, k_ref: int) -> bool:
    """Whether a cell is one of the comparisons' arms (``arm`` or ``against``) at their K or at ``k_ref``."""
    return any(cell.algorithm in (c.arm, c.against) and cell.K in (k_ref, c.K) for c in comparisons)


def look_cells(cells: Sequence, seeds: int, needed=None) -> list:
    """The cells of a look at ``seeds`` seeds: the first ``seeds`` of every cell's seeds, or after
    the first look only the arms of the comparisons still open (``needed``; None: all). A
    comparison decided at an earlier look keeps its verdict and its alpha passes to the others
    (Maurer and Bretz 2013), so more seeds of its arms would change nothing the plan judges."""
    ranks = seed_ranks(cells)
    k_ref = min(c.K for c in cells)
    return [c for c in cells if ranks[c.id] < seeds and (needed is None or look_needs(c, needed, k_ref))]


def look_progress(plan, cells: Sequence, states: Mapping[str, str], readings: Sequence) -> str:
    """Where ``--until-decided`` stands, for ``vaco sweep --status``: the look it runs now (the first
    not recorded), how many of that look's cells have finished or are running, and the looks
    recorded so far (``readings``: the plan's record, :func:`vaco.study.judge.read_judgements`). A
    look after the first holds only the arms of the comparisons the recorded looks left open, as
    :func:`look_cells` names them when the sweep runs."""
    from vaco.study.judge import DECIDED, FLOOR_WORD

    ours = [j for j in readings if j.by == "until-decided"]
    taken = sorted({j.seeds for j in ours})
    recorded = ", ".join(f"{s} seeds" for s in taken) or "none"
    shut = {label for j in ours for label, word in j.words.items() if word in (*DECIDED, FLOOR_WORD)}
    still_open = [c for c in plan.family if c.label() not in shut]
    if taken and not still_open:
        return f"every primary comparison is decided (looks recorded: {recorded}): --until-decided runs nothing more"
    k = sum(1 for seeds in plan.looks if taken and seeds <= taken[-1])
    if k == len(plan.looks):
        return f"the last look ({plan.looks[-1]} seeds) is recorded: what is undecided stays undecided"
    look = look_cells(cells, plan.looks[k], still_open if k else None)
    done = sum(states.get(c.id) == "finished" for c in look)
    running = sum(states.get(c.id) == "running" for c in look)
    arms = f", the arms of {'; '.join(c.label() for c in still_open)}" if k else ""
    return (
        f"look {k + 1} of {len(plan.looks)} ({plan.looks[k]} seeds{arms}): {done} of its {len(look)} cells finished"
        + (f", {running} running" if running else "")
        + f"; looks recorded: {recorded}"
    )


def judge_look(sweep, uri: str, cell_ids: set[str], from_data: Mapping[str, str]):
    """The sweep's plan judged on the runs of the looks' cells so far (none of a later look's seeds;
    the runs that finished in an earlier store, ``from_data``: cell id -> its data file, included),
    normalised by the plan's fixed references where it has them, against the looks recorded on the
    sweep's parent run."""
    import mlflow

    from vaco.report.runs import load_runs, read_data_files
    from vaco.report.scores import build_report
    from vaco.study.judge import judge_plan, read_judgements
    from vaco.study.plan import score_settings

    study = sweep.plan
    runs, notes = load_runs(sweep.experiment, uri)
    runs = [r for r in runs if r.name in cell_ids]
    carried = {c for c in from_data if c in cell_ids} - {r.name for r in runs}
    if carried:  # the runs of this look that finished in an earlier store (--finished-in)
        found, more = read_data_files(sorted({from_data[c] for c in carried}))
        runs += [r for r in found if r.name in carried and r.status == "FINISHED"]
        notes += more
    fixed = {task: (low, high) for task, low, high in study.references} or None
    score, last_evals = score_settings(study.score)
    report = build_report(
        sweep.experiment, runs, notes, score=score, last_evals=last_evals, margin=study.margin, fixed_bounds=fixed
    )
    tags = mlflow.MlflowClient(uri).get_run(sweep.parent_run_id).data.tags
    return judge_plan(
        study, report, tags.get(f"{PLAN_TAG}.declared"), read_judgements(tags), tags.get(f"{PLAN_TAG}.commit")
    )


def trajectory(judged, report, earlier: Sequence = ()) -> list[dict]:
    """Each comparison of a judged plan at every look taken (``earlier``: the plan's recorded
    :class:`~vaco.study.judge.Judgement` s, oldest first; this judgement is the last look): the estimate, its
    interval and the declared test's p on the first ``n`` paired seeds, the level its Holm step met there
    (the step-down replayed look by look on these p's) and the word recorded at that look."""
    from vaco.report.robustness import paired_cells
    from vaco.study.plan import holm_levels, sequential_holm

    plan = judged.plan
    if judged.look is None:
        return []
    words = {j.seeds: j.words for j in earlier if plan.looks[0] <= j.seeds < judged.seeds}
    words[judged.seeds] = {v.comparison.label(): v.word for v in judged.verdicts}
    seeds = sorted(words)
    levels = holm_levels(list(judged.looks), plan.alpha, plan.spending, len(plan.family))
    cells = {}
    for v in judged.verdicts:
        c = v.comparison
        mats, _ = paired_cells(
            report, [(c.arm, 1), (c.arm, c.K), (c.against, 1), (c.against, c.K)], report.tasks, runs=report.runs
        )
        cells[c] = [np.asarray(m, dtype=np.float64) for m in mats]
    done = [False] * len(plan.family)
    out = []
    for look, n in enumerate(seeds):
        p_all, rows = [], {}
        for i, c in enumerate(plan.family):
            m = cells.get(c)
            if m is None or m[0].shape[0] < n or done[i]:
                p_all.append(1.0)
                continue
            # the data's own look judges each comparison on every seed it has (as the judgement did)
            part = m if n == judged.seeds else [x[:n] for x in m]
            p_all.append(_p(plan, part, report))
            rows[i] = part
        open_ = sorted((i for i in range(len(p_all)) if not done[i]), key=lambda i: (p_all[i], i))
        step = {i: levels[len(open_) - rank - 1][min(look, len(judged.looks) - 1)] for rank, i in enumerate(open_)}
        done = sequential_holm(p_all, levels, min(look, len(judged.looks) - 1), done)
        for i, part in rows.items():
            label = plan.family[i].label()
            low, high = np.percentile(_draws(plan, part, report), [2.5, 97.5])
            out.append(
                {
                    "comparison": label,
                    "seeds": n,  # the look
                    "n": int(part[0].shape[0]),  # the seeds this comparison was judged on there
                    "estimate": float(_difference(plan, part)),
                    "lo": float(low),
                    "hi": float(high),
                    "p": p_all[i],
                    "level": step.get(i, 0.0),
                    "word": words[n].get(label, "not judged"),
                }
            )
    return out


def _p(plan, cells, report) -> float:
    """The declared test's two-sided p (the percentile bootstrap's where the plan declares ``bootstrap``)."""
    from vaco.study.randomisation import SWAPS, agreement_p, bootstrap_p, randomisation_p

    if plan.test == "bootstrap":
        return bootstrap_p(cells, plan.margin, report.reps, report.seed, estimand=plan.estimand)[0]
    test = randomisation_p if plan.test == "randomisation" else agreement_p
    return test(cells, None, SWAPS, report.seed, estimand=plan.estimand)[0]


def _difference(plan, cells) -> float:
    from vaco.study.randomisation import drop_difference

    return float(drop_difference(*cells, estimand=plan.estimand))


def _draws(plan, cells, report) -> np.ndarray:
    from vaco.study.randomisation import bootstrap_samples

    return bootstrap_samples(cells, TRAJECTORY_RESAMPLES, report.seed, plan.estimand)
