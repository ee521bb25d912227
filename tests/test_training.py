"""The training system end to end: learning, resume, determinism, NaN handling, bad input, DDP.

Everything is real: MuJoCo envs, Lightning's Trainer, an MLflow SQLite store in a temp dir, and
subprocesses for the CLI and DDP.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import time
import warnings
from pathlib import Path

import lightning as L
import mlflow
import pytest
import torch

from helpers.runs import CONFIGS, REAL_VACO, VACO, build_run, metric_histories, run_cli
from vaco import VacoModule
from vaco.advantages import GAE, VTrace
from vaco.learners.vaco_module import NonFiniteLossError
from vaco.objectives import PPOClip, TVFilter

# ---------------------------------------------------------------- learning
LEARN = dict(num_envs=4, num_steps=128, total_steps=25_600, eval_every=0, eval_episodes=10, eval_envs=5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,objective,advantage,K",
    [("ppo_clip", PPOClip, GAE, 1), ("vaco", TVFilter, VTrace, 4)],
)
def test_learns_inverted_pendulum(tmp_path, mlflow_uri, name, objective, advantage, K):
    """A random policy scores < 30; 800 means the pole stays up for 80% of each 1000-step
    episode, averaged over 10 evaluation episodes, after 25.6k env steps (50 iterations)."""
    module, data, trainer = build_run(
        tmp_path,
        mlflow_uri,
        objective=objective(),
        advantage=advantage(),
        seed=1,
        data_kwargs={**LEARN, "policy_buffer_size": K},
        model_kwargs=dict(update_epochs=10, num_minibatches=4),
        every_n_iterations=0,
    )
    trainer.fit(module, data)
    assert module.algorithm == name
    history = metric_histories(mlflow_uri, trainer.logger.run_id)
    first_return = history["train/episode_return"][0][1]
    assert first_return < 100
    assert module.last_eval_return >= 800, history["eval/return"]
    # lag telemetry: with K = 4 stale policies the learner differs from the behaviour data
    backward = [v for _, v in history["lag/backward_tv"]]
    ages = [v for _, v in history["lag/policy_age_max"]]
    if K == 1:
        assert max(backward) < 1e-5 and max(ages) == 0
    else:
        assert max(backward) > 0.01 and max(ages) == K - 1


# ---------------------------------------------------------------- resume and determinism
class StopAt(L.Callback):
    """Interrupt training after ``iteration`` (as Ctrl-C would), before its checkpoint is written."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if int(pl_module.version) == self.iteration:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_resume_equals_uninterrupted_and_same_seed_is_identical(tmp_path, mlflow_uri):
    # K = 3 and mid-episode boundaries: the policy buffer, normalisers, env states and RNGs
    # all have to come back for the metrics to match
    kwargs = dict(data_kwargs={"total_steps": 2 * 64 * 8, "policy_buffer_size": 3, "eval_every": 3})

    module, data, trainer = build_run(tmp_path / "a", mlflow_uri, **kwargs)
    assert data.collector is None and data.learner is None  # nothing acts before the learner binds
    trainer.fit(module, data)
    reference = metric_histories(mlflow_uri, trainer.logger.run_id)
    assert len(reference["train/tv"]) == 8
    # the explicit binding: each holds the other, and the data module owns the buffer its collector acts from
    assert module.data is data and data.learner is module
    assert data.collector.policy_buffer is data.policy_buffer and data.policy_buffer.newest_version == 8

    module, data, trainer = build_run(tmp_path / "c", mlflow_uri, **kwargs)
    trainer.fit(module, data)
    assert metric_histories(mlflow_uri, trainer.logger.run_id) == reference, "same seed, different metrics"

    module, data, trainer = build_run(tmp_path / "b", mlflow_uri, callbacks=(StopAt(5),), **kwargs)
    with pytest.raises(SystemExit):  # Lightning shuts down gracefully, then exits as Ctrl-C would
        trainer.fit(module, data)
    assert trainer.interrupted
    run_id = trainer.logger.run_id
    ckpt = tmp_path / "b" / "ckpt" / "last.ckpt"
    # tensors and plain values only: Lightning's (and torch's) safe loader reads it
    assert torch.load(ckpt, weights_only=True)["state_dict"]["version"] == 4

    module, data, trainer = build_run(tmp_path / "b", mlflow_uri, run_id=run_id, **kwargs)
    trainer.fit(module, data, ckpt_path=str(ckpt))
    resumed = metric_histories(mlflow_uri, run_id)
    assert resumed.keys() == reference.keys()
    for key, values in reference.items():
        # iteration 5 was logged before the interruption and again after the resume: same value
        assert sorted(set(resumed[key])) == values, key


