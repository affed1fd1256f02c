"""phaze's import graph, read statically with ``ast`` (no module is imported).

* no import cycles: every ``import phaze...``, ``from phaze... import`` and relative import, at
  module level and inside functions, is an edge (``from phaze.x import y`` goes to ``phaze.x.y``
  when that is a module, else to ``phaze.x``; a package's ``__init__`` is the module ``phaze.x``).
  Initialising a module's parent packages is not an edge: a package that re-exports its
  submodules would otherwise be a cycle with each of them.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "phaze"


class Import(NamedTuple):
    """One imported name: a phaze module (``phaze.x.y``) or another package's top-level name."""

    target: str
    internal: bool  # a module of the package being checked
    line: int  # the import statement's first line
    end_line: int
    local: bool  # inside a function (runs when the function does, not when the module is imported)


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package at ``package_dir``, by dotted name (``__init__`` -> package)."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _in_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def module_imports(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The imports of module ``name`` (file ``path``), at every nesting level, in file order."""
    package = name.split(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(dotted: str) -> tuple[str, bool]:
        if dotted.split(".")[0] != package:
            return dotted.split(".")[0], False
        while dotted not in modules and "." in dotted:  # `import phaze.x.f` -> phaze.x
            dotted = dotted.rpartition(".")[0]
        return dotted, True

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [resolve(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != package:
                targets = [resolve(source)]
            else:
                targets = [
                    resolve(f"{source}.{alias.name}")
                    if f"{source}.{alias.name}" in modules
                    else resolve(source)
                    for alias in node.names
                ]
        else:
            continue
        local = _in_function(node, parents)
        found += [
            Import(target, internal, node.lineno, node.end_lineno or node.lineno, local)
            for target, internal in dict.fromkeys(targets)
        ]
    return sorted(found, key=lambda imp: (imp.line, imp.target))


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its body (itself excluded)."""
    modules = module_names(package_dir)
    return {
        name: {
            imp.target
            for imp in module_imports(name, path, modules)
            if imp.internal and imp.target != name
        }
        for name, path in modules.items()
    }


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module, as a path
    ``[a, b, ..., a]`` starting at the component's first module in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm; phaze's graph is shallow enough to recurse
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)

    cycles = []
    for component in components:
        start = min(component)
        # breadth-first inside the component: the shortest way from start back to start
        previous: dict[str, str] = {}
        frontier = [start]
        while start not in previous:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & component):
                    if w not in previous:
                        previous[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while path[-1] != start or len(path) == 1:
            path.append(previous[path[-1]])
        cycles.append(path[::-1])
    return sorted(cycles)


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root / "pkg"


def test_phaze_has_no_import_cycles():
    cycles = find_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_find_cycles_reports_a_cycle_through_a_function_local_and_a_relative_import(tmp_path):
    pkg = _write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.sub import b\n",  # b is a module: edge to pkg.sub.b
            "pkg/sub/__init__.py": "",
            "pkg/sub/b.py": "def f():\n    from .c import VALUE\n    return VALUE\n",
            "pkg/sub/c.py": "import os\n\nfrom .. import a\nVALUE = 1\n",
            "pkg/d.py": "from pkg.sub import c\n",  # into the cycle, not on it
        },
    )
    assert import_graph(pkg) == {
        "pkg": set(),
        "pkg.a": {"pkg.sub.b"},
        "pkg.d": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg.a"},
    }
    assert find_cycles(import_graph(pkg)) == [["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]]


def test_find_cycles_passes_an_acyclic_package_and_a_name_from_an_init(tmp_path):
    pkg = _write_package(
        tmp_path,
        {
            # the package re-exports its submodule; the submodule takes a NAME from a sibling
            # through the package (`from pkg import helper` -> pkg, not a module pkg.helper)
            "pkg/__init__.py": "from pkg.a import run\n",
            "pkg/a.py": "from pkg.b import helper\n\ndef run():\n    return helper()\n",
            "pkg/b.py": "import json\n\ndef helper():\n    import pkg.c\n    return pkg.c.X\n",
            "pkg/c.py": "X = 1\n",
        },
    )
    assert import_graph(pkg) == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": set(),
    }
    assert find_cycles(import_graph(pkg)) == []
    # the same package with c taking a name from the package's __init__: a cycle through it
    (pkg / "c.py").write_text("from pkg import run\nX = 1\n", encoding="utf-8")
    assert find_cycles(import_graph(pkg)) == [["pkg", "pkg.a", "pkg.b", "pkg.c", "pkg"]]
