"""The RLVR LightningModule through the real `vaco fit` CLI: configs instantiate, bad values fail
naming the field, micro-batching leaves the update unchanged, and resume is exact and continues
the MLflow run. A small random Llama stands in for the policy (no learning is asserted here)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
import torch

from vaco.commands.cli import main
from vaco.commands.fit import VacoCLI
from vaco.llm.data import DEFAULT_PROMPT_TEMPLATE, format_prompt
from vaco.llm.policy import tiny_causal_lm
from vaco.llm.synthetic import generate_splits, write_jsonl
from vaco.llm.tokenizer import train_tokenizer

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "llm"


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """A random tiny policy and small GSM8k-format files, as scripts/llm_prepare.py lays them out."""
    root = tmp_path_factory.mktemp("llm")
    splits = generate_splits(num_train=64, num_test=12, num_sft=64, seed=0)
    write_jsonl(splits["train"], str(root / "train.jsonl"))
    write_jsonl(splits["test"], str(root / "test.jsonl"))
    texts = [format_prompt(DEFAULT_PROMPT_TEMPLATE, p["question"]) + " " + p["answer"] for p in splits["sft"]]
    tokenizer = train_tokenizer(texts, vocab_size=300)
    torch.manual_seed(0)
    model = tiny_causal_lm(tokenizer, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model.save_pretrained(str(root / "model"))
    tokenizer.save_pretrained(str(root / "model"))
    return root


def fit_args(setting, tmp_path, *extra, objective="grpo.yaml"):
    return [
        "fit",
        "--config",
        str(CONFIGS / "env" / "gsm8k_cpu.yaml"),
        "--config",
        str(CONFIGS / "algo" / objective),
        "--data.init_args.train_path",
        str(setting / "train.jsonl"),
        "--data.init_args.test_path",
        str(setting / "test.jsonl"),
        "--data.init_args.prompts_per_minibatch",
        "2",
        "--data.init_args.num_steps",
        "4",
        "--data.init_args.eval_every",
        "2",
        "--model.init_args.model_path",
        str(setting / "model"),
        "--model.init_args.completions_per_prompt",
        "3",
        "--model.init_args.max_completion_length",
        "6",
        "--model.init_args.lr",
        "1e-2",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--progress_bar.refresh_rate",
        "0",
        *extra,
    ]


@pytest.fixture
def mlflow_env(tmp_path, monkeypatch):
    """Runs log to a fresh SQLite store in the test's temp dir; returns its URI."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.mark.parametrize("objective", ["grpo.yaml", "vaco_grpo.yaml"])
def test_cpu_configs_instantiate(setting, tmp_path, mlflow_env, objective):
    cli = VacoCLI(args=fit_args(setting, tmp_path, objective=objective)[1:], run=False)
    from vaco.llm import GSM8kDataModule, RLVRModule
    from vaco.objectives import PPOClip, TVFilter

    assert isinstance(cli.model, RLVRModule) and isinstance(cli.datamodule, GSM8kDataModule)
    objective_module = cli.model.objective
    if objective == "grpo.yaml":
        assert isinstance(objective_module, PPOClip) and cli.model.algorithm == "grpo"
        assert (objective_module.clip_epsilon, objective_module.clip_epsilon_high) == (0.2, 0.272)
    else:
        assert (
            isinstance(objective_module, TVFilter)
            and cli.model.algorithm == "vaco_grpo"
            and objective_module.delta == 0.05
        )
    assert objective_module.normalize_advantage is False


@pytest.mark.slow
@pytest.mark.parametrize(
    "objective",
    [
        *("tis", "tis_seq", "mis", "mis_seq", "cispo", "dppo_tv", "gspo", "oi_rho_tv"),
        *("m2po", "topr", "grpo_opsm", "kimi_k25", "grpo_ess_step", "grpo_lag_step"),
    ],
)
def test_every_llm_correction_fits_and_logs_the_lag_diagnostics(setting, tmp_path, mlflow_env, objective):
    """The corrections the LLM grid can run as arms: each config's short fit, its algorithm name,
    the ESS and the ratio's tail among its metrics."""
    assert main(fit_args(setting, tmp_path, "--data.init_args.num_steps", "2", objective=f"{objective}.yaml")) == 0
    client = mlflow.MlflowClient(mlflow_env)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.data.params["algorithm"] == objective
    assert {"lag/ess", "lag/ratio_p99", "lag/ratio_max", run.data.params["fraction_metric"]} <= set(run.data.metrics)


