"""Feature cache for the frozen-encoder (FE) regime, shared by the tasks that replay an encoder.

In FE every pretrained weight is frozen and (with the encoder in eval mode) the block outputs
``z_1 .. z_L`` of a sentence never change, so they are computed once per sentence and kept,
keyed by the encoder's content (weights, config, tokenizer: see
:func:`~layerfusion_recipes.core.cache.cache_files.feature_key`) + max length + the sentence's token ids
(shared by every method, trial and shot size of a sweep). ``z_0`` is not kept: the embeddings run
in every replay.

**Only what is read.** The task tells the cache which positions of a sentence it reads
(:class:`KeptPositions`): NER with token-wise methods reads the labelled positions (the first
sub-word of each word), a sentence classifier its pooled position (:data:`FIRST_POSITION` for a
BERT-like encoder, :data:`LAST_POSITION` for a decoder) or :data:`ALL_POSITIONS` for mean pooling;
a method that attends over the sentence (R+n) needs :data:`ALL_POSITIONS`. Only those are stored,
once, as ``(kept positions, L, d)`` per sentence; a batch is padded on the fly
(:meth:`FeatureCache.batch`: zeros wherever nothing was kept, one block at a time), never kept a second time.

**Out of RAM when asked.** With a ``directory`` each fill writes the sentences it computed as
safetensors shards (every :data:`FLUSH_BYTES`, atomically) and then serves them memory-mapped from
those files, so several workers share one copy through the page cache and the process's memory
holds what it touches; every fill first reads the shards other workers wrote since, so nothing is
computed or written twice; a damaged shard is reported, removed and recomputed, and temporary files
of crashed writers are removed (see :mod:`layerfusion_recipes.core.cache.cache_files`).

**Half precision when asked.** ``dtype="bfloat16"`` or ``"float16"`` stores the states in 2 bytes
instead of 4 (half the memory); they are cast back to float32 when a batch is built, so training
runs in float32 on rounded features (the result changes a little: see the README). The dtype is
part of the key: a result never comes from a file of another precision.

**A memory model** (:class:`CachePlan`): the bytes a cache will hold, from its sentences' kept
positions, the blocks and the width, before anything is computed; with the training state of the
stacked LR candidates (:class:`TrainingPlan`) and the process's own :data:`PROCESS_BYTES`, what a
sweep's process peaks at (:func:`memory_check`); :func:`available_memory` is what this process may
have.

Training then *replays* the cache through the real model: inside :meth:`FeatureCache.replay`
every encoder block returns its cached output instead of computing it. The embeddings, the
capture hooks, the fusion module (with the last block's real call arguments, so R+n's extra
blocks get the real attention mask) and the head run as usual, so the cached path is the
uncached one minus the encoder's blocks.

**The blocks' other outputs.** A block may return more than its state, for the blocks after it: T5's
blocks return the relative position bias, which block 0 computes and each block hands to the next (the
extra block of R+n gets it from the last block's call). What each block returns is learned from one
real forward of one sentence (:class:`BlockOutputs`): a replayed block hands on the argument it
received, and a block that computes something a later block reads runs for real where the last
block's call is read (``block_calls``: R+n), its own state still the cached one. The same sentence
replayed must give the last block the call of the real forward; an encoder whose replay cannot
(:attr:`BlockOutputs.exact_calls`) trains R+n without the cache, saying why in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from peft_layerfusion.discovery import EncoderBlocks, hidden_size_of
from peft_layerfusion.hooks import first_tensor
from peft_layerfusion.utils import eval_mode

from ..memory import release_freed_memory
from ..options.options import CACHE_DTYPES, DEFAULT_CACHE_DTYPE, check_cache_dtype
from .cache_files import (
    SHARD_SUFFIX,
    CorruptShardError,
    SentenceKey,
    drop_mapped_pages,
    feature_key,
    mapped_range,
    read_shard,
    remove_stale_temp_files,
    write_shard,
)

# storage dtypes of the cached states (``--cache-dtype``); float32 is exact, the others round
STORAGE_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in CACHE_DTYPES}
FLUSH_BYTES = 256 * 2**20  # with a directory, a fill writes a shard (and maps it) every 256 MiB of states
# with a directory, the shards' pages leave the process after every 256 MiB of states served from them
MAPPED_BYTES_HELD = 256 * 2**20
# what a sweep's process holds before any cache: Python, torch, transformers, the data, the tokenizer
# (about 0.6 GB measured on the CoNLL-2003 sweeps, benchmarks/README.md)
PROCESS_BYTES = 600 * 10**6
# what training holds per trainable parameter of each stacked LR candidate: its values, gradient and
# best-epoch snapshot (4 B each), AdamW's two moments (8 B); the stacked values a step reads are views
# of the values (runner.StackedView), not a copy
TRAINING_BYTES_PER_PARAMETER = 20

Feature = Mapping[str, Sequence[int]]  # an encoded sentence: input_ids (+ labels, ...)


@dataclass(frozen=True)
class KeptPositions:
    """Which positions of a sentence the cache keeps: the ones its task reads.

    Args:
        name: Short name, part of the cache key (a cache of other positions is another folder).
        select: An encoded sentence -> the positions to keep, ascending.

    Example:
        >>> FIRST_POSITION.of({"input_ids": [101, 7592, 102]})
        (0,)
    """

    name: str
    select: Callable[[Feature], Sequence[int]]

    def of(self, feature: Feature) -> tuple[int, ...]:
        """The kept positions of ``feature``."""
        return tuple(self.select(feature))


def _every_position(feature: Feature) -> range:
    return range(len(feature["input_ids"]))


def _first_position(feature: Feature) -> tuple[int, ...]:
    return (0,)


def _last_position(feature: Feature) -> tuple[int, ...]:
    return (len(feature["input_ids"]) - 1,)


ALL_POSITIONS = KeptPositions("all", _every_position)  # R+n, mean pooling: every position
FIRST_POSITION = KeptPositions("first", _first_position)  # [CLS] pooling of a BERT-like encoder
LAST_POSITION = KeptPositions("last", _last_position)  # a decoder's last real token (unpadded sentences)


def storage_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``--cache-dtype`` name.

    Raises:
        ValueError: naming the value and the allowed names
            (:func:`~layerfusion_recipes.core.options.options.check_cache_dtype`).

    Example:
        >>> storage_dtype("bfloat16")
        torch.bfloat16
    """
    return STORAGE_DTYPES[check_cache_dtype(name)]


