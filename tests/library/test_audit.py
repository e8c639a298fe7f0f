"""The parameter audit: hand-computed counts on a tiny config, the paper's Table 2, the CLI."""

from __future__ import annotations

import json

import pytest
from conftest import TINY
from transformers import BertConfig, RobertaConfig

from layerfusion_recipes.cli import main as cli_main
from peft_layerfusion.comparison.audit import (
    audit,
    audit_totals,
    component_of,
    load_model_config,
    match_report,
)


def main(argv: list[str]) -> int:
    """``layerfusion audit ...`` through the command line."""
    return cli_main(argv)


# RoBERTa-large's shape (its published config.json, the fields that size the model): TINY's fields
# (vocabulary, width, blocks, heads, MLP width, positions), then one token type and padding id 1.
ROBERTA_LARGE = {
    **dict(zip(TINY, (50265, 1024, 24, 16, 4096, 514), strict=True)),
    "type_vocab_size": 1,
    "pad_token_id": 1,
}

# Tiny BERT, d=32, L=3, γd=16. One bottleneck MLP: 32*16+16 + LN 2*16 + 16*32+32 = 1104.
TINY_DWATT = {"query_mlp": 1104, "value_mlps": 3 * 1104, "value_norm": 3 * 64, "key_proj": 24 * 32 + 32}
TINY_CONCAT = 3 * 32 * 32 + 32
TINY_BLOCK = 7504
# BertModel: embeddings 99*32 + 64*32 + 2*32 + LN 64, 3 blocks, pooler 32*32 + 32.
TINY_BASE = 3168 + 2048 + 64 + 64 + 3 * TINY_BLOCK + 1056


@pytest.fixture
def tiny_config() -> BertConfig:
    return BertConfig(**TINY)


def test_tiny_counts_by_hand(tiny_config):
    report = audit(tiny_config)
    assert report["dwatt"]["components"] == TINY_DWATT
    assert report["dwatt"]["total"] == 5408
    assert report["dwatt"]["percent_of_base"] == pytest.approx(100 * 5408 / TINY_BASE)
    assert report["concat"]["components"] == {"proj": TINY_CONCAT}
    assert report["extra_layers"]["components"] == {"blocks": TINY_BLOCK}  # n = max(1, round(3104 / 7504))
    assert report["average"]["total"] == 0
    assert report["scalar_mix"]["total"] == 3 + 1


def test_regimes_add_their_own_components(tiny_config):
    lora = audit(tiny_config, "lora", ("concat",), lora_r=2)["concat"]["components"]
    assert lora == {"lora": 3 * 2 * 2 * 64, "proj": TINY_CONCAT}
    bitfit = audit(tiny_config, "bitfit", ("none", "average"))
    biases = 32 + 3 * 272 + 32  # embeddings LN, blocks, pooler
    assert bitfit["none"]["components"] == {"bias": biases} == bitfit["average"]["components"]


def test_paper_table_2_roberta_large():
    totals = audit_totals(RobertaConfig(**ROBERTA_LARGE))  # meta device: no weights, no download
    paper = {"extra_layers": 25.19e6, "concat": 25.18e6, "dwatt": 26.33e6}
    for method, expected in paper.items():
        assert abs(totals[method] - expected) / expected < 0.005, (method, totals[method])
    assert totals["average"] == 0 and totals["scalar_mix"] == 25


