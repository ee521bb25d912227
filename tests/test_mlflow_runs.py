"""What a researcher sees in MLflow after `vaco fit`: an experiment of kind model training, runs
named by their coordinates (unique), and params that are the coordinates and hyperparameters."""

from __future__ import annotations

import mlflow
import pytest

from helpers.runs import CONFIGS, run_cli

FIT = [
    "fit",
    "--config",
    str(CONFIGS / "env" / "inverted_pendulum.yaml"),
    "--config",
    str(CONFIGS / "algo" / "vaco.yaml"),
    "--data.init_args.num_envs",
    "2",
    "--data.init_args.num_steps",
    "64",
    "--data.init_args.total_steps",
    "128",
    "--data.init_args.policy_buffer_size",
    "4",
    "--seed_everything",
    "3",
    "--model.init_args.num_minibatches",
    "2",
    "--model.init_args.update_epochs",
    "1",
    "--data.init_args.eval_episodes",
    "1",
    "--trainer.enable_progress_bar",
    "false",
]


@pytest.mark.slow
def test_runs_are_named_by_their_coordinates_in_a_model_training_experiment(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for extra in ([], [], ["--model.init_args.objective.init_args.delta", "0.4"]):
        out = run_cli(*FIT, *extra, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
        assert out.returncode == 0, out.stderr[-2000:]
    named = run_cli(
        *FIT, "--trainer.logger.init_args.run_name", "my own name", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri}
    )
    assert named.returncode == 0, named.stderr[-2000:]

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("vaco")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    assert [r.info.run_name for r in runs] == [
        "vaco InvertedPendulum-v5 K=4 s3",
        "vaco InvertedPendulum-v5 K=4 s3 (2)",  # same seed, same coordinates: still a distinct name
        "vaco InvertedPendulum-v5 K=4 delta=0.4 s3",
        "my own name",  # a user-given name wins
    ]
    params = runs[0].data.params
    assert {
        "algorithm": "vaco",
        "env": "InvertedPendulum-v5",
        "K": "4",
        "seed": "3",
        "delta": "0.2",
        "rho_bar": "1.0",
    }.items() <= params.items()
    assert not [k for k in params if k.startswith(("env_spec", "_"))]


def test_a_resume_the_logger_refuses_leaves_the_run_as_it_was(tmp_path):
    """A resumed run is RUNNING while it runs; a resume refused because a logged param changed
    (the check in `VacoMLFlowLogger.log_hyperparams`) puts back the status it had (it used to be
    left FAILED, the finished run looking broken)."""
    import mlflow

    from vaco.run.logger import VacoMLFlowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("resume")
    run = client.create_run(experiment, run_name="done")
    client.log_param(run.info.run_id, "lr", "0.0003")
    client.set_terminated(run.info.run_id, "FINISHED")

    resumed = VacoMLFlowLogger(experiment_name="resume", tracking_uri=uri, run_id=run.info.run_id)
    with pytest.raises(ValueError, match="`lr` cannot change when a run resumes"):
        resumed.log_hyperparams({"lr": 0.001})
    assert client.get_run(run.info.run_id).info.status == "RUNNING"  # while it was resuming
    resumed.finalize("failed")  # what Lightning calls on the exception
    assert client.get_run(run.info.run_id).info.status == "FINISHED"

    accepted = VacoMLFlowLogger(experiment_name="resume", tracking_uri=uri, run_id=run.info.run_id)
    accepted.log_hyperparams({"lr": 0.0003})
    accepted.finalize("failed")  # a resume that ran and failed is FAILED
    assert client.get_run(run.info.run_id).info.status == "FAILED"


@pytest.mark.slow
def test_runs_started_at_once_into_a_new_store_all_go_on(tmp_path):
    """Two `vaco fit`s started together into a store that has no experiment yet both look it up,
    find nothing and create it; the second create fails on the name's unique key (a benchmark's two
    555f487 runs died of this), and two that find it untagged both insert its kind tag, which fails
    the same way. The logger creates the experiment with its kind in one write and takes the winner's
    experiment when it loses. Eight loggers in threads, released together by a barrier, into each
    of five fresh SQLite stores: every one prepares its run, and each store ends with one experiment
    of kind model training. (Before the fix it failed on the first or second store, either way.)"""
    import threading

    from vaco.run.logger import VacoMLFlowLogger
    from vaco.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    for store in range(5):
        uri = f"sqlite:///{tmp_path / f'store{store}.db'}"
        mlflow.MlflowClient(uri).search_experiments()  # the tables, before the threads race
        loggers = [VacoMLFlowLogger(experiment_name="race", tracking_uri=uri) for _ in range(8)]
        barrier, errors = threading.Barrier(len(loggers)), []

        def prepare(logger, barrier=barrier, errors=errors):
            barrier.wait()
            try:
                logger.experiment  # noqa: B018 - the property creates the experiment and the run
            except Exception as err:  # the test's verdict, below
                errors.append(err)

        threads = [threading.Thread(target=prepare, args=(logger,)) for logger in loggers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, f"store {store}: {errors[0]!r}"
        experiments = [e for e in mlflow.MlflowClient(uri).search_experiments() if e.name == "race"]
        assert len(experiments) == 1 and experiments[0].tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
        assert {logger.experiment_id for logger in loggers} == {experiments[0].experiment_id}
