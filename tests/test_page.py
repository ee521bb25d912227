"""The benchmark page (vaco.report.page): what it plots is the runs' IQMs computed here by hand, its plan
section replays the declared test look by look, and in a real headless Chromium with no network its
controls change what is plotted and a point opens its runs."""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import trim_mean

from helpers import browser
from vaco import report as R
from vaco.report.page import ALL_TASKS, page_data, write_page
from vaco.study import randomisation as Z
from vaco.study.judge import judge_plan, plan_from_tags, plan_lines, read_judgements, read_record
from vaco.study.looks import trajectory
from vaco.study.plan import load_plan

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs/data/confirm_k4.csv.gz"


@cache
def _confirmatory():
    """The confirmatory study's runs, its declared plan and recorded looks, judged as the report does."""
    tags = read_record(REPO / "docs/data/confirm_k4_record.json")
    plan = plan_from_tags(tags)
    runs = R.read_runs(DATA)
    report = R.build_report("confirm", runs, reps=200, fixed_bounds={t: (lo, hi) for t, lo, hi in plan.references})
    earlier = read_judgements(tags)
    judged = judge_plan(plan, report, tags["vaco.plan.declared"], earlier, tags.get("vaco.plan.commit"))
    return report, judged, earlier


def test_every_plotted_point_is_the_iqm_of_its_runs_and_every_task_weighs_alike():
    report, judged, earlier = _confirmatory()
    data = page_data(report, plan_lines(judged), trajectory(judged, report, earlier))
    by_run = {r["name"]: r for r in data["runs"]}
    assert len(by_run) == len(report.runs) and set(data["scores"]) == {"final", "last-3", "auc"}
    for score in ("final", "last-3"):
        for a in ("vaco", "ppo_clip"):
            for K in (1, 4):
                per_task = []
                for task in report.tasks:
                    values = [
                        r["scores"][score] for r in data["runs"] if (r["algorithm"], r["K"], r["env"]) == (a, K, task)
                    ]
                    (cell,) = [c for c in data["scores"][score][task] if (c["algorithm"], c["K"]) == (a, K)]
                    assert cell["iqm"] == pytest.approx(trim_mean(values, 0.25), abs=1e-5)
                    assert cell["lo"] <= cell["iqm"] <= cell["hi"] and cell["interval"] == "bootstrap"
                    per_task.append(trim_mean(values, 0.25))
                (both,) = [c for c in data["scores"][score][ALL_TASKS] if (c["algorithm"], c["K"]) == (a, K)]
                assert both["iqm"] == pytest.approx(np.mean(per_task), abs=1e-5)
    # a run's final score is its last evaluation under the plan's references, by hand
    run = report.runs[0]
    low, high = report.bounds[run.env]
    expected = (run.histories["eval/return"][1][-1] - low) / (high - low)
    assert by_run[run.name]["scores"]["final"] == pytest.approx(expected, abs=1e-6)
    # fewer than 5 seeds a task: the bracket is the runs' range, and the cell says so
    few = [r for r in report.runs if r.seed <= 2003]
    small = page_data(R.build_report("few", few, reps=50, fixed_bounds=dict(report.bounds)))
    (cell,) = [c for c in small["scores"]["final"]["Hopper-v5"] if (c["algorithm"], c["K"]) == ("vaco", 4)]
    values = [
        r["scores"]["final"] for r in small["runs"] if (r["algorithm"], r["K"], r["env"]) == ("vaco", 4, "Hopper-v5")
    ]
    assert cell["interval"] == "range" and (cell["lo"], cell["hi"]) == pytest.approx((min(values), max(values)))


