"""The testbed's configuration and the files it generates (pure functions, no daemons)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

HOSTS_MARK = "# {} slurmfabric testbed {}"  # BEGIN/END, node prefix: one block per testbed
# First release whose cgroup.conf accepts CgroupPlugin=disabled (verified on 24.11.5;
# 22.05.8's library knows only cgroup/v1, cgroup/v2 and autodetect).
CGROUP_DISABLED_SINCE = (23, 2)


def default_state_dir() -> Path:
    """Outside any home directory: munged runs as user munge and must reach its files."""
    explicit = os.environ.get("SLURMFABRIC_TESTBED_DIR")
    if explicit:
        return Path(explicit)
    return Path(f"/var/tmp/slurmfabric-testbed-{os.getuid()}")


@dataclass
class Settings:
    """Everything that shapes the cluster; stored beside it so later calls reuse it."""

    __test__ = False

    state_dir: Path = field(default_factory=default_state_dir)
    nodes: int = 4
    prefix: str = "sfn"
    cpus: int = 4
    memory_mb: int = 4000
    partition: str = "debug"
    cluster_name: str = "sftestbed"
    ctld_port: int = 16817
    node_port_base: int = 16901
    addr_prefix: str = "127.0.77."
    # Job accounting through slurmdbd and a private MariaDB, like a real site (sacct).
    accounting: bool = False
    dbd_port: int = 16819
    db_port: int = 16830
    # How long a requeued job waits before it may start again, and a step credential's
    # lifetime: slurm.conf(5) AuthInfo cred_expire ("This also controls how long a requeued
    # job must wait before starting again", default 120 s). 30 s keeps requeue tests lean and
    # still outlasts a prolog plus a launch on a busy 2-core machine.
    cred_expire: int = 30
    # The pyxis/enroot build (scripts/build-containers.sh) the nodes load through
    # plugstack.conf; "" runs without pyxis. ``converge`` sets it from what it finds built.
    pyxis: str = ""

    @property
    def node_names(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(1, self.nodes + 1)]

    def node_addr(self, index: int) -> str:
        return f"{self.addr_prefix}{index + 1}"

    @property
    def urgent_partition(self) -> str:
        """The preempting partition: same nodes, higher PriorityTier."""
        return f"{self.partition}-urgent"

    @property
    def conf_path(self) -> Path:
        return self.state_dir / "etc" / "slurm.conf"

    @property
    def extra_conf_path(self) -> Path:
        return self.state_dir / "etc" / "slurm.extra.conf"

    @property
    def cgroup_conf_path(self) -> Path:
        """Slurm reads cgroup.conf from the directory that holds slurm.conf."""
        return self.state_dir / "etc" / "cgroup.conf"

    @property
    def plugstack_path(self) -> Path:
        return self.state_dir / "etc" / "plugstack.conf"

    @property
    def munge_socket(self) -> Path:
        return self.state_dir / "munge" / "munge.socket"

    @property
    def pids_path(self) -> Path:
        return self.state_dir / "pids.json"

    @property
    def dbd_conf_path(self) -> Path:
        """slurmdbd reads slurmdbd.conf beside slurm.conf (it must be mode 0600)."""
        return self.state_dir / "etc" / "slurmdbd.conf"

    @property
    def db_dir(self) -> Path:
        return self.state_dir / "mysql"

    @property
    def db_socket(self) -> Path:
        return self.db_dir / "mysqld.sock"


DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
DB_PASSWORD = "slurmfabric-testbed"  # a private database on 127.0.0.1 only


def render_dbd_conf(s: Settings) -> str:
    """slurmdbd.conf (slurmdbd.conf(5)): MariaDB over 127.0.0.1, munge on our socket."""
    host = socket.gethostname().split(".")[0]
    d = s.state_dir
    return "\n".join([
        "# Written by 'slurmfabric testbed up --accounting'.",
        "AuthType=auth/munge",
        f"AuthInfo=socket={s.munge_socket}",
        f"DbdHost={host}",  # slurmdbd refuses to start on a host DbdHost does not name
        "DbdAddr=127.0.0.1",
        f"DbdPort={s.dbd_port}",
        "SlurmUser=root",
        f"PidFile={d}/run/slurmdbd.pid",
        f"LogFile={d}/log/slurmdbd.log",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={s.db_port}",
        f"StorageUser={DB_USER}",
        f"StoragePass={DB_PASSWORD}",
        f"StorageLoc={DB_NAME}",
    ]) + "\n"


def render_slurm_conf(s: Settings) -> str:
    """slurm.conf for the testbed. Settings that matter and why are commented inline."""
    host = socket.gethostname().split(".")[0]
    d = s.state_dir
    names = s.node_names
    lines = [
        "# Written by 'slurmfabric testbed up'; rewritten on each up.",
        f"ClusterName={s.cluster_name}",
        # slurmctld refuses to start unless SlurmctldHost names this machine.
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={s.ctld_port}",
        f"SlurmdPort={s.node_port_base}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={s.munge_socket},cred_expire={s.cred_expire}",
        f"StateSaveLocation={d}/ctld",
        # %n: several slurmd share the host, each needs its own spool, pid and log file.
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd.%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd.%n.log",
        # srun --mpi=pmix: each slurmstepd makes its client dir spmix_appdir_<uid>_<job>.<step>
        # under TmpFS, which slurmd expands with %n like the spool (pmixp_info.c ->
        # slurm_get_tmp_fs(node)). One shared /tmp gives every node the same path and all
        # but one fail with "File exists". Jobs still see the real /tmp (nothing sets TMPDIR).
        f"TmpFS={d}/tmp/%n",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # Declared CPUs/memory win over what slurmd detects (virtual nodes share 2 cores).
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        # SPANK plugins (spank(8)): pyxis, when a build for this Slurm was found.
        *([f"PlugStackConfig={s.plugstack_path}"] if s.pyxis else []),
        *([
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={s.dbd_port}",
            # Connections to slurmdbd take their munge socket from here, not from AuthInfo
            # (slurm.conf(5) AccountingStoragePass).
            f"AccountingStoragePass={s.munge_socket}",
        ] if s.accounting else ["AccountingStorageType=accounting_storage/none"]),
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        # 24.11 logs "Configured MailProg is invalid" when no mail(1) is installed.
        "MailProg=/bin/true",
        # A failed prolog requeues the job without holding it (slurm.conf(5),
        # SchedulerParameters=nohold_on_prolog_fail). A job whose BeginTime passed (a requeued
        # one, see cred_expire) waits for the next periodic pass: sched_interval (main loop,
        # default 60 s) and bf_interval (backfill, default 30 s) at 5 s start it within
        # seconds; on 4-64 idle nodes a pass costs nothing.
        "SchedulerParameters=nohold_on_prolog_fail,sched_interval=5,bf_interval=5",
        "PrologFlags=Alloc",
        "PrologEpilogTimeout=60",
        "MinJobAge=600",
        "KillWait=5",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        # A node whose slurmd stops answering is DOWN after this long, and its jobs are
        # requeued (--requeue) or ended NODE_FAIL: the resume tests kill one on purpose.
        "SlurmdTimeout=20",
        # Jobs in a higher PriorityTier partition preempt lower ones, which are requeued
        # (slurm.conf(5) PreemptType, PreemptMode; https://slurm.schedmd.com/preempt.html).
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        f"Include {s.extra_conf_path}",
    ]
    for i, name in enumerate(names):
        lines.append(
            f"NodeName={name} NodeHostname={name} NodeAddr={s.node_addr(i)} "
            f"Port={s.node_port_base + i} CPUs={s.cpus} RealMemory={s.memory_mb} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={s.partition} Nodes={','.join(names)} Default=YES "
        "MaxTime=INFINITE State=UP PriorityTier=1"
    )
    # Same nodes, higher tier: a job here preempts (requeues) the default partition's jobs.
    lines.append(
        f"PartitionName={s.urgent_partition} Nodes={','.join(names)} "
        "MaxTime=INFINITE State=UP PriorityTier=2"
    )
    return "\n".join(lines) + "\n"


def render_cgroup_conf(version: tuple[int, ...]) -> str:
    """cgroup.conf for the installed Slurm ``version`` (from ``slurmd -V``).

    From 23.02 on, slurmd initialises the cgroup plugin even with proctrack/linuxproc and
    task/none, and exits ("Unable to initialize cgroup plugin") where no cgroup tree is
    mounted or, on cgroup v2, none is delegated by systemd (containers, chroots, daemons
    started from a shell). The testbed uses no cgroups, so it switches them off. 22.05
    does not know the value ``disabled`` and never needed it: it gets comments only,
    which means its defaults, as with no file.
    """
    head = "# Written by 'slurmfabric testbed up' for Slurm {}.\n".format(
        ".".join(str(part) for part in version))
    if tuple(version[:2]) >= CGROUP_DISABLED_SINCE:
        return head + "CgroupPlugin=disabled\n"
    return head + "# Slurm < 23.02: no setting needed (cgroups are used only by plugins).\n"


def hosts_block(s: Settings, own_names: list[str] | tuple[str, ...] = ()) -> str:
    """The /etc/hosts rows for the nodes, plus this machine's names if given.

    slurmctld connects back to srun and scancel at the host name they report; where that
    name does not resolve (a bare chroot or container) job steps time out, so ``up`` adds
    it here, on 127.0.0.1 like SlurmctldHost.
    """
    rows = [f"{s.node_addr(i)} {name}" for i, name in enumerate(s.node_names)]
    if own_names:
        rows.append(f"127.0.0.1 {' '.join(own_names)}")
    begin, end = (HOSTS_MARK.format(word, s.prefix) for word in ("BEGIN", "END"))
    return "\n".join([begin, *rows, end]) + "\n"


def current_block(current: str, prefix: str) -> str:
    """This testbed's block as it stands in an /etc/hosts text ('' when absent)."""
    begin, end = (HOSTS_MARK.format(word, prefix) for word in ("BEGIN", "END"))
    lines = [line.strip() for line in current.splitlines()]
    if begin not in lines or end not in lines[lines.index(begin):]:
        return ""
    start = lines.index(begin)
    stop = lines.index(end, start)
    return "\n".join(lines[start:stop + 1]) + "\n"


def merge_hosts(current: str, block: str) -> str:
    """Replace the block with the same markers in an /etc/hosts text (or append it).

    Every other line, other testbeds' blocks included, is kept as it was.
    """
    begin, end = block.splitlines()[0].strip(), block.splitlines()[-1].strip()
    out: list[str] = []
    skipping = False
    for line in current.splitlines(keepends=True):
        if line.strip() == begin:
            skipping = True
            continue
        if skipping:
            if line.strip() == end:
                skipping = False
            continue
        out.append(line)
    text = "".join(out)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + block


def write_extra_conf(s: Settings, text: str) -> None:
    """Write the included fragment; never empty, since Slurm warns about empty includes."""
    s.extra_conf_path.write_text("# site additions (slurmfabric testbed set_extra_conf)\n" + text)