# ---------------------------------------------------------------- NaN handling
class NaNAfter(PPOClip):
    """A user objective whose loss becomes NaN from the third iteration on."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        self.calls += 1
        loss, indicators = super().surrogate(ratio=ratio, log_ratio=log_ratio, advantage=advantage, batch=batch)
        if self.calls > 2 * 2 * 4:  # two iterations of 2 epochs x 4 minibatches
            loss = loss * float("nan")
        return loss, indicators


def test_nan_loss_before_any_checkpoint_does_not_claim_one_is_kept(tmp_path, mlflow_uri):
    """A NaN in the first iteration, before any checkpoint exists: the line says none was written."""
    objective = NaNAfter()
    objective.calls = 2 * 2 * 4  # NaN from the first step on
    module, data, trainer = build_run(tmp_path, mlflow_uri, objective=objective, advantage=GAE())
    with pytest.raises(NonFiniteLossError, match=r"iteration 1, epoch 0, minibatch 0") as err:
        trainer.fit(module, data)
    assert "no checkpoint was written before it" in str(err.value) and "is kept" not in str(err.value)
    assert not (tmp_path / "ckpt" / "last.ckpt").exists()


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, mlflow_uri):
    module, data, trainer = build_run(tmp_path, mlflow_uri, objective=NaNAfter(), advantage=GAE())
    with pytest.raises(NonFiniteLossError, match=r"iteration 3, epoch 0, minibatch 0.*last good checkpoint"):
        trainer.fit(module, data)
    ckpt = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert int(ckpt["state_dict"]["version"]) == 2
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    run = mlflow.MlflowClient(mlflow_uri).get_run(trainer.logger.run_id)
    assert run.info.status == "FAILED"


class PlainAdam(VacoModule):
    """A user's own optimiser (not fused: it cannot skip a step on the device)."""

    def configure_optimizers(self):
        params = list(self.actor.parameters()) + list(self.critic.parameters())
        return torch.optim.Adam(params, lr=self.hparams.lr, foreach=False)


def test_nan_loss_with_a_non_fused_optimizer_stops_before_the_step(tmp_path, mlflow_uri):
    _, data, trainer = build_run(tmp_path, mlflow_uri)
    module = PlainAdam(objective=NaNAfter(), advantage=GAE(), update_epochs=2, num_minibatches=4)
    with pytest.raises(NonFiniteLossError, match=r"iteration 3, epoch 0, minibatch 0.*last good checkpoint"):
        trainer.fit(module, data)
    assert all(torch.isfinite(p).all() for p in module.parameters())  # the NaN step was never applied


# ---------------------------------------------------------------- bad input
def _cli(*args):
    from vaco.commands.fit import VacoCLI

    return VacoCLI(args=list(args), run=False)  # run=False: no subcommand, instantiate only


ENV = str(CONFIGS / "env" / "inverted_pendulum.yaml")
ALGO = str(CONFIGS / "algo" / "vaco.yaml")


@pytest.mark.parametrize(
    "override,message",
    [
        (["--data.init_args.env_id", "Hoper-v5"], r"`data.env_id`: unknown gymnasium env id 'Hoper-v5'"),
        (["--data.init_args.policy_buffer_size", "0"], r"`data.policy_buffer_size` \(K\) must be an integer >= 1"),
        (["--model.init_args.objective.init_args.delta", "0"], r"`delta` must be a finite number > 0"),
        (["--model.init_args.objective.init_args.delta", "-0.1"], r"`delta` must be a finite number > 0"),
        (["--model.init_args.advantage.init_args.rho_bar", "0"], r"`rho_bar` must be a finite number > 0"),
    ],
)
def test_bad_values_stop_at_parsing_naming_the_field(mlflow_uri, capsys, override, message):
    # the constructors validate and build no env (envs start in the data module's setup at fit
    # time); from the command line LightningCLI reports the error as a usage error (exit 2)
    with pytest.raises(ValueError) as error:
        _cli("--config", ENV, "--config", ALGO, *override)
    assert re.search(message, str(error.value))


def test_unknown_objective_class_is_a_parse_error(mlflow_uri, capsys):
    with pytest.raises(SystemExit):
        _cli("--config", ENV, "--config", ALGO, "--model.init_args.objective", "vaco.objectives.NoSuchObjective")
    assert "NoSuchObjective" in capsys.readouterr().err


