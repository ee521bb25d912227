"""End to end: the supervised start, then `vaco fit` with VACO-GRPO on the real Lightning Trainer
and an MLflow store in a temp dir, must raise the greedy test accuracy well above the start.

The setting is chosen so the improvement is large and reliable within ~1 minute of CPU: one
family ("boxes": a * b), whose weak teacher writes a + b in 60% of its demonstrations. After 800
supervised steps the policy knows the times table (~94% of its a * b samples are right) and the
mistake; greedy decoding picks the mistake (accuracy near 0) while ~36% of its samples take the
right operation, so almost every group of 8 completions carries the signal and RL only has to
move that one decision. Measured (data seeds 0, 2, 3, 4): start 0.015-0.03, 0.93-1.0 after 16
steps. The test asks for +0.5: a policy that never moves the decision stays under 0.1, and
one that moves it but forgets half the times table stays under 0.5.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import mlflow
import pytest

from vaco.commands.cli import main
from vaco.llm.sft import CpuSetting, prepare_cpu_setting

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "llm"


@pytest.mark.slow
def test_rlvr_raises_eval_accuracy_above_the_supervised_start(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    setting = CpuSetting(
        seed=0,
        families=["boxes"],
        error_rates={"boxes": 0.6},
        num_train=2000,
        num_test=200,
        num_sft=2000,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=128,
        sft_steps=800,
        sft_batch_size=64,
        sft_lr=2e-3,
    )
    summary = prepare_cpu_setting(str(tmp_path / "cpu"), setting, verbose=False)
    assert summary["test_accuracy"] < 0.5  # the supervised policy's greedy answer is mostly the mistake

    main(
        [
            "fit",
            "--config",
            str(CONFIGS / "env" / "gsm8k_cpu.yaml"),
            "--config",
            str(CONFIGS / "algo" / "vaco_grpo.yaml"),
            "--data.init_args.train_path",
            str(tmp_path / "cpu" / "train.jsonl"),
            "--data.init_args.test_path",
            str(tmp_path / "cpu" / "test.jsonl"),
            "--data.init_args.num_steps",
            "16",
            "--data.init_args.eval_every",
            "8",
            "--model.init_args.model_path",
            str(tmp_path / "cpu" / "model"),
            "--model.init_args.num_minibatches",
            "2",
            "--model.init_args.lr",
            "3e-4",
            "--seed_everything",
            "1",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--progress_bar.refresh_rate",
            "0",
        ]
    )

    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("vaco-llm-cpu").experiment_id])
    accuracy = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval/accuracy")}
    assert sorted(accuracy) == [0, 8, 16]
    assert accuracy[0] == pytest.approx(summary["test_accuracy"])  # the run starts from the cached SFT policy
    assert accuracy[16] >= accuracy[0] + 0.5, accuracy
    assert run.data.metrics["time/episodes"] == 16 * 16 * 8

    # `vaco evaluate` scores the LLM checkpoint: its greedy accuracy is the run's last eval/accuracy
    # (the same decoding on the same split), and pass@4 of sampled completions bounds their mean
    import subprocess
    import sys

    (ckpt,) = tmp_path.glob("checkpoints/*/last.ckpt")
    out = subprocess.run(
        [str(Path(sys.executable).with_name("vaco")), "evaluate", "--ckpt", str(ckpt), "--samples", "4"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    greedy = re.search(r"greedy accuracy ([0-9.]+) on 200 prompts", out.stdout)
    assert greedy and float(greedy.group(1)) == pytest.approx(accuracy[16], abs=5e-4), out.stdout
    sampled = re.search(r"pass@4 ([0-9.]+), mean accuracy of the 4 samples ([0-9.]+)", out.stdout)
    assert sampled and 0 < float(sampled.group(2)) <= float(sampled.group(1)) <= 1, out.stdout


@pytest.fixture(scope="module")
def tiny_setting(tmp_path_factory) -> Path:
    """A tiny supervised start (a 1-layer Llama and its tokenizer, train and test files), once a module."""
    root = tmp_path_factory.mktemp("cpu")
    setting = CpuSetting(
        seed=0,
        families=["boxes"],
        num_train=200,
        num_test=40,
        num_sft=200,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        sft_steps=20,
        sft_batch_size=16,
    )
    with warnings.catch_warnings():  # the supervised start warns about nothing (it warned on every step's loss)
        warnings.simplefilter("error")
        prepare_cpu_setting(str(root), setting, verbose=False)
    return root


def _vaco(*args: str, cwd: Path, uri: str, timeout: int = 900):
    import subprocess
    import sys

    vaco = str(Path(sys.executable).with_name("vaco"))
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1"}
    return subprocess.run([vaco, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _cell_runs(uri: str, experiment: str) -> tuple[list, list[str]]:
    """A sweep's cell runs in ``experiment`` and their cell names, sorted."""
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = [
        r
        for r in client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        if "vaco.sweep.cell" in r.data.tags
    ]
    return runs, sorted(r.data.tags["vaco.sweep.cell"] for r in runs)


