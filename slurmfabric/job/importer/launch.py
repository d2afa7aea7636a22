"""The launch line -> ``[launcher]`` and ``program.command``.

Reads the launchers' own option syntax: srun(1) "OPTIONS", torchrun (``torch.distributed.run``,
"torchrun (Elastic Launch)" in the PyTorch docs) and Open MPI mpirun(1). Values slurmfabric
derives at run time (node and task counts, rendezvous endpoint and id, ``-np``) are dropped
and reported as such; options it has a field for become that field; the rest are kept as
launcher arguments (data).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from slurmfabric.job.importer.expand import ARGS, Field
from slurmfabric.job.launcher_options import (
    MPIRUN_VALUE,
    SRUN_SHORT_VALUE,
    SRUN_VALUE,
    TORCHRUN_VALUE,
)

Notify = Callable[[int, str, str, str], None]

TORCHRUN_DERIVED = frozenset({
    "nnodes", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "node-rank",
    "master-addr", "master-port", "standalone", "local-addr",
})
MPIRUN_DERIVED = frozenset({"np", "n", "c", "H", "host", "hostfile", "machinefile"})
# Set by slurmfabric for every rank: never imported as env.
DERIVED_ENV = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
})
_PYTHON = re.compile(r"(.*/)?python[0-9.]*\Z")
LAUNCHERS = frozenset({"srun", "mpirun", "mpiexec", "orterun", "prterun", "torchrun"})


@dataclass
class Launch:
    launcher: dict[str, Any] = field(default_factory=dict)
    program: dict[str, Any] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)
    env: list[tuple[str, Field]] = field(default_factory=list)  # leading NAME=VALUE, -x
    defaults: dict[str, str] = field(default_factory=dict)
    inner: Optional[tuple[Field, list[str]]] = None  # bash -c CODE [ARGS]: read CODE next
    params: list[str] = field(default_factory=list)  # ${NAME} parameters the command uses


def base(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def is_launch(words: list[str]) -> bool:
    """A launch line: its first command word is srun, mpirun or torchrun, or python runs
    torch.distributed.run."""
    rest = [w for w in words if not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", w)]
    rest = rest[1:] if rest[:1] == ["exec"] else rest
    return bool(rest) and (base(rest[0]) in LAUNCHERS or _torchrun_module(rest) is not None)


def _torchrun_module(words: list[str]) -> Optional[int]:
    """Index after ``python [flags] -m torch.distributed.run``, else None."""
    if not words or not _PYTHON.match(words[0]):
        return None
    i = 1
    while i < len(words) and words[i].startswith("-") and words[i] != "-m":
        i += 2 if words[i] in ("-X", "-W") else 1
    if words[i:i + 2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
        return i + 2
    return None


def _option(fields: list[Field], i: int,
            takes: Callable[[str], bool]) -> tuple[str, Optional[Field], int]:
    """The option at ``fields[i]``: its name (no dashes, '_' as '-'), value, next index."""
    word = fields[i].text
    name, eq, value = word.lstrip("-").partition("=")
    name = name.replace("_", "-")
    if eq:
        return name, Field(value, fields[i].runtime, fields[i].params, fields[i].fixed), i + 1
    if takes(name) and i + 1 < len(fields):
        return name, fields[i + 1], i + 2
    return name, None, i + 1


def data(value: Field, defaults: dict[str, str]) -> Field:
    """A launcher option's value is data: a parameter in it takes its default (reported)."""
    if not value.params:
        return value
    text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                  lambda m: defaults.get(m.group(1), m.group(0)), value.text)
    return Field(text, value.runtime, frozenset(), value.fixed + tuple(sorted(value.params)))


def map_launch(fields: list[Field], line: int, job: dict[str, Any], notify: Notify,
               defaults: dict[str, str]) -> Launch:
    """Launcher, program and env from the launch line's expanded words (``defaults``: the
    named parameters' defaults, for values that are data)."""
    out = Launch(defaults=defaults)
    map_program(out, fields, line, job, notify)
    return out


def map_program(out: Launch, fields: list[Field], line: int, job: dict[str, Any],
                notify: Notify) -> None:
    """The words from the first command word on (leading ``NAME=VALUE`` go to env)."""
    i = 0
    while i < len(fields) and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", fields[i].text):
        name, _, value = fields[i].text.partition("=")
        out.env.append((name, Field(value, fields[i].runtime, fields[i].params,
                                    fields[i].fixed)))
        i += 1
    if i < len(fields) and fields[i].text == "exec":
        i += 1
    words = fields[i:]
    if words and base(words[0].text) == "srun" and "type" not in out.launcher:
        words = _srun(words[1:], line, out, job, notify)
    _program(words, line, out, job, notify)