@pytest.mark.parametrize("objective", ["decoupled_ppo", "ppo_ewma"])
def test_an_objective_that_needs_a_proximal_policy_is_refused_in_one_line(
    setting, tmp_path, mlflow_env, objective, capsys
):
    name = "DecoupledPPO" if objective == "decoupled_ppo" else "PPOEWMA"
    # from a config whose settings the class takes (grpo.yaml's clip_epsilon_high is refused by name first)
    args = [
        *fit_args(setting, tmp_path, objective="tis.yaml"),
        "--model.init_args.objective",
        f"vaco.objectives.{name}",
    ]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("vaco fit: error:")]
    assert f"`model.objective`: {name} reads a proximal policy" in line


def test_a_chat_template_the_tokenizer_lacks_is_one_line_before_the_model_loads(setting, tmp_path, mlflow_env, capsys):
    """It failed after the model loaded: a 50-line traceback, a FAILED run and a checkpoint folder."""
    args = fit_args(setting, tmp_path, "--data.init_args.chat_template", "true")
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("vaco fit: error:")]
    assert "`data.chat_template` is true but the tokenizer in " in line and "has no chat template" in line
    assert not list(tmp_path.rglob("checkpoints"))
    assert not mlflow.MlflowClient(mlflow_env).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(mlflow_env).search_experiments()]
    )


def test_paper_config_prints_and_names_the_missing_model(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--config",
                str(CONFIGS / "env" / "gsm8k_qwen.yaml"),
                "--config",
                str(CONFIGS / "algo" / "vaco_grpo.yaml"),
                "--print_config",
            ]
        )
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    for line in (
        "model_path: models/Qwen2.5-0.5B",
        "lr: 1.0e-06",
        "prompts_per_minibatch: 32",
        "completions_per_prompt: 8",
        "max_prompt_length: 512",
        "max_completion_length: 512",
        "num_steps: 256",
        "delta: 0.05",
    ):
        assert line in printed
    # the model and data are not on this machine: constructing says which field to fix
    from vaco.llm import GSM8kDataModule, RLVRModule
    from vaco.objectives import TVFilter

    with pytest.raises(FileNotFoundError, match="`model.model_path`: no directory 'models/Qwen2.5-0.5B'"):
        RLVRModule(objective=TVFilter(delta=0.05, normalize_advantage=False), model_path="models/Qwen2.5-0.5B")
    with pytest.raises(FileNotFoundError, match="`data.train_path`: no file 'data/gsm8k/main/train"):
        GSM8kDataModule(
            train_path="data/gsm8k/main/train-00000-of-00001.parquet",
            test_path="data/gsm8k/main/test-00000-of-00001.parquet",
        )


@pytest.mark.parametrize(
    "override,field",
    [
        (("--model.init_args.num_minibatches", "0"), "model.num_minibatches"),
        (("--model.init_args.completions_per_prompt", "1"), "model.completions_per_prompt"),
        (("--model.init_args.lr", "-1"), "model.lr"),
        (("--model.init_args.temperature", "0"), "model.temperature"),
        (("--model.init_args.dtype", "int8"), "model.dtype"),
        (("--model.init_args.micro_batch_size", "0"), "model.micro_batch_size"),
        (("--model.init_args.model_path", "/no/such/model"), "model.model_path"),
        (("--data.init_args.num_steps", "0"), "data.num_steps"),
        (("--data.init_args.test_path", "/no/such/test.jsonl"), "data.test_path"),
    ],
)
def test_bad_values_name_the_field(setting, tmp_path, mlflow_env, override, field):
    with pytest.raises((ValueError, FileNotFoundError), match=f"`{field}`"):
        VacoCLI(args=fit_args(setting, tmp_path, *override)[1:], run=False)


