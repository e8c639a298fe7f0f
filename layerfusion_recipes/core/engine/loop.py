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

from collections.abc import Sequence
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from transformers import get_linear_schedule_with_warmup

from ..models.models import eval_frozen_subtrees


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
