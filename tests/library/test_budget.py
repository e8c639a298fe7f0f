"""Budget matching: analytic sizes, the knob chosen, and the residual reported."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import tiny_bert
from peft import LoraConfig, get_peft_model

from peft_layerfusion.comparison.budget import (
    BudgetMatch,
    bottleneck_params,
    lora_params_per_rank,
    match_bottleneck,
    match_extra_layers,
    match_lora_rank,
    mismatched_pairs,
    reduction_factor_for,
)

# One tiny BERT block (d=32, intermediate 48): q,k,v 3 x 1056 + attn out 1056 + LN 64
# + intermediate 1584 + output 1568 + LN 64.
TINY_BLOCK = 7504


def test_lora_size_per_rank_matches_peft():
    model = tiny_bert()
    assert lora_params_per_rank(model, ["query", "value"]) == 3 * 2 * (32 + 32)
    lora = get_peft_model(tiny_bert(), LoraConfig(target_modules=["query", "value"], r=3))
    assert sum(p.numel() for n, p in lora.named_parameters() if "lora_" in n) == 3 * 384


def test_lora_rank_closest_to_target_with_residual():
    match = match_lora_rank(tiny_bert(), 1000, ["query", "value"])
    assert (match.knob, match.value, match.params, match.residual) == ("lora_r", 3, 1152, 152)
    assert match.relative == pytest.approx(0.152)
    assert match_lora_rank(tiny_bert(), 10, ["query", "value"]).value == 1  # never below 1


def test_lora_targets_that_match_nothing_are_refused():
    with pytest.raises(ValueError, match="`target_modules`"):
        lora_params_per_rank(tiny_bert(), ["nope"])


def test_extra_layers_closest_count():
    match = match_extra_layers(tiny_bert(), 16_000)
    assert (match.value, match.params, match.residual) == (2, 2 * TINY_BLOCK, 2 * TINY_BLOCK - 16_000)
    assert match_extra_layers(tiny_bert(), 100).value == 1


def test_bottleneck_sizes():
    assert bottleneck_params(1024, 24, 64) == 24 * (2 * 1024 * 64 + 64 + 1024) == 3_171_840
    assert bottleneck_params(1024, 24, 64, "double_seqbn") == 2 * 3_171_840
    with pytest.raises(ValueError, match="`kind`"):
        bottleneck_params(8, 1, 1, "lora")


def test_bottleneck_match_picks_the_width_and_reduction_factor():
    match = match_bottleneck(tiny_bert(), 1656, "seqbn")  # 3 x (2*32*8 + 8 + 32): width 8
    assert (match.knob, match.value, match.params, match.residual) == ("reduction_factor", 4.0, 1656, 0)
    houlsby = match_bottleneck(tiny_bert(), 5000, "double_seqbn")
    assert houlsby.params == 6 * (64 * 12 + 12 + 32) and abs(houlsby.relative) < 0.03


@pytest.mark.parametrize("hidden", [384, 768, 1000, 1024])
def test_reduction_factor_gives_the_width_back(hidden):
    assert all(int(hidden // reduction_factor_for(hidden, b)) == b for b in range(1, hidden + 1))


def test_matched_budgets_are_within_half_a_step():
    target = 5408  # tiny DWAtt (see test_audit)
    lora = match_lora_rank(tiny_bert(), target, ["query", "value"])
    adapter = match_bottleneck(tiny_bert(), target, "seqbn")
    assert abs(lora.residual) <= 384 / 2 and abs(adapter.residual) <= 3 * 65 / 2
    assert abs(lora.relative) < 0.05 and abs(adapter.relative) < 0.05


def test_mismatched_pairs_flags_gaps_over_tolerance():
    pairs = mismatched_pairs({"a": 100, "b": 104, "c": 120})
    assert [(a, b) for a, b, _ in pairs] == [("a", "c"), ("b", "c")]
    assert pairs[0][2] == pytest.approx(20 / 120)
    assert mismatched_pairs({"a": 100, "b": 104}, tolerance=0.03) == [("a", "b", pytest.approx(0.04 / 1.04))]
    assert BudgetMatch("x", 1, 0, 0).relative == 0.0


@pytest.mark.skipif(
    importlib.util.find_spec("adapters") is None, reason="AdapterHub `adapters` not installed"
)
@pytest.mark.parametrize("kind", ["seqbn", "double_seqbn"])
def test_bottleneck_count_matches_adapterhub(kind):
    from peft_layerfusion.comparison.adapters_baseline import apply_bottleneck_adapters

    match = match_bottleneck(tiny_bert(), 5000, kind)
    model = apply_bottleneck_adapters(tiny_bert(), kind, match_params=5000)
    adapters = sum(
        p.numel() for n, p in model.named_parameters() if p.requires_grad and "classifier" not in n
    )
    assert adapters == match.params


def tiny_gpt2():
    """A 2-block, width-32 GPT-2: its attention and MLP linears are transformers' ``Conv1D``."""
    from transformers import GPT2Config, GPT2Model

    return GPT2Model(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=16, n_inner=48))


@pytest.mark.parametrize("r", [1, 8])
@pytest.mark.parametrize("targets", [["c_attn"], ["c_attn", "c_proj", "c_fc"]])
def test_lora_size_per_rank_counts_gpt2_conv1d_as_peft_adapts_it(targets, r):
    """GPT-2's ``Conv1D`` has its weight as ``(d_in, d_out)``: the count equals the LoRA parameters
    peft creates (c_attn 32 -> 96, c_proj 32 -> 32 in the attention and 48 -> 32 in the MLP,
    c_fc 32 -> 48)."""
    per_rank = lora_params_per_rank(tiny_gpt2(), targets)
    lora = get_peft_model(tiny_gpt2(), LoraConfig(target_modules=targets, r=r))
    created = sum(p.numel() for n, p in lora.named_parameters() if "lora_" in n)
    assert r * per_rank == created
    assert per_rank == (2 * 128 if targets == ["c_attn"] else 2 * (128 + 64 + 80 + 80))


def test_audit_matches_lora_on_gpt2(tmp_path, capsys):
    """``audit --regime lora --match``: the lora regime's targets on GPT-2 are Conv1D modules."""
    from layerfusion_recipes.cli import main

    tiny_gpt2().config.save_pretrained(tmp_path)
    assert main(["audit", str(tmp_path), "--regime", "lora", "--match", "dwatt"]) == 0
    assert "+lora (r=" in capsys.readouterr().out
