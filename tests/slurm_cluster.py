"""A real Slurm for the tests: Debian's ``slurmctld``, one ``slurmd`` per node and ``munge``,
each node an emulated host of its own (``tfdp.launcher.emulated_hosts``: a network namespace
with its own address, all on one switch), the controller on a host of its own, from which jobs
are submitted. Every file is in one folder; ``stop`` ends every process and removes every
namespace.

Needs Linux, root and Slurm's and munge's commands (``.ci/run`` installs them; the steps are in
docs/clusters.md); ``missing()`` says what is absent, for the tests' skip.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from processes import name_hosts, unname_hosts
from tfdp.launcher import emulated_hosts

COMMANDS = ("slurmctld", "slurmd", "srun", "sbatch", "scancel", "scontrol", "sinfo", "munged")
NODES = 2
# A job's credential lifetime, and so how long a requeued job waits before it may start again
# (while its old credential is revoked on the nodes): Slurm's default is 120 s. A job whose start
# time has come is started by the scheduler's next periodic pass (sched_interval, 60 s by
# default: here 1 s), no event prompting it.
CRED_EXPIRE = 10


def missing() -> str:
    """Why a real Slurm cannot run here ('' when it can)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "needs Linux and root (a slurmd per network namespace)"
    absent = [c for c in COMMANDS if shutil.which(c) is None]
    return (f"needs Slurm and munge ({', '.join(absent)} not found; Debian: apt install "
            "slurmctld slurmd slurm-client munge)") if absent else ""


def _cgroup2() -> bool:
    """Whether /sys/fs/cgroup itself is the unified (v2) hierarchy."""
    with open("/proc/mounts") as f:
        return any(line.split()[1:3] == ["/sys/fs/cgroup", "cgroup2"] for line in f)


class SlurmCluster:
    """``NODES`` compute nodes (``node1``..) and a controller, on emulated hosts."""

    def __init__(self, folder):
        self.base, self.starts = str(folder), 0
        self.hosts = emulated_hosts.Hosts(NODES + 1)
        self.daemons = []

    def start(self) -> "SlurmCluster":
        """A new cluster: its own folder (configuration, state, logs), hosts and daemons."""
        self.starts += 1
        self.folder = os.path.join(self.base, f"start-{self.starts}")
        os.makedirs(self.folder)
        self.conf = os.path.join(self.folder, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.hosts.create()
        try:
            # Each node's name resolves on every host, as a cluster's names do on its nodes.
            name_hosts(self.hosts, "".join(f"{self.hosts.address(n)} node{n}\n"
                                           for n in range(1, NODES + 1)))
            self._munge()
            self._configure()
            self.daemons.append(self._spawn(0, "slurmctld", "-D", "-i"))
            for node in range(1, NODES + 1):
                self.daemons.append(self._spawn(node, "slurmd", "-D", "-N", f"node{node}"))
            self.wait_for(lambda: self.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()
                          == ["idle"] * NODES or None, 60, "both nodes idle in sinfo")
        except AssertionError as e:
            logs = self.logs()
            self.stop()
            raise AssertionError(f"{e}; the daemons' logs:\n{logs}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def _munge(self):
        key = os.path.join(self.folder, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(os.urandom(128))
        self.socket = os.path.join(self.folder, "munge.socket")
        subprocess.run(["munged", "--force", f"--socket={self.socket}", f"--key-file={key}",
                        f"--log-file={self.folder}/munged.log",
                        f"--pid-file={self.folder}/munged.pid",
                        f"--seed-file={self.folder}/munged.seed"], check=True, timeout=30)

    def _configure(self):
        d = self.folder
        for sub in ["state"] + [f"spool-node{n}" for n in range(1, NODES + 1)]:
            os.makedirs(os.path.join(d, sub))
        nodes = "\n".join(f"NodeName=node{n} NodeAddr={self.hosts.address(n)} CPUs=2 "
                          "State=UNKNOWN" for n in range(1, NODES + 1))
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=tfdp
SlurmctldHost={socket.gethostname()}({self.hosts.address(0)})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket},cred_expire={CRED_EXPIRE}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
SlurmctldTimeout=30
SlurmdTimeout=10
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        # slurmd loads a cgroup plugin even with proctrack/linuxproc, and its autodetection
        # fails on a tmpfs at /sys/fs/cgroup holding v1 hierarchies: name the one mounted.
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n" if _cgroup2()
                    else "CgroupPlugin=cgroup/v1\n")

    def _spawn(self, host: int, *command):
        log = open(os.path.join(self.folder, f"{command[0]}-{host}.out"), "w")
        return subprocess.Popen(["ip", "netns", "exec", self.hosts.names[host], *command],
                                env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def run(self, *command, timeout=600, env=None, cwd=None) -> subprocess.CompletedProcess:
        """A Slurm command (srun, sbatch, scontrol, ...) on the controller's host."""
        return subprocess.run(["ip", "netns", "exec", self.hosts.names[0], *command],
                              env=dict(self.env, **(env or {})), capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)

    def popen(self, *command, env=None, cwd=None) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.hosts.names[0], *command],
                                env=dict(self.env, **(env or {})), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=cwd)

    def job(self, job_id: str) -> dict:
        """``scontrol show job``'s fields of ``job_id``."""
        out = self.run("scontrol", "-o", "show", "job", job_id).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    @staticmethod
    def wait_for(check, seconds: float, what: str):
        """``check()``'s first truthy value within ``seconds``; else fail, naming ``what``."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            found = check()
            if found:
                return found
            time.sleep(0.2)
        raise AssertionError(f"waited {seconds:g} s for {what}")

    def logs(self) -> str:
        """The daemons' last lines, for a failing test's message."""
        text = []
        for name in sorted(os.listdir(self.folder)):
            if name.endswith((".out", ".log")):
                with open(os.path.join(self.folder, name), errors="replace") as f:
                    text.append(f"--- {name}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(text)

    def restart(self) -> "SlurmCluster":
        """After a test that took a node down: a fresh cluster for the next."""
        self.stop()
        return self.start()

    def stop(self):
        """Every job, daemon and namespace made, gone."""
        if self.daemons:
            self.run("scancel", "--full", "--signal=KILL", "--user=root", timeout=30)
        self.hosts.remove()  # Kills what still runs on the hosts: daemons, steps, tasks.
        unname_hosts(self.hosts)
        for daemon in self.daemons:
            daemon.wait(timeout=30)
        self.daemons = []
        pid_file = os.path.join(self.folder, "munged.pid")
        if os.path.exists(pid_file):
            with open(pid_file) as f:
                pid = int(f.read().strip() or 0)
            if pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