def test_cross_field_check_runs_before_any_generation(setting, tmp_path, mlflow_env, capsys):
    # 4 optimiser steps cannot be cut into generation batches of 3 minibatches: one line, exit 2
    with pytest.raises(SystemExit) as exit_info:
        main(fit_args(setting, tmp_path, "--model.init_args.num_minibatches", "3"))
    assert exit_info.value.code == 2
    assert "`data.num_steps` (4) must be a multiple of `model.num_minibatches` (3)" in capsys.readouterr().err
    client = mlflow.MlflowClient(tracking_uri=mlflow_env)
    for experiment in client.search_experiments():
        assert not client.search_runs([experiment.experiment_id])  # no run was created


@pytest.mark.parametrize(
    "devices", [("--trainer.devices", "2"), ("--trainer.devices", "0,1"), ("--trainer.num_nodes", "2")]
)
def test_more_than_one_device_is_refused_in_one_line_before_anything_starts(
    setting, tmp_path, mlflow_env, capsys, devices
):
    with pytest.raises(SystemExit) as exit_info:
        main(fit_args(setting, tmp_path, "--trainer.accelerator", "cpu", *devices))
    assert exit_info.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("vaco fit: error:")]
    assert "`trainer.devices`: the LLM learner trains on one device, this config would start 2 processes" in line
    client = mlflow.MlflowClient(tracking_uri=mlflow_env)
    assert not [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert not list(Path(tmp_path).glob("checkpoints/*"))


def final_policy_state(tmp_path) -> dict[str, torch.Tensor]:
    (ckpt,) = list(Path(tmp_path).glob("checkpoints/*/last.ckpt"))
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    return {k: v for k, v in state["state_dict"].items() if k.startswith("policy.")}


def test_micro_batches_give_the_same_update(setting, tmp_path, mlflow_env):
    """The loss is the token mean over the minibatch whether or not it is micro-batched."""
    main(fit_args(setting, tmp_path / "full", "--data.init_args.num_steps", "1"))
    main(
        fit_args(
            setting, tmp_path / "micro", "--data.init_args.num_steps", "1", "--model.init_args.micro_batch_size", "2"
        )
    )
    full, micro = final_policy_state(tmp_path / "full"), final_policy_state(tmp_path / "micro")
    assert full.keys() == micro.keys()
    for key in full:
        torch.testing.assert_close(full[key], micro[key], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_micro_batches_log_the_minibatchs_own_lag_diagnostics(setting, tmp_path, mlflow_env):
    """``lag/ess``, ``lag/ratio_p99`` and ``lag/ratio_max`` of a micro-batched minibatch are its own
    (every valid token's ratio at once), as the unbatched run logs them, not a token-weighted mean of
    the micro-batches' values. The second minibatch of a batch of N = 2 is a step off-policy."""
    # an entropy bonus moves the policy whatever the rewards (a random tiny model's are all 0: no advantage)
    args = ("--data.init_args.num_steps", "2", "--model.init_args.num_minibatches", "2", "--model.init_args.lr", "0.01")
    args += ("--model.init_args.objective.init_args.entropy_coef", "0.1")
    main(fit_args(setting, tmp_path / "full", *args))
    main(fit_args(setting, tmp_path / "micro", *args, "--model.init_args.micro_batch_size", "2"))
    client = mlflow.MlflowClient(mlflow_env)
    experiments = [e.experiment_id for e in client.search_experiments()]
    full, micro = client.search_runs(experiments, order_by=["attributes.start_time ASC"])
    assert full.data.metrics["lag/ess"] < 1.0  # off-policy at the logged step: the check is not vacuous
    for key in ("lag/ess", "lag/ratio_p99", "lag/ratio_max"):
        assert micro.data.metrics[key] == pytest.approx(full.data.metrics[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_run_logs_and_resumes_exactly_into_the_same_mlflow_run(setting, tmp_path, mlflow_env, capsys):
    # straight: 4 steps as 2 generation batches of N = 2 minibatches
    args = ("--model.init_args.num_minibatches", "2", "--checkpoint.every_n_iterations", "1")
    main(fit_args(setting, tmp_path / "straight", *args, objective="vaco_grpo.yaml"))
    # interrupted after the first generation batch, then resumed from its checkpoint
    main(
        fit_args(
            setting,
            tmp_path / "first",
            *args,
            "--data.init_args.num_steps",
            "4",
            "--trainer.max_steps",
            "2",
            objective="vaco_grpo.yaml",
        )
    )
    (ckpt,) = list((tmp_path / "first").glob("checkpoints/*/last.ckpt"))
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)  # tensors and plain values only
    assert int(saved["state_dict"]["version"]) == 1
    run_id = saved["vaco"]["mlflow_run_id"]
    assert saved["vaco"]["definition"]["model.init_args.objective.init_args.delta"] == 0.05
    # the LLM track has a run definition too: a changed delta is refused, in one line, before any step
    with pytest.raises(SystemExit) as exit_info:
        main(
            fit_args(
                setting,
                tmp_path / "first",
                *args,
                "--ckpt_path",
                str(ckpt),
                "--model.init_args.objective.init_args.delta",
                "0.1",
                objective="vaco_grpo.yaml",
            )
        )
    assert exit_info.value.code == 2
    assert "`model.init_args.objective.init_args.delta` cannot change when resuming" in capsys.readouterr().err
    # the reward is stored twice (the run's definition, the data settings `vaco evaluate` reads): a checkpoint
    # whose data settings were edited to another reward is refused too, in one line, before any step
    edited = dict(saved, datamodule_hyper_parameters=dict(saved["datamodule_hyper_parameters"]))
    edited["datamodule_hyper_parameters"]["reward"] = {"class_path": "my_rewards.Lenient", "init_args": {}}
    torch.save(edited, tmp_path / "edited.ckpt")
    with pytest.raises(SystemExit) as exit_info:
        main(
            fit_args(
                setting,
                tmp_path / "first",
                *args,
                "--ckpt_path",
                str(tmp_path / "edited.ckpt"),
                objective="vaco_grpo.yaml",
            )
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "`data.init_args.reward` cannot change when resuming" in err and "my_rewards.Lenient" in err, err
    main(fit_args(setting, tmp_path / "first", *args, "--ckpt_path", str(ckpt), objective="vaco_grpo.yaml"))

    straight, resumed = final_policy_state(tmp_path / "straight"), final_policy_state(tmp_path / "first")
    for key in straight:
        torch.testing.assert_close(straight[key], resumed[key], atol=0, rtol=0)
    mlflow_store = mlflow.MlflowClient(tracking_uri=mlflow_env)
    experiment = mlflow_store.get_experiment_by_name("vaco-llm-cpu")
    runs = mlflow_store.search_runs([experiment.experiment_id])
    assert len(runs) == 2  # the resumed run continued the interrupted one
    history = mlflow_store.get_metric_history(run_id, "train/filter_fraction")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]  # one value per minibatch
    lag = {m.step: m.value for m in mlflow_store.get_metric_history(run_id, "lag/steps_behind")}
    assert lag == {1: 0, 2: 1, 3: 0, 4: 1}
    evals = sorted(m.step for m in mlflow_store.get_metric_history(run_id, "eval/accuracy"))
    assert evals == [0, 2, 4]
    params = mlflow_store.get_run(run_id).data.params
    assert (params["algorithm"], params["N"], params["delta"]) == ("vaco_grpo", "2", "0.05")


@pytest.mark.slow
def test_sigterm_inside_a_generation_batch_stops_at_the_minibatch_boundary_and_resumes_exactly(
    setting, tmp_path, mlflow_env, capsys
):
    """N = 4 minibatches per generation batch; SIGTERM arrives during optimiser step 6 (minibatch 2
    of batch 2): the run stops after that minibatch with a checkpoint holding the batch, is marked
    KILLED, and the resume trains minibatches 3-4 of that batch and the rest of the run: the final
    policy equals an uninterrupted run's bit for bit and every step is logged once."""
    args = ("--model.init_args.num_minibatches", "4", "--data.init_args.num_steps", "12")
    main(fit_args(setting, tmp_path / "straight", *args, objective="vaco_grpo.yaml"))
    stop = ("--trainer.callbacks+=helpers.signals.SignalAtStep", "--trainer.callbacks.step=6")
    with pytest.raises(SystemExit) as stopped:
        main(fit_args(setting, tmp_path / "stopped", *args, *stop, objective="vaco_grpo.yaml"))
    assert stopped.value.code == 128 + 15
    assert "stopped by SIGTERM" in capsys.readouterr().err
    (ckpt,) = list((tmp_path / "stopped").glob("checkpoints/*/last.ckpt"))
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert int(saved["state_dict"]["version"]) == 1 and saved["vaco"]["pending"]["next"] == 2
    run_id = saved["vaco"]["mlflow_run_id"]
    client = mlflow.MlflowClient(tracking_uri=mlflow_env)
    assert client.get_run(run_id).info.status == "KILLED"
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/tv")) == [1, 2, 3, 4, 5, 6]

    main(fit_args(setting, tmp_path / "stopped", *args, "--ckpt_path", str(ckpt), objective="vaco_grpo.yaml"))
    straight, resumed = final_policy_state(tmp_path / "straight"), final_policy_state(tmp_path / "stopped")
    for key in straight:
        torch.testing.assert_close(straight[key], resumed[key], atol=0, rtol=0)
    assert client.get_run(run_id).info.status == "FINISHED"
    for metric, steps in (("train/tv", list(range(1, 13))), ("time/generation_batch", [4, 8, 12])):
        assert [m.step for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)] == steps


@pytest.mark.slow
def test_sigterm_during_generation_abandons_the_batch_and_the_resume_regenerates_it_exactly(
    setting, tmp_path, mlflow_env, capsys
):
    """SIGTERM as generation batch 2 starts: generation stops at its next token (not after the whole
    rollout), nothing of the batch is trained or logged, the checkpoint is the state after batch 1
    with the batch's prompts, and the resume regenerates it: the final policy equals an uninterrupted
    run's bit for bit and every step is logged once."""
    args = ("--model.init_args.num_minibatches", "2", "--data.init_args.num_steps", "6")
    main(fit_args(setting, tmp_path / "straight", *args, objective="vaco_grpo.yaml"))
    capsys.readouterr()  # the straight run's output
    stop = ("--trainer.callbacks+=helpers.signals.SignalAtBatchStart", "--trainer.callbacks.batch=2")
    with pytest.raises(SystemExit) as stopped:
        main(fit_args(setting, tmp_path / "stopped", *args, *stop, objective="vaco_grpo.yaml"))
    assert stopped.value.code == 128 + 15
    captured = capsys.readouterr()
    assert "stopped by SIGTERM after iteration 1" in captured.err
    assert "stopping after this minibatch (in generation or evaluation: the next token)" in captured.err
    # the abandoned batch printed no second line for iteration 1
    assert [line.split(" |")[0] for line in captured.out.splitlines() if line.startswith("iter ")] == ["iter 1/3"]
    (ckpt,) = list((tmp_path / "stopped").glob("checkpoints/*/last.ckpt"))
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert int(saved["state_dict"]["version"]) == 1 and saved["vaco"]["pending"] == {"regenerate": 1}
    run_id = saved["vaco"]["mlflow_run_id"]
    client = mlflow.MlflowClient(tracking_uri=mlflow_env)
    assert client.get_run(run_id).info.status == "KILLED"
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/tv")) == [1, 2]  # batch 1 only
    main(fit_args(setting, tmp_path / "stopped", *args, "--ckpt_path", str(ckpt), objective="vaco_grpo.yaml"))
    straight, resumed = final_policy_state(tmp_path / "straight"), final_policy_state(tmp_path / "stopped")
    for key in straight:
        torch.testing.assert_close(straight[key], resumed[key], atol=0, rtol=0)
    assert client.get_run(run_id).info.status == "FINISHED"
    for metric, steps in (("train/tv", list(range(1, 7))), ("time/generation_batch", [2, 4, 6])):
        assert [m.step for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)] == steps


@pytest.mark.slow
def test_sigterm_during_the_first_evaluation_stops_it_and_the_resume_evaluates_first(
    setting, tmp_path, mlflow_env, capsys
):
    """SIGTERM before the step-0 evaluation: the evaluation is abandoned at its first token (nothing
    logged), the run checkpoints before any step (the first batch to generate, the evaluation still to
    do) and exits 128 + 15; the resume evaluates at step 0 first, then trains: the final policy and
    every logged step equal an uninterrupted run's."""
    args = ("--model.init_args.num_minibatches", "2", "--data.init_args.num_steps", "4")
    main(fit_args(setting, tmp_path / "straight", *args, objective="vaco_grpo.yaml"))
    with pytest.raises(SystemExit) as stopped:
        main(
            fit_args(
                setting,
                tmp_path / "stopped",
                *args,
                "--trainer.callbacks+=helpers.signals.SignalAtFirstEvaluation",
                objective="vaco_grpo.yaml",
            )
        )
    assert stopped.value.code == 128 + 15
    (ckpt,) = list((tmp_path / "stopped").glob("checkpoints/*/last.ckpt"))
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert int(saved["state_dict"]["version"]) == 0
    assert saved["vaco"]["initial_eval_pending"] is True and saved["vaco"]["pending"] == {"regenerate": 0}
    run_id = saved["vaco"]["mlflow_run_id"]
    client = mlflow.MlflowClient(tracking_uri=mlflow_env)
    assert client.get_run(run_id).info.status == "KILLED"
    assert client.get_metric_history(run_id, "eval/accuracy") == []  # the abandoned evaluation logged nothing
    main(fit_args(setting, tmp_path / "stopped", *args, "--ckpt_path", str(ckpt), objective="vaco_grpo.yaml"))
    straight, resumed = final_policy_state(tmp_path / "straight"), final_policy_state(tmp_path / "stopped")
    for key in straight:
        torch.testing.assert_close(straight[key], resumed[key], atol=0, rtol=0)
    assert client.get_run(run_id).info.status == "FINISHED"
    runs = {r.info.run_id: r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])}
    (other,) = [r for r in runs if r != run_id]
    for metric in ("eval/accuracy", "train/tv"):
        got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric))
        want = sorted((m.step, m.value) for m in client.get_metric_history(other, metric))
        assert got == want and got, metric


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["vaco_grpo.yaml", "vaco_grpo_seq.yaml"])
def test_micro_batches_give_the_same_vaco_update(setting, tmp_path, mlflow_env, objective):
    """VACO-GRPO with a lagged second minibatch (N = 2): micro-batching changes nothing, because
    the TV filter tests the whole minibatch's TV, measured before the micro-batched backward (the
    per-completion filter's test needs only a completion's own tokens)."""
    args = (
        "--data.init_args.num_steps",
        "2",
        "--model.init_args.num_minibatches",
        "2",
        "--model.init_args.objective.init_args.delta",
        "0.01",
    )
    main(fit_args(setting, tmp_path / "full", *args, objective=objective))
    main(fit_args(setting, tmp_path / "micro", *args, "--model.init_args.micro_batch_size", "2", objective=objective))
    full, micro = final_policy_state(tmp_path / "full"), final_policy_state(tmp_path / "micro")
    for key in full:
        torch.testing.assert_close(full[key], micro[key], atol=1e-5, rtol=1e-4)
    client = mlflow.MlflowClient(tracking_uri=mlflow_env)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    for run in runs:  # re-scored behaviour log-probs: pi/beta compares one computation with itself
        assert run.data.metrics["lag/rescore_tv"] < 1e-5


