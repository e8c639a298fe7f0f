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
    """``layerfusion_recipes/core/sweeps/sweep.py`` -> ``layerfusion_recipes.core.sweeps.sweep``."""
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
    sweep = f"{PACKAGE}.core.sweeps.sweep"
    assert f"{PACKAGE}.core.results.records" in imports[sweep]  # `from ..results.records import ...`
    assert f"{PACKAGE}.core.sweeps.sweep_log" in imports[sweep]  # `from .sweep_log import ...`
    assert f"{PACKAGE}.core.errors" in imports[sweep]  # `from ..errors import ...`
    assert sweep in imports[f"{PACKAGE}.ner.command"]  # `from ..core.sweeps.sweep import ...`
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
        ("from ...reporting.plot import summarize\n", "core/sweeps/sweep.py", "reporting"),
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

# The rooms of core/, the same way, top first: a grid of runs (sweeps: the sweep, its log, the true
# few-shot protocol); one experiment's runs (engine: settings, experiment, the training loop, forward
# passes); the layer probes; the feature cache; records, cells, selection and statistics (results);
# models; the options (standard library only); beneath them, the top-level modules of core/ (errors,
# batches, memory) as the room ``base``.
CORE = f"{PACKAGE}.core"
CORE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("sweeps",),
    ("engine",),
    ("probes",),
    ("cache",),
    ("results",),
    ("models",),
    ("options",),
    ("base",),
)
CORE_RANK = {room: rank for rank, rooms in enumerate(CORE_LAYERS) for room in rooms}
# Each level the picture checks: the package whose folders it ranks, their ranks, and the name its
# top-level modules take together as one folder.
LEVELS = {"folders": (PACKAGE, RANK, "top"), "core": (CORE, CORE_RANK, "base")}


def folder_of(module: str, scope: str = PACKAGE, rank: dict[str, int] = RANK, top: str = "top") -> str | None:
    """The folder of a module under ``scope`` (``top`` for a top-level module such as ``arguments``),
    ``None`` outside ``scope`` or for ``scope`` itself (its ``__init__`` holds nothing)."""
    parts, prefix = module.split("."), scope.split(".")
    if parts[: len(prefix)] != prefix or len(parts) <= len(prefix):
        return None
    return parts[len(prefix)] if parts[len(prefix)] in rank else top


def module_of(name: str, modules: set[str]) -> str:
    """The module an imported name is in: the longest prefix of ``name`` that is one of ``modules``
    (``from ..results.records import unit_key`` imports ``...core.results.records``), else ``name``."""
    prefixes = [name.rsplit(".", cut)[0] for cut in range(name.count(".") + 1)]  # longest first
    return next((prefix for prefix in prefixes if prefix in modules), name)


def folder_edges(imports: dict[str, set[str]], level: str = "folders") -> dict[tuple[str, str], list[str]]:
    """``(folder A, folder B) -> ["importer -> imported", ...]``: each module of A importing a module of
    B (A != B), once however many of its names it takes; the folders of ``level`` (:data:`LEVELS`)."""
    scope, rank, top = LEVELS[level]
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, names in imports.items():
        for module in {module_of(imported, set(imports)) for imported in names}:
            source, target = folder_of(name, scope, rank, top), folder_of(module, scope, rank, top)
            if source is not None and target is not None and source != target:
                edges[source, target].add(f"{name} -> {module}")
    return {edge: sorted(lines) for edge, lines in edges.items()}


def upward_imports(edges: dict[tuple[str, str], list[str]], level: str = "folders") -> list[str]:
    """The imports of a folder into one of a higher layer than its own (:data:`LAYERS`,
    :data:`CORE_LAYERS`)."""
    rank = LEVELS[level][1]
    return [line for (a, b), lines in sorted(edges.items()) if rank[b] < rank[a] for line in lines]


