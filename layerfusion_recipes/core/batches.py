"""Batches of encoded examples, whatever the task: padding to the longest example, and the label that
no loss reads (:data:`IGNORE_INDEX`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

IGNORE_INDEX = -100  # label of sub-tokens after the first and of special tokens


def collate(features: Sequence[dict[str, Any]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad a list of encoded examples to the longest one: ``(batch, seq)`` tensors.

    Keys: ``input_ids`` (padded with ``pad_id``), ``attention_mask`` and ``token_type_ids`` (0),
    ``labels`` (-100): a list per token (NER) is padded, one label per example (a sentence
    classifier) gives ``(batch,)``.

    Example:
        >>> collate([{"input_ids": [5, 6], "attention_mask": [1, 1], "labels": 1},
        ...          {"input_ids": [7], "attention_mask": [1], "labels": 0}])["input_ids"]
        tensor([[5, 6],
                [7, 0]])
    """
    width = max(len(f["input_ids"]) for f in features)
    pads = {"input_ids": pad_id, "attention_mask": 0, "token_type_ids": 0, "labels": IGNORE_INDEX}
    return {
        key: torch.tensor(
            [f[key] + [pad] * (width - len(f[key])) if isinstance(f[key], list) else f[key] for f in features]
        )
        for key, pad in pads.items()
        if key in features[0]
    }
