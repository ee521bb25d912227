"""docs/extending.md, followed literally; and resuming a run with a larger budget.

The doc test takes every ``<!-- file: NAME -->`` block out of the page, writes it into an empty
temporary directory (with ``configs/`` linked in, as in a clone), and runs every
``<!-- run -->`` command from there with no PYTHONPATH, for a tiny budget.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
import yaml

from helpers.runs import REPO, VACO, metric_histories

DOC = REPO / "docs" / "extending.md"
# a tiny budget appended to every `vaco fit` of the doc
TINY_FIT = [
    "--data.init_args.num_envs",
    "2",
    "--data.init_args.num_steps",
    "64",
    "--data.init_args.total_steps",
    "384",
    "--data.init_args.eval_every",
    "0",
    "--data.init_args.eval_episodes",
    "2",
    "--data.init_args.eval_envs",
    "2",
    "--model.init_args.update_epochs",
    "2",
    "--model.init_args.num_minibatches",
    "4",
    "--trainer.enable_progress_bar",
    "false",
]


def doc_blocks() -> tuple[dict[str, str], list[list[str]]]:
    text = DOC.read_text()
    files = dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S))
    commands = []
    for block in re.findall(r"<!-- run -->\n```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("#")[0].strip()
            if line:
                commands.append(shlex.split(line))
    return files, commands


def _run(args: list[str], cwd, uri: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The doc's files in an empty directory, beside a link to the repo's configs."""
    root = tmp_path_factory.mktemp("my_project")
    files, commands = doc_blocks()
    assert {
        "my_objectives.py",
        "ratio_cap.yaml",
        "my_advantages.py",
        "ppo_td0.yaml",
        "lr_sweep.yaml",
        "cap_sweep.yaml",
    } <= set(files)
    for name, body in files.items():
        (root / name).write_text(body)
    (root / "configs").symlink_to(REPO / "configs")
    (root / "scripts").symlink_to(REPO / "scripts")  # the clone's scripts (plan_power.py)
    return root, commands, f"sqlite:///{root / 'mlflow.db'}"


def _commands(commands, verb: str) -> list[list[str]]:
    return [[VACO, *c[1:]] for c in commands if c[0].endswith("vaco") and c[1] == verb]


@pytest.mark.slow
def test_the_doc_objective_and_advantage_train_from_the_users_directory(project):
    root, commands, uri = project
    fits = _commands(commands, "fit")
    assert len(fits) == 2
    for command in fits:
        out = _run([*command, *TINY_FIT], root, uri)
        assert out.returncode == 0, out.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("vaco").experiment_id])
    params = {r.data.params["algorithm"]: r.data.params for r in runs}
    # named by the class's own `names` (the doc's YAML sets no algorithm_name)
    assert "algorithm_name" not in (root / "ratio_cap.yaml").read_text()
    assert params["ratio_cap"]["objective"] == "RatioCap" and params["ratio_cap"]["objective.cap"] == "2.0"
    assert params["ratio_cap"]["realigned"] == "False" and params["ratio_cap"]["variant_of"] == "None"
    assert params["ppo_td0"]["advantage_estimator"] == "TD0"
    assert all(r.info.status == "FINISHED" for r in runs)
    # ... and the report lists it (alphabetically after the paper's algorithms) as a main algorithm:
    # it is on the scale (0 or 1 with one run per task) and not among the variants
    out = _run([VACO, "report", "--experiment", "vaco", "--out", str(root / "report")], root, uri)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = (root / "report" / "summary.md").read_text()
    assert "| ratio_cap | 1 | RatioCap |" in summary and "| ppo_td0 | 1 | PPOClip |" in summary
    assert summary.index("| ppo_td0 | 1 | PPOClip |") < summary.index("| ratio_cap | 1 | RatioCap |")
    assert "ablation and control variants (none here)" in summary


