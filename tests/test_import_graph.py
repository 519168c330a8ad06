"""The import graph of skippy/, bench/ and stress/ has no cycles, and scheduling/ stays pure.

A cycle works only by the order modules happen to load in, and a deferred import (one inside a
function) that exists to dodge it hides the same knot, so both count: the graph holds every
`import` and `from` statement, at module level and in function bodies, except the ones under
`if TYPE_CHECKING:` (they never run). Parsed with `ast`, nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("skippy", "bench", "stress")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """Every module under PACKAGES, by dotted name (a package by its __init__)."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules[_module_name(path)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth, skipping `if TYPE_CHECKING:` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for orelse in child.orelse:
                yield from _import_nodes_of(orelse)
            continue
        yield from _import_nodes_of(child)


def _import_nodes_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _import_nodes(node)


def _resolve_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `module` imports: `from pkg import name` means pkg.name when that is a
    module, else pkg itself; parents that load implicitly are left out (they are not a knot)."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    targets.add(alias.name)
            continue
        base = _resolve_base(module, is_package, node)
        for alias in node.names:
            sub = f"{base}.{alias.name}" if base else alias.name
            if sub in modules:
                targets.add(sub)
            elif base in modules:
                targets.add(base)
    targets.discard(module)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module are the cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "{" + ", ".join(component) + "}: " + "; ".join(edges)


def test_the_checker_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_the_checker_reads_relative_deferred_and_type_only_imports(tmp_path: Path) -> None:
    source = tmp_path / "a.py"  # stands for pkg/sub/a.py
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "from .c import name\n"
        "if TYPE_CHECKING:\n"
        "    from .d import Hidden\n"
        "def f():\n"
        "    from .. import sub\n"
        "    from ..e import thing\n"
        "    import pkg.f\n"
    )
    modules = {m: source for m in ("pkg", "pkg.sub", "pkg.sub.a", "pkg.sub.b", "pkg.sub.c", "pkg.sub.d", "pkg.e",
                                   "pkg.f")}
    assert imports_of("pkg.sub.a", source, modules) == {"pkg.sub", "pkg.sub.b", "pkg.sub.c", "pkg.e", "pkg.f"}


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert "skippy.native.context" in graph and "bench.gate.cli" in graph
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(c, graph) for c in cycles)


def test_scheduling_imports_neither_trio_nor_native() -> None:
    """scheduling/ is the pure policy: no event loop, no llama; the actors and native/ wrap it."""
    offenders = []
    for path in sorted((ROOT / "skippy" / "scheduling").rglob("*.py")):
        module = _module_name(path)
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = _resolve_base(module, path.name == "__init__.py", node)
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            offenders += [f"{module}: {name}" for name in names
                          if any(name == f or name.startswith(f + ".") for f in ("trio", "skippy.native"))]
    assert not offenders, "scheduling/ must stay pure:\n" + "\n".join(offenders)
