"""Render sbatch scripts from a JobConfig with Jinja2 templates.

Every value a template prints must pass through a quoting filter: ``q`` (shell words),
``qargs`` (argument lists), ``sbatch`` (one ``#SBATCH`` option), ``comment`` (header text).
Integers may be printed as they are. Anything else is refused at render time by the
``finalize`` hook, so an unquoted user string cannot slip into a script. Per-node and
per-rank values (MASTER_ADDR, ranks, NCCL NICs, binding) are not computed here: the
script calls ``slurmfabric env`` / ``slurmfabric launch`` on the nodes at run time.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import jinja2

from slurmfabric import __version__
from slurmfabric._common.textcheck import shell_word
from slurmfabric.config.models import JobConfig
from slurmfabric.errors import ConfigError
from slurmfabric.job import expansion, usercode, zipapp
from slurmfabric.job.options import (  # the #SBATCH lines: options.py
    component_sbatch_options,
    sbatch_options,
    shape,
    total_nodes,
)

CONFIG_MARKER = "# slurmfabric-config: "
_PACKAGE = Path(__file__).resolve().parents[1]  # slurmfabric/
_PACKAGE_TEMPLATES = _PACKAGE / "templates"  # wheel (force-include)
_REPO_TEMPLATES = _PACKAGE.parent / "templates"  # editable install
_SBATCH_OPTION = re.compile(r"^--?[A-Za-z][A-Za-z0-9-]*(=[^\s'\"#\\`$]+)?\Z")


class Shell(str):
    """Text that is safe to paste into bash as it is (already quoted or checked)."""


def q(value: Any) -> Shell:
    """One shell word, quoted so bash passes it on byte for byte.

    A backslash right before a quote (``'a\\'``) is valid bash but reads like an escaped
    quote to people and to shellcheck (SC1003), so such values put each backslash outside
    the quotes: ``'a'\\``.
    """
    if isinstance(value, Shell):
        return value
    text = str(value)
    if not text.isprintable():
        return Shell(_ansi_c(text))
    quoted = shell_word(text)
    if quoted.startswith("="):  # export X==v is valid bash, but shellcheck reads '=='
        quoted = f"'{text}'"
    if "\\'" in quoted:
        quoted = "\\\\".join(shell_word(part) if part else "" for part in text.split("\\"))
    return Shell(quoted)


_ANSI_C = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _ansi_c(text: str) -> str:
    """bash's ``$'...'`` form for text with control or other non-printable characters: the
    script keeps one line per command (nothing that looks like an ``#SBATCH`` line), and each
    such character is written as its UTF-8 bytes (``\\xHH``), exact in any locale."""
    out = []
    for ch in text:
        if ch in _ANSI_C:
            out.append(_ANSI_C[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append("".join(f"\\x{byte:02x}" for byte in ch.encode("utf-8")))
    return "$'" + "".join(out) + "'"


def path_word(value: Any) -> Shell:
    """A path where its first characters must not change what it names: ``cd -- -`` is
    ``cd "$OLDPWD"`` (the operand '-' is special even after '--'), and a relative ``cd``
    operand is looked up in CDPATH first (bash manual, "Bourne Shell Builtins": cd; POSIX cd
    skips CDPATH for an operand starting with '.' or '..'). A relative path therefore gets
    ``./``; quoting keeps '~' literal."""
    text = str(value)
    if not text.startswith(("/", "./", "../")) and text not in (".", ".."):
        text = "./" + text
    return q(text)


def qargs(values: Iterable[Any]) -> Shell:
    return Shell(" ".join(q(v) for v in values))


def sbatch_option(value: str) -> Shell:
    """An ``#SBATCH`` option; the model already checked values, this refuses anything odd."""
    if not _SBATCH_OPTION.match(value):
        raise ConfigError([f"#SBATCH option {value!r} is not one plain word"])
    return Shell(value)


def comment(value: Any) -> Shell:
    """Text for a ``#`` comment line: control characters escaped so it stays one line."""
    text = str(value)
    return Shell("".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text))


def _finalize(value: Any) -> Any:
    if isinstance(value, Shell) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise jinja2.TemplateError(
        f"template printed {value!r} without a quoting filter (q, qargs, sbatch, comment)"
    )