def map_step(fields: list[Field], line: int, notify: Notify,
             defaults: dict[str, str]) -> Optional[dict[str, Any]]:
    """An srun line that is not the launch -> one ``[[steps]]`` table, or None when its
    options are not all known."""
    step: dict[str, Any] = {}
    args: list[str] = []
    i = 0
    while i < len(fields) and fields[i].text.startswith("-"):
        f = fields[i]
        if f.text.startswith("--"):
            name, value, i = _option(fields, i, lambda n: n in SRUN_VALUE)
        else:
            name = SRUN_SHORT_VALUE.get(f.text[1:2], f.text[1:2])
            rest = f.text[2:].removeprefix("=")
            if f.text[1:2] in SRUN_SHORT_VALUE:
                value = Field(rest, f.runtime) if rest else (
                    fields[i + 1] if i + 1 < len(fields) else None)
                i += 1 if rest else 2
            else:
                value, i = None, i + 1
        value = None if value is None else data(value, defaults)
        if value is not None and value.runtime:
            return None
        text = None if value is None else value.text
        if name == "nodes" and text and text.isdigit():
            step["nodes"] = int(text)
        elif name == "ntasks-per-node" and text and text.isdigit():
            step["ntasks_per_node"] = int(text)
        elif name == "ntasks" and text and text.isdigit() and step.get("nodes") \
                and int(text) % step["nodes"] == 0:
            step["ntasks_per_node"] = int(text) // step["nodes"]
        elif name == "container-image" and text:
            step["container_image"] = text
        else:
            args.append(f.text if value is None or "=" in f.text or not f.text.startswith("--")
                        and f.text[2:] else f"{f.text}={text}" if f.text.startswith("--")
                        else f"{f.text}{text}")
    command = [f.text for f in fields[i:]]
    if not command or any(not f.static for f in fields[i:]):
        return None
    step["command"] = command
    if args:
        step["srun_args"] = args
    return step


def _srun(fields: list[Field], line: int, out: Launch, job: dict[str, Any],
          notify: Notify) -> list[Field]:
    out.launcher["type"] = "srun"
    args: list[str] = []
    i = 0
    while i < len(fields) and (fields[i].text.startswith("-") or (
            _looks_option(fields[i]) and i + 1 < len(fields))):
        f = fields[i]
        if f.runtime and not f.text.startswith("-"):
            notify(line, "unmapped", f.text, "an srun option set at run time; not mapped")
            i += 1
            continue
        if f.text.startswith("--"):
            name, value, i = _option(fields, i, lambda n: n in SRUN_VALUE)
        else:
            short = f.text[1:2]
            name = SRUN_SHORT_VALUE.get(short, short)
            if short in SRUN_SHORT_VALUE:
                rest = f.text[2:].removeprefix("=")
                value = Field(rest, f.runtime) if rest else (fields[i + 1] if i + 1 < len(fields)
                                                            else None)
                i += 1 if rest else 2
            else:
                value, i = None, i + 1
        _srun_option(name, value, f.text, line, out, job, args, notify)
    if args:
        out.launcher["srun_args"] = args
    return fields[i:]


def _looks_option(f: Field) -> bool:
    """An unknown word before the program that stands for options (``${AUTO_RESUME}``)."""
    return f.runtime == (f.text,) and f.text.startswith("$") and "/" not in f.text