def test_bad_value_from_the_command_line_exits_with_the_message(mlflow_uri):
    out = run_cli("fit", "--config", ENV, "--config", ALGO, "--data.init_args.policy_buffer_size", "0")
    assert out.returncode == 2
    assert "`data.policy_buffer_size` (K) must be an integer >= 1, got 0" in out.stderr


def test_minibatches_must_divide_the_batch_before_any_env_starts(tmp_path, mlflow_uri):
    module, data, trainer = build_run(tmp_path, mlflow_uri, model_kwargs={"num_minibatches": 5})
    with pytest.raises(ValueError, match=r"`model.num_minibatches` \(5\) must divide the batch"):
        trainer.fit(module, data)
    assert data.collector is None  # no env was created


def test_gamma_must_agree_between_reward_scaling_and_advantage(tmp_path, mlflow_uri):
    module, data, trainer = build_run(tmp_path, mlflow_uri, advantage=VTrace(gamma=0.9))
    with pytest.raises(ValueError, match=r"`data.gamma`"):
        trainer.fit(module, data)


# ---------------------------------------------------------------- configs
def _all(kind):
    return sorted((CONFIGS / kind).glob("*.yaml"))


@pytest.mark.parametrize("env", _all("env"), ids=lambda p: p.stem)
def test_every_env_config_instantiates(env, mlflow_uri):
    cli = _cli("--config", str(env), "--config", ALGO)
    assert cli.datamodule.env_id.endswith("-v5")


@pytest.mark.slow
@pytest.mark.parametrize("algo", _all("algo"), ids=lambda p: p.stem)
def test_every_algo_config_instantiates(algo, mlflow_uri):
    cli = _cli("--config", ENV, "--config", str(algo))
    assert cli.model.algorithm == algo.stem


def test_demo_config_instantiates(mlflow_uri):
    cli = _cli("--config", str(CONFIGS / "demo.yaml"))
    assert cli.model.algorithm == "vaco" and cli.datamodule.policy_buffer_size == 4


# ---------------------------------------------------------------- the CLI, for real
@pytest.mark.slow
def test_cli_fit_logs_to_mlflow_and_evaluate_reads_the_checkpoint(tmp_path, mlflow_uri):
    tmp_path = tmp_path / "my runs"  # a folder with a space: the printed commands must paste as they are
    tmp_path.mkdir()
    out = run_cli(
        "fit",
        "--config",
        ENV,
        "--config",
        str(CONFIGS / "algo" / "ppo_clip.yaml"),
        "--data.init_args.total_steps",
        "2048",
        "--data.init_args.num_envs",
        "2",
        "--data.init_args.num_steps",
        "128",
        "--data.init_args.eval_episodes",
        "2",
        "--model.init_args.update_epochs",
        "2",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.logger.init_args.experiment_name",
        "cli-test",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final eval/return" in out.stdout
    # stdout is a pipe, not a terminal: a line per iteration, no tqdm bars redrawn with \r
    lines = [line for line in out.stdout.splitlines() if line.startswith("iter ")]
    assert len(lines) == 8 and lines[0].startswith("iter 1/8 | steps 256/2.05k | sps ") and "\r" not in out.stdout
    assert " | tv " in lines[-1] and " | clipped " in lines[-1] and " | filtered " not in lines[-1]
    for banner in ("GPU available: False", "TPU available", "srun", "litlogger"):  # nothing said to a CPU user
        assert banner not in out.stdout + out.stderr, banner
    # the hint is runnable from here: `vaco` where it is on PATH, else this install's script
    hint = next(line for line in out.stdout.splitlines() if "open it with:" in line).split("open it with: ", 1)[1]
    program = hint.split()[0]
    assert hint.endswith(" ui") and (
        program == "vaco" or Path(tmp_path, program).resolve() == Path(REAL_VACO).resolve()
    )
    client = mlflow.MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("cli-test").experiment_id])
    assert run.info.status == "FINISHED"
    params = run.data.params
    for key, value in {"algorithm": "ppo_clip", "env": "InvertedPendulum-v5", "K": "1", "seed": "1"}.items():
        assert params[key] == value
    for key in ("lambda", "rho_bar", "c_bar", "delta", "lr", "num_minibatches"):
        assert key in params
    for key in (
        "eval/return",
        "lag/backward_tv",
        "lag/forward_tv",
        "lag/policy_age_mean",
        "perf/sps",
        "perf/eval_seconds",
        "perf/startup_seconds",
        "train/clip_fraction",
        "lag/ess",
        "lag/ratio_p99",
        "lag/ratio_max",
    ):
        assert key in run.data.metrics
    # the process's start-up (imports, config, envs, run, model) was read: positive, and shorter than the run
    assert 0.0 < run.data.metrics["perf/startup_seconds"] < (run.info.end_time - run.info.start_time) / 1000 + 60
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "config.yaml" in artifacts and "last" in artifacts
    ckpt = next((tmp_path / "checkpoints").glob("*/last.ckpt"))
    # the printed `evaluate it with:` line, pasted into a shell from the run's folder
    hint = next(line for line in out.stdout.splitlines() if "evaluate it with:" in line).split(": ", 1)[1]
    assert shlex.split(hint)[-2:] == ["--ckpt", str(ckpt)]
    evaluated = subprocess.run(
        f"{hint} --episodes 3 --envs 3",
        shell=True,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "InvertedPendulum-v5: return" in evaluated.stdout and "over 3 episodes" in evaluated.stdout
    assert evaluated.stdout.startswith("evaluating InvertedPendulum-v5: 3 episodes")


def test_print_config_shows_the_composed_config(mlflow_uri):
    out = run_cli("fit", "--config", str(CONFIGS / "env" / "hopper.yaml"), "--config", ALGO, "--print_config")
    assert out.returncode == 0, out.stderr[-2000:]
    for text in (
        "vaco.objectives.TVFilter",
        "delta: 0.2",
        "vaco.advantages.VTrace",
        "env_id: Hopper-v5",
        "policy_buffer_size: 1",
    ):
        assert text in out.stdout


# ---------------------------------------------------------------- DDP
def _listening(port: int | None = None) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) of sockets listening on ``port``
    (any port: ``address:port``)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and (port is None or int(hex_port, 16) == port):  # TCP_LISTEN
                found.add(address if port is not None else fields[1])
    return found


