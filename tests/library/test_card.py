"""Model cards of saved adapters: metadata, the peft_layerfusion section, user content kept."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import perturb_, tiny_bert
from huggingface_hub import ModelCard
from peft import LoraConfig, PeftModel, get_peft_model

from peft_layerfusion import BitFitConfig, DWAttConfig, ExtraLayersConfig, ScalarMixConfig, card
from peft_layerfusion.card import ADAPTER_PLACEHOLDER, SECTION_BEGIN, SECTION_END, with_section


def named_bert(folder):
    """A tiny BERT that says it was loaded from ``folder`` (as ``from_pretrained`` would).

    The folder holds its ``config.json``, so peft's checks at save time never look for it online.
    """
    base = tiny_bert()
    base.config.save_pretrained(folder)
    base.name_or_path = base.config._name_or_path = str(folder)
    return base


def saved_card(model: PeftModel, folder) -> ModelCard:
    model.save_pretrained(folder)
    return ModelCard.load(folder / "README.md")


@pytest.mark.parametrize(
    "config, peft_type, description",
    [
        (DWAttConfig(task_type="TOKEN_CLS"), "DWATT", "DWAtt (depth-wise attention)."),
        (ExtraLayersConfig(modules_to_save=["classifier"]), "EXTRA_LAYERS", "R+n: `n` randomly initialised"),
        (BitFitConfig(modules_to_save=["classifier"]), "BITFIT", "BitFit: every bias of the base model"),
    ],
)
def test_card_names_package_method_base_model_and_the_load(tmp_path, config, peft_type, description):
    base_name = str(tmp_path / "base")
    model_card = saved_card(get_peft_model(named_bert(base_name), config), tmp_path / "adapter")
    data = model_card.data
    assert data.library_name == "peft"
    assert data.base_model == base_name
    assert {"peft_layerfusion", peft_type.lower(), "transformers"} <= set(data.tags)
    text = model_card.text
    assert text.count(SECTION_BEGIN) == 1 and text.count(SECTION_END) == 1
    assert f"| `default` | `{peft_type}` | {description}" in text
    assert f"Base model: `{base_name}` (`BertForTokenClassification`)." in text
    assert f"KeyError: '{peft_type}'" in text
    load = text.index("```python")
    lines = text[load:].splitlines()[1:7]
    assert lines[0] == f"import peft_layerfusion  # first: registers {peft_type} with peft"
    assert lines[4] == f"base_model = BertForTokenClassification.from_pretrained({base_name!r}, num_labels=5)"
    assert lines[5].startswith(f'model = PeftModel.from_pretrained(base_model, "{ADAPTER_PLACEHOLDER}")')
    assert "`score`" not in text  # TOKEN_CLS lists `score` too; this BERT has no such module
    assert "| `classifier` |" in text or "`classifier` |" in text


def test_card_lists_lora_and_biases_of_a_combined_adapter(tmp_path):
    config = DWAttConfig(target_modules=["query", "value"], r=4, bias="all", modules_to_save=["classifier"])
    text = saved_card(get_peft_model(named_bert(tmp_path / "base"), config), tmp_path).text
    assert "| LoRA (r=4) on `query`, `value`; biases (`bias='all'`); `classifier` |" in text


def test_a_user_card_keeps_its_text_metadata_and_tags(tmp_path):
    user_card = "---\nlicense: mit\ntags:\n- my-tag\n---\n\n# My NER model\n\nTrained on my own data.\n"
    (tmp_path / "README.md").write_text(user_card)
    model = get_peft_model(named_bert(tmp_path / "base"), DWAttConfig(task_type="TOKEN_CLS"))
    model_card = saved_card(model, tmp_path)
    assert model_card.data.license == "mit"
    assert {"my-tag", "peft_layerfusion", "dwatt"} <= set(model_card.data.tags)
    text = model_card.text
    assert text.index("# My NER model") < text.index(SECTION_BEGIN) < text.index(SECTION_END)
    assert text.index(SECTION_END) < text.index("Trained on my own data.")


def test_saving_again_replaces_the_section(tmp_path):
    model = get_peft_model(named_bert(tmp_path / "base"), DWAttConfig(modules_to_save=["classifier"]))
    first = saved_card(model, tmp_path).text
    model.add_adapter("second", DWAttConfig(modules_to_save=["classifier"], layers=[1, 2]))
    text = saved_card(model, tmp_path).text
    assert text.count(SECTION_BEGIN) == 1 and text.count(SECTION_END) == 1
    assert "| `second` | `DWATT` |" in text and "| `second` |" not in first
    assert f'model.load_adapter("{ADAPTER_PLACEHOLDER}/second", adapter_name="second")' in text
    assert len(text) - len(first) < 400  # the old section is gone, not kept next to the new one


def test_an_in_memory_base_model_gets_no_empty_base_model_metadata(tmp_path):
    model_card = saved_card(get_peft_model(tiny_bert(), DWAttConfig(task_type="TOKEN_CLS")), tmp_path)
    assert model_card.data.base_model is None  # peft alone writes base_model: ''
    assert "base_model:adapter:" not in model_card.data.tags
    assert "built in memory" in model_card.text


def test_adapters_of_other_peft_types_get_peft_card_only(tmp_path):
    lora = LoraConfig(target_modules=["query"], modules_to_save=["classifier"])
    model = get_peft_model(named_bert(tmp_path / "base"), lora)
    model_card = saved_card(model, tmp_path)
    assert SECTION_BEGIN not in model_card.text
    assert "peft_layerfusion" not in model_card.data.tags
    assert "- PEFT " in model_card.text  # peft's own card is still written


def test_the_hook_is_installed_once():
    hooked, saving = PeftModel.create_or_update_model_card, PeftModel.save_pretrained
    importlib.reload(card)
    card.install_card_hook()
    card.install_card_hook()
    assert PeftModel.create_or_update_model_card is hooked and PeftModel.save_pretrained is saving
    assert hooked.__wrapped__.__qualname__ == "PeftModel.create_or_update_model_card"  # peft's own
    assert saving.__wrapped__.__qualname__ == "PeftModel.save_pretrained"


def test_section_goes_after_the_title_or_on_top():
    section = f"{SECTION_BEGIN}\nS\n{SECTION_END}"
    assert with_section("# Title\nbody", section) == f"# Title\n\n{section}\n\nbody"
    assert with_section("no title", section) == f"{section}\n\nno title"
    replaced = with_section(f"# Title\n\n{SECTION_BEGIN}\nold\n{SECTION_END}\n\nbody", section)
    assert replaced == f"# Title\n\n{section}\n\nbody"


def test_the_cards_load_works_in_a_fresh_process_and_fails_without_the_import(tmp_path):
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    tiny_bert().save_pretrained(base_dir)
    base = type(tiny_bert()).from_pretrained(base_dir).eval()
    model = get_peft_model(base, DWAttConfig(task_type="TOKEN_CLS")).eval()
    perturb_(model.base_model.model.bert.encoder.layer_fusion)  # the adapter is not at its init
    perturb_(model.base_model.model.classifier.modules_to_save)
    model.save_pretrained(adapter_dir)
    input_ids = torch.arange(1, 15).reshape(2, 7)
    with torch.no_grad():
        torch.save(model(input_ids=input_ids).logits, tmp_path / "logits.pt")
    text = (adapter_dir / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    snippet = snippet.replace(ADAPTER_PLACEHOLDER, str(adapter_dir))
    without_import = snippet.split("\n", 1)[1]
    script = textwrap.dedent(f"""
        import sys, torch
        bare = {{}}
        try:
            exec({without_import!r}, bare)
        except KeyError as error:
            print("without import:", repr(error))
        try:
            bare["base_model"].load_adapter({str(adapter_dir)!r})
        except KeyError as error:
            print("load_adapter without import:", repr(error))
        assert "peft_layerfusion" not in sys.modules
        scope = {{}}
        exec({snippet!r}, scope)
        with torch.no_grad():
            logits = scope["model"].eval()(input_ids=torch.arange(1, 15).reshape(2, 7)).logits
        print("equal:", torch.equal(logits, torch.load({str(tmp_path / "logits.pt")!r})))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "without import: KeyError('DWATT')" in result.stdout
    assert "load_adapter without import: KeyError('DWATT')" in result.stdout
    assert "equal: True" in result.stdout