@dataclass(frozen=True)
class CachePlan:
    """The bytes a feature cache will hold, known before anything is computed.

    Args:
        sentences: Distinct sentences cached.
        positions: Their kept positions, summed.
        num_blocks: Encoder blocks ``L`` (one state each; ``z_0`` is not kept).
        width: Width ``d`` of a state.
        dtype: Storage dtype name (:data:`STORAGE_DTYPES`).
        kept: The :class:`KeptPositions` name.
        model_bytes: Bytes of the encoder's weights (the model that fills the cache).

    Example:
        >>> CachePlan(4000, 60000, 12, 768, "float32", "labelled").nbytes
        2211840000
    """

    sentences: int
    positions: int
    num_blocks: int
    width: int
    dtype: str
    kept: str
    model_bytes: int = 0

    @property
    def nbytes(self) -> int:
        """``positions x num_blocks x width x`` bytes per element."""
        return self.positions * self.num_blocks * self.width * storage_dtype(self.dtype).itemsize

    def with_dtype(self, dtype: str) -> CachePlan:
        """The same cache stored in ``dtype``."""
        return dataclasses.replace(self, dtype=dtype)

    def describe(self) -> str:
        """One line: the bytes and what they come from.

        Example:
            >>> CachePlan(4000, 60000, 12, 768, "float32", "labelled").describe()[-43:]
            'x 12 blocks x 768 x 4 B (float32) = 2.21 GB'
        """
        itemsize = storage_dtype(self.dtype).itemsize
        text = (
            f"feature cache: {self.sentences} sentences, {self.positions} {self.kept} positions x "
            f"{self.num_blocks} blocks x {self.width} x {itemsize} B ({self.dtype}) = "
            f"{gigabytes(self.nbytes)}"
        )
        return text + (f", model {gigabytes(self.model_bytes)}" if self.model_bytes else "")


@dataclass(frozen=True)
class TrainingPlan:
    """The training state of one pass of stacked LR candidates of the largest method of a sweep.

    Args:
        method: The method whose candidates hold the most (the largest trainable part).
        parameters: ``P``, the trainable parameters of one candidate (fusion module + head).
        candidates: ``K``, the LRs of a cell.
        per_pass: Candidates trained together in one pass (:func:`candidates_per_pass`; ``K``: one
            pass; 1 for a method whose LRs run one after another).

    Example:
        >>> TrainingPlan("dwatt", 8_330_000, 7, 7).nbytes  # 20 B per parameter of each candidate
        1166200000
    """

    method: str
    parameters: int
    candidates: int
    per_pass: int

    @property
    def nbytes(self) -> int:
        """``per_pass x P x`` :data:`TRAINING_BYTES_PER_PARAMETER`."""
        return self.per_pass * self.parameters * TRAINING_BYTES_PER_PARAMETER

    def describe(self) -> str:
        """One clause: the bytes and what they come from.

        Example:
            >>> TrainingPlan("dwatt", 8_330_000, 7, 3).describe()
            'training 3 of 7 LRs per pass x 8.33M dwatt parameters x 20 B = 0.50 GB'
        """
        return (
            f"training {self.per_pass} of {self.candidates} LRs per pass x {self.parameters / 1e6:.2f}M "
            f"{self.method} parameters x {TRAINING_BYTES_PER_PARAMETER} B = {gigabytes(self.nbytes)}"
        )


