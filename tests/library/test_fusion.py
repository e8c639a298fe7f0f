"""The shared pieces of the fusion modules (fusion.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import TOKEN_WISE_CONFIGS, attach, fusion_of, perturb_

from peft_layerfusion.fusion import (
    STACKED_TOKENS,
    inside_functorch,
    linear_init_,
    matrix_vector_step,
    runs_stacked,
    stack_layers,
    weighted_sum,
)
from peft_layerfusion.hooks import Capture
from peft_layerfusion.layer import fusion_layer_of
from peft_layerfusion.methods.concat import ConcatConfig
from peft_layerfusion.methods.dwatt import DWAttConfig, rows_linear


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


def small_step(num_states: int = 4, shape: tuple[int, ...] = (1, 1, 8)) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=generator) * (n + 1) ** 2 for n in range(num_states)]


def test_runs_stacked_only_without_autograd_on_small_float_inputs_in_eager_code():
    step = small_step()
    with torch.no_grad():
        assert runs_stacked(step)
        assert runs_stacked(small_step(shape=(2, STACKED_TOKENS // 2, 8)))
        assert not runs_stacked(small_step(shape=(2, STACKED_TOKENS // 2 + 1, 8)))  # too many positions
        assert not runs_stacked([state.bfloat16() for state in step])  # LayerNorm rounds otherwise
        assert not torch.func.vmap(lambda x: torch.tensor(runs_stacked([x] * 3)))(torch.ones(2, 1, 8)).any()
    assert not runs_stacked(step)  # a training step keeps the per-state path


def test_inside_functorch_is_true_under_vmap_only():
    assert not inside_functorch()
    assert torch.func.vmap(lambda x: x + inside_functorch())(torch.zeros(3)).tolist() == [1.0, 1.0, 1.0]


# the modules that look up runs_stacked / matrix_vector_step
STACKED_PLACES = (
    "peft_layerfusion.fusion",
    "peft_layerfusion.methods.dwatt",
    "peft_layerfusion.methods.concat",
)


def one_step(config, dtype: torch.dtype, positions: tuple[int, int]):
    """A perturbed fusion module in ``dtype``, the states it fuses and their capture (z_0 .. z_3 of
    ``(*positions, 32)``; with ``rms_after_norm``, a pre-norm stack's ``F`` and ``F(z_L)``)."""
    model, _ = attach(config)
    module = fusion_of(model).to(dtype)
    perturb_(module, scale=1.0)
    layers = fusion_layer_of(model).fused_layers["default"]
    capture = Capture([s.to(dtype) for s in small_step(4, (*positions, 32))], (), {})  # z_0 .. z_3
    if config.state_norm == "rms_after_norm":  # a pre-norm stack's F, with F(z_L) as the model computed it
        norm = torch.nn.RMSNorm(32, dtype=dtype)
        torch.nn.init.uniform_(norm.weight, 0.2, 300.0)
        capture = replace(capture, final_norm=norm, normed_last=norm(capture.states[-1]).detach())
    return module, [capture.states[n] for n in layers], capture


def patch_everywhere(monkeypatch, name: str, value: bool) -> None:
    for place in STACKED_PLACES:
        monkeypatch.setattr(f"{place}.{name}", lambda states: value, raising=False)


# Where a stacked forward's products are a batched matrix-vector product at one position while the per-state
# forward's are plain ones, which BLAS rounds otherwise: Concat's map in one product, DWAtt's value MLPs.
ONE_POSITION_PRODUCTS = (ConcatConfig, DWAttConfig)
STACKED_CASES = [
    (config_cls, positions)
    for config_cls in TOKEN_WISE_CONFIGS
    for positions in [(1, 1), (2, 7), (1, STACKED_TOKENS)]
    if not (config_cls is DWAttConfig and positions == (1, 1))  # the next test
]


@pytest.mark.parametrize("config_cls, positions", STACKED_CASES, ids=lambda x: getattr(x, "__name__", str(x)))
@pytest.mark.parametrize("state_norm", ["none", "rms", "rms_after_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_the_stacked_forward_gives_the_per_state_bits(config_cls, state_norm, dtype, positions, monkeypatch):
    """A short forward without autograd runs over a (K, tokens, d) stack; it must give the very bits of the
    per-state forward that training and long inputs run (after a final norm too). One position's
    products are set apart here (the next test): Concat's map in one product, DWAtt's batched
    matrix-vector products."""
    module, states, capture = one_step(
        config_cls(fusion_init="paper", state_norm=state_norm), dtype, positions
    )
    with torch.no_grad():
        assert runs_stacked(states)
        assert matrix_vector_step(states) == (positions == (1, 1))
        patch_everywhere(monkeypatch, "matrix_vector_step", False)
        stacked = module(states, capture)
        patch_everywhere(monkeypatch, "runs_stacked", False)
        per_state = module(states, capture)
    assert torch.equal(stacked, per_state)
    assert per_state.abs().max() > 0 and not torch.equal(per_state, capture.states[-1])  # something was mixed


@pytest.mark.parametrize("config_cls", ONE_POSITION_PRODUCTS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("state_norm", ["none", "rms", "rms_after_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_one_position_equals_the_per_state_forward_up_to_rounding(config_cls, state_norm, dtype, monkeypatch):
    """A batch-1 decoding step: Concat computes its map in one product, DWAtt its value MLPs as batched
    matrix-vector products read from the weights as stored (no copy): the per-state forward's values,
    summed in another order."""
    module, states, capture = one_step(config_cls(fusion_init="paper", state_norm=state_norm), dtype, (1, 1))
    with torch.no_grad():
        assert matrix_vector_step(states)
        step = module(states, capture)
        patch_everywhere(monkeypatch, "runs_stacked", False)
        per_state = module(states, capture)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(step, per_state, rtol=tolerance, atol=tolerance * per_state.abs().max().item())
    assert not torch.equal(per_state, capture.states[-1])  # something was mixed


def test_one_concat_step_is_one_linear_map_of_the_concatenated_states():
    module, states, capture = one_step(ConcatConfig(fusion_init="paper"), torch.float32, (1, 1))
    with torch.no_grad():
        step = module(states, capture)
        expected = module.proj(torch.cat(states, dim=-1))  # W [z_1; ...; z_K] + b: (1, 1, d)
    assert torch.equal(step, expected)


def test_dwatt_mlps_are_stored_as_linear_layers_and_read_so():
    """``U_k``, ``W_k`` ``(K, out, in)`` as ``nn.Linear`` stores them: each slice of the stacked product is
    ``W_k x + b_k`` (``nn.Linear``'s map), read as stored (the per-state product's bits, no copy kept)."""
    module, states, capture = one_step(DWAttConfig(fusion_init="paper"), torch.float32, (2, 3))
    mlps = module.value_mlps
    assert tuple(mlps.up.weight.shape) == (3, 16, 32) and tuple(mlps.down.weight.shape) == (3, 32, 16)
    assert all(p.is_contiguous() for p in mlps.parameters())
    x = torch.randn(3, 6, 32, generator=torch.Generator().manual_seed(0))  # (K, tokens, d)
    with torch.no_grad():
        stacked = mlps.up(x)  # (K, tokens, γd)
        for k in range(3):
            linear = torch.nn.functional.linear(x[k], mlps.up.weight[k], mlps.up.bias[k])  # (tokens, γd)
            torch.testing.assert_close(stacked[k], linear, rtol=1e-6, atol=1e-6)
            assert torch.equal(stacked[k], rows_linear(x[k], mlps.up.weight[k], mlps.up.bias[k]))
    assert [name for name, value in vars(mlps).items() if isinstance(value, (torch.Tensor, tuple))] == []
