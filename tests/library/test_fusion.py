"""The shared pieces of the fusion modules (fusion.py)."""

from __future__ import annotations

import pytest
import torch

from peft_layerfusion.fusion import linear_init_, stack_layers, weighted_sum


def test_weighted_sum_matches_the_stacked_formula_and_leaves_start_alone():
    generator = torch.Generator().manual_seed(0)
    states = [torch.randn(2, 5, 8, generator=generator) for _ in range(4)]
    weights = torch.softmax(torch.randn(4, generator=generator), dim=0)
    start = torch.randn(2, 5, 8, generator=generator)
    start_before = start.clone()

    reference = torch.einsum("k,kbsd->bsd", weights, stack_layers(states))
    torch.testing.assert_close(weighted_sum(zip(states, weights, strict=True)), reference)
    with_start = weighted_sum(zip(states, weights, strict=True), start=start)
    torch.testing.assert_close(with_start, start + reference)
    assert torch.equal(start, start_before)


def test_weighted_sum_takes_per_token_columns_and_passes_gradients():
    states = [torch.randn(6, 3, requires_grad=True) for _ in range(3)]
    columns = torch.rand(6, 3, requires_grad=True)  # (tokens, K)
    pairs = ((state, columns[:, n : n + 1]) for n, state in enumerate(states))
    weighted_sum(pairs).sum().backward()
    for n, state in enumerate(states):
        torch.testing.assert_close(state.grad, columns[:, n : n + 1].detach().expand(6, 3))
        torch.testing.assert_close(columns.grad[:, n], state.detach().sum(-1))


def test_weighted_sum_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        weighted_sum([])


def test_linear_init_bounds_follow_fan_in():
    weight, bias = torch.empty(3, 64, 32), torch.empty(3, 32)
    linear_init_(weight, bias, fan_in=64)
    bound = 64**-0.5
    assert weight.abs().max() <= bound and bias.abs().max() <= bound
    assert weight.abs().max() > 0.9 * bound  # really drawn over the whole range


def test_fusion_modules_realign_tensors_loaded_with_assign():
    from conftest import attach, fusion_of

    from peft_layerfusion import DWAttConfig

    model, _ = attach(DWAttConfig())
    module = fusion_of(model)
    state = module.state_dict()
    # what low_cpu_mem_usage loads: views into one file buffer, at offsets BLAS kernels treat differently
    size = sum(t.numel() for t in state.values())
    buffer, offset, views = torch.empty(size + 2 * len(state)), 1, {}
    for name, tensor in state.items():
        views[name] = buffer[offset : offset + tensor.numel()].view_as(tensor).copy_(tensor)
        offset += tensor.numel() + 1
    assert any(v.data_ptr() % 64 for v in views.values())
    module.load_state_dict(views, assign=True)
    loaded = [*module.parameters(), *module.buffers()]
    assert len(loaded) == len(state) and all(t.data_ptr() % 64 == 0 for t in loaded)
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, state[name]), name
