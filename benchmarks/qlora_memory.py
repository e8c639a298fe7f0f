"""Memory of one QLoRA training step: plain LoRA against DWAtt + the same LoRA, on one 4-bit base.

A random Llama (``--width``, ``--blocks``; saved once, then loaded 4-bit NF4 by bitsandbytes) is
prepared with ``prepare_model_for_kbit_training`` (gradient checkpointing on, as QLoRA runs), given
LoRA on ``q_proj``/``v_proj`` alone or with DWAtt over every block, and trained one step
(forward, backward, AdamW) on a batch of ``--batch`` x ``--length`` tokens. Each variant runs in its
own process, after one warm-up step (the optimizer state exists); the measure is the step's peak
of tensor bytes above those held before it: ``torch.cuda.max_memory_allocated`` on a GPU; on the CPU
the torch profiler's allocator events (``overhead.peak_allocated``: exact and repeatable, unlike the
resident set, which the allocator's reuse of freed pages blurs; the resident set's peak above its
start, ``VmHWM`` reset through ``/proc/self/clear_refs``, is printed beside it).

Usage::

    python benchmarks/qlora_memory.py [--width 512] [--blocks 8] [--batch 4] [--length 256] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
from pathlib import Path

import torch
from overhead import peak_allocated
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig

import peft_layerfusion

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 8000


def status_bytes(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def write_base(folder: Path, width: int, blocks: int) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=int(2.75 * width),
                         num_hidden_layers=blocks, num_attention_heads=8, num_key_value_heads=4)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def step_peak(folder: str, variant: str, batch: int, length: int, queue) -> None:
    """(In a child process.) The peak bytes of one training step above those held before it."""
    torch.set_num_threads(2)
    quantisation = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    base = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quantisation, device_map=DEVICE)
    base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=True)
    lora = dict(target_modules=["q_proj", "v_proj"], r=16, lora_alpha=32, task_type="CAUSAL_LM")
    config = LoraConfig(**lora) if variant == "lora" else peft_layerfusion.DWAttConfig(**lora)
    model = get_peft_model(base, config).train()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(0)).to(DEVICE)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: the optimizer state and the allocator's pools exist afterwards
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        queue.put({"variant": variant, "above": peak - before, "trainable": trainable})
        return
    before = status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    step()
    resident = status_bytes("VmHWM") - before
    tensors = peak_allocated(step)  # one more step, under the profiler
    queue.put({"variant": variant, "above": tensors, "resident_above": resident, "trainable": trainable})


def measure(folder: str, variant: str, batch: int, length: int) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=step_peak, args=(folder, variant, batch, length, queue))
    child.start()
    result = queue.get()
    child.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved runs of each variant")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        write_base(Path(folder), arguments.width, arguments.blocks)
        runs = {"lora": [], "dwatt+lora": []}
        for _ in range(arguments.rounds):
            for variant in runs:
                result = measure(folder, variant, arguments.batch, arguments.length)
                runs[variant].append(result)
                print(json.dumps(result), flush=True)
    median = {variant: statistics.median(r["above"] for r in results) for variant, results in runs.items()}
    print(f"device {DEVICE}; {arguments.blocks} blocks x {arguments.width}, 4-bit NF4, checkpointing, "
          f"batch {arguments.batch} x {arguments.length} tokens")  # fmt: skip
    for variant, results in runs.items():
        resident = [f"{r['resident_above'] / 2**20:.0f}" for r in results if "resident_above" in r]
        resident_cell = f" resident set above start {', '.join(resident)} MiB |" if resident else ""
        print(f"| {variant} | trainable {results[0]['trainable']:,} | step peak of tensors above start "
              f"{median[variant] / 2**20:.1f} MiB |{resident_cell}")  # fmt: skip
    print(f"ratio DWAtt+LoRA / LoRA: {median['dwatt+lora'] / median['lora']:.2f}")


if __name__ == "__main__":
    main()
