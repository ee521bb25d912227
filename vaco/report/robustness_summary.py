"""The summary's "Robustness to lag" section: each algorithm's drop from its own K = 1, the
difference of drops against the baseline with its verdict (``vaco.report.decision``), the
algorithms ranked by their drop (``vaco.report.ranking``), per task."""

from __future__ import annotations

from vaco.report.decision import PERMUTATION_BELOW, Verdict
from vaco.report.design import Design
from vaco.report.markdown import estimate_text, markdown_table
from vaco.report.ranking import Ranking, rankings
from vaco.report.robustness import Robustness
from vaco.report.scores import Report
from vaco.report.sensitivity import SCALES, Sensitivity, SensitivityRow

__all__ = ["design_lines", "ranking_lines", "scoring_lines", "verdict_lines"]

SCORE_WORDS = {
    "final": "normalised final scores (the last evaluation)",
    "last-n": "normalised scores averaged over the last {n} evaluations",
    "auc": "normalised areas under the curve (the curve's mean over training)",
}


def score_words(report: Report) -> str:
    words = SCORE_WORDS[report.score].format(n=report.last_evals)
    return words.replace("normalised ", "") + f" of {report.score_metric}" if report.scale == "as is" else words


def robustness_section(
    report: Report, data: Robustness, figure: str | None, scoring: Sensitivity | None = None
) -> list[str]:
    s = ["", "## Robustness to lag", ""]
    if not data.drops:
        return s + [f"Not in this report: it needs runs of an algorithm at two or more K ({'; '.join(data.notes)})."]
    k_ref = data.k_ref
    s += [
        f"The paper's claim is about robustness: as K grows, does an algorithm lose less of its own K={k_ref} "
        "score than the baseline? Each algorithm is compared with itself; levels (which algorithm scores "
        "higher) are in the sections below.",
        "",
        f"- **drop** at K = IQM(K={k_ref}) - IQM(K) of the {score_words(report)}, the score declared for this "
        f"report (`--score {report.score}`); **ratio** = IQM(K) / IQM(K={k_ref}).",
    ]
    if data.baseline:  # the LLM track (one objective family) has no baseline to compare drops with
        s += [
            f"- **difference of drops** = drop({data.baseline}) - drop(algorithm): above 0 the algorithm loses "
            f"less than {data.baseline}. **P(drop smaller)**: the probability that a run of the algorithm drops "
            f"less than a run of {data.baseline} on a task drawn at random (rliable's probability of improvement "
            "on the per-seed drops; 0.5: no difference).",
        ]
    s += [
        f"- Runs are paired by seed; 95% intervals from a paired stratified bootstrap ({report.reps} resamples, "
        f"seed {report.seed}): per resample and task, one draw of seeds for every cell compared.",
        f"- **verdict**, by a rule fixed before the data, at the declared margin M = {report.margin:g} ({report.units} "
        "units, `--margin`): **differs** when the 95% interval excludes 0; **equivalent (+-M)** when the 90% "
        "interval lies inside (-M, M) (two one-sided tests); otherwise **undecided**, with the seeds per task that "
        "would decide it at 80% power if the true difference were the observed one (normal approximation from the "
        "per-seed paired spread). With fewer than "
        f"{PERMUTATION_BELOW} paired seeds per task the tests are exact sign-flip permutation tests on the per-seed "
        "paired differences (their mean), not the bootstrap; MDD: the minimum difference detectable at 80% power "
        "with the seeds at hand.",
        "",
    ]
    if figure:
        s += [f"![robustness]({figure})", ""]
    if data.interactions:
        s += [f"**Against {data.baseline}** (the headline):", "", _interaction_table(data), ""]
    elif data.baseline:
        s += [
            f"No comparison with {data.baseline}: it needs its runs at K={k_ref} and at the other K, with the same seeds.",
            "",
        ]
    s += ["Each algorithm against its own K = " + str(k_ref) + ":", "", _drop_table(data)]
    s += _ranking_part(report, rankings(report, data))
    s += [
        "",
        "Per task: mean normalised score at K = " + str(k_ref) + " and at K, and the per-seed drop "
        "(mean +- sample SD, ddof = 1):",
        "",
        _task_drop_table(report, data),
    ]
    s += [f"- {n}" for n in data.notes]
    if scoring is not None and scoring.rows:
        s += _scoring_section(report, scoring)
    return s


