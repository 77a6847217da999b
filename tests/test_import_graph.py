"""The runtime's packages import downward only, and no modules import each other in a circle.

The graph is read from the source with `ast`, never by importing it: every `import` and
`from … import` counts, at module level and deferred inside functions alike (a deferred import
is still a dependency, only a late one). A module that calls `importlib.import_module` also
depends on every module of the package whose full dotted name it holds as a string literal (the
registries' lists of the modules that fill them). Imports under `if TYPE_CHECKING:` are left out:
they never run, so they order nothing at import time and annotations may name any floor.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "radixserve"
PACKAGE_DIR = ROOT / "runtime" / PACKAGE

# The floor plan, lowest first. A module may import its own package, any package on a lower floor,
# and a sibling on its own floor (sibling edges must still be acyclic); never a higher floor.
# A top-level module (`radixserve/config.py`) is its own "package", named by its stem; the
# package's `__init__` and `__main__` are the entry points at the top.
FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"utils", "logs", "settings", "options", "version"}),
    frozenset({"config", "chat_template", "sampling_params", "json_checks", "messages",
               "distributed"}),
    frozenset({"core"}),
    frozenset({"layers", "kvcache", "tokenizer", "constrained", "postprocess"}),
    frozenset({"models", "lora"}),
    frozenset({"attention", "engine"}),
    # the scheduler's processes (spawn, join, channel, heartbeat); speculative decoding's drafters
    frozenset({"ranks", "speculative"}),
    frozenset({"scheduler"}),
    frozenset({"offline", "llm", "testing"}),
    frozenset({"server", "bench"}),
    frozenset({"cli"}),
    frozenset({"__init__", "__main__"}),
)


@dataclass(frozen=True)
class Edge:
    """`source` imports `target` (both dotted module names) at `line` of the source's file."""

    source: str
    target: str
    line: int


