"""The recipes' import direction: cli/arguments -> tasks -> core, the reporting reads records. The core
never imports the reporting, and nothing imports the entry point (``cli``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
PACKAGE = "layerfusion_recipes"  # the installed name of recipes/


def module_name(path: Path) -> str:
    """``recipes/core/sweep.py`` -> ``layerfusion_recipes.core.sweep``."""
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
    assert f"{PACKAGE}.commands" in imports[f"{PACKAGE}.reporting.results_md"]


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
