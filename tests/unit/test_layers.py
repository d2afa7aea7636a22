"""The package's import layers: commands on top, libraries below, no import back up, no
circle. Read from the source with ``ast``, so a lazy import inside a function counts too."""

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
