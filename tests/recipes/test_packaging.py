"""Packaging: every third-party module the library and the recipes import is declared."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"peft_layerfusion", "layerfusion_recipes"}


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return {normalized(re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)) for requirement in requirements}


def imported_top_level_modules(folder: Path) -> set[str]:
    modules = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - FIRST_PARTY


def test_every_third_party_import_is_a_declared_dependency():
    distributions_of = packages_distributions()
    declared = declared_distributions()
    folders = (ROOT / "peft_layerfusion", ROOT / "layerfusion_recipes")
    modules = set().union(*(imported_top_level_modules(folder) for folder in folders))
    assert {"torch", "transformers", "peft"} <= modules  # the scan sees the imports
    undeclared = {
        module
        for module in modules
        if not {normalized(name) for name in distributions_of.get(module, [module])} & declared
    }
    assert not undeclared, f"imported but not declared in pyproject.toml: {sorted(undeclared)}"


def test_every_package_folder_is_packaged_none_listed_by_hand():
    """pyproject.toml finds the packages (``[tool.setuptools.packages.find]``, no list, no folder
    mapping, no setup.py): each folder with an ``__init__.py`` of the library and of the recipes."""
    from setuptools import find_packages

    setuptools_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools_config == {"packages": {"find": setuptools_config["packages"]["find"]}}  # no list
    assert not (ROOT / "setup.py").exists()
    found = find_packages(str(ROOT), **setuptools_config["packages"]["find"])
    folders = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("peft_layerfusion", "layerfusion_recipes")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert sorted(found) == sorted(folders)
    assert {"layerfusion_recipes.ner", "layerfusion_recipes.core", "peft_layerfusion.methods"} <= folders