def test_the_doc_objective_validates_its_field(project):
    root, commands, uri = project
    command = _commands(commands, "fit")[0]
    out = _run([*command, *TINY_FIT, "--model.init_args.objective.init_args.cap", "0"], root, uri)
    assert out.returncode == 2 and "`cap` must be > 0, got 0" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_the_doc_sweep_axis_lists_its_cells_and_runs(project):
    root, commands, uri = project
    sweeps = _commands(commands, "sweep")
    dry = next(c for c in sweeps if "--dry-run" in c and "lr_sweep.yaml" in c)
    out = _run(dry, root, uri)
    assert out.returncode == 0, out.stderr
    assert "18 cells" in out.stdout and "vaco-inverted_pendulum-K4-lr0.0001-s1" in out.stdout
    # the same file at a tiny budget, two cells of it
    config = yaml.safe_load((root / "lr_sweep.yaml").read_text())
    config["overrides"].update(
        {
            "data.init_args.num_envs": 2,
            "data.init_args.num_steps": 64,
            "data.init_args.total_steps": 256,
            "data.init_args.eval_episodes": 2,
            "data.init_args.eval_envs": 2,
            "model.init_args.update_epochs": 1,
            "model.init_args.num_minibatches": 2,
        }
    )
    (root / "tiny_lr_sweep.yaml").write_text(yaml.safe_dump(config))
    run = next(c for c in sweeps if "--dry-run" not in c and "lr_sweep.yaml" in c)
    tiny = [a.replace("lr_sweep.yaml", "tiny_lr_sweep.yaml") for a in run]
    out = _run([*tiny, "--only", "vaco-*-lr0.0001-s1", "--only", "vaco-*-lr0.001-s1"], root, uri)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    runs = [
        r
        for r in client.search_runs([client.get_experiment_by_name("vaco-lr").experiment_id])
        if "vaco.sweep.cell" in r.data.tags
    ]  # the cells (not the sweep's parent run)
    assert sorted(r.data.params["lr"] for r in runs) == ["0.0001", "0.001"]
    assert sorted(r.data.params["algorithm"] for r in runs) == ["vaco[lr=0.0001]", "vaco[lr=0.001]"]
    assert {r.data.tags["vaco.model.init_args.lr"] for r in runs} == {"0.0001", "0.001"}


def test_the_doc_objective_declares_its_own_sweep_axis(project):
    """`cap` is a grid axis because RatioCap declares it: no edit of the sweep."""
    root, commands, uri = project
    setup = next(c for c in commands if c[0] == "mkdir")
    assert (
        subprocess.run(" ".join(shlex.quote(a) if a != "&&" else a for a in setup), shell=True, cwd=root).returncode
        == 0
    )
    dry = next(c for c in _commands(commands, "sweep") if "cap_sweep.yaml" in c)
    out = _run(dry, root, uri)
    assert out.returncode == 0, out.stderr
    cells = re.findall(r"new\s+(\S+)", out.stdout)
    assert "12 cells" in out.stdout and len(cells) == 12
    assert sorted(c for c in cells if c.startswith("ratio_cap-") and c.endswith("-s1")) == [
        "ratio_cap-inverted_pendulum-K4-cap1.5-s1",
        "ratio_cap-inverted_pendulum-K4-cap4-s1",
        "ratio_cap-inverted_pendulum-K4-s1",  # 2.0 is the config's own value: no suffix
    ]
    assert sum(c.startswith("ppo_clip-") for c in cells) == 3  # ppo_clip takes no cap
    bad = yaml.safe_load((root / "cap_sweep.yaml").read_text())
    bad["grid"]["cap"]["cap"] = [0.0]
    (root / "bad_cap.yaml").write_text(yaml.safe_dump(bad))
    out = _run([VACO, "sweep", "--config", "bad_cap.yaml", "--dry-run"], root, uri)
    assert out.returncode == 2 and "`grid.cap.cap`: 0.0 is refused by RatioCap" in out.stderr
    assert "`cap` must be > 0" in out.stderr and "Traceback" not in out.stderr


def test_the_doc_study_is_a_pilot_a_sized_plan_and_a_declared_sweep(project):
    """The worked example from an objective to a verdict: its pilot and study files list their
    cells and the study's plan, and its sizing command runs (on a committed pilot's runs standing in
    for the doc's: two corrections at 4 seeds, K 1 and 4 on Hopper; few simulated studies)."""
    root, commands, uri = project
    if not (root / "my_configs").exists():
        setup = next(c for c in commands if c[0] == "mkdir")
        subprocess.run(" ".join(a for a in setup), shell=True, cwd=root, check=True)
    files, _ = doc_blocks()
    assert {"cap_pilot.yaml", "cap_study.yaml"} <= set(files)
    pilot = _run([VACO, "sweep", "--config", "cap_pilot.yaml", "--dry-run"], root, uri)
    assert pilot.returncode == 0, pilot.stderr
    assert "16 cells" in pilot.stdout and "ratio_cap-hopper-K4-s901" in pilot.stdout
    study = next(c for c in _commands(commands, "sweep") if "cap_study.yaml" in c)
    out = _run(study, root, uri)
    assert out.returncode == 0, out.stderr
    assert "96 cells" in out.stdout and "a family of 1 at looks 12, 24 seeds" in out.stdout
    assert "randomisation test" in out.stdout and "never decide" not in out.stdout
    sizing = next(c for c in commands if "scripts/plan_power.py" in c)
    data = str(REPO / "docs" / "data" / "lag_bench_pilot.csv.gz")
    argv = [
        a.replace("ratio_cap,vaco,4=cap_pilot.csv.gz", f"ratio_cap:decoupled_ppo,vaco:ppo_ewma,4={data}")
        for a in sizing
    ]
    assert argv != sizing, "the doc's --pilot changed: update the stand-in above"
    out = _run([sys.executable, *argv[1:], "--studies", "20", "--swaps", "99"], root, uri)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "12,24" in out.stdout.replace(", ", ",") and "16,32" in out.stdout.replace(", ", ","), out.stdout


