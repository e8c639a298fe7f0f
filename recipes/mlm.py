"""``layerfusion mlm``: masked-LM perplexity (WikiText-2) with a fusion method and a regime.

The fused state ``h`` replaces ``z_L`` as the input of the model's LM head. In FE the encoder
is frozen and the fusion module trains with the LM head (the "vocabulary module"; an encoder
without an MLM head, like the demo's, gets a fresh random one). AdamW with the LR linear to
zero, batch 8 (paper), 15% of the tokens masked (80/10/10, BERT), evaluation masks fixed by a
seed. Reported: test perplexity ``exp(mean masked-token cross-entropy)`` of the checkpoint
with the best validation loss.

Data: ``--data`` is a folder with ``train.txt``/``valid.txt``/``test.txt`` (one paragraph a
line, WikiText style) or a Hub name (``wikitext-2-raw-v1``, online only). Offline there is
no train split (``../shared/data/wikitext-2`` has valid/test only): the recipe then trains on
the first 90% of ``valid.txt``, selects the checkpoint on its last 10%, reports on
``test.txt`` and says so in its output. Scales with ``accelerate launch`` like ``ner``.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from peft_layerfusion.layer import fused_positions
from peft_layerfusion.utils import atomic_write_json, eval_mode

from .data import IGNORE_INDEX, read_text
from .datasets_io import looks_like_hub_name
from .demo import demo_model_path
from .errors import DataSourceError, first_line
from .loop import TrainingLoop, restore, snapshot
from .models import METHOD_NAMES, REGIME_NAMES, apply_regime, load_pretrained, trainable_parameters
from .options import check_names


@dataclass
class TextSplits:
    """Paragraphs of train / validation / test, and how they were obtained."""

    train: list[str]
    valid: list[str]
    test: list[str]
    note: str


def load_text_splits(source: str, holdout: float = 0.1) -> TextSplits:
    """Text splits from a folder (``train``/``valid``/``test`` ``.txt``) or a Hub name.

    Without a train file the first ``1 - holdout`` of ``valid`` trains and the rest validates.

    Example:
        >>> splits = load_text_splits("../shared/data/wikitext-2")
        >>> splits.note  # 'no train split: trained on valid.txt[:90%], ...'
    """
    folder = Path(source)
    if folder.is_dir():
        missing = [name for name in ("valid.txt", "test.txt") if not (folder / name).is_file()]
        if missing:
            raise DataSourceError(
                f"{folder}: needs valid.txt and test.txt (train.txt optional), missing {missing}, "
                f"found {sorted(os.listdir(folder))}"
            )
        valid, test = read_text(folder / "valid.txt"), read_text(folder / "test.txt")
        if (folder / "train.txt").is_file():
            return TextSplits(
                read_text(folder / "train.txt"), valid, test, "train.txt / valid.txt / test.txt"
            )
        cut = max(1, round(len(valid) * (1 - holdout)))
        note = (
            f"no train split in {folder}: trained on valid.txt[:{100 * (1 - holdout):.0f}%], "
            f"checkpoint chosen on valid.txt[{100 * (1 - holdout):.0f}%:], perplexity reported on test.txt"
        )
        return TextSplits(valid[:cut], valid[cut:], test, note)
    if not looks_like_hub_name(source):
        raise DataSourceError(f"--data {source!r}: no such file or directory")
    import datasets

    try:
        raw = datasets.load_dataset("wikitext", source)
    except Exception as error:  # offline, unknown config...
        raise DataSourceError(
            f"--data {source!r}: no such directory, and not a loadable wikitext config of the Hub "
            f"({first_line(error)})"
        ) from error

    def lines(split: str) -> list[str]:
        return [t.strip() for t in raw[split]["text"] if t.strip()]

    return TextSplits(
        lines("train"), lines("validation"), lines("test"), f"Hub {source}: train/validation/test"
    )


def make_blocks(tokenizer, paragraphs: list[str], block_size: int, limit: int | None = None) -> torch.Tensor:
    """Concatenate the token ids and cut into ``[CLS] ... [SEP]`` blocks: ``(blocks, block_size)``."""
    ids: list[int] = []
    for paragraph in paragraphs:
        ids += tokenizer(paragraph, add_special_tokens=False)["input_ids"]
        if limit is not None and len(ids) >= limit * (block_size - 2):
            break
    body = block_size - 2
    count = len(ids) // body if limit is None else min(limit, len(ids) // body)
    if count == 0:
        raise ValueError(f"not enough text for one block of {block_size} tokens")
    chunks = torch.tensor(ids[: count * body]).view(count, body)
    cls = torch.full((count, 1), tokenizer.cls_token_id)
    sep = torch.full((count, 1), tokenizer.sep_token_id)
    return torch.cat([cls, chunks, sep], dim=1)


def mask_tokens(
    ids: torch.Tensor, tokenizer, probability: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking: ``probability`` of the non-special tokens predicted (80% [MASK], 10% random, 10% kept).

    Returns ``(inputs, labels)`` with ``labels = -100`` where nothing is predicted.
    """
    special = torch.tensor(
        [[t in tokenizer.all_special_ids for t in row] for row in ids.tolist()], dtype=torch.bool
    )
    chosen = (torch.rand(ids.shape, generator=generator) < probability) & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    roll = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (roll < 0.8)] = tokenizer.mask_token_id
    random_ids = torch.randint(len(tokenizer), ids.shape, generator=generator)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = random_ids[swap]
    return inputs, labels


def lm_head_modules(model: nn.Module) -> list[str]:
    """Top-level modules outside the base model: the LM head ("vocabulary module")."""
    return [name for name, _ in model.named_children() if name != getattr(model, "base_model_prefix", "")]


