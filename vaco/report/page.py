"""The benchmark page: one self-contained HTML file a reader clicks through (``benchmark.html`` beside the
report's other files; plotly.js inside the file, so it opens with no network).

What it shows, for any sweep: the IQM score against K per algorithm with its 95% interval and every seed's
value beside it, for the task and score chosen on the page (each task alone, or every task weighed alike:
the mean of the tasks' IQMs); the lag diagnostics the runs logged (their mean over training) on the same
axes; a click on a point opens its runs (seed, score, last return, learning curve, the command that
reproduces it, and its MLflow run where the report read a store). For a declared plan, its looks as a
decision trajectory: each comparison's estimate and interval at every look taken, with the p, the level
its Holm step met and the word recorded then (computed by :func:`vaco.study.looks.trajectory`).

The page's state lives in its address (``#task=Hopper-v5&score=final&diagnostic=...&open=vaco,4``), so a
view can be linked; ``set=FIELD:VALUE`` changes a control as a reader would (its ``change`` event). What is
plotted is kept as JSON in ``<script id="plotted">``: what a browser test reads back.

plotly.js is its "basic" bundle (scatter, bar and pie traces: all the page draws), 1.2 MB against the full
bundle's 4.8 MB, so a page of a thousand runs stays under 2 MB and can be kept in git: the file
``vendor/plotly-basic.min.js`` is npm's ``plotly.js-basic-dist-min`` 4.1.1 as published (MIT, its licence
beside it; sha256 in :data:`PLOTLY_SHA256`, checked when the page is written).

Written by hand where plotly stops: the controls, the run table and the state (a few dozen lines of
JavaScript, no other library). The intervals are computed here, not in the browser: a cell with 5 or
more seeds a task is bootstrapped (1,000 resamples of its seeds, per task), below that its bracket is
the runs' range (the report's rule), and the page says which.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from vaco.files import write_text_atomic
from vaco.report.bootstrap import iqm

__all__ = ["ALL_TASKS", "page_data", "write_page"]

ALL_TASKS = "every task (mean of the tasks' IQMs)"
BOOTSTRAP_FROM = 5  # seeds a task from which a cell's interval is bootstrapped (below: the runs' range)
RESAMPLES = 1000
_SKIP = ("eval/return", "eval/accuracy")  # the score itself is not a diagnostic
PLOTLY_JS = Path(__file__).with_name("vendor") / "plotly-basic.min.js"
PLOTLY_SHA256 = "99784e3abfb07b142a15e521a439e6d9addceadb3f79553fd24c72774f0649ba"


def plotly_js() -> str:
    """The plotly.js the page embeds, as published (a changed or missing file is an error, not a page
    that draws nothing)."""
    try:
        raw = PLOTLY_JS.read_bytes()
    except OSError as e:
        raise RuntimeError(f"the benchmark page's plotly.js is missing ({PLOTLY_JS}): reinstall vaco") from e
    if hashlib.sha256(raw).hexdigest() != PLOTLY_SHA256:
        raise RuntimeError(f"{PLOTLY_JS} is not the published plotly.js-basic-dist-min 4.1.1: reinstall vaco")
    return raw.decode("utf-8")


def _iqm(values: np.ndarray) -> np.ndarray:
    """IQM over the last axis (scipy's 25% trimmed mean, as rliable): :func:`vaco.report.bootstrap.iqm`."""
    return iqm(np.asarray(values)[..., None])


def _cell(by_task: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict:
    """IQM, interval and seeds of a cell's values (``task -> per-seed values``; several tasks: the mean of
    their IQMs, each task resampled on its own)."""
    tasks = [v for v in by_task.values() if len(v)]
    point = float(np.mean([_iqm(v) for v in tasks]))
    fewest = min(len(v) for v in tasks)
    if fewest >= BOOTSTRAP_FROM:
        draws = np.mean([_iqm(v[rng.integers(0, len(v), size=(RESAMPLES, len(v)))]) for v in tasks], axis=0)
        low, high = np.percentile(draws, [2.5, 97.5])
        kind = "bootstrap"
    else:
        low, high = np.mean([v.min() for v in tasks]), np.mean([v.max() for v in tasks])
        kind = "range"
    return {"iqm": point, "lo": float(low), "hi": float(high), "n": fewest, "interval": kind}


def _scores(report) -> dict[str, dict[str, float]]:
    """score name -> run_id -> normalised score: the last evaluation, the mean of the last three (where
    every run has three) and the AUC, each by the report's per-task bounds."""
    out = {"final": {}, "last-3": {}, "auc": dict(report.auc)}
    for r in report.runs:
        _, values = report.normalized_curve(r)
        out["final"][r.run_id] = float(values[-1])
        if len(values) >= 3:
            out["last-3"][r.run_id] = float(np.mean(values[-3:]))
    if len(out["last-3"]) < len(report.runs):
        del out["last-3"]
    if report.score == "last-n" and report.last_evals != 3:
        name = f"last-{report.last_evals}"
        out[name] = dict(report.normalized)
    return out


def _declared(report) -> str:
    return f"last-{report.last_evals}" if report.score == "last-n" else report.score


def page_data(
    report,
    plan_lines: Sequence[str] | None = None,
    looks: Sequence[dict] = (),
    command: str | None = None,
    store: Mapping[str, str] | None = None,
) -> dict:
    """Everything the page draws, as JSON-ready data. ``plan_lines``: a judged plan's lines
    (:func:`vaco.study.judge.plan_lines`; None without a plan); ``looks``: its decision trajectory
    (:func:`vaco.study.looks.trajectory`); ``command``: how a run is reproduced, with ``{name}`` for its
    cell; ``store``: ``{"experiment_id": ...}`` where the runs were read from an MLflow store (the page
    gives each run's address there)."""
    rng = np.random.default_rng(report.seed)
    scores = _scores(report)
    tasks, ks = report.tasks, report.ks
    algorithms = report.algorithms
    groups: dict[tuple[str, int, str], list] = defaultdict(list)
    for r in report.runs:
        groups[(r.algorithm, r.K, r.env)].append(r)
    diagnostics = sorted({m for r in report.runs for m in r.histories if m not in _SKIP})

    def run_mean(r, metric: str) -> float | None:
        values = np.asarray(r.histories.get(metric, ((), ()))[1], dtype=np.float64)
        values = values[np.isfinite(values)]
        return float(values.mean()) if values.size else None

    runs = []
    for r in sorted(report.runs, key=lambda r: (r.algorithm, r.K, r.env, r.seed)):
        steps, values = report.normalized_curve(r)
        runs.append(
            {
                "name": r.name,
                "run_id": r.run_id,
                "algorithm": r.algorithm,
                "env": r.env,
                "K": r.K,
                "seed": r.seed,
                "scores": {s: round(v[r.run_id], 6) for s, v in scores.items() if r.run_id in v},
                "last_return": float(report.final[r.run_id]),
                "curve": [[int(x) for x in steps], [round(float(y), 5) if np.isfinite(y) else None for y in values]],
                "diagnostics": {m: run_mean(r, m) for m in diagnostics},
            }
        )

    def cells(value) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for scope in [*tasks, ALL_TASKS]:
            scope_tasks = tasks if scope == ALL_TASKS else [scope]
            rows = []
            for a in algorithms:
                for K in ks:
                    by_task = {}
                    for t in scope_tasks:
                        got = [value(r) for r in groups.get((a, K, t), ())]
                        by_task[t] = np.array([v for v in got if v is not None], dtype=np.float64)
                    if any(len(v) == 0 for v in by_task.values()):
                        continue  # a cell missing on a task is not averaged over the others
                    rows.append({"algorithm": a, "K": K, **_cell(by_task, rng)})
            out[scope] = rows
        return out

    data = {
        "title": report.experiment,
        "tasks": tasks,
        "ks": ks,
        "algorithms": algorithms,
        "declared_score": _declared(report),
        "units": "normalised by the plan's fixed references"
        if report.scale == "fixed"
        else "normalised per task (min and max over the runs)"
        if report.scale == "runs"
        else "as logged",
        "bounds": {t: list(report.bounds[t]) for t in tasks},
        "scores": {s: cells(lambda r, v=v: v.get(r.run_id)) for s, v in scores.items()},
        "diagnostics": {m: cells(lambda r, m=m: run_mean(r, m)) for m in diagnostics},
        "runs": runs,
        "command": command,
        "store": dict(store) if store else None,
        "plan": None,
    }
    if plan_lines is not None:
        data["plan"] = {"lines": list(plan_lines), "looks": list(looks)}
    return data


def write_page(path, data: dict) -> Path:
    """The page, self-contained (plotly.js inside), written atomically."""
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    body = (
        _TEMPLATE.replace("__TITLE__", html.escape(str(data["title"])))
        .replace("__PLOTLY__", plotly_js())
        .replace("__DATA__", payload)
    )
    return write_text_atomic(Path(path), body)


_TEMPLATE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__: the lag benchmark page</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1em 2em;color:#222}
label{margin-right:1.2em} select{margin-left:.3em}
table{border-collapse:collapse;font-size:13px} td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} code{font-size:12px}
.note{color:#555;font-size:13px} .row{display:flex;flex-wrap:wrap;gap:1em} .row>div{flex:1 1 560px}
pre.lines{white-space:pre-wrap;font-size:12px;background:#f8f8f8;padding:.6em}
</style>
<script>__PLOTLY__</script></head><body>
<h1>__TITLE__</h1>
<p class="note" id="about"></p>
<div><label>task<select id="task"></select></label><label>score<select id="score"></select></label>
<label>diagnostic<select id="diagnostic"></select></label></div>
<div class="row"><div id="main"></div><div id="diag"></div></div>
<p class="note" id="caveat"></p>
<h2 id="runs-title">Runs behind a point</h2><p class="note">Click a point of the score plot to open its runs.</p>
<div class="row"><div id="runs"></div><div id="curves"></div></div>
<div id="plan-section"><h2>The declared plan, look by look</h2><div id="plan"></div><div id="plan-table"></div>
<pre class="lines" id="plan-lines"></pre></div>
<script type="application/json" id="data">__DATA__</script>
<script type="application/json" id="plotted">{}</script>
<script>
const D = JSON.parse(document.getElementById('data').textContent);
const $ = id => document.getElementById(id);
const state = {task: D.tasks.length > 1 ? '__all__' : D.tasks[0], score: D.declared_score,
               diagnostic: Object.keys(D.diagnostics)[0] || '', open: null};
const ALL = "every task (mean of the tasks' IQMs)";
const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf',
                 '#393b79', '#ad494a', '#637939', '#8c6d31', '#7b4173', '#3182bd'];
const color = i => PALETTE[i % PALETTE.length];
const scope = () => state.task === '__all__' ? ALL : state.task;
function fill(select, values, labels) {
  select.innerHTML = values.map((v, i) => `<option value="${v}">${labels ? labels[i] : v}</option>`).join('');
}
function readHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  for (const k of ['task', 'score', 'diagnostic']) if (h.has(k)) state[k] = h.get(k);
  if (h.has('open')) { const [a, K] = h.get('open').split(','); state.open = {algorithm: a, K: +K}; }
  return h.getAll('set');
}
function writeHash() {
  const h = new URLSearchParams({task: state.task, score: state.score, diagnostic: state.diagnostic});
  if (state.open) h.set('open', state.open.algorithm + ',' + state.open.K);
  history.replaceState(null, '', '#' + h.toString());
}
const x = (a, K) => D.ks.indexOf(K) + (D.algorithms.indexOf(a) - (D.algorithms.length - 1) / 2) * 0.6 / D.algorithms.length;
const fmt = v => v === null || v === undefined ? '' : Math.abs(v) >= 1e5 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3)
  : Math.abs(v) >= 100 ? v.toFixed(1) : v.toFixed(3);  // never a small number that reads as a large one
