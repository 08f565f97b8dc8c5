"""A real one-machine SLURM cluster for the tests: munged, slurmctld and one slurmd with 2 CPUs, all on
loopback, configured in a temporary directory and stopped afterwards.

Needs root and Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` packages (``.ci/run``
installs them). Where they are missing the tests that use the cluster are skipped with the reason; under
CI (``CI=true``) they fail instead, so the cluster test can never pass silently.
"""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "srun")


def _which(name):
    return shutil.which(name) or next(
        (str(Path(d) / name) for d in ("/usr/sbin", "/sbin") if (Path(d) / name).exists()), None
    )


def unavailable_reason():
    """Why a SLURM cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root"
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        return (f"SLURM/munge not installed ({', '.join(missing)} missing): "
                "apt-get install slurmctld slurmd slurm-client munge")
    if not Path("/etc/munge/munge.key").exists():
        return "/etc/munge/munge.key missing (the munge package creates it)"
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """A running cluster; ``env`` has ``SLURM_CONF`` for sbatch/squeue/scontrol."""

    def __init__(self, root: Path):
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.procs = []
        self.conf = root / "slurm.conf"
        self.socket = root / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def write_conf(self):
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(exist_ok=True)
        ctld_port, d_port = _free_port(), _free_port()
        self.conf.write_text(f"""\
ClusterName=fairseqresidualtest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName={self.host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self):
        self.write_conf()
        subprocess.run(
            [_which("munged"), "--force", f"--socket={self.socket}", f"--pid-file={self.root}/munged.pid",
             f"--log-file={self.root}/log/munged.log", f"--seed-file={self.root}/munged.seed"],
            check=True, capture_output=True, timeout=30,
        )
        for daemon, extra in (("slurmctld", ["-i"]), ("slurmd", ["-N", self.host])):
            log = open(self.root / "log" / f"{daemon}.stdout", "w")
            self.procs.append(subprocess.Popen([_which(daemon), "-D", "-f", str(self.conf), *extra],
                                               stdout=log, stderr=subprocess.STDOUT, env=self.env))
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run([_which("sinfo"), "-h", "-o", "%T"], env=self.env, capture_output=True,
                                 text=True)
            if out.returncode == 0 and out.stdout.strip() in ("idle", "idle*") and "*" not in out.stdout:
                return self
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"SLURM daemon exited: {self.logs()}")
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM node did not become idle within 60 s: {self.logs()}")

    def wait_for_jobs(self, timeout):
        """Wait until the queue is empty; raise after ``timeout`` seconds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = subprocess.run([_which("squeue"), "-h"], env=self.env, capture_output=True, text=True)
            if out.returncode == 0 and not out.stdout.strip():
                return
            time.sleep(1)
        raise TimeoutError(f"SLURM jobs still queued after {timeout} s: {out.stdout}")

    def logs(self):
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((self.root / "log").glob("*")))

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run([_which("munged"), "--stop", f"--socket={self.socket}"], capture_output=True)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the SLURM test must run in CI, but: {reason}")
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()
