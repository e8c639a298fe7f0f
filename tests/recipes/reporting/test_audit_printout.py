"""`layerfusion audit --match`: flags only the baselines it sized, says when one cannot reach the budget."""

from __future__ import annotations

from conftest import TINY
from layerfusion_recipes.cli import main
from layerfusion_recipes.reporting.audit import budget_lines
from transformers import BertConfig


def test_match_flags_only_the_rows_it_sized_and_says_r_plus_n_cannot_reach_the_budget(tmp_path, capsys):
    BertConfig(**TINY).save_pretrained(tmp_path)  # DWAtt 5,408; one BERT block 7,504 (+38.8%); Concat 3,104
    assert main(["audit", str(tmp_path), "--match", "dwatt"]) == 0
    lines = capsys.readouterr().out.splitlines()
    flags = [line for line in lines if line.startswith("FLAG")]  # was 14, pairs of rows never sized
    assert flags == [
        "FLAG: +extra_layers (n=1) is +38.8% from dwatt's budget (> 5%): "
        "R+n cannot reach it (one extra block is its smallest size)"
    ]
    assert lines[-1] == (
        "note: shown at their own default size, not sized here: concat -42.6%, extra_layers +38.8% "
        "from dwatt's budget"
    )


def _row(total: int, target: int, **sized) -> dict:
    return {"total": total, "vs_target": (total - target) / target, **sized}


def test_budget_lines_of_sized_unsized_and_reference_rows():
    rows = {
        "none": _row(0, 1000),
        "dwatt": _row(1000, 1000),
        "concat": _row(1020, 1000),  # at its default size, within 5%: no note
        "average": _row(0, 1000),  # a reference: never flagged nor noted
        "+lora (r=1)": _row(1300, 1000, knob="lora_r", value=1),
        "+extra_layers (n=2)": _row(940, 1000, knob="num_extra_layers", value=2),
        "+adapter_seqbn (rf=2)": _row(1001, 1000, knob="reduction_factor", value=2.0),
    }
    assert budget_lines(rows, "dwatt", 0.05) == [
        "FLAG: +lora (r=1) is +30.0% from dwatt's budget (> 5%): "
        "LoRA cannot reach it (rank 1 is its smallest size)",
        "FLAG: +extra_layers (n=2) is -6.0% from dwatt's budget (> 5%)",
    ]
    assert budget_lines(rows, "dwatt", 0.5) == ["every baseline sized here is within 50% of dwatt's budget"]
