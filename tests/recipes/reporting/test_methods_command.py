"""`layerfusion methods` and the registry's names on the command line: generated from the registry,
current, and read without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from layerfusion_recipes.core.options import names
from layerfusion_recipes.reporting.registry_names import names_source
from peft_layerfusion.comparison.regimes import METHOD_NAMES, REGIME_NAMES
from peft_layerfusion.registration import METHODS


def test_the_names_module_is_the_registry_s_current_list():
    """Adding a method to the registry fails here until names.py is regenerated
    (python -m layerfusion_recipes.reporting.registry_names)."""
    assert Path(names.__file__).read_text(encoding="utf-8") == names_source()
    assert names.METHOD_NAMES == METHOD_NAMES and names.REGIME_NAMES == REGIME_NAMES
    assert [row[0] for row in names.METHOD_ROWS] == [m.name for m in METHODS] + ["bitfit", "none"]
    assert names.METHOD_LABELS["extra_layers"] == "R+n" and names.REGIME_LABELS["fe"] == "frozen encoder"


def test_the_generator_sees_a_changed_registry(monkeypatch):
    from layerfusion_recipes.reporting import registry_names

    monkeypatch.setattr(registry_names, "METHOD_NAMES", (*METHOD_NAMES, "new_method"))
    assert '"new_method"' in names_source() and names_source() != Path(names.__file__).read_text()


HEAVY = "sorted({'torch', 'transformers', 'peft', 'peft_layerfusion'} & set(sys.modules))"


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    script = f"import sys\nfrom layerfusion_recipes.cli import main\nprint(main({argv!r}), {HEAVY})\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)


def test_methods_prints_its_table_without_importing_torch():
    result = _run(["methods"])
    lines = result.stdout.splitlines()
    assert lines[-1] == "0 []"
    assert lines[1].split()[:2] == ["dwatt", "DWATT"] and lines[-2].startswith("none")
    assert "depth-wise attention over every block's output" in lines[1]


def test_unknown_method_and_regime_names_are_refused_before_torch_loads(tmp_path):
    for argv, message in [
        (["ner", "--methods", "none", "dwat"], "layerfusion ner: error: --methods: unknown ['dwat']"),
        (["classify", "--regimes", "adapter_seqbn"], "layerfusion classify: error: --regimes: unknown "),
        (["mlm", "--data", str(tmp_path), "--method", "dwat"], "layerfusion mlm: error: --method: unknown"),
    ]:
        result = _run(argv)
        assert result.stdout.strip() == "2 []", argv
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(message), result.stderr
