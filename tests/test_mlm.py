"""Masked LM recipe: splits without a train file, masking, a smoke run that lowers perplexity."""

from __future__ import annotations

import json
import math

import pytest
import torch
from layerfusion_recipes.cli import main
from layerfusion_recipes.mlm import load_text_splits, make_blocks, mask_tokens
from layerfusion_recipes.toy import write_tiny_model

TEXT = " = Heading = \n\n" + "\n".join(
    "alice went to paris and bob met alice in london today ." for _ in range(60)
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlm")
    (root / "wt").mkdir()
    (root / "wt" / "valid.txt").write_text(TEXT)
    (root / "wt" / "test.txt").write_text(TEXT)
    return write_tiny_model(root / "model"), str(root / "wt")


def test_without_train_split_valid_is_cut_and_said(tiny):
    splits = load_text_splits(tiny[1], holdout=0.1)
    assert (len(splits.train), len(splits.valid), len(splits.test)) == (55, 6, 61)
    assert "no train split" in splits.note and "test.txt" in splits.note


def test_blocks_and_bert_masking(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny[0])
    blocks = make_blocks(tokenizer, ["alice went to paris"] * 40, block_size=10)
    assert blocks.shape == (20, 10)  # 160 tokens, 8 per block
    assert (blocks[:, 0] == tokenizer.cls_token_id).all()
    inputs, labels = mask_tokens(blocks, tokenizer, 0.5, torch.Generator().manual_seed(0))
    chosen = labels != -100
    assert not chosen[:, 0].any() and not chosen[:, -1].any()  # specials never predicted
    assert 0.4 < chosen[:, 1:-1].float().mean() < 0.6
    assert (labels[chosen] == blocks[chosen]).all() and (inputs[~chosen] == blocks[~chosen]).all()
    masked = (inputs[chosen] == tokenizer.mask_token_id).float().mean()
    assert 0.65 < masked < 0.95


def test_mlm_cli_trains_fusion_and_lm_head(tiny, tmp_path, capsys):
    model, data = tiny
    argv = [
        "mlm",
        "--model",
        model,
        "--data",
        data,
        "--method",
        "dwatt",
        "--epochs",
        "3",
        "--lr",
        "0.01",
        "--block-size",
        "16",
        "--output",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "no train split" in out and "test perplexity" in out
    record = json.loads((tmp_path / "mlm-dwatt-fe.json").read_text())
    assert record["head_modules"] == ["cls"]
    first, best = record["curve"][0]["valid_ppl"], record["best_valid_ppl"]
    assert best == min(p["valid_ppl"] for p in record["curve"])
    assert math.isfinite(record["test_ppl"]) and record["test_ppl"] < 20 < 76  # vocabulary of 76: chance ~76
    assert best <= first


@pytest.mark.parametrize("method", ["dwatt", "concat", "extra_layers", "none"])
def test_masked_logits_equal_the_full_logits_at_the_predicted_positions(tiny, method):
    from layerfusion_recipes.mlm import masked_logits
    from layerfusion_recipes.models import apply_regime
    from transformers import AutoModelForMaskedLM

    torch.manual_seed(0)
    model = apply_regime(AutoModelForMaskedLM.from_pretrained(tiny[0]), method, "fe", head_modules=("cls",))
    model.eval()
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randint(5, 40, (3, 9), generator=generator)
    labels = torch.where(torch.rand(3, 9, generator=generator) < 0.3, inputs, torch.full_like(inputs, -100))
    with torch.no_grad():
        full = model(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits  # (3, 9, vocab)
        logits, targets = masked_logits(model, inputs, labels)
    chosen = labels != -100
    assert logits.shape == (int(chosen.sum()), full.shape[-1]) and torch.equal(targets, labels[chosen])
    torch.testing.assert_close(logits, full[chosen], atol=1e-5, rtol=1e-5)