def _srun_option(name: str, value: Optional[Field], raw: str, line: int, out: Launch,
                 job: dict[str, Any], args: list[str], notify: Notify) -> None:
    value = None if value is None else data(value, out.defaults)
    text = None if value is None else value.text
    if value is not None and value.runtime and name not in ("nodes", "ntasks", "jobid",
                                                             "ntasks-per-node"):
        notify(line, "unmapped", f"--{name}={text}", "value known only at run time; not mapped")
        return
    if value is not None and value.fixed:
        notify(line, "fixed", f"--{name}", f"uses the default of {', '.join(value.fixed)}")
    if name == "container-image":
        out.program["container_image"] = text
        notify(line, "mapped", f"--{name}", "program.container_image")
    elif name == "container-mounts" and text:
        out.program["container_mounts"] = text.split(",")
        notify(line, "mapped", f"--{name}", "program.container_mounts")
    elif name == "mpi" and text and text.startswith("pmix"):
        out.launcher["type"] = "srun-pmix"
        notify(line, "mapped", f"--mpi={text}", 'launcher.type = "srun-pmix"')
    elif name in ("kill-on-bad-exit", "K") and text in (None, "1"):
        notify(line, "dropped", raw, "slurmfabric's srun steps always kill the step on a bad exit")
    elif name in ("nodes", "ntasks", "ntasks-per-node", "N", "n"):
        notify(line, "derived", f"--{name}", "slurmfabric sets the step's node and task counts "
               "from the job request")
    elif name == "jobid":
        notify(line, "dropped", f"--jobid {text}", "the step runs in its own job")
    elif name == "export" and text and text.upper() == "ALL":
        notify(line, "dropped", raw, "srun exports the environment by default")
    elif name == "cpus-per-task" and text and text.isdigit():
        job.setdefault("cpus_per_task", int(text))
        notify(line, "mapped", raw, "job.cpus_per_task")
    elif name == "cpu-bind" and text == "none":
        out.launcher["bind"] = False
        notify(line, "mapped", raw, "launcher.bind = false")
    else:
        word = raw if value is None else f"--{name}={text}" if raw.startswith("--") \
            else f"{raw}" if raw[2:] else f"{raw}{text}"
        args.append(word)
        notify(line, "mapped", word, "launcher.srun_args")


def _program(words: list[Field], line: int, out: Launch, job: dict[str, Any],
             notify: Notify) -> None:
    texts = [w.text for w in words]
    if texts[:2] in (["bash", "-c"], ["sh", "-c"]) and len(words) >= 3:
        out.inner = (words[2], texts[3:])
        return
    if texts and base(texts[0]) in ("apptainer", "singularity") and texts[1:2] == ["exec"] \
            and "container_image" not in out.program:
        words = _apptainer(words, line, out, job, notify)
        texts = [w.text for w in words]
    kind = _per_node_kind(texts)
    if kind is not None:
        _per_node(words, kind, line, out, job, notify)
        return
    named = _unsupported(texts)
    if named:
        notify(line, "unmapped", " ".join(texts[:3]), named)
    module_at = _torchrun_module(texts)
    if texts and (base(texts[0]) == "torchrun" or module_at is not None):
        _torchrun(words, module_at, line, out, job, notify)
        return
    if texts and base(texts[0]) in ("mpirun", "mpiexec", "orterun", "prterun"):
        _mpirun(words, line, out, job, notify)
        return
    if len(words) == 1 and words[0].runtime == (words[0].text,):
        notify(line, "unmapped", words[0].text, "the launched command is built at run time; "
               "not mapped (program.command is empty)")
        out.program["command"] = []
        return
    if "type" not in out.launcher:
        out.launcher["type"] = "srun"
        notify(line, "unmapped", texts[0] if texts else "", "runs on the batch node only; "
               "slurmfabric runs it as an srun step on every node")
    _command(words, line, out, notify)


# apptainer exec options that take a value (https://apptainer.org/docs/user/main/cli/
# apptainer_exec.html); the others are flags.
_APPTAINER_VALUE = frozenset({
    "bind", "B", "env", "env-file", "pwd", "home", "H", "overlay", "o", "workdir", "W",
    "mount", "security", "app", "network", "network-args", "scratch", "S", "no-mount", "dns",
    "hostname", "add-caps", "drop-caps", "apply-cgroups",
})


def _apptainer(words: list[Field], line: int, out: Launch, job: dict[str, Any],
               notify: Notify) -> list[Field]:
    """``apptainer|singularity exec [OPTIONS] IMAGE PROGRAM...`` -> program.container_runtime,
    container_image and container_mounts (``--bind``); the program's words are returned.
    ``--nv`` is what slurmfabric adds for a GPU job; any other option is named."""
    runtime = base(words[0].text)
    i = 2
    mounts: list[str] = []
    while i < len(words) and words[i].text.startswith("-"):
        name, eq, attached = words[i].text.lstrip("-").partition("=")
        takes = not eq and name in _APPTAINER_VALUE and i + 1 < len(words)
        value = Field(attached, words[i].runtime) if eq else words[i + 1] if takes else None
        raw = " ".join(w.text for w in words[i:i + 1 + takes])
        i += 1 + takes
        if name in ("bind", "B") and value is not None and value.static:
            mounts += value.text.split(",")
            notify(line, "mapped", raw, "program.container_mounts")
        elif name == "nv" and job.get("gpus_per_node"):
            notify(line, "dropped", raw, "slurmfabric passes --nv for a job with GPUs")
        else:
            notify(line, "unmapped", raw, f"a {runtime} exec option slurmfabric does not pass "
                   "(it passes --bind and, for a GPU job, --nv); not mapped")
    if i >= len(words):
        notify(line, "unmapped", runtime, f"{runtime} exec without an image; not mapped")
        return words[i:]
    image = words[i]
    if not image.static:
        notify(line, "unmapped", image.text, "the image is known only at run time; not mapped")
    out.program["container_runtime"] = runtime
    out.program["container_image"] = image.text
    if mounts:
        out.program["container_mounts"] = mounts
    notify(line, "mapped", f"{runtime} exec {image.text}", "program.container_runtime, "
           "program.container_image")
    return words[i + 1:]