def candidates_per_pass(count: int, parameters: int, budget: float | None) -> int:
    """How many of ``count`` stacked LR candidates of ``parameters`` trainable parameters each train in
    one pass within ``budget`` bytes of training state (at least one; ``None``: all of them).

    Example:
        >>> candidates_per_pass(7, 8_330_000, 0.6e9), candidates_per_pass(7, 8_330_000, None)
        (3, 7)
    """
    if budget is None:
        return count
    per_candidate = TRAINING_BYTES_PER_PARAMETER * max(1, parameters)
    return max(1, min(count, int(budget // per_candidate)))


def plan_cache(
    base_model: nn.Module,
    located: EncoderBlocks,
    positions: KeptPositions,
    dtype: str,
    features: Sequence[Feature],
) -> CachePlan:
    """The :class:`CachePlan` of a cache of ``base_model`` holding ``features``, computing nothing.

    Example:
        >>> from peft_layerfusion.discovery import find_encoder_blocks
        >>> base = experiment.load_model(seed=0)  # the tiny BERT token classifier (3 blocks, width 32)
        >>> features = experiment.dev + experiment.test  # encoded sentences
        >>> plan = plan_cache(base, find_encoder_blocks(base), ALL_POSITIONS, "float32", features)
        >>> plan.sentences, plan.positions, plan.nbytes  # nbytes: positions x 3 blocks x 32 x 4 B
        (24, 207, 79488)
    """
    keys = {(tuple(feature["input_ids"]), positions.of(feature)) for feature in features}
    return CachePlan(
        sentences=len(keys),
        positions=sum(len(kept) for _, kept in keys),
        num_blocks=located.num_blocks,
        width=hidden_size_of(base_model, located),
        dtype=dtype,
        kept=positions.name,
        model_bytes=sum(parameter.nbytes for parameter in base_model.parameters()),
    )


def resident_limit(plan: CachePlan, training: TrainingPlan | None = None, mapped: bool = False) -> int:
    """What one process of a sweep holds resident by the memory line (:func:`memory_check`):
    :data:`PROCESS_BYTES`, the model, the training state of one pass of stacked candidates and the
    states, unless they are ``mapped`` from a cache directory (their pages leave the process as it
    reads them: :class:`FeatureCache`). Above it, a run gives
    the heap's freed pages back after a training step or evaluation batch, not only after every
    epoch and evaluation (``TaskSettings.resident_limit``).

    Why: glibc serves each step's tensors from holes its heap keeps, and the holes a step touches
    change with the batch, so without a trim the resident memory grows over a few steps far above
    what is in use. Trimming after every step keeps it down but makes every next step fault its pages
    in again; above the line only, a run trims where it matters. One 13 x 768 DWAtt cell of seven
    candidates (CoNLL-2003, N = 32, dev 1000, the full test split; memory line 4.44 GB): peak 5.38 GB
    without step trims, 4.98 GB with a trim above the line (a third of the steps) in 1.03x the time.
    Where the process sits at the line between steps (a small cache: the README's demo, line 1.05 GB),
    many steps trim: 14 M more page faults and 23 s more system time (4% of its CPU time) for
    0.09 GB less.

    Example:
        >>> plan = CachePlan(sentences=4379, positions=62903, num_blocks=12, width=768, dtype="float32",
        ...                  kept="labelled", model_bytes=440_000_000)  # CoNLL-2003 train on a BERT-base
        >>> training = TrainingPlan("dwatt", 7_740_000, 7, 7)
        >>> resident_limit(plan, training) > plan.nbytes + training.nbytes  # plus the model and the process
        True
    """
    trained = training.nbytes if training is not None else 0
    return held_by_one_process(plan.model_bytes, trained, 0 if mapped else plan.nbytes)


def held_by_one_process(model_bytes: int, trained: int, states: int) -> int:
    """The memory line's bytes for one process: :data:`PROCESS_BYTES`, the model, the training state
    and the states it holds (``0`` where they are mapped from a cache directory)."""
    return PROCESS_BYTES + model_bytes + trained + states


def memory_check(
    plan: CachePlan,
    copies: int,
    mapped: bool,
    available: int | None,
    training: TrainingPlan | None = None,
) -> tuple[str, str | None]:
    """What a run holding ``plan`` in ``copies`` processes peaks at, against the memory ``available``.

    Each process holds :data:`PROCESS_BYTES`, the model and the training state of one pass of
    stacked candidates (``training``); without ``mapped`` (a cache directory) each also holds the
    states, with it they are mapped from the shards and shared through the page cache (one copy,
    which the kernel pages from disk when memory is short: not counted; each process lets the pages
    go after every :data:`MAPPED_BYTES_HELD` it reads).

    Args:
        plan: The cache's :class:`CachePlan`.
        copies: Processes that each hold a cache (workers x processes of a launch).
        mapped: The states are memory-mapped from a cache directory.
        available: Bytes available (:func:`available_memory`; ``None``: unknown, never refused).
        training: The largest method's pass of stacked LR candidates (``None``: not counted).

    Returns:
        ``(line, refusal)``: one line saying the bytes, and ``None`` or a one-line refusal naming the
        options that would make it fit.

    Example:
        >>> plan = CachePlan(sentences=4379, positions=62903, num_blocks=12, width=768, dtype="float32",
        ...                  kept="labelled", model_bytes=440_000_000)  # CoNLL-2003 train on a BERT-base
        >>> training = TrainingPlan("dwatt", 7_740_000, 7, 7)
        >>> line, refusal = memory_check(plan, 2, mapped=False, available=16 * 10**9, training=training)
        >>> refusal is None
        True
    """
    train = training.nbytes if training is not None else 0

    def peak(states: int, workers: int = copies, trained: int = train) -> int:
        return workers * held_by_one_process(plan.model_bytes, trained, 0 if mapped else states)

    needed = peak(plan.nbytes)
    held = (
        f"states memory-mapped from the cache directory, one copy for {copies} process(es); "
        f"{copies} process(es) hold {gigabytes(needed)} besides"
        if mapped
        else f"{copies} process(es) hold {gigabytes(needed)} in memory"
    )
    free = "unknown memory available" if available is None else f"{gigabytes(available)} available"
    parts = [plan.describe()] + ([training.describe()] if training is not None else [])
    line = f"{'; '.join(parts)}; process {gigabytes(PROCESS_BYTES)}; {held}; {free}"
    if available is None or needed <= available:
        return line, None
    options = []
    half = peak(plan.with_dtype("bfloat16").nbytes)
    if plan.dtype == DEFAULT_CACHE_DTYPE and not mapped and half <= available:
        options.append(f"--cache-dtype bfloat16 ({gigabytes(half)})")
    if copies > 1 and peak(plan.nbytes, workers=1) <= available:
        options.append(f"--workers 1 ({gigabytes(peak(plan.nbytes, workers=1))})")
    if training is not None and training.per_pass > 1:
        left = available // copies - peak(plan.nbytes, workers=1, trained=0)
        fewer = min(training.per_pass - 1, candidates_per_pass(training.per_pass, training.parameters, left))
        budget = math.ceil(fewer * training.parameters * TRAINING_BYTES_PER_PARAMETER / 1e7) / 100  # GB
        passes = dataclasses.replace(
            training, per_pass=candidates_per_pass(training.per_pass, training.parameters, budget * 1e9)
        )
        if left > 0 and peak(plan.nbytes, trained=passes.nbytes) <= available:
            options.append(
                f"--train-memory {budget:.2f} (passes of {passes.per_pass} LR candidates, "
                f"{gigabytes(peak(plan.nbytes, trained=passes.nbytes))})"
            )
    if not mapped:
        options.append("--cache-dir DIR (memory-mapped, shared by the workers, paged from disk when short)")
        options.append("fewer evaluation sentences (--dev-limit, --test-limit)")
    what = "; ".join(part.removeprefix("feature cache: ") for part in parts)
    refusal = (
        f"the sweep needs {gigabytes(needed)} in memory ({what}; process {gigabytes(PROCESS_BYTES)}; "
        f"x {copies} process(es)) but {gigabytes(available)} is available; it fits with "
        f"{', '.join(options)}{' or ' if options else ''}--no-cache"
    )
    return line, refusal


def gigabytes(nbytes: float) -> str:
    """``nbytes`` in GB (10**9 bytes), two decimals: ``'2.21 GB'``."""
    return f"{nbytes / 1e9:.2f} GB"


def available_memory() -> int | None:
    """Bytes this process can still get: the smaller of the machine's ``MemAvailable`` and what its
    cgroup (container) limit leaves; ``None`` where neither can be read (not Linux).

    Example:
        >>> available_memory() > 0  # e.g. 21474836480
        True
    """
    limits = []
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        current = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit != "max":
            limits.append(int(limit) - int(current))
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None


def encoder_inputs(features: Sequence[Feature]) -> dict[str, torch.Tensor]:
    """What the encoder reads of ``features``, padded with zeros: ``input_ids``, ``attention_mask`` and,
    where they carry them, ``token_type_ids`` (a BERT pair's segments), ``(batch, seq)`` each.

    Example:
        >>> inputs = encoder_inputs(experiment.dev[:2])
        >>> sorted(inputs), inputs["input_ids"].shape[0]
        (['attention_mask', 'input_ids'], 2)
    """
    ids, mask = padded_inputs(features)
    return {"input_ids": ids, "attention_mask": mask, **padded_token_types(features)}


def padded_inputs(features: Sequence[Feature]) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` of ``features``, padded with zeros: ``(batch, seq)`` each."""
    ids = pad_sequence([torch.tensor(f["input_ids"]) for f in features], batch_first=True)
    mask = pad_sequence([torch.tensor(f["attention_mask"]) for f in features], batch_first=True)
    return ids, mask


def padded_token_types(features: Sequence[Feature]) -> dict[str, torch.Tensor]:
    """``{"token_type_ids": (batch, seq)}`` of ``features`` padded with zeros where they carry token
    types (a BERT sentence pair's segments change every state), else ``{}``."""
    if "token_type_ids" not in features[0]:
        return {}
    types = pad_sequence([torch.tensor(f["token_type_ids"]) for f in features], batch_first=True)
    return {"token_type_ids": types}


def flat_positions(
    keys: Sequence[SentenceKey], width: int, rows: Sequence[int] | None = None
) -> torch.Tensor:
    """Where the kept positions of ``keys`` are in a ``(batch, width)`` batch flattened: ``(kept,)``.

    Args:
        keys: Sentences of the batch.
        width: Its padded length.
        rows: The row of each sentence (default: ``0, 1, ...``).

    Example:
        >>> flat_positions([((5, 6, 7), (1, 2)), ((8, 9), (0,))], width=3)
        tensor([1, 2, 3])
    """
    rows = range(len(keys)) if rows is None else rows
    return torch.tensor([row * width + p for row, (_, kept) in zip(rows, keys, strict=True) for p in kept])


class _KeptRows:
    """Forward hooks that copy the rows of ``z_1 .. z_L`` at :attr:`rows` (positions of the flattened
    batch) as the encoder computes them: ``z_i`` is the output of block ``i`` for ``i < L`` (the input
    of the next one) and ``z_L`` the encoder's output (the last block's, before the final norm, in a
    pre-norm stack), as :class:`~peft_layerfusion.hooks.BlockCapture`
    captures them; each full state is freed as soon as the next block has read it.

    Args:
        located: The encoder's blocks.
        dtype: Storage dtype of the copies.
    """

    def __init__(self, located: EncoderBlocks, dtype: torch.dtype) -> None:
        self.num_blocks, self.dtype = located.num_blocks, dtype
        self.rows: torch.Tensor = torch.empty(0, dtype=torch.long)
        self.kept: torch.Tensor | None = None  # (kept, L, d) of the batch being computed
        # z_L: the last block's output where a final norm F reads it (a pre-norm stack: the container
        # returns F(z_L), and a replay runs F on the cached z_L); else the container's output
        last = located.blocks[-1] if located.final_norms else located.container
        self.handles = [
            block.register_forward_hook(functools.partial(self._keep, index))
            for index, block in enumerate(located.blocks[:-1])
        ]
        self.handles.append(last.register_forward_hook(functools.partial(self._keep, self.num_blocks - 1)))

    def _keep(self, index: int, module: nn.Module, args: tuple, output: object) -> None:
        hidden = first_tensor(output)  # (batch, seq, d)
        if self.kept is None:
            self.kept = torch.empty((len(self.rows), self.num_blocks, hidden.shape[-1]), dtype=self.dtype)
        self.kept[:, index] = hidden.flatten(0, 1).index_select(0, self.rows)  # cast on the copy

    def take(self) -> torch.Tensor:
        """The batch's ``(kept, L, d)`` states (the next batch starts a new tensor)."""
        kept, self.kept = self.kept, None
        if kept is None:
            raise RuntimeError("the encoder ran no block: nothing to cache")
        return kept

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@dataclass(frozen=True)
class OutputSlot:
    """What a replayed block returns in one entry of its output tuple after the hidden state.

    Args:
        kind: ``"none"`` (``None``: no later block reads what the real block returns there, e.g. its
            attention weights), ``"arg"`` or ``"kwarg"`` (the block's own call argument ``where``, handed
            on: T5's position bias from block 1 on), or ``"computed"`` (a value the block computes that
            a later block reads: T5's position bias in block 0).
        where: The argument's position (``"arg"``) or name (``"kwarg"``).

    Example:
        >>> bias = torch.zeros(1, 4, 6, 6)  # T5's position bias: a block's third argument
        >>> OutputSlot("arg", 2).value((torch.zeros(1, 6, 32), None, bias), {}) is bias
        True
    """

    kind: str
    where: int | str | None = None

    def value(self, args: tuple, kwargs: dict) -> object:
        """This entry of a replayed block's output, from the block's call (``None`` unless handed on)."""
        if self.kind == "arg":
            return args[self.where]
        if self.kind == "kwarg":
            return kwargs[self.where]
        return None


NOTHING, COMPUTED = OutputSlot("none"), OutputSlot("computed")
BlockCall = tuple[tuple, dict]  # a block's positional and keyword arguments


@dataclass(frozen=True)
class BlockOutputs:
    """What each encoder block returns beside its hidden state (:func:`learn_block_outputs`), so that a
    replayed block returns what the real one would and the blocks after it get a real forward's arguments.

    Args:
        slots: Per block, ``None`` (it returns a tensor) or one :class:`OutputSlot` per entry of its
            output tuple after the hidden state.
        exact_calls: Whether a replay with ``block_calls`` gives the last block the call of a real forward
            (checked on the sentence the slots were learned from). ``False``: the encoder hands its blocks
            something a replay cannot rebuild, and a method that reads the last block's call (R+n) runs
            without the cache.

    Example:
        >>> t5 = ((COMPUTED, NOTHING), (OutputSlot("arg", 2), NOTHING))  # (hidden, position bias, None)
        >>> outputs = BlockOutputs(t5)  # 2 T5 blocks: block 0 makes the bias, block 1 hands it on
        >>> outputs.computes(0), outputs.computes(1)
        (True, False)
        >>> learned = cache.block_outputs  # the tiny BERT's: a tensor (transformers 5) or (tensor, None)
        >>> [learned.computes(index) for index in range(3)], learned.exact_calls
        ([False, False, False], True)
    """

    slots: tuple[tuple[OutputSlot, ...] | None, ...]
    exact_calls: bool = True

    def computes(self, index: int) -> bool:
        """Whether block ``index`` computes something a later block reads (it runs where calls matter)."""
        slots = self.slots[index]
        return slots is not None and COMPUTED in slots

    def replayed(self, index: int, hidden: torch.Tensor, call: BlockCall, run: Callable | None) -> object:
        """What replayed block ``index`` returns: ``hidden`` (its cached state), then each other entry
        of its output (handed on from its ``call``; computed by ``run``, the block's own forward, where
        given and the block computes something a later block reads).

        Example:
            >>> outputs = BlockOutputs(((COMPUTED, NOTHING), (OutputSlot("arg", 2), NOTHING)))  # T5's
            >>> hidden = torch.zeros(1, 6, 32)  # (batch, seq, d)
            >>> bias = torch.zeros(1, 4, 6, 6)  # (1, heads, seq, seq)
            >>> replayed = outputs.replayed(1, hidden, ((hidden, None, bias), {}), run=None)
            >>> replayed[0] is hidden, replayed[1] is bias, replayed[2]  # block 1 hands the bias on
            (True, True, None)
        """
        slots = self.slots[index]
        if slots is None:
            return hidden
        if run is not None and self.computes(index):
            return (hidden, *run(*call[0], **call[1])[1:])
        return (hidden, *(slot.value(*call) for slot in slots))


def learn_block_outputs(model: nn.Module, located: EncoderBlocks, feature: Feature) -> BlockOutputs:
    """What the blocks of ``model`` return beside their states (:class:`BlockOutputs`), from a real
    forward of ``feature``: each entry is ``None``, one of the block's arguments (the same object) or a
    value a later block reads (computed by the block). The sentence is then replayed from its own states
    (blocks that compute run): ``exact_calls`` says whether the last block got the real call again.

    Example:
        >>> from peft_layerfusion.discovery import find_encoder_blocks
        >>> base = experiment.load_model(seed=0)  # the tiny BERT token classifier: its blocks return a tensor
        >>> learned = learn_block_outputs(base, find_encoder_blocks(base), experiment.dev[0])
        >>> [learned.computes(index) for index in range(3)], learned.exact_calls  # nothing to run, exact
        ([False, False, False], True)
    """
    inputs = encoder_inputs([feature])
    with eval_mode(model), torch.no_grad():
        with _BlockCalls(located) as real:
            model(**inputs)
        slots = tuple(_output_slots(real.calls, index) for index in range(located.num_blocks))
        outputs = BlockOutputs(slots)
        states = torch.stack([first_tensor(output) for _, _, output in real.calls])  # (L, 1, seq, d)
        with _BlockCalls(located) as replayed, replaying(located, states, outputs, block_calls=True):
            model(**inputs)
    last_real, last_replayed = real.calls[-1], replayed.calls[-1]
    exact = same_arguments(last_real[:2], last_replayed[:2])
    return dataclasses.replace(outputs, exact_calls=exact)


def _output_slots(calls: Sequence[tuple], index: int) -> tuple[OutputSlot, ...] | None:
    """The :class:`OutputSlot` of each entry of block ``index``'s output after its hidden state
    (``calls``: every block's ``(args, kwargs, output)`` in one forward)."""
    args, kwargs, output = calls[index]
    if isinstance(output, torch.Tensor):
        return None
    later = [
        value
        for call_args, call_kwargs, _ in calls[index + 1 :]
        for value in (*call_args, *call_kwargs.values())
    ]
    return tuple(_slot_of(value, args, kwargs, later) for value in output[1:])


def _slot_of(value: object, args: tuple, kwargs: dict, later: Sequence[object]) -> OutputSlot:
    """Where a replay finds ``value``, an entry of a block's output: ``None``, the block's argument
    that is ``value``, or the block itself when ``value`` is none of them and a later block reads it."""
    if value is None:
        return NOTHING
    for position, argument in enumerate(args):
        if argument is value:
            return OutputSlot("arg", position)
    for name, argument in kwargs.items():
        if argument is value:
            return OutputSlot("kwarg", name)
    return COMPUTED if any(argument is value for argument in later) else NOTHING


def same_arguments(first: object, second: object) -> bool:
    """Whether two block calls' arguments are the same: equal tensors (dtype, shape, values), equal
    plain values, containers of the same such entries, and other objects (key/value caches) of the same
    type.

    Example:
        >>> same_arguments(((torch.ones(2), None), {"bias": torch.zeros(3)}), ((torch.ones(2), None), {}))
        False
    """
    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return (
            isinstance(first, torch.Tensor)
            and isinstance(second, torch.Tensor)
            and first.dtype == second.dtype
            and first.shape == second.shape
            and torch.equal(first, second)
        )
    if type(first) is not type(second):
        return False
    if isinstance(first, (tuple, list)):
        return len(first) == len(second) and all(map(same_arguments, first, second))
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(same_arguments(first[k], second[k]) for k in first)
    if first is None or isinstance(first, (bool, int, float, str)):
        return first == second
    return True


class _BlockCalls:
    """Forward hooks keeping every block's ``(args, kwargs, output)`` of one forward (a context manager
    that removes them on exit)."""

    def __init__(self, located: EncoderBlocks) -> None:
        self.calls: list[tuple | None] = [None] * located.num_blocks
        self.handles = [
            block.register_forward_hook(functools.partial(self._keep, index), with_kwargs=True)
            for index, block in enumerate(located.blocks)
        ]

    def _keep(self, index: int, module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        self.calls[index] = (args, kwargs, output)

    def __enter__(self) -> _BlockCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        if exc[0] is None and any(call is None for call in self.calls):
            raise RuntimeError(
                "the encoder did not run every block on one sentence: cannot learn their outputs"
            )


@contextmanager
def replaying(
    located: EncoderBlocks, states: CachedBatch | torch.Tensor, outputs: BlockOutputs, block_calls: bool
) -> Iterator[None]:
    """Inside, block ``i`` of ``located`` returns ``z_{i+1}`` of ``states`` (:meth:`FeatureCache.replay`)
    and the other entries :class:`BlockOutputs` says; with ``block_calls`` a block that computes what a
    later block reads runs for real (its state still the replayed one)."""
    if states.shape[0] != located.num_blocks:
        raise ValueError(f"cached states have {states.shape[0]} blocks, the model {located.num_blocks}")
    for index, block in enumerate(located.blocks):
        block.forward = _replayed(states, index, outputs, block.forward if block_calls else None)
    try:
        yield
    finally:
        for block in located.blocks:
            del block.forward


def _replayed(states: CachedBatch | torch.Tensor, index: int, outputs: BlockOutputs, run: Callable | None):
    """Block ``index``'s forward under a replay (``run``: its own forward, or ``None``)."""

    def forward(*args, **kwargs):
        reference = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
        output = states.block(index) if isinstance(states, CachedBatch) else states[index]  # (batch, seq, d)
        hidden = output.to(device=reference.device, dtype=reference.dtype)
        return outputs.replayed(index, hidden, (args, kwargs), run)

    return forward


class FeatureCache:
    """``z_1 .. z_L`` at the kept positions of each sentence, for one frozen encoder.

    Args:
        base_model: The pretrained model (before any regime/fusion is applied); its blocks
            compute the features. Only its encoder is used.
        located: Its encoder blocks (``find_encoder_blocks(base_model)``).
        model_name: Name or path of the model (for messages; the key hashes the weights instead).
        max_length: Tokenizer max length (part of the cache key).
        directory: Optional folder where the cache is persisted (shards under ``features-<key>/``)
            and from which it is served memory-mapped. After every :data:`MAPPED_BYTES_HELD` of
            states served from the shards, their pages leave the process
            (:func:`~layerfusion_recipes.core.cache.cache_files.drop_mapped_pages`): its RSS holds its
            working set and at most that much of the shards, not every state it has read, and the
            page cache keeps one copy for every process (read again from there: minor page faults).
        tokenizer: The tokenizer that made the token ids (part of the cache key).
        positions: Which positions to keep (:class:`KeptPositions`; part of the key).
        dtype: Storage dtype name (:data:`STORAGE_DTYPES`; part of the key).

    Example:
        >>> from peft_layerfusion.discovery import find_encoder_blocks
        >>> base = experiment.load_model(seed=0).eval()  # the tiny BERT token classifier, frozen
        >>> located = find_encoder_blocks(base)
        >>> cache = FeatureCache(base, located, "tiny-bert", 128, tokenizer=experiment.tokenizer)
        >>> cache.fill(experiment.dev + experiment.test)  # the sentences computed
        24
        >>> batch = experiment.dev[:4]
        >>> ids, mask = padded_inputs(batch)
        >>> with torch.no_grad():
        ...     computed = base(input_ids=ids, attention_mask=mask).logits
        ...     with cache.replay(located, cache.batch(batch)):  # each block returns its cached output
        ...         replayed = base(input_ids=ids, attention_mask=mask).logits
        >>> torch.allclose(replayed[mask.bool()], computed[mask.bool()], atol=1e-6)  # at the real tokens
        True
    """

    def __init__(
        self,
        base_model: nn.Module,
        located: EncoderBlocks,
        model_name: str,
        max_length: int,
        directory: str | os.PathLike | None = None,
        tokenizer=None,
        positions: KeptPositions = ALL_POSITIONS,
        dtype: str = DEFAULT_CACHE_DTYPE,
    ) -> None:
        self.base_model: nn.Module | None = base_model  # None once released (release_encoder)
        self.located: EncoderBlocks | None = located
        self.num_blocks = located.num_blocks
        self.model_name = model_name
        self.positions = positions
        self.dtype, self.dtype_name = storage_dtype(dtype), dtype
        self.key = feature_key(base_model, tokenizer, max_length, located.num_blocks, positions.name, dtype)
        self.path = Path(directory) / f"features-{self.key}" if directory else None  # shard folder
        self.states: dict[SentenceKey, torch.Tensor] = {}  # (ids, kept positions) -> (kept, L, d)
        self._read_shards: set[str] = set()
        self._mapped: list[tuple[int, int]] = []  # the shards' pages in this process: (start, length)
        self._served = 0  # bytes of mapped states served since their pages were last dropped
        self.pages_dropped = 0  # how many times (drop_mapped_pages)
        # what the blocks return beside their states, learned by the first fill (learn_block_outputs)
        self.block_outputs: BlockOutputs | None = None
        self.refresh()

    def __len__(self) -> int:
        return len(self.states)

    @property
    def nbytes(self) -> int:
        """Bytes of the cached states (in memory, or mapped from the shards)."""
        return sum(value.nbytes for value in self.states.values())

    def plan(self, features: Sequence[Feature]) -> CachePlan:
        """What this cache holds once ``features`` are filled (:class:`CachePlan`), computing nothing."""
        if self.base_model is None or self.located is None:
            raise RuntimeError("the feature cache's encoder was released: plan before release_encoder()")
        return plan_cache(self.base_model, self.located, self.positions, self.dtype_name, features)

    def key_of(self, feature: Feature) -> SentenceKey:
        """The cache key of an encoded sentence: its token ids and its kept positions."""
        return tuple(feature["input_ids"]), self.positions.of(feature)

    @torch.no_grad()
    def fill(self, features: Sequence[Feature], batch_size: int = 64) -> int:
        """Compute the states of every sentence not cached yet; returns how many were added. The first
        fill also learns what the blocks return beside their states (:func:`learn_block_outputs`)."""
        self.refresh()  # another worker may have computed some of them meanwhile
        if self.block_outputs is None and features and self.base_model is not None:
            self.block_outputs = learn_block_outputs(self.base_model, self.located, features[0])
        missing: dict[SentenceKey, Feature] = {}
        for feature in features:
            key = self.key_of(feature)
            if key not in self.states:
                missing.setdefault(key, feature)
        if not missing:
            return 0
        if self.base_model is None or self.located is None:
            raise RuntimeError(
                f"the feature cache's encoder was released (release_encoder) but {len(missing)} sentences "
                "are not cached: fill every sentence a sweep reads before releasing it"
            )
        keys = list(missing)
        kept = _KeptRows(self.located, self.dtype)  # z_1 .. z_L at the kept positions, as they are computed
        pending: list[tuple[list[SentenceKey], torch.Tensor]] = []  # computed, not written yet
        try:
            with eval_mode(self.base_model):
                for start in range(0, len(keys), batch_size):
                    chunk = keys[start : start + batch_size]
                    inputs = encoder_inputs([missing[key] for key in chunk])
                    kept.rows = flat_positions(chunk, inputs["input_ids"].shape[1])
                    self.base_model(**inputs)
                    states, row = kept.take(), 0  # (kept, L, d)
                    for key in chunk:
                        self.states[key] = states[row : row + len(key[1])]  # (kept, L, d)
                        row += len(key[1])
                    pending.append((chunk, states))
                    if sum(states.nbytes for _, states in pending) >= FLUSH_BYTES:
                        self._write_shard(pending)
                        pending = []
                    # the batch's activations: freed between the states kept, which pin the heap's pages
                    release_freed_memory()
        finally:
            kept.remove()
        self._write_shard(pending)
        return len(keys)

    def release_encoder(self) -> None:
        """Let the encoder that fills the cache go (its weights leave this process's memory): every
        sentence the run reads is cached. A later fill of a sentence not cached raises."""
        self.base_model = self.located = None

    def refresh(self) -> int:
        """Read the shards written (by any worker) since the last call; returns how many.

        A shard that cannot be read (empty, truncated, foreign) is reported with its file name
        (``RuntimeWarning``) and removed: its sentences are computed again by the next fill.
        Temporary files of writers that died are removed (see ``remove_stale_temp_files``).
        """
        if self.path is None or not self.path.is_dir():
            return 0
        remove_stale_temp_files(self.path)
        new = sorted(p for p in self.path.glob(f"*{SHARD_SUFFIX}") if p.name not in self._read_shards)
        read = 0
        for shard in new:
            try:
                self._map_shard(shard)
            except CorruptShardError as error:
                warnings.warn(
                    f"feature cache: removing {error}; its sentences will be recomputed",
                    RuntimeWarning,
                    stacklevel=2,
                )
                shard.unlink(missing_ok=True)
                continue
            read += 1
        return read

    def _map_shard(self, shard: Path) -> None:
        """Serve the sentences of ``shard`` from the file (memory-mapped)."""
        states = read_shard(shard, self.key, self.num_blocks)
        mapped = mapped_range(next(iter(states.values())), shard) if states else None
        if mapped is not None:  # None: read into memory, never dropped
            self._mapped.append(mapped)
        self.states.update(states)
        self._read_shards.add(shard.name)

    def _write_shard(self, pending: Sequence[tuple[Sequence[SentenceKey], torch.Tensor]]) -> None:
        """Persist ``pending`` (sentences and their kept states) as one new shard (atomic: temp
        file + ``os.replace``), then serve them from it, memory-mapped (their copies in memory go)."""
        if self.path is None or not pending:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        name = f"shard-{uuid.uuid4().hex}{SHARD_SUFFIX}"
        keys = [key for chunk, _ in pending for key in chunk]
        states = torch.cat([kept for _, kept in pending]) if len(pending) > 1 else pending[0][1]
        write_shard(self.path / name, keys, states, self.key)
        self._map_shard(self.path / name)

    def batch(self, features: Sequence[Feature]) -> CachedBatch:
        """The cached states of a batch (:class:`CachedBatch`): its kept rows, each block's padded
        ``(batch, seq, d)`` state built when that block is replayed."""
        keys = [self.key_of(feature) for feature in features]
        width = max(len(ids) for ids, _ in keys)
        kept = [self.states[key] for key in keys]  # (kept, L, d) each, not copied
        self._serve(sum(states.nbytes for states in kept))
        return CachedBatch(kept, flat_positions(keys, width), (len(keys), width))

    def _serve(self, nbytes: int) -> None:
        """Count ``nbytes`` of states served; past :data:`MAPPED_BYTES_HELD` since the last time,
        the shards' pages leave this process (the next reads map them again)."""
        if not self._mapped:
            return
        self._served += nbytes
        if self._served > MAPPED_BYTES_HELD:
            drop_mapped_pages(self._mapped)
            self._served = 0
            self.pages_dropped += 1

    def batch_states(self, features: Sequence[Feature]) -> torch.Tensor:
        """Cached states of a batch in float32, zero-padded: ``(L, batch, seq, d)`` (every block at once:
        the probes' input; a replay builds one block at a time, :meth:`batch`)."""
        return self.batch(features).stacked()

    @property
    def replays_block_calls(self) -> bool:
        """Whether a replay gives the last block the call of a real forward (:class:`BlockOutputs`), as a
        method that reads it (R+n) needs; ``False`` also before the first fill."""
        return self.block_outputs is not None and self.block_outputs.exact_calls

    def replay(
        self, located: EncoderBlocks, states: CachedBatch | torch.Tensor, block_calls: bool = True
    ) -> AbstractContextManager[None]:
        """Inside, block ``i`` of ``located`` returns the cached ``z_{i+1}`` without computing.

        Args:
            located: The blocks of the model being trained (same encoder as the cache's).
            states: A :class:`CachedBatch` (:meth:`batch`: each block's state is built when the block is
                called, so a forward that keeps only some positions of each state, as the fusion's
                capture does without grad, never holds every block's padded state at once), or an
                ``(L, batch, seq, d)`` tensor.
            block_calls: The last block must get the call of a real forward (a fusion module that reads
                it: R+n): a block that computes what a later block reads (T5's block 0, its position
                bias) runs for real. ``False``: no block runs (what the blocks hand on may then differ).

        Raises:
            RuntimeError: before the first fill (what the blocks return is not known yet).
            ValueError: ``block_calls`` on an encoder whose replay cannot give the real call (one line).
        """
        if self.block_outputs is None:
            raise RuntimeError("fill the feature cache before replaying it (its blocks' outputs are learned)")
        if block_calls and not self.block_outputs.exact_calls:
            raise ValueError(
                f"the feature cache of {self.model_name} cannot give the last block the arguments of a "
                "real forward: run the methods that read them (R+n) without the cache (--no-cache)"
            )
        return replaying(located, states, self.block_outputs, block_calls)


class CachedBatch:
    """The cached states of one batch: the kept rows of its sentences (the cache's own tensors, not copied)
    and where they sit in the padded ``(batch, seq)`` grid; every other position (not kept, padding) is
    zeros.

    Args:
        kept: Per sentence, its ``(kept, L, d)`` states in the storage dtype.
        rows: ``(sum of kept,)`` their positions in the flattened ``(batch * seq)`` grid, sentence after
            sentence.
        size: ``(batch, seq)``.

    Example:
        >>> batch = cache.batch(experiment.dev[:4])  # the experiment's cache: dev and test filled
        >>> batch.shape  # (L, batch, seq, d)
        (3, 4, 6, 32)
        >>> batch.block(0).shape  # z_1, float32: (batch, seq, d)
        torch.Size([4, 6, 32])
    """

    def __init__(self, kept: Sequence[torch.Tensor], rows: torch.Tensor, size: tuple[int, int]) -> None:
        self.kept, self.rows, self.size = kept, rows, size

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(L, batch, seq, d)``: the shape of :meth:`stacked`."""
        return (self.kept[0].shape[1], *self.size, self.kept[0].shape[2])

    def block(self, index: int) -> torch.Tensor:
        """``z_{index+1}`` of the batch in float32, zero-padded: ``(batch, seq, d)`` (a new tensor; what it
        is built from, ``(kept, d)``, lives only during the call)."""
        width = self.kept[0].shape[-1]
        out = torch.zeros(self.size[0] * self.size[1], width)  # (batch * seq, d)
        rows = torch.cat([states[:, index] for states in self.kept])  # (kept, d), storage dtype
        out.index_copy_(0, self.rows, rows.to(torch.float32))  # cast on the copy
        return out.view(*self.size, width)

    def stacked(self) -> torch.Tensor:
        """Every block's state in float32, zero-padded: ``(L, batch, seq, d)``."""
        blocks, width = self.kept[0].shape[1:]
        out = torch.zeros(self.size[0] * self.size[1], blocks, width)  # (batch * seq, L, d)
        out.index_copy_(0, self.rows, torch.cat(self.kept).to(torch.float32))
        return out.view(*self.size, blocks, width).permute(2, 0, 1, 3)
