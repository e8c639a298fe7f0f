"""Config validation (every bad value names its field and value), PEFT types, save/load of configs."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import ENCODER_CONFIGS, fusion_of, tiny_bert
from peft import LoraConfig, PeftConfig, get_peft_model
from peft.utils.peft_types import PeftType

from peft_layerfusion import (
    METHODS,
    AverageConfig,
    ConcatConfig,
    DWAttConfig,
    ExtraLayersConfig,
    LayerFusionConfig,
    ScalarMixConfig,
    method_named,
)

LORA_FIELDS = {f.name for f in dataclasses.fields(LoraConfig)}
ALL_CONFIGS = ENCODER_CONFIGS

BAD_VALUES = [
    (DWAttConfig, "d_pos", -3),
    (DWAttConfig, "d_pos", 0),
    (DWAttConfig, "d_pos", 2.5),
    (DWAttConfig, "query_bottleneck_width", 0),
    (DWAttConfig, "value_bottleneck_width", -4),
    (DWAttConfig, "value_bottleneck_width", 2.5),
    (DWAttConfig, "query_bottleneck_width", "half"),
    (DWAttConfig, "score_scale", "sqrt"),
    (DWAttConfig, "query_init", "zero"),
    (ExtraLayersConfig, "num_extra_layers", 0),
    (ExtraLayersConfig, "num_extra_layers", -1),
    (ExtraLayersConfig, "num_extra_layers", 1.5),
    (ConcatConfig, "layers", []),
    (ConcatConfig, "layers", [1, 1]),
    (ConcatConfig, "layers", [1, "2"]),
    (ConcatConfig, "layers", [True]),
    (ScalarMixConfig, "layers", 3),
    (AverageConfig, "include_embeddings", "yes"),
    (DWAttConfig, "blocks_path", ""),
    (DWAttConfig, "blocks_path", 5),
]


@pytest.mark.parametrize("config_cls, field, value", BAD_VALUES, ids=lambda x: repr(x)[:20])
def test_bad_value_names_field_and_value(config_cls, field, value):
    with pytest.raises(ValueError) as error:
        config_cls(**{field: value})
    message = str(error.value)
    assert f"`{field}`" in message
    assert repr(value) in message


@pytest.mark.parametrize("layers", [[4], [-5], [0, 9]])
def test_out_of_range_layers_fail_at_injection(layers):
    config = DWAttConfig(layers=layers)  # the config cannot know L yet
    model = tiny_bert()
    with pytest.raises(ValueError) as error:
        get_peft_model(model, config)
    assert str(error.value) == f"`layers`={layers!r} is not allowed: expected indices in -4..3 for 3 blocks."
    assert not any("layer_fusion" in n for n, _ in model.named_modules())  # model left untouched


def test_layers_naming_one_state_twice_fail_at_injection():
    with pytest.raises(ValueError, match=r"`layers`=\[3, -1\]"):
        get_peft_model(tiny_bert(), DWAttConfig(layers=[3, -1]))  # z_3 is z_-1 for 3 blocks


def test_include_embeddings_conflicts_with_explicit_layers():
    with pytest.raises(ValueError, match=r"`include_embeddings`=True .*`layers`=\[1, 2\]"):
        DWAttConfig(include_embeddings=True, layers=[1, 2])


def test_resolve_layers():
    assert DWAttConfig().resolve_layers(3) == [1, 2, 3]
    assert DWAttConfig(include_embeddings=True).resolve_layers(3) == [0, 1, 2, 3]
    assert DWAttConfig(layers=[-1, 0, -3]).resolve_layers(3) == [3, 0, 1]


def test_base_config_is_abstract():
    with pytest.raises(TypeError, match="abstract"):
        LayerFusionConfig()


@pytest.mark.parametrize("config_cls", ALL_CONFIGS)
def test_peft_type_is_upper_case_and_registered(config_cls):
    config = config_cls()
    assert config.peft_type == config_cls.PEFT_TYPE == config_cls.PEFT_TYPE.upper()
    assert PeftType(config_cls.PEFT_TYPE) is config.peft_type
    assert not config.target_modules and config.target_modules is not None  # empty: no LoRA by default


def test_method_names():
    types = [m.peft_type for m in METHODS]
    assert {"DWATT", "CONCAT", "AVERAGE", "SCALAR_MIX", "EXTRA_LAYERS"} <= set(types)
    methods = [m for m in METHODS if m.preset is None]
    assert all(m.peft_type == m.peft_type.upper() and m.name == m.peft_type.lower() for m in methods)
    presets = {m.name: (m.peft_type, m.variant_of) for m in METHODS if m.preset is not None}
    assert presets == {
        "scaled_dwatt": ("DWATT", "dwatt"),
        "layer_mix": ("SCALAR_MIX", "scalar_mix"),
        "probe_ensemble": ("CONCAT", "concat"),
        "stacked": ("CONCAT", "concat"),
        "joint_probe": ("CONCAT", "concat"),
        "joint_ensemble": ("CONCAT", "concat"),
    }
    assert not {"SCALED_DWATT", "LAYER_MIX"} & set(PeftType.__members__)  # presets are no PEFT types


def test_a_preset_is_its_method_config_with_the_preset_values_then_the_fields_given():
    config = ScalarMixConfig.from_preset("layer_mix", start_layer=2, mixing_lr_multiplier=10.0)
    assert type(config) is ScalarMixConfig and config.peft_type is PeftType.SCALAR_MIX
    assert (config.state_norm, config.start_layer, config.mixing_lr_multiplier) == ("rms", 2, 10.0)
    assert ScalarMixConfig.from_preset("layer_mix", state_norm="none").state_norm == "none"  # given: it wins
    scaled = method_named("scaled_dwatt").make_config(d_pos=8)
    assert type(scaled) is DWAttConfig and scaled.peft_type is PeftType.DWATT
    values = (scaled.state_norm, scaled.score_scale, scaled.query_init, scaled.d_pos)
    assert values == ("rms", "sqrt_d", "uniform", 8)
    assert method_named("dwatt").make_config(d_pos=8) == DWAttConfig(d_pos=8)


def test_an_unknown_preset_is_refused_in_one_line():
    with pytest.raises(ValueError) as error:
        DWAttConfig.from_preset("layer_mix")
    assert str(error.value) == (
        "`preset`='layer_mix' is not allowed: expected one of ['scaled_dwatt'] for DWAttConfig."
    )


@pytest.mark.parametrize(
    "state_norm, flags", [("none", (False, False)), ("rms", (True, False)), ("rms_after_norm", (True, True))]
)
def test_the_state_norm_flags_are_the_depth_mix_configs(state_norm, flags):
    config = AverageConfig(state_norm=state_norm)
    assert (config.normalizes_states, config.mixes_after_norm) == flags
    module = fusion_of(get_peft_model(tiny_bert(), config))
    assert (module.normalizes_states, module.mixes_after_norm) == flags


@pytest.mark.parametrize("config_cls", ALL_CONFIGS)
def test_every_field_has_help(config_cls):
    fields = dataclasses.fields(config_cls)
    own = [f for f in fields if f.name not in LORA_FIELDS or f.name == "target_modules"]
    assert {"layers", "include_embeddings", "blocks_path", "target_modules"} <= {f.name for f in own}
    for f in own:
        assert len(f.metadata.get("help", "")) > 10, f.name


NON_DEFAULT = {
    DWAttConfig: dict(
        d_pos=7,
        query_bottleneck_width=5,
        value_bottleneck_width=6,
        score_scale="sqrt_d",
        query_init="uniform",
        state_norm="rms",
    ),
    ExtraLayersConfig: dict(num_extra_layers=2),
}


@pytest.mark.parametrize("config_cls", ALL_CONFIGS)
def test_config_round_trip_through_adapter_config_json(config_cls, tmp_path):
    options = dict(
        layers=[0, 2, -1],
        blocks_path="encoder.layer",
        modules_to_save=["classifier"],
        **NON_DEFAULT.get(config_cls, {}),
    )
    model = get_peft_model(tiny_bert(), config_cls(**options))
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert saved["peft_type"] == config_cls.PEFT_TYPE
    for key, value in options.items():
        assert saved[key] == value, key
    loaded = PeftConfig.from_pretrained(tmp_path)
    assert type(loaded) is config_cls
    original = model.peft_config["default"]
    set_on_load = {"inference_mode", "auto_mapping"}  # peft's bookkeeping, not options
    for f in dataclasses.fields(config_cls):
        if f.name not in set_on_load:
            assert getattr(loaded, f.name) == getattr(original, f.name), f.name
    assert loaded.inference_mode is True


def test_lora_fields_combine_with_fusion():
    config = DWAttConfig(target_modules=["query", "value"], r=4)
    model = get_peft_model(tiny_bert(), config)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("lora_A" in n for n in names) and any("dwatt_fusion" in n for n in names)
