"""No import cycles between the project's modules, and every module imports whatever came before it.

Two modules that import each other work only while they happen to be
imported in one order; the day a new caller imports the other one first, a
name is missing from a half-initialised module. A cycle hidden inside a
function ("lazy" import) is still a cycle: the two modules still need each
other, so the graph counts imports inside functions too. Imports under
``if TYPE_CHECKING:`` never run, so the whole project's graph leaves them out;
the engine's graph counts them as well: a type-only import is still a module
that must know another, and the engine's floors (delivery below the parts
that hold deliveries, the worker above every part it composes) hold for types
too.

The graph part finds the cycles by reading the source; the import part
proves it in fresh interpreters, importing every module first to last and
then last to first once Django is set up, as in every process of the
project (programs such as ``bench/__main__.py`` do nothing on import).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "bench", "chasqui_core", "config", "dashboard", "emails")

IMPORT_SETTINGS = "bench.django_settings"
"""The project's settings plus the bench's tasks app, so every app's modules (bench/tasks.py too) can load."""


def project_modules() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST, type_only: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: module level, in functions and classes; under TYPE_CHECKING too
    with ``type_only``."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_only:
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path], type_only: bool = False) -> set[str]:
    """The project modules ``name`` imports; ``from package import module`` points at the module itself."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path)), type_only):
        if isinstance(node, ast.Import):
            for alias in node.names:
                targets.add(alias.name)
            continue
        if node.level:
            package = name.split(".") if is_package else name.split(".")[:-1]
            base_parts = package[:len(package) - (node.level - 1)]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in modules else base)
    return {t for t in targets if t in modules and t != name}


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules, type_only) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules, as a path that ends where it starts."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, set(group)) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, staying inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target == start:
                    return paths[node] + [start]
                if target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")  # a strongly connected group has one


def test_the_graph_reads_imports_as_python_runs_them(tmp_path):
    """The reader itself: relative and function-level imports count, TYPE_CHECKING ones do not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n"
        "def later():\n    from .c import thing\n")
    (package / "c.py").write_text("import pkg.a\nthing = 1\n")
    (package / "d.py").write_text("from pkg.b import later\n")
    modules = {"pkg": package / "__init__.py", **{f"pkg.{m}": package / f"{m}.py" for m in "abcd"}}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}, "pkg.d": {"pkg.b"}}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    with_types = {name: imports_of(name, path, modules, type_only=True) for name, path in modules.items()}
    assert with_types["pkg.b"] == {"pkg.c", "pkg.d"}
    assert with_types["pkg.d"] == {"pkg.b"}  # pkg.b -> pkg.d -> pkg.b counts now, besides a -> b -> c -> a


def test_no_module_of_the_project_takes_part_in_an_import_cycle():
    graph = import_graph()
    assert len(graph) > 100 and "chasqui_core.backend" in graph  # the walk found the project
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_engine_module_takes_part_in_a_cycle_even_through_type_only_imports():
    graph = import_graph(type_only=True)
    engine = {name: {t for t in targets if t.startswith("chasqui_core.engine")}
              for name, targets in graph.items() if name.startswith("chasqui_core.engine")}
    assert "chasqui_core.engine.worker.worker" in engine and "chasqui_core.engine.worker.running" in engine
    cycles = find_cycles(engine)
    assert not cycles, "import cycles (type-only imports counted):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles)


def test_no_part_of_the_engine_imports_the_worker_it_serves():
    """The worker composes its parts; a part that imported it (for types, even) would reach back into the whole."""
    graph = import_graph(type_only=True)
    users = sorted(name for name, targets in graph.items()
                   if name.startswith("chasqui_core.engine") and "chasqui_core.engine.worker.worker" in targets)
    assert users == [], f"engine modules importing worker.py: {users}"


IMPORT_ALL = """
import importlib, sys, traceback
import django
django.setup()
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException:
        print(f"importing {name} failed:")
        traceback.print_exc(file=sys.stdout)
        sys.exit(1)
"""


def _import_in_a_fresh_interpreter(names: list[str]) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": IMPORT_SETTINGS, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *names], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_module_imports_in_alphabetical_order():
    _import_in_a_fresh_interpreter(sorted(project_modules()))


def test_every_module_imports_in_reverse_order():
    _import_in_a_fresh_interpreter(sorted(project_modules(), reverse=True))