def _host_named_elsewhere(tmp_path: Path) -> tuple[tuple[str, ...], str, str] | None:
    """A command prefix that runs a command in its own UTS and mount namespaces, under a host name
    that resolves to this machine's first non-loopback IPv4 address (a hosts file bind-mounted over
    /etc/hosts), with that name and address; None where they cannot be made (not root, no
    ``unshare``, no such address)."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return None
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    addresses = [line.split()[3].split("/")[0] for line in shown.stdout.splitlines() if " inet " in line]
    if not addresses:
        return None
    name, address = "vaco-ddp-elsewhere", addresses[0]
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{address} {name}\n")
    # sh -c SCRIPT NAME HOSTS COMMAND...: the script names the host, mounts the hosts file, says what
    # the name resolves to (on stderr), then runs the command
    script = 'hostname "$0" && mount --bind "$1" /etc/hosts && getent hosts "$0" >&2 && shift && exec "$@"'
    prefix = ("unshare", "--uts", "--mount", "sh", "-c", script, name, str(hosts))
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    return (prefix, name, address) if probe.returncode == 0 and address in probe.stderr else None


@pytest.mark.slow
def test_ddp_two_processes_train_in_sync(tmp_path, mlflow_uri):
    """Two CPU ranks stay in sync, and every socket they listen on is on the loopback: the
    rendezvous store (PyTorch's own listens on every interface) and the ranks' gloo pairs, with the
    host name resolving to this machine's network address (gloo binds there unless told otherwise):
    the run is made in its own UTS and mount namespaces where the host name is set and /etc/hosts
    says so. Every listening socket is watched in /proc/net while the run goes."""
    import concurrent.futures

    from helpers.mlflow_server import free_port

    elsewhere = _host_named_elsewhere(tmp_path)
    port = free_port()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    running = pool.submit(
        run_cli,
        "fit",
        "--config",
        ENV,
        "--config",
        ALGO,
        "--data.init_args.total_steps",
        "2048",
        "--data.init_args.num_envs",
        "2",
        "--data.init_args.num_steps",
        "128",
        "--data.init_args.eval_episodes",
        "2",
        "--data.init_args.policy_buffer_size",
        "2",
        "--model.init_args.update_epochs",
        "2",
        "--trainer.strategy",
        "ddp",
        "--trainer.devices",
        "2",
        "--trainer.accelerator",
        "cpu",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.logger.init_args.experiment_name",
        "ddp",
        cwd=tmp_path,
        timeout=900,
        env={"MASTER_PORT": str(port)},
        prefix=elsewhere[0] if elsewhere else (),
    )
    listening, before, new = set(), _listening(), set()
    while not running.done():
        listening |= _listening(port)
        new |= _listening() - before
        time.sleep(0.02)
    out = running.result()
    pool.shutdown()
    assert out.returncode == 0, out.stderr[-4000:]
    if elsewhere:  # the run's host name resolved to the network address, not the loopback
        _, name, address = elsewhere
        assert re.search(rf"^{re.escape(address)}\s+{name}$", out.stderr, flags=re.M), out.stderr[:500]
    else:
        warnings.warn("no UTS/mount namespace here: the host name resolves as the machine's does", stacklevel=1)
    assert listening == {"0100007F"}, listening  # 127.0.0.1 only, never 0.0.0.0 or [::]
    # and the ranks' gloo pairs (ephemeral ports) too: every socket that listened during the run
    assert new and {entry.rsplit(":", 1)[0] for entry in new} == {"0100007F"}, new
    assert "deprecated" not in out.stderr, out.stderr[-3000:]  # torch's all_gather notice, once per rank
    client = mlflow.MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ddp").experiment_id])
    assert run.data.params["world_size"] == "2"
    # each rank collects its own 2 x 128 batch: 512 env steps per iteration in all, 4 iterations
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "time/env_steps")]
    assert steps == [512, 1024, 1536, 2048]
    # the ranks' weights and normalisers were compared at the end of every iteration
    assert math.isclose(run.data.metrics["ddp/max_param_divergence"], 0.0, abs_tol=0.0)


def test_single_node_ddp_keeps_the_gloo_pairs_on_the_loopback(monkeypatch):
    """gloo binds its pairs to the address the host name resolves to (a network address on many
    machines; this one resolves to 127.0.0.1, so the DDP run above cannot show it): the launching
    process names the loopback interface for every rank it starts, unless the user chose one."""
    import lightning as L

    from helpers.mlflow_server import free_port
    from vaco.run.rendezvous import host_store_on_loopback

    for key in ("GLOO_SOCKET_IFNAME", "TORCHELASTIC_USE_AGENT_STORE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    trainer = L.Trainer(strategy="ddp", devices=2, accelerator="cpu", logger=False)
    store, listener = host_store_on_loopback(trainer)
    try:
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    finally:
        listener.close()
        del store
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's own choice stays
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    store, listener = host_store_on_loopback(trainer)
    listener.close()
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"


# the same NaNAfter, as a module a `vaco fit` subprocess imports from its directory
NAN_MODULE = "from vaco.objectives import PPOClip\n\n\n" + __import__("inspect").getsource(NaNAfter)


@pytest.mark.slow
def test_a_non_finite_loss_ends_vaco_fit_in_one_line_with_the_iteration_and_the_checkpoint(tmp_path):
    """It ended in a 48-56 line traceback (the last line was clear). Now `vaco fit` prints one line
    naming the iteration and the last good checkpoint, exits 1, and the run is FAILED."""
    (tmp_path / "nan_after.py").write_text(NAN_MODULE)
    import yaml

    model = {"objective": {"class_path": "nan_after.NaNAfter"}, "advantage": {"class_path": "vaco.advantages.GAE"}}
    model.update(update_epochs=2, num_minibatches=4)
    (tmp_path / "nan.yaml").write_text(yaml.safe_dump({"model": {"class_path": "vaco.VacoModule", "init_args": model}}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = subprocess.run(
        [VACO, "fit", "--config", str(CONFIGS / "env/inverted_pendulum.yaml"), "--config", "nan.yaml"]
        + ["--data.init_args.num_envs", "2", "--data.init_args.num_steps", "64", "--data.init_args.total_steps", "640"]
        + [
            "--data.init_args.eval_every",
            "0",
            "--data.init_args.eval_episodes",
            "2",
            "--checkpoint.every_n_iterations",
            "1",
        ]
        + ["--trainer.enable_progress_bar", "false"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, MLFLOW_TRACKING_URI=uri),
    )
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    (line,) = [x for x in out.stderr.strip().splitlines() if x.startswith("vaco fit:")]
    assert line.startswith("vaco fit: stopped: non-finite loss at iteration 3, epoch 0, minibatch 0"), line
    assert "the last good checkpoint is kept (" in line and "last.ckpt" in line
    (run,) = mlflow.MlflowClient(uri).search_runs(
        [mlflow.MlflowClient(uri).get_experiment_by_name("vaco").experiment_id]
    )
    assert run.info.status == "FAILED"
