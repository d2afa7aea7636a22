"""Which launcher options take a value: srun(1) "OPTIONS", torchrun (torch.distributed.run's
argument parser, either spelling) and Open MPI mpirun(1). One owner for the importer
(job/importer/launch.py) and the recording stand-ins (job/importstubs.py); standard library
only, because a stand-in loads it on every call.
"""

from __future__ import annotations

# srun(1) options that take a value (long names; short ones below).
SRUN_VALUE = frozenset({
    "account", "acctg-freq", "begin", "chdir", "clusters", "comment", "constraint",
    "container", "container-image", "container-mounts", "container-workdir", "container-name",
    "container-env", "core-spec", "cpu-bind", "cpu-freq", "cpus-per-gpu", "cpus-per-task",
    "dependency", "distribution", "error", "exclude", "export", "gpu-bind", "gpus",
    "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "het-group",
    "input", "job-name", "jobid", "licenses", "mem", "mem-bind",
    "mem-per-cpu", "mem-per-gpu", "mpi", "network", "nodefile", "nodelist", "nodes",
    "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket",
    "open-mode", "output", "partition", "prolog", "qos", "relative", "reservation",
    "signal", "slurmd-debug", "task-epilog", "task-prolog", "threads", "time", "wait",
})
# srun(1) options whose argument is optional ("--kill-on-bad-exit[=0|1]", "--bcast[=<dest_path>]"
# in its OPTIONS, Slurm 22.05 and 24.11): getopt_long reads their value only when attached
# ("--kill-on-bad-exit=1", "-K1"), so "--kill-on-bad-exit ./wrap.sh" runs ./wrap.sh.
SRUN_OPTIONAL = frozenset({
    "bcast", "compress", "exclusive", "immediate", "kill-on-bad-exit", "nice", "no-kill",
    "propagate", "resv-ports", "send-libs",
})
SRUN_SHORT_OPTIONAL = {"I": "immediate", "K": "kill-on-bad-exit", "k": "no-kill"}
SRUN_SHORT_VALUE = {
    "A": "account", "c": "cpus-per-task", "C": "constraint", "D": "chdir",
    "d": "dependency", "e": "error", "G": "gpus", "i": "input", "J": "job-name",
    "L": "licenses", "m": "distribution", "M": "clusters", "N": "nodes", "n": "ntasks",
    "o": "output", "p": "partition", "q": "qos", "r": "relative", "S": "core-spec",
    "T": "threads", "t": "time", "W": "wait", "w": "nodelist", "x": "exclude",
}
# torchrun options that take a value (either spelling, '-' or '_').
TORCHRUN_VALUE = frozenset({
    "nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
    "max-restarts", "monitor-interval", "start-method", "role", "log-dir", "redirects",
    "tee", "local-ranks-filter", "node-rank", "master-addr", "master-port", "local-addr",
    "logs-specs", "event-log-handler", "numa-binding", "signals-to-handle", "r", "t",
})
MPIRUN_VALUE = frozenset({
    "np", "n", "c", "N", "npernode", "x", "mca", "gmca", "map-by", "bind-to", "rank-by",
    "H", "host", "hostfile", "machinefile", "rf", "rankfile", "wdir", "wd", "prefix",
    "report-bindings-file", "tune", "am", "output-filename", "display",
})
