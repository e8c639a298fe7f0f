"""`layerfusion methods` and the registry's names on the command line: read from the library's
``names.py`` (no copy), without torch."""

from __future__ import annotations

import subprocess
import sys

from layerfusion_recipes.reporting.methods import method_rows
from peft_layerfusion.registration import BASELINE_TYPES, METHODS


def test_the_rows_are_the_registry_s():
    rows = method_rows()
    assert [row[0] for row in rows] == [m.name for m in METHODS] + ["bitfit", "none"]
    assert [row[1:4] for row in rows[: len(METHODS)]] == [
        (m.peft_type, str(m.token_wise), str(m.seq2seq)) for m in METHODS
    ]
    assert rows[len(METHODS)][:4] == ("bitfit", BASELINE_TYPES[0][1].PEFT_TYPE, "-", "False")
    marked = [row[4].startswith("recommended: ") for row in rows[: len(METHODS)]]
    assert marked == [m.recommended for m in METHODS]


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
    assert len(lines) == 1 + len(METHODS) + len(BASELINE_TYPES) + 1 + 1


def test_unknown_method_and_regime_names_are_refused_before_torch_loads(tmp_path):
    for argv, message in [
        (["ner", "--methods", "none", "dwat"], "layerfusion ner: error: --methods: unknown ['dwat']"),
        (["classify", "--regimes", "adapter_seqbn"], "layerfusion classify: error: --regimes: unknown "),
        (["mlm", "--data", str(tmp_path), "--method", "dwat"], "layerfusion mlm: error: --method: unknown"),
    ]:
        result = _run(argv)
        assert result.stdout.strip() == "2 []", argv
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(message), result.stderr