def _scoring_section(report: Report, data: Sensitivity) -> list[str]:
    """Each difference of drops under every scoring, the scale-dependent ones flagged, and the
    two-way model's interaction term."""
    flagged = data.scale_dependent()
    s = [
        "",
        "### Does the verdict depend on the scoring?",
        "",
        "Each difference of drops above, recomputed with each score (final: the last evaluation; "
        f"last-{data.last_n}: the mean of the last {data.last_n}; AUC: the normalised curve's mean over training), "
        "aggregate (IQM, mean) and per-task scale ("
        + {
            "runs": "min-max: (x - min) / (max - min), the paper's",
            "fixed": "min-max: (x - min) / (max - min) with the plan's fixed references",
            "as is": "min-max and floor-free: the accuracy as it is; its floor is 0 and its top 1, so the two coincide",
        }[report.scale]
        + (
            ""
            if report.scale == "as is"
            else "; floor-free: x / max, the same top without the floor that collapsed runs set"
        )
        + "), decided by the same rule on the same "
        "bootstrap draws (`*`: this report's declared scoring, the headline). A comparison whose verdict word "
        "changes across scorings is **scale-dependent**: read its headline as one scoring's answer.",
        "",
    ]
    if flagged:
        s += [_flagged_sentence(flagged), ""]
    else:
        s += ["No verdict changes with the scoring.", ""]
    s += [_scoring_table(data.rows, data.last_n, "algorithm"), ""]
    s += [holm_sentence(data, report.reps), ""]
    if data.models:
        s += [
            "Two-way model (statsmodels OLS on the declared score and scale): score ~ algorithm x lagged + "
            "(task, seed) unit, per comparison; the interaction term is the difference of the mean drops "
            "(above 0: the algorithm loses less), with its 95% confidence interval and t-test. A cross-check that "
            "does not trim or resample.",
            "",
            markdown_table(
                ["algorithm", "K", "interaction", "95% CI", "t", "p", "observations"],
                [
                    (
                        m.algorithm,
                        m.K,
                        f"{m.estimate:+.3f}",
                        f"[{m.low:+.3f}, {m.high:+.3f}]",
                        f"{m.t:.2f}",
                        f"{m.p:.3g}",
                        m.observations,
                    )
                    for m in data.models
                ],
            ),
        ]
    s += [f"- {n}" for n in data.notes]
    return s


def _scoring_table(rows: list[SensitivityRow], last_n: int, first: str) -> str:
    """One line per (comparison, K, score, aggregate), one column per scale: estimate, interval, verdict."""
    cells = {(r.algorithm, r.K, r.score, r.aggregate, r.scale): r for r in rows}
    keys = list(dict.fromkeys((r.algorithm, r.K, r.score, r.aggregate) for r in rows))
    lines = []
    for algo, K, score, agg in keys:
        line = [algo, K, score if score != "last-n" else f"last-{last_n}", agg]
        for scale in SCALES:
            r = cells[(algo, K, score, agg, scale)]
            star = "*" if r.declared else ""
            line.append(f"{estimate_text(r.difference, r.interval)} {r.verdict.word}{star}")
        lines.append(line)
    return markdown_table([first, "K", "score", "aggregate", *SCALES], lines)


def _flagged_sentence(flagged: dict[tuple[str, int], list[str]]) -> str:
    return (
        "Scale-dependent: "
        + "; ".join(
            f"**{name} K={K}** ({', '.join(f'{w} on {words.count(w)}' for w in dict.fromkeys(words))} of {len(words)})"
            for (name, K), words in flagged.items()
        )
        + "."
    )


def holm_sentence(data: Sensitivity, reps: int, alpha: float = 0.05) -> str:
    """How the table's verdicts fare under Holm's correction over all of them (exploratory), and
    whether the bootstrap's resolution (its smallest p, ``2 / (reps + 1)``) lets Holm reject at all."""
    counts = data.holm_counts(alpha)
    total = sum(alone for alone, _ in counts.values())
    kept = ", ".join(
        f"{kept} of the {alone} **{word}** verdicts stay {word}" for word, (alone, kept) in sorted(counts.items())
    )
    sentence = (
        f"Each verdict of this table is decided at {alpha:g} on its own. Under Holm's correction over all {total} "
        f"of them (this table and the 2x2 contrasts' below; a family-wise level of {alpha:g}, exploratory: "
        f"no plan declared them a family): {kept}. `sensitivity.csv` holds each row's p-values and their "
        "Holm adjustment (`p_differs_holm`, `p_equivalent_holm`, `verdict_holm`)."
    )
    floor = 2 / (reps + 1)
    bootstrap = any(r.verdict.method == "bootstrap" for r in [*data.rows, *data.design])
    if bootstrap and total and floor * total > alpha:
        sentence += (
            f" **Too coarse to judge**: with {reps} bootstrap resamples the smallest p is {floor:.3g}, so Holm over "
            f"{total} cannot go below {min(1.0, floor * total):.3g} and no bootstrap verdict can survive it; run "
            f"with `--reps` of at least {int(2 * total / alpha)} to judge the table under the correction."
        )
    return sentence


