"""Everything PEFT users combine with layer fusion, on decoder-only LLMs (issue 26 item 6).

Each combination runs on tiny Llama, Qwen3 and GPT-2 causal LMs (``tiny_decoders.py``; GPT-2's
attention projection is one ``Conv1D``, ``c_attn``, that stores ``W`` transposed), with the fusion
and LoRA in ONE adapter (``DWAttConfig(target_modules=[...])``):

* fusion + LoRA = the fusion's formula (R+n: the appended blocks) on the residual stream of the
  model with the same LoRA weights alone (peft's own ``LoraConfig``), then its final norm and head;
* save / load: every tensor and the logits of the reloaded adapter bitwise the trained ones;
* ``Trainer``: a few steps lower the loss and move every LoRA and fusion weight and no base weight;
  ``save_model`` then ``PeftModel.from_pretrained`` gives the trained logits bitwise;
* bf16 (the whole PeftModel cast, or a bf16 base with float32 adapter weights): forward and
  backward run, and the output is the float32 recomputation on the bf16 stream within bf16 rounding;
* ``torch.compile``: the compiled forward equals the eager one;
* two adapters: ``set_adapter`` gives exactly each adapter's own outputs (the adapter alone on the
  same base), ``disable_adapter()`` exactly the base's;
* ``merge_adapter()`` folds the LoRA part into the base weights and the fusion keeps running;
  ``merge_and_unload()`` raises with one line saying what to do instead;
* cached generation equals uncached forwards with fusion + LoRA.

Gradient checkpointing with fusion + LoRA (Llama and GPT-2) is in ``test_decoders.py``; data-parallel
training of a decoder in ``test_ddp.py``.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import fusion_of
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from test_decoder_generation import NEW_TOKENS, assert_scores_close, cached_generate, uncached_greedy
from test_methods import REFERENCES
from test_trainer import mean_loss, quiet_arguments
from tiny_decoders import (
    FAMILIES,
    adapted,
    head_output,
    residual_stream,
    rule_rows,
    token_ids,
    with_blocks_appended,
)
from transformers import Trainer

from peft_layerfusion import ExtraLayersConfig
from peft_layerfusion.layer import fusion_layer_of
from peft_layerfusion.registration import ENCODER_METHODS, method_named

FAMILY_NAMES = ["llama", "qwen3", "gpt2"]
METHOD_IDS = [method.name for method in ENCODER_METHODS]
DWATT = method_named("dwatt")
ATOL = 2e-5


def causal_inputs() -> dict[str, torch.Tensor]:
    ids = token_ids()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def logits_of(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


def config_for(method, name: str, r: int = 4, **options):
    """``method``'s config with LoRA on the family's attention projections: one adapter."""
    if method.config_cls is ExtraLayersConfig:
        options.setdefault("num_extra_layers", 1)
    return method.make_config(task_type="CAUSAL_LM", **FAMILIES[name].lora(r), **options)


def with_trained_lora(model: torch.nn.Module, seed: int = 11, scale: float = 0.2) -> torch.nn.Module:
    """``model`` with noise on every LoRA weight (LoRA's ``B`` starts at zero: the LoRA part then
    changes nothing)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(scale * torch.randn(param.shape, generator=generator).to(param.dtype))
    return model


def combined(name: str, method=DWATT, **options) -> PeftModel:
    """A fusion + LoRA adapter on the family's causal LM, both parts perturbed away from their init."""
    return with_trained_lora(adapted(FAMILIES[name].build("causal"), config_for(method, name, **options)))


