"""The packages, found rather than listed: the library's, and the recipes' (the folder ``recipes/``,
installed as ``layerfusion_recipes`` through ``[tool.setuptools.package-dir]`` in pyproject.toml,
which holds every other setting). A new folder with an ``__init__.py`` is packaged as it is.

pyproject.toml alone cannot say this: ``[tool.setuptools.packages.find]`` names what it finds after
the folders (``recipes.core``), not after the installed name (``layerfusion_recipes.core``).
"""

from setuptools import find_packages, setup

RECIPES = "layerfusion_recipes"  # the installed name of the folder recipes/


def packages() -> list[str]:
    """Every package of the library and of the recipes, under its installed name."""
    library = find_packages(include=["peft_layerfusion", "peft_layerfusion.*"])
    recipes = find_packages(include=["recipes", "recipes.*"])
    return [*library, *(RECIPES + name.removeprefix("recipes") for name in recipes)]


if __name__ == "__main__":  # how pip's build backend runs this file
    setup(packages=packages())
