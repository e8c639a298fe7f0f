"""Padding a batch: token labels padded with IGNORE_INDEX, one label per example kept as it is."""

from __future__ import annotations

import torch

from layerfusion_recipes.core.batches import IGNORE_INDEX, collate


def test_token_labels_are_padded_with_the_ignored_label():
    batch = collate(
        [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [1, 2, 0]},
         {"input_ids": [8], "attention_mask": [1], "labels": [3]}],
        pad_id=9,
    )  # fmt: skip
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[1, 2, 0], [3, IGNORE_INDEX, IGNORE_INDEX]]
    assert "token_type_ids" not in batch


def test_one_label_per_example_gives_a_vector():
    batch = collate([{"input_ids": [5, 6], "labels": 1}, {"input_ids": [7], "labels": 0}])
    assert torch.equal(batch["labels"], torch.tensor([1, 0]))  # (batch,)
