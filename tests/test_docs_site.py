"""The documentation site's own code: the home page's table of methods is the registry's, and the
site loads nothing from another host (it reads the same offline)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from peft_layerfusion.names import entry_named
from peft_layerfusion.registration import BASELINE_TYPES, METHODS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _docs_module(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


registry_table = _docs_module("registry_table")


def test_the_table_read_from_the_source_is_the_imported_registry():
    """``docs/registry_table.py`` reads ``names.py`` and the config classes without importing the package
    (the docs build has no torch): every registered type, in order, with the registry's name, label,
    config and summary."""
    expected = [
        (m.name, m.label, m.config_cls.__name__, m.summary.removeprefix(f"{m.label}: "), m.recommended)
        for m in METHODS
    ]  # fmt: skip
    expected += [
        (name, config.__name__.removesuffix("Config"), config.__name__, entry_named(name).summary, False)
        for name, config, _ in BASELINE_TYPES
    ]
    rows = registry_table.registry_rows()
    assert [(r.name, r.label, r.config, r.summary, r.recommended) for r in rows] == expected
    # the type an adapter is saved as: a preset's is its method's (LayerMix saves as SCALAR_MIX)
    types = [m.peft_type for m in METHODS] + [config.PEFT_TYPE for _, config, _ in BASELINE_TYPES]
    assert [r.peft_type for r in rows] == types
    assert {r.name: r.peft_type for r in rows}["layer_mix"] == "SCALAR_MIX"


def test_the_table_is_built_without_torch():
    script = (
        "import importlib.util, sys\n"
        f"path = {str(DOCS / 'registry_table.py')!r}\n"
        "spec = importlib.util.spec_from_file_location('registry_table', path)\n"
        "module = sys.modules['registry_table'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(len(module.methods_table().splitlines()), sorted({'torch', 'peft'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(2 + len(METHODS) + len(BASELINE_TYPES)), "[]"]


def test_the_home_page_shows_every_registered_method():
    table = registry_table.methods_table()
    lines = table.splitlines()
    assert lines[0] == "| method | config | PEFT type | what it is |"
    assert len(lines) == 2 + len(METHODS) + len(BASELINE_TYPES)
    for method in METHODS:
        assert f"`{method.config_cls.__name__}` | `{method.peft_type}` |" in table
    assert sum("(recommended)" in line for line in lines) == sum(m.recommended for m in METHODS) == 1
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    hooks = (DOCS / "hooks.py").read_text(encoding="utf-8")
    marker = re.search(r'METHODS_TABLE = "(?P<line>[^"]+)"', hooks)["line"]
    assert index.count(marker) == 1 and "| `DWAttConfig` |" not in index  # the table is written, not kept


def test_the_methods_page_has_a_section_for_every_preset_naming_its_call():
    """A preset has no module of its own to render: its section names its label and how to make it."""
    page = (DOCS / "concepts" / "methods.md").read_text(encoding="utf-8")
    presets = [m for m in METHODS if m.preset is not None]
    assert {m.name for m in presets} >= {"layer_mix", "scaled_dwatt", "probe_ensemble", "stacked"}
    for method in presets:
        assert f"\n## {method.label}\n" in page, method.name
        assert f'`{method.config_cls.__name__}.from_preset("{method.preset}"' in page, method.name


def test_the_site_loads_nothing_from_another_host():
    """Formulas, fonts and scripts are shipped in docs/ (KaTeX with its license): nothing from a CDN."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = re.findall(r"^\s+- (\S+\.(?:js|css))\s*$", config, re.MULTILINE)
    assert listed and all((DOCS / path).is_file() for path in listed), listed
    assert not re.search(r"^\s+- https?://", config, re.MULTILINE)
    katex = DOCS / "assets" / "katex"
    assert "MIT License" in (katex / "LICENSE").read_text(encoding="utf-8")
    css = (katex / "katex.min.css").read_text(encoding="utf-8")
    fonts = set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", css))
    assert fonts and all((katex / font).is_file() for font in fonts)
