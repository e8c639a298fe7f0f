"""The registry's methods as a Markdown table, read from the source without importing it (standard
library only).

The site is built where torch and peft are not installed (``.ci/run`` builds it with the ``docs``
extra alone), so ``peft_layerfusion.registration`` cannot be imported there. Its ``METHODS`` (and
``BASELINE_TYPES``) are read from ``registration.py`` as written: each ``Method(...)``'s fields by
the order and names of the ``Method`` dataclass, each config class found through the module's
imports, its description the first line of its module's docstring (as ``layerfusion methods``
prints it). ``tests/test_docs_site.py`` checks these rows against the imported registry.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "peft_layerfusion"
REGISTRATION = ROOT / PACKAGE / "registration.py"


@dataclass(frozen=True)
class MethodRow:
    """One registered PEFT type, as the table shows it.

    Args:
        name: The registry's name (``"dwatt"``).
        label: Its name in tables and figures (``"DWAtt"``).
        config: Its config class's name (``"DWAttConfig"``).
        summary: The first line of the config's module docstring, without the period; a preset's: its
            ``Preset`` summary (as ``Method.summary`` reads them).
        recommended: Marked ``recommended`` in the registry.
        peft_type: The PEFT type its adapters are saved as: its config class's ``PEFT_TYPE`` (a preset's
            is its method's); by default ``name.upper()``.
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


def _assigned(tree: ast.Module, name: str) -> ast.expr:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(target, ast.Name) and target.id == name for target in targets) and node.value:
            return node.value
    raise ValueError(f"{REGISTRATION}: no assignment to {name}")


def _fields(tree: ast.Module, class_name: str) -> list[str]:
    """The dataclass fields of ``class_name`` in their order (its annotated class attributes)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return [item.target.id for item in node.body if isinstance(item, ast.AnnAssign)]
    raise ValueError(f"{REGISTRATION}: no class {class_name}")


def _imports(tree: ast.Module) -> dict[str, str]:
    """Imported name -> the module it comes from (relative imports resolved against the package)."""
    modules = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            module = f"{PACKAGE}.{node.module}" if node.level == 1 else node.module
            modules.update({alias.asname or alias.name: module for alias in node.names})
    return modules


def _summary(module: str) -> str:
    """The first line of ``module``'s docstring (a module of this repository), without its period."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    return first.rstrip(".").replace("``", "`")


def _literal(node: ast.expr) -> object:
    return node.id if isinstance(node, ast.Name) else ast.literal_eval(node)


def _class_attribute(module: str, class_name: str, attribute: str) -> ast.expr:
    """The value assigned to ``attribute`` in the body of ``class_name`` of ``module`` (a module of this
    repository)."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                target = item.target if isinstance(item, ast.AnnAssign) else None
                if isinstance(target, ast.Name) and target.id == attribute and item.value is not None:
                    return item.value
    raise ValueError(f"{path}: no {class_name}.{attribute}")


def _preset_summary(module: str, config: str, preset: str) -> str:
    """The summary of ``config``'s preset ``preset``: the first argument of its ``Preset(...)``."""
    presets = _class_attribute(module, config, "PRESETS")
    for key, value in zip(presets.keys, presets.values, strict=True):
        if _literal(key) == preset:
            return str(_literal(value.args[0]))
    raise ValueError(f"{module}: {config} has no preset {preset!r}")


def registry_rows() -> list[MethodRow]:
    """The fusion methods (``METHODS``), then the baseline types (``BASELINE_TYPES``), in registry order."""
    tree = ast.parse(REGISTRATION.read_text(encoding="utf-8"))
    fields, imports = _fields(tree, "Method"), _imports(tree)
    rows = []
    for call in _assigned(tree, "METHODS").elts:
        values = dict(zip(fields, map(_literal, call.args), strict=False))
        values.update({keyword.arg: _literal(keyword.value) for keyword in call.keywords})
        config, preset = values["config_cls"], values.get("preset")
        module = imports[config]
        summary = _preset_summary(module, config, preset) if preset else _summary(module)
        label_first = f"{values['label']}: "
        rows.append(MethodRow(
            values["name"],
            values["label"],
            config,
            summary.removeprefix(label_first),
            bool(values.get("recommended", False)),
            str(_literal(_class_attribute(module, config, "PEFT_TYPE"))),
            preset,
        ))  # fmt: skip
    for entry in _assigned(tree, "BASELINE_TYPES").elts:
        name, config = _literal(entry.elts[0]), _literal(entry.elts[1])
        module = imports[config]
        peft_type = str(_literal(_class_attribute(module, config, "PEFT_TYPE")))
        label = config.removesuffix("Config")
        rows.append(MethodRow(name, label, config, _summary(module), False, peft_type))
    return rows


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
