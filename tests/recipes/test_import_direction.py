"""The recipes' import direction: cli/arguments -> tasks -> core, the reporting reads records. The core
never imports the reporting, and nothing imports the entry point (``cli``).

The folder-level picture: a folder of ``layerfusion_recipes/`` (the top-level modules ``arguments.py``,
``cli.py``, ``commands.py`` together as the folder ``top``) imports only the folders below it in
:data:`LAYERS` (no import runs back up) and no two folders import each other, through any path (no
loop). Print the picture, an edge per line with its count of imports, then the counts of upward
imports and loops::

    python tests/recipes/test_import_direction.py
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "layerfusion_recipes"
RECIPES = ROOT / PACKAGE


def module_name(path: Path) -> str:
    """``layerfusion_recipes/core/sweep.py`` -> ``layerfusion_recipes.core.sweep``."""
    parts = path.relative_to(RECIPES).with_suffix("").parts
    return ".".join((PACKAGE, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports (top level or inside a function), relative imports resolved
    against ``package``; ``from X import name`` counts as ``X`` and as ``X.name``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found |= {module, *(f"{module}.{alias.name}" for alias in node.names)}
    return found


def recipe_imports() -> dict[str, set[str]]:
    imports = {}
    for path in sorted(RECIPES.rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imports[name] = imported_modules(path, package)
    return imports


def test_the_scan_resolves_relative_imports():
    imports = recipe_imports()
    assert f"{PACKAGE}.core.records" in imports[f"{PACKAGE}.core.sweep"]  # `from .records import ...`
    assert f"{PACKAGE}.core.sweep" in imports[f"{PACKAGE}.ner.sweep"]  # `from ..core.sweep import ...`
    assert f"{PACKAGE}.reporting.markdown" in imports[f"{PACKAGE}.reporting.results_md"]  # `from .markdown`


def offenders(imports: dict[str, set[str]], importer: str, imported: str) -> list[str]:
    """``importer -> module`` for every module under ``importer`` importing one under ``imported``."""
    return [
        f"{name} -> {module}"
        for name, modules in imports.items()
        if name == importer or name.startswith(importer + ".")
        for module in sorted(modules)
        if module == imported or module.startswith(imported + ".")
    ]


def test_the_core_never_imports_the_reporting():
    assert offenders(recipe_imports(), f"{PACKAGE}.core", f"{PACKAGE}.reporting") == []


def test_nothing_in_the_package_imports_the_entry_point():
    """Scripts and tests (outside the package) may drive the command line through it."""
    imports = recipe_imports()
    assert [line for name in imports for line in offenders(imports, name, f"{PACKAGE}.cli")] == []


@pytest.mark.parametrize(
    "source, importer, imported",
    [
        ("from ..reporting.plot import summarize\n", "core/sweep.py", "reporting"),
        ("def f():\n    from ..cli import main\n", "reporting/results_md.py", "cli"),
        ("from . import cli\n", "commands.py", "cli"),
    ],
)
def test_the_check_sees_an_upward_import(tmp_path, source, importer, imported):
    path = tmp_path / "module.py"
    path.write_text(source)
    name = module_name(RECIPES / importer)
    package = name.rpartition(".")[0]
    imports = {name: imported_modules(path, package)}
    assert offenders(imports, name, f"{PACKAGE}.{imported}") != []


# The folders of layerfusion_recipes/, top first: a folder imports only its own layer's and the ones
# below it.
# The entry point and the command table; the tasks (over core, drawing their figures with the
# reporting); the reporting (reads records); the data readers; core (what every task shares).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("top",),
    ("ner", "classify", "mlm", "seq2seq"),
    ("reporting",),
    ("data",),
    ("core",),
)
RANK = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}


def folder_of(module: str) -> str | None:
    """The folder of a module of the package (``top`` for a top-level module such as ``arguments``),
    ``None`` outside the package or for the package itself (its ``__init__`` holds nothing)."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    return parts[1] if parts[1] in RANK else "top"


