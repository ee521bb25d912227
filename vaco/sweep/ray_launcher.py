"""The Ray launcher: one Ray task per cell, on a running cluster (``--ray-address``) or a local one."""

from __future__ import annotations

import logging
import os
import signal
import socket

from vaco.sweep.cells import cell_dirs, cell_result, run_cell, say, see_results
from vaco.sweep.grid import Cell, Sweep
from vaco.sweep.launcher import Launcher
from vaco.tracking import ENV_VAR, has_secrets

__all__ = ["RayLauncher", "check_ray_address", "run_cell_task"]


def run_cell_task(cell_dir: str, tracking_uri: str | None) -> int:
    """What a Ray task runs (a module-level function: Ray ships it by reference). A tracking URI with
    credentials is not an argument (Ray keeps a task's arguments where the cluster's other users can
    read them): ``None``, and the worker reads it from its environment (:meth:`RayLauncher.launch`)."""
    uri = tracking_uri or os.environ.get(ENV_VAR)
    if not uri:
        raise RuntimeError(
            f"{ENV_VAR} is not set in the Ray worker's environment (a tracking URI with credentials travels only there)"
        )
    return cell_result(run_cell(cell_dir, uri), cell_dir)


class RayLauncher(Launcher):
    """One Ray task per cell (plain tasks, not Ray Tune: a cell already resumes itself from its
    checkpoint, and Tune's trial runner would add a second layer of trial state, schedulers and
    checkpoint handling that a grid of independent runs does not need).

    A worker or node that dies takes its cell's ``vaco fit`` with it; Ray retries the task
    (``max_retries``) and the retry resumes from the cell's last checkpoint into the same MLflow run.
    """

    name = "ray"

    def __init__(
        self, sweep: Sweep, tracking_uri: str, resources: dict, address: str | None = None, num_cpus: int | None = None
    ) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise RuntimeError("`--launcher ray` needs Ray: pip install -e '.[ray]'") from None
        super().__init__(sweep, tracking_uri, resources)
        self.address, self.num_cpus = address, num_cpus
        if address:
            check_ray_address(address)

    @classmethod
    def add_arguments(cls, group) -> None:
        group.add_argument(
            "--ray-address",
            default=None,
            help="ray: a running cluster (host:port or ray://host:port); default: start a local one",
        )
        group.add_argument(
            "--ray-cpus", type=int, default=None, help="ray: CPUs of the local cluster it starts (default: all)"
        )

    @classmethod
    def from_args(cls, sweep, tracking_uri, resources, args) -> RayLauncher:
        return cls(sweep, tracking_uri, resources, address=args.ray_address, num_cpus=args.ray_cpus)

    def launch(self, cells: list[Cell]) -> int:
        import ray

        dirs = cell_dirs(self.sweep, cells, self.uri)
        secret = has_secrets(self.uri)
        # a URI with a password reaches the workers in their environment, never as a task argument (Ray
        # keeps those where every user of the cluster reads them) or on a command line: a local cluster's
        # workers inherit this process's; a running cluster's get it in the job's runtime_env
        if secret:
            os.environ[ENV_VAR] = self.uri
        if self.address:
            runtime_env = {"env_vars": {ENV_VAR: self.uri}} if secret else None
            ray.init(address=self.address, log_to_driver=False, runtime_env=runtime_env)
        else:  # a local cluster on this host only
            # its notices about a cluster only this process uses (a generated token, "Started a local
            # Ray instance") say nothing to the user; errors still show
            for name in ("ray._private.authentication.authentication_token_setup", "ray._private.worker", "ray.worker"):
                logging.getLogger(name).setLevel(logging.ERROR)
            ray.init(
                num_cpus=self.num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
            )
        stop = {"signal": 0}

        def on_signal(signum, _frame):
            stop["signal"] = stop["signal"] or signum  # the first signal decides the exit code

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            task = ray.remote(run_cell_task).options(
                num_cpus=self.resources.get("cpus", 1),
                num_gpus=self.resources.get("gpus", 0),
                max_retries=self.resources.get("max_retries", 3),
                retry_exceptions=False,
            )
            pending = {task.remote(d, None if secret else self.uri): cell for d, cell in zip(dirs, cells)}
            say(f"ray: {len(pending)} cells on {ray.cluster_resources().get('CPU', 0):.0f} CPUs")
            failed = 0
            while pending and not stop["signal"]:
                done, _ = ray.wait(list(pending), timeout=1.0)
                for ref in done:
                    cell = pending.pop(ref)
                    try:
                        ray.get(ref)
                        say(f"done   {cell.id}   [{len(pending)} left]")
                        if self.on_cell_done is not None:
                            self.on_cell_done()
                    except Exception as err:  # noqa: BLE001 - the task's error, or the worker's death
                        failed += 1
                        say(f"FAILED {cell.id}: {str(err).strip().splitlines()[-1][:300]}")
            if stop["signal"]:
                for ref in pending:
                    ray.cancel(ref, force=True)
                say(
                    f"stopped: done {len(cells) - len(pending) - failed}/{len(cells)}, failed {failed}; "
                    "rerun the same command to resume"
                )
                return 128 + int(stop["signal"])
            say(f"sweep finished: done {len(cells) - failed}/{len(cells)}, failed {failed} (ray)")
            say(see_results(self.sweep))
            return 1 if failed else 0
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            ray.shutdown()


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Fail in seconds, naming the field, if nothing listens at a Ray cluster address."""

    hostport = address.split("://", 1)[-1]
    if address == "auto":
        return
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return
    except (OSError, ValueError) as err:
        raise RuntimeError(f"`--ray-address` {address!r}: no Ray cluster answers there ({err})") from None