def _report(experiment: str, tmp_path: Path, uri: str) -> str:
    """``vaco report`` on ``experiment`` (50 bootstrap draws, one run a group enough); its summary.md."""
    out = tmp_path / "report"
    args = ["report", "--experiment", experiment, "--out", str(out), "--reps", "50", "--min-runs", "1"]
    report = _vaco(*args, cwd=tmp_path, uri=uri, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    return (out / "summary.md").read_text()


@pytest.mark.slow
def test_the_papers_llm_grid_file_runs_end_to_end_on_the_tiny_model(tmp_path, tiny_setting):
    """configs/sweeps/llm_gsm8k.yaml, the paper's 36-cell GPU grid, through its own files (the sweep
    file, configs/llm/env/gsm8k_qwen.yaml, both algorithms) on the tiny model on this CPU: its cells
    with N in {1, 2} and seed 1, the model, data, sizes and device overridden (the launcher local:
    SLURM's path is tests/test_cluster.py's), then `vaco report` on the paper's experiment: accuracy
    against N, and the clip and filter fractions (the paper's figure) per algorithm and N."""
    import yaml

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    shipped = yaml.safe_load((CONFIGS.parent / "sweeps" / "llm_gsm8k.yaml").read_text())
    assert shipped["defaults"]["env"] == "gsm8k_qwen" and shipped["launcher"] == "slurm"
    sweep = dict(shipped, configs_dir=str(CONFIGS), output_dir=str(tmp_path / "out"), jobs=2, launcher="local")
    sweep["defaults"] = dict(shipped["defaults"], K=[1, 2], seed=[1])
    sweep["overrides"] = {
        "data.init_args.train_path": str(tiny_setting / "train.jsonl"),
        "data.init_args.test_path": str(tiny_setting / "test.jsonl"),
        "data.init_args.prompt_template": "{question}",  # the tiny model's own prompt (the Qwen one is for a base model)
        "data.init_args.num_steps": 4,
        "data.init_args.eval_every": 2,
        "data.init_args.prompts_per_minibatch": 2,
        "model.init_args.model_path": str(tiny_setting / "model"),
        "model.init_args.completions_per_prompt": 4,
        "model.init_args.max_prompt_length": 64,
        "model.init_args.max_completion_length": 32,
        "model.init_args.micro_batch_size": 4,
        "model.init_args.generation_batch_size": 8,
        "model.init_args.eval_batch_size": 8,
        "model.init_args.lr": 1e-4,
        "trainer.accelerator": "cpu",
    }
    (tmp_path / "gsm8k.yaml").write_text(yaml.safe_dump(sweep))
    out = _vaco("sweep", "--config", str(tmp_path / "gsm8k.yaml"), cwd=tmp_path, uri=uri)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs, cells = _cell_runs(uri, "vaco-llm-gsm8k")
    assert cells == [
        "grpo-gsm8k_qwen-K1-s1",
        "grpo-gsm8k_qwen-K2-s1",
        "vaco_grpo-gsm8k_qwen-K1-s1",
        "vaco_grpo-gsm8k_qwen-K2-s1",
    ]
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.params["N"] == r.data.tags["vaco.K"]
        assert r.data.params["dtype"] == "bfloat16"  # the paper's setting, computed in float32 on a CPU
    summary = _report("vaco-llm-gsm8k", tmp_path, uri)
    assert "4 finished runs on 1 task(s) (gsm8k); algorithms grpo, vaco_grpo; K in [1, 2]" in summary
    assert "Final eval/accuracy (raw)" in summary and (tmp_path / "report" / "iqm_vs_k.png").is_file()
    fractions = summary.split("## Filter and clip fractions")[1].split("\n## ")[0]
    rows = re.findall(r"\| (grpo|vaco_grpo) \| ([12]) \| [^|]+ \| (\d\.\d{4}) \| (\d\.\d{4}) \|", fractions)
    assert sorted((a, k) for a, k, _, _ in rows) == [
        ("grpo", "1"),
        ("grpo", "2"),
        ("vaco_grpo", "1"),
        ("vaco_grpo", "2"),
    ]
    assert (tmp_path / "report" / "filter_clip_fractions.png").is_file()


@pytest.mark.slow
def test_the_llm_grid_is_a_sweep_and_its_report_is_rliables(tmp_path, tiny_setting):
    """configs/sweeps/llm_cpu.yaml's design at a tiny budget: `vaco sweep` runs the LLM cells
    (K is N, the minibatches per generation batch, as RLVRModule declares) and `vaco report`
    scores them by eval/accuracy with the same rliable code as the MuJoCo runs."""

    import yaml

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    shipped = yaml.safe_load((CONFIGS.parent / "sweeps" / "llm_cpu.yaml").read_text())
    sweep = dict(shipped, configs_dir=str(CONFIGS), output_dir=str(tmp_path / "out"), jobs=2)
    sweep["defaults"] = dict(shipped["defaults"], K=[1, 2], seed=[1])
    sweep["grid"] = {"main": shipped["grid"]["main"]}
    sweep["overrides"] = {
        "data.init_args.train_path": str(tiny_setting / "train.jsonl"),
        "data.init_args.test_path": str(tiny_setting / "test.jsonl"),
        "data.init_args.num_steps": 4,
        "data.init_args.eval_every": 2,
        "data.init_args.prompts_per_minibatch": 4,
        "model.init_args.model_path": str(tiny_setting / "model"),
        "model.init_args.completions_per_prompt": 4,
    }
    (tmp_path / "llm.yaml").write_text(yaml.safe_dump(sweep))
    out = _vaco("sweep", "--config", str(tmp_path / "llm.yaml"), cwd=tmp_path, uri=uri)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs, cells = _cell_runs(uri, "vaco-llm-cpu")
    assert cells == [
        "grpo-gsm8k_cpu-K1-s1",
        "grpo-gsm8k_cpu-K2-s1",
        "vaco_grpo-gsm8k_cpu-K1-s1",
        "vaco_grpo-gsm8k_cpu-K2-s1",
    ]
    for r in runs:  # K set N, the LLM module's own lag
        assert r.data.params["N"] == r.data.params["K"] == r.data.tags["vaco.K"]
        assert r.data.params["score_metric"] == "eval/accuracy" and r.info.status == "FINISHED"
    summary = _report("vaco-llm-cpu", tmp_path, uri)
    assert "4 finished runs on 1 task(s) (gsm8k); algorithms grpo, vaco_grpo; K in [1, 2]" in summary
    assert "Final eval/accuracy (raw)" in summary and "| vaco_grpo K=2 | 1 | 1 |" in summary
    assert "rliable" in summary and len(list((tmp_path / "report").glob("*.png"))) >= 7
    assert "drop(None)" not in summary and "than None" not in summary  # no baseline: no sentence about one
    finals = re.findall(r"\| gsm8k \| \w+ \| \d \| (-?\d+\.\d+) (?:\+- |\(1 run\))", summary)
    assert finals and all(len(x.split(".")[1]) == 3 for x in finals)  # an accuracy in [0, 1]: 3 decimals


def _doc_files(name: str) -> dict[str, str]:
    """The ``<!-- file: NAME -->`` blocks of docs/``name``, as written."""
    text = (CONFIGS.parents[1] / "docs" / name).read_text()
    return dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S))


