"""Data-parallel training of a fusion + LoRA adapter on 2 CPU processes (gloo) = one process.

At the same global batch (each process takes half):

* DDP: transformers' Trainer under ``accelerate launch --multi_gpu`` (``ACCELERATE_USE_CPU=1``)
  logs the same loss and gradient norm at every step, and ends with the same logits, as the
  Trainer in one process;
* FSDP2: ``fully_shard`` on every block and on the root (``torchrun``, gloo) trains as the
  unsharded loop in one process. torch 2.13 runs FSDP2 on CPU, but accelerate (1.15) does not:
  with CPU processes, ``accelerate launch --use_fsdp --fsdp_version 2`` and the Trainer's
  ``fsdp``/``fsdp_config`` set up plain DDP (``DistributedType.MULTI_CPU``) without a word, so
  FSDP is driven by torch itself here.

The tests are a matrix over the model families of ``ddp_driver.FAMILIES``: a BERT token classifier and a
Llama causal LM (decoder-only, pre-norm), each with fusion + LoRA in one adapter.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddp_driver import FAMILIES, LAUNCHERS, build, stacked

DRIVER = Path(__file__).with_name("ddp_driver.py")

needs_distributed = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch without torch.distributed"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launched(launcher: list[str], argv: list[str], output: Path) -> dict:
    """Run ``LAUNCHER ddp_driver.py ARGV OUTPUT`` with 2 CPU processes; the main process's record."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(DRIVER.parents[1]), env.get("PYTHONPATH", "")])  # conftest
    command = [sys.executable, "-m", *launcher, str(DRIVER), *argv, str(output)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=DRIVER.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(output.read_text())


def alone(launcher: str, family: str, output: Path) -> dict:
    """The same training in this process."""
    LAUNCHERS[launcher](family, str(output))
    return json.loads(output.read_text())


def assert_same_training(one: dict, two: dict, family: str) -> None:
    """Same loss at every step and the same logits after training; and training changed the logits."""
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert len(one["losses"]) == len(two["losses"]) == 4
    torch.testing.assert_close(torch.tensor(two["losses"]), torch.tensor(one["losses"]), rtol=1e-5, atol=1e-6)
    trained = torch.tensor(one["logits"])
    torch.testing.assert_close(torch.tensor(two["logits"]), trained, rtol=1e-5, atol=1e-5)
    examples = FAMILIES[family].examples()
    with torch.no_grad():
        untrained = build(FAMILIES[family]).eval()(**stacked(examples)).logits
    assert (trained - untrained).abs().max() > 1e-2  # the comparison is between trained models


@needs_distributed
@pytest.mark.parametrize("family", list(FAMILIES))
def test_trainer_ddp_on_two_cpu_processes_trains_as_one_process(family, tmp_path):
    one = alone("trainer", family, tmp_path / "one.json")
    accelerate = ["accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    accelerate += ["--mixed_precision", "no", "--dynamo_backend", "no"]
    accelerate += ["--main_process_port", str(free_port())]
    two = launched(accelerate, ["trainer", family], tmp_path / "two.json")
    assert two["distributed_type"] == "DistributedType.MULTI_CPU" and two["sharded"] == 0
    assert_same_training(one, two, family)
    grad_norms = torch.tensor(two["grad_norms"]), torch.tensor(one["grad_norms"])
    torch.testing.assert_close(*grad_norms, rtol=1e-5, atol=0)  # the all-reduced gradients: one's


@needs_distributed
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fsdp2_fully_shard_on_two_cpu_processes_trains_as_one_process(family, tmp_path):
    one = alone("fully_shard", family, tmp_path / "one.json")
    torchrun = ["torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    two = launched(torchrun, ["fully_shard", family], tmp_path / "two.json")
    assert two["distributed_type"] == "FSDP2" and one["sharded"] == 0
    blocks = FAMILIES[family].config().num_hidden_layers
    assert two["sharded_blocks"] == blocks  # each block its own unit, then the root (the rest)
    assert two["sharded"] == two["parameters"] == one["parameters"]  # all DTensor shards between steps
    assert_same_training(one, two, family)