def test_cli_json_is_one_object_of_integers(tiny_config, tmp_path, capsys):
    tiny_config.save_pretrained(tmp_path)  # a directory; the config.json path works too
    assert main(["audit", str(tmp_path), "--json"]) == 0
    directory = json.loads(capsys.readouterr().out)
    assert main(["audit", str(tmp_path / "config.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == directory
    assert directory == {
        "dwatt": 5408,
        "concat": TINY_CONCAT,
        "extra_layers": TINY_BLOCK,
        "average": 0,
        "scalar_mix": 4,
        "scaled_dwatt": 5408,  # DWAtt's parameters, other options
        "layer_mix": 4,  # ScalarMix's
    }  # not the presets fitted in closed form (probe_ensemble, ...): nothing trains them


def test_cli_table_and_match(tiny_config, tmp_path, capsys):
    tiny_config.save_pretrained(tmp_path)
    assert main(["audit", str(tmp_path)]) == 0
    assert "value_mlps=3312" in capsys.readouterr().out
    assert main(["audit", str(tmp_path), "--regime", "fe", "--match", "dwatt"]) == 0
    out = capsys.readouterr().out
    assert "+lora (r=14)" in out and "adapter_seqbn" in out  # 5408 / 384 per rank
    assert "FLAG: +extra_layers (n=1)" in out  # one block, 7504, against 5408 on a tiny model
    assert "FLAG: average" not in out and "FLAG: concat" not in out  # only the sized rows are flagged


def test_match_report_residuals(tiny_config):
    report = match_report(tiny_config, "fe", "dwatt")
    rows = report["rows"]
    assert rows["+lora (r=14)"]["total"] == 14 * 384
    assert rows["+lora (r=14)"]["vs_target"] == pytest.approx((14 * 384 - 5408) / 5408)
    assert all(
        abs(row["vs_target"]) < 0.05 for name, row in rows.items() if name.startswith(("+lora", "+adapter"))
    )
    flagged = {(a, b) for a, b, _ in report["flagged"]}
    assert ("dwatt", "concat") in flagged and not any("average" in pair for pair in flagged)


def test_uncached_hub_name_is_a_clear_error():
    with pytest.raises(ValueError, match="local cache only"):
        load_model_config("no-such-org/no-such-model-xyz")


def test_component_names():
    prefix = "base_model.model.encoder.layer_fusion.dwatt_fusion.default."
    assert component_of(prefix + "value_norm_weight") == "value_norm"
    assert component_of(prefix + "value_mlps.up.weight") == "value_mlps"
    assert (
        component_of("base_model.model.encoder.layer.0.attention.self.query.lora_A.default.weight") == "lora"
    )
    assert component_of("base_model.model.encoder.layer.0.output.dense.bias") == "bias"
    assert component_of("base_model.model.classifier.modules_to_save.default.weight") is None


def test_matched_baselines_sit_on_top_of_the_regime(tiny_config):
    rows = match_report(tiny_config, "bitfit", "dwatt")["rows"]
    biases = 32 + 3 * 272 + 32
    assert rows["dwatt"]["total"] == 5408 + biases
    assert rows["+lora (r=14)"]["components"] == {"bias": biases, "lora": 14 * 384}
    assert rows["+extra_layers (n=1)"]["components"] == {"bias": biases, "blocks": TINY_BLOCK}


def test_lora_regime_names_the_rank_of_the_one_lora_to_train(tiny_config):
    """Under `lora` the matched row sits on the regime's r = 8; the baseline to train is ONE LoRA
    of the summed rank (the conll_lora_matched grid once trained the added rank alone: -6.8%)."""
    rows = match_report(tiny_config, "lora", "dwatt")["rows"]
    (name,) = [name for name in rows if name.startswith("+lora")]
    added = int(name.split("(r=")[1].split(";")[0])
    alone = int(name.split("alone: r=")[1].rstrip(")"))
    assert alone == added + 8
    assert audit(tiny_config, "lora", ("none",), lora_r=alone)["none"]["total"] == rows[name]["total"]


def test_lora_regime_names_the_reduction_factor_of_adapters_trained_alone(tiny_config):
    """The ``adapter_*`` regimes replace the LoRA, so the adapters alone take DWAtt + LoRA's whole
    budget (conll_adapters_lr.yaml once derived that width by hand). Sized to Concat: on the tiny
    model DWAtt + LoRA is more than a full-width adapter (rf = 1)."""
    report = match_report(tiny_config, "lora", "concat")
    target = report["rows"]["concat"]["total"]
    (name,) = [name for name in report["rows"] if name.startswith("+adapter_seqbn")]
    on_top = float(name.split("(rf=")[1].split(";")[0])
    alone = float(name.split("alone: rf=")[1].rstrip(")"))
    d, blocks = TINY["hidden_size"], TINY["num_hidden_layers"]
    width_alone = round(d / alone)
    alone_params = blocks * (2 * d * width_alone + width_alone + d)  # Pfeiffer: down + up, biases
    assert abs(alone_params - target) <= blocks * (2 * d + 1)  # the closest width: within one step
    assert width_alone > round(d / on_top)  # wider than the adapters added on top of the LoRA
    assert "alone" not in " ".join(match_report(tiny_config, "bitfit", "concat")["rows"])
