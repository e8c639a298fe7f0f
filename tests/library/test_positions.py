"""``fused_positions``: fusing only the read positions gives the same numbers there."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F
from conftest import NO_DROPOUT, TOKEN_WISE_CONFIGS, attach, fusion_of, perturb_, perturbed_bert, tiny_bert
from tiny_decoders import FAMILIES, NAMES, adapted, token_ids, with_blocks

from peft_layerfusion import (
    DWAttConfig,
    ExtraLayersConfig,
    count_hooks,
    fused_positions,
)
from peft_layerfusion.hooks import first_tensor
from peft_layerfusion.layer import fusion_layer_of

TOKEN_WISE = TOKEN_WISE_CONFIGS


@pytest.fixture
def selected() -> torch.Tensor:
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[0, [1, 2, 5]] = True
    mask[1, [0, 3]] = True
    return mask


def fused_and_grads(model, input_ids, attention_mask, labels, mask=None):
    model.zero_grad()
    if mask is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    else:
        with fused_positions(model, mask):
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


@pytest.mark.parametrize("config_class", TOKEN_WISE)
def test_selected_positions_match_full_fusion(config_class, input_ids, attention_mask, selected):
    model, _ = attach(config_class(modules_to_save=["classifier"]), tiny_bert(**NO_DROPOUT))
    perturb_(fusion_of(model))
    labels = torch.where(selected, torch.arange(14).view(2, 7) % 5, torch.full_like(input_ids, -100))
    full_logits, full_grads = fused_and_grads(model, input_ids, attention_mask, labels)
    part_logits, part_grads = fused_and_grads(model, input_ids, attention_mask, labels, selected)

    torch.testing.assert_close(part_logits[selected], full_logits[selected], atol=1e-5, rtol=1e-5)
    has_params = any(True for _ in fusion_of(model).parameters())
    assert full_grads.keys() == part_grads.keys()
    assert any("fusion" in name for name in full_grads) == has_params
    for name, grad in full_grads.items():
        torch.testing.assert_close(part_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_other_positions_get_the_last_block_output(input_ids, attention_mask, selected):
    model, reference = attach(DWAttConfig(), tiny_bert(**NO_DROPOUT))
    perturb_(fusion_of(model))
    seen = []
    handle = fusion_layer_of(model).located.container.register_forward_hook(
        lambda module, args, output: seen.append(output if isinstance(output, torch.Tensor) else output[0])
    )
    with torch.no_grad(), fused_positions(model, selected):
        model(input_ids=input_ids, attention_mask=attention_mask)
    handle.remove()
    plain = reference(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    last = plain.hidden_states[-1]  # z_L of the untouched base
    torch.testing.assert_close(seen[0][~selected], last[~selected])
    assert not torch.allclose(seen[0][selected], last[selected], atol=1e-3)  # fused there


@pytest.mark.parametrize("config_class", TOKEN_WISE)
def test_an_empty_selection_gives_the_unfused_model(config_class, input_ids, attention_mask):
    model, reference = attach(config_class(), tiny_bert(**NO_DROPOUT))
    with torch.no_grad(), fused_positions(model, torch.zeros(2, 7, dtype=torch.bool)):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    with torch.no_grad():
        plain = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(logits, plain)


def test_position_mixing_methods_ignore_the_mask(input_ids, attention_mask, selected):
    model, _ = attach(ExtraLayersConfig(num_extra_layers=1), tiny_bert(**NO_DROPOUT))
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask).logits
        with fused_positions(model, selected):
            part = model(input_ids=input_ids, attention_mask=attention_mask).logits
    assert torch.equal(full, part)


def test_the_restriction_ends_with_the_block_even_on_error(input_ids, selected):
    model, _ = attach(DWAttConfig())
    layer = fusion_layer_of(model)
    with pytest.raises(RuntimeError, match="boom"), fused_positions(model, selected):
        assert layer.positions is selected
        raise RuntimeError("boom")
    assert layer.positions is None


def test_a_disabled_adapter_gives_the_base_outputs_everywhere(input_ids, selected):
    model, reference = attach(DWAttConfig())
    perturb_(fusion_of(model))
    with torch.no_grad():
        plain = reference(input_ids=input_ids).logits
        with model.disable_adapter(), fused_positions(model, selected):
            disabled = model(input_ids=input_ids).logits
        with fused_positions(model, selected):
            enabled = model(input_ids=input_ids).logits
    assert torch.equal(disabled, plain)
    assert (enabled[selected] - plain[selected]).abs().max() > 1e-3  # fused where selected ...
    assert torch.equal(enabled[~selected], plain[~selected])  # ... z_L elsewhere


def test_a_model_without_fusion_layer_is_accepted(input_ids, selected):
    model = tiny_bert()
    with torch.no_grad(), fused_positions(model, selected):  # no layer to restrict: no error
        inside = model(input_ids=input_ids).logits
    assert inside.shape == (2, 7, 5) and count_hooks(model) == 0


@pytest.mark.parametrize(
    "mask, expected",
    [
        (torch.ones(2, 7, dtype=torch.long), "boolean"),
        (torch.ones(14, dtype=torch.bool), "boolean"),
        ([[True]], "boolean"),
    ],
)
def test_bad_masks_are_refused(mask, expected):
    model, _ = attach(DWAttConfig())
    with pytest.raises(ValueError, match=expected), fused_positions(model, mask):
        pass


def test_a_mask_of_another_batch_is_refused(input_ids):
    model, _ = attach(DWAttConfig())
    with (
        pytest.raises(ValueError, match=r"\(3, 7\).*\(2, 7\)"),
        fused_positions(model, torch.ones(3, 7, dtype=torch.bool)),
    ):
        model(input_ids=input_ids)


# post-norm BERT (the container's output is z_L) and every decoder family with a token head (pre-norm:
# fused at the final norm), 3 blocks each so that a state can be freed before the fusion runs
TOKEN_HEAD_FAMILIES = ["bert"] + [name for name in NAMES if "token" in FAMILIES[name].heads]


def three_block_token_model(family: str, config_class) -> tuple[torch.nn.Module, torch.Tensor]:
    """A 3-block token classifier of ``family`` with a perturbed ``config_class`` fusion, and its inputs."""
    if family == "bert":
        return perturbed_bert(config_class(modules_to_save=["classifier"]))
    return adapted(with_blocks(family, "token", 3), config_class(task_type="TOKEN_CLS")), token_ids()


def forward_seen_by_the_fusion(model, input_ids, mask, grad: bool):
    """Logits of an eval forward under ``fused_positions(mask)``, the shapes of the states the fusion
    module received (those captured: in eval mode, the fused ones and ``z_L``), whether the capture
    gathered them as the blocks ran, and whether block 0's whole output was still alive when it ran."""
    layer = fusion_layer_of(model)
    outputs: list[weakref.ref] = []
    seen: dict = {}

    def at_fusion(module, args):
        seen["shapes"] = [tuple(state.shape) for state in args[1].states if state is not None]
        seen["gathered"] = args[1].selected is not None
        seen["first_alive"] = outputs[0]() is not None

    handles = [
        layer.located.blocks[0].register_forward_hook(
            lambda m, a, output: outputs.append(weakref.ref(first_tensor(output)))
        ),
        fusion_of(model).register_forward_pre_hook(at_fusion),
    ]
    try:
        with torch.set_grad_enabled(grad), fused_positions(model, mask):
            logits = model(input_ids=input_ids).logits.detach()
    finally:
        for handle in handles:
            handle.remove()
    return logits, seen


