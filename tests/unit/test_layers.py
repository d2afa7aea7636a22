"""The package's import layers: commands on top, libraries below, no import back up, no
circle. Read from the source with ``ast``, so a lazy import inside a function (and one under
``if TYPE_CHECKING``) counts too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurmfabric"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str) -> set[str]:
    """The slurmfabric modules this file imports (``from pkg import mod`` names mod)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("slurmfabric"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if not base.startswith("slurmfabric"):
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return found - {module}


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: _imports(path, name) for name, path in MODULES.items()}


def test_the_graph_is_read() -> None:
    # A wrong reader would find nothing and pass every check below.
    assert "slurmfabric.rank.task" in GRAPH["slurmfabric.commands.launch"]
    assert "slurmfabric.plan.placement" in GRAPH["slurmfabric.plan"]


def test_no_library_imports_a_command_or_the_dispatcher() -> None:
    top = ("slurmfabric.commands", "slurmfabric.cli", "slurmfabric.__main__")
    up = {name: sorted(dep for dep in deps if dep.startswith(top[:2]))
          for name, deps in GRAPH.items() if not name.startswith(top)}
    assert {name: deps for name, deps in up.items() if deps} == {}


def test_no_import_circle() -> None:
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for dep in sorted(GRAPH.get(name, ())):
            if dep == name.rpartition(".")[0] or name.startswith(dep + "."):
                continue  # a module may import its own package's __init__ names
            if state.get(dep) == 1:
                circles.append([*trail[trail.index(dep):], dep] if dep in trail else [name, dep])
            elif dep in GRAPH and dep not in state:
                visit(dep, [*trail, dep])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert circles == []