def template_dirs() -> list[Path]:
    """The package's templates (installed wheel) first, then the repo's (editable)."""
    return [d for d in (_PACKAGE_TEMPLATES, _REPO_TEMPLATES) if d.is_dir()]


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in template_dirs()]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_finalize,
    )
    env.filters.update(q=q, qargs=qargs, path=path_word, sbatch=sbatch_option, comment=comment,
                       env_prepend=lambda n, v: Shell(expansion.prepend_export(n, v, q)),
                       env_append=lambda n, v: Shell(expansion.append_export(n, v, q)),
                       env_expand=lambda n, v: Shell(expansion.expand_export(n, v, q)))
    return env


def local_slurmfabric_bin() -> str:
    """The ``slurmfabric`` next to the running interpreter (a venv), else from PATH: what
    ``--embed-bin`` writes into a script. Compute nodes rarely have this path."""
    candidate = Path(sys.executable).parent / "slurmfabric"
    return str(candidate) if candidate.is_file() else "slurmfabric"


def node_bin(config: JobConfig, override: Optional[str] = None) -> str:
    """The slurmfabric command the script runs on the nodes: never a login-node path unless
    given (``override``/--embed-bin or ``launcher.slurmfabric``); else from their PATH.
    An override is checked like ``launcher.slurmfabric``: srun, mpirun and torchrun get it
    as an argument, where a leading '-' would be read as their own option."""
    if override is not None:
        from slurmfabric._common.textcheck import one_line, problem
        from slurmfabric.errors import UsageError

        bad = problem(override, "strict")
        if bad or not override or override.startswith("-"):
            raise UsageError(f"--slurmfabric-bin {one_line(repr(override), 120)}: "
                             f"{bad or 'empty or starts with -'}",
                             "give the path of slurmfabric on the compute nodes, e.g. "
                             "/opt/slurmfabric/bin/slurmfabric")
    return override or config.launcher.slurmfabric or "slurmfabric"


def login_only_path(path: str) -> Optional[str]:
    """Why ``path`` is unlikely to exist on compute nodes (under a home or a git clone)."""
    if not path.startswith("/"):
        return None
    home = str(Path.home())
    resolved = Path(path).resolve()
    for parent in (resolved, *resolved.parents):
        if (parent / ".git").exists():
            return f"it lies in the clone {parent}"
    if home not in ("/", "") and (path + "/").startswith(home.rstrip("/") + "/"):
        return f"it lies under the home directory {home}"
    return None


def config_json(config: JobConfig) -> str:
    """Canonical one-line JSON of the config: what the digest covers and the script embeds."""
    return json.dumps(config.model_dump(mode="json"), sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)


def config_digest(config: JobConfig) -> str:
    return "sha256:" + hashlib.sha256(config_json(config).encode()).hexdigest()[:16]


def nccl_exports(config: JobConfig) -> dict[str, str]:
    """NCCL variables the script exports: fabric.type's meaning (plan/contract.py), then
    fabric.nccl on top. Contradictions between the two were refused when the config loaded."""
    from slurmfabric.plan.contract import job_env

    return job_env(config.fabric.type, config.fabric.nccl)


def nccl_advice(config: JobConfig) -> list[str]:
    """The script's comment lines on the NCCL settings that matter at this job's fabric and
    scale (plan/scale.py); they explain, the exports decide."""
    from slurmfabric.job.options import total_nodes
    from slurmfabric.plan import scale

    return [a.line() for a in scale.advice(config.fabric.type, total_nodes(config),
                                           nccl_exports(config))]


def nccl_warnings(config: JobConfig) -> list[str]:
    """fabric.nccl values that contradict NCCL's rules or fabric.type (render warns)."""
    from slurmfabric.job.options import total_nodes
    from slurmfabric.plan import scale

    return scale.warnings(config.fabric.type, total_nodes(config), config.fabric.nccl,
                          where="fabric.nccl.")


# pyxis's srun options (https://github.com/NVIDIA/pyxis/wiki/Usage, `srun --help`): those
# taking a value, and the flags.
PYXIS_VALUE = frozenset({"container-image", "container-mounts", "container-workdir",
                         "container-name", "container-save", "container-env",
                         "container-unshare"})
