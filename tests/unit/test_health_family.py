"""Issue 44 item 1: a check family is one file plus its name in health/families.NAMES.

The test adds a family the way docs/health.md says, in a fresh interpreter: a new module
under slurmfabric.health.checks (here from a temporary directory on the package's path) and
one name added to the NAMES line of families.py, nothing else. The site config must then
know and type the family's key, and the runner must gather its fact and judge it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from cleanenv import clean_env

from slurmfabric.health import families
from slurmfabric.health.family import Key
from slurmfabric.health.runner import FACTS, registry
from slurmfabric.health.siteconfig import NODE_KEYS

DEMO = textwrap.dedent('''
    from slurmfabric.health.family import Fact, Family, Key
    from slurmfabric.health.model import FAIL, OK, CheckResult

    def collect(expect, timeout):
        return {"entropy": int(open(expect["demo_file"]).read())}

    def check_entropy(facts, expect, ctx):
        low = facts["entropy"] < expect["demo_min"]
        return CheckResult("demo.entropy", FAIL if low else OK,
                           f"entropy {facts['entropy']} < {expect['demo_min']}" if low else "")

    CHECKS = {"demo.entropy": (check_entropy, "fail", ("check",))}
    FAMILY = Family("demo", keys={"demo_min": Key(100, (0, 4096), integer=True),
                                  "demo_file": Key("/proc/sys/kernel/random/entropy_avail")},
                    facts=(Fact("demo", lambda run, t: collect(run.expect, t), CHECKS),))
''')

DRIVER = textwrap.dedent('''
    import json, sys, types
    import slurmfabric.health.checks as checks
    checks.__path__.append(sys.argv[1])
    import slurmfabric.health as health
    path = health.__path__[0] + "/families.py"
    src = open(path).read()
    assert src.count("NAMES = (") == 1
    mod = types.ModuleType("slurmfabric.health.families")
    mod.__file__ = path
    exec(compile(src.replace("NAMES = (", 'NAMES = ("demo", ', 1), path, "exec"), mod.__dict__)
    sys.modules["slurmfabric.health.families"] = mod
    from slurmfabric.errors import ConfigError
    from slurmfabric.health import runner, siteconfig
    from slurmfabric.health.model import Context
    out = {}
    try:
        siteconfig.resolve({"nodes": [{"demo_min": "lots"}]}, "n1", "h.toml")
    except ConfigError as exc:
        out["refused"] = str(exc)
    for value in (10, 999):
        cfg = siteconfig.resolve({"nodes": [{"demo_min": value, "demo_file": sys.argv[2],
                                             "gpus": 0, "rdma_ports": 0, "amd_gpus": 0}]},
                                 "n1", "h.toml")
        result = runner.run(cfg, Context(hook="check", node="n1"))
        out[str(value)] = [(r.check, r.status, r.reason) for r in result.results
                           if r.check.startswith("demo.")]
    print(json.dumps(out))
''')


def test_a_new_family_is_one_file_and_one_name(tmp_path: Path) -> None:
    (tmp_path / "demo.py").write_text(DEMO)
    (tmp_path / "entropy").write_text("256\n")
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), str(tmp_path / "entropy")],
                          capture_output=True, text=True, timeout=60,
                          env=clean_env(PATH="/usr/bin:/bin"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert "demo_min = 'lots' should be a number" in out["refused"]
    assert out["10"] == [["demo.entropy", "ok", ""]]
    assert out["999"] == [["demo.entropy", "fail", "entropy 256 < 999"]]


def test_every_fact_and_key_has_one_owner() -> None:
    """No two families gather one fact or declare one key, every check names its family's
    prefix, and the site config's [[nodes]] keys are exactly the families' plus the shared
    three (no key declared twice, none left in a central table)."""
    names = [fact.name for fact in FACTS]
    assert len(names) == len(set(names))
    keys = [k for family in families.FAMILIES for k in family.keys]
    assert len(keys) == len(set(keys))
    assert set(NODE_KEYS) == set(keys) | {"match", "sysfs_root", "commands"}
    assert all(isinstance(key, Key) for key in NODE_KEYS.values())
    # check names keep the policy families sites already write ([checks.gpu] ...); storage
    # (storage.read, issue 43) is new
    assert {spec.name.split(".")[0] for spec in registry()} == {"gpu", "rdma", "node", "amd",
                                                                  "storage"}
    assert tuple(f.name for f in families.FAMILIES) == families.NAMES


def test_the_docs_show_the_smallest_family_as_it_is() -> None:
    """docs/health.md quotes the clocks family's declaration; it must be the code's."""
    root = Path(__file__).resolve().parents[2]
    code = (root / "slurmfabric/health/checks/clocks.py").read_text()
    declaration = code[code.index('FAMILY = Family("clocks"'):].rstrip()
    assert declaration in (root / "docs/health.md").read_text()
    sizes = {f.name: len(f.keys) for f in families.FAMILIES}
    # one of the smallest (storage has one key, a table with its own rule)
    assert sizes["clocks"] <= sorted(sizes.values())[1] + 1