# accelerate launch's options that take no value (https://huggingface.co/docs/accelerate/
# package_reference/cli, "accelerate launch"); every other option takes one.
ACCELERATE_FLAGS = frozenset({
    "cpu", "multi_gpu", "tpu", "ipex", "mps", "use_xpu", "use_deepspeed", "use_fsdp",
    "use_megatron_lm", "m", "module", "no_python", "debug", "q", "quiet", "same_network",
    "enable_cpu_affinity", "downcast_bf16", "tpu_use_cluster", "tpu_use_sudo",
    "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation",
    "fsdp_use_orig_params", "fsdp_sync_module_states", "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params", "fsdp_activation_checkpointing", "zero3_init_flag",
    "zero3_save_16bit_model", "deepspeed_moe_layer_cls_names", "use_parallelism_config",
})
# What slurmfabric supplies to a per-node launcher (job/render.py per_node_exec).
ACCELERATE_DERIVED = frozenset({"num_machines", "machine_rank", "main_process_ip",
                                "main_process_port", "num_processes", "rdzv_backend"})
# deepspeed's runner (deepspeed/launcher/runner.py parse_args): its options that take no
# value, and what slurmfabric supplies in its --no_ssh mode or makes moot (ssh, pdsh/MPI
# launcher choice, hosts). --include/--exclude name hosts and GPUs of the hostfile: not
# mapped, since slurmfabric's hostfile is the allocation.
DEEPSPEED_FLAGS = frozenset({
    "module", "no_python", "no_local_rank", "no_ssh_check", "force_multi", "save_pid",
    "elastic_training", "bind_cores_to_rank", "no_ssh"})
DEEPSPEED_DERIVED = frozenset({
    "H", "hostfile", "num_nodes", "num_gpus", "num_accelerators", "node_rank", "master_addr",
    "master_port", "no_ssh", "no_ssh_check", "force_multi", "launcher", "launcher_args",
    "ssh_port"})


def _per_node_kind(texts: list[str]) -> Optional[tuple[str, int]]:
    """``accelerate launch`` (kind accelerate), ``deepspeed`` or ``tune run`` (a torchrun
    wrapper): the kind and how many words the launcher itself is."""
    first = base(texts[0]) if texts else ""
    if first == "accelerate" and texts[1:2] == ["launch"]:
        return "accelerate", 2
    if first == "deepspeed":
        return "deepspeed", 1
    if first == "tune" and texts[1:2] == ["run"]:
        return "torchrun", 2
    return None