PYXIS_FLAG = frozenset({"container-mount-home", "no-container-mount-home",
                        "container-remap-root", "no-container-remap-root",
                        "container-entrypoint", "no-container-entrypoint",
                        "container-entrypoint-log", "container-writable",
                        "container-readonly"})


def split_pyxis_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(pyxis options of ``launcher.srun_args``, the other srun options), order kept; a
    value given as the next word stays with its option."""
    pyxis: list[str] = []
    other: list[str] = []
    i = 0
    while i < len(args):
        name = args[i][2:].split("=", 1)[0] if args[i].startswith("--") else ""
        if name in PYXIS_FLAG or (name in PYXIS_VALUE and "=" in args[i]):
            pyxis.append(args[i])
        elif name in PYXIS_VALUE:
            pyxis += args[i:i + 2]
            i += 1
        else:
            other.append(args[i])
        i += 1
    return pyxis, other


def container_env_names(config: JobConfig) -> list[str]:
    """Every variable the script exports for the ranks, which pyxis must set over the
    image's ENV (--container-env): the user's, the NCCL plan's, slurmfabric's own and the
    job-level ones 'slurmfabric env' prints. program.env_prepend/env_append expand the
    host's value, so they are left to the image (a PATH of the host would replace the
    image's)."""
    from slurmfabric.rank.env import MARKER, MARKER_JOB, RankEnv

    program, launcher = config.program, config.launcher
    job_level = RankEnv(scope="job", job_id="0", master_host="h", master_addr="a",
                        master_port=1, rdzv_id="r", nnodes=1).variables()
    names = {*program.env, *program.env_expand, *program.params, *nccl_exports(config),
             *job_level, MARKER, MARKER_JOB, "SLURMFABRIC_FABRIC_TYPE",
             "SLURMFABRIC_PORT_RANGE", "SLURMFABRIC_CONTAINER_ENV"}
    if launcher.rendezvous.port:
        names.add("SLURMFABRIC_PORT")
    if launcher.resume.enabled:
        names.update(("SLURMFABRIC_CHECKPOINT_DIR", "SLURMFABRIC_PROGRESS_DIR"))
    names.update(flight_recorder(config))
    if launcher.type == "torchrun" and "worker_fail" in launcher.resume.events:
        names.add("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    if launcher.type == "torchrun" and launcher.signal:
        names.add("TORCHELASTIC_SIGNALS_TO_HANDLE")
    return sorted(names)


def _array_word(text: str) -> str:
    """q(text), quoted even when plain if it holds a ',': in a bash array an unquoted ','
    reads as a typo for a space (ShellCheck SC2054)."""
    quoted = q(text)
    return f"'{quoted}'" if "," in text and quoted[0] not in "'$" else quoted


def container(config: JobConfig) -> Optional[dict[str, Any]]:
    """The container options every srun step of the job shares (pyxis), or None. Under
    Apptainer/Singularity the steps take no options; ``exec`` is the command every rank
    (and the image check) starts with instead."""
    image = config.program.container_image
    runtime = config.program.container_runtime
    if runtime != "pyxis" and image:
        # apptainer exec (https://apptainer.org/docs/user/main/cli/apptainer_exec.html):
        # --bind src[:dest[:opts]],... as program.container_mounts are written; --nv gives
        # the job's GPUs; the host environment passes in by default.
        binds = ",".join([f":{zipapp.CONTAINER_PATH}:ro", *config.program.container_mounts])
        words = [runtime, "exec"] + (["--nv"] if config.job.gpus_per_node else [])
        exec_words = qargs(words) + ' --bind "$sf_pyz"' + _array_word(binds) + " " + q(image)
        return {"image": Shell(q(image)), "words": Shell(""), "exec": Shell(exec_words),
                "env": Shell(q(",".join(container_env_names(config)))),
                "srun_args": Shell(qargs(config.launcher.srun_args)),
                "pyz": Shell(q(zipapp.CONTAINER_PATH)), "runtime": runtime}
    pyxis, other = split_pyxis_args(config.launcher.srun_args)
    names = [value for option, value in zip(pyxis, [*pyxis[1:], ""])
             if option.startswith("--container-name")
             for value in [option.partition("=")[2] or value]]
    if not image and not names:  # pyxis ignores the other container options then
        return None
    env = ",".join(container_env_names(config))
    words = [_array_word(f"--container-image={image}")] if image else []
    if not names:  # a job-scoped name: imported by the first step, reused by the next
        words.append('--container-name="sf-$SLURM_JOB_ID"')
    mounts = ",".join(config.program.container_mounts)
    words.append('--container-mounts="$sf_pyz"' + _array_word(
        f":{zipapp.CONTAINER_PATH}:ro" + (f",{mounts}" if mounts else "")))
    words.append('--container-env="$SLURMFABRIC_CONTAINER_ENV"')
    words += [_array_word(a) for a in pyxis]
    # the check names the image, or the existing container a name-only job runs in
    return {"image": Shell(q(image or names[0])), "words": Shell(" ".join(words)),
            "env": Shell(q(env)), "runtime": "pyxis",
            "srun_args": Shell(qargs(other)), "pyz": Shell(q(zipapp.CONTAINER_PATH))}


def checkpoint_dir(config: JobConfig) -> str:
    """Where the job's checkpoints live, as the config says (relative: to the workdir)."""
    return config.launcher.resume.checkpoint_dir or f"checkpoints/{config.job.name}"


def supervise_args(config: JobConfig) -> list[str]:
    """``slurmfabric resume supervise`` options for this config (the launch follows ``--``)."""
    resume = config.launcher.resume
    return [
        "--events", ",".join(resume.events), "--max-restarts", str(resume.max_restarts),
        "--signal", resume.signal, "--grace", str(resume.grace_seconds),
        "--mode", resume.mode, "--keep", str(resume.keep), "--launcher", config.launcher.type,
        # the heartbeats' directory is exported above it in the script (resume.sh.j2)
        "--progress-dir", Shell('"$SLURMFABRIC_PROGRESS_DIR"'),
        "--hang-timeout", str(resume.hang_timeout), "--slow-ratio", f"{resume.slow_ratio:g}",
    ]


FLIGHT_RECORDER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                   "TORCH_FR_DUMP_TEMP_FILE")


