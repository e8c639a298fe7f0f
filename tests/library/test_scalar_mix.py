"""ScalarMix's bounded blend (``bounded_blend``, LayerMix's default): ``β = clamp(ρ, 0, 1)`` with a projected
gradient keeps the layer weights on the simplex, starts bitwise where the unbounded blend starts, with its
gradient, and comes back from a boundary; adapters saved without the field keep the unbounded blend."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import NO_DROPOUT, attach, fusion_of, tiny_bert
from peft import PeftModel, get_peft_model
from test_trainer import NUM_LABELS, mean_loss, quiet_arguments, token_examples
from tiny_decoders import FAMILIES
from transformers import Trainer

from peft_layerfusion import ScalarMixConfig
from peft_layerfusion.methods.scalar_mix import ProjectedClamp
from peft_layerfusion.registration import method_named

LAYER_MIX = method_named("layer_mix")


def layer_mix(start_layer: int | None = 2, **options) -> ScalarMixConfig:
    return LAYER_MIX.make_config(start_layer=start_layer, modules_to_save=["classifier"], **options)


def ids() -> torch.Tensor:
    return torch.randint(1, 50, (2, 7), generator=torch.Generator().manual_seed(1))


def logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits


def test_layer_mix_bounds_its_blend_and_plain_scalar_mix_does_not():
    assert LAYER_MIX.make_config().bounded_blend is True
    assert ScalarMixConfig().bounded_blend is False
    with pytest.raises(ValueError) as error:
        ScalarMixConfig(bounded_blend="yes")
    assert str(error.value) == "`bounded_blend`='yes' is not allowed: expected True or False."


@pytest.mark.parametrize(
    "rho, grad, passed",
    [
        (0.25, 2.0, 2.0), (0.25, -2.0, -2.0),  # inside: the gradient as it is
        (0.0, 2.0, 2.0), (1.0, -2.0, -2.0),  # on a boundary, pointing out: passed (the start trains)
        (-0.5, 2.0, 0.0), (1.5, -2.0, 0.0),  # outside, a descent step would move it further out: blocked
        (-0.5, -2.0, -2.0), (1.5, 2.0, 2.0),  # outside, a descent step moves it back: passed
    ],
)  # fmt: skip
def test_the_projected_clamp_passes_the_gradient_inside_and_back_in_only(rho, grad, passed):
    parameter = torch.tensor(rho, requires_grad=True)
    beta = ProjectedClamp.apply(parameter)
    (beta * grad).backward()
    assert beta.item() == min(max(rho, 0.0), 1.0)
    assert parameter.grad.item() == passed


def test_the_projected_clamp_runs_under_vmap():
    rho = torch.tensor([-0.5, 0.25, 1.5])
    assert torch.func.vmap(ProjectedClamp.apply)(rho).tolist() == [0.0, 0.25, 1.0]


def test_a_bounded_start_is_bitwise_the_unbounded_one_with_its_gradient():
    model, reference = attach(layer_mix(), tiny_bert(**NO_DROPOUT))
    unbounded, _ = attach(layer_mix(bounded_blend=False), tiny_bert(**NO_DROPOUT))
    assert fusion_of(model).mix_weights().tolist() == [0.0, 1.0, 0.0]  # e_2
    input_ids = ids()
    labels = torch.arange(14).view(2, 7) % NUM_LABELS
    assert torch.equal(logits(model, input_ids), logits(unbounded, input_ids))
    grads = []
    for peft_model in (model, unbounded):
        peft_model(input_ids=input_ids, labels=labels).loss.backward()
        grads.append(fusion_of(peft_model).blend.grad)
    assert grads[0].item() != 0.0 and torch.equal(grads[0], grads[1])  # the unbounded blend's gradient


def test_the_identity_start_on_a_decoder_is_bitwise_the_base_model():
    family = FAMILIES["llama"]
    base = family.build("causal")
    input_ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    expected = logits(base, input_ids)
    model = get_peft_model(base, LAYER_MIX.make_config())  # identity init on a decoder: one-hot on z_L
    assert fusion_of(model).bounded_blend and torch.equal(logits(model, input_ids), expected)


def steps(module, loss_of_weights, count: int, lr: float = 0.05) -> None:
    """``count`` Adam steps on the module's parameters, minimising ``loss_of_weights(s)``."""
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    for _ in range(count):
        optimizer.zero_grad()
        loss_of_weights(module.mix_weights()).backward()
        optimizer.step()