def reaches(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """What each node of ``graph`` reaches through its edges (the transitive closure: a few hundred
    nodes at most)."""
    reach = {node: set(targets) for node, targets in graph.items()}
    changed = True
    while changed:
        changed = False
        for targets in reach.values():
            more = set().union(*(reach[t] for t in targets)) - targets if targets else set()
            if more:
                targets |= more
                changed = True
    return reach


def folder_loops(edges: dict[tuple[str, str], list[str]], level: str = "folders") -> list[list[str]]:
    """The folders that reach each other through imports (strongly connected, more than one folder)."""
    rank = LEVELS[level][1]
    reach = reaches({folder: {b for (a, b) in edges if a == folder} for folder in rank})
    loops = {frozenset({a} | {b for b in reach[a] if a in reach[b]}) for a in rank if a in reach[a]}
    return sorted(sorted(loop) for loop in loops)


@pytest.mark.parametrize("level", LEVELS)
def test_the_folders_import_downward_only(level):
    assert upward_imports(folder_edges(recipe_imports(), level), level) == []


@pytest.mark.parametrize("level", LEVELS)
def test_no_two_folders_import_each_other(level):
    assert folder_loops(folder_edges(recipe_imports(), level), level) == []


def test_every_folder_has_a_layer():
    folders = {path.parent.name for path in RECIPES.glob("*/__init__.py")}
    assert folders == set(RANK) - {"top"}
    rooms = {path.parent.name for path in (RECIPES / "core").glob("*/__init__.py")}
    assert rooms == set(CORE_RANK) - {"base"}
    assert not list((RECIPES / "core").glob("*/*/__init__.py"))  # one level of rooms


def module_loops(imports: dict[str, set[str]]) -> list[str]:
    """The modules that reach themselves through imports (a type-only import counts)."""
    modules = set(imports)
    reach = reaches(
        {
            name: {module_of(imported, modules) for imported in names} & modules - {name}
            for name, names in imports.items()
        }
    )
    return sorted(name for name in reach if name in reach[name])


def test_no_two_modules_import_each_other():
    assert module_loops(recipe_imports()) == []


@pytest.mark.parametrize(
    "level, importer, source, upward, loop",
    [
        ("folders", "core/results/cells.py", "from ...arguments import FULL_TRAIN\n", True, True),
        ("folders", "core/engine/runner.py", "from ...data.readers import collate\n", True, True),
        ("folders", "reporting/plot.py", "from ..mlm.records import read_mlm_records\n", True, True),
        ("folders", "ner/settings.py", "from ..core.options.options import default_output\n", False, False),
        ("folders", "arguments.py", "from .core.options.grids import DEFAULT_LR_GRIDS\n", False, False),
        ("core", "core/options/grids.py", "from ..engine.experiment import TaskSettings\n", True, True),
        ("core", "core/results/cells.py", "from ..probes.probes import PROBE_SETTINGS\n", True, True),
        ("core", "core/sweeps/sweep.py", "from ..cache.feature_cache import FeatureCache\n", False, False),
        ("core", "core/errors.py", "from .options.options import check_names\n", True, True),
    ],
)
def test_the_picture_sees_an_upward_import_and_its_loop(tmp_path, level, importer, source, upward, loop):
    """An import planted against the layers is upward, and a loop where the folder it reaches imports
    the importer's (``arguments`` and ``data`` import core; mlm draws with the reporting)."""
    path = tmp_path / "module.py"
    path.write_text(source)
    name = module_name(RECIPES / importer)
    imports = recipe_imports()
    before = folder_edges(imports, level)
    imports[name] = imports[name] | imported_modules(path, name.rpartition(".")[0])
    edges = folder_edges(imports, level)
    assert (len(upward_imports(edges, level)) > len(upward_imports(before, level))) is upward
    assert folder_loops(before, level) == [] and (folder_loops(edges, level) != []) is loop


def print_picture() -> int:
    """Print the folder-level import picture of ``layerfusion_recipes/`` and of its ``core/``: each edge
    and its count of imports, then the upward imports and the loops (each listed); 1 when there is any."""
    status = 0
    for level, (_, rank, _) in LEVELS.items():
        edges = folder_edges(recipe_imports(), level)
        order = sorted(edges, key=lambda edge: (rank[edge[0]], rank[edge[1]], edge))
        print(f"{level}:")
        for (a, b), lines in ((edge, edges[edge]) for edge in order):
            print(f"{a:>9} -> {b:<9} {len(lines):3d} imports")
        upward, loops = upward_imports(edges, level), folder_loops(edges, level)
        print(f"upward imports: {len(upward)}")
        print(*(f"  {line}" for line in upward), sep="\n", end="\n" if upward else "")
        print(f"folder-level loops: {len(loops)}")
        print(*(f"  {' <-> '.join(loop)}" for loop in loops), sep="\n", end="\n" if loops else "")
        status |= 1 if upward or loops else 0
    return status


if __name__ == "__main__":
    sys.exit(print_picture())
