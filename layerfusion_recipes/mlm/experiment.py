"""``layerfusion mlm``: masked-LM perplexity (WikiText-2) with a fusion method, a regime and an LR grid.

The fused state ``h`` replaces ``z_L`` as the input of the model's LM head. In FE the encoder
is frozen and the fusion module trains with the LM head (the "vocabulary module"; an encoder
without an MLM head, like the demo's, gets a fresh random one). AdamW with the LR linear to
zero, batch 8 (paper), 15% of the tokens masked (80/10/10, BERT), evaluation masks fixed by a
seed. A run reports the test perplexity ``exp(mean masked-token cross-entropy)`` of its
checkpoint with the best dev loss.

Learning rates: each LR of the grid (``--lr``, else the regime's
:data:`~layerfusion_recipes.core.options.grids.DEFAULT_MLM_LR_GRIDS`) is one run with the same seed, data
and masks, appended as one record to ``OUTPUT/results.jsonl`` (:mod:`layerfusion_recipes.mlm.records`:
keyed by its method, regime, seed, LR and the settings that change its result,
``MlmSettings.run_settings``). Re-running skips a run whose key is there and runs it otherwise. The
LR with the lowest dev perplexity is selected
(:func:`~layerfusion_recipes.core.results.selection.select_then_repeat`; ties to the smaller; test perplexity
never chooses) and :func:`~layerfusion_recipes.mlm.records.summarize` gives the selected
LR, its dev and test perplexity, every LR's, and ``at_edge`` when the selected LR is the smallest or
largest of a grid of two or more (printed; :func:`~layerfusion_recipes.mlm.results.mlm_summary` makes
the summary of a folder's records).

Data: ``--data`` is a folder with ``train.txt``/``valid.txt``/``test.txt`` (one paragraph a
line, WikiText style) or a Hub name (``wikitext-2-raw-v1``, online only). A folder without
``train.txt`` (some WikiText-2 copies hold valid/test only) has no train split: the recipe then trains on
the first 90% of ``valid.txt``, selects the checkpoint and the LR on its last 10% (dev), reports
on ``test.txt`` and says so in its output and files. Scales with ``accelerate launch`` like ``ner``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from peft_layerfusion.layer import fused_positions
from peft_layerfusion.utils import eval_mode

from ..core.batches import IGNORE_INDEX
from ..core.engine.loop import TrainingLoop, restore, snapshot
from ..core.errors import DataSourceError, first_line
from ..core.models.models import (
    apply_regime,
    check_head_modules,
    check_length,
    load_pretrained,
    model_skeleton,
    trainable_parameters,
)
from ..core.options.locations import looks_like_hub_name
from ..core.results.records import finished_records, read_records, run_or_resume
from ..core.results.selection import select_then_repeat
from ..core.sweeps.sweep_log import peak_rss_mb
from ..core.sweeps.tasks import check_task
from ..data.readers import read_text
from .records import lr_label, results_file, run_key, summarize
from .settings import MlmSettings


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
        >>> splits = load_text_splits(text_path)  # a folder of train.txt, valid.txt and test.txt
        >>> len(splits.train), len(splits.valid), len(splits.test)  # paragraphs
        (6, 7, 8)
        >>> splits.note  # with no train.txt: 'no train split: trained on valid.txt[:90%], ...'
        'train.txt / valid.txt / test.txt'
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
            f"checkpoint and LR chosen on valid.txt[{100 * (1 - holdout):.0f}%:] (dev), "
            "perplexity reported on test.txt"
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
        >>> from transformers import BertForMaskedLM
        >>> model = BertForMaskedLM(base_model.config)
        >>> with head_on_positions(model, labels != -100):
        ...     logits = model(input_ids=ids).logits[0]  # (selected, vocab)
        >>> loss = F.cross_entropy(logits, labels[labels != -100])
        >>> logits.shape  # the 14 positions the loss reads, not 16
        torch.Size([14, 100])
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


@dataclass
class MlmData:
    """What every LR of a grid trains and evaluates on: the same blocks and the same masks.

    Args:
        tokenizer: The model's tokenizer.
        train: Training blocks ``(blocks, block_size)`` (masked anew each epoch from ``--seed``).
        valid: Dev ``(inputs, labels)``, masked once (checkpoint and LR selection).
        test: Test ``(inputs, labels)``, masked once (reported only).
        note: Where the splits came from (e.g. no train split: trained on ``valid.txt[:90%]``).
    """

    tokenizer: Any
    train: torch.Tensor
    valid: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    note: str


def prepare_data(settings: MlmSettings) -> MlmData:
    """Split, tokenize and cut ``data`` into blocks; mask dev and test with seed ``seed + 12345``.

    Args:
        settings: The grid's settings (data, holdout, model's tokenizer, block size and limits, seed,
            masking).

    Example:
        >>> settings = MlmSettings(text_path, model_path, epochs=1, block_size=16, max_train_blocks=8)
        >>> data = prepare_data(settings)
        >>> data.train.shape  # (blocks, block_size)
        torch.Size([8, 16])
    """
    from transformers import AutoTokenizer

    splits = load_text_splits(settings.data, settings.holdout)
    tokenizer = AutoTokenizer.from_pretrained(settings.model)
    train = make_blocks(tokenizer, splits.train, settings.block_size, settings.max_train_blocks)
    valid = make_blocks(tokenizer, splits.valid, settings.block_size, settings.max_eval_blocks)
    test = make_blocks(tokenizer, splits.test, settings.block_size, settings.max_eval_blocks)
    eval_masks = torch.Generator().manual_seed(settings.seed + 12345)
    valid_xy = mask_tokens(valid, tokenizer, settings.mlm_probability, eval_masks)
    test_xy = mask_tokens(test, tokenizer, settings.mlm_probability, eval_masks)
    return MlmData(tokenizer, train, valid_xy, test_xy, splits.note)


def check_model(settings: MlmSettings) -> None:
    """Refuse, before any run, a ``--block-size`` beyond the model's positions and ``--head-modules``
    naming no module of it (one line each; reads the config and the tokenizer, no weights).

    Example:
        >>> check_model(MlmSettings(text_path, model_path, block_size=1024))
        Traceback (most recent call last):
        ValueError: --block-size 1024: BertForMaskedLM embeds at most 128 positions; use --block-size <= 128
    """
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    skeleton = model_skeleton(AutoModelForMaskedLM, settings.model)
    check_length("--block-size", settings.block_size, skeleton, AutoTokenizer.from_pretrained(settings.model))
    check_head_modules(skeleton, settings.head_modules or ())


def train_at_lr(settings: MlmSettings, data: MlmData, lr: float) -> dict[str, Any]:
    """Train one run at max LR ``lr``; its record (the caller adds ``settings`` and writes it).

    Init, batch order and training masks come from ``seed``, so the runs of a grid differ only by
    their LR. ``dev_ppl`` (also ``best_valid_ppl``) is the best dev perplexity over the epochs,
    ``test_ppl`` the test perplexity of that checkpoint.

    Args:
        settings: The grid's settings (model, method, regime, epochs, batch size, seed, ...).
        data: The blocks and masks of :func:`prepare_data`, shared by every LR.
        lr: Max LR of the linear schedule.

    Example:
        >>> settings = MlmSettings(text_path, model_path, epochs=1, block_size=16, max_train_blocks=8)
        >>> train_at_lr(settings, prepare_data(settings), 1e-3)["dev_ppl"] > 1
        True
    """
    from transformers import AutoModelForMaskedLM

    model = load_pretrained(AutoModelForMaskedLM, settings.model, settings.seed)
    heads = settings.head_modules or lm_head_modules(model)
    model = apply_regime(model, settings.method, settings.regime, head_modules=tuple(heads))
    train, tokenizer = data.train, data.tokenizer
    steps_per_epoch = math.ceil(len(train) / settings.batch_size)
    groups = [{"params": trainable_parameters(model), "lr": lr}]
    loop = TrainingLoop(model, groups, settings.epochs * steps_per_epoch, settings.seed)
    model, device = loop.model, loop.device
    masks = torch.Generator().manual_seed(settings.seed)
    curve, best_loss, best_state = [], math.inf, None
    for epoch in range(1, settings.epochs + 1):
        order = torch.randperm(len(train), generator=masks)
        for start in range(0, len(train), settings.batch_size):
            inputs, labels = mask_tokens(
                train[order[start : start + settings.batch_size]], tokenizer, settings.mlm_probability, masks
            )
            if not (labels != IGNORE_INDEX).any():  # nothing to predict in this batch
                continue
            logits, targets = masked_logits(model, inputs.to(device), labels.to(device))
            loop.step(F.cross_entropy(logits, targets))
        valid_loss = masked_loss(model, *data.valid, settings.batch_size, device)
        curve.append({"epoch": epoch, "step": epoch * steps_per_epoch, "valid_ppl": math.exp(valid_loss)})
        if valid_loss < best_loss:
            best_loss, best_state = valid_loss, snapshot(loop.parameters)
    if best_state is not None:
        restore(loop.parameters, best_state)
    test_ppl = math.exp(masked_loss(model, *data.test, settings.batch_size, device))
    details = {"train_blocks": len(train), "block_size": settings.block_size, "head_modules": heads}
    return run_record(settings, lr, math.exp(best_loss), test_ppl, data.note, curve=curve, **details)


def run_record(
    settings: MlmSettings,
    lr: float,
    dev_ppl: float,
    test_ppl: float,
    note: str,
    curve: list[dict[str, Any]] | None = None,
    **details: Any,
) -> dict[str, Any]:
    """A run's record (the caller adds ``settings`` and the cost): what it ran, its dev perplexity
    (also ``best_valid_ppl``) and the test perplexity of that checkpoint, the dev curve, where the
    data came from, then ``details``.

    Example:
        >>> settings = MlmSettings(text_path, model_path, epochs=1, block_size=16, max_train_blocks=8)
        >>> run_record(settings, 1e-3, 21.4, 22.1, "train.txt / valid.txt / test.txt")["dev_ppl"]
        21.4
    """
    record = {
        "model": settings.model,
        "method": settings.method,
        "regime": settings.regime,
        "epochs": settings.epochs,
        "lr": lr,
        "dev_ppl": dev_ppl,
        "best_valid_ppl": dev_ppl,
        "test_ppl": test_ppl,
    }
    return record | ({"curve": curve} if curve is not None else {}) | {"data": note, **details}


def run_mlm(settings: MlmSettings, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every LR of the grid (skipping finished ones), select on dev; returns the summary.

    Each run is appended to ``output``/``results.jsonl`` under its key
    (:func:`~layerfusion_recipes.mlm.records.run_key` of its ``settings.run_settings``); a key already
    there is not run again. The data are prepared only if some LR has to run.

    Args:
        settings: The grid (:meth:`~layerfusion_recipes.mlm.settings.MlmSettings.from_args`).
        progress: Called with one line per LR as it finishes (e.g. ``print``).

    Example:
        >>> settings = MlmSettings(text_path, model_path, lr=[1e-3, 3e-3], epochs=1, block_size=16)
        >>> summary = run_mlm(settings)
        >>> summary["selected_lr"] in (1e-3, 3e-3), summary["test_ppl"] > 1
        (True, True)
    """
    check_model(settings)
    path = results_file(settings.output)
    check_task(read_records(path), path, "mlm")  # a results file holds one task's records
    finished = finished_records(path)
    data: list[MlmData] = []  # prepared once, only if some LR has to run

    def run(lr: float, seed: int) -> dict[str, Any]:
        stored = settings.run_settings(lr)

        def train() -> dict[str, Any]:
            data[:] = data or [prepare_data(settings)]
            started, load = time.perf_counter(), os.getloadavg()[0]
            record = {**train_at_lr(settings, data[0], lr), "settings": stored}
            return record | run_cost(started, load)

        record, trained = run_or_resume(path, finished, run_key(stored), train)
        if progress is not None:
            progress(run_line(record, path, skipped=not trained))
        return record

    _, records = select_then_repeat(settings.lr_grid(), [settings.seed], run, lambda r: r["dev_ppl"], True)
    return summarize(records)


