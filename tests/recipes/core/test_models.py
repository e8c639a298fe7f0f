"""The recipes' model building: no warning a user of the commands cannot act on."""

from __future__ import annotations

import warnings

import pytest
from conftest import tiny_bert, write_tiny_model

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.models.models import PEFT_ALIAS_WARNING, apply_regime
from layerfusion_recipes.seq2seq.experiment import METHOD_NAMES, Seq2SeqSettings, build_model, with_method


def _alias_warnings(build) -> list[str]:
    """The messages of the checkpointing-alias warnings ``build()`` issues (every one, even repeated)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    return [str(w.message) for w in caught if "is_gradient_checkpointing" in str(w.message)]


@pytest.mark.parametrize("method, regime", [("none", "fe"), ("dwatt", "fe"), ("concat", "lora")])
def test_ner_and_mlm_models_build_without_the_checkpointing_alias_warning(method, regime):
    build = lambda: apply_regime(tiny_bert(), method, regime, head_modules=("classifier",))  # noqa: E731
    assert _alias_warnings(build) == []


def test_seq2seq_methods_build_without_the_checkpointing_alias_warning():
    settings = Seq2SeqSettings(width=16, layers=1)
    for method in METHOD_NAMES[1:]:  # every seq2seq method's variant (the first is the plain model)
        assert _alias_warnings(lambda: with_method(build_model(40, settings), method)) == [], method  # noqa: B023


def test_audit_runs_without_the_checkpointing_alias_warning(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "model")
    assert _alias_warnings(lambda: main(["audit", model, "--match", "dwatt"])) == []
    assert "dwatt" in capsys.readouterr().out


def test_only_that_warning_is_quieted():
    from layerfusion_recipes.core.models.models import peft_alias_quiet

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with peft_alias_quiet():
            warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning, stacklevel=1)
            warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
    assert PEFT_ALIAS_WARNING.startswith("`is_gradient_checkpointing`")


def test_a_model_folder_gone_since_the_start_is_said_missing(tmp_path):
    """A sweep loads the model for every run: a folder deleted meanwhile is named as missing, not
    refused as a malformed Hub repo id."""
    from transformers import AutoModel

    from layerfusion_recipes.core.errors import DataSourceError
    from layerfusion_recipes.core.models.models import load_pretrained

    folder = write_tiny_model(tmp_path / "m")
    assert load_pretrained(AutoModel, folder, seed=0) is not None
    for path in sorted(tmp_path.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    with pytest.raises(DataSourceError, match=r"^--model '.*/m': no such model folder or file$"):
        load_pretrained(AutoModel, folder, seed=0)
