"""phaze's import graph, read statically with ``ast`` (no module is imported).

* no import cycles: every ``import phaze...``, ``from phaze... import`` and relative import, at
  module level and inside functions, is an edge (``from phaze.x import y`` goes to ``phaze.x.y``
  when that is a module, else to ``phaze.x``; a package's ``__init__`` is the module ``phaze.x``).
  Initialising a module's parent packages is not an edge: a package that re-exports its
  submodules would otherwise be a cycle with each of them.
* a function-local import only where it defers a heavy package (``HEAVY``: one a light command
  such as `python -m phaze --help` or `phaze search` must not load), directly or through a phaze
  module whose import pulls one; it says so with ``# deferred: <what>``. Anything else is imported
  at the top of the module, or carries ``# local import allowed: <why>``.
* measured: importing phaze.cli and building its parser (what `python -m phaze --help` does, every
  stage's CLI module) loads no heavy package.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
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


@functools.lru_cache(maxsize=512)
def _parsed(source: str) -> tuple[ast.Module, dict[ast.AST, ast.AST]]:
    """A module's tree and each node's parent (cached by source text: the checks read every file
    more than once)."""
    tree = ast.parse(source)
    return tree, {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def module_imports(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The imports of module ``name`` (file ``path``), at every nesting level, in file order."""
    package = name.split(".")[0]
    tree, parents = _parsed(path.read_text(encoding="utf-8"))
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


# --- function-local imports ----------------------------------------------------------------------

#: packages a light command (`python -m phaze --help`, `phaze search`) must not pay for
HEAVY = frozenset({"torch", "transformers", "pyomo", "pyscipopt", "matplotlib"})


def heavy_modules(package_dir: Path, heavy: frozenset[str] = HEAVY) -> dict[str, str]:
    """Module -> the heavy package that importing it pulls in: through its own module-level
    imports, transitively, and through its parent packages' ``__init__`` (which Python runs
    first). A module absent from the answer imports nothing heavy when it is imported."""
    modules = module_names(package_dir)
    at_import: dict[str, list[Import]] = {
        name: [imp for imp in module_imports(name, path, modules) if not imp.local]
        for name, path in modules.items()
    }
    pulled: dict[str, str] = {}
    changed = True
    while changed:  # a fixed point: the graph is small
        changed = False
        for name in modules:
            if name in pulled:
                continue
            parents = [p for p in (name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1))]
            for imp in at_import[name]:
                why = (
                    imp.target
                    if not imp.internal and imp.target in heavy
                    else pulled.get(imp.target)
                )
                if why:
                    break
            else:
                why = next((pulled[p] for p in parents if p in pulled), None)
            if why:
                pulled[name] = why
                changed = True
    return pulled


DEFERRED = "# deferred:"
ALLOWED = "# local import allowed:"


def local_import_problems(
    package_dir: Path, heavy: frozenset[str] = HEAVY, skip: frozenset[str] = frozenset()
) -> list[str]:
    """``file:line: what is wrong`` for each function-local import statement that defers nothing
    heavy (and is not allowed explicitly), or defers something heavy without saying so. ``skip``:
    files (``package/x/y.py``) not checked."""
    modules = module_names(package_dir)
    pulled = heavy_modules(package_dir, heavy)
    problems = []
    for name, path in modules.items():
        rel = path.relative_to(package_dir.parent).as_posix()
        if rel in skip:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        statements: dict[tuple[int, int], list[Import]] = {}
        for imp in module_imports(name, path, modules):
            if imp.local:
                statements.setdefault((imp.line, imp.end_line), []).append(imp)
        for (line, end_line), imps in statements.items():
            text = "\n".join(lines[line - 1 : end_line])
            if ALLOWED in text:
                continue
            light = [
                imp.target
                for imp in imps
                if not (pulled.get(imp.target) if imp.internal else imp.target in heavy)
            ]
            if light:
                wrong = f" (its `{DEFERRED}` comment is wrong)" if DEFERRED in text else ""
                problems.append(
                    f"{rel}:{line}: {', '.join(light)} pulls nothing heavy: import it at the "
                    f"top of the module{wrong}"
                )
            elif DEFERRED not in text:
                problems.append(f"{rel}:{line}: a deferred heavy import needs `{DEFERRED} <what>`")
    return problems


def test_phaze_function_local_imports_only_defer_heavy_packages():
    problems = local_import_problems(PACKAGE)
    assert not problems, "function-local imports:\n" + "\n".join(problems)


def test_local_import_problems_on_a_tiny_package(tmp_path):
    pkg = _write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/light.py": "import json\n",
            "pkg/heavy.py": "import json\n\nif True:\n    import torch.nn\n",
            "pkg/via.py": "from pkg import heavy\n",  # heavy at one remove
            "pkg/hsub/__init__.py": "from pyomo.environ import Var\n",
            "pkg/hsub/leaf.py": "X = 1\n",  # light itself; its package's __init__ is not
            "pkg/lazy.py": "def f():\n    import torch  # deferred: torch\n",  # torch, not at import
            "pkg/user.py": (
                "import os\n"
                "\n"
                "def ok():\n"
                "    import torch  # deferred: torch\n"
                "    from pkg import via  # deferred: pulls torch\n"
                "    from pkg.hsub import leaf  # deferred: pulls pyomo\n"
                "    from pyomo.environ import (  # deferred: pyomo\n"
                "        Var,\n"
                "    )\n"
                "    import json  # local import allowed: a test of the allow comment\n"
                "\n"
                "class C:\n"
                "    def bad(self):\n"
                "        import json\n"
                "        from pkg import light  # deferred: wrongly\n"
                "        from pkg import lazy  # deferred: its torch is itself deferred\n"
                "        import torch\n"
                "        import torch, os  # deferred: half of it\n"
            ),
        },
    )
    assert heavy_modules(pkg) == {
        "pkg.heavy": "torch",
        "pkg.via": "torch",
        "pkg.hsub": "pyomo",
        "pkg.hsub.leaf": "pyomo",
    }
    assert local_import_problems(pkg) == [
        "pkg/user.py:14: json pulls nothing heavy: import it at the top of the module",
        (
            "pkg/user.py:15: pkg.light pulls nothing heavy: import it at the top of the module "
            "(its `# deferred:` comment is wrong)"
        ),
        (
            "pkg/user.py:16: pkg.lazy pulls nothing heavy: import it at the top of the module "
            "(its `# deferred:` comment is wrong)"
        ),
        "pkg/user.py:17: a deferred heavy import needs `# deferred: <what>`",
        (
            "pkg/user.py:18: os pulls nothing heavy: import it at the top of the module "
            "(its `# deferred:` comment is wrong)"
        ),
    ]
    assert local_import_problems(pkg, skip=frozenset({"pkg/user.py"})) == []


def test_building_the_cli_loads_no_heavy_package():
    """What `python -m phaze --help` does: import phaze.cli and every stage's CLI module."""
    probe = (
        "import sys, phaze.cli; phaze.cli.build_parser(); "
        f"print(sorted({{m.partition('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"heavy packages loaded by the CLI: {out.stdout.strip()}"
