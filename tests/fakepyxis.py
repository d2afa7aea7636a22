#!/usr/bin/env -S python3 -I -B
"""A stand-in for pyxis/enroot on the testbed: an ``srun`` wrapper that runs each task of a
step with container options inside bubblewrap (bwrap(1), Debian package ``bubblewrap``).

pyxis is a SPANK plugin built against the site's Slurm and needs enroot; neither can be
installed from Debian's packages, so the cluster tests put a directory holding this file as
``srun`` ahead of the real srun on PATH. It applies the pyxis options the way pyxis
documents them (https://github.com/NVIDIA/pyxis/wiki/Usage, the ``srun --help`` text of
pyxis args.c) and nothing else:

* ``--container-image=PATH``: an image directory (an unpacked rootfs, see ``build_image``);
  pyxis takes a registry reference or a squashfs file, which this stand-in refuses.
* ``--container-name=NAME[:auto|create|exec|no_exec]``: "Unnamed containers are removed
  after the slurm task is complete; named containers are not. If a container with this
  name already exists, the existing container is used and the import is skipped." One
  container per node and step (pyxis: the first task of a node creates it); the rootfs of a
  named one is kept under ``$FAKEPYXIS_STATE/<node>/pyxis_<NAME>`` (pyxis's default
  container_scope=global name) and reused, with what earlier steps wrote in it. Every
  import is one line in ``$FAKEPYXIS_STATE/imports.log``. Unnamed containers are left in
  the state directory (a wrapper cannot tell when the step ends); the test's tmp_path goes.
* ``--container-mounts=SRC[:DST[:FLAGS]],...``: bind mounts; FLAGS ``ro`` read-only.
* ``--container-workdir=PATH``: the task's directory; without it the host's current
  directory, which must exist in the container (pyxis chdirs to the task's cwd).
* ``--container-env=NAME,...``: pyxis: "By default, all exported host environment variables
  are set in the container ..., but their existing values in the image take precedence;
  the variables specified with this flag are preserved from the host". The image's values
  come from the rootfs's ``/etc/environment``, where enroot writes the image's ENV (enroot
  src/docker.sh ``docker::configure``, doc/image-format.md); a name given here but unset
  on the host keeps the image's value (pyxis tests/env.bats). LANG, LANGUAGE and LC_ALL are
  dropped unless named (pyxis_slurmstepd.c ``container_deny_env``).

The container shares the host's network (as enroot does) and gets /proc, /dev, /sys, a
tmpfs /tmp and the host's /etc/hosts, /etc/passwd and /etc/group (enroot
conf/mounts/10-system.fstab and 20-config.fstab, hooks/10-shadow.sh). Other pyxis flags
(--container-mount-home, --container-remap-root, ...) are accepted and ignored;
--container-save and --container-unshare are refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
IGNORED_FLAGS = ("container-mount-home", "no-container-mount-home", "container-remap-root",
                 "no-container-remap-root", "container-entrypoint", "no-container-entrypoint",
                 "container-entrypoint-log", "container-writable", "container-readonly")
DENIED_ENV = ("LANG", "LANGUAGE", "LC_ALL")
HOST_DIRS = ("usr",)  # read-only from the host's Debian; bin, lib, sbin link into it
HOST_FILES = ("/etc/hosts", "/etc/passwd", "/etc/group", "/etc/hostname", "/etc/resolv.conf")


def fail(message: str) -> None:
    print(f"fakepyxis: error: {message}", file=sys.stderr)
    raise SystemExit(1)


def build_image(path: Path, env: dict[str, str]) -> Path:
    """An image rootfs that costs nothing to build: the host's /usr (so Debian's
    /usr/bin/python3, and no slurmfabric) mounted read-only at run time, links for
    /bin, /lib, /lib64 and /sbin as Debian's merged /usr has them, and an /etc/environment
    with the image's ENV, one NAME=VALUE a line, as enroot writes it."""
    for name in ("etc", "usr", "proc", "dev", "sys", "tmp", "opt", "root", "home", "var/tmp"):
        (path / name).mkdir(parents=True, exist_ok=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        if Path("/", name).is_symlink() or Path("/usr", name).is_dir():
            link = path / name
            if not link.is_symlink():
                link.symlink_to(f"usr/{name}")
    (path / "etc" / "environment").write_text(
        "".join(f"{k}={v}\n" for k, v in env.items()), encoding="utf-8")
    return path


# --- the srun side: split off the container options, run the real srun ---------------------


def split(argv: list[str]) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """(srun options, container options by name, the command)."""
    from slurmfabric.job.launcher_options import SRUN_SHORT_VALUE, SRUN_VALUE

    srun: list[str] = []
    pyxis: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "--":
            return srun, pyxis, argv[i + (arg == "--"):]
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name.startswith(("container-", "no-container-")):
            if name in IGNORED_FLAGS:
                i += 1
                continue
            if not eq:
                value, i = argv[i + 1], i + 1
            pyxis.setdefault(name, []).append(value)
        else:
            srun.append(arg)
            takes = (name in SRUN_VALUE and not eq) or (
                not arg.startswith("--") and len(arg) == 2 and arg[1] in SRUN_SHORT_VALUE)
            if takes and i + 1 < len(argv):
                srun.append(argv[i + 1])
                i += 1
        i += 1
    return srun, pyxis, []


def real_srun() -> str:
    me = os.path.realpath(__file__)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, "srun")
        if directory and os.access(candidate, os.X_OK) and os.path.realpath(candidate) != me:
            return candidate
    fail("no real srun on PATH after this wrapper")
    return ""