@pytest.mark.parametrize("family", TOKEN_HEAD_FAMILIES)
@pytest.mark.parametrize("config_class", TOKEN_WISE)
def test_a_no_grad_forward_keeps_each_state_at_the_read_positions_only(config_class, family, selected):
    # Without an autograd graph the capture gathers z_0 .. z_{L-1} at the read positions as the blocks
    # run, and each whole state is freed once the next block has read it; the logits are those of the
    # same forward with grad (where the capture keeps the whole states and the fusion gathers), bitwise.
    model, input_ids = three_block_token_model(family, config_class)
    gathered, lean = forward_seen_by_the_fusion(model, input_ids, selected, grad=False)
    whole, kept = forward_seen_by_the_fusion(model, input_ids, selected, grad=True)
    assert torch.equal(gathered, whole)
    assert lean["shapes"] == kept["shapes"]  # (1, selected, d) each, as the module reads them
    assert lean["shapes"][0][:2] == (1, int(selected.sum()))
    assert not lean["first_alive"] and kept["first_alive"]


def test_a_no_grad_forward_of_a_mixing_method_keeps_the_whole_states(input_ids, selected):
    # R+n attends over every position: the mask is ignored and nothing is gathered. It reads z_L alone,
    # so in eval mode the capture holds only that and the last block's input (hooked for its call).
    model, _ = attach(ExtraLayersConfig(num_extra_layers=1), tiny_bert(**NO_DROPOUT))
    _, seen = forward_seen_by_the_fusion(model, input_ids, selected, grad=False)
    assert not seen["gathered"] and seen["shapes"] == [(2, 7, 32)] * 2
