"""The package keeps the shape docs/architecture.md describes: a short top level, a wing per stage
whose ``__init__`` only says its job, no module over 500 lines, no class over 15 methods, every wing on the page,
and the wings in one order, each importing only the wings below it."""

from __future__ import annotations

import ast
from collections.abc import Sequence
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


# The entry points and the one stage at the top level, above every wing (WING_LINE): they call into the wings; every
# other top-level module is a foundation, which the wings build on and which never reaches into one of them.
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


# The wings' order, bottom to top; docs/architecture.md draws this same list ("The order of the wings"). Below the
# first rung: the foundations (the top-level modules, and UNDER_FOUNDATIONS beneath hub.py); above the last: the
# entry points (USES_WINGS). A wing imports the foundations and the wings on lower rungs only, never a wing on its
# own rung or above, TYPE_CHECKING imports included (a type is a dependency too).
WING_LINE: list[tuple[str, ...]] = [
    ("gpu", "host", "runtimes", "release"),
    ("sync",),
    ("dataset",),
    ("training",),
    ("export", "evaluation"),
    ("report",),
    ("job",),
]


def upward_imports(graph: dict[str, set[str]], line: Sequence[Sequence[str]]) -> list[str]:
    """Every import in ``graph`` of a wing on the importer's own rung or above it, as ``a imports b (why)``; a
    foundation (rung 0) may import foundations, the entry points (the top rung) one another."""
    rungs = {wing: rung for rung, names in enumerate(line, start=1) for wing in names}
    top = len(line) + 1

    def rung(module: str) -> int:
        name = module.split(".")[1]
        return top if name in USES_WINGS else rungs.get(name, 0)

    found = []
    for module, targets in sorted(graph.items()):
        if "." not in module:
            continue
        here = rung(module)
        for target in sorted(targets):
            there = rung(target)
            other = target.split(".")[1] != module.split(".")[1]
            if other and (there > here or (there == here and 0 < here < top)):
                where = "above" if there > here else "beside"
                found.append(f"{module} imports {target} ({target.split('.')[1]} sits {where} it)")
    return found


def line_drawn(line: Sequence[Sequence[str]]) -> str:
    """The order as docs/architecture.md writes it."""
    return " < ".join(", ".join(f"`{wing}/`" for wing in names) for names in line)


def test_every_wing_has_its_place_in_the_line() -> None:
    placed = [wing for names in WING_LINE for wing in names]
    assert len(placed) == len(set(placed)), f"a wing on two rungs: {placed}"
    assert {wing.name for wing in _wings()} == set(placed) | UNDER_FOUNDATIONS, "a wing off the line (or gone)"


def test_a_wing_imports_only_the_wings_below_it() -> None:
    from tests.unit.test_import_cycles import import_graph

    upward = upward_imports(import_graph(PACKAGE), WING_LINE)
    assert not upward, "against the order of the wings (docs/architecture.md): " + "; ".join(upward)


def test_the_line_check_finds_an_import_upward_beside_or_from_a_foundation(tmp_path: Path) -> None:
    from tests.unit.test_import_cycles import import_graph

    package = tmp_path / "entrypoint"
    for wing in ("low", "peer", "high"):
        (package / wing).mkdir(parents=True)
        (package / wing / "__init__.py").write_text('"""A wing."""\n')
        (package / wing / "m.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text("")
    (package / "cli.py").write_text("from .high import m\nfrom . import base\n")
    (package / "high" / "m.py").write_text("from ..low import m\nfrom .. import base\n")
    line = [("low", "peer"), ("high",)]
    assert upward_imports(import_graph(package), line) == []  # downward only: nothing to say
    # upward under TYPE_CHECKING, inside a function, beside on one rung, and a foundation reaching into a wing
    (package / "low" / "m.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high import m\n"
    )
    (package / "peer" / "m.py").write_text("def later() -> None:\n    from ..low import m\n")
    (package / "base.py").write_text("from .peer import m\n")
    assert upward_imports(import_graph(package), line) == [
        "entrypoint.base imports entrypoint.peer (peer sits above it)",
        "entrypoint.base imports entrypoint.peer.m (peer sits above it)",
        "entrypoint.low.m imports entrypoint.high (high sits above it)",
        "entrypoint.low.m imports entrypoint.high.m (high sits above it)",
        "entrypoint.peer.m imports entrypoint.low (low sits beside it)",
        "entrypoint.peer.m imports entrypoint.low.m (low sits beside it)",
    ]


def test_the_architecture_page_draws_the_line() -> None:
    assert line_drawn(WING_LINE) in ARCHITECTURE.read_text(), "docs/architecture.md draws another order"
