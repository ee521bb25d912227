"""Real cluster services for the tests, started once per test session on this machine: a one-node
SLURM cluster (munged, slurmctld and slurmd as root, from Debian's slurm-wlm and munge, with a
generated slurm.conf) and a PostgreSQL server (initdb and pg_ctl as the postgres user). Each
starter returns None with the reason when the packages are not installed or the session is not
root; the tests then skip with that reason. `.ci/run` installs the packages on a fresh machine.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

_started: dict[str, object] = {}
MAX_ARRAY_SIZE = 4  # small, so the tiny sweep's 5 cells need two job arrays


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up in {timeout:.0f} s")
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------- SLURM
SLURM_CONF = """ClusterName=vaco-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
KillWait=30
MaxArraySize={max_array}
NodeName={host} CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _munge_up() -> bool:
    return subprocess.run(["munge", "-n"], capture_output=True).returncode == 0


def slurm_cluster() -> tuple[dict[str, str] | None, str]:
    """(the environment that points SLURM's clients at the cluster, "") or (None, why not)."""
    if "slurm" in _started:
        return _started["slurm"]  # type: ignore[return-value]
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol") if not shutil.which(b)]
    if missing:
        _started["slurm"] = (
            None,
            f"SLURM is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge",
        )
        return _started["slurm"]  # type: ignore[return-value]
    if os.geteuid() != 0:
        _started["slurm"] = (None, "a one-node SLURM cluster needs root to start slurmd")
        return _started["slurm"]  # type: ignore[return-value]
    if not _munge_up():
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        if not Path("/etc/munge/munge.key").is_file() and shutil.which("mungekey"):
            subprocess.run(["mungekey", "--create"], check=False, capture_output=True)
        subprocess.run(["munged", "--force"], capture_output=True)
        _wait(_munge_up, 20, "munged")
    root = Path(tempfile.mkdtemp(prefix="vaco-slurm-"))
    (root / "state").mkdir()
    (root / "spool").mkdir()
    host = socket.gethostname()
    memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    conf = root / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            host=host,
            root=root,
            ctld_port=_free_port(),
            d_port=_free_port(),
            cpus=os.cpu_count() or 1,
            memory=memory,
            max_array=MAX_ARRAY_SIZE,
        )
    )
    env = dict(os.environ, SLURM_CONF=str(conf))
    subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True)
    subprocess.run(["slurmd", "-f", str(conf)], env=env, check=True)

    def idle() -> bool:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        return out.returncode == 0 and out.stdout.strip() == "idle"

    _wait(idle, 60, "the SLURM node")

    def stop() -> None:
        subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True)
        for name in ("slurmd", "slurmctld"):
            pid = root / f"{name}.pid"
            if pid.is_file():
                try:
                    os.kill(int(pid.read_text()), 15)
                except (ProcessLookupError, ValueError):
                    pass

    atexit.register(stop)
    _started["slurm"] = ({"SLURM_CONF": str(conf)}, "")
    return _started["slurm"]  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------- PostgreSQL
def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


class PostgresCluster:
    """A fresh PostgreSQL cluster on 127.0.0.1 with a database ``mlflow`` owned by the user
    ``vaco``; :meth:`stop` and :meth:`start` take it down and bring it back on the same port."""

    def __init__(self, pg_bin: Path, password: str) -> None:
        self.pg_bin, self.root = pg_bin, Path(tempfile.mkdtemp(prefix="vaco-pg-"))
        self.run_as: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            shutil.chown(self.root, "postgres")
            self.run_as = ["runuser", "-u", "postgres", "--"]
        admin = self.root / "admin-password"
        admin.write_text("admin-" + password + "\n")
        if self.run_as:
            shutil.chown(admin, "postgres")
        self.port = _free_port()
        subprocess.run(
            [
                *self.run_as,
                str(pg_bin / "initdb"),
                "-D",
                str(self.root / "data"),
                "-U",
                "postgres",
                "-A",
                "scram-sha-256",
                f"--pwfile={admin}",
            ],
            check=True,
            capture_output=True,
        )
        self.start()
        atexit.register(self.stop)
        import psycopg

        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            password="admin-" + password,
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f"CREATE USER vaco PASSWORD '{password}'")
            conn.execute("CREATE DATABASE mlflow OWNER vaco")
        self.url = f"postgresql+psycopg://vaco:{password}@127.0.0.1:{self.port}/mlflow"

    def _ctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.run_as, str(self.pg_bin / "pg_ctl"), "-D", str(self.root / "data"), *args], capture_output=True
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        out = self._ctl("-l", str(self.root / "log"), "-w", "-o", options, "start")
        assert out.returncode == 0, out.stderr

    def stop(self) -> None:
        self._ctl("-m", "fast", "-w", "stop")


def postgres_cluster(password: str) -> tuple[PostgresCluster | None, str]:
    """A cluster of its own (a test that stops it), or (None, why not)."""
    pg_bin = _pg_bin()
    if pg_bin is None:
        return None, "PostgreSQL is not installed: apt-get install postgresql"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return None, "psycopg is not installed: pip install -e '.[postgres]'"
    return PostgresCluster(pg_bin, password), ""


def postgres(password: str) -> tuple[str | None, str]:
    """(``postgresql+psycopg://vaco:<password>@127.0.0.1:<port>/mlflow``, "") or (None, why not):
    one cluster for the session."""
    if "postgres" not in _started:
        cluster, why = postgres_cluster(password)
        _started["postgres"] = (cluster.url if cluster else None, why)
    return _started["postgres"]  # type: ignore[return-value]