def test_a_sweep_with_an_unimportable_class_path_starts_nothing(tmp_path):
    (tmp_path / "configs" / "algo").mkdir(parents=True)
    (tmp_path / "configs" / "env").symlink_to(REPO / "configs" / "env")
    (tmp_path / "configs" / "algo" / "mine.yaml").write_text(
        "model:\n  class_path: vaco.VacoModule\n  init_args:\n"
        "    objective: {class_path: not_here.Objective}\n    advantage: {class_path: vaco.advantages.GAE}\n"
    )
    (tmp_path / "configs" / "sweeps").mkdir()
    (tmp_path / "configs" / "sweeps" / "s.yaml").write_text(
        "experiment: broken\ngrid:\n  main: {algorithm: mine, env: inverted_pendulum}\n"
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = _run([VACO, "sweep", "--config", "configs/sweeps/s.yaml"], tmp_path, uri)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "mine.yaml: model.init_args.objective.class_path" in lines[0]
    assert "cannot import 'not_here.Objective'" in lines[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "sweeps").exists() and not (tmp_path / "mlflow.db").exists()


# ---------------------------------------------------------------- resume with a larger budget
BASE = [
    "--config",
    str(REPO / "configs" / "env" / "inverted_pendulum.yaml"),
    "--config",
    str(REPO / "configs" / "algo" / "vaco.yaml"),
    *TINY_FIT,
    "--data.init_args.policy_buffer_size",
    "2",
]


LR = 1e-3  # stated, so the schedule below does not lean on the module's default


def annealed(i: int, iterations: int) -> float:
    """CleanRL's linear annealing, written here apart from vaco: iteration i (0-based) of a run of
    ``iterations`` steps at ``LR * (1 - i / iterations)``."""
    return LR * (1.0 - i / iterations)


@pytest.mark.slow
def test_resume_with_a_larger_budget_continues_the_same_run_and_defining_fields_cannot_change(tmp_path):
    """Extending a finished 2-iteration run to 4: the same MLflow run, the budget's history, and
    the learning rate of the new budget's schedule from the first resumed iteration (it used to
    train that iteration at the old schedule's end, 0, and barely move: TV ~1e-7). The run's folder
    is moved between the two: the resume keeps writing its ``last.ckpt`` (it wrote ``last-v1.ckpt``
    beside it, and a later resume from ``last.ckpt`` took the older state)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    base = [*BASE, "--model.init_args.lr", str(LR)]
    (tmp_path / "before").mkdir()
    first = _run([VACO, "fit", *base, "--data.init_args.total_steps", "256"], tmp_path / "before", uri)
    assert first.returncode == 0, first.stderr[-3000:]
    tmp_path = (tmp_path / "before").rename(tmp_path / "after")
    ckpt = str(next(tmp_path.glob("checkpoints/*/last.ckpt")))
    run_id = next(tmp_path.glob("checkpoints/*")).name

    for change, field in (
        (["--seed_everything", "2"], "`data.init_args.seed` cannot change"),
        (
            ["--model.init_args.objective.init_args.delta", "0.4"],
            "`model.init_args.objective.init_args.delta` cannot change",
        ),
    ):
        out = _run(
            [VACO, "fit", *base, "--data.init_args.total_steps", "512", *change, "--ckpt_path", ckpt], tmp_path, uri
        )
        assert out.returncode == 2
        errors = [line for line in out.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and field in errors[0], out.stderr[-2000:]
        assert mlflow.MlflowClient(uri).get_run(run_id).info.status == "FINISHED"  # a refused resume changes nothing
    # a copy of the checkpoint whose weights do not fit the model (one layer of another width): one line,
    # exit 2, before the run is touched (it used to print Lightning's 40-line load error and mark it FAILED)
    misfit = torch.load(ckpt, weights_only=True)
    key = next(k for k in misfit["state_dict"] if k.startswith("actor.") and k.endswith("weight"))
    misfit["state_dict"][key] = torch.zeros(misfit["state_dict"][key].shape[0] + 1, misfit["state_dict"][key].shape[1])
    copy = tmp_path / "misfit" / "last.ckpt"
    copy.parent.mkdir()
    torch.save(misfit, copy)
    out = _run([VACO, "fit", *base, "--data.init_args.total_steps", "512", "--ckpt_path", str(copy)], tmp_path, uri)
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert out.returncode == 2 and len(errors) == 1 and "its weights do not fit the model" in errors[0], out.stderr
    assert key in errors[0] and "Traceback" not in out.stderr
    assert mlflow.MlflowClient(uri).get_run(run_id).info.status == "FINISHED"

    longer = _run([VACO, "fit", *base, "--data.init_args.total_steps", "512", "--ckpt_path", ckpt], tmp_path, uri)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert longer.stdout.splitlines()[0] == (
        "vaco fit: resuming to a budget of 512 env steps (--data.init_args.total_steps; the checkpoint's run had 256)"
    )
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("vaco").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # the same MLflow run
    history = metric_histories(uri, run_id)
    assert [s for s, _ in history["train/tv"]] == [128 * i for i in range(1, 5)]  # 2 iterations, then 2 more
    assert history["time/total_steps"] == [(0, 256.0), (256, 512.0)]  # the budget's history
    # train/lr is the rate each iteration stepped at: 2 of a 2-iteration run, then 2 of a 4-iteration one
    expected = [annealed(0, 2), annealed(1, 2), annealed(2, 4), annealed(3, 4)]
    assert [step for step, _ in history["train/lr"]] == [128, 256, 384, 512]
    assert [lr for _, lr in history["train/lr"]] == pytest.approx(expected, rel=1e-12)
    assert history["train/tv"][2][1] > 1e-4  # the first resumed iteration moved the policy
    assert runs[0].data.tags["total_steps"] == "512" and "total_steps" not in runs[0].data.params
    assert runs[0].info.status == "FINISHED"
    assert sorted(p.name for p in Path(ckpt).parent.iterdir()) == ["last.ckpt"]
    assert torch.load(ckpt, weights_only=True)["vaco"]["total_steps"] == 512  # the resumed state, in last.ckpt


@pytest.mark.slow
def test_resume_without_a_budget_keeps_the_checkpoints_and_says_so(tmp_path):
    """A resume that does not restate the budget runs to the checkpoint's, not the config file's
    (inverted_pendulum.yaml's 40,960 steps: it used to extend a 256-step run to 320 iterations)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    unbudgeted = [word for i, word in enumerate(BASE) if not any("total_steps" in w for w in (word, BASE[i - 1]))]
    assert "384" not in unbudgeted and "--data.init_args.total_steps" not in unbudgeted
    every = ["--checkpoint.every_n_iterations", "1"]
    first = _run([VACO, "fit", *unbudgeted, *every, "--data.init_args.total_steps", "256"], tmp_path, uri)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = next(tmp_path.glob("checkpoints/*/last.ckpt"))
    run_id = ckpt.parent.name
    again = _run([VACO, "fit", *unbudgeted, *every, "--ckpt_path", str(ckpt)], tmp_path, uri, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.splitlines()[0] == (
        "vaco fit: resuming to the checkpoint's budget of 256 env steps; the config's 40,960 is not used on a "
        "resume (--data.init_args.total_steps N runs it to N)"
    )
    history = metric_histories(uri, run_id)
    assert [s for s, _ in history["train/tv"]] == [128, 256]  # nothing more was trained
    assert history["time/total_steps"] == [(0, 256.0)]
    assert mlflow.MlflowClient(uri).get_run(run_id).data.tags["total_steps"] == "256"


@pytest.mark.slow
def test_resume_with_a_larger_budget_when_the_last_iteration_saved_the_checkpoint(tmp_path):
    """``checkpoint.every_n_iterations`` dividing the run (the demo: 100 iterations, every 10): the
    last iteration's own save is the last checkpoint, with its epoch not yet marked complete.
    A larger budget must still run the remaining iterations (it used to finish at once)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    every = ["--checkpoint.every_n_iterations", "1"]
    first = _run([VACO, "fit", *BASE, *every, "--data.init_args.total_steps", "256"], tmp_path, uri)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = str(next(tmp_path.glob("checkpoints/*/last.ckpt")))
    run_id = next(tmp_path.glob("checkpoints/*")).name
    longer = _run(
        [VACO, "fit", *BASE, *every, "--data.init_args.total_steps", "512", "--ckpt_path", ckpt], tmp_path, uri
    )
    assert longer.returncode == 0, longer.stderr[-3000:]
    history = metric_histories(uri, run_id)
    assert [s for s, _ in history["train/tv"]] == [128 * i for i in range(1, 5)]  # 2 iterations, then 2 more


def test_the_readme_example_is_the_docs_example():
    """The README's "Adding an objective" blocks are the doc's, so the doc test runs them too."""
    readme = dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S))
    files, _ = doc_blocks()
    assert readme and all(files[name] == body for name, body in readme.items())
    assert (
        ".venv/bin/vaco fit --config configs/env/inverted_pendulum.yaml --config ratio_cap.yaml"
        in (REPO / "README.md").read_text()
    )
