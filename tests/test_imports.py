"""Imports go one way: utils -> kernels -> ops -> models -> compat -> tasks -> build -> commands ->
the root scripts, with decoding, evaluation and optim as libraries beside the tasks; datamodules
stand alone (only export and the entry layer import them); nothing imports a root script, and
there is no import cycle. Only build and commands (the entry layer) and the ``python -m`` commands
``src.datamodules.check`` and ``src.compat.convert`` use Hydra (and may import the entry
layer)."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

from tests.conftest import ROOT

# package -> src packages it must not import
ENTRY = {"build", "commands"}
FORBIDDEN = {
    "utils": {
        "kernels",
        "ops",
        "models",
        "compat",
        "tasks",
        "datamodules",
        "callbacks",
        "decoding",
        "evaluation",
        "optim",
    }
    | ENTRY,
    # where an op's fast path is chosen: below the ops, above only the utils
    "kernels": {
        "ops",
        "models",
        "compat",
        "tasks",
        "datamodules",
        "callbacks",
        "decoding",
        "evaluation",
        "optim",
        "export",
    }
    | ENTRY,
    "ops": {
        "models",
        "compat",
        "tasks",
        "datamodules",
        "callbacks",
        "decoding",
        "evaluation",
        "optim",
    }
    | ENTRY,
    "models": {"compat", "tasks", "datamodules", "callbacks", "decoding", "evaluation", "optim"}
    | ENTRY,
    # converters fill our networks from official weights: they import models, never the reverse
    "compat": {"tasks", "datamodules", "callbacks", "decoding", "evaluation", "optim"} | ENTRY,
    "decoding": {"models", "compat", "tasks", "datamodules", "callbacks", "evaluation", "optim"}
    | ENTRY,
    "evaluation": {"compat", "tasks", "datamodules", "callbacks", "decoding", "optim"} | ENTRY,
    "optim": {
        "kernels",
        "ops",
        "models",
        "compat",
        "tasks",
        "datamodules",
        "callbacks",
        "decoding",
        "evaluation",
    }
    | ENTRY,
    "datamodules": {
        "kernels",
        "ops",
        "models",
        "compat",
        "tasks",
        "callbacks",
        "decoding",
        "evaluation",
        "optim",
    }
    | ENTRY,
    "tasks": {"datamodules"} | ENTRY,
    # export builds graphs of networks and runs them: it sits beside the tasks, above models; it
    # reads what a deployed file carries from the data (images to check and calibrate on,
    # vocabularies, class names, normalisation), so it may import the datamodules
    "export": {"tasks", "callbacks", "compat"} | ENTRY,
    "callbacks": {"models", "compat", "tasks", "datamodules", "decoding", "evaluation", "optim"}
    | ENTRY,
}
# the root scripts: thin command lines over src.commands, imported by nothing
ROOT_SCRIPTS = {path.stem for path in ROOT.glob("*.py")}

# commands run with ``python -m``: like the root entry points, they compose configs with Hydra
COMMANDS = {ROOT / "src" / "datamodules" / "check.py", ROOT / "src" / "compat" / "convert.py"}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_direction(package: str) -> None:
    for path in (ROOT / "src" / package).rglob("*.py"):
        for name in imported_modules(path):
            parts = name.split(".")
            assert parts[0] != "hydra" or path in COMMANDS, (
                f"{path} imports Hydra; only the entry points may"
            )
            assert name != "src.datamodules.check", (
                f"{path} imports the check command (and so Hydra)"
            )
            if (
                parts[0] == "src"
                and len(parts) > 1
                and not (path in COMMANDS and parts[1] in ENTRY)
            ):
                assert parts[1] not in FORBIDDEN[package], f"{path} imports {name}"


def import_graph(root: Path, package: str = "src") -> dict[str, set[str]]:
    """Every module of ``package`` (under ``root``) and the modules of ``package`` it imports,
    wherever the import statement is: a function-local import runs when the function does, so it
    counts. ``from a import b`` imports the module ``a.b`` where there is one, else ``a``; importing
    a module also runs its packages' ``__init__``, except those of the importer's own packages."""
    paths = {}
    for path in (root / package).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in paths.items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importer's package, up level - 1
                    anchor = own_package.split(".")[: own_package.count(".") + 2 - node.level]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    imported.add(sub if sub in paths else base)
        graph[name] = set()
        for target in imported:
            while target and target not in paths:  # an attribute of a module, or outside it
                target = target.rpartition(".")[0]
            parts = target.split(".") if target else []
            for depth in range(1, len(parts) + 1):
                module = ".".join(parts[:depth])
                ours = name == module or name.startswith(module + ".")
                if module in paths and (depth == len(parts) or not ours) and module != name:
                    graph[name].add(module)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import one another (a strongly connected
    component of more than one module): the shortest from the group's first module back to it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = set()
            while not group or module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_shortest_cycle(graph, group) for group in groups]


def _shortest_cycle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    start = min(group)
    parent = {start: start}
    frontier = deque([start])
    while frontier:
        module = frontier.popleft()
        for target in sorted(graph[module] & group):
            if target == start:
                path = [module]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if target not in parent:
                parent[target] = module
                frontier.append(target)
    raise AssertionError(f"no cycle through {sorted(group)}")


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_graph(ROOT))
    assert not cycles, "import cycles among the modules under src/:\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_cycle_check_sees_local_imports_of_submodules(tmp_path: Path) -> None:
    """A cycle closed by a function-local ``from package import module`` is still a cycle."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.a import g\n\n    return g\n")
    (package / "c.py").write_text("from . import a\nimport torch\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_every_src_package_has_rules() -> None:
    packages = {p.name for p in (ROOT / "src").iterdir() if (p / "__init__.py").is_file()}
    assert packages - ENTRY == set(FORBIDDEN), "a new src package needs its row in FORBIDDEN"


@pytest.mark.parametrize("folder", ["src", "tests", "benchmarks"])
def test_nothing_imports_a_root_script(folder: str) -> None:
    assert {"train", "eval", "predict"} <= ROOT_SCRIPTS
    for path in (ROOT / folder).rglob("*.py"):
        for name in imported_modules(path):
            assert name.split(".")[0] not in ROOT_SCRIPTS, (
                f"{path} imports the root script {name}; import src.commands"
            )
