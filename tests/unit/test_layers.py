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