def flight_recorder_names() -> frozenset[str]:
    """Every name the flight recorder's defaults can reach a rank under: the script's, and
    the old ones ``launch`` adds for torch <= 2.7 (rank/torchnames.py). The import checks
    compare them only where the original set them too."""
    from slurmfabric.rank.torchnames import RENAMED

    return frozenset({*FLIGHT_RECORDER, *(RENAMED[n] for n in FLIGHT_RECORDER if n in RENAMED)})


def flight_recorder(config: JobConfig) -> list[str]:
    """The flight-recorder variables the script sets (``launcher.nccl_flight_recorder``),
    under torch >= 2.8's names (rank/torchnames.py adds the older ones per rank): none for
    nccl-tests (no PyTorch) or when off, and none that the config's own environment names
    under either name (the user's value wins; the submitting environment's wins too, the
    template sets each only when unset)."""
    from slurmfabric.rank.torchnames import RENAMED

    if not config.launcher.nccl_flight_recorder or config.launcher.type == "nccl-tests":
        return []
    program = config.program
    own = {*program.env, *program.env_prepend, *program.env_append, *program.env_expand}
    return [name for name in FLIGHT_RECORDER if name not in own and RENAMED.get(name) not in own]


def per_node_exec(config: JobConfig, workers_per_node: int) -> str:
    """The bash code that execs a per-node launcher (``"${@:2:$1}"``, its ``$1`` words) with
    what slurmfabric supplies on this node, then the rest (its options, the program).
    NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT come from 'slurmfabric launch --mode
    torchrun' in this one-task-per-node step (rank/env.py, node scope). Option names:
    accelerate launch (https://huggingface.co/docs/accelerate/package_reference/cli,
    "accelerate launch": --num_machines, --machine_rank, --main_process_ip,
    --main_process_port, --num_processes, the total), torchrun (torch/distributed/run.py:
    --nnodes, --node_rank, --master_addr, --master_port, --nproc_per_node; a wrapper such
    as 'tune run' passes them on) and deepspeed's --no_ssh mode (deepspeed/launcher/
    runner.py, microsoft/DeepSpeed#5510: each node runs its own launcher with --node_rank;
    the world is the hostfile's entries, whose names it never contacts, so a file of
    NNODES lines "nodeI slots=W" in the step's TMPDIR gives it the shape)."""
    w = workers_per_node
    kind = config.launcher.per_node.kind or "torchrun"
    supplied = {
        "accelerate": ('--num_machines "$NNODES" --machine_rank "$NODE_RANK" '
                       '--main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT" '
                       f'--num_processes "$((NNODES * {w}))"'),
        "torchrun": ('--nnodes "$NNODES" --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" '
                     f'--master_port "$MASTER_PORT" --nproc_per_node {w}'),
        "deepspeed": ('--no_ssh --hostfile "$hosts" --num_nodes "$NNODES" '
                      '--node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" '
                      f'--master_port "$MASTER_PORT" --num_gpus {w}'),
    }[kind]
    hosts = ""
    if kind == "deepspeed":
        hosts = ('hosts="${TMPDIR:-/tmp}/slurmfabric-deepspeed-hosts.$SLURM_JOB_ID.$NODE_RANK" '
                 f'&& for ((i = 0; i < NNODES; i++)); do echo "node$i slots={w}"; done '
                 '> "$hosts" && ')
    return f'{hosts}exec "${{@:2:$1}}" {supplied} "${{@:$1+2}}"'