def test_tv_filter_uses_the_minibatch_tv_when_given():
    from vaco.objectives import TVFilter

    # a minibatch of 8: the first half alone has TV 0.03 > delta/2 = 0.025, the whole 0.015 < 0.025
    ratio = torch.tensor([1.06, 0.94, 1.06, 0.94, 1.0, 1.0, 1.0, 1.0])
    log_prob = ratio.log()
    advantage = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    half = {"log_prob": log_prob[:4], "behavior_log_prob": torch.zeros(4), "advantage": advantage[:4]}
    whole_tv = 0.5 * (ratio - 1).abs().mean()
    assert 0.01 < float(whole_tv) < 0.025 < float(0.5 * (ratio[:4] - 1).abs().mean())
    objective = TVFilter(delta=0.05, normalize_advantage=False)
    assert float(objective(half)["filter_fraction"]) == 1.0  # micro-batch TV: every sample filtered
    assert float(objective({**half, "minibatch_tv": whole_tv})["filter_fraction"]) == 0.0


def _one_policy_gradient_step(module) -> float:
    """One AdamW step of the module's objective on sampled completions with +-1 advantages (a real
    policy-gradient signal); the fraction of the weights with a non-zero gradient that moved."""
    from vaco.llm.policy import completion_log_probs, encode_prompts, generate

    tok, policy = module.tokenizer, module.policy
    ids, mask, _ = encode_prompts(tok, ["Question: Tom has 3 apples.\nAnswer:", "Question: hi\nAnswer:"] * 2, 64)
    with module.autocast():
        out = generate(
            policy,
            ids,
            mask,
            max_new_tokens=8,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            generator=torch.Generator().manual_seed(0),
        )
        log_prob, entropy = completion_log_probs(
            policy, ids, mask, out["completion_ids"], out["completion_mask"], with_entropy=True
        )
    advantage = torch.tensor([1.0, -1.0, -1.0, 1.0])[:, None].expand_as(log_prob) * out["completion_mask"]
    losses = module.objective(
        {
            "log_prob": log_prob,
            "behavior_log_prob": out["behavior_log_prob"],
            "advantage": advantage,
            "entropy": entropy,
            "mask": out["completion_mask"],
        }
    )
    sum(v for k, v in losses.items() if k.startswith("loss_")).backward()
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    module.configure_optimizers().step()
    moved = total = 0
    for name, p in policy.named_parameters():
        signal = p.grad is not None and p.grad != 0
        moved += int(((p.detach() != before[name]) & signal).sum())
        total += int(signal.sum())
    return moved / total


