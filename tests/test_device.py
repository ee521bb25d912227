"""The learner's device handling, tested where a CPU can: the batch is moved once per iteration to
the module's device and every tensor the objective sees is there; checkpoints load with any
map_location; asking for a GPU that is not there is one line before any env starts. The tests
marked `gpu` run only where CUDA is available (none was, where this suite was written)."""

from __future__ import annotations

import pytest
import torch

from helpers.runs import CONFIGS, build_run, run_cli
from vaco import VacoModule
from vaco.advantages import VTrace
from vaco.objectives import TVFilter
from vaco.run.checkpoint import load_checkpoint
from vaco.run.logger import VacoMLFlowLogger

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


class SeesDevices(TVFilter):
    """The TV filter, noting the device of every tensor its surrogate receives."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.devices: set[torch.device] = set()

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        tensors = [ratio, log_ratio, advantage, *(v for v in batch.values() if isinstance(v, torch.Tensor))]
        self.devices |= {t.device for t in tensors}
        return super().surrogate(ratio=ratio, log_ratio=log_ratio, advantage=advantage, batch=batch)


class CountsTransfers(VacoModule):
    """VacoModule noting each batch it transfers: where it came from and where it went."""

    transfers: list

    def transfer_batch(self, batch):
        moved = super().transfer_batch(batch)
        self.transfers.append((batch.device, {t.device for t in moved.values(True, True)}))
        return moved


def test_the_batch_moves_to_the_learners_device_once_per_iteration(tmp_path, mlflow_uri):
    objective = SeesDevices(delta=0.2)
    _, data, trainer = build_run(tmp_path, mlflow_uri, objective=objective)
    module = CountsTransfers(objective=objective, advantage=VTrace(), update_epochs=2, num_minibatches=4)
    module.transfers = []
    trainer.fit(module, data)
    assert len(module.transfers) == data.num_iterations() == 6  # once per iteration
    for source, moved in module.transfers:
        assert source is None  # the collector's batch has no device of its own (numpy-backed, CPU)
        assert moved == {module.device}
    assert objective.devices == {module.device}


def test_checkpoints_load_with_any_map_location(tmp_path, mlflow_uri):
    module, data, trainer = build_run(tmp_path, mlflow_uri)
    trainer.fit(module, data)
    path = tmp_path / "ckpt" / "last.ckpt"
    by_name = load_checkpoint(path, map_location="cpu")
    by_device = load_checkpoint(path, map_location=torch.device("cpu"))
    by_function = load_checkpoint(path, map_location=lambda storage, location: storage)
    for state in (by_device, by_function):
        assert state["state_dict"].keys() == by_name["state_dict"].keys()
        for key, value in by_name["state_dict"].items():
            assert torch.equal(state["state_dict"][key], value)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("hardware", ["gpu", "gpu_ddp"])
def test_asking_for_a_gpu_without_one_is_one_line_before_any_work(tmp_path, hardware):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        "fit",
        "--config",
        str(CONFIGS / "env" / "inverted_pendulum.yaml"),
        "--config",
        str(CONFIGS / "algo" / "vaco.yaml"),
        "--config",
        str(CONFIGS / "hardware" / f"{hardware}.yaml"),
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": uri},
    )
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "`trainer.accelerator` (gpu)" in errors[0] and "--trainer.accelerator cpu" in errors[0]
    assert f"hardware/{hardware}.yaml is for machines with a GPU" in errors[0]  # the file given, not another
    assert not (tmp_path / "checkpoints").exists()
    if (tmp_path / "mlflow.db").exists():  # MLflow's client makes the empty store; no run is in it
        import mlflow

        client = mlflow.MlflowClient(uri)
        assert not [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


@pytest.mark.parametrize("name", ["gpu", "gpu_ddp"])
def test_hardware_configs_compose_with_any_run(name):
    out = run_cli(
        "fit",
        "--config",
        str(CONFIGS / "env" / "hopper.yaml"),
        "--config",
        str(CONFIGS / "algo" / "vaco.yaml"),
        "--config",
        str(CONFIGS / "hardware" / f"{name}.yaml"),
        "--print_config",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "accelerator: gpu" in out.stdout


@pytest.mark.gpu
@needs_gpu
def test_a_gpu_run_trains_and_its_checkpoint_resumes_and_evaluates_on_the_cpu(tmp_path, mlflow_uri):
    objective = SeesDevices(delta=0.2)
    # vaco fit's logger: a resumed run may grow its budget (total_steps), but change nothing else it logged
    kw = dict(logger_cls=VacoMLFlowLogger)
    module, data, trainer = build_run(tmp_path / "gpu", mlflow_uri, objective=objective, accelerator="gpu", **kw)
    trainer.fit(module, data)
    assert objective.devices == {torch.device("cuda", 0)}
    ckpt = tmp_path / "gpu" / "ckpt" / "last.ckpt"
    out = run_cli("evaluate", "--ckpt", str(ckpt), "--episodes", "2", "--envs", "2")
    assert out.returncode == 0, out.stderr
    longer = {"total_steps": 2 * 64 * 8}
    resumed = SeesDevices(delta=0.2)  # the same objective: the run logged its name
    module, data, trainer = build_run(
        tmp_path / "gpu", mlflow_uri, objective=resumed, data_kwargs=longer, run_id=trainer.logger.run_id, **kw
    )
    trainer.fit(module, data, ckpt_path=str(ckpt))  # the CPU resumes the GPU's run
    assert int(module.version) == 8
    assert resumed.devices == {torch.device("cpu")}
