"""Train a tiny fusion + LoRA adapter in one process or data-parallel over several (used by test_ddp.py).

Usage::

    python tests/ddp_driver.py trainer FAMILY OUTPUT.json        # transformers' Trainer, one process
    accelerate launch --multi_gpu --num_processes 2 tests/ddp_driver.py trainer FAMILY OUTPUT.json
        # the same Trainer, DDP over 2 CPU processes (gloo; needs ACCELERATE_USE_CPU=1)
    python tests/ddp_driver.py fully_shard FAMILY OUTPUT.json    # a plain AdamW loop, one process
    torchrun --nproc_per_node 2 tests/ddp_driver.py fully_shard FAMILY OUTPUT.json
        # the same loop with every block and the root sharded by FSDP2's ``fully_shard`` (gloo)

The global batch is :data:`GLOBAL_BATCH` whatever the number of processes (each takes its share),
so every step sees the same examples as in one process. The main process writes one JSON object:
``{"world_size", "distributed_type", "sharded" (parameters held as DTensor shards after training;
``fully_shard`` adds "parameters" and "sharded_blocks"), "losses" (the loss of each step, averaged
over the processes), "grad_norms" (Trainer only), "logits" (of every example after training)}``.

Pitfall (transformers 5.23, not 4.57.6): ``average_tokens_across_devices`` (default True) multiplies each
process's loss by the number of processes, assuming the model divides by the global token count it
passes as ``num_items_in_batch``. ``BertForTokenClassification`` (5.x) accepts the keyword
(``**kwargs``) but takes a plain mean, so under DDP the logged loss and the gradient come out N
times too large.
The Trainer here turns the option off; equal token counts per process make the plain mean exact.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from conftest import NO_DROPOUT, TINY
from peft import get_peft_model
from test_trainer import NUM_LABELS, token_examples
from tiny_decoders import FAMILIES as DECODERS
from tiny_decoders import rule_rows
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import (
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    BertConfig,
    PretrainedConfig,
    Trainer,
    TrainingArguments,
)

from peft_layerfusion import DWAttConfig

GLOBAL_BATCH = 8
STEPS = 4
SEED = 0
LEARNING_RATE = 1e-2


@dataclass(frozen=True)
class Family:
    """A tiny random model of one family with its head, and its fusion + LoRA adapter."""

    config: Callable[[], PretrainedConfig]
    auto_class: type
    task_type: str
    lora_targets: tuple[str, ...]
    examples: Callable[[], list[dict[str, torch.Tensor]]]  # the same token count in each example


# An encoder with a token-classification head, and a decoder-only LLM (a pre-norm Llama, fusion_init
# "auto" = identity) trained as a causal LM, as LLM users train one.
FAMILIES: dict[str, Family] = {
    "bert": Family(
        config=lambda: BertConfig(**TINY, **NO_DROPOUT, num_labels=NUM_LABELS),
        auto_class=AutoModelForTokenClassification,
        task_type="TOKEN_CLS",
        lora_targets=("query", "value"),
        examples=lambda: token_examples(count=GLOBAL_BATCH * STEPS),
    ),
    "llama": Family(
        config=DECODERS["llama"].config,
        auto_class=AutoModelForCausalLM,
        task_type="CAUSAL_LM",
        lora_targets=DECODERS["llama"].lora_targets,
        examples=lambda: rule_rows(count=GLOBAL_BATCH * STEPS),
    ),
}


def build(family: Family) -> torch.nn.Module:
    """The family's tiny model with a DWAtt + LoRA adapter, the same weights in every process."""
    torch.manual_seed(SEED)
    base = family.auto_class.from_config(family.config())
    config = DWAttConfig(task_type=family.task_type, target_modules=list(family.lora_targets), r=4)
    return get_peft_model(base, config)


def stacked(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([example[key] for example in examples]) for key in examples[0]}


def sharded(model: torch.nn.Module) -> int:
    """How many parameters are DTensor shards (FSDP2 between steps: every unit resharded)."""
    return sum(isinstance(param, DTensor) for param in model.parameters())


def write(output: str, model: torch.nn.Module, examples: list, main: bool, **record: object) -> None:
    """The logits of every example after training (a forward on every process: FSDP gathers), then
    the record, written by the main process."""
    with torch.no_grad():
        logits = model.eval()(**stacked(examples)).logits
    if main:
        with open(output, "w") as handle:
            json.dump({**record, "logits": logits.tolist()}, handle)


def train_with_trainer(family_name: str, output: str) -> None:
    """transformers' Trainer; under ``accelerate launch`` each process takes its share of the batch."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    family = FAMILIES[family_name]
    model = build(family)
    arguments = TrainingArguments(
        output_dir=os.path.dirname(output) or ".", max_steps=STEPS, learning_rate=LEARNING_RATE, seed=SEED,
        per_device_train_batch_size=GLOBAL_BATCH // world_size, logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, dataloader_drop_last=True,
        average_tokens_across_devices=False,
    )  # fmt: skip
    examples = family.examples()
    trainer = Trainer(model=model, args=arguments, train_dataset=examples)
    trainer.train()
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    accelerator = trainer.accelerator
    write(
        output, trainer.model, examples, accelerator.is_main_process,
        world_size=accelerator.num_processes, distributed_type=str(accelerator.distributed_type),
        losses=[entry["loss"] for entry in steps], grad_norms=[entry["grad_norm"] for entry in steps],
        sharded=sharded(trainer.model),
    )  # fmt: skip


def block_stacks(model: torch.nn.Module) -> list[torch.nn.ModuleList]:
    """The model's stacks of blocks: module lists as long as the config's ``num_hidden_layers``."""
    depth = model.config.num_hidden_layers
    stacks = [module for module in model.modules() if isinstance(module, torch.nn.ModuleList)]
    return [stack for stack in stacks if len(stack) == depth]


def train_fully_sharded(family_name: str, output: str) -> None:
    """A plain AdamW loop; with several processes (torchrun) FSDP2 shards every block, then the root."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world_size > 1 else 0
    family = FAMILIES[family_name]
    model = build(family)
    if world_size > 1:
        for blocks in block_stacks(model):
            for block in blocks:
                fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
    examples, share = family.examples(), GLOBAL_BATCH // world_size
    losses = []
    model.train()
    for step in range(STEPS):
        start = step * GLOBAL_BATCH + rank * share
        loss = model(**stacked(examples[start : start + share])).loss  # FSDP averages the gradients
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        if world_size > 1:
            dist.all_reduce(mean)  # gloo has no AVG: a sum, then divided
            mean /= world_size
        losses.append(mean.item())
    write(
        output, model, examples, rank == 0, world_size=world_size,
        distributed_type="FSDP2" if world_size > 1 else "NO", losses=losses,
        sharded=sharded(model), parameters=len(list(model.parameters())),
        sharded_blocks=sum(len(blocks) for blocks in block_stacks(model)) if world_size > 1 else 0,
    )  # fmt: skip
    if world_size > 1:
        dist.destroy_process_group()


LAUNCHERS = {"trainer": train_with_trainer, "fully_shard": train_fully_sharded}


if __name__ == "__main__":
    LAUNCHERS[sys.argv[1]](sys.argv[2], sys.argv[3])