def _context(config: JobConfig, slurmfabric_bin: Optional[str],
             rerender: Optional[str] = None) -> dict[str, Any]:
    ops = config.launcher.nccl_tests
    job_shape = shape(config)
    the_container = container(config)
    binaries = [f"{op}_perf" if not ops.bin_dir else f"{ops.bin_dir.rstrip('/')}/{op}_perf"
                for op in ops.ops]
    return {
        "config": config,
        "job": config.job,
        "launcher": config.launcher,
        "program": config.program,
        "fabric": config.fabric,
        "sf": node_bin(config, slurmfabric_bin),
        "container": the_container,
        # the ranks' slurmfabric: in a container, the mounted zipapp run by the image's python3
        "sf_rank": Shell(('"${sf_exec[@]}" ' if the_container and "exec" in the_container
                          else "") + "python3 " + q(zipapp.CONTAINER_PATH)) if the_container
        else q(node_bin(config, slurmfabric_bin)),
        "mpirun_binds": any(arg.lstrip("-").startswith("bind-to")
                            for arg in config.launcher.mpirun_args),
        "tasks_per_node": job_shape.tasks_per_node,
        **_layout(config, job_shape.tasks_per_node),
        "workers_per_node": job_shape.workers_per_node,
        "per_node_exec": per_node_exec(config, job_shape.workers_per_node),
        "per_node_opts": Shell(" --no-bind" * config.launcher.bind
                               + usercode.launch_options(config)),
        "port_range": "{}-{}".format(*config.launcher.rendezvous.port_range),
        "nccl_exports": nccl_exports(config),
        "nccl_advice": nccl_advice(config),
        "nccl_tests_binaries": binaries,
        "sbatch_options": sbatch_options(config),
        "component_sbatch_options": component_sbatch_options(config),
        "total_nodes": total_nodes(config),
        "version": __version__,
        "digest": config_digest(config),
        "config_json": config_json(config),
        "rerender": rerender,
        "resume": config.launcher.resume,
        "checkpoint_dir": checkpoint_dir(config),
        "supervise_args": supervise_args(config),
        "flight_recorder": flight_recorder(config),
        **{key: _shell_tree(value) for key, value in usercode.context(config, q).items()},
    }


