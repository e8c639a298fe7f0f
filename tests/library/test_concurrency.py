"""One model, several threads; a forward that calls the model again (issue 12, points 1 and 3).

The capture state is per thread and per forward: every output must equal the output of the
same request run alone. On the old per-model state about a fifth to a half of the outputs
were the other request's (Average mixed the other thread's hidden states).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from conftest import TINY, attach, perturb_, tiny_bert

from peft_layerfusion import AverageConfig, DWAttConfig, ExtraLayersConfig, fused_positions
from peft_layerfusion.layer import fusion_layer_of

REQUESTS = 120


def requests(count: int = REQUESTS) -> list[torch.Tensor]:
    """``count`` distinct ``(2, 7)`` batches of token ids."""
    return [
        torch.randint(1, TINY["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(i))
        for i in range(count)
    ]


@contextmanager
def frequent_thread_switches() -> Iterator[None]:
    """Let the interpreter switch threads as often as it can, so interleavings really happen."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def run_in_threads(work, num_threads: int) -> list[BaseException]:
    """Run ``work(thread_index)`` in ``num_threads`` threads; the exceptions they raised."""
    errors: list[BaseException] = []

    def target(index: int) -> None:
        try:
            work(index)
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(num_threads)]
    with frequent_thread_switches():
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return errors


@pytest.mark.parametrize("config_cls", [DWAttConfig, AverageConfig])
@pytest.mark.parametrize("num_threads", [2, 3])
def test_threads_get_exactly_the_sequential_outputs(config_cls, num_threads):
    model, _ = attach(config_cls())
    perturb_(fusion_layer_of(model))
    batches = requests()
    with torch.no_grad():
        reference = [model(input_ids=ids).logits for ids in batches]
        with model.disable_adapter():
            plain = model(input_ids=batches[0]).logits
    assert not torch.allclose(reference[0], plain)  # the fusion matters for these outputs
    outputs: dict[int, torch.Tensor] = {}

    def work(thread: int) -> None:
        for i in range(thread, len(batches), num_threads):
            with torch.no_grad():
                outputs[i] = model(input_ids=batches[i]).logits

    errors = run_in_threads(work, num_threads)
    assert errors == []
    wrong = [i for i in range(len(batches)) if not torch.equal(outputs[i], reference[i])]
    assert wrong == [], f"{len(wrong)} of {len(batches)} outputs differ from the sequential ones"


def test_fused_positions_is_per_thread():
    """One thread fuses only where its mask says, the other everywhere: neither sees the other's mask."""
    model, _ = attach(DWAttConfig())
    perturb_(fusion_layer_of(model))
    batches = requests(60)
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[:, ::2] = True
    with torch.no_grad():
        everywhere = [model(input_ids=ids).logits for ids in batches]
        with fused_positions(model, mask):
            selected = [model(input_ids=ids).logits for ids in batches]
    assert not torch.equal(everywhere[0], selected[0])
    outputs: dict[tuple[int, int], torch.Tensor] = {}

    def work(thread: int) -> None:
        with torch.no_grad():
            for i, ids in enumerate(batches):
                if thread == 0:
                    with fused_positions(model, mask):
                        outputs[thread, i] = model(input_ids=ids).logits
                else:
                    outputs[thread, i] = model(input_ids=ids).logits

    assert run_in_threads(work, 2) == []
    assert all(torch.equal(outputs[0, i], selected[i]) for i in range(len(batches)))
    assert all(torch.equal(outputs[1, i], everywhere[i]) for i in range(len(batches)))


@pytest.mark.parametrize("config_cls", [DWAttConfig, ExtraLayersConfig])
def test_reentrant_forward_fuses_both_calls(config_cls, input_ids):
    """A block hook that calls the model again: outer and inner outputs are both exactly fused."""
    model, _ = attach(config_cls())
    perturb_(fusion_layer_of(model))
    other = torch.flip(input_ids, dims=[1])
    with torch.no_grad():
        outer_reference = model(input_ids=input_ids).logits
        inner_reference = model(input_ids=other).logits
        with model.disable_adapter():
            plain = model(input_ids=input_ids).logits
    inner_outputs = []

    def call_again(module, args, output):
        if not inner_outputs:  # once, not at the inner call's own pass through this block
            inner_outputs.append(None)
            inner_outputs[0] = model(input_ids=other).logits

    handle = model.base_model.model.bert.encoder.layer[1].register_forward_hook(call_again)
    with torch.no_grad():
        outer = model(input_ids=input_ids).logits
    handle.remove()
    assert torch.equal(inner_outputs[0], inner_reference)
    assert torch.equal(outer, outer_reference)
    assert not torch.allclose(outer, plain)


def test_each_thread_closes_its_own_capture():
    """After threaded forwards no capture stays open in any thread (nothing is kept alive)."""
    model, _ = attach(DWAttConfig(), tiny_bert())
    capture = fusion_layer_of(model).capture
    batches = requests(20)
    left_open = []

    def work(thread: int) -> None:
        with torch.no_grad():
            for ids in batches:
                model(input_ids=ids)
        left_open.append(capture._open)

    assert run_in_threads(work, 2) == []
    assert left_open == [None, None]