def test_bf16_configured_weights_move_after_one_step_at_lr_1e_6(setting):
    """`dtype: bfloat16` computes in bfloat16 but keeps float32 master weights: one AdamW step at the
    paper's lr 1e-6 moves every weight that has a gradient. Weights *stored* in bfloat16 (as before)
    barely move: a step of ~1e-6 is below bfloat16's resolution for nearly every weight."""
    from vaco.llm import RLVRModule
    from vaco.llm.policy import load_causal_lm
    from vaco.objectives import PPOClip

    def module():
        m = RLVRModule(PPOClip(normalize_advantage=False), str(setting / "model"), lr=1e-6, dtype="bfloat16")
        m.configure_model()
        m.compute_dtype = torch.bfloat16  # what a GPU resolves to; autocast runs bfloat16 on a CPU too
        return m

    mixed = module()
    assert all(p.dtype == torch.float32 for p in mixed.policy.parameters())  # the master weights
    assert _one_policy_gradient_step(mixed) > 0.99
    # the check can fail: the same step on weights stored in bfloat16 leaves nearly all of them where they were
    stored = module()
    stored.policy = load_causal_lm(str(setting / "model"), "bfloat16")
    assert _one_policy_gradient_step(stored) < 0.5


@pytest.mark.slow
def test_bf16_on_a_cpu_computes_in_float32_and_says_so(setting, tmp_path, mlflow_env):
    with pytest.warns(UserWarning, match="bfloat16` on a CPU: computing in float32"):
        main(fit_args(setting, tmp_path, "--data.init_args.num_steps", "1", "--model.init_args.dtype", "bfloat16"))
    state = final_policy_state(tmp_path)
    assert state and all(v.dtype == torch.float32 for v in state.values())


def test_a_finished_run_extends_with_a_larger_num_steps(setting, tmp_path, mlflow_env):
    args = ("--checkpoint.every_n_iterations", "1", "--data.init_args.eval_every", "0")
    main(fit_args(setting, tmp_path, *args, "--data.init_args.num_steps", "2"))
    (ckpt,) = list(tmp_path.glob("checkpoints/*/last.ckpt"))
    run_id = torch.load(ckpt, map_location="cpu", weights_only=True)["vaco"]["mlflow_run_id"]
    main(fit_args(setting, tmp_path, *args, "--data.init_args.num_steps", "4", "--ckpt_path", str(ckpt)))
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert int(saved["state_dict"]["version"]) == 4 and saved["vaco"]["num_steps"] == 4
    client = mlflow.MlflowClient(tracking_uri=mlflow_env)
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/reward")) == [1, 2, 3, 4]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags.get("num_steps") == "4"