def scoring_lines(data: Sensitivity, design: bool = False) -> list[str]:
    """The stdout lines of `vaco report`: the comparisons (``design``: the 2x2 contrasts) whose
    verdict depends on the scoring."""
    return [
        f"  {name} K={K}: scale-dependent ({', '.join(f'{w} on {words.count(w)}' for w in dict.fromkeys(words))}"
        f" of {len(words)} scorings)"
        for (name, K), words in data.scale_dependent(design).items()
    ]


def _verdict(v: Verdict | None) -> str:
    if v is None:
        return "-"
    how = "" if v.method == "bootstrap" else f"; {v.method} p = {v.p_differs:.3g}"
    return f"**{v.text()}**" + (f" ({how[2:]})" if how else "")


def _mdd(v: Verdict | None) -> str:
    return "-" if v is None or v.mdd is None else f"{v.mdd:.3f}"


def verdict_lines(data: Robustness) -> list[str]:
    """One line per comparison, as `vaco report` prints them: the difference, its interval and its verdict."""
    lines = []
    for (algo, K), x in data.interactions.items():
        lines.append(
            f"  {algo} vs {data.baseline}, K={K}: difference of drops {estimate_text(x.difference, x.difference_interval)}"
            f" -> {x.verdict.text() if x.verdict else '-'}" + _by(x.verdict)
        )
    for (algo, K), d in data.drops.items():
        lines.append(
            f"  {algo}, drop K={data.k_ref}->{K}: {estimate_text(d.drop, d.drop_interval)}"
            f" -> {d.verdict.text() if d.verdict else '-'}" + _by(d.verdict)
        )
    return lines


def _by(verdict) -> str:
    """Which test a console verdict came from (the interval beside it is always the bootstrap's)."""
    if verdict is None:
        return ""
    if verdict.method == "bootstrap":
        return " (by the bootstrap interval)"
    return f" (by the {verdict.method} test; the interval is the bootstrap's)"


def _interaction_table(data: Robustness) -> str:
    return markdown_table(
        ["algorithm", "K", "difference of drops", "verdict", "MDD", "P(drop smaller)", "paired seeds/task", "tasks"],
        [
            (
                x.algorithm,
                K,
                estimate_text(x.difference, x.difference_interval),
                _verdict(x.verdict),
                _mdd(x.verdict),
                estimate_text(x.p_smaller, x.p_interval),
                x.seeds,
                x.tasks,
            )
            for (_, K), x in data.interactions.items()
        ],
    )


def _drop_table(data: Robustness) -> str:
    k_ref = data.k_ref
    return markdown_table(
        ["algorithm", "K", f"IQM K={k_ref}", "IQM K", "drop", "verdict", "ratio", "paired seeds/task", "tasks"],
        [
            (
                d.algorithm,
                K,
                f"{d.level_ref:.3f}",
                f"{d.level:.3f}",
                estimate_text(d.drop, d.drop_interval),
                _verdict(d.verdict),
                estimate_text(d.ratio, d.ratio_interval),
                d.seeds,
                d.tasks,
            )
            for (_, K), d in data.drops.items()
        ],
    )


def _ranking_part(report: Report, found: list[Ranking]) -> list[str]:
    if not found:
        return []
    s = [
        "",
        f"Ranked by drop (exploratory: an ordering, not a test): rank 1 loses least of its own K = {found[0].k_ref}; "
        f"every algorithm on the seeds they all have (so a drop here can differ from the table above where an "
        "algorithm has more); **rank interval**: the 2.5th-97.5th percentiles of its rank over "
        f"the paired bootstrap ({report.reps} resamples, seed {report.seed}); **P(first)**: the share of resamples in "
        "which its drop is the smallest. An algorithm that learned little at "
        f"K = {found[0].k_ref} has little to lose: one whose IQM there is below the floor"
        + (f" ({found[0].floor:g})" if found[0].floor is not None else "")
        + " is not ranked but listed apart, marked, with its drop.",
    ]
    for r in found:
        if not r.ranks:
            s += ["", *(f"- {n}" for n in r.notes)]
            continue
        s += ["", f"At K = {r.K} ({r.seeds} paired seeds per task, {', '.join(r.tasks)}):", ""]
        s += [
            markdown_table(
                ["rank", "algorithm", "drop", "rank interval", "P(first)", f"IQM K={r.k_ref}", "IQM K"],
                [
                    (
                        x.rank,
                        x.algorithm,
                        estimate_text(x.drop, x.drop_interval),
                        "-" if x.rank_interval is None else f"{x.rank_interval[0]}-{x.rank_interval[1]}",
                        "-" if x.rank_interval is None else f"{x.p_first:.2f}",
                        f"{x.level_ref:.3f}",
                        f"{x.level:.3f}",
                    )
                    for x in r.ranks
                ],
            )
        ]
        if r.apart:
            s += [
                "",
                f"Below the floor at K = {r.k_ref} (IQM under {r.floor:g}: little to lose; **not ranked**): "
                + "; ".join(
                    f"{x.algorithm} drop {estimate_text(x.drop, x.drop_interval)} (IQM K={r.k_ref} "
                    f"{x.level_ref:.3f}, K={r.K} {x.level:.3f})"
                    for x in r.apart
                )
                + ".",
            ]
        s += [f"- {n}" for n in r.notes]
    return s


