"""The experiments of peft_layerfusion: one folder per task over a shared core, and the ``layerfusion``
command.

The registry's names (:mod:`peft_layerfusion.names`, standard library only) are loaded here from their
file, without running ``peft_layerfusion/__init__.py`` (torch, transformers, peft): so the command line
checks method names and answers ``--help`` and ``layerfusion methods`` at once, and every module here
writes ``from peft_layerfusion.names import ...``. The module is registered in ``sys.modules`` under its
own name, so the package, imported later, gets that same object (importing a submodule that is already
in ``sys.modules`` runs neither its file again nor its package's ``__init__``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

NAMES_MODULE = "peft_layerfusion.names"


def load_library_names() -> None:
    """Put :mod:`peft_layerfusion.names` in ``sys.modules``, executed from its file in the installed
    package (found by ``find_spec``, which does not execute the package), unless it is there already."""
    if NAMES_MODULE in sys.modules:
        return
    package = importlib.util.find_spec(NAMES_MODULE.rpartition(".")[0])
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError(
            "layerfusion_recipes needs the package peft_layerfusion: it is not installed"
        )
    path = Path(next(iter(package.submodule_search_locations))) / "names.py"
    spec = importlib.util.spec_from_file_location(NAMES_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAMES_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[NAMES_MODULE]
        raise


load_library_names()