def _module_name(path: Path, package_dir: Path, package: str) -> str:
    parts = list(path.relative_to(package_dir).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` except the bodies of `if TYPE_CHECKING:` (their `else` still runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _nearest_module(name: str, modules: set[str]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _calls_import_module(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and n.func.attr == "import_module")
        or (isinstance(n.func, ast.Name) and n.func.id == "import_module"))
        for n in ast.walk(tree))


def import_edges(package_dir: Path, package: str) -> list[Edge]:
    """Every import from one module of the package to another (itself excluded), once per line."""
    files = {_module_name(p, package_dir, package): p for p in sorted(package_dir.rglob("*.py"))}
    modules = set(files)
    edges: dict[Edge, None] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        dynamic = _calls_import_module(tree)
        for node in _runtime_nodes(tree):
            targets: list[str] = []
            if dynamic and isinstance(node, ast.Constant) and node.value in modules - {package}:
                targets = [node.value]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node)
                # `from pkg import name` imports the submodule `pkg.name` when there is one.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for target in targets:
                found = _nearest_module(target, modules)
                if found and found != module:
                    edges[Edge(module, found, node.lineno)] = None
    return list(edges)


def package_of(module: str) -> str:
    """The first component below the root package: `radixserve.core.batch` -> `core`."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def upward_edges(edges: Sequence[Edge], floors: Sequence[frozenset[str]]) -> list[str]:
    """Each edge into a higher floor, or into or out of a package the plan does not place."""
    floor_of = {name: i for i, floor in enumerate(floors) for name in floor}
    problems = []
    for e in edges:
        src, dst = package_of(e.source), package_of(e.target)
        if src == dst:
            continue
        if src not in floor_of or dst not in floor_of:
            unplaced = src if src not in floor_of else dst
            problems.append(f"{e.source}:{e.line} -> {e.target}: package {unplaced!r} "
                            f"is not in the floor plan")
        elif floor_of[dst] > floor_of[src]:
            problems.append(f"{e.source}:{e.line} -> {e.target}: {src} (floor {floor_of[src]}) "
                            f"imports {dst} (floor {floor_of[dst]})")
    return problems


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One closed path through each strongly connected component of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graphs are a few hundred nodes
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_closed_path(graph, set(c)) for c in components]


def _closed_path(graph: Mapping[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first node, staying inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    return [*paths[node], start]
                if nxt in component and nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"no cycle through {start}")


def module_graph(edges: Sequence[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    return graph


def package_graph(edges: Sequence[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for e in edges:
        src, dst = package_of(e.source), package_of(e.target)
        if src != dst:
            graph.setdefault(src, set()).add(dst)
    return graph


def check(package_dir: Path, package: str, floors: Sequence[frozenset[str]]) -> list[str]:
    """Every violation of the floor plan, as readable lines; empty when the graph is clean."""
    edges = import_edges(package_dir, package)
    problems = [f"upward: {p}" for p in upward_edges(edges, floors)]
    problems += ["package cycle: " + " -> ".join(c) for c in cycles(package_graph(edges))]
    problems += ["module cycle: " + " -> ".join(c) for c in cycles(module_graph(edges))]
    return problems


def test_runtime_imports_downward_without_cycles() -> None:
    problems = check(PACKAGE_DIR, PACKAGE, FLOORS)
    assert not problems, "\n".join(problems)


def test_every_runtime_package_is_on_a_floor() -> None:
    placed = set().union(*FLOORS)
    present = {p.stem if p.is_file() else p.name for p in PACKAGE_DIR.iterdir()
               if (p.is_file() and p.suffix == ".py") or (p / "__init__.py").is_file()}
    assert present <= placed, f"not in the floor plan: {sorted(present - placed)}"


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_reports_upward_edge_and_cycles(tmp_path: Path) -> None:
    pkg = tmp_path / "toy"
    _write(pkg, {
        "__init__.py": "",
        "low/__init__.py": "",
        # Deferred and relative: low.a reaches up into high.b from inside a function.
        "low/a.py": "def f():\n    from ..high import b\n    return b\n",
        "high/__init__.py": "",
        "high/b.py": "from toy.low import a\n",
        # A module-level cycle inside one package, through `from . import`.
        "high/c.py": "from . import d\n",
        "high/d.py": "import toy.high.c\n",
        # A registry that imports the modules it lists, which import it back to register.
        "low/reg.py": "import importlib\nPARTS = ('toy.low.part',)\n"
                      "def load():\n    for m in PARTS:\n        importlib.import_module(m)\n",
        "low/part.py": "from toy.low.reg import PARTS\n",
        # A TYPE_CHECKING import never runs: not an edge.
        "low/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from toy.high import c\n",
    })
    problems = check(pkg, "toy", (frozenset({"low"}), frozenset({"high"}), frozenset({"__init__"})))
    assert "upward: toy.low.a:2 -> toy.high.b: low (floor 0) imports high (floor 1)" in problems
    assert "package cycle: high -> low -> high" in problems
    assert "module cycle: toy.high.b -> toy.low.a -> toy.high.b" in problems
    assert "module cycle: toy.high.c -> toy.high.d -> toy.high.c" in problems
    assert "module cycle: toy.low.part -> toy.low.reg -> toy.low.part" in problems
    assert not any("toy.low.e" in p for p in problems), problems
    assert len(problems) == 5, problems


def test_checker_passes_a_clean_package(tmp_path: Path) -> None:
    pkg = tmp_path / "toy"
    _write(pkg, {
        "__init__.py": "from toy.high import b\n",
        "low/__init__.py": "",
        "low/a.py": "X = 1\n",
        "high/__init__.py": "",
        "high/b.py": "from ..low.a import X\n\ndef f():\n    from toy.low import a\n",
    })
    assert check(pkg, "toy", (frozenset({"low"}), frozenset({"high"}),
                              frozenset({"__init__"}))) == []