def ranking_lines(report: Report, data: Robustness) -> list[str]:
    """One line per K, as `vaco report` prints it: the algorithms in rank order with their drops."""
    return [
        f"  ranked by drop at K={r.K} ({r.seeds} seeds a task; exploratory): "
        + ", ".join(f"{x.rank}. {x.algorithm} {x.drop:.3f}" for x in r.ranks)
        + (
            f"; below the floor at K={r.k_ref}, not ranked: {', '.join(x.algorithm for x in r.apart)}"
            if r.apart
            else ""
        )
        for r in rankings(report, data)
        if r.ranks
    ]


def _task_drop_table(report: Report, data: Robustness) -> str:
    k_ref = data.k_ref
    return markdown_table(
        ["task", "algorithm", "K", f"mean K={k_ref}", "mean K", "drop", "seeds"],
        [
            (
                t.task,
                t.algorithm,
                t.K,
                f"{t.mean_ref:.3f}",
                f"{t.mean:.3f}",
                f"{t.drop:.3f} +- {t.drop_sd:.3f}" if t.seeds > 1 else f"{t.drop:.3f}",
                t.seeds,
            )
            for t in sorted(data.per_task, key=lambda t: (t.task, report.algorithms.index(t.algorithm), t.K))
        ],
    )


def design_section(report: Report, design: Design | None, scoring: Sensitivity | None = None) -> list[str]:
    """The 2x2 step-size design's contrasts (only with two ``--step-pairs``), and under every scoring."""
    if design is None:
        return []
    (fl, cl), (fs, cs) = design.large, design.small
    s = [
        "",
        "### The 2x2 design: objective x step size",
        "",
        f"Four arms: the TV filter and clipping, each at a large step ({fl} / {cl}) and a small one ({fs} / {cs}; "
        f"the large pair is the one whose filter arm moves further at K = {design.k_ref}). With drop(X) as above and "
        "A = drop(clip arm) - drop(filter arm) of a pair (above 0: the filter loses less at that step size): "
        "**objective** = the mean of the two A; **step size** = the small arms' mean drop minus the large arms' "
        "(above 0: the larger step loses less); **objective x step size** = A(large) - A(small). Paired by seed over "
        f"the eight cells; one paired bootstrap for all; verdicts at M = {report.margin:g} as above.",
        "",
    ]
    if design.contrasts:
        s.append(
            markdown_table(
                ["K", "contrast", "estimate", "verdict", "MDD", "paired seeds/task", "tasks"],
                [
                    (
                        c.K,
                        c.name,
                        estimate_text(c.estimate, c.interval),
                        _verdict(c.verdict),
                        _mdd(c.verdict),
                        c.seeds,
                        c.tasks,
                    )
                    for c in design.contrasts
                ],
            )
        )
    s += [f"- {n}" for n in design.notes]
    if scoring is not None and scoring.design:
        flagged = scoring.scale_dependent(design=True)
        s += [
            "",
            "#### Do the contrasts depend on the scoring?",
            "",
            "Each contrast above under every score, aggregate and scale of the robustness section's scoring table, "
            "on the same cells and paired seeds, resampled with the same bootstrap draws (`*`: the declared "
            "scoring, the table above) and decided by the same rule.",
            "",
            _flagged_sentence(flagged) if flagged else "No contrast's verdict changes with the scoring.",
            "",
            _scoring_table(scoring.design, scoring.last_n, "contrast"),
        ]
    return s


def design_lines(design: Design | None) -> list[str]:
    """One line per 2x2 contrast, as `vaco report` prints them."""
    if design is None:
        return []
    return [
        f"  2x2 K={c.K}, {c.name}: {estimate_text(c.estimate, c.interval)} -> {c.verdict.text()}"
        + (f" [{c.verdict.method}]" if c.verdict.method != "bootstrap" else "")
        for c in design.contrasts
    ]
