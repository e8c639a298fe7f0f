"""The registry's methods as a Markdown table, read without importing the package (standard library
only).

The site is built where torch and peft are not installed (``.ci/run`` builds it with the ``docs``
extra alone), so ``peft_layerfusion`` cannot be imported there. Its names are plain data in
``peft_layerfusion/names.py`` (standard library only), loaded here from its file; each PEFT type's config
class is found in the source as the class that sets ``PEFT_TYPE`` to it. ``tests/test_docs_site.py``
checks these rows against the imported registry.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "peft_layerfusion"
NAMES_MODULE = f"{PACKAGE}.names"


@dataclass(frozen=True)
class MethodRow:
    """One registered PEFT type, as the table shows it.

    Args:
        name: The registry's name (``"dwatt"``).
        label: Its name in tables and figures (``"DWAtt"``).
        config: Its config class's name (``"DWAttConfig"``).
        summary: Its one line, without its label (``names.py``'s summary).
        recommended: Marked ``recommended`` in the registry.
        peft_type: The PEFT type its adapters are saved as (a preset's is its method's).
        preset: The preset of ``config`` it is (``ScalarMixConfig.from_preset("layer_mix")``), if any.
    """

    name: str
    label: str
    config: str
    summary: str
    recommended: bool = False
    peft_type: str = ""
    preset: str | None = None

    def __post_init__(self) -> None:
        if not self.peft_type:
            object.__setattr__(self, "peft_type", self.name.upper())


def library_names() -> ModuleType:
    """``peft_layerfusion/names.py`` of this checkout (the imported one where the package is loaded)."""
    if NAMES_MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(NAMES_MODULE, ROOT / PACKAGE / "names.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[NAMES_MODULE] = module
        spec.loader.exec_module(module)
    return sys.modules[NAMES_MODULE]


def config_classes() -> dict[str, str]:
    """PEFT type -> the name of the config class that sets ``PEFT_TYPE`` to it, from the source."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                target = item.target if isinstance(item, ast.AnnAssign) else None
                if isinstance(target, ast.Name) and target.id == "PEFT_TYPE" and item.value is not None:
                    value = ast.literal_eval(item.value)
                    if value:
                        found[value] = node.name
    return found


def registry_rows() -> list[MethodRow]:
    """The fusion methods, then the baseline types, in registry order."""
    names, configs = library_names(), config_classes()
    return [
        MethodRow(
            entry.name,
            entry.label,
            configs[entry.peft_type],
            entry.summary.removeprefix(f"{entry.label}: "),
            entry.recommended,
            entry.peft_type,
            entry.preset,
        )
        for entry in names.ENTRIES + names.BASELINE_ENTRIES
    ]


def methods_table(rows: list[MethodRow] | None = None) -> str:
    """The Markdown table of :func:`registry_rows`: method, config, PEFT type, what it is.

    Example:
        >>> print(methods_table([MethodRow("dwatt", "DWAtt", "DWAttConfig", "depth-wise attention")]))
        | method | config | PEFT type | what it is |
        |---|---|---|---|
        | DWAtt | `DWAttConfig` | `DWATT` | depth-wise attention |
    """
    lines = ["| method | config | PEFT type | what it is |", "|---|---|---|---|"]
    for row in registry_rows() if rows is None else rows:
        label = f"**{row.label}** (recommended)" if row.recommended else row.label
        config = f"`{row.config}`" + (f", preset `{row.preset}`" if row.preset else "")
        lines.append(f"| {label} | {config} | `{row.peft_type}` | {row.summary} |")
    return "\n".join(lines)