def srun_main(argv: list[str]) -> None:
    srun, pyxis, command = split(argv)
    for name in ("container-save", "container-unshare"):
        if name in pyxis:
            fail(f"--{name} is not supported by this stand-in")
    if "container-image" not in pyxis and "container-name" not in pyxis:
        os.execv(real_srun(), [real_srun(), *argv])  # pyxis ignores the other options then
    spec = {key: values[-1] if key in ("container-image", "container-name",
                                       "container-workdir") else values
            for key, values in pyxis.items()}
    task = [sys.executable, "-I", "-B", str(Path(__file__).resolve()), "--task", json.dumps(spec),
            "--", *command]
    os.execv(real_srun(), [real_srun(), *srun, *task])


# --- the task side: the container of this node, then bwrap -----------------------------------


def container_dir(spec: dict, state: Path, node: str) -> Path:
    """This node's container for the step: the named one (created or reused) or the step's."""
    name, _, flags = (spec.get("container-name") or "").partition(":")
    job, step = os.environ.get("SLURM_JOB_ID", "0"), os.environ.get("SLURM_STEP_ID", "0")
    key = f"pyxis_{name}" if name else f"pyxis_{job}.{step}"
    root = state / node / key
    image = spec.get("container-image")
    (state / node).mkdir(parents=True, exist_ok=True)
    with open(state / node / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the node's first task creates it, the rest wait
        done = root / ".fakepyxis-step"
        this_step = f"{job}.{step}"
        if root.is_dir():
            if name and flags == "create" and done.read_text() != this_step:
                fail('"create" flag was passed to --container-name but the container '
                     "already exists")
            return root
        if flags == "exec":
            fail('"exec" flag was passed to --container-name but the container is not running')
        if not image:
            fail(f'a container with name "{key}" does not exist, and --container-image is '
                 "not set")
        if not Path(image).is_dir():
            fail(f"--container-image {image!r}: this stand-in takes an image directory "
                 "(tests/fakepyxis.py build_image)")
        tmp = root.with_name(root.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(image, tmp, symlinks=True)
        (tmp / ".fakepyxis-step").write_text(this_step)
        tmp.rename(root)
        with open(state / "imports.log", "a", encoding="utf-8") as log:
            log.write(f"{node} {this_step} {name or '-'} {image}\n")
    return root


def image_env(root: Path) -> dict[str, str]:
    out = {}
    path = root / "etc" / "environment"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        key, eq, value = line.strip().partition("=")
        if eq and key and not key.startswith("#"):
            out[key] = value
    return out


def task_env(host: dict[str, str], image: dict[str, str], keep: set[str]) -> dict[str, str]:
    """pyxis's order: the host's exported variables, then the image's over them, except
    for the names of --container-env that the host sets."""
    env = {k: v for k, v in host.items() if k not in DENIED_ENV or k in keep}
    for key, value in image.items():
        if key not in keep or key not in host:
            env[key] = value
    return env


def task_main(spec: dict, command: list[str]) -> None:
    state = Path(os.environ.get("FAKEPYXIS_STATE") or fail("FAKEPYXIS_STATE is not set") or "")
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    root = container_dir(spec, state, node)
    keep = {n for item in spec.get("container-env", []) for n in item.split(",") if n}
    env = task_env(dict(os.environ), image_env(root), keep)
    args = ["bwrap", "--bind", str(root), "/"]
    for name in HOST_DIRS:
        args += ["--ro-bind", f"/{name}", f"/{name}"]
    args += ["--proc", "/proc", "--dev-bind", "/dev", "/dev", "--ro-bind", "/sys", "/sys",
             "--tmpfs", "/tmp"]
    for path in HOST_FILES:
        args += ["--ro-bind-try", path, path]
    for item in (m for value in spec.get("container-mounts", []) for m in value.split(",")):
        parts = item.split(":")
        src = os.path.abspath(parts[0])
        dst = parts[1] if len(parts) > 1 else src
        flags = parts[2].split("+") if len(parts) > 2 else []
        args += ["--ro-bind" if "ro" in flags else "--bind", src, dst]
    args += ["--chdir", spec.get("container-workdir") or os.getcwd(), "--", *command]
    if not command:
        fail("no command")
    bwrap = shutil.which("bwrap") or fail("bwrap is not installed (Debian: bubblewrap)") or ""
    os.execve(bwrap, args, env)  # found on the host's PATH, not the container's


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--task"]:
        task_main(json.loads(argv[1]), argv[3:])
    srun_main(argv)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))  # the checkout: srun's options (standard library)
    main()
