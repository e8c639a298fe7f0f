"""``names.py`` (the names as plain data) and the registry built from it agree: every entry is a method
with its classes, and what the entry says of it (PEFT type, token-wise, seq2seq, summary) is what the
classes say."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import peft_layerfusion
from peft_layerfusion import names
from peft_layerfusion.registration import BASELINE_TYPES, METHODS, RECOMMENDED, TYPES, method_named

ROOT = Path(__file__).resolve().parents[2]


def first_docstring_line(cls: type) -> str:
    """The first line of the docstring of ``cls``'s module, without its period and ``````."""
    doc = sys.modules[cls.__module__].__doc__.strip()
    return doc.splitlines()[0].rstrip(".").replace("``", "")


def test_every_entry_is_a_registered_method_in_order():
    assert [m.entry for m in METHODS] == list(names.ENTRIES)
    assert [name for name, _, _ in BASELINE_TYPES] == [entry.name for entry in names.BASELINE_ENTRIES]
    assert RECOMMENDED.name == names.RECOMMENDED == "layer_mix"
    assert names.METHOD_NAMES == ("none", *(m.name for m in METHODS if not m.seq2seq))
    assert method_named("extra_layers").label == "R+n"


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_an_entry_says_what_its_classes_are(method):
    entry = method.entry
    assert entry.peft_type == method.config_cls.PEFT_TYPE
    assert (entry.token_wise, entry.seq2seq) == (method.module_cls.token_wise, method.module_cls.seq2seq)
    if entry.variant_of is None:
        assert entry.summary == first_docstring_line(method.config_cls)  # its formula's file says it first
    else:
        assert entry.preset in method.config_cls.PRESETS
        assert method_named(entry.variant_of).config_cls is method.config_cls


def test_a_baseline_entry_says_what_its_classes_are():
    for (_, config_cls, _), entry in zip(BASELINE_TYPES, names.BASELINE_ENTRIES, strict=True):
        assert entry.peft_type == config_cls.PEFT_TYPE
        assert entry.summary == first_docstring_line(config_cls)


def test_every_tuner_class_serves_an_entry():
    used = {entry.peft_type for entry in names.ENTRIES + names.BASELINE_ENTRIES}
    assert set(TYPES) == used


def test_names_is_standard_library_only():
    """Loaded alone (the command line and the docs build do), it must import nothing of the package."""
    tree = ast.parse((ROOT / "peft_layerfusion" / "names.py").read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0] if isinstance(node, ast.Import) else (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
    assert all(not node.level for node in ast.walk(tree) if isinstance(node, ast.ImportFrom))


def test_names_loaded_first_is_the_package_s_module():
    """layerfusion_recipes loads names.py alone; the package, imported after, gets the same object."""
    script = (
        "import sys\n"
        "import layerfusion_recipes\n"
        "first = sys.modules['peft_layerfusion.names']\n"
        "heavy = sorted({'torch', 'peft', 'peft_layerfusion'} & set(sys.modules))\n"
        "import peft_layerfusion\n"
        "from peft_layerfusion.registration import METHODS\n"
        "print(heavy, peft_layerfusion.names is first, METHODS[0].entry is first.ENTRIES[0])\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["[]", "True", "True"]
    assert peft_layerfusion.names is names
