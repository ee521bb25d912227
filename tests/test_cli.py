"""The `vaco` command as a user meets it: help that shows vaco, fast commands, clear refusals, `vaco ui`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import browser
from helpers.mlflow_server import free_port
from helpers.runs import CONFIGS, REAL_VACO, VACO, run_cli

PROBE = """
import json, sys
from vaco.commands.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print(json.dumps({{"torch": "torch" in sys.modules, "lightning": "lightning" in sys.modules}}), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "argv", [["--help"], ["sweep", "--help"], ["report", "--help"], ["evaluate", "--help"], ["ui", "--help"]]
)
def test_help_imports_neither_torch_nor_lightning(argv):
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stderr.strip().splitlines()[-1]) == {"torch": False, "lightning": False}
    assert "usage" in out.stdout


def test_the_command_list_is_the_same_everywhere():
    top = run_cli("--help")
    listed = [
        line.split()[0] for line in top.stdout.split("commands:")[1].split("examples:")[0].splitlines() if line.strip()
    ]
    assert listed == ["fit", "evaluate", "sweep", "report", "ui"]
    wrong = run_cli("validate")
    assert wrong.returncode == 2 and "fit, evaluate, sweep, report, ui" in wrong.stderr
    typo = run_cli("fti")
    assert typo.returncode == 2 and "Did you mean fit?" in typo.stderr
    as_module = subprocess.run([sys.executable, "-m", "vaco", "--help"], capture_output=True, text=True, timeout=120)
    assert as_module.returncode == 0 and as_module.stdout == top.stdout, as_module.stderr


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_output_into_a_closed_pipe_stops_quietly(argv):
    """`vaco --help | head -1`: the reader is gone before vaco writes. vaco stops as `ls | head` does,
    with the shell's SIGPIPE status and no traceback."""
    proc = subprocess.Popen([REAL_VACO, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # closed before the interpreter has started: every write meets a closed pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE, stderr
    assert stderr == "", stderr


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(tmp_path):
    """Only a closed stdout is a quiet stop: a command whose own pipe breaks (an actor's, a socket)
    fails with its traceback while its stdout is still read."""
    (tmp_path / "boom.py").write_text("def main(argv):\n    raise BrokenPipeError('a pipe to an actor')\n")
    script = "from vaco.commands import cli\ncli.COMMANDS['boom'] = ('boom', '')\ncli.main(['boom'])\n"
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
    )
    assert out.returncode == 1 and "BrokenPipeError: a pipe to an actor" in out.stderr, out.stderr


def test_fit_help_lists_vacos_own_fields_with_their_docs_and_defaults():
    out = run_cli("fit", "--help")
    assert out.returncode == 0
    for field in (
        "--model.num_minibatches",
        "--model.update_epochs",
        "--data.policy_buffer_size",
        "--data.eval_envs",
        "--data.total_steps",
    ):
        assert field in out.stdout, field
    assert "K, how many recent policies the actors draw from" in out.stdout
    assert "default: 32" in out.stdout
    assert "limit_val_batches" not in out.stdout  # Lightning's whole list is behind --help-all
    assert "limit_val_batches" in run_cli("fit", "--help-all").stdout


def test_video_without_an_mp4_writer_fails_before_rendering(tmp_path):
    # imageio's ffmpeg backend made unimportable in this process only
    code = (
        "import sys; sys.modules['imageio_ffmpeg'] = None\n"
        "from vaco.commands.cli import main\n"
        f"sys.exit(main(['evaluate', '--ckpt', {str(tmp_path / 'none.ckpt')!r}, '--video', 'x.mp4']))\n"
    )
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "pip install -e '.[video]'" in out.stderr and "x.mp4" in out.stderr
    assert "return" not in out.stdout  # no episode was run, nothing rendered
    assert time.monotonic() - start < 60


# a two-iteration PPO-clip fit on InvertedPendulum (seconds)
TINY_FIT = (
    "fit",
    "--config",
    str(CONFIGS / "env" / "inverted_pendulum.yaml"),
    "--config",
    str(CONFIGS / "algo" / "ppo_clip.yaml"),
    "--data.init_args.num_envs",
    "2",
    "--data.init_args.num_steps",
    "64",
    "--data.init_args.total_steps",
    "128",
    "--model.init_args.num_minibatches",
    "2",
    "--model.init_args.update_epochs",
    "1",
    "--data.init_args.eval_episodes",
    "1",
)


@pytest.mark.slow
def test_fit_ends_with_vacos_summary_not_lightnings_notice(tmp_path):
    out = run_cli(
        *TINY_FIT,
        "--trainer.enable_progress_bar",
        "false",
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert "max_epochs=1" not in text and "vaco: training finished." in out.stdout
    assert "vaco evaluate --ckpt" in out.stdout and "vaco ui" in out.stdout


@pytest.mark.slow
def test_a_sqlite_store_keeps_its_runs_artifacts_beside_its_file_not_in_the_working_directory(tmp_path):
    """MLflow would put the config and the checkpoints in ./mlruns of whichever directory first
    created the experiment; vaco puts them in mlruns/<experiment> beside the database file."""
    import mlflow

    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store.mkdir(), elsewhere.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    out = run_cli(
        *TINY_FIT,
        "--trainer.logger.init_args.experiment_name",
        "my study/v2",
        cwd=elsewhere,
        env={"MLFLOW_TRACKING_URI": uri},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("my study/v2")
    assert experiment.artifact_location == str(store / "mlruns" / "my_study_v2")
    (run,) = client.search_runs([experiment.experiment_id])
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert artifacts.is_relative_to(store / "mlruns" / "my_study_v2")
    assert (artifacts / "config.yaml").is_file() and list(artifacts.rglob("*.ckpt")), sorted(artifacts.rglob("*"))
    assert not (elsewhere / "mlruns").exists(), sorted((elsewhere / "mlruns").rglob("*"))


@pytest.mark.slow
def test_log_model_false_keeps_one_copy_of_the_checkpoints(tmp_path):
    """By default a run's checkpoints are also copied into its MLflow artifacts (so the store alone,
    a server's included, holds the weights); `--trainer.logger.init_args.log_model false` keeps the
    one copy in the checkpoint folder: the artifacts keep the config, no checkpoint."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        *TINY_FIT, "--trainer.logger.init_args.log_model", "false", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri}
    )
    assert out.returncode == 0, out.stderr[-2000:]
    client = mlflow.MlflowClient(uri)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert (artifacts / "config.yaml").is_file() and not list(artifacts.rglob("*.ckpt")), sorted(artifacts.rglob("*"))
    kept = [p for p in tmp_path.rglob("*.ckpt") if not p.is_relative_to(artifacts)]
    assert any(p.name == "last.ckpt" for p in kept), sorted(tmp_path.rglob("*.ckpt"))


AS_ANOTHER_ACCOUNT = """
import json, sys, urllib.request, urllib.error
for method, url, body in json.loads(sys.argv[1]):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        code = urllib.request.urlopen(req, timeout=20).status
    except urllib.error.HTTPError as err:
        code = err.code
    print(code)
"""


@pytest.mark.slow
def test_vaco_ui_serves_its_owner_only_and_stops_on_ctrl_c(tmp_path):
    """`vaco ui` serves the store on 127.0.0.1 to the address it prints (its token, then a cookie;
    `Authorization: Bearer` for a client). As `nobody` (a second local account, through `runuser`),
    with no token, a read (a run, a search), a write (a tag, a metric), a delete and an artifact
    download each get 401 and change nothing; the token is in no process's command line (which
    every account can read). Ctrl-C stops the UI and everything it started."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run = client.create_run(client.create_experiment("vaco")).info.run_id  # a store with something in it
    client.log_metric(run, "eval/return", 1.0, step=1)
    other_account = os.geteuid() == 0 and shutil.which("runuser") is not None
    port = free_port()
    ui = _start_ui(port, tmp_path, uri)
    try:
        line, lines = "", []
        deadline = time.monotonic() + 120
        while "vaco_token=" not in line:  # the line `vaco ui` prints (the server prints its own first)
            assert ui.poll() is None and time.monotonic() < deadline, line
            line = ui.stdout.readline()
            lines.append(line)
        token = re.search(r"\?vaco_token=([\w-]+)#", line).group(1)
        host = re.search(r"vaco ui: http://([^/]+)/", line).group(1)
        assert re.fullmatch(rf"vaco-[0-9a-f]{{10}}\.localhost:{port}", host), host  # the UI's own site
        import http.client

        def ask(path: str, **headers) -> tuple[int, dict, bytes]:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # *.localhost is loopback
            connection.request("GET", path, headers=headers)
            answer = connection.getresponse()
            body = answer.read(2000)
            connection.close()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, body

        status, head, _ = ask(f"/?vaco_token={token}", Host=host)  # the printed address: a cookie, then out
        assert status == 303 and head["location"] == "/" and f"vaco_ui_{port}={token}" in head["set-cookie"]
        assert "samesite=strict" in head["set-cookie"].lower() and "domain" not in head["set-cookie"].lower()
        status, head, _ = ask(f"/?vaco_token={token}", Host=f"127.0.0.1:{port}")  # by hand at 127.0.0.1
        assert status == 303 and head["location"] == f"http://{host}/?vaco_token={token}" and "set-cookie" not in head
        cookie = f"vaco_ui_{port}={token}"
        status, _, body = ask("/", Host=host, Cookie=cookie)
        assert status == 200 and b"<html" in body.lower()
        assert ask("/", Host=f"127.0.0.1:{port}", Cookie=cookie)[0] == 401  # its cookie counts on its host only
        evil = {"Host": host, "Cookie": cookie, "Origin": f"http://127.0.0.1:{port + 1}"}
        assert ask("/ajax-api/2.0/mlflow/experiments/search?max_results=5", **evil)[0] == 403  # another origin
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search",
            data=b'{"max_results": 10}',
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as found:
            assert "vaco" in [e["name"] for e in json.loads(found.read())["experiments"]]
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            assert token.encode() not in cmdline, pid
        if other_account:
            base = f"http://127.0.0.1:{port}"
            api = f"{base}/api/2.0/mlflow"
            metric = {"run_id": run, "key": "eval/return", "value": 1e9, "timestamp": 0, "step": 2}
            tries = [
                ("GET", f"{api}/runs/get?run_id={run}", None),
                ("POST", f"{api}/experiments/search", {"max_results": 10}),
                ("POST", f"{api}/runs/set-tag", {"run_id": run, "key": "evil", "value": "1"}),
                ("POST", f"{api}/runs/log-metric", metric),
                ("POST", f"{api}/runs/delete", {"run_id": run}),
                ("GET", f"{base}/get-artifact?path=x&run_uuid={run}", None),
                ("GET", f"{base}/api/2.0/mlflow-artifacts/artifacts/0/{run}/artifacts/x", None),
                ("GET", f"{base}/", None),
                ("GET", f"{base}/?vaco_token=wrong", None),
            ]
            python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
            other = subprocess.run(
                ["runuser", "-u", "nobody", "--", python, "-c", AS_ANOTHER_ACCOUNT, json.dumps(tries)],
                capture_output=True,
                text=True,
                timeout=120,
                cwd="/",
            )
            assert other.returncode == 0, other.stderr
            assert other.stdout.split() == ["401"] * len(tries), list(zip(tries, other.stdout.split()))
            found = client.get_run(run)
            assert "evil" not in found.data.tags and found.info.lifecycle_stage == "active"
            assert [m.value for m in client.get_metric_history(run, "eval/return")] == [1.0]
        ui.send_signal(signal.SIGINT)  # Ctrl-C
        assert ui.wait(timeout=60) == 0
        output = "".join(lines) + ui.stdout.read()
        assert "Warning" not in output, output  # MLflow's server imported a deprecated Starlette module
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()
    deadline = time.monotonic() + 30
    while _serving(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _serving(port), "a UI process outlived `vaco ui`"
    if not other_account:
        pytest.skip("served and stopped as it should; the second-account part needs root and runuser")


@pytest.mark.slow
def test_vaco_ui_lands_on_the_runs_table_in_a_fresh_browser(tmp_path):
    """What a new user sees: the address `vaco ui` prints, opened in headless Chromium with a new,
    empty profile, shows the experiment's runs table in the model-training view (MLflow 3's default
    for a fresh browser is its GenAI pages: Overview, Traces, Token usage), with the study's columns
    and their values (MLflow's own first columns are Source, Models and Dataset, no metric). A
    screenshot is kept. The addresses a user types or clicks without vaco's query (the root, an
    experiment's link) open the training view too, each in a fresh browser (once the token has set
    its cookie: here each fresh profile gets in by the address with the token); without the token, a
    fresh browser sees only the refusal."""
    import mlflow

    chromium = browser.chromium()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("vaco-first-look")
    for name in ("vaco Hopper-v5 K=4 s1", "ppo_clip Hopper-v5 K=4 s1"):
        run = client.create_run(experiment, run_name=name)
        for key, value in {"algorithm": name.split()[0], "env": "Hopper-v5", "K": "4", "seed": "1"}.items():
            client.log_param(run.info.run_id, key, value)
        client.log_metric(run.info.run_id, "eval/return", 123.5, step=4096)
        client.log_metric(run.info.run_id, "lag/forward_tv", 0.0987, step=4096)
        client.log_metric(run.info.run_id, "lag/backward_tv", 8.748329e-08, step=4096)
        client.set_terminated(run.info.run_id)
    port = free_port()
    ui = _start_ui(port, tmp_path, uri)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while not line.startswith("vaco ui: http"):  # the server prints its own address first
            assert ui.poll() is None and time.monotonic() < deadline, line
            line = ui.stdout.readline()
        url = line.split("vaco ui: ", 1)[1].split()[0]
        token = re.search(r"\?vaco_token=([\w-]+)#", url).group(1)
        host = re.search(r"^http://(vaco-[0-9a-f]{10}\.localhost:\d+)/", url).group(1)
        assert url == (
            f"http://{host}/?vaco_token={token}#/experiments/{experiment}/runs"
            "?workflowType=machine_learning&viewStateShareKey=vaco"
        ), line
        entry = f"http://127.0.0.1:{port}/?vaco_token={token}"  # by hand at 127.0.0.1: sent on to the UI's host
        assert "the runs of 'vaco-first-look'" in line
        flags = browser.ONE_PAGE
        dom = subprocess.run(
            [chromium, *flags, f"--user-data-dir={tmp_path / 'profile-dom'}", "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=180,
        ).stdout
        assert "vaco Hopper-v5 K=4 s1" in dom and "ppo_clip Hopper-v5 K=4 s1" in dom and ">Runs<" in dom
        assert "Token" not in dom  # not the GenAI overview (Traces, Latency, Token usage)
        # the study's columns, with each run's values, without a click
        for column, value in (("eval/return", "123.5"), ("lag/forward_tv", "0.0987")):
            assert f'id="cell-metrics.`{column}`' in dom and f">{value}</span>" in dom, column
        assert 'id="cell-params.`K`' in dom and ">ppo_clip</span>" in dom
        assert ">8.748329e-8</span>" in dom  # a small value whole, its exponent too

        def left_edge(column: str) -> tuple[int, int]:  # a header cell's place in the scrolled pane
            found = re.search(
                rf'col-id="{re.escape(column)}" aria-sort[^>]*style="left: (\d+)px; width: (\d+)px;"', dom
            )
            assert found, column
            return int(found.group(1)), int(found.group(2))

        # the run's coordinates first, on screen without scrolling in a 1400-pixel window (the
        # pane scrolled beside the run's name shows ~700 pixels), the metrics after them
        seed_left, seed_width = left_edge("params.`seed`")
        assert max(left_edge(f"params.`{p}`")[0] for p in ("algorithm", "env", "K")) < seed_left
        assert seed_left + seed_width <= 500 and left_edge("metrics.`eval/return`")[0] >= seed_left + seed_width
        shot = tmp_path / "vaco_ui.png"
        subprocess.run(
            [chromium, *flags, f"--user-data-dir={tmp_path / 'profile-shot'}", f"--screenshot={shot}", url],
            capture_output=True,
            timeout=180,
        )
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

        def page(address: str, profile: str) -> str:  # a fresh browser opening an address by hand
            return subprocess.run(
                [chromium, *flags, f"--user-data-dir={tmp_path / profile}", "--dump-dom", address],
                capture_output=True,
                text=True,
                timeout=180,
            ).stdout

        # the experiment's link as the home page and the experiments list give it (no workflowType):
        # MLflow alone opens a fresh browser on the GenAI view there (Traces, Token usage)
        linked = page(f"{entry}#/experiments/{experiment}", "profile-link")
        assert "vaco Hopper-v5 K=4 s1" in linked and ">Runs<" in linked and "Token" not in linked
        assert "Ask questions about your experiments" not in linked  # the Assistant did not open over it

        # the root: its page reads the same in both views, but its sidebar's switch says which one
        # is on (and every link from it follows): on the root as with ?workflowType=machine_learning
        def switch(dom: str) -> tuple[str, str]:
            found = re.search(r'class="([^"]*)">GenAI</span>.*?class="([^"]*)">Model training<', dom, re.S)
            assert found, dom[-2000:]
            return found.groups()

        root = switch(page(f"{entry}", "profile-root"))
        training = switch(page(f"{entry}#/?workflowType=machine_learning", "profile-ml"))
        genai = switch(page(f"{entry}#/?workflowType=genai", "profile-genai"))
        # without the token a fresh browser sees no run, only the refusal
        shut = page(f"http://127.0.0.1:{port}/#/experiments/{experiment}", "profile-no-token")
        assert "vaco Hopper-v5 K=4 s1" not in shut and "no access without its token" in shut
        assert root == training != genai
        ui.send_signal(signal.SIGINT)
        assert ui.wait(timeout=60) == 0
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()


@pytest.mark.slow
def test_vaco_ui_lists_a_sweeps_runs_and_draws_their_curves(tmp_path):
    """A sweep's experiment at the address `vaco ui` prints, in headless Chromium with a fresh
    profile: every cell is a row with its algorithm, K, seed and eval/return (MLflow folds a sweep's
    cells under one collapsed parent row, its columns all "-", when it orders by start time), and the
    chart view draws eval/return first, with the cells' curves (not "No charts in this section")."""
    import mlflow

    from vaco.tracking import CELL_TAG, PARENT_RUN_ID_TAG, PARENT_TAG

    chromium = browser.chromium()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("vaco-sweep-look")
    parent = client.create_run(experiment, run_name="sweep", tags={PARENT_TAG: "true"}).info.run_id
    cells = {}
    for algorithm in ("vaco", "ppo_clip"):
        for K in (1, 4):
            cell = f"{algorithm}-hopper-K{K}-s7"
            run = client.create_run(
                experiment, run_name=cell, tags={PARENT_RUN_ID_TAG: parent, CELL_TAG: cell}
            ).info.run_id
            for key, value in {"algorithm": algorithm, "env": "Hopper-v5", "K": str(K), "seed": "7"}.items():
                client.log_param(run, key, value)
            final = {"vaco": 1500.0, "ppo_clip": 900.0}[algorithm] + 11.25 * K
            for step, value in ((4096, 100.0), (8192, final / 2), (12288, final)):
                client.log_metric(run, "eval/return", value, step=step)
            client.log_metric(run, "lag/forward_tv", 0.05, step=12288)
            client.set_terminated(run)
            cells[cell] = final
    client.set_terminated(parent)
    port = free_port()
    ui = _start_ui(port, tmp_path, uri)
    flags = browser.ONE_PAGE
    try:
        line = ""
        deadline = time.monotonic() + 120
        while not line.startswith("vaco ui: http"):
            assert ui.poll() is None and time.monotonic() < deadline, line
            line = ui.stdout.readline()
        url = line.split("vaco ui: ", 1)[1].split()[0]
        assert "the runs of 'vaco-sweep-look'" in line

        def page(address: str, profile: str, *extra: str) -> str:
            return subprocess.run(
                [chromium, *flags, f"--user-data-dir={tmp_path / profile}", *extra, "--dump-dom", address],
                capture_output=True,
                text=True,
                timeout=180,
            ).stdout

        table = page(url, "profile-table")
        for cell, final in cells.items():
            assert cell in table, (cell, table[-3000:])
            assert f">{final:g}</span>" in table, (cell, final)
        assert 'id="cell-params.`K`' in table and 'id="cell-params.`seed`' in table
        # the chart view: drawn once its charts are in view (plotly, loaded late): more virtual time
        charts = page(url + "&compareRunsMode=CHART", "profile-charts", "--virtual-time-budget=60000")
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", charts))
        # the score's section first, its chart drawn against the step, a curve for every cell
        assert 0 <= text.find("eval (1) ") < text.find("lag (1) ") and "eval/return" in text, text[-3000:]
        curves = re.findall(r"([\w-]+) \(eval/return\)", text)
        assert set(cells) <= set(curves), curves
        assert ">Step<" in charts
        shot = tmp_path / "vaco_ui_sweep_charts.png"
        subprocess.run(
            [
                chromium,
                *flags,
                f"--user-data-dir={tmp_path / 'profile-shot'}",
                f"--screenshot={shot}",
                url + "&compareRunsMode=CHART",
            ],
            capture_output=True,
            timeout=180,
        )
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        ui.send_signal(signal.SIGINT)
        assert ui.wait(timeout=60) == 0
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()


def _vaco_cells(client, experiment: str, cells: dict[str, dict[str, str]], tv: float = 0.05) -> dict[str, str]:
    """A sweep's runs as vaco logs them: coordinates, the swept axes and a nested copy of each, a score."""
    out = {}
    for name, axes in cells.items():
        run = client.create_run(experiment, run_name=name).info.run_id
        params = {
            "algorithm": "vaco",
            "env": "Hopper-v5",
            "env_id": "Hopper-v5",
            "K": "4",
            "seed": "1",
            "axes": "delta,rho_bar",
            "lr": "0.0003",
            **axes,
            **{f"objective.{k}": v for k, v in axes.items()},
        }
        for key, value in params.items():
            client.log_param(run, key, value)
        client.log_metric(run, "eval/return", 100.0 + len(out), step=4096)
        client.log_metric(run, "lag/backward_tv", tv, step=4096)
        client.set_terminated(run)
        out[name] = run
    return out


def test_a_runs_view_shows_the_fields_that_tell_the_runs_apart_and_no_copy_of_one(tmp_path):
    import mlflow

    from vaco.commands.ui_view import differing_params

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("tiny")
    cells = {"vaco": {"delta": "0.2", "rho_bar": "1.0"}, "vaco-delta0.4": {"delta": "0.4", "rho_bar": "1.0"}}
    _vaco_cells(client, experiment, {**cells, "vaco-rho2": {"delta": "0.2", "rho_bar": "2.0"}})
    runs = client.search_runs([experiment])
    # the axes first; env_id (env's copy), objective.* (the axes' copies), lr (the same everywhere) left out
    assert differing_params(runs) == ["delta", "rho_bar"]
    two = [r for r in runs if r.info.run_name != "vaco-rho2"]
    assert differing_params(two) == ["delta"]


ATTACK_PAGE = """<!doctype html><html><body><pre id="out">running</pre><script>
const UI = %(ui)s, PORT = %(port)d, RUN = %(run)s;
async function attempt(url, options) {
  try { const r = await fetch(url, Object.assign({credentials: 'include'}, options || {}));
        return r.status + ' ' + (await r.text()).slice(0, 300); }
  catch (e) { return 'blocked ' + e.name; }
}
const write = {method: 'POST', headers: {'Content-Type': 'text/plain'},
               body: JSON.stringify({run_id: RUN, key: 'evil', value: '1'})};
window.results = Promise.all([
  attempt('/probe'),  // this server's own path: does the browser send it the UI's cookie?
  attempt('http://127.0.0.1:' + PORT + '/ajax-api/2.0/mlflow/experiments/search?max_results=5'),
  attempt('http://' + UI + '/ajax-api/2.0/mlflow/experiments/search?max_results=5'),
  attempt('http://127.0.0.1:' + PORT + '/ajax-api/2.0/mlflow/runs/set-tag', write),
  attempt('http://' + UI + '/ajax-api/2.0/mlflow/runs/set-tag', write),
]).then(r => { document.getElementById('out').textContent = r.join('\\n'); return r; });
</script></body></html>"""


@pytest.mark.slow
def test_no_other_local_server_gets_the_ui_cookie_or_reads_through_the_owners_browser(tmp_path):
    """The owner's browser opens the printed address (the runs table shows); then a page another local
    server serves on 127.0.0.1 at another port (this test's own, as another account's would be) asks the
    UI, through that same browser, for the experiments and to tag a run, at 127.0.0.1 and at the UI's own
    host name, with credentials. Its server receives no cookie of the UI's on any request, every ask is
    refused or unreadable, and the run has no new tag. The browser does hold the UI's cookie (for the UI's
    host alone), so nothing here passes for want of one."""
    import http.server
    import threading

    import mlflow

    from helpers.browser import Browser

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("vaco-owner")
    run = client.create_run(experiment, run_name="vaco Hopper-v5 K=4 s1").info.run_id
    for key, value in {"algorithm": "vaco", "env": "Hopper-v5", "K": "4", "seed": "1"}.items():
        client.log_param(run, key, value)
    client.log_metric(run, "eval/return", 123.5, step=4096)
    client.set_terminated(run)
    port = free_port()
    ui = _start_ui(port, tmp_path, uri)
    seen: list[str] = []  # the Cookie header of every request the other server received

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Cookie") or "")
            body = (ATTACK_PAGE % {"ui": json.dumps(host), "port": port, "run": json.dumps(run)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body if self.path.startswith("/attack") else b"probe")

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        line = ""
        deadline = time.monotonic() + 120
        while not line.startswith("vaco ui: http"):
            assert ui.poll() is None and time.monotonic() < deadline, line
            line = ui.stdout.readline()
        url = line.split("vaco ui: ", 1)[1].split()[0]
        host = re.search(r"^http://([^/]+)/", url).group(1)
        with Browser(tmp_path / "profile") as browser:
            browser.open(url, settle=10)
            assert "vaco Hopper-v5 K=4 s1" in browser.evaluate("document.body.innerText")  # the owner's view
            cookies = [c for c in browser.cookies() if c["name"].startswith("vaco_ui")]
            assert [(c["domain"], c["httpOnly"], c["sameSite"]) for c in cookies] == [
                (host.split(":")[0], True, "Strict")
            ], cookies
            browser.open(f"http://127.0.0.1:{other.server_port}/attack.html", settle=1)
            results = browser.evaluate("window.results", wait=True)
        assert len(results) == 5 and results[0] == "200 probe", results
        for answer in results[1:]:
            assert not answer.startswith("200") and "experiments" not in answer and "vaco-owner" not in answer, results
        assert seen and not any("vaco_ui" in cookie for cookie in seen), seen
        assert "evil" not in client.get_run(run).data.tags
        ui.send_signal(signal.SIGINT)
        assert ui.wait(timeout=60) == 0
    finally:
        other.shutdown()
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()


@pytest.mark.slow
def test_an_experiment_made_after_the_ui_started_opens_with_its_view_from_a_plain_link(tmp_path):
    """A sweep's experiment created while `vaco ui` serves (the three VACO cells of a tiny sweep: main,
    delta 0.4, rho_bar 2), opened in a fresh Chromium from a plain link (no view in it, as the
    experiments list gives it): one row a cell with a delta and a rho_bar column and each cell's values,
    and a TV of 9.546056e-09 shown whole (not cut to a number that reads as 9.5)."""
    import mlflow

    chromium = browser.chromium()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    client.log_metric(client.create_run(client.create_experiment("before")).info.run_id, "eval/return", 1.0)
    port = free_port()
    ui = _start_ui(port, tmp_path, uri)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while not line.startswith("vaco ui: http"):
            assert ui.poll() is None and time.monotonic() < deadline, line
            line = ui.stdout.readline()
        entry = line.split("vaco ui: ", 1)[1].split()[0].split("#")[0]
        experiment = client.create_experiment("vaco-tiny-after")  # after the UI started
        cells = {"vaco": {"delta": "0.2", "rho_bar": "1.0"}, "vaco-delta0.4": {"delta": "0.4", "rho_bar": "1.0"}}
        _vaco_cells(client, experiment, {**cells, "vaco-rho2": {"delta": "0.2", "rho_bar": "2.0"}}, tv=9.546056e-09)
        dom = subprocess.run(
            [
                chromium,
                *browser.ONE_PAGE,
                f"--user-data-dir={tmp_path / 'p'}",
                "--dump-dom",
                f"{entry}#/experiments/{experiment}",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        ).stdout
        for name in ("vaco", "vaco-delta0.4", "vaco-rho2"):
            assert f">{name}<" in dom, (name, dom[-3000:])
        for column in ("params.`delta`", "params.`rho_bar`", "params.`K`", "metrics.`lag/backward_tv`"):
            assert f'id="cell-{column}' in dom, column
        assert ">0.4</span>" in dom and ">2.0</span>" in dom and ">9.546056e-9</span>" in dom
        assert 'id="cell-params.`env_id`' not in dom  # env's copy is not a column
        ui.send_signal(signal.SIGINT)
        assert ui.wait(timeout=60) == 0
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()


def _start_ui(port: int, cwd, uri: str) -> subprocess.Popen:
    """`vaco ui` on ``uri`` at ``port``, its output (the printed address first) on a pipe, in its own group."""
    return subprocess.Popen(
        [VACO, "ui", "--port", str(port)],
        cwd=cwd,
        env=dict(os.environ, MLFLOW_TRACKING_URI=uri),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _serving(port: int) -> list[str]:
    """Live processes started for this port (the UI's server and its workers)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"--port {port}" in cmd or f"127.0.0.1:{port}" in cmd:
            found.append(cmd)
    return found


def test_every_config_path_the_docs_name_exists():
    """Each `--config configs/...` in README.md and docs/*.md names a file that is there (a
    `$name` in a loop matches at least one file), and each `configs/...yaml` they mention too."""
    import glob
    import re

    repo = Path(__file__).resolve().parents[1]
    named = {}
    for doc in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        for path in re.findall(r"(?<![\w/.-])(configs/[\w/$.{}-]+\.yaml)", doc.read_text()):
            named.setdefault(path, doc.name)
    assert len(named) > 20  # the search finds the docs' commands
    missing = [
        f"{path} ({doc})" for path, doc in named.items() if not glob.glob(str(repo / re.sub(r"\$\{?\w+\}?", "*", path)))
    ]
    assert not missing, missing
