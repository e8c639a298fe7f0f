"""The audit at LLM shapes: every method sized to the budget of LoRA r = 16 on ``q, k, v, o``.

Gemma 3 270M, Qwen3-0.6B and Llama-3.1-8B, built from their published sizes on the meta device
(``comparison/shapes.py``: no weights, no download). Every count is checked against a number
written out by hand from the shapes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from layerfusion_recipes.cli import main as cli_main
from peft_layerfusion import ConcatConfig, DWAttConfig
from peft_layerfusion.comparison.audit import (
    ATTENTION_PROJECTIONS,
    format_table,
    load_model_config,
    lora_sized_report,
    meta_model,
)
from peft_layerfusion.comparison.budget import count_parameters, lora_params_per_rank
from peft_layerfusion.comparison.shapes import LLM_SHAPES, llm_shape


def per_rank(d: int, q_out: int, kv_out: int) -> int:
    """LoRA parameters per rank and block on q, k, v, o: ``Σ (d_in + d_out)``."""
    return (d + q_out) + 2 * (d + kv_out) + (q_out + d)


def block(d: int, q_out: int, kv_out: int, mlp: int, norms: int) -> int:
    """One decoder block: the four projections, a gated MLP (3 d mlp), the norms."""
    return 2 * d * q_out + 2 * d * kv_out + 3 * d * mlp + norms


# K (= L), d, the LoRA r=16 budget, one block, the bare model (AutoModel: no LM head).
SHAPES = {
    "gemma-3-270m": dict(
        K=18, d=640, lora=16 * 18 * per_rank(640, 4 * 256, 256),  # 4 heads of 256, 1 KV head
        block=block(640, 1024, 256, 2048, norms=4 * 640 + 2 * 256), base=262144 * 640 + 18 * 5_573_632 + 640,
    ),
    "qwen3-0.6b": dict(
        K=28, d=1024, lora=16 * 28 * per_rank(1024, 16 * 128, 8 * 128),
        block=block(1024, 2048, 1024, 3072, norms=2 * 1024 + 2 * 128),
        base=151936 * 1024 + 28 * 15_730_944 + 1024,
    ),
    "llama-3.1-8b": dict(
        K=32, d=4096, lora=16 * 32 * per_rank(4096, 4096, 8 * 128),
        block=block(4096, 4096, 1024, 14336, norms=2 * 4096), base=128256 * 4096 + 32 * 218_112_000 + 4096,
    ),
}  # fmt: skip


# The knob closest to the budget and the sized count (the formulas written out again).
def concat_size(k: int, d: int, rank: int) -> int:
    return 2 * k * d * rank + d


def dwatt_size(k: int, d: int, width: int) -> int:
    mlp = 2 * d * width + 3 * width + d  # U, LN, W
    return (k + 1) * mlp + 2 * k * d + 24 * d + d  # query + K value MLPs, LN_n, W_K (d_pos = 24)


SIZED = {
    "gemma-3-270m": dict(rank=64, concat=concat_size(18, 640, 64), width=58, dwatt=dwatt_size(18, 640, 58)),
    "qwen3-0.6b": dict(rank=80, concat=concat_size(28, 1024, 80), width=75, dwatt=dwatt_size(28, 1024, 75)),
    "llama-3.1-8b": dict(rank=52, concat=concat_size(32, 4096, 52), width=49, dwatt=dwatt_size(32, 4096, 49)),
}


def test_the_hand_numbers():
    assert [SHAPES[name]["lora"] for name in SHAPES] == [1_474_560, 4_587_520, 13_631_488]
    assert [SHAPES[name]["block"] for name in SHAPES] == [5_573_632, 15_730_944, 218_112_000]
    assert [SIZED[name]["concat"] for name in SIZED] == [1_475_200, 4_588_544, 13_635_584]
    assert [SIZED[name]["dwatt"] for name in SIZED] == [1_465_066, 4_573_565, 13_751_027]


@pytest.mark.parametrize("name", list(LLM_SHAPES))
def test_shapes_have_their_published_sizes_and_lora_budget(name):
    model = meta_model(load_model_config(name))  # a shape name is a config source
    assert model.device.type == "meta"
    assert count_parameters(model) == SHAPES[name]["base"]  # 268M, 596M, 7.50B (+ LM head: 8.03B)
    assert 16 * lora_params_per_rank(model, list(ATTENTION_PROJECTIONS)) == SHAPES[name]["lora"]


def test_unknown_shape_names_the_known_ones():
    with pytest.raises(
        ValueError, match=r"^`shape`='llama-4' is not allowed: expected one of \['gemma-3-270m'"
    ):
        llm_shape("llama-4")


@pytest.mark.parametrize("name", list(LLM_SHAPES))
def test_every_method_sized_to_lora_r16(name):
    shape, sized = SHAPES[name], SIZED[name]
    report = lora_sized_report(name)
    rows = report["rows"]
    target = shape["lora"]
    assert report["target"] == rows["lora (r=16; q_proj, k_proj, v_proj, o_proj)"]["total"] == target
    concat = rows[f"concat (map_rank={sized['rank']})"]
    assert concat["total"] == concat["formula"] == sized["concat"]
    assert concat["components"] == {
        "down": shape["K"] * shape["d"] * sized["rank"],
        "up": sized["concat"] - concat["components"]["down"],
    }
    width = sized["width"]
    dwatt = rows[f"dwatt (query_bottleneck_width={width}, value_bottleneck_width={width})"]
    assert dwatt["total"] == dwatt["formula"] == sized["dwatt"]
    for row in (concat, dwatt):
        assert abs(row["vs_target"]) < 0.01  # within 1% of the LoRA
    extra = rows["extra_layers (num_extra_layers=1)"]  # one block is the least R+n can add
    assert extra["total"] == extra["formula"] == shape["block"] > 3 * target
    sized_rows = [row for row in rows if abs(rows[row]["vs_target"]) < 0.01]  # LoRA, the Concats, the DWAtts
    assert len(sized_rows) == 4 and rows[sized_rows[3]]["total"] == sized["dwatt"]  # Scaled DWAtt: DWAtt
    fitted = ("probe_ensemble", "stacked", "joint_")  # Concat's presets fitted in closed form: not sized
    assert not any(row.startswith(fitted) for row in rows)
    assert {frozenset(pair[:2]) for pair in report["flagged"]} == {
        frozenset((first, "extra_layers (num_extra_layers=1)")) for first in sized_rows
    }  # only R+n is off budget
    assert rows["average"]["total"] == 0
    assert rows["scalar_mix"]["components"] == {
        "layer_logits": shape["K"],
        "gamma": 1,
        "blend": 1,
    }  # identity
    k, d = shape["K"], shape["d"]
    assert rows["concat (default)"]["total"] == ConcatConfig().num_parameters(k, d) == k * d * d + d
    assert rows["dwatt (default)"]["total"] == DWAttConfig().num_parameters(k, d)
    assert "concat (map_rank=" in format_table(rows, reference="lora")


def test_cli_audits_a_shape_name(capsys):
    assert cli_main(["audit", "llama-3.1-8b", "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)
    assert totals["concat"] == 32 * 4096 * 4096 + 4096  # 537M: the number
    assert totals["dwatt"] == 554_350_592


def test_benchmark_script_prints_the_table(capsys):
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "llm_audit.py"
    spec = importlib.util.spec_from_file_location("llm_audit", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--shapes", "gemma-3-270m", "--lora-r", "8", "--targets", "q_proj", "v_proj"]) == 0
    out = capsys.readouterr().out
    budget = 8 * 18 * ((640 + 1024) + (640 + 256))  # 368,640
    assert f"budget {budget:,} (LoRA r=8 on q_proj, v_proj)" in out
    assert f"concat (map_rank={round((budget - 640) / (2 * 18 * 640))})" in out  # 16
    assert "FLAG: lora (r=8; q_proj, v_proj) and extra_layers (num_extra_layers=1)" in out
