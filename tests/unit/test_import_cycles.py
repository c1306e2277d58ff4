"""No import cycle inside the ``entrypoint`` package.

Every module's imports are read from its syntax tree, wherever they sit: an import inside a function
still makes the two modules depend on each other, it only postpones the failure to the first call, and
one under ``if TYPE_CHECKING:`` is a dependency too (of the types: two modules that need each other's
names are one concern split in two). Importing ``a.b`` runs the package ``a`` first, so it depends on
``a`` too, and ``from . import name`` taken from a package's ``__init__`` depends on that ``__init__``.

The wings lean one way: the training wing asks the sync wing (``training/resume.py`` asks
``sync/read.py`` where the newest copy is); nothing in ``sync/`` imports ``training/``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "entrypoint"


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _all_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node: the bodies of functions and of ``if TYPE_CHECKING:`` included."""
    for node in ast.iter_child_nodes(tree):
        yield node
        yield from _all_nodes(node)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the modules of the package it imports (at the top or in a function)."""
    modules = {_module_name(path, package): path for path in package.rglob("*.py")}
    root = package.name
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        wanted: set[str] = set()
        for node in _all_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                targets = [f"{source}.{alias.name}" for alias in node.names]
                if any(target not in modules for target in targets):
                    wanted.add(source)  # names from the module itself (a package: its __init__)
                else:
                    targets.append(source)
            else:
                continue
            for target in targets:
                parts = target.split(".")
                # a.b.c runs a, a.b and a.b.c; the packages this module lives in are running already
                wanted |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} - ancestors
        graph[name] = {target for target in wanted if target in modules and target not in (name, root)}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (its modules in import order, the first repeated at the end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        while stack:
            target = next(stack[-1], None)
            if target is None:
                done.add(path.pop())
                stack.pop()
            elif target in path:
                return [*path[path.index(target) :], target]
            elif target not in done:
                path.append(target)
                stack.append(iter(sorted(graph[target])))
    return None


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "entrypoint.dataset" in graph and "entrypoint.gpu.probe" in graph  # the walk sees subpackages
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_through_a_function_local_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "entrypoint"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("from .c import NAME\n")
    (package / "sub" / "b.py").write_text("")
    (package / "sub" / "c.py").write_text("def later():\n    from .. import a\n")
    graph = import_graph(package)
    assert find_cycle(graph) == ["entrypoint.a", "entrypoint.sub", "entrypoint.sub.c", "entrypoint.a"]
    # Under TYPE_CHECKING it is the same cycle: the two modules need each other's names.
    (package / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n")
    assert find_cycle(import_graph(package)) == ["entrypoint.a", "entrypoint.sub", "entrypoint.sub.c", "entrypoint.a"]
    (package / "sub" / "c.py").write_text("")
    assert find_cycle(import_graph(package)) is None


def test_the_sync_wing_never_imports_the_training_wing() -> None:
    graph = import_graph()
    sync = {name for name in graph if name.startswith("entrypoint.sync")}
    assert "entrypoint.sync.read" in sync and "entrypoint.sync.read" in graph["entrypoint.training.resume"]
    leaning = sorted(f"{name} -> {target}" for name in sync for target in graph[name] if ".training" in target)
    assert not leaning, "sync/ imports training/: " + ", ".join(leaning)