def _per_node(words: list[Field], kind: tuple[str, int], line: int, out: Launch,
              job: dict[str, Any], notify: Notify) -> None:
    """A launcher that runs once per node -> ``launcher.type = "torchrun"`` with
    ``[launcher.per_node]``: what slurmfabric supplies (node count and rank, rendezvous,
    process counts) is dropped, the launcher's other options are kept as data."""
    name, size = kind
    if out.launcher.get("type") not in (None, "srun"):
        notify(line, "unmapped", words[0].text, f"{words[0].text} under srun --mpi; not mapped")
    out.launcher["type"] = "torchrun"
    per_node: dict[str, Any] = {"kind": name}
    launcher_words = [w.text for w in words[:size]]
    per_node["command"] = launcher_words
    notify(line, "mapped", " ".join(launcher_words), f"launcher.per_node (kind = {name!r}: "
           "one per node, slurmfabric supplies the node rank and the rendezvous)")
    flags = {"accelerate": ACCELERATE_FLAGS, "deepspeed": DEEPSPEED_FLAGS}.get(name)
    derived = {"accelerate": ACCELERATE_DERIVED, "deepspeed": DEEPSPEED_DERIVED}.get(name) or {
        n.replace("-", "_") for n in TORCHRUN_DERIVED | {"nproc-per-node"}}
    args: list[str] = []
    i = size
    while i < len(words) and words[i].text.startswith("-"):
        start = i
        if flags is not None:
            key, eq, attached = words[i].text.lstrip("-").partition("=")
            takes = not eq and key not in flags and i + 1 < len(words)
            value = Field(attached) if eq else words[i + 1] if takes else None
            i += 2 if takes else 1
        else:
            key, value, i = _option(words, i, lambda n: n in TORCHRUN_VALUE)
        key = key.replace("-", "_")
        raw = " ".join(w.text for w in words[start:i])
        value = None if value is None else data(value, out.defaults)
        if name == "deepspeed" and key in ("include", "exclude", "i", "e"):
            notify(line, "unmapped", raw, "names hosts and GPUs of the script's hostfile; "
                   "slurmfabric's hostfile is the allocation (not mapped)")
            continue
        if key in derived:
            notify(line, "derived", raw, "slurmfabric supplies it on every node")
            if key in ("num_processes", "nproc_per_node", "num_gpus") and value is not None \
                    and value.text.isdigit() and not job.get("gpus_per_node"):
                per = int(value.text) // (job.get("nodes", 1) if key == "num_processes" else 1)
                out.launcher["nproc_per_node"] = max(per, 1)
            continue
        if value is not None and not value.static:
            notify(line, "unmapped", raw, f"a {name} option known only at run time; not mapped")
            continue
        args += [words[start].text] if value is None or i == start + 1 \
            else [words[start].text, value.text]
        notify(line, "mapped", raw, "launcher.per_node.args")
    if args:
        per_node["args"] = args
    out.launcher["per_node"] = per_node
    _command(words[i:], line, out, notify)



_RUNTIMES = {"singularity": "Apptainer/Singularity (other than 'exec')",
             "apptainer": "Apptainer/Singularity (other than 'exec')", "shifter": "Shifter",
             "podman": "Podman", "docker": "Docker",
             "enroot": "enroot (without pyxis)", "charliecloud": "Charliecloud",
             "ch-run": "Charliecloud"}


def _unsupported(texts: list[str]) -> Optional[str]:
    """Why the program's first words are a form slurmfabric does not express yet, by
    name: a container runtime it has no form for. None when it is not one."""
    first = base(texts[0]) if texts else ""
    if first in _RUNTIMES:
        return (f"{_RUNTIMES[first]} container: slurmfabric's config expresses pyxis "
                "containers only (program.container_image); the image, binds and options "
                "are kept as plain command words (not mapped)")
    return None


def _torchrun(words: list[Field], module_at: Optional[int], line: int, out: Launch,
              job: dict[str, Any], notify: Notify) -> None:
    if out.launcher.get("type") not in (None, "srun"):
        notify(line, "unmapped", "torchrun", "torchrun under srun --mpi; not mapped")
    out.launcher["type"] = "torchrun"
    if module_at is None:
        runner = words[0].text
        python = runner[: -len("torchrun")] + "python" if "/" in runner else "python"
        if runner != "torchrun":
            out.launcher["torchrun"] = runner
        i = 1
    else:
        python = words[0].text
        out.launcher["torchrun"] = [w.text for w in words[:module_at]]
        i = module_at
    notify(line, "mapped", " ".join(w.text for w in words[:i]), "launcher.torchrun")
    targs: list[str] = []
    module = no_python = False
    while i < len(words) and words[i].text.startswith("-"):
        text = words[i].text
        if text in ("-m", "--module"):
            module, i = True, i + 1
            continue
        if text in ("--no-python", "--no_python"):
            no_python, i = True, i + 1
            continue
        name, value, nxt = _option(words, i, lambda n: n in TORCHRUN_VALUE)
        raw = " ".join(w.text for w in words[i:nxt])
        i = nxt
        value = None if value is None else data(value, out.defaults)
        vtext = None if value is None else value.text
        if name == "nproc-per-node":
            if vtext and vtext.isdigit():
                out.launcher["nproc_per_node"] = int(vtext)
                notify(line, "mapped", raw, "launcher.nproc_per_node")
            else:
                notify(line, "derived", raw, "workers per node: job.gpus_per_node")
        elif name == "nnodes":
            nodes = job.get("nodes", 1)
            why = "the allocation's node count"
            if vtext and vtext.isdigit() and int(vtext) != nodes:
                why += f" (the script fixes {vtext}, its request says {nodes})"
            notify(line, "derived", raw, why)
        elif name in TORCHRUN_DERIVED:
            notify(line, "derived", raw, "rendezvous and node rank")
        elif value is not None and not value.static:
            notify(line, "unmapped", raw, "a torchrun option known only at run time; not mapped")
        else:
            targs += [text] if value is None or "=" in text else [text, vtext or ""]
            notify(line, "mapped", raw, "launcher.torchrun_args")
    if targs:
        out.launcher["torchrun_args"] = targs
    rest = words[i:]
    if no_python:
        _command(rest, line, out, notify)
        return
    prefix = [Field(python), Field("-u")] + ([Field("-m")] if module else [])
    _command(prefix + rest, line, out, notify)
    notify(line, "mapped", rest[0].text if rest else "", f"program.command (torchrun runs "
           f"{'modules' if module else 'scripts'} as {python} -u{' -m' if module else ''})")


