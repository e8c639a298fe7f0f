"""The PEFT lifecycle: save/load, several adapters, disable, unload, merge, parameter counts."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ENCODER_CONFIGS, ToyEncoder, attach, fusion_of, perturb_, tiny_bert
from peft import PeftModel, get_peft_model
from tiny_decoders import FAMILIES

from peft_layerfusion import (
    AverageConfig,
    ConcatConfig,
    DWAttConfig,
    ExtraLayersConfig,
    LayerFusionLayer,
    ScalarMixConfig,
    count_hooks,
)
from peft_layerfusion.layer import fusion_layer_of
from peft_layerfusion.registration import method_named

ALL_CONFIGS = ENCODER_CONFIGS


def logits(model, input_ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits


def trained(config, seed: int = 0):
    """A PeftModel whose fusion module and head moved away from their init."""
    model, reference = attach(config, seed=seed)
    perturb_(fusion_of(model), seed=seed + 7)
    perturb_(model.base_model.model.classifier.modules_to_save["default"], seed=seed + 8)
    return model, reference


@pytest.mark.parametrize("config_cls", ALL_CONFIGS)
@pytest.mark.parametrize("low_cpu_mem_usage", [False, True], ids=["plain", "low_cpu_mem"])
def test_save_load_round_trip_is_bitwise(config_cls, low_cpu_mem_usage, tmp_path, input_ids):
    model, _ = trained(config_cls(modules_to_save=["classifier"]))
    expected = logits(model, input_ids)
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(tiny_bert(), tmp_path, low_cpu_mem_usage=low_cpu_mem_usage).eval()
    assert torch.equal(logits(loaded, input_ids), expected)
    assert type(loaded.peft_config["default"]) is config_cls


def test_load_in_fresh_process(tmp_path, input_ids):
    """A new interpreter: importing peft_layerfusion is all it takes to load every method."""
    for config_cls in ALL_CONFIGS:
        model, _ = trained(config_cls(modules_to_save=["classifier"]))
        model.save_pretrained(tmp_path / config_cls.PEFT_TYPE)
        torch.save(logits(model, input_ids), tmp_path / f"{config_cls.PEFT_TYPE}.pt")
    torch.save(input_ids, tmp_path / "ids.pt")
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parents[1])!r})
        import peft_layerfusion
        from peft import PeftModel
        from conftest import tiny_bert
        ids = torch.load({str(tmp_path / "ids.pt")!r})
        for name in {[c.PEFT_TYPE for c in ALL_CONFIGS]!r}:
            model = PeftModel.from_pretrained(tiny_bert(), {str(tmp_path)!r} + "/" + name).eval()
            with torch.no_grad():
                got = model(input_ids=ids).logits
            assert torch.equal(got, torch.load({str(tmp_path)!r} + f"/{{name}}.pt")), name
        print("ok", len({[c.PEFT_TYPE for c in ALL_CONFIGS]!r}))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"ok {len(ALL_CONFIGS)}" in result.stdout


def test_several_named_adapters(input_ids, tmp_path):
    model, reference = trained(DWAttConfig(modules_to_save=["classifier"]))
    first = logits(model, input_ids)
    torch.manual_seed(5)
    model.add_adapter("other", DWAttConfig(layers=[0, 3], modules_to_save=["classifier"]))
    layer = next(m for m in model.modules() if isinstance(m, LayerFusionLayer))
    assert set(layer.fusion_modules) == {"default", "other"}
    assert fusion_of(model, "other").num_fused == 2
    assert logits(model, input_ids).equal(first)  # adding does not activate
    perturb_(fusion_of(model, "other"), seed=99)
    model.set_adapter("other")
    second = logits(model, input_ids)
    assert (second - first).abs().max() > 1e-3
    model.set_adapter("default")
    assert torch.equal(logits(model, input_ids), first)
    # only the active adapter's parameters train
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(".default." in n for n in trainable) and not any(".other." in n for n in trainable)

    model.delete_adapter("other")
    assert "other" not in layer.fusion_modules and "other" not in model.peft_config
    assert not any(".other." in n for n, _ in model.named_parameters())
    assert "other" not in model.base_model.model.classifier.modules_to_save
    assert torch.equal(logits(model, input_ids), first)
    with model.disable_adapter():
        assert torch.equal(logits(model, input_ids), logits(reference, input_ids))


def test_deleting_the_active_adapter_switches_to_the_other(input_ids):
    model, reference = trained(ConcatConfig(modules_to_save=["classifier"]))
    model.add_adapter("other", ConcatConfig(layers=[0], modules_to_save=["classifier"]))
    model.set_adapter("other")
    other = logits(model, input_ids)
    model.set_adapter("default")
    with pytest.warns(UserWarning, match="Setting active adapter to other"):
        model.delete_adapter("default")
    assert model.active_adapters == ["other"]
    assert set(fusion_layer_of(model).fusion_modules) == {"other"}
    assert torch.equal(logits(model, input_ids), other)


@pytest.mark.parametrize(
    "head, task_type, allowed",
    [
        ("causal", "SEQ_CLS", "['CAUSAL_LM', 'FEATURE_EXTRACTION'] or None for a LlamaForCausalLM"),
        ("seq", "TOKEN_CLS", "['SEQ_CLS', 'FEATURE_EXTRACTION'] or None for a "
         "LlamaForSequenceClassification"),
        ("token", "CAUSAL_LM", "['TOKEN_CLS', 'FEATURE_EXTRACTION'] or None for a "
         "LlamaForTokenClassification"),
    ],
)  # fmt: skip
def test_a_task_type_the_model_has_no_head_for_is_refused_in_one_line(head, task_type, allowed):
    base = FAMILIES["llama"].build(head)
    with pytest.raises(ValueError) as error:
        get_peft_model(base, method_named("layer_mix").make_config(task_type=task_type))
    assert str(error.value) == f"`task_type`={task_type!r} is not allowed: expected one of {allowed}."
    assert not any("layer_fusion" in name for name, _ in base.named_modules())


@pytest.mark.parametrize("task_type", [None, "FEATURE_EXTRACTION", "SEQ_CLS"])
def test_a_task_type_is_taken_where_the_model_fits_it_or_is_no_known_task_model(task_type):
    model = get_peft_model(FAMILIES["llama"].build("seq"), DWAttConfig(task_type=task_type))
    assert model.peft_config["default"].task_type == task_type
    toy = DWAttConfig(task_type="SEQ_CLS", blocks_path="stack.blocks", modules_to_save=["head"])
    get_peft_model(ToyEncoder(), toy)  # no transformers task model: any task type


@pytest.mark.parametrize("config_cls", [DWAttConfig, ExtraLayersConfig])
def test_task_type_token_cls(config_cls, tmp_path, input_ids):
    model, _ = attach(config_cls(task_type="TOKEN_CLS"))
    assert type(model).__name__ == "PeftModelForTokenClassification"
    head = model.base_model.model.classifier
    assert all(p.requires_grad for p in head.modules_to_save["default"].parameters())
    perturb_(head.modules_to_save["default"])
    perturb_(fusion_of(model))
    expected = logits(model, input_ids)
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(tiny_bert(), tmp_path).eval()
    assert torch.equal(logits(loaded, input_ids), expected)


def test_adapters_of_another_type_are_refused():
    model, _ = attach(DWAttConfig())
    with pytest.raises(ValueError, match="different peft types"):
        model.add_adapter("second", ScalarMixConfig())


def test_save_and_load_several_adapters(tmp_path, input_ids):
    model, _ = trained(DWAttConfig(modules_to_save=["classifier"]))
    model.add_adapter("other", DWAttConfig(layers=[0, 3], modules_to_save=["classifier"]))
    perturb_(fusion_of(model, "other"), seed=42)
    first = logits(model, input_ids)
    model.set_adapter("other")
    second = logits(model, input_ids)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "other" / "adapter_model.safetensors").exists()

    loaded = PeftModel.from_pretrained(tiny_bert(), tmp_path).eval()
    loaded.load_adapter(tmp_path / "other", adapter_name="other")  # goes through inject_adapter directly
    assert torch.equal(logits(loaded, input_ids), first)
    loaded.set_adapter("other")
    assert torch.equal(logits(loaded, input_ids), second)


def test_loaded_adapter_can_be_trained_further(tmp_path, input_ids):
    model, _ = trained(DWAttConfig(modules_to_save=["classifier"]))
    model.save_pretrained(tmp_path)
    frozen = PeftModel.from_pretrained(tiny_bert(), tmp_path)
    assert not any(p.requires_grad for p in frozen.parameters())
    loaded = PeftModel.from_pretrained(tiny_bert(), tmp_path, is_trainable=True)
    trainable = [n for n, p in loaded.named_parameters() if p.requires_grad]
    assert len(trainable) == 16 + 2  # every DWAtt parameter and the head
    loaded(input_ids=input_ids).logits.square().sum().backward()
    assert all(p.grad is not None for p in fusion_of(loaded).parameters())


def test_disable_adapter_gives_exact_base(input_ids):
    model, reference = trained(ExtraLayersConfig(modules_to_save=["classifier"]))
    base = logits(reference, input_ids)
    fused = logits(model, input_ids)
    assert (fused - base).abs().max() > 1e-3
    with model.disable_adapter():
        assert torch.equal(logits(model, input_ids), base)
    assert torch.equal(logits(model, input_ids), fused)


@pytest.mark.parametrize(("config_cls", "blocks_read"), [(DWAttConfig, 2), (ExtraLayersConfig, 1)])
def test_unload_restores_the_base(config_cls, blocks_read, input_ids):
    model, reference = trained(config_cls(modules_to_save=["classifier"]))
    # container pre/post, pre/post per hooked block, model pre/post, the container's forward guard pre/post;
    # in eval mode only the blocks read are hooked (DWAtt: z_1, z_2 and the last; R+n: the last)
    assert not model.base_model.model.bert.encoder.training
    assert count_hooks(model) == 2 + 2 * blocks_read + 2 + 2
    model.train()  # training: every block (layer drop)
    assert count_hooks(model) == 2 + 2 * 3 + 2 + 2
    model.eval()
    assert count_hooks(model) == 2 + 2 * blocks_read + 2 + 2
    assert "forward" in vars(model.base_model.model.bert.encoder)  # the guard (HookedForward)
    unloaded = model.unload()
    assert type(unloaded) is type(reference)
    assert count_hooks(unloaded) == 0
    assert "forward" not in vars(unloaded.bert.encoder)  # the class's forward again
    assert not any(isinstance(m, LayerFusionLayer) for m in unloaded.modules())
    assert "layer_fusion" not in unloaded.bert.encoder._modules
    assert isinstance(unloaded.classifier, torch.nn.Linear)  # the ModulesToSaveWrapper is gone too
    # peft keeps the trained copy of a module in `modules_to_save`: base encoder + trained head
    reference.classifier.load_state_dict(unloaded.classifier.state_dict())
    assert torch.equal(logits(unloaded, input_ids), logits(reference, input_ids))
    assert unloaded.state_dict().keys() == reference.state_dict().keys()


def test_unload_without_head_gives_original_outputs(input_ids):
    model, reference = trained(DWAttConfig(modules_to_save=["classifier"]))
    model.base_model.model.classifier.modules_to_save["default"].load_state_dict(
        reference.classifier.state_dict()
    )
    unloaded = model.unload()
    assert count_hooks(unloaded) == 0
    assert torch.equal(logits(unloaded, input_ids), logits(reference, input_ids))


def test_extra_blocks_carry_no_hooks_of_the_copied_block(input_ids):
    base = tiny_bert()
    base(input_ids=input_ids, output_hidden_states=True)  # transformers adds its recording hooks
    model, reference = attach(ExtraLayersConfig(), base=base)
    extra = fusion_of(model).blocks[0]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in extra.modules())
    with torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True)
    assert torch.equal(out.logits, logits(model, input_ids))


@pytest.mark.parametrize("config_cls", [DWAttConfig, ExtraLayersConfig])
def test_output_hidden_states_last_is_what_the_head_sees(config_cls, input_ids):
    model, reference = trained(config_cls(modules_to_save=["classifier"]))
    with torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True)
        base_states = reference(input_ids=input_ids, output_hidden_states=True).hidden_states
    head = model.base_model.model.classifier
    assert torch.equal(out.logits, head(out.hidden_states[-1]))
    for index in (0, 2):  # the states below z_L are the base model's own
        assert torch.equal(out.hidden_states[index], base_states[index])


def test_merge_and_unload_raises_one_line_and_merge_adapter_merges_only_lora(input_ids):
    # merge_and_unload would return a plain model without the fusion: refused, saying what to do instead.
    model, _ = trained(DWAttConfig(target_modules=["query", "value"], modules_to_save=["classifier"]))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            perturb_(torch.nn.ParameterList([param]), seed=3)  # LoRA's B starts at zero
    before = logits(model, input_ids)
    with pytest.raises(NotImplementedError) as refused:
        model.merge_and_unload()
    message = str(refused.value)
    assert "\n" not in message and "cannot fold a layer-fusion module" in message
    assert "merge_adapter()" in message and "unload()" in message
    model.merge_adapter()  # the LoRA part goes into the base weights; the fusion keeps running
    lora_layers = [m for m in model.modules() if hasattr(m, "lora_A")]
    assert len(lora_layers) == 2 * 3 and all(layer.merged for layer in lora_layers)
    merged = logits(model, input_ids)
    torch.testing.assert_close(merged, before, atol=1e-5, rtol=1e-5)
    model.unmerge_adapter()
    torch.testing.assert_close(logits(model, input_ids), before, atol=1e-5, rtol=1e-5)
    with model.disable_adapter():  # neither the LoRA part nor the fusion
        assert (logits(model, input_ids) - before).abs().max() > 1e-3


def test_print_trainable_parameters_matches_hand_count(capsys):
    d, k, labels, gamma_d = 32, 3, 5, 16
    mlp = lambda n: n * (d * gamma_d + gamma_d + 2 * gamma_d + gamma_d * d + d)  # noqa: E731  U, LN, W
    dwatt = mlp(1) + mlp(k) + 2 * k * d + (24 * d + d)  # query MLP, value MLPs, LN_n, W_K
    head = d * labels + labels
    base = sum(p.numel() for p in tiny_bert().parameters())
    model, _ = attach(DWAttConfig(modules_to_save=["classifier"]))
    trainable, total = model.get_nb_trainable_parameters()
    assert trainable == dwatt + head == 5573
    assert total == base + dwatt + head  # the head copy is counted once more
    model.print_trainable_parameters()
    assert f"trainable params: {trainable:,} || all params: {total:,}" in capsys.readouterr().out

    concat, _ = attach(ConcatConfig(modules_to_save=["classifier"]))
    assert concat.get_nb_trainable_parameters()[0] == k * d * d + d + head
    average, _ = attach(AverageConfig(modules_to_save=["classifier"]))
    assert average.get_nb_trainable_parameters()[0] == head
    mix, _ = attach(ScalarMixConfig(modules_to_save=["classifier"]))
    assert mix.get_nb_trainable_parameters()[0] == k + 1 + head
    # one BERT block of width 32, FFN 48: 4 attention/output linears, 2 FFN linears, 2 LayerNorms
    block = 4 * (d * d + d) + (d * 48 + 48) + (48 * d + d) + 2 * 2 * d
    extra, _ = attach(ExtraLayersConfig(num_extra_layers=2, modules_to_save=["classifier"]))
    assert extra.get_nb_trainable_parameters()[0] == 2 * block + head


def test_state_dict_keys_are_prefixed_and_adapter_free(tmp_path):
    model, _ = attach(DWAttConfig(modules_to_save=["classifier"]))
    model.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "adapter_model.safetensors")
    fusion_keys = [k for k in saved if "layer_fusion" in k]
    assert len(fusion_keys) == 17  # 16 parameters + the depth-embedding buffer
    assert all("dwatt_fusion." in k and ".default." not in k for k in fusion_keys)
    assert not any("encoder.layer." in k for k in saved)  # no frozen base weight saved
