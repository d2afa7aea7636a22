"""Kernel files read the way the kernel serves them (issue 46, item 5).

Fixture trees are plain files: a plain file answers any read size at once. The kernel does
not: /proc/sys refuses a read larger than KMALLOC_MAX_SIZE with ENOMEM
(proc_sys_call_handler, fs/proc/proc_sysctl.c), a seq_file (/proc/self/maps, /proc/net/*)
hands out about a page per read before its end (seq_read_iter, fs/seq_file.c), a sysfs
attribute stats as 4096 bytes and a procfs file as 0 whatever they hold, and a driver's
show() may fail the read itself (EIO). The first tests read this machine's own /proc and
/sys; the last ones replay those four behaviours through os.read on a tree of files."""

from __future__ import annotations

import errno
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from slurmfabric._common import sysfs
from slurmfabric._common.sysfs import Root
from slurmfabric.topology._io import Reader

LINUX = sys.platform.startswith("linux") and os.path.exists("/proc/sys/kernel/osrelease")
needs_linux = pytest.mark.skipif(not LINUX, reason="reads this machine's own /proc and /sys")


@needs_linux
def test_this_machines_kernel_version_is_read() -> None:
    assert sysfs.read_text("/proc/sys/kernel/osrelease") == platform.release()
    assert Reader(Root("/")).text("/proc/sys/kernel/osrelease") == platform.release()


@needs_linux
def test_proc_sys_refuses_the_read_size_the_old_reader_asked_for() -> None:
    """The premise, on this kernel: one read of 4 MiB + 1 bytes (the old ``_MAX_CHARS + 1``)
    is ENOMEM where pages are 4 KiB (KMALLOC_MAX_SIZE is 4 MiB there; 64 KiB-page arm64
    kernels allow more); the reader's own chunk is accepted everywhere."""
    fd = os.open("/proc/sys/kernel/osrelease", os.O_RDONLY)
    try:
        if os.sysconf("SC_PAGE_SIZE") == 4096:
            with pytest.raises(OSError) as refused:
                os.read(fd, (4 << 20) + 1)
            assert refused.value.errno == errno.ENOMEM
        assert os.read(fd, sysfs._CHUNK).decode().strip() == platform.release()
    finally:
        os.close(fd)


@needs_linux
def test_a_seq_file_is_read_to_its_end() -> None:
    """/proc/self/maps comes a page at a time; the old shortcut (a short read is EOF) kept
    the first page only, without the [stack] line near its end."""
    fd = os.open("/proc/self/maps", os.O_RDONLY)
    try:
        first = os.read(fd, sysfs._CHUNK)
    finally:
        os.close(fd)
    assert len(first) < sysfs._CHUNK  # served short, yet not at its end:
    for text in (sysfs.read_text("/proc/self/maps"), Reader(Root("/")).text("/proc/self/maps")):
        assert text is not None and "[stack]" in text and len(text) > len(first)


@needs_linux
def test_sysfs_and_procfs_stat_sizes_say_nothing_about_the_content() -> None:
    online = "/sys/devices/system/cpu/online"
    if os.path.exists(online):
        assert os.stat(online).st_size == 4096
        assert sysfs.parse_cpulist(sysfs.read_text(online))  # a short list, read whole
    assert os.stat("/proc/cpuinfo").st_size == 0
    assert (sysfs.read_text("/proc/cpuinfo") or "").startswith("processor")


@needs_linux
def test_health_check_json_reports_the_kernel_this_machine_runs(tmp_path: Path) -> None:
    config = tmp_path / "health.toml"
    config.write_text(f'[runner]\nstate_dir = "{tmp_path}/s"\nsyslog = false\n'
                      f'log_file = "{tmp_path}/s/h.log"\n\n[[nodes]]\ngpus = 0\nrdma_ports = 0\n')
    out = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "check", "--json",
                          "--config", str(config), "--node", "gnode-test"],
                         capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    versions = next(c for c in report["checks"] if c["check"] == "node.versions")
    assert versions["values"]["versions"]["kernel"] == platform.release(), out.stderr


# -- the kernel's behaviours, replayed -------------------------------------------------------

KMALLOC_MAX_SIZE = 4 << 20  # x86-64 with 4 KiB pages: order-10 allocations


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Files under tmp_path/proc/sys refuse reads over KMALLOC_MAX_SIZE, files named *.seq
    serve at most one page per read, files named *.eio fail every read with EIO."""
    real_read = os.read

    def read(fd: int, size: int) -> bytes:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if path.startswith(str(tmp_path)):
            if "/proc/sys/" in path and size > KMALLOC_MAX_SIZE:
                raise OSError(errno.ENOMEM, "Cannot allocate memory")
            if path.endswith(".eio"):
                raise OSError(errno.EIO, "Input/output error")
            if path.endswith(".seq"):
                size = min(size, 4096)
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", read)
    return tmp_path


def test_proc_sys_files_read_in_sizes_it_accepts(kernel: Path) -> None:
    (kernel / "proc/sys/kernel").mkdir(parents=True)
    (kernel / "proc/sys/kernel/osrelease").write_text("6.8.0-1013-nvidia-64k\n")
    assert sysfs.read_text(kernel / "proc/sys/kernel/osrelease") == "6.8.0-1013-nvidia-64k"
    assert Reader(Root(str(kernel))).text("/proc/sys/kernel/osrelease") == \
        "6.8.0-1013-nvidia-64k"


def test_a_file_served_a_page_at_a_time_is_read_whole(kernel: Path) -> None:
    rows = "".join(f"{i:04d} 00000000 0001 0000 eth{i}\n" for i in range(900))  # ~29 KB
    (kernel / "route.seq").write_text(rows)
    assert sysfs.read_text(kernel / "route.seq") == rows.strip()


def test_a_read_that_fails_is_none_and_so_is_an_endless_file(kernel: Path) -> None:
    (kernel / "counter.eio").write_text("5\n")
    assert sysfs.read_text(kernel / "counter.eio") is None
    assert Reader(Root(str(kernel))).int("/counter.eio") is None
    if os.path.exists("/dev/zero"):
        (kernel / "zero").symlink_to("/dev/zero")
        assert sysfs.read_text(kernel / "zero") is None  # past _MAX_BYTES: no attribute


def test_windows_line_ends_and_a_fifo_read_as_text(kernel: Path) -> None:
    (kernel / "crlf").write_bytes(b"a\r\nb\rc\n")
    assert sysfs.read_text(kernel / "crlf") == "a\nb\nc"
    os.mkfifo(kernel / "fifo")
    assert sysfs.read_text(kernel / "fifo") == ""  # O_NONBLOCK: no writer, no wait