def module_of(name: str, modules: set[str]) -> str:
    """The module an imported name is in: the longest prefix of ``name`` that is one of ``modules``
    (``from .records import unit_key`` imports ``...core.records``), else ``name``."""
    prefixes = [name.rsplit(".", cut)[0] for cut in range(name.count(".") + 1)]  # longest first
    return next((prefix for prefix in prefixes if prefix in modules), name)


def folder_edges(imports: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """``(folder A, folder B) -> ["importer -> imported", ...]``: each module of A importing a module of
    B (A != B), once however many of its names it takes."""
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, names in imports.items():
        for module in {module_of(imported, set(imports)) for imported in names}:
            source, target = folder_of(name), folder_of(module)
            if source is not None and target is not None and source != target:
                edges[source, target].add(f"{name} -> {module}")
    return {edge: sorted(lines) for edge, lines in edges.items()}


def upward_imports(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """The imports of a folder into one of a higher layer than its own (:data:`LAYERS`)."""
    return [line for (a, b), lines in sorted(edges.items()) if RANK[b] < RANK[a] for line in lines]


def folder_loops(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The folders that reach each other through imports (strongly connected, more than one folder)."""
    reach = {folder: {b for (a, b) in edges if a == folder} for folder in RANK}
    changed = True
    while changed:  # transitive closure: a handful of folders
        changed = False
        for targets in reach.values():
            more = set().union(*(reach[t] for t in targets)) - targets if targets else set()
            if more:
                targets |= more
                changed = True
    loops = {frozenset({a} | {b for b in reach[a] if a in reach[b]}) for a in RANK if a in reach[a]}
    return sorted(sorted(loop) for loop in loops)


def test_the_folders_import_downward_only():
    assert upward_imports(folder_edges(recipe_imports())) == []


def test_no_two_folders_import_each_other():
    assert folder_loops(folder_edges(recipe_imports())) == []


def test_every_folder_has_a_layer():
    folders = {path.parent.name for path in RECIPES.glob("*/__init__.py")}
    assert folders == set(RANK) - {"top"}


@pytest.mark.parametrize(
    "importer, source, upward",
    [
        ("core/cells.py", "from ..arguments import FULL_TRAIN\n", True),
        ("core/runner.py", "from ..data.readers import collate\n", True),
        ("reporting/plot.py", "from ..mlm.records import read_mlm_records\n", True),
        ("ner/settings.py", "from ..core.options import default_output\n", False),
        ("arguments.py", "from .core.grids import DEFAULT_LR_GRIDS\n", False),
    ],
)
def test_the_picture_sees_an_upward_import_and_its_loop(tmp_path, importer, source, upward):
    path = tmp_path / "module.py"
    path.write_text(source)
    name = module_name(RECIPES / importer)
    imports = recipe_imports()
    before = folder_edges(imports)
    imports[name] = imports[name] | imported_modules(path, name.rpartition(".")[0])
    edges = folder_edges(imports)
    assert (len(upward_imports(edges)) > len(upward_imports(before))) is upward
    if upward and importer.startswith("core/"):  # arguments and data import core: a loop
        assert folder_loops(edges) != [] and folder_loops(before) == []


def print_picture() -> int:
    """Print the folder-level import picture of ``layerfusion_recipes/``: each edge and its count of
    imports, then the upward imports and the loops (each listed); 1 when there is any."""
    edges = folder_edges(recipe_imports())
    order = sorted(edges, key=lambda edge: (RANK[edge[0]], RANK[edge[1]], edge))
    for (a, b), lines in ((edge, edges[edge]) for edge in order):
        print(f"{a:>9} -> {b:<9} {len(lines):3d} imports")
    upward, loops = upward_imports(edges), folder_loops(edges)
    print(f"upward imports: {len(upward)}")
    print(*(f"  {line}" for line in upward), sep="\n", end="\n" if upward else "")
    print(f"folder-level loops: {len(loops)}")
    print(*(f"  {' <-> '.join(loop)}" for loop in loops), sep="\n", end="\n" if loops else "")
    return 1 if upward or loops else 0


if __name__ == "__main__":
    sys.exit(print_picture())