@contextmanager
def head_on_positions(model: nn.Module, mask: torch.Tensor) -> Iterator[None]:
    """Inside, only the ``mask`` positions reach the LM head (and the fusion runs only there).

    The loss reads 15% of the positions; the vocabulary projection (``d x |V|`` per position)
    is the largest cost of a masked-LM step, so the other 85% are dropped at the backbone's
    output. Logits then come out as ``(1, selected, vocab)``, in the order of ``mask.nonzero()``.

    Example:
        >>> with head_on_positions(model, labels != -100):
        ...     logits = model(input_ids=inputs).logits[0]  # (selected, vocab)
        >>> loss = F.cross_entropy(logits, labels[labels != -100])
    """
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = hf_model.base_model  # e.g. BertForMaskedLM.bert

    def selected(module: nn.Module, args: tuple, output):
        if isinstance(output, torch.Tensor):
            return output[mask].unsqueeze(0)
        first = output[0][mask].unsqueeze(0)  # (1, selected, d)
        if isinstance(output, tuple):
            return (first, *output[1:])
        output["last_hidden_state"] = first  # a ModelOutput
        return output

    handle = backbone.register_forward_hook(selected)
    try:
        with fused_positions(model, mask):
            yield
    finally:
        handle.remove()


def masked_logits(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(selected, vocab)`` logits at the predicted positions and their ``(selected,)`` targets."""
    mask = labels != IGNORE_INDEX  # (batch, seq)
    with head_on_positions(model, mask):
        logits = model(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits
    return logits[0], labels[mask]


@torch.no_grad()
def masked_loss(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int, device
) -> float:
    """Mean cross-entropy over the predicted tokens (the log of the perplexity)."""
    total, count = 0.0, 0
    with eval_mode(model):
        for start in range(0, len(inputs), batch_size):
            rows = slice(start, start + batch_size)
            x, y = inputs[rows].to(device), labels[rows].to(device)
            logits, targets = masked_logits(model, x, y)  # (selected, vocab), (selected,)
            total += F.cross_entropy(logits, targets, reduction="sum").item()
            count += len(targets)
    return total / max(count, 1)


def run_mlm(args: argparse.Namespace) -> dict:
    """Train and evaluate; returns the result record (also written to ``--output``)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer


    check_names("method", [args.method], METHOD_NAMES)
    check_names("regime", [args.regime], REGIME_NAMES)
    model_name = args.model or demo_model_path()
    splits = load_text_splits(args.data, args.holdout)
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    train = make_blocks(tokenizer, splits.train, args.block_size, args.max_train_blocks)
    valid = make_blocks(tokenizer, splits.valid, args.block_size, args.max_eval_blocks)
    test = make_blocks(tokenizer, splits.test, args.block_size, args.max_eval_blocks)
    eval_masks = torch.Generator().manual_seed(args.seed + 12345)
    valid_xy = mask_tokens(valid, tokenizer, args.mlm_probability, eval_masks)
    test_xy = mask_tokens(test, tokenizer, args.mlm_probability, eval_masks)

    model = load_pretrained(AutoModelForMaskedLM, model_name, args.seed)
    heads = args.head_modules or lm_head_modules(model)
    model = apply_regime(model, args.method, args.regime, head_modules=tuple(heads))
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    lr = args.lr if args.lr is not None else (1e-3 if args.regime == "fe" else 5e-5)
    groups = [{"params": trainable_parameters(model), "lr": lr}]
    loop = TrainingLoop(model, groups, args.epochs * steps_per_epoch, args.seed)
    model, device = loop.model, loop.device
    masks = torch.Generator().manual_seed(args.seed)
    curve, best_loss, best_state = [], math.inf, None
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(train), generator=masks)
        for start in range(0, len(train), args.batch_size):
            inputs, labels = mask_tokens(
                train[order[start : start + args.batch_size]], tokenizer, args.mlm_probability, masks
            )
            if not (labels != IGNORE_INDEX).any():  # nothing to predict in this batch
                continue
            logits, targets = masked_logits(model, inputs.to(device), labels.to(device))
            loop.step(F.cross_entropy(logits, targets))
        valid_loss = masked_loss(model, *valid_xy, args.batch_size, device)
        curve.append({"epoch": epoch, "step": epoch * steps_per_epoch, "valid_ppl": math.exp(valid_loss)})
        if valid_loss < best_loss:
            best_loss, best_state = valid_loss, snapshot(loop.parameters)
    if best_state is not None:
        restore(loop.parameters, best_state)
    test_ppl = math.exp(masked_loss(model, *test_xy, args.batch_size, device))
    record = {
        "model": model_name,
        "method": args.method,
        "regime": args.regime,
        "epochs": args.epochs,
        "lr": lr,
        "best_valid_ppl": math.exp(best_loss),
        "test_ppl": test_ppl,
        "curve": curve,
        "data": splits.note,
        "train_blocks": len(train),
        "block_size": args.block_size,
        "head_modules": heads,
    }
    atomic_write_json(Path(args.output) / f"mlm-{args.method}-{args.regime}.json", record)
    return record


def mlm_main(args: argparse.Namespace) -> int:
    record = run_mlm(args)
    print(f"data: {record['data']}")
    print(f"{record['method']} ({record['regime']}): best valid perplexity {record['best_valid_ppl']:.3f}")
    print(f"test perplexity of that checkpoint: {record['test_ppl']:.3f}")
    print(f"written to {Path(args.output) / f'mlm-{args.method}-{args.regime}.json'}")
    return 0
