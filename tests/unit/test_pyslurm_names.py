"""pyslurm made honest: every JobSubmitDescription attribute the options table sets exists
in the real pyslurm release the `[pyslurm]` extra pins (names recorded from its sdist in
tests/fixtures/pyslurm/jobsubmitdescription.txt by extract_names.py), and the pin, the
recorded release and docs/launch.md agree on the one Slurm release it matches."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import pytest
from extract_names import FIXTURE, extract, public_names, read_fixture

from slurmfabric.job import options

REPO = Path(__file__).resolve().parents[2]
VERSION, NAMES = read_fixture()


def test_every_pyslurm_attribute_the_table_uses_exists_in_the_release() -> None:
    used = options.pyslurm_attributes()
    assert used - NAMES == set()
    # the check can fail: pyslurm has no gpus_per_node (GPUs go through gres_per_node)
    assert "gpus_per_node" not in NAMES and "gres_per_node" in used


def test_the_pin_the_release_and_the_readme_agree() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    (pin,) = re.findall(r'^pyslurm = \["pyslurm==(\d+)\.(\d+)\.\*"\]$', pyproject, re.M)
    major_minor = ".".join(pin)
    assert VERSION.startswith(major_minor + ".")
    launch_doc = (REPO / "docs" / "launch.md").read_text()
    assert f"`pip install 'slurmfabric[pyslurm]'` (pyslurm {major_minor}.*) fits Slurm " \
        f"{major_minor} only" in launch_doc


def test_the_build_script_and_the_docs_name_the_same_tags() -> None:
    """scripts/build-pyslurm.sh's release line -> tag choice is the docs' table."""
    script = (REPO / "scripts" / "build-pyslurm.sh").read_text()
    chosen = re.findall(r"^  (\d+\.\d+)\.\*\) want=([\d.]+);", script, re.M)
    assert chosen == [("22.05", "22.5.3"), ("24.11", "24.11.0")]
    launch_doc = (REPO / "docs" / "launch.md").read_text()
    for line, tag in chosen:
        assert re.search(rf"^\| {re.escape(line)} \(Debian \d+\) \| v{re.escape(tag)} \|",
                         launch_doc, re.M), (line, tag)


def _sdist(tmp_path: Path, pxd: str, version: str = "25.11.9") -> Path:
    """A tiny tarball shaped like a pyslurm sdist (our own text, not pyslurm's)."""
    path = tmp_path / f"pyslurm-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in ((f"pyslurm-{version}/pyslurm/version.py",
                            f'__version__ = "{version}"\n'),
                           (f"pyslurm-{version}/pyslurm/core/job/submission.pxd", pxd)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


PXD = """cdef class Other:
    cdef public:
        not_this

cdef class JobSubmitDescription:
    \"\"\"docs\"\"\"
    cdef:
        slurm.job_desc_msg_t *ptr

    cdef public:
        name
        signal

        is_requeueable

cdef class Next:
    cdef public:
        nor_this
"""


def test_the_extractor_reads_the_public_block_of_the_class(tmp_path) -> None:
    assert public_names(PXD) == ["name", "signal", "is_requeueable"]
    text = extract(_sdist(tmp_path, PXD))
    assert "# version: 25.11.9" in text and "pyslurm-25.11.9.tar.gz" in text
    assert read_fixture_text(text) == ("25.11.9", {"name", "signal", "is_requeueable"})
    with pytest.raises(SystemExit, match="no 'cdef class JobSubmitDescription'"):
        public_names("cdef class Other:\n    cdef public:\n        x\n")


def read_fixture_text(text: str) -> tuple[str, set[str]]:
    version = next(line.split(": ", 1)[1] for line in text.splitlines()
                   if line.startswith("# version: "))
    return version, {line for line in text.splitlines() if line and not line.startswith("#")}


@pytest.mark.skipif(not os.environ.get("SLURMFABRIC_PYSLURM_SDIST"),
                    reason="set SLURMFABRIC_PYSLURM_SDIST to a pyslurm sdist to re-extract")
def test_the_fixture_is_what_the_sdist_says() -> None:
    """With the real sdist at hand (pip download --no-deps --no-binary :all:
    'pyslurm==25.11.*'), the recorded names are exactly what it declares."""
    sdist = Path(os.environ["SLURMFABRIC_PYSLURM_SDIST"])
    assert extract(sdist) == FIXTURE.read_text()