const axis = {tickvals: D.ks.map((_, i) => i), ticktext: D.ks.map(K => 'K=' + K), title: {text: 'K (policy lag)'}, zeroline: false};
const CONFIG = {displaylogo: false, responsive: true};
function runsOf(a, K) {
  return D.runs.filter(r => r.algorithm === a && r.K === K && (state.task === '__all__' || r.env === state.task));
}
function render() {
  const cells = (D.scores[state.score] || {})[scope()] || [];
  const traces = [], plotted = {task: scope(), score: state.score, diagnostic: state.diagnostic, traces: [], open: null};
  D.algorithms.forEach((a, i) => {
    const rows = cells.filter(c => c.algorithm === a);
    if (!rows.length) return;
    traces.push({x: rows.map(c => x(a, c.K)), y: rows.map(c => c.iqm), name: a, legendgroup: a, mode: 'lines+markers',
      error_y: {type: 'data', symmetric: false, array: rows.map(c => c.hi - c.iqm), arrayminus: rows.map(c => c.iqm - c.lo)},
      customdata: rows.map(c => [a, c.K]), marker: {color: color(i)}, line: {color: color(i)},
      hovertemplate: rows.map(c => `${a} K=${c.K}: IQM ${fmt(c.iqm)} [${fmt(c.lo)}, ${fmt(c.hi)}] (${c.interval}), ${c.n} seeds<extra></extra>`)});
    const seeds = D.runs.filter(r => r.algorithm === a && (state.task === '__all__' || r.env === state.task) && r.scores[state.score] !== undefined);
    traces.push({x: seeds.map(r => x(a, r.K) + 0.02), y: seeds.map(r => r.scores[state.score]), name: a + ' seeds', legendgroup: a,
      showlegend: false, mode: 'markers', marker: {size: 4, opacity: 0.45, color: color(i)}, customdata: seeds.map(r => [a, r.K]),
      hovertemplate: seeds.map(r => `${r.name}: ${fmt(r.scores[state.score])}<extra></extra>`)});
    plotted.traces.push({algorithm: a, K: rows.map(c => c.K), iqm: rows.map(c => c.iqm), lo: rows.map(c => c.lo), hi: rows.map(c => c.hi), seeds: seeds.length});
  });
  Plotly.react('main', traces, {title: {text: `${state.score} score, ${scope()}`}, xaxis: axis,
    yaxis: {title: {text: 'IQM score (' + D.units + ')'}}, height: 460, margin: {t: 40}}, CONFIG);
  const dcells = (D.diagnostics[state.diagnostic] || {})[scope()] || [];
  Plotly.react('diag', D.algorithms.filter(a => dcells.some(c => c.algorithm === a)).map(a => {
    const rows = dcells.filter(c => c.algorithm === a);
    return {x: rows.map(c => x(a, c.K)), y: rows.map(c => c.iqm), name: a, mode: 'lines+markers', line: {color: color(D.algorithms.indexOf(a))},
      hovertemplate: rows.map(c => `${a} K=${c.K}: ${fmt(c.iqm)}, ${c.n} seeds<extra></extra>`)};
  }), {title: {text: `${state.diagnostic}: IQM of each run's mean over training`}, xaxis: axis, height: 460, margin: {t: 40}}, CONFIG);
  const ranges = cells.filter(c => c.interval === 'range').length;
  $('caveat').textContent = ranges ? `${ranges} of ${cells.length} points have fewer than 5 seeds a task: their brackets are the runs' range, not an interval.` : 'Brackets: 95% bootstrap intervals over seeds (each task resampled on its own).';
  if (state.open) plotted.open = openRuns(state.open.algorithm, state.open.K);
  $('plotted').textContent = JSON.stringify(plotted);
  writeHash();
}
function openRuns(a, K) {
  const runs = runsOf(a, K);
  $('runs-title').textContent = `Runs behind ${a} at K=${K} (${scope()})`;
  const link = r => D.store ? `<code title="in vaco ui: experiment ${D.store.experiment_id}, run ${r.run_id}">#/experiments/${D.store.experiment_id}/runs/${r.run_id}</code>` : '';
  const cmd = r => D.command ? `<code>${D.command.replace('{name}', r.name)}</code>` : '';
  $('runs').innerHTML = '<table><tr><th class="l">run</th><th>task</th><th>seed</th><th>' + state.score +
    '</th><th>last return</th><th class="l">reproduce</th><th class="l">MLflow run (after vaco ui\'s address)</th></tr>' + runs.map(r =>
    `<tr><td class="l">${r.name}</td><td>${r.env}</td><td>${r.seed}</td><td>${fmt(r.scores[state.score])}</td><td>${fmt(r.last_return)}</td><td class="l">${cmd(r)}</td><td class="l">${link(r)}</td></tr>`).join('') + '</table>';
  Plotly.react('curves', runs.map(r => ({x: r.curve[0], y: r.curve[1], name: `${r.env} s${r.seed}`, mode: 'lines'})),
    {title: {text: 'learning curves (normalised return)'}, xaxis: {title: {text: 'env steps'}}, height: 380, margin: {t: 40}}, CONFIG);
  return runs.map(r => r.name);
}
function renderPlan() {
  if (!D.plan) { $('plan-section').style.display = 'none'; return; }
  $('plan-lines').textContent = D.plan.lines.join('\n');
  const by = {};
  D.plan.looks.forEach(l => (by[l.comparison] = by[l.comparison] || []).push(l));
  Plotly.react('plan', Object.entries(by).map(([c, ls]) => ({x: ls.map(l => l.seeds), y: ls.map(l => l.estimate), name: c,
    mode: 'lines+markers+text', text: ls.map(l => l.word), textposition: 'top center',
    error_y: {type: 'data', symmetric: false, array: ls.map(l => l.hi - l.estimate), arrayminus: ls.map(l => l.estimate - l.lo)}})),
    {title: {text: 'difference of drops at each look (positive: the arm loses less)'}, xaxis: {title: {text: 'seeds a cell'}},
     yaxis: {zeroline: true}, height: 420, margin: {t: 40}}, CONFIG);
  $('plan-table').innerHTML = '<table><tr><th class="l">comparison</th><th>look</th><th>its seeds</th><th>estimate</th><th>95% interval</th><th>p</th><th>Holm step level</th><th class="l">word</th></tr>' +
    D.plan.looks.map(l => `<tr><td class="l">${l.comparison}</td><td>${l.seeds}</td><td>${l.n}</td><td>${fmt(l.estimate)}</td><td>[${fmt(l.lo)}, ${fmt(l.hi)}]</td><td>${l.p.toPrecision(3)}</td><td>${l.level.toPrecision(3)}</td><td class="l">${l.word}</td></tr>`).join('') + '</table>';
}
fill($('task'), D.tasks.length > 1 ? ['__all__', ...D.tasks] : D.tasks, D.tasks.length > 1 ? [ALL, ...D.tasks] : D.tasks);
fill($('score'), Object.keys(D.scores), Object.keys(D.scores).map(s => s + (s === D.declared_score ? ' (declared)' : '')));
fill($('diagnostic'), Object.keys(D.diagnostics));
$('about').textContent = `${D.runs.length} runs; scores ${D.units}; the declared score is ${D.declared_score}. Every point is exploratory unless the plan below decides it.`;
const sets = readHash();
for (const k of ['task', 'score', 'diagnostic']) {
  $(k).value = state[k];
  $(k).addEventListener('change', e => { state[k] = e.target.value; render(); });
}
for (const s of sets) {  // a control changed as a reader would: set=FIELD:VALUE
  const [k, v] = [s.slice(0, s.indexOf(':')), s.slice(s.indexOf(':') + 1)];
  if ($(k)) { $(k).value = v; $(k).dispatchEvent(new Event('change')); }
}
render(); renderPlan();
$('main').on('plotly_click', ev => { const [a, K] = ev.points[0].customdata; state.open = {algorithm: a, K: K}; render(); });
</script></body></html>
"""