def test_the_plan_section_replays_the_declared_test_look_by_look():
    """A task-mean plan judged by randomisation+bootstrap-t: at the data's look the trajectory's estimate and
    p are the judgement's own; at an earlier look they are the test on the first n seeds; the words are the
    ones recorded."""
    report, _, _ = _confirmatory()
    raw = {
        "family": [{"arm": a, "against": "ppo_clip", "K": 4} for a in ("vaco", "vaco_delta01")],
        "looks": [6, 12],
        "test": "randomisation+bootstrap-t",
        "estimand": "task-mean",
        "references": {t: list(b) for t, b in report.bounds.items()},
    }
    plan = load_plan(raw, report.algorithms, [1, 4], 12)
    judged = judge_plan(plan, report, declared=None)
    from vaco.study.judge import Judgement

    earlier = [Judgement(6, "then", "until-decided", {c.label(): "undecided" for c in plan.family})]
    looks = trajectory(judged, report, earlier)
    assert [(row["seeds"], row["comparison"]) for row in looks][:2] == [
        (6, plan.family[0].label()),
        (6, plan.family[1].label()),
    ]
    last = {row["comparison"]: row for row in looks if row["seeds"] == judged.seeds}
    for v in judged.verdicts:
        row = last[v.comparison.label()]
        assert row["estimate"] == pytest.approx(v.estimate, abs=1e-12) and row["p"] == v.p_differs
        assert row["word"] == v.word and row["lo"] <= row["estimate"] <= row["hi"]
    first = looks[0]
    from vaco.report.robustness import paired_cells

    c = plan.family[0]
    cells, _ = paired_cells(
        report, [(c.arm, 1), (c.arm, 4), (c.against, 1), (c.against, 4)], report.tasks, runs=report.runs
    )
    part = [m[:6] for m in cells]
    assert first["p"] == Z.agreement_p(part, None, Z.SWAPS, report.seed, estimand="task-mean")[0]
    assert first["estimate"] == pytest.approx(float(Z.drop_difference(*part, estimand="task-mean")), abs=1e-12)
    assert first["word"] == "undecided"


def _plotted(chromium: str, page: Path, fragment: str, profile: Path) -> dict:
    dom = subprocess.run(
        [chromium, *browser.ONE_PAGE, f"--user-data-dir={profile}", "--dump-dom", f"{page.as_uri()}#{fragment}"],
        capture_output=True,
        text=True,
        timeout=180,
    ).stdout
    found = re.search(r'<script type="application/json" id="plotted">(.*?)</script>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(found.group(1))


@pytest.mark.slow
def test_the_page_opens_offline_its_controls_change_the_plot_and_a_point_opens_its_runs(tmp_path):
    chromium = browser.chromium()
    report, judged, earlier = _confirmatory()
    data = page_data(
        report, plan_lines(judged), trajectory(judged, report, earlier), "vaco sweep --config X --only '{name}'"
    )
    page = write_page(tmp_path / "benchmark.html", data)
    text = page.read_text()
    assert "<script src=" not in text and "https://" not in text.split("<script>", 2)[-1]  # nothing to fetch
    assert len(text.encode()) < 2_000_000  # plotly.js's basic bundle: a page small enough to keep in git

    default = _plotted(chromium, page, "", tmp_path / "p1")
    assert (default["task"], default["score"]) == (ALL_TASKS, data["declared_score"])
    changed = _plotted(chromium, page, "set=task:Hopper-v5&set=score:last-3&open=vaco,4", tmp_path / "p2")
    assert (changed["task"], changed["score"]) == ("Hopper-v5", "last-3")
    for trace in changed["traces"]:
        expected = [c for c in data["scores"]["last-3"]["Hopper-v5"] if c["algorithm"] == trace["algorithm"]]
        assert trace["iqm"] == [c["iqm"] for c in expected] and trace["K"] == [c["K"] for c in expected]
    assert changed["traces"][0]["iqm"] != default["traces"][0]["iqm"]
    opened = sorted(r.name for r in report.runs if (r.algorithm, r.K, r.env) == ("vaco", 4, "Hopper-v5"))
    assert sorted(changed["open"]) == opened and len(opened) == 12


def test_the_page_embeds_plotly_js_as_published_or_refuses(tmp_path, monkeypatch):
    from vaco.report import page as P

    assert P.plotly_js().startswith("/**\n* plotly.js (basic - minified) v4.1.1")
    changed = tmp_path / "plotly-basic.min.js"
    changed.write_bytes(P.PLOTLY_JS.read_bytes().replace(b"v4.1.1", b"v4.1.2", 1))
    monkeypatch.setattr(P, "PLOTLY_JS", changed)
    with pytest.raises(RuntimeError, match="not the published plotly.js-basic-dist-min 4.1.1"):
        P.write_page(tmp_path / "benchmark.html", {"title": "x"})
    assert not (tmp_path / "benchmark.html").exists()
