"""The package keeps the shape docs/architecture.md describes: a short top level, a wing per stage
whose ``__init__`` only says its job, no module over 500 lines, no class over 15 methods, every wing on the page."""

from __future__ import annotations

import ast
from pathlib import Path

import entrypoint

PACKAGE = Path(entrypoint.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
MAX_LINES = 500
MAX_METHODS = 15  # defined in a class's own body, properties included
MAX_TOP_LEVEL_FILES = 20


def _wings() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


def test_the_top_level_holds_at_most_twenty_files() -> None:
    files = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(files) <= MAX_TOP_LEVEL_FILES, f"{len(files)} files at the top level: {files}"


def test_no_module_is_over_500_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES:
            long.append(f"{path.relative_to(PACKAGE)} ({len(lines)})")
    assert not long, "over 500 lines (split it along the ideas it holds): " + ", ".join(long)


def _methods(node: ast.ClassDef) -> int:
    return sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body)


def test_no_class_has_over_15_methods() -> None:
    crowded = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and _methods(node) > MAX_METHODS:
                crowded.append(f"{path.relative_to(PACKAGE)}:{node.name} ({_methods(node)})")
    assert not crowded, "over 15 methods (split the class along the ideas it holds): " + ", ".join(crowded)


def test_the_method_count_sees_properties_and_nested_classes() -> None:
    source = "class A:\n    @property\n    def p(self): ...\n    def m(self): ...\n"
    source += "    class B:\n        def n(self): ...\n"
    outer = ast.parse(source).body[0]
    assert isinstance(outer, ast.ClassDef) and _methods(outer) == 2


def test_every_wing_init_says_its_job_and_holds_no_logic() -> None:
    for wing in _wings():
        tree = ast.parse((wing / "__init__.py").read_text())
        assert ast.get_docstring(tree), f"{wing.name}/__init__.py does not say its job"
        logic = [
            type(node).__name__
            for node in tree.body[1:]
            if not isinstance(node, ast.ImportFrom | ast.Import) and not ast.unparse(node).startswith("__all__ =")
        ]
        assert not logic, f"{wing.name}/__init__.py holds {logic}: code belongs in a module of the wing"


# The entry points and the one stage at the top level: they call into the wings; every other top-level
# module is a foundation, which the wings build on and which never reaches into one of them.
USES_WINGS = {"cli", "pipeline", "dryrun", "preflight", "__main__"}
# A foundation's own machinery kept in a wing of its own (hub.py's Xet transfers): the foundations may use it, and
# it builds on the foundations alone.
UNDER_FOUNDATIONS = {"xet"}


def test_the_foundations_import_no_wing() -> None:
    from tests.unit.test_import_cycles import import_graph

    wings = {wing.name for wing in _wings()}
    graph = import_graph(PACKAGE)
    reaching = {
        module: sorted(target for target in targets if target.split(".")[1] in wings - UNDER_FOUNDATIONS)
        for module, targets in graph.items()
        if module.count(".") == 1 and module.split(".")[1] not in wings | USES_WINGS
    }
    assert not {module: found for module, found in reaching.items() if found}, "a foundation imports a wing"


def test_a_wing_under_the_foundations_imports_no_other_wing() -> None:
    from tests.unit.test_import_cycles import import_graph

    wings = {wing.name for wing in _wings()}
    graph = import_graph(PACKAGE)
    reaching = {
        module: sorted(target for target in targets if target.split(".")[1] in wings - {module.split(".")[1]})
        for module, targets in graph.items()
        if "." in module and module.split(".")[1] in UNDER_FOUNDATIONS
    }
    assert wings >= UNDER_FOUNDATIONS
    assert not {module: found for module, found in reaching.items() if found}, "xet/ imports another wing"


def test_the_architecture_page_names_every_wing_and_top_level_module() -> None:
    page = ARCHITECTURE.read_text()
    missing = [f"{wing.name}/" for wing in _wings() if f"`{wing.name}/" not in page]
    missing += [p.name for p in PACKAGE.glob("*.py") if not p.name.startswith("_") and f"`{p.name}`" not in page]
    assert not missing, f"docs/architecture.md does not mention: {missing}"
