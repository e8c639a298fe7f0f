"""The training-loop core shared by every recipe (``ner``, its stacked LR candidates, ``mlm``, ``seq2seq``).

One :class:`TrainingLoop` is one run's optimisation: AdamW over parameter groups (one group,
or one per LR candidate), transformers' linear schedule (optional warm-up, then linear to
zero), the model on this process's device with accelerate's mixed precision (never DDP: a
run is trained by one process, see :func:`prepare_local`), frozen sub-trees in eval mode,
and a step counter. The recipes keep what differs: their batches, their loss, what they
evaluate after an epoch.

Example:
    >>> params = [p for p in model.parameters() if p.requires_grad]
    >>> loop = TrainingLoop(model, [{"params": params, "lr": 1e-3}], total_steps=4, seed=0)
    >>> for epoch in range(2):
    ...     for _ in range(2):  # the epoch's batches
    ...         loop.step(F.cross_entropy(loop.model(ids).logits.flatten(0, 1), labels.flatten()))
    >>> loop.steps
    4
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Sequence
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from transformers import get_linear_schedule_with_warmup

from .models import eval_frozen_subtrees


def prepare_local(accelerator: Accelerator, model: nn.Module, optimizer: torch.optim.Optimizer):
    """``model`` on this process's device with accelerate's mixed precision, and ``optimizer`` with its
    loss scaling, for a run trained by this process alone.

    Not ``accelerator.prepare``: under a multi-process launch that wraps the model in DDP and shards
    the batches, so each process would train the same run on part of the batch (other numbers than
    one process). The data loader and the LR schedule stay as they are (a prepared schedule steps
    once per process).

    Example:
        >>> from accelerate import Accelerator
        >>> optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        >>> model, optimizer = prepare_local(Accelerator(cpu=True), model, optimizer)
    """
    model = accelerator.prepare_model(model, evaluation_mode=True)  # device + autocast, no DDP
    return model, accelerator.prepare_optimizer(optimizer)


class TrainingLoop:
    """AdamW + linear schedule for one run; :meth:`step` is one optimisation step.

    Args:
        model: The model (moved to this process's device; the prepared model is :attr:`model`).
        groups: AdamW parameter groups, each ``{"params": [...], "lr": max_lr}``.
        total_steps: Steps of the whole run (the LR reaches zero there).
        seed: Seeds torch first, so dropout draws do not depend on what ran before (``None``: the
            caller already seeded torch, e.g. right before building the model, and its stream goes on).
        weight_decay: AdamW weight decay.
        warmup_steps: Linear warm-up from 0 to the max LR over these first steps.
        clip_norm: Clip the gradient norm of the trained parameters to this value (``None``: no clip).

    Example:
        >>> params = [p for p in model.parameters() if p.requires_grad]
        >>> loop = TrainingLoop(model, [{"params": params, "lr": 3e-3}], total_steps=50, seed=1)
        >>> loss = F.cross_entropy(loop.model(ids).logits.flatten(0, 1), labels.flatten())
        >>> loop.step(loss)  # backward, clip, AdamW, schedule, zero_grad
    """

    def __init__(
        self,
        model: nn.Module,
        groups: list[dict[str, Any]],
        total_steps: int,
        seed: int | None,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        clip_norm: float | None = None,
    ) -> None:
        if seed is not None:
            torch.manual_seed(seed)
        self.accelerator = Accelerator()
        optimizer = torch.optim.AdamW(groups, lr=groups[0]["lr"], weight_decay=weight_decay)
        self.scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)
        self.model, self.optimizer = prepare_local(self.accelerator, model, optimizer)
        self.parameters = [p for group in groups for p in group["params"]]
        self.clip_norm = clip_norm
        self.steps = 0
        eval_frozen_subtrees(self.model)  # e.g. no dropout inside a frozen encoder

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def step(self, loss: torch.Tensor) -> None:
        """Backward ``loss``, clip, one AdamW step, one schedule step, zero the gradients."""
        self.accelerator.backward(loss)
        if self.clip_norm is not None:
            nn.utils.clip_grad_norm_(self.parameters, self.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        self.steps += 1


def snapshot(parameters: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Detached copies of ``parameters`` (the checkpoint of the best dev epoch)."""
    return [p.detach().clone() for p in parameters]


@torch.no_grad()
def restore(parameters: Sequence[torch.Tensor], saved: Sequence[torch.Tensor]) -> None:
    """Copy a :func:`snapshot` back into ``parameters``."""
    for parameter, value in zip(parameters, saved, strict=True):
        parameter.copy_(value)


def glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has ``malloc_trim``), else ``None`` (macOS, musl, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 (glibc only)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


_LIBC = glibc()


def release_freed_memory() -> bool:
    """Give the pages glibc's heap holds free back to the system (``malloc_trim(0)``); ``False`` where
    the C library is not glibc (nothing to do).

    Why: a stacked FE run's tensors change size with every shuffled batch (seven DWAtt candidates,
    vmap and backward), and glibc serves such requests from its heap and keeps what they free, mostly
    in holes it cannot hand back by itself. Measured on the MiniLM CoNLL-2003 FE sweep (N = 32, two
    trials, ten epochs): in use 0.8 GB, held free 2.4 GB after one DWAtt run and still growing (peak RSS
    5.2 GB). :func:`~layerfusion_recipes.core.fitting.fit` calls this after every epoch's steps and
    every evaluation, and after a training step or evaluation batch that leaves the process above its
    resident limit (:func:`resident_above`: a sweep's memory line; every one under ``--train-memory``).
    That costs time: the heap walk takes milliseconds, but the next step faults in again the pages it
    gave back (after every step and batch: 12% of a DWAtt cell's time at 13 x 768, seven candidates;
    only above the memory line: 3%). Numbers do not change.

    Example:
        >>> release_freed_memory()  # True on Linux with glibc
        True
    """
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


def resident_bytes() -> int | None:
    """This process's resident memory (RSS) in bytes, from ``/proc/self/statm``; ``None`` where it
    cannot be read (not Linux).

    Example:
        >>> resident_bytes() > 0  # e.g. 612368384
        True
    """
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def resident_above(limit: int | None) -> bool:
    """Whether this process holds more than ``limit`` bytes resident: always for ``0``, never for
    ``None`` or where the resident memory cannot be read. What
    :func:`~layerfusion_recipes.core.fitting.fit` asks after every training step and evaluation batch
    before it gives the heap's freed pages back (:func:`release_freed_memory`).

    Example:
        >>> resident_above(0), resident_above(None), resident_above(2**62)
        (True, False, False)
    """
    if limit is None:
        return False
    if limit == 0:
        return True
    resident = resident_bytes()
    return resident is not None and resident > limit


def collect_garbage() -> None:
    """Free what only reference cycles keep alive (``gc.collect()``), then give the freed heap pages back
    (:func:`release_freed_memory`).

    Why: a model held in reference cycles is not freed when its last name goes but when Python's cyclic
    collector next makes a full pass, which object counts trigger, not bytes. Fusion adapters did that
    (each block's forward hook was a bound method of the fusion's capture, which held the blocks):
    R+1 on SST-2 with Gemma 3 270M, 11 runs one after another (each builds its model: about 1 GB of
    memory and 1 GB of mapped weights) peaked at 16.3 GB RSS, every earlier run's model still alive.
    The library now holds the model through weak links (``peft_layerfusion.utils.WeakLink``), so a
    run's model is freed at once; this stays as the guard against any other cycle (a callback, a
    library's cache) holding a whole model:
    :meth:`~layerfusion_recipes.core.experiment.FewShotExperiment.build` calls it before it builds the
    next. Numbers do not change.

    A full pass scans every object the process tracks (0.25 s with torch, transformers and peft loaded),
    so the first call also moves what is alive then (the libraries, the data) out of the collector's
    sight (``gc.freeze()``): later calls scan what was made since, the runs' models among it.

    Example:
        >>> collect_garbage()  # before building the next run's model
    """
    gc.collect()
    if gc.get_freeze_count() == 0:
        gc.freeze()
    release_freed_memory()