def run_cost(started: float, load: float) -> dict[str, float | int | None]:
    """What a run cost, for its record, with the machine's state beside it (as a sweep logs it).

    Args:
        started: ``time.perf_counter()`` at the run's start.
        load: The 1-minute load average at the run's start (``os.getloadavg()[0]``).

    Returns:
        ``seconds`` of wall time since ``started``; ``peak_rss_mb``, this process's peak resident set
        so far (a grid's runs share the process, so a later run's peak covers the earlier ones');
        ``threads`` (torch's), ``cpu_count`` and ``load_1min``: was the machine shared?

    Example:
        >>> cost = run_cost(time.perf_counter(), os.getloadavg()[0])
        >>> cost["seconds"] >= 0, cost["threads"] == torch.get_num_threads()
        (True, True)
    """
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mb": peak_rss_mb()[0],
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_1min": round(load, 2),
    }


def run_line(record: dict[str, Any], path: Path, skipped: bool) -> str:
    """One line about a finished run.

    Args:
        record: The run's record.
        path: The results file it is in.
        skipped: Whether it was finished earlier (under the same settings) rather than trained now.

    Example:
        >>> record = {"lr": 1e-3, "dev_ppl": 21.4031, "test_ppl": 22.1183}
        >>> run_line(record, Path("out/results.jsonl"), skipped=False)
        'lr 0.001: dev perplexity 21.403, test perplexity 22.118 (trained; out/results.jsonl)'
    """
    how = "finished earlier with these settings, skipped" if skipped else "trained"
    return (
        f"lr {lr_label(record['lr'])}: dev perplexity {record['dev_ppl']:.3f}, "
        f"test perplexity {record['test_ppl']:.3f} ({how}; {path})"
    )


