"""The options every task shares, each with one default and one check: ``--cache-dtype``."""

from __future__ import annotations

import dataclasses

import pytest

from layerfusion_recipes.classify.experiment import ClassifySettings
from layerfusion_recipes.cli import build_parser
from layerfusion_recipes.core.cache.feature_cache import storage_dtype
from layerfusion_recipes.core.engine.experiment import TaskSettings
from layerfusion_recipes.core.options.options import CACHE_DTYPES, DEFAULT_CACHE_DTYPE, check_cache_dtype
from layerfusion_recipes.ner.experiment import NerSettings
from layerfusion_recipes.ner.settings import resolve

BAD = r"^--cache-dtype 'half': allowed float32, bfloat16, float16$"


@pytest.mark.parametrize("settings", [NerSettings, ClassifySettings])
def test_a_bad_cache_dtype_stops_the_settings_of_every_task_in_one_line(settings):
    """Checked once, where the settings are made: a flag, a YAML value and a script all pass there."""
    with pytest.raises(ValueError, match=BAD):
        settings(model="m", data="d", cache_dtype="half")
    with pytest.raises(ValueError, match=BAD):
        dataclasses.replace(settings(model="m", data="d"), cache_dtype="half")


def test_a_bad_cache_dtype_in_the_yaml_is_the_same_line(tmp_path):
    config = tmp_path / "grid.yaml"
    config.write_text("cache_dtype: half\n")
    with pytest.raises(ValueError, match=BAD):
        resolve(build_parser().parse_args(["ner", "--data", str(tmp_path), "--config", str(config)]))


def test_the_default_cache_dtype_is_the_exact_one_everywhere():
    field = {f.name: f for f in dataclasses.fields(TaskSettings)}["cache_dtype"]
    assert field.default == DEFAULT_CACHE_DTYPE == CACHE_DTYPES[0] == "float32"
    settings, _ = resolve(build_parser().parse_args(["ner", "--data", "conll/"]))
    assert settings.cache_dtype == DEFAULT_CACHE_DTYPE
    assert [str(storage_dtype(check_cache_dtype(name))) for name in CACHE_DTYPES] == [
        "torch.float32",
        "torch.bfloat16",
        "torch.float16",
    ]
    assert build_parser().parse_args(["ner", "--cache-dtype", "float16"]).cache_dtype == "float16"