# The order, lowest first: a module may import its own package, any package in a lower
# layer, and a package beside it only along an edge of SIDEWAYS. ``slurmfabric`` is the
# root __init__ (the version and the API's lazy name table, strings only).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("slurmfabric", "errors"),
    ("_common",),  # probes, records, sysfs, files, text rules
    ("slurm",),  # every Slurm command's argv and parser; hostlists
    ("topology", "plan", "whatif"),  # what a node has, what NCCL and ranks use, step time
    ("config",),  # the job config model and its vocabulary
    ("rank",),  # each rank's env, address, port and binding
    # the fronts: launch (job, restart, site, testbed), guard (health, nccl, pairsweep,
    # ibaudit, roce, progress)
    ("job", "restart", "site", "testbed", "health", "nccl", "pairsweep", "ibaudit", "roce",
     "progress"),
    ("commands",),  # one module per subcommand: parse and print
    ("cli",),  # the dispatcher (loads a command by name)
    ("__main__",),
)
SIDEWAYS = {
    ("plan", "topology"),  # the plan is made from the topology model
    ("health", "roce"),  # the RoCE health check reads roce's facts and profile
    ("ibaudit", "health"),  # a fabric audit drains through health's drain
    ("job", "nccl"),  # following a job reads its NCCL log lines
    ("job", "testbed"),  # the importer's real check submits to the testbed
    ("restart", "job"),  # the resume supervisor follows its job
    ("restart", "progress"),  # hang and slow events come from the heartbeats
    ("pairsweep", "job"),  # a sweep is rendered as a job
    ("pairsweep", "health"),  # burn-in drains; versions name the stacks
    ("pairsweep", "ibaudit"),  # a slow pair is placed on the fabric's links
    ("pairsweep", "nccl"),  # each pair's nccl-tests output is read
}


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def _layer(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def back_edges(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run up the order, or sideways along no edge of SIDEWAYS."""
    out = []
    for name, deps in sorted(graph.items()):
        here = _package(name)
        for dep in sorted(deps):
            there = _package(dep)
            if there == here:
                continue
            up, side = _layer(there) - _layer(here), (here, there) in SIDEWAYS
            if up > 0 or (up == 0 and not side):
                out.append(f"{name} -> {dep}")
    return out


def test_every_top_level_package_has_a_layer() -> None:
    placed = [package for layer in LAYERS for package in layer]
    assert len(placed) == len(set(placed))
    assert {_package(name) for name in GRAPH} == set(placed)


def test_no_import_runs_back_up_the_layers() -> None:
    assert back_edges(GRAPH) == []


def test_a_synthetic_back_edge_is_caught(tmp_path: Path) -> None:
    # The order check itself, on the real graph plus a module read by the same reader: an
    # import that runs up (config -> job, the one issue 44 found) inside a function, one
    # under TYPE_CHECKING, and one sideways along no listed edge.
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from slurmfabric.job.options import OPTIONS\n"
                    "if TYPE_CHECKING:\n    from slurmfabric.rank import env\n"
                    "from slurmfabric.plan import contract\n")
    deps = _imports(fake, "slurmfabric.config.fake")
    assert deps == {"slurmfabric.job.options", "slurmfabric.rank.env",
                    "slurmfabric.plan.contract"}
    graph = {**GRAPH, "slurmfabric.config.fake": deps,
             "slurmfabric.nccl.fake": {"slurmfabric.health.drain"},
             "slurmfabric.health.fake": {"slurmfabric.roce.facts"}}
    assert back_edges(graph) == [
        "slurmfabric.config.fake -> slurmfabric.job.options",
        "slurmfabric.config.fake -> slurmfabric.rank.env",
        "slurmfabric.nccl.fake -> slurmfabric.health.drain"]


def test_every_sideways_edge_is_still_used() -> None:
    """An edge nobody imports along any more leaves the list, so it stays short and true."""
    used = {(_package(name), _package(dep)) for name, deps in GRAPH.items() for dep in deps}
    assert SIDEWAYS - used == set()


def test_the_config_model_stands_alone() -> None:
    """config/ imports no front and nothing above it: the model, its vocabulary and rules
    are read by job/, rank/ and restart/, never the other way (issue 44)."""
    config = {name: deps for name, deps in GRAPH.items() if _package(name) == "config"}
    assert len(config) >= 10  # the split: sections, rules, formats, vocabulary ...
    reached = {_package(dep) for deps in config.values() for dep in deps}
    assert reached <= {"config", "_common", "errors", "plan", "slurmfabric"}


CONFIG_MAX_LINES = 400


def test_no_config_module_is_over_400_lines() -> None:
    """The model is split by section and rules (issue 44: models.py had reached 1,073
    lines); a module past 400 is a section that wants its own file."""
    long = {str(p.relative_to(PACKAGE)): n for p in sorted((PACKAGE / "config").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > CONFIG_MAX_LINES}
    assert long == {}


def test_the_top_level_holds_only_the_dispatcher_errors_and_the_api() -> None:
    """Each concern lives in a package named for it (job, rank, slurm, health ...); a loose
    module at the top is a hallway nobody can find by name."""
    loose = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__", "__main__", "cli", "errors"]


def test_every_stable_api_name_resolves() -> None:
    """The names ``slurmfabric.X`` that the README and user code use stay valid when files
    move: each one imports and is what its target module holds."""
    import importlib

    import slurmfabric

    for name, target in slurmfabric._LAZY.items():
        module, attr = target.split(":")
        assert getattr(slurmfabric, name) is getattr(importlib.import_module(module), attr)
    assert {"render_sbatch", "load_config", "sbatch", "make_plan", "task_env",
            "Checkpoints"} <= set(slurmfabric.__all__)


COMMANDS = PACKAGE / "commands"
COMMAND_MAX_LINES = 300


def test_no_command_module_is_over_300_lines() -> None:
    """A command parses and prints; one past 300 lines has grown decisions that belong in
    the library below it (issue 30: pairs.py had reached 611)."""
    long = {p.name: n for p in sorted(COMMANDS.glob("*.py"))
            if (n := len(p.read_text().splitlines())) > COMMAND_MAX_LINES}
    assert long == {}


def _private_command_names(source: str, module: str) -> list[str]:
    """``commands.X._name`` that ``source`` (the commands module ``module``) uses from another
    commands module: imported by name, or read as an attribute of the imported module."""
    found = []
    aliases: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "slurmfabric.commands"):
            for alias in node.names:
                if node.module == "slurmfabric.commands":  # a whole command module
                    aliases[alias.asname or alias.name] = alias.name
                elif node.module != f"slurmfabric.commands.{module}" and \
                        alias.name.startswith("_"):
                    found.append(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("slurmfabric.commands.") and alias.asname:
                    aliases[alias.asname] = alias.name.rpartition(".")[2]
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and aliases[node.value.id] != module):
            found.append(f"slurmfabric.commands.{aliases[node.value.id]}.{node.attr}")
    return sorted(found)


def test_the_private_name_reader_finds_both_forms() -> None:
    # A reader that misses a form would pass the check below on any tree.
    source = ("from slurmfabric.commands.health import _this_executable\n"
              "from slurmfabric.commands._args import number\n"
              "from slurmfabric.commands import env as env_cmd\n"
              "env_cmd._build()\nenv_cmd.build_task()\n")
    assert _private_command_names(source, "pairs") == [
        "slurmfabric.commands.env._build", "slurmfabric.commands.health._this_executable"]


def test_no_command_uses_another_commands_private_name() -> None:
    """What two commands share is a public name (``_args.number``, ``env.build_task``), or a
    library function; a private name of another command is a decision in the wrong place."""
    used = {p.stem: names for p in sorted(COMMANDS.glob("*.py"))
            if (names := _private_command_names(p.read_text(), p.stem))}
    assert used == {}