def test_steps_that_push_the_blend_out_leave_the_weights_on_the_simplex_and_it_comes_back():
    bounded, unbounded = (fusion_of(attach(layer_mix(bounded_blend=bound))[0]) for bound in (True, False))
    for module in (bounded, unbounded):
        with torch.no_grad():
            module.layer_logits.copy_(torch.tensor([0.5, 0.0, -0.5]))
    more_on_block_2 = lambda s: -s[1]  # noqa: E731  (dL/dβ > 0: pushes β below 0)
    steps(unbounded, more_on_block_2, 20)
    assert unbounded.blend.item() < -0.5 and unbounded.mix_weights().min().item() < -0.1  # off the simplex
    steps(bounded, more_on_block_2, 20)
    assert bounded.blend.item() < 0.0  # ρ stepped out once, and momentum carried it a little further
    assert bounded.blend_weight().item() == 0.0 and bounded.mix_weights().tolist() == [0.0, 1.0, 0.0]
    rho_out = bounded.blend.item()
    steps(bounded, more_on_block_2, 20)  # its own gradient is blocked outside: a fresh Adam never moves it
    assert bounded.blend.item() == rho_out
    less_on_block_2 = lambda s: s[1]  # noqa: E731  (dL/dβ < 0: pulls β in, then past 1)
    steps(bounded, less_on_block_2, 60)
    weights = bounded.mix_weights()
    assert bounded.blend_weight().item() == 1.0  # back in, across, and held at the upper boundary
    assert weights.min().item() >= 0.0 and abs(weights.sum().item() - 1.0) < 1e-6
    assert weights[1].item() < 0.2  # the mix has left block 2: w trained once β was above 0


def test_a_bounded_blend_outside_its_range_saves_and_reloads_bitwise(tmp_path):
    model, _ = attach(layer_mix(), tiny_bert(**NO_DROPOUT))
    with torch.no_grad():
        fusion_of(model).blend.fill_(1.7)  # a ρ an optimizer left beyond 1: read as β = 1
        fusion_of(model).layer_logits.copy_(torch.tensor([0.3, -0.2, 0.1]))
    model.eval()
    input_ids = ids()
    expected = logits(model, input_ids)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["bounded_blend"] is True
    reloaded = PeftModel.from_pretrained(tiny_bert(**NO_DROPOUT), tmp_path).eval()
    assert fusion_of(reloaded).blend.item() == pytest.approx(1.7)
    assert torch.equal(logits(reloaded, input_ids), expected)
    with torch.no_grad():
        fusion_of(model).blend.fill_(1.0)
    assert torch.equal(logits(model, input_ids), expected)  # ρ = 1.7 computes β = 1


def test_an_adapter_saved_without_the_field_loads_with_the_unbounded_blend(tmp_path):
    """As every adapter saved before the option (the legacy LayerMix of test_legacy_adapters among them)."""
    model, _ = attach(layer_mix(bounded_blend=False), tiny_bert(**NO_DROPOUT))
    with torch.no_grad():
        fusion_of(model).blend.fill_(-0.4)  # outside [0, 1]: the two readings differ here
        fusion_of(model).layer_logits.copy_(torch.tensor([3.0, -3.0, 0.0]))
    model.eval()
    input_ids = ids()
    unbounded = logits(model, input_ids)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    del saved["bounded_blend"]
    (tmp_path / "adapter_config.json").write_text(json.dumps(saved))
    reloaded = PeftModel.from_pretrained(tiny_bert(**NO_DROPOUT), tmp_path).eval()
    assert reloaded.peft_config["default"].bounded_blend is False
    assert torch.equal(logits(reloaded, input_ids), unbounded)
    assert fusion_of(reloaded).mix_weights().min().item() < -0.3  # e_2 - 0.4 (softmax - e_2): negative
    fusion_of(reloaded).bounded_blend = True  # the bounded reading of the same tensors: block 2 alone
    assert (logits(reloaded, input_ids) - unbounded).abs().max().item() > 1e-3


def test_the_trainer_trains_a_layer_mix_and_it_reloads_bitwise(tmp_path):
    model = get_peft_model(tiny_bert(num_labels=NUM_LABELS), layer_mix(task_type="TOKEN_CLS"))
    examples = token_examples()
    loss_before = mean_loss(model, examples)
    arguments = quiet_arguments(str(tmp_path / "run"), max_steps=8, learning_rate=1e-2)
    Trainer(model=model, args=arguments, train_dataset=examples).train()
    assert mean_loss(model, examples) < loss_before - 0.05
    module = fusion_of(model)
    assert module.blend.item() != 0.0 and module.layer_logits.abs().max().item() > 0.0  # the mix trained
    weights = module.mix_weights()
    assert weights.min().item() >= 0.0 and abs(weights.sum().item() - 1.0) < 1e-6
    model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(tiny_bert(num_labels=NUM_LABELS), tmp_path / "adapter").eval()
    batch = {key: torch.stack([example[key] for example in examples]) for key in examples[0]}
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, model.eval()(**batch).logits)
