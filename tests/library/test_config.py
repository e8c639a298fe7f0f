"""Config validation (every bad value names its field and value), PEFT types, save/load of configs."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import ENCODER_CONFIGS, tiny_bert
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
)

LORA_FIELDS = {f.name for f in dataclasses.fields(LoraConfig)}
ALL_CONFIGS = ENCODER_CONFIGS

BAD_VALUES = [
    (DWAttConfig, "d_pos", -3),
    (DWAttConfig, "d_pos", 0),
    (DWAttConfig, "d_pos", 2.5),
    (DWAttConfig, "query_bottleneck", 0),
    (DWAttConfig, "value_bottleneck", 0),
    (DWAttConfig, "value_bottleneck", -0.5),
    (DWAttConfig, "query_bottleneck", "half"),
    (DWAttConfig, "score_temperature", 0.0),
    (DWAttConfig, "score_temperature", -1.0),
    (DWAttConfig, "attention_dropout", 1.5),
    (DWAttConfig, "attention_dropout", -0.1),
    (DWAttConfig, "attention_dropout", 1.0),
    (DWAttConfig, "prenorm_scaling", "yes"),
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
    assert "`layers`" in str(error.value) and repr(layers) in str(error.value)
    assert "-4..3" in str(error.value)
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
    types = [m.config_cls.PEFT_TYPE for m in METHODS]
    assert {"DWATT", "CONCAT", "AVERAGE", "SCALAR_MIX", "EXTRA_LAYERS"} <= set(types)
    assert all(t == t.upper() and m.name == t.lower() for t, m in zip(types, METHODS, strict=True))


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
        query_bottleneck=0.25,
        value_bottleneck=0.75,
        score_temperature=2.0,
        attention_dropout=0.1,
        prenorm_scaling=True,
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