@pytest.mark.slow
def test_a_users_reward_module_and_a_boxed_dataset_run_from_the_docs_files(tmp_path, tiny_setting):
    """docs/llm.md's reward module and config, as written, on a \\boxed{} version of the tiny setting's
    problems (the doc's field names, JSONL): a short fit scores with the
    user's class; `vaco evaluate` rebuilds it only when named with --reward."""
    import json

    files = _doc_files("llm.md")
    assert set(files) == {"my_rewards.py", "my_math.yaml"}
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    math_dir = tmp_path / "data" / "math"
    math_dir.mkdir(parents=True)
    for split in ("train", "test"):
        rows = [json.loads(x) for x in (tiny_setting / f"{split}.jsonl").read_text().splitlines()]
        boxed = [
            {
                "problem": r["question"],
                "solution": re.sub(r"#### *(\S+)", r"so the answer is $\\boxed{\1}$", r["answer"]),
            }
            for r in rows
        ]
        (math_dir / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in boxed))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    fit = [
        "fit",
        "--config",
        str(CONFIGS / "env" / "gsm8k_cpu.yaml"),
        "--config",
        str(CONFIGS / "algo" / "vaco_grpo.yaml"),
        "--config",
        "my_math.yaml",
        "--model.init_args.model_path",
        str(tiny_setting / "model"),
        "--data.init_args.num_steps",
        "2",
        "--data.init_args.eval_every",
        "0",
        "--data.init_args.num_eval",
        "8",
        "--data.init_args.prompts_per_minibatch",
        "2",
        "--model.init_args.completions_per_prompt",
        "4",
    ]
    out = _vaco(*fit, cwd=tmp_path, uri=uri)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("vaco-llm-cpu").experiment_id])
    assert run.info.status == "FINISHED" and "train/reward" in run.data.metrics
    (ckpt,) = tmp_path.glob("checkpoints/*/last.ckpt")
    refused = _vaco("evaluate", "--ckpt", str(ckpt), cwd=tmp_path, uri=uri, timeout=300)
    assert refused.returncode == 2 and "give it with `--reward my_rewards.BoxedExact`" in refused.stderr
    scored = _vaco("evaluate", "--ckpt", str(ckpt), "--reward", "my_rewards.BoxedExact", cwd=tmp_path, uri=uri)
    assert scored.returncode == 0 and re.search(r"greedy accuracy [0-9.]+ on 8 prompts", scored.stdout), scored.stderr

    # the GSM8k reward cannot read a boxed solution: one line naming the record, before the model loads
    wrong = _vaco(*fit, "--data.init_args.reward", "vaco.llm.reward.GSM8k", cwd=tmp_path, uri=uri, timeout=300)
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert "`data.train_path`: record 1 of data/math/train.jsonl: GSM8k cannot read its 'solution'" in wrong.stderr