def _layout(config: JobConfig, tasks_per_node: int) -> dict[str, Shell]:
    """How the launch step names its nodes and tasks.

    A plain job's step carries its own counts (a generator's header may have no
    --ntasks-per-node, and srun would then start one task per node). A heterogeneous job's
    one step spans every component with ``srun --het-group=0-N``, each component with its
    own allocation's layout; there ``$SLURM_NNODES`` is component 0's alone, so the node
    total adds the ``*_HET_GROUP_<n>`` counts (https://slurm.schedmd.com/heterogeneous_jobs.html,
    "Launching Applications" and "Environment Variables"; recorded on Slurm 22.05: the
    step's SLURM_PROCID runs 0..N-1 over both components)."""
    groups = len(config.job.components)
    if not groups:
        return {"step_counts": Shell(f'--nodes="$SLURM_NNODES" '
                                     f"--ntasks-per-node={tasks_per_node}"),
                "agent_counts": Shell('--nodes="$SLURM_NNODES" --ntasks-per-node=1'),
                "nnodes_total": Shell('"$SLURM_NNODES"'),
                "check_counts": [Shell('--nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" '
                                       "--ntasks-per-node=1")]}
    het = Shell(f"--het-group=0-{groups}")
    counts = [f"SLURM_JOB_NUM_NODES_HET_GROUP_{n}" for n in range(groups + 1)]
    return {"step_counts": het, "agent_counts": het,
            "nnodes_total": Shell('"$((' + " + ".join(counts) + '))"'),
            "check_counts": [Shell(f'--het-group={n} --nodes="${c}" --ntasks="${c}" '
                                   "--ntasks-per-node=1") for n, c in enumerate(counts)]}


def _shell_tree(value: Any) -> Any:
    """usercode.context's text (already quoted, or verbatim code) as Shell, in lists too."""
    if isinstance(value, str):
        return Shell(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_shell_tree(item) for item in value)
    return value


def _render(name: str, config: JobConfig, slurmfabric_bin: Optional[str] = None,
            rerender: Optional[str] = None) -> str:
    template = environment().get_template(name)
    # Jinja drops the newline after an include; a script must end with one.
    return template.render(**_context(config, slurmfabric_bin, rerender)).rstrip("\n") + "\n"


def render_sbatch(config: JobConfig, *, slurmfabric_bin: Optional[str] = None,
                  rerender: Optional[str] = None) -> str:
    """The whole sbatch script. ``rerender`` is the command shown in the header. The code
    fields are shellchecked first (job/usercode.py): an error raises ConfigError."""
    usercode.check_code(config)
    return _render("sbatch.sh.j2", config, slurmfabric_bin, rerender)


def render_sbatch_header(config: JobConfig) -> str:
    """Only the ``#SBATCH`` lines (the modelled options sorted, then ``job.extra_sbatch``),
    for a generator that writes the rest of the script itself."""
    return _render("sbatch_lines.sh.j2", config)


def render_env_block(config: JobConfig, *, slurmfabric_bin: Optional[str] = None) -> str:
    """Only the environment block: modules, user and NCCL exports, job-level rank env. It
    leaves the host script's shell options as it found them and stops the script itself
    (``exit``) when slurmfabric is missing, with or without ``set -e``."""
    return _render("env.sh.j2", config, slurmfabric_bin)


def render_launch(config: JobConfig, *, slurmfabric_bin: Optional[str] = None) -> str:
    """Only the launch command(s) for the config's launcher (one line per step). Each step
    names its own node and task counts, so it starts the config's ranks under any
    ``#SBATCH`` header that allocates enough (it needs the env block before it); with the
    program.task_setup it passes on (shellchecked, as in the whole script). A heterogeneous
    job's step (``srun --het-group``) takes each component's layout from the allocation, so
    it needs the components' ``#SBATCH`` lines (render_sbatch_header)."""
    usercode.check_code(config)
    return _render(f"launch/{config.launcher.type}.sh.j2", config, slurmfabric_bin)


RERENDER_MARKER = "# Re-render: "


def rerender_from_script(text: str) -> Optional[str]:
    """The ``# Re-render:`` command a rendered script carries, or None."""
    for line in text.splitlines():
        if line.startswith(RERENDER_MARKER):
            return line[len(RERENDER_MARKER):]
        if line.startswith(CONFIG_MARKER):
            return None
    return None


def config_from_script(text: str) -> JobConfig:
    """The config a rendered script embeds (its ``# slurmfabric-config:`` line)."""
    from pydantic import ValidationError

    from slurmfabric.config.loader import format_errors

    for line in text.splitlines():
        if line.startswith(CONFIG_MARKER):
            try:
                return JobConfig.model_validate(json.loads(line[len(CONFIG_MARKER):]))
            except json.JSONDecodeError as exc:
                raise ConfigError([f"the script's config line is not valid JSON: {exc}"]) \
                    from None
            except ValidationError as exc:
                raise ConfigError(format_errors(exc)) from None
    raise ConfigError(["script has no '# slurmfabric-config:' line; was it rendered by "
                       "slurmfabric?"])
