"""`layerfusion audit`: decoder configs and the named offline decoder; `--match` flags only the baselines it
sized, says when one cannot reach the budget."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, write_tiny_decoder
from transformers import AutoModel, BertConfig

from layerfusion_recipes.cli import main
from layerfusion_recipes.reporting.audit import budget_lines
from peft_layerfusion.discovery import find_encoder_blocks


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
        "from dwatt's budget"  # the presets fitted in closed form are not audited: nothing trains them
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


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "opt"])
def test_audit_counts_each_method_on_a_decoder_config(tmp_path, capsys, family):
    folder = write_tiny_decoder(tmp_path / family, family=family)  # 2 blocks, d = 32
    capsys.readouterr()
    assert main(["audit", folder, "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    blocks = find_encoder_blocks(AutoModel.from_pretrained(folder)).blocks
    assert counts["concat"] == 2 * 32 * 32 + 32  # W over z_1, z_2 and a bias
    assert counts["scalar_mix"] == 2 + 2 and counts["average"] == 0  # 2 logits, gamma, blend
    assert counts["extra_layers"] == sum(p.numel() for p in blocks[-1].parameters())  # one more block
    assert counts["dwatt"] > counts["concat"]


def test_audit_reads_the_named_offline_decoder_from_its_cache_folder(tmp_path, capsys, monkeypatch):
    """`layerfusion audit gemma3-270m` audits the converted copy (here a tiny stand-in's config)."""
    write_tiny_decoder(tmp_path / "cache" / "models" / "gemma3-270m", family="gemma3_text")
    monkeypatch.setenv("LAYERFUSION_CACHE", str(tmp_path / "cache"))
    capsys.readouterr()
    assert main(["audit", "gemma3-270m", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["concat"] == 2 * 32 * 32 + 32


def test_audit_of_a_gguf_file_reads_its_header_and_no_weight(tmp_path, capsys, monkeypatch):
    """`layerfusion audit FILE.gguf` counts from the config in the GGUF header: no tensor is read nor
    de-quantised, no float32 copy written; the counts are those of the converted copy."""
    from conftest import write_tiny_llama_gguf

    from layerfusion_recipes.core.models import gemma

    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("LAYERFUSION_CACHE", str(tmp_path / "cache"))

    def no_weights(*args, **kwargs):
        raise AssertionError("the audit loaded the weights")

    with monkeypatch.context() as patched:
        patched.setattr(gemma, "load_gguf", no_weights)
        patched.setattr(gemma.AutoModelForCausalLM, "from_pretrained", no_weights)
        capsys.readouterr()
        assert main(["audit", str(path), "--json"]) == 0
        from_header = json.loads(capsys.readouterr().out)
    assert not (tmp_path / "cache" / "models").exists()
    folder = gemma.resolve_model(str(path), {"LAYERFUSION_CACHE": str(tmp_path / "cache")})  # the copy
    assert main(["audit", folder, "--json"]) == 0
    assert from_header == json.loads(capsys.readouterr().out)
    assert from_header["concat"] == 2 * 16 * 16 + 16  # W over z_1, z_2 (d = 16) and a bias
