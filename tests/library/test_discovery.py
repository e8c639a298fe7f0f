"""Block discovery on tiny random models of every supported family, `blocks_path`, and errors."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from conftest import TINY, ToyEncoder, attach, perturb_, seq2seq_sizes
from peft import get_peft_model
from torch import nn

from peft_layerfusion import DWAttConfig, ExtraLayersConfig, find_encoder_blocks
from peft_layerfusion.discovery import hidden_size_of

LAYERS = 2
BERT_LIKE = {**TINY, "num_hidden_layers": LAYERS}  # the tests' tiny sizes, 2 blocks
SEQ2SEQ = seq2seq_sizes(BERT_LIKE)
D, HEADS, FF = BERT_LIKE["hidden_size"], BERT_LIKE["num_attention_heads"], BERT_LIKE["intermediate_size"]
VOCAB = BERT_LIKE["vocab_size"]

# (model class, config, expected block list name)
FAMILIES = {
    "bert": (tf.BertForTokenClassification, tf.BertConfig(**BERT_LIKE), "bert.encoder.layer"),
    "roberta": (tf.RobertaForTokenClassification, tf.RobertaConfig(**BERT_LIKE), "roberta.encoder.layer"),
    "xlm-roberta": (
        tf.XLMRobertaForTokenClassification,
        tf.XLMRobertaConfig(**BERT_LIKE),
        "roberta.encoder.layer",
    ),
    "distilbert": (
        tf.DistilBertForTokenClassification,
        tf.DistilBertConfig(vocab_size=VOCAB, dim=D, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FF),
        "distilbert.transformer.layer",
    ),
    "electra": (
        tf.ElectraForTokenClassification,
        tf.ElectraConfig(**BERT_LIKE, embedding_size=D),
        "electra.encoder.layer",
    ),
    "deberta-v2": (
        tf.DebertaV2ForTokenClassification,
        tf.DebertaV2Config(**BERT_LIKE, relative_attention=True, position_buckets=8),
        "deberta.encoder.layer",
    ),
    "mpnet": (tf.MPNetForTokenClassification, tf.MPNetConfig(**BERT_LIKE), "mpnet.encoder.layer"),
    "modernbert": (
        tf.ModernBertForTokenClassification,
        tf.ModernBertConfig(**BERT_LIKE, global_attn_every_n_layers=2, local_attention=16, pad_token_id=0),
        "model.layers",
    ),
    "bart": (tf.BartForConditionalGeneration, tf.BartConfig(**SEQ2SEQ), "model.encoder.layers"),
    "t5": (
        tf.T5ForConditionalGeneration,
        tf.T5Config(vocab_size=VOCAB, d_model=D, d_kv=8, d_ff=FF, num_layers=LAYERS, num_heads=HEADS),
        "encoder.block",
    ),
}


def build(family: str) -> nn.Module:
    model_cls, config, _ = FAMILIES[family]
    torch.manual_seed(0)
    return model_cls(config).eval()


def inputs_for(family: str) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if family in ("bart", "t5"):
        batch["decoder_input_ids"] = ids[:, :4]
    return batch


def main_output(output) -> torch.Tensor:
    return output.logits


@pytest.mark.parametrize("config_cls", [DWAttConfig, ExtraLayersConfig])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_discovery_and_fusion_on_every_family(family, config_cls):
    base = build(family)
    found = find_encoder_blocks(base)
    expected_name = FAMILIES[family][2]
    assert found.blocks_name == expected_name
    assert found.container_name == expected_name.rpartition(".")[0]
    assert found.container is base.get_submodule(found.container_name)
    assert found.num_blocks == LAYERS
    assert hidden_size_of(base) == D

    batch = inputs_for(family)
    with torch.no_grad():
        base_out = main_output(base(**batch))
    model, _ = attach(config_cls(), base=base)
    perturb_(model.base_model.model.get_submodule(found.container_name).layer_fusion)
    with torch.no_grad():
        fused = main_output(model(**batch))
        with model.disable_adapter():
            disabled = main_output(model(**batch))
    assert fused.shape == base_out.shape
    assert (fused - base_out).abs().max() > 1e-3
    assert torch.equal(disabled, base_out)


def test_seq2seq_decoder_blocks_are_not_hooked():
    base = build("bart")
    model, _ = attach(DWAttConfig(), base=base)
    decoder_layers = model.base_model.model.model.decoder.layers
    assert all(len(layer._forward_pre_hooks) == 0 for layer in decoder_layers)
    assert "layer_fusion" in model.base_model.model.model.encoder._modules


def test_blocks_path_for_custom_model():
    model = ToyEncoder()
    with pytest.raises(ValueError) as error:
        find_encoder_blocks(model)
    message = str(error.value)
    assert "encoder.layer" in message and "blocks_path" in message and "stack.blocks" in message
    for path in ("stack.blocks", "blocks"):
        found = find_encoder_blocks(model, blocks_path=path)
        assert found.blocks_name == "stack.blocks" and found.container is model.stack
    assert hidden_size_of(model, found) == 16


class PlainLayers(nn.Module):
    """A plain module whose ``layers`` are bare ``Linear`` layers, and a head with a list of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.classifier = nn.Module()
        self.classifier.layers = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])
        self.stack = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])


def test_the_discovery_error_says_why_each_list_was_passed_over():
    with pytest.raises(ValueError) as error:
        find_encoder_blocks(PlainLayers())
    assert str(error.value) == (
        "Could not find the encoder blocks of PlainLayers: no nn.ModuleList named by the suffixes "
        "['encoder.layer', 'encoder.layers', 'encoder.block', 'transformer.layer', 'layers'] holds them. "
        "The model's non-empty ModuleLists: `layers` (its items are bare Linear layers, not blocks); "
        "`classifier.layers` (inside the task head `classifier`); `stack` (not a name searched). Name the "
        "block list yourself with the config field `blocks_path` (e.g. blocks_path='layers')."
    )
    with pytest.raises(ValueError) as error:
        find_encoder_blocks(ToyEncoder(), blocks_path="does.not.exist")
    assert str(error.value) == (
        "Could not find the encoder blocks of ToyEncoder: no nn.ModuleList named by "
        "blocks_path='does.not.exist' holds them. The model's non-empty ModuleLists: `stack.blocks` (not a "
        "name searched). Name the block list yourself with the config field `blocks_path` "
        "(e.g. blocks_path='stack.blocks')."
    )


def test_a_list_of_several_kinds_of_module_is_passed_over_as_such():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])
    with pytest.raises(ValueError) as error:
        find_encoder_blocks(model)
    assert "`layers` (its items are of several classes, ['Linear', 'ReLU'], not one kind of block)" in str(
        error.value
    )


def test_nothing_found_raises_at_injection():
    class NoBlocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x)

    with pytest.raises(ValueError, match=r"(?s)NoBlocks.*encoder\.layer.*blocks_path"):
        get_peft_model(NoBlocks(), DWAttConfig())
    with pytest.raises(ValueError, match=r"blocks_path='does.not.exist'"):
        get_peft_model(ToyEncoder(), DWAttConfig(blocks_path="does.not.exist"))


def test_explicit_full_blocks_path_on_bert():
    base = build("bert")
    found = find_encoder_blocks(base, blocks_path="bert.encoder.layer")
    assert found.container is base.bert.encoder