def _mpirun(words: list[Field], line: int, out: Launch, job: dict[str, Any],
            notify: Notify) -> None:
    out.launcher["type"] = "mpirun"
    if words[0].text != "mpirun":
        out.launcher["mpirun"] = words[0].text
    margs: list[str] = []
    i = 1
    while i < len(words) and words[i].text.startswith("-"):
        text = words[i].text
        name = text.lstrip("-")
        if name in MPIRUN_VALUE and "=" not in name and i + 1 < len(words):
            value: Optional[Field] = words[i + 1]
            nxt = i + 2
        else:
            value, nxt = None, i + 1
        if name == "mca" or name == "gmca":
            value = Field(f"{words[i + 1].text} {words[i + 2].text}") if i + 2 < len(words) \
                else None
            nxt = i + 3
        raw = " ".join(w.text for w in words[i:nxt])
        i = nxt
        value = None if value is None else data(value, out.defaults)
        vtext = None if value is None else value.text
        if name in MPIRUN_DERIVED:
            notify(line, "derived", raw, "slurmfabric takes -np and the hosts from the allocation")
        elif name in ("N", "npernode") or (name == "map-by" and vtext
                                           and re.fullmatch(r"ppr:[0-9]+:node", vtext)):
            per = int(re.sub(r"\D", "", vtext.split(":")[1] if ":" in vtext else vtext)) \
                if vtext else 0
            job.setdefault("ntasks_per_node", per)
            notify(line, "mapped", raw, "job.ntasks_per_node (slurmfabric maps ranks per node)")
        elif name == "x" and vtext:
            env_name, eq, env_value = vtext.partition("=")
            if eq:
                out.env.append((env_name, Field(env_value, value.runtime, value.params,
                                                value.fixed)))
            else:
                notify(line, "dropped", raw, "the ranks inherit the batch environment")
        elif value is not None and not value.static:
            notify(line, "unmapped", raw, "an mpirun option known only at run time; not mapped")
        else:
            margs += raw.split(" ") if name in ("mca", "gmca") else (
                [text] if value is None else [text, vtext or ""])
            notify(line, "mapped", raw, "launcher.mpirun_args")
    if margs:
        out.launcher["mpirun_args"] = margs
    _command(words[i:], line, out, notify)


def _command(words: list[Field], line: int, out: Launch, notify: Notify) -> None:
    """program.command: ``"$@"`` at the end becomes program.pass_args; ``${NAME}`` of a
    parameter stays; any other run-time piece is reported."""
    command: list[str] = []
    params: set[str] = set()
    for index, w in enumerate(words):
        if ARGS in w.text and (w.text != ARGS or not w.runtime):
            notify(line, "unmapped", '"$@"', "the script's arguments inside a word; not mapped")
            continue
        if w.text == ARGS:
            if index == len(words) - 1:
                out.program["pass_args"] = True
                notify(line, "mapped", w.runtime[0], "program.pass_args = true")
            else:
                notify(line, "unmapped", w.runtime[0], "the script's arguments in the middle "
                       "of the command; not mapped")
            continue
        if w.runtime:
            notify(line, "unmapped", w.text, "known only at run time; kept as literal text")
        if w.fixed:
            notify(line, "fixed", w.text, f"uses the default of {', '.join(w.fixed)}")
        params |= w.params
        command.append(w.text)
    out.program["command"] = command
    if params:
        out.params = sorted(params)
