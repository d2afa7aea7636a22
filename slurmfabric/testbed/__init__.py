"""A real multi-node Slurm cluster on one machine, for tests and demos.

It runs Debian's own daemons: one munged (private socket and key), one slurmctld and one
slurmd per virtual node (``slurmd -N <name>``), each node with its own loopback address
and an ``/etc/hosts`` name so that node names resolve like on a real cluster. Everything
lives under one state directory; ports are non-default so it never meets a site's daemons.
``down`` stops exactly the PIDs that ``up`` recorded. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from slurmfabric.errors import SlurmCommandError, SlurmfabricError
from slurmfabric.slurm import cmd
from slurmfabric.testbed import containers
from slurmfabric.testbed.config import (
    DB_NAME,
    DB_PASSWORD,
    DB_USER,
    Settings,
    current_block,
    default_state_dir,
    hosts_block,
    merge_hosts,
    render_cgroup_conf,
    render_dbd_conf,
    render_slurm_conf,
    write_extra_conf,
)
from slurmfabric.testbed.procs import (
    munge_ids,
    own_host_names,
    pid_runs,
    resolves,
    send_signal,
    slurmd_version,
    stop,
    strays,
    wait_for,
    which,
)

APT_PACKAGES = ("slurm-wlm", "munge")
ACCOUNTING_PACKAGES = ("slurmdbd", "mariadb-server")


class TestbedError(SlurmfabricError):
    """The local cluster could not be started or inspected."""

    __test__ = False  # not a pytest test class despite the name


class Testbed:
    """Start, stop and inspect the cluster described by ``Settings``."""

    __test__ = False

    def __init__(self, settings: Settings | None = None) -> None:
        self.s = settings or Settings()

    # -- environment -------------------------------------------------------------------

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """A process environment that talks to this cluster and finds slurmfabric."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.s.conf_path)
        # Virtual nodes resolve to 127.x addresses; on a real cluster that is an error.
        env["SLURMFABRIC_ALLOW_LOOPBACK"] = "1"
        bindir = str(Path(sys.executable).parent)
        paths = [bindir, "/usr/sbin", "/sbin"]
        env["PATH"] = os.pathsep.join([*paths, env.get("PATH", "/usr/bin:/bin")])
        return env

    def export_lines(self) -> str:
        bindir = Path(sys.executable).parent
        return (
            f"export SLURM_CONF={self.s.conf_path}\n"
            "export SLURMFABRIC_ALLOW_LOOPBACK=1  # testbed nodes live on 127.x addresses\n"
            f'export PATH={bindir}:"$PATH"\n'
        )

    # -- install -------------------------------------------------------------------------

    @staticmethod
    def missing_binaries(accounting: bool = False) -> list[str]:
        names = ["munged", "slurmctld", "slurmd", "sbatch"]
        if accounting:
            names += ["slurmdbd", "mariadbd", "mariadb-install-db", "sacct"]
        return [b for b in names if not which(b)]

    def ensure_installed(self, log=print) -> None:
        missing = self.missing_binaries(self.s.accounting)
        if not missing:
            return
        packages = (*APT_PACKAGES, *(ACCOUNTING_PACKAGES if self.s.accounting else ()))
        command = "apt-get update && apt-get install -y " + " ".join(packages)
        if os.geteuid() != 0:
            raise TestbedError(
                f"missing {', '.join(missing)}",
                hint=f"as root run: {command}",
            )
        log(f"installing {' '.join(packages)} with apt-get ...")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for argv in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", *packages]):
            proc = subprocess.run(argv, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise TestbedError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-500:]}")
        still = self.missing_binaries(self.s.accounting)
        if still:
            raise TestbedError(f"still missing after apt-get: {', '.join(still)}")

    # -- state ---------------------------------------------------------------------------

    def _read_pids(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(self.s.pids_path.read_text()).items()}
        except (OSError, ValueError):
            return {}

    def _write_pids(self, pids: dict[str, int]) -> None:
        tmp = self.s.pids_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(pids, indent=1))
        tmp.replace(self.s.pids_path)

    def _save_settings(self) -> None:
        data = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.s).items()}
        (self.s.state_dir / "settings.json").write_text(json.dumps(data, indent=1))

    @classmethod
    def from_state(cls, state_dir: Path | None = None) -> Testbed:
        """Reattach to a cluster started earlier (same settings), or the defaults."""
        state_dir = state_dir or default_state_dir()
        try:
            data = json.loads((state_dir / "settings.json").read_text())
            # an older or newer layout: keep the keys this version knows, drop the rest
            known = {f.name for f in fields(Settings)}
            data = {k: v for k, v in data.items() if k in known} if isinstance(data, dict) \
                else {}
            data["state_dir"] = state_dir
            return cls(Settings(**data))
        except (OSError, ValueError, TypeError):
            return cls(Settings(state_dir=state_dir))

    def running(self) -> dict[str, int]:
        """Recorded daemons that are still alive and still the program we started."""
        alive = {}
        for key, pid in self._read_pids().items():
            if pid_runs(pid, key.split(":")[0]):
                alive[key] = pid
        return alive

    def expected_keys(self) -> list[str]:
        accounting = ["mariadbd", "slurmdbd"] if self.s.accounting else []
        return ["munged", *accounting, "slurmctld", *(f"slurmd:{n}" for n in self.s.node_names)]

    # -- up / down -----------------------------------------------------------------------

    def up(self, timeout: float = 60, log=print) -> float:
        """Start whatever is not running yet; return seconds until all nodes were idle."""
        t0 = time.monotonic()
        self.ensure_installed(log)
        alive = self.running()
        if alive and set(alive) == set(self.expected_keys()):
            log(f"testbed already running ({len(self.s.node_names)} nodes); "
                f"SLURM_CONF={self.s.conf_path}")
            self._refresh_conf(log)
            self.wait_idle(timeout)
            return 0.0
        self._prepare_dirs()
        self._write_files()
        self._update_hosts(log)
        pids = dict(alive)
        if "munged" not in pids:
            pids["munged"] = self._start_munged()
            self._write_pids(pids)
            wait_for(lambda: self.s.munge_socket.exists(), 10, "munged socket")
        if self.s.accounting:
            self._start_accounting(pids, fresh="slurmctld" not in pids)
        if "slurmctld" not in pids:
            # -c: a testbed starts clean, so no drained node or old job survives a restart.
            pids["slurmctld"] = self._spawn(
                ["slurmctld", "-D", "-c", "-i", "-f", str(self.s.conf_path)], "slurmctld")
            self._write_pids(pids)
        paths = self._write_pyxis_files(fresh="slurmctld" not in alive)
        for name in self.s.node_names:
            key = f"slurmd:{name}"
            if key not in pids:
                env = self.env()
                if name in paths:  # this node's enroot first (containers.render_node_enroot)
                    env["PATH"] = os.pathsep.join([paths[name], env["PATH"]])
                pids[key] = self._spawn(
                    ["slurmd", "-D", "-N", name, "-f", str(self.s.conf_path)], f"slurmd.{name}",
                    env=env)
        self._write_pids(pids)
        self.wait_idle(timeout - (time.monotonic() - t0))
        elapsed = time.monotonic() - t0
        log(f"testbed up: {len(self.s.node_names)} idle nodes in {elapsed:.1f} s; "
            f"SLURM_CONF={self.s.conf_path}"
            + (f"; pyxis from {self.s.pyxis}" if self.s.pyxis else ""))
        return elapsed

    def converge(self, accounting: bool = False, timeout: float = 90,
                 log=print) -> Testbed:
        """Bring whatever is here to a full running testbed (with accounting if asked),
        saying in one line what had to change: a running one without accounting is
        restarted with it; a partly running one (a daemon died) is restarted; daemons no
        record knows (a killed run, an older state layout) are stopped first. A stopped
        or healthy one is simply started or reused (``up`` says so). Returns the testbed
        that now runs (its settings may have changed)."""
        build = containers.find_build(".".join(map(str, slurmd_version())))
        target = Testbed(replace(self.s, accounting=self.s.accounting or accounting,
                                 pyxis=str(build.root) if build else ""))
        alive = self.running()
        changed = []
        stray = strays(self.s.state_dir, set(alive.values()))
        if stray:
            stop([pid for pid, _ in stray])
            changed.append("stopped " + ", ".join(f"{name} {pid}" for pid, name in stray)
                           + " that no record knew (an earlier run)")
        if alive and set(alive) != set(self.expected_keys()):
            missing = sorted(set(self.expected_keys()) - set(alive))
            self.down(log=lambda msg: None)
            changed.append("restarted a partly running testbed (not running: "
                           f"{', '.join(missing) or 'none of the expected'})")
            alive = {}
        elif alive and target.s.accounting and not self.s.accounting:
            self.down(log=lambda msg: None)
            changed.append("restarted with accounting (slurmdbd on MariaDB); it ran without")
            alive = {}
        elif alive and target.s.pyxis != self.s.pyxis:
            self.down(log=lambda msg: None)
            changed.append(f"restarted to load {build.describe()}" if build else
                           "restarted without pyxis (its build is gone)")
            alive = {}
        if changed:
            log(f"testbed: {'; '.join(changed)}")
        if alive:
            target.resume_all()  # an earlier session may have left a node drained
        target.up(timeout=timeout, log=log)
        return target

    def down(self, log=print, timeout: float = 15) -> list[str]:
        """Stop the recorded daemons (slurmd first, munged last). Removes no files."""
        alive = self.running()
        rank = {"slurmctld": 1, "slurmdbd": 2, "mariadbd": 3, "munged": 4}
        order = sorted(alive, key=lambda k: rank.get(k, 0))  # slurmd first, munged last
        for key in order:
            send_signal(alive[key], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for key in order:
            while pid_runs(alive[key], key.split(":")[0]) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_runs(alive[key], key.split(":")[0]):
                send_signal(alive[key], signal.SIGKILL)
        if self.s.pids_path.parent.exists():
            self._write_pids({})
        if alive:
            log(f"testbed down: stopped {', '.join(order)}")
        else:
            log("testbed down: nothing was running")
        return order

    def _refresh_conf(self, log) -> None:
        """A testbed started by an older slurmfabric gets today's slurm.conf in place.

        Running daemons reread it on ``scontrol reconfigure`` (e.g. TmpFS, which srun
        --mpi=pmix needs per node), so shared long-lived testbeds need no restart.
        """
        try:
            current = self.s.conf_path.read_text()
        except OSError:
            current = ""
        if current == render_slurm_conf(self.s):
            return
        self._prepare_dirs()
        self._write_files()
        cmd.reconfigure(env=self.env())
        time.sleep(1.0)  # slurmd rereads asynchronously
        log(f"testbed slurm.conf updated and reread: {self.s.conf_path}")

    def wait_idle(self, timeout: float) -> None:
        """Wait until sinfo shows every node idle (or fail with the daemons' last words)."""
        deadline = time.monotonic() + max(timeout, 1)
        last = ""
        while time.monotonic() < deadline:
            try:
                out = cmd.run(cmd.SINFO_NODE_STATES, env=self.env(), timeout=10)
                states = cmd.parse_node_states(out)
                last = out.strip()
                if states and all(states.get(n) == "idle" for n in self.s.node_names):
                    return
            except SlurmfabricError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise TestbedError(
            f"nodes not idle after {timeout:.0f} s: {last!r}",
            hint=f"see the logs in {self.s.state_dir / 'log'}",
        )

    def resume_all(self) -> list[str]:
        """Return every drained or down node to service (a clean slate for a test session)."""
        stuck = [name for name, state in cmd.node_states(env=self.env()).items()
                 if not state.startswith(("idle", "alloc", "mix", "comp"))]
        for name in stuck:
            cmd.update_node(name, env=self.env(), State="RESUME")
        return stuck

    def status(self) -> str:
        alive = self.running()
        lines = [f"SLURM_CONF={self.s.conf_path}"]
        lines.append(f"daemons running: {len(alive)}/{len(self.expected_keys())}")
        if alive:
            lines.append(cmd.sinfo_summary(env=self.env()).rstrip())
        return "\n".join(lines)

    # -- internals -----------------------------------------------------------------------

    def _prepare_dirs(self) -> None:
        d = self.s.state_dir
        for sub in ("etc", "ctld", "run", "log", "spool", "munge", "jobs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for name in self.s.node_names:
            (d / "spool" / name).mkdir(exist_ok=True)
            # TmpFS=<state>/tmp/%n (config.py): pmix creates its app dir inside, not parents.
            node_tmp = d / "tmp" / name
            node_tmp.mkdir(parents=True, exist_ok=True)
            os.chmod(node_tmp, 0o1777)  # a /tmp for jobs of any user
        os.chmod(d, 0o755)  # munged (user munge) must traverse it
        for parent in d.resolve().parents:
            if not os.stat(parent).st_mode & 0o001:
                raise TestbedError(
                    f"state directory {d} is below {parent}, which user munge cannot enter",
                    hint="use --state-dir (or SLURMFABRIC_TESTBED_DIR) under /var/tmp",
                )

    def _write_files(self) -> None:
        self.s.conf_path.write_text(render_slurm_conf(self.s))
        self.s.cgroup_conf_path.write_text(render_cgroup_conf(slurmd_version()))
        if self.s.accounting:
            self.s.dbd_conf_path.write_text(render_dbd_conf(self.s))
            os.chmod(self.s.dbd_conf_path, 0o600)  # slurmdbd refuses a readable one
        if not self.s.extra_conf_path.exists():
            write_extra_conf(self.s, "")
        self._save_settings()
        key = self.s.state_dir / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        munge_dir = self.s.state_dir / "munge"
        if os.geteuid() == 0:
            uid, gid = munge_ids()
            for path in (munge_dir, key):
                os.chown(path, uid, gid)
        os.chmod(munge_dir, 0o755)  # munged: socket dir must be searchable by all
        os.chmod(key, 0o400)

    def _write_pyxis_files(self, fresh: bool) -> dict[str, str]:
        """plugstack.conf and each node's enroot, when this testbed loads pyxis (with no
        container left when the cluster starts afresh); returns each node's PATH prefix
        for its slurmd ({} without pyxis)."""
        if not self.s.pyxis:
            return {}
        build = containers.load_build(Path(self.s.pyxis))
        if build is None:
            raise TestbedError(f"the pyxis build in {self.s.pyxis} is gone or unfinished",
                               hint=containers.BUILD_HINT)
        self.s.plugstack_path.write_text(containers.render_plugstack(self.s.state_dir, build))
        if fresh:
            containers.clear_containers(self.s.state_dir, self.s.node_names)
        return containers.write_node_files(self.s.state_dir, self.s.node_names, build)

    def _update_hosts(self, log) -> None:
        missing = [n for n in self.s.node_names if not resolves(n)]
        hosts = Path("/etc/hosts")
        current = hosts.read_text()
        # This machine's name too, if nothing else resolves it (or our block already did).
        ours = current_block(current, self.s.prefix).split()
        own = [n for n in own_host_names() if n in ours or not resolves(n)]
        missing += [n for n in own if n not in ours]
        block = hosts_block(self.s, own)
        if not missing and block in current:
            return
        if os.geteuid() != 0:
            raise TestbedError(
                f"node names {', '.join(missing)} do not resolve",
                hint=f"add these lines to /etc/hosts:\n{block}",
            )
        # Write in place: /etc/hosts is often a bind mount in containers, so no rename.
        with open(hosts, "w") as handle:
            handle.write(merge_hosts(current, block))
        log(f"/etc/hosts: {len(self.s.node_names)} testbed names written")

    def _start_accounting(self, pids: dict[str, int], fresh: bool) -> None:
        """A private MariaDB on 127.0.0.1 and slurmdbd on it, so sacct works as on a site.

        A fresh start (no slurmctld running, which then starts with -c and numbers jobs
        from 1 again) also starts the accounting database empty, so a job id never means
        two jobs in sacct."""
        s = self.s
        data = s.db_dir / "data"
        if not (data / "mysql").is_dir():
            data.mkdir(parents=True, exist_ok=True)
            proc = subprocess.run(
                ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                 "--auth-root-authentication-method=socket", "--skip-test-db"],
                capture_output=True, text=True)
            if proc.returncode != 0:
                raise TestbedError(f"mariadb-install-db failed: {proc.stderr.strip()[-400:]}")
        if "mariadbd" not in pids:
            pids["mariadbd"] = self._spawn(
                ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={s.db_socket}",
                 f"--port={s.db_port}", "--bind-address=127.0.0.1", "--user=root",
                 f"--pid-file={s.db_dir / 'mariadbd.pid'}",
                 f"--log-error={s.state_dir / 'log' / 'mariadb.log'}"], "mariadbd")
            self._write_pids(pids)
            wait_for(lambda: s.db_socket.exists(), 30, "MariaDB socket")
        grants = [f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY "
                  f"'{DB_PASSWORD}'", f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1'"]
        if fresh and "slurmdbd" not in pids:
            grants.append(f"DROP DATABASE IF EXISTS {DB_NAME}")
        # The socket file appears at bind(), before the server listens and before it has
        # finished starting: a connection can be refused (ERROR 2002, errno 111) for a
        # moment on a loaded machine, so readiness is a client that gets in (CI, stop 38).
        argv = ["mariadb", "--no-defaults", f"--socket={s.db_socket}", "-u", "root", "-e",
                "; ".join(grants)]
        deadline = time.monotonic() + 30
        while True:
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode == 0:
                break
            if "ERROR 2002" not in proc.stderr or time.monotonic() > deadline:
                log_tail = _tail(s.state_dir / "log" / "mariadb.log", 400)
                raise TestbedError(f"MariaDB setup failed: {proc.stderr.strip()[-400:]}",
                                   hint=f"the server's log ends: {log_tail}")
            time.sleep(0.2)
        if "slurmdbd" not in pids:
            pids["slurmdbd"] = self._spawn(["slurmdbd", "-D"], "slurmdbd")
            self._write_pids(pids)
            wait_for(self._dbd_answers, 60, "slurmdbd")
            try:
                cmd.add_cluster(s.cluster_name, env=self.env())
            except SlurmCommandError as exc:
                raise TestbedError(str(exc)) from None

    def _dbd_answers(self) -> bool:
        return cmd.accounting_answers(env=self.env())

    def _start_munged(self) -> int:
        d = self.s.state_dir / "munge"
        argv = [
            "munged", "-F", f"--socket={self.s.munge_socket}", f"--key-file={d / 'munge.key'}",
            f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}",
        ]
        if os.geteuid() == 0:
            argv = ["setpriv", "--reuid=munge", "--regid=munge", "--clear-groups", *argv]
        return self._spawn(argv, "munged")

    def _spawn(self, argv: list[str], logname: str, env: dict[str, str] | None = None) -> int:
        """Start a daemon in its own session so it outlives this process; keep its output."""
        logfile = self.s.state_dir / "log" / f"{logname}.out"
        try:
            with open(logfile, "ab") as out:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True, env=env or self.env(), cwd=self.s.state_dir,
                )
        except FileNotFoundError as exc:
            raise TestbedError(f"{argv[0]} not found", hint="apt-get install slurm-wlm munge") \
                from exc
        time.sleep(0.05)
        if proc.poll() is not None:
            tail = logfile.read_text()[-800:]
            raise TestbedError(f"{argv[0]} exited at once (code {proc.returncode}): {tail}")
        return proc.pid


def _tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip() or "(empty)"
    except OSError:
        return f"({path} unreadable)"


__all__ = ["Settings", "Testbed", "TestbedError"]