def summary_line(summary: dict[str, Any], path: Path) -> str:
    """The one-line result of a grid: the selected LR, its dev and test perplexity, the results file.

    Args:
        summary: A :func:`~layerfusion_recipes.mlm.records.summarize` result.
        path: The results file of its runs.

    Example:
        >>> from layerfusion_recipes.mlm.records import summarize
        >>> runs = [
        ...     {"lr": lr, "dev_ppl": dev, "test_ppl": dev + 1, "method": "dwatt", "regime": "fe",
        ...      "model": "m", "data": "d", "settings": {"epochs": 1}}
        ...     for lr, dev in [(3e-4, 25.0), (1e-3, 21.4031), (3e-3, 30.0)]
        ... ]
        >>> summary_line(summarize(runs), Path("out/results.jsonl"))
        'dwatt (fe): lr 0.001 selected on dev of [0.0003, 0.001, 0.003]: dev perplexity 21.403, ...'
    """
    grid = ", ".join(map(lr_label, summary["lrs"]))
    return (
        f"{summary['method']} ({summary['regime']}): lr {lr_label(summary['selected_lr'])} selected on "
        f"dev of [{grid}]: dev perplexity {summary['dev_ppl']:.3f}, test perplexity of that run "
        f"{summary['test_ppl']:.3f} ({path})"
    )


def edge_warning(summary: dict[str, Any]) -> str | None:
    """A warning line when the selected LR is at the edge of its grid, else ``None``.

    Args:
        summary: A :func:`~layerfusion_recipes.mlm.records.summarize` result (``at_edge``,
            ``selected_lr``, ``lrs``).

    Example:
        >>> edge_warning({"at_edge": True, "selected_lr": 3e-3, "lrs": [3e-4, 1e-3, 3e-3]})
        'warning: the selected lr 0.003 is the largest of the grid: the best LR may lie above it; widen --lr'
    """
    if not summary["at_edge"]:
        return None
    largest = summary["selected_lr"] == summary["lrs"][-1]
    side, beyond = ("largest", "above") if largest else ("smallest", "below")
    return (
        f"warning: the selected lr {lr_label(summary['selected_lr'])} is the {side} of the grid: "
        f"the best LR may lie {beyond} it; widen --lr"
    )