def lora_only(name: str, model: PeftModel, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The family's base with ``model``'s LoRA weights alone, through peft's own ``LoraConfig``.

    ``dtype``: the base's; LoRA's weights stay float32 as peft keeps them on a bf16 base, unless
    ``model``'s own are bf16 (a PeftModel cast as a whole).
    """
    config = model.peft_config["default"]
    options = {"target_modules": config.target_modules, "r": config.r, "lora_alpha": config.lora_alpha}
    lora = get_peft_model(
        FAMILIES[name].build("causal").to(dtype), LoraConfig(**options, fan_in_fan_out=config.fan_in_fan_out)
    )
    weights = {key: value for key, value in model.state_dict().items() if "lora_" in key}
    adapter_dtype = next(iter(weights.values())).dtype
    lora = lora.to(adapter_dtype) if adapter_dtype != torch.float32 else lora  # a PeftModel cast whole
    loaded = lora.load_state_dict(weights, strict=False)
    assert not loaded.unexpected_keys and not [key for key in loaded.missing_keys if "lora_" in key]
    return lora.get_base_model().eval()


def recomputed(name: str, model: PeftModel, method, inputs: dict, dtype: torch.dtype = torch.float32):
    """The logits of ``model`` recomputed: the fusion's formula (in float32) on the residual stream of
    the LoRA-only model, then that model's final norm and head; R+n: its blocks appended."""
    family = FAMILIES[name]
    reference = lora_only(name, model, dtype)
    module = fusion_of(model)
    if method.config_cls is ExtraLayersConfig:
        return logits_of(with_blocks_appended(family, reference, list(module.blocks)), inputs)
    states = [state.float() for state in residual_stream(family, reference, inputs)]
    with torch.no_grad():
        h = REFERENCES[method.config_cls](states, list(range(1, len(states))), copy.deepcopy(module).float())
    return head_output(family, reference, "causal", h.to(dtype), inputs)


# ----------------------------------------------------------------------------- fusion + LoRA
@pytest.mark.parametrize("method", ENCODER_METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_fusion_and_lora_in_one_adapter_equal_the_recomputation(name, method):
    model = combined(name, method)
    assert list(model.peft_config) == ["default"]  # one adapter holds both parts
    trainable = [key for key, param in model.named_parameters() if param.requires_grad]
    assert any("lora_B" in key for key in trainable)
    fusion_trains = any(".layer_fusion." in key for key in trainable)
    assert fusion_trains == bool(list(fusion_of(model).parameters()))  # Average has no parameter
    inputs = causal_inputs()
    got = logits_of(model, inputs)
    torch.testing.assert_close(got, recomputed(name, model, method, inputs), atol=ATOL, rtol=1e-5)
    lora_alone = logits_of(lora_only(name, model), inputs)
    assert (lora_alone - logits_of(FAMILIES[name].build("causal"), inputs)).abs().max() > 1e-3  # LoRA acts
    assert (got - lora_alone).abs().max() > 1e-3  # and so does the fusion


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_fusion_and_lora_reload_bitwise(name, method, tmp_path):
    model = combined(name, method)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert sorted(saved["target_modules"]) == sorted(FAMILIES[name].lora_targets)
    reloaded = PeftModel.from_pretrained(FAMILIES[name].build("causal"), tmp_path).eval()
    trained, loaded = model.state_dict(), reloaded.state_dict()
    assert trained.keys() == loaded.keys()
    for key, tensor in trained.items():
        assert torch.equal(loaded[key], tensor), key
    inputs = causal_inputs()
    assert torch.equal(logits_of(reloaded, inputs), logits_of(model, inputs))


# ----------------------------------------------------------------------------- Trainer
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_trainer_trains_fusion_and_lora_then_reloads_bitwise(name, tmp_path):
    torch.manual_seed(0)
    model = get_peft_model(FAMILIES[name].build("causal"), config_for(DWATT, name))  # fusion_init: identity
    before = {key: param.detach().clone() for key, param in model.named_parameters()}
    rows = rule_rows()
    loss_before = mean_loss(model, rows)
    arguments = quiet_arguments(str(tmp_path / "run"), max_steps=20, learning_rate=2e-2)
    Trainer(model=model, args=arguments, train_dataset=rows).train()
    loss_after = mean_loss(model, rows)
    print(f"loss {loss_before:.4f} -> {loss_after:.4f}")
    assert loss_after < loss_before - 0.1, (loss_before, loss_after)  # measured 0.15 to 0.23
    for key, param in model.named_parameters():
        moved = not torch.equal(param, before[key])
        assert moved == param.requires_grad, key  # every LoRA and fusion weight, no base weight
    assert any("lora_" in key for key, p in model.named_parameters() if p.requires_grad)
    assert any(".layer_fusion." in key for key, p in model.named_parameters() if p.requires_grad)

    Trainer(model=model, args=arguments).save_model(str(tmp_path / "adapter"))
    reloaded = PeftModel.from_pretrained(FAMILIES[name].build("causal"), tmp_path / "adapter").eval()
    inputs = causal_inputs()
    assert torch.equal(logits_of(reloaded, inputs), logits_of(model.eval(), inputs))


# ----------------------------------------------------------------------------- bf16, torch.compile
@pytest.mark.parametrize("where", ["bf16_peft_model", "bf16_base"])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_bf16_runs_forward_and_backward_and_stays_the_recomputation(name, where):
    fp32 = combined(name)
    inputs = causal_inputs()
    expected_fp32 = logits_of(fp32, inputs)
    if where == "bf16_peft_model":  # everything cast, the adapter's weights included
        model, adapter_dtype = fp32.to(torch.bfloat16), torch.bfloat16
    else:  # a bf16 base gets the adapter: peft keeps LoRA in float32, the fusion module is built so
        model = get_peft_model(FAMILIES[name].build("causal").to(torch.bfloat16), config_for(DWATT, name))
        set_peft_model_state_dict(model, get_peft_model_state_dict(fp32))
        adapter_dtype = torch.float32
    assert {param.dtype for param in model.parameters() if param.requires_grad} == {adapter_dtype}
    got = logits_of(model.eval(), inputs)
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    expected = recomputed(name, model, DWATT, inputs, dtype=torch.bfloat16)
    # bf16 rounding of the fusion's arithmetic (measured up to 0.005 cast whole, 0 on a bf16 base)
    torch.testing.assert_close(got, expected, atol=0.01, rtol=0.01)
    torch.testing.assert_close(got.float(), expected_fp32, atol=0.02, rtol=0.02)  # measured up to 0.006
    plain = logits_of(FAMILIES[name].build("causal").to(torch.bfloat16), inputs)
    assert (got - plain).abs().max() > 0.3  # far beyond the tolerance: the adapter acts in bf16

    model.train()
    model(**inputs, labels=inputs["input_ids"], use_cache=False).loss.backward()
    for key, param in model.named_parameters():
        if param.requires_grad:
            assert param.grad is not None and param.grad.dtype == adapter_dtype, key
            assert torch.isfinite(param.grad).all() and param.grad.abs().max() > 0, key


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_compiled_forward_equals_eager(name):
    dynamo = pytest.importorskip("torch._dynamo", reason="torch without torch.compile")
    testing = pytest.importorskip("torch._dynamo.testing")
    if not dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not supported on this Python")
    model = combined(name)
    inputs = causal_inputs()
    eager = logits_of(model, inputs)
    dynamo.reset()
    # aot_eager: dynamo captures the forward, hooks included, and AOTAutograd traces it; inductor's
    # code generation (minutes for these graphs on a CPU) adds nothing the fusion could get wrong
    counter = testing.CompileCounterWithBackend("aot_eager")
    try:
        got = logits_of(torch.compile(model, backend=counter), inputs)
    finally:
        dynamo.reset()
    assert counter.frame_count >= 1 and counter.op_count > 0  # it compiled, not fell back to eager
    torch.testing.assert_close(got, eager, atol=ATOL, rtol=1e-5)
    assert (got - logits_of(FAMILIES[name].build("causal"), inputs)).abs().max() > 1e-3


def graph_break_hook(module: torch.nn.Module, args: tuple) -> None:
    """A forward pre-hook that makes dynamo break the graph there (eager: does nothing)."""
    torch._dynamo.graph_break()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_compiled_forward_with_a_graph_break_after_the_blocks_equals_eager(name):
    """Issue 37 item 1: a graph break after the block container (in the LM head; GPT-2 with ``labels``
    in the loss) split the forward, and the per-thread counts the "did the adapter run" check reads
    stayed behind (dynamo dropped attributes set on a ``threading.local`` subclass): a false
    "did not run" on every call. Now the compiled logits and loss equal eager ones, no error."""
    dynamo = pytest.importorskip("torch._dynamo", reason="torch without torch.compile")
    testing = pytest.importorskip("torch._dynamo.testing")
    if not dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not supported on this Python")
    model = combined(name)
    model.get_output_embeddings().register_forward_pre_hook(graph_break_hook)
    inputs = {**causal_inputs(), "labels": token_ids(), "use_cache": False}
    with torch.no_grad():
        eager = model(**inputs)
    dynamo.reset()
    counter = testing.CompileCounterWithBackend("aot_eager")
    try:
        compiled = torch.compile(model, backend=counter)
        with torch.no_grad():
            outputs = [compiled(**inputs) for _ in range(2)]  # the second call runs the compiled graphs
    finally:
        dynamo.reset()
    assert counter.frame_count >= 2  # the graph did break
    for got in outputs:
        assert torch.equal(got.logits, eager.logits) and torch.equal(got.loss, eager.loss)
    assert (eager.logits - logits_of(FAMILIES[name].build("causal"), causal_inputs())).abs().max() > 1e-3


# ----------------------------------------------------------------------------- several adapters
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_set_adapter_gives_each_adapters_own_outputs(name, tmp_path):
    inputs = causal_inputs()
    model = combined(name)  # "default": DWAtt over z_1..z_L, LoRA r = 4
    second = with_trained_lora(combined(name, layers=[0, -1], r=2), seed=12, scale=0.5)
    own = {"default": logits_of(model, inputs), "second": logits_of(second, inputs)}
    assert (own["default"] - own["second"]).abs().max() > 1e-3
    second.save_pretrained(tmp_path)
    model.load_adapter(tmp_path, adapter_name="second")
    assert torch.equal(logits_of(model, inputs), own["default"])  # loading does not activate
    for adapter in ("second", "default", "second"):
        model.set_adapter(adapter)
        assert torch.equal(logits_of(model, inputs), own[adapter]), adapter
    with model.disable_adapter():
        assert torch.equal(logits_of(model, inputs), logits_of(FAMILIES[name].build("causal"), inputs))
    assert torch.equal(logits_of(model, inputs), own["second"])  # enabled again


# ----------------------------------------------------------------------------- merging
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_merge_adapter_merges_lora_and_the_fusion_keeps_running(name):
    model = combined(name)
    inputs = causal_inputs()
    before = logits_of(model, inputs)
    with pytest.raises(NotImplementedError) as refused:
        model.merge_and_unload()
    message = str(refused.value)
    assert "\n" not in message and "merge_adapter()" in message and "unload()" in message
    assert torch.equal(logits_of(model, inputs), before)  # the refusal changed nothing

    lora_layers = [module for module in model.modules() if isinstance(module, LoraLayer)]
    weights = [layer.get_base_layer().weight.detach().clone() for layer in lora_layers]
    model.merge_adapter()
    assert lora_layers and all(layer.merged for layer in lora_layers)
    assert not fusion_layer_of(model).merged  # nothing of the fusion can be merged: it keeps running
    for layer, weight in zip(lora_layers, weights, strict=True):
        assert not torch.equal(layer.get_base_layer().weight, weight)  # B A folded in
    merged = logits_of(model, inputs)
    torch.testing.assert_close(merged, before, atol=ATOL, rtol=1e-5)
    assert (merged - logits_of(lora_only(name, model), inputs)).abs().max() > 1e-3  # the fusion still runs

    model.unmerge_adapter()
    assert not any(layer.merged for layer in lora_layers)
    torch.testing.assert_close(logits_of(model, inputs), before, atol=ATOL, rtol=1e-5)


# ----------------------------------------------------------------------------- generation
@pytest.mark.parametrize("method", ENCODER_METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_cached_generation_with_fusion_and_lora_equals_uncached(name, method):
    model = combined(name, method)
    ids = token_ids(2, 5)
    tokens, scores = uncached_greedy(model, ids)
    out = cached_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids))
    assert torch.equal(out.sequences[:, -NEW_TOKENS:], tokens)
    assert_scores_close(out.logits, scores)
