"""The shape of natsjs's import graph (STYLE.md, "what to stop doing").

Every module under natsjs/ is parsed (not imported) and each import,
at module level or inside a function, becomes an edge.  Two rules:

- no circle, except the core's owner back-references among
  natsjs.{client,cluster,connection,route,server} (a Server owns its
  connections and routes, and they reach back to it);
- no module takes another natsjs module's underscore name
  (``from natsjs.m import _x`` or ``import natsjs.m`` ... ``m._x``).

The checks run per package so each package's owner sees their own list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "natsjs"

# A Server owns connections, routes and the cluster; they call back to it.
CORE_OWNERS = frozenset(
    f"natsjs.{m}" for m in ("client", "cluster", "connection", "route", "server"))

PACKAGES = ("natsjs.admin", "natsjs.jetstream", "rest")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    """Every natsjs module with Python or Cython source."""
    mods = {}
    for path in sorted(PKG.rglob("*")):
        if path.suffix in (".py", ".pyx") and "__pycache__" not in path.parts:
            mods[module_name(path)] = path
    return mods


MODULES = all_modules()


def resolve(current: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module a (possibly relative) import names."""
    if level == 0:
        return name or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


class Imports:
    """What one module imports: edges, and underscore names it borrows."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.edges: dict[str, int] = {}  # target module -> first line
        self.borrowed: list[tuple[int, str]] = []  # (line, "module._name")
        if path.suffix != ".py":
            return  # Cython: cimports are checked by the compiler
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        aliases: dict[str, str] = {}  # local name -> natsjs module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("natsjs"):
                        self._edge(alias.name, node.lineno)
                        if alias.asname:
                            aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                target = resolve(name, is_package, node.level, node.module)
                if not target.startswith("natsjs"):
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    if full in MODULES:
                        # `from pkg import mod` runs pkg/__init__ no more than
                        # `import pkg.mod` does: the edge is to mod.
                        self._edge(full, node.lineno)
                        aliases[alias.asname or alias.name] = full
                        continue
                    self._edge(target, node.lineno)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        self.borrowed.append((node.lineno, full))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                self.borrowed.append((node.lineno, f"{aliases[node.value.id]}.{node.attr}"))

    def _edge(self, target: str, line: int) -> None:
        # `import natsjs.a.b` also runs natsjs.a; only real modules count.
        if target != self.name and target in MODULES:
            self.edges.setdefault(target, line)


GRAPH = {name: Imports(name, path) for name, path in MODULES.items()}


def cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v].edges:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    for pkg in PACKAGES[:-1]:
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return "rest"


def cycle_edges(comp: list[str]) -> list[str]:
    members = set(comp)
    return [f"  {a} -> {b} (line {GRAPH[a].edges[b]})"
            for a in comp for b in sorted(GRAPH[a].edges) if b in members]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package: str) -> None:
    bad = []
    for comp in cycles():
        if set(comp) <= CORE_OWNERS:
            continue
        if any(package_of(m) == package for m in comp):
            bad.append(f"cycle among {', '.join(comp)}:\n" + "\n".join(cycle_edges(comp)))
    assert not bad, "import cycles:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_borrowed_private_names(package: str) -> None:
    bad = [f"  {mod} line {line}: {what}"
           for mod, imports in sorted(GRAPH.items()) if package_of(mod) == package
           for line, what in imports.borrowed
           if what.rsplit(".", 1)[0] != mod]
    assert not bad, "underscore names of other modules:\n" + "\n".join(bad)


def test_checker_sees_a_cycle() -> None:
    """The graph is real: the allowed core back-references are found."""
    assert any(set(comp) & CORE_OWNERS for comp in cycles())