def test_a_named_adapter_s_own_folder_says_to_import_the_package_first(tmp_path):
    """peft saves an adapter not named ``default`` in a sub-folder: a user loads that folder, so its
    README says what the top one does, for that adapter (here a LayerMix, saved as ``SCALAR_MIX``)."""
    model = get_peft_model(named_bert(tmp_path / "base"), ScalarMixConfig(task_type="TOKEN_CLS"))
    model.add_adapter("mix", ScalarMixConfig.from_preset("layer_mix", task_type="TOKEN_CLS"))
    model.save_pretrained(tmp_path / "adapter")
    own = ModelCard.load(tmp_path / "adapter" / "mix" / "README.md").text
    assert own.count(SECTION_BEGIN) == 1 and own.startswith("# mix\n\n" + SECTION_BEGIN)
    layer_mix = (
        "LayerMix: a ScalarMix of unit-RMS states, its blend kept in [0, 1], the trained fusion we recommend "
        "(the preset `layer_mix`)."
    )
    assert f"| `mix` | `SCALAR_MIX` | {layer_mix} ScalarMix" in own
    import_first = "before the load (without it peft fails with `KeyError: 'SCALAR_MIX'`)"
    assert f"`import peft_layerfusion` {import_first}" in own
    assert "import peft_layerfusion  # first: registers SCALAR_MIX with peft" in own
    assert "| `default` |" not in own and "sub-folders" not in own
    top = (tmp_path / "adapter" / "README.md").read_text()
    assert "| `default` | `SCALAR_MIX` | ScalarMix" in top and f"| `mix` | `SCALAR_MIX` | {layer_mix}" in top
    assert "sub-folders" in top


def test_a_named_adapter_s_folder_card_loads_it_in_a_fresh_process_and_names_the_error_without(tmp_path):
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    tiny_bert().save_pretrained(base_dir)
    base = type(tiny_bert()).from_pretrained(base_dir).eval()
    model = get_peft_model(base, ScalarMixConfig(task_type="TOKEN_CLS"))
    model.add_adapter("mix", ScalarMixConfig.from_preset("layer_mix", start_layer=2, task_type="TOKEN_CLS"))
    model.save_pretrained(adapter_dir)
    text = (adapter_dir / "mix" / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    snippet = snippet.replace(ADAPTER_PLACEHOLDER, str(adapter_dir / "mix"))
    script = textwrap.dedent(f"""
        import sys
        try:
            exec({snippet.split(chr(10), 1)[1]!r}, {{}})
        except KeyError as error:
            print("without import:", repr(error))
        assert "peft_layerfusion" not in sys.modules
        scope = {{}}
        exec({snippet!r}, scope)
        config = scope["model"].peft_config["default"]
        print("loaded:", type(config).__name__, config.state_norm, config.start_layer)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "without import: KeyError('SCALAR_MIX')" in result.stdout
    assert "loaded: ScalarMixConfig rms 2" in result.stdout
