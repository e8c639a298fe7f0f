"""``layerfusion ner`` on decoder-only models: transformers' token head where it has one (Llama's
``score``), a linear head on the base model where it has none (Gemma 3, OPT), words tokenized as
running text, cached = uncached records, each token labelled from its left context, one-line errors."""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import toy_dataset, write_folders, write_tiny_decoder, write_tiny_model, write_toy_data
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BartConfig,
    BartForConditionalGeneration,
    PreTrainedTokenizerFast,
)

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.batches import collate
from layerfusion_recipes.core.models import gemma
from layerfusion_recipes.core.models.gemma import NamedGGUF
from layerfusion_recipes.core.models.models import eval_frozen_subtrees, head_module_names
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.data.readers import NerSentence, encode_ner, word_separator
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings
from layerfusion_recipes.ner.models import (
    DecoderTokenClassifier,
    default_token_head,
    load_token_classifier,
    token_classifier_skeleton,
)
from peft_layerfusion.discovery import find_encoder_blocks
from peft_layerfusion.layer import fusion_layer_of

METHODS = ("none", "average", "concat", "dwatt")  # the FE comparison of the real Gemma run
RESULT_FIELDS = ("best_f1", "best_epoch", "curve", "test_f1", "train_sentences")  # equal bitwise
GENERIC = ("gemma3_text", "opt")  # decoder types without a token-classification class in transformers
# models whose block container holds a parameter-less embedding dropout beside the blocks (and the fusion)
CONTAINER_DROPOUT = {
    "gpt2": "transformer.drop",
    "gpt_neox": "gpt_neox.emb_dropout",
    "t5": "transformer.encoder.dropout",
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return write_folders(
        tmp_path_factory,
        llama=write_tiny_decoder,
        **{family: partial(write_tiny_decoder, family=family) for family in (*GENERIC, *CONTAINER_DROPOUT)},
        bert=write_tiny_model,
        data=partial(write_toy_data, train=30, dev=8, test=8),
    )


def ner_argv(model: str, data: str, output: Path, *extra: str) -> list[str]:
    return [
        "ner",
        *("--model", model, "--data", data, "--methods", *METHODS),
        *("--shots", "2", "--epochs", "2", "--trials", "1", "--lr", "3e-3", "3e-2", "--max-length", "64"),
        *("--output", str(output), "--quiet", *extra),
    ]


def results_of(records: list[dict], approx: bool = False) -> dict[str, dict]:
    """Records by key, their result fields only (:func:`result_fields`)."""
    return {record["key"]: result_fields(record, approx) for record in records}


def result_fields(record: dict, approx: bool = False) -> dict:
    """A record's :data:`RESULT_FIELDS`; with ``approx`` DWAtt's depth attention as ``pytest.approx``
    (the replayed and computed blocks give the same states, the attention's float sums may differ in
    the last bits)."""
    fields = {field: record.get(field) for field in RESULT_FIELDS}
    if "depth_attention" in record:
        weights = record["depth_attention"]
        fields["depth_attention"] = pytest.approx(weights, rel=1e-5, abs=1e-7) if approx else weights
    return fields


def test_ner_on_a_tiny_llama_runs_the_fe_comparison_cached_equal_to_uncached(folders, tmp_path, capsys):
    cached, uncached = tmp_path / "cached", tmp_path / "uncached"
    assert main(ner_argv(folders["llama"], folders["data"], cached)) == 0
    assert "| regime | epochs | shots | none | dwatt | concat | average |" in capsys.readouterr().out
    records = read_records(cached / "results.jsonl")
    assert len(records) == len(METHODS) * 2 and all(record["cached"] for record in records)
    assert {tuple(record["settings"]["head_modules"]) for record in records} == {("score",)}  # Llama's head
    assert main(ner_argv(folders["llama"], folders["data"], uncached, "--no-cache")) == 0
    assert not any(record["cached"] for record in read_records(uncached / "results.jsonl"))
    assert results_of(records) == results_of(read_records(uncached / "results.jsonl"), approx=True)
    dwatt = [record for record in records if record["method"] == "dwatt"]
    assert all(len(record["depth_attention"]) == 2 for record in dwatt)  # fused layers 1..L of 2 blocks


@pytest.mark.parametrize("family", GENERIC)
def test_a_decoder_without_a_token_class_gets_a_linear_head_on_its_pretrained_base(folders, family):
    model = load_token_classifier(folders[family], num_labels=5, seed=0).eval()
    assert isinstance(model, DecoderTokenClassifier) and head_module_names(model) == ("classifier",)
    assert default_token_head(folders[family]) == ("classifier",)
    skeleton = token_classifier_skeleton(folders[family], num_labels=5)
    assert [name for name, _ in skeleton.named_parameters()] == [name for name, _ in model.named_parameters()]
    # the saved weights, loaded apart: the causal LM's base model (AutoModel loads none of a Gemma 3
    # causal-LM checkpoint on transformers 4.x, whose prefix differs; the classifier must not either)
    reference = AutoModelForCausalLM.from_pretrained(folders[family]).model.eval()
    ids = torch.tensor([[2, 8, 9, 10, 11], [2, 12, 13, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        final = reference(input_ids=ids, attention_mask=mask).last_hidden_state  # F(z_L)
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, model.classifier(final))


@pytest.mark.parametrize("family", ["llama", *GENERIC])
def test_each_token_is_labelled_from_its_left_context_only(folders, family):
    """A later token never changes an earlier token's logits: what the README says a decoder sees."""
    model = load_token_classifier(folders[family], num_labels=5, seed=0).eval()
    ids = torch.tensor([[2, 8, 9, 10, 11, 12]])
    changed = ids.clone()
    changed[0, 4:] = torch.tensor([20, 21])
    with torch.no_grad():
        before, after = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert torch.equal(before[:, :4], after[:, :4])
    assert not torch.allclose(before[:, 4:], after[:, 4:])


@pytest.mark.parametrize("family", GENERIC)
def test_the_generic_head_trains_every_method_cached_equal_to_uncached(folders, family):
    settings = NerSettings(
        model=folders[family], data="toy", lr=3e-2, batch_size=4, max_length=64, eval_every=2
    )
    experiment = NerExperiment(settings, toy_dataset(train=30, dev=8, test=8))
    for method in METHODS:
        cell = Cell(method, "fe", shots=2, epochs=2, trial=0)
        cached, uncached = experiment.run(cell, use_cache=True), experiment.run(cell, use_cache=False)
        assert cached["cached"] and not uncached["cached"]
        assert result_fields(cached) == result_fields(uncached, approx=True)


@pytest.mark.parametrize("family", GENERIC)
def test_dwatt_on_unit_rms_states_trains_stacked_and_cached_as_alone_and_uncached(folders, family):
    """``method_options: {state_norm: rms}``: the LR candidates trained together on the cache
    give each lone uncached run's record, and the option reaches the model (another query)."""
    data = toy_dataset(train=30, dev=8, test=8)
    common = dict(model=folders[family], data="toy", batch_size=4, max_length=64, eval_every=2)
    scaled = NerExperiment(NerSettings(**common, method_options={"state_norm": "rms"}), data)
    cell = Cell("dwatt", "fe", shots=2, epochs=2, trial=0)
    together = scaled.run_lrs(cell, [3e-3, 3e-2], use_cache=True)
    alone = [scaled.run(cell, use_cache=False, lr=lr) for lr in (3e-3, 3e-2)]
    assert [result_fields(r) for r in together] == [result_fields(r, approx=True) for r in alone]
    paper = NerExperiment(NerSettings(**common), data).run(cell, use_cache=True, lr=3e-2)
    assert paper["key"] != together[1]["key"]  # the option is part of the key
    assert paper["depth_attention"] != together[1]["depth_attention"]  # the query reads z_L / rms(z_L)


@pytest.mark.parametrize(
    "family, method",
    [(family, method) for family in CONTAINER_DROPOUT for method in ("dwatt", "concat", "extra_layers")],
)
def test_fe_training_puts_a_dropout_beside_the_fused_blocks_in_eval_mode(folders, family, method):
    """The frozen encoder's parameter-less dropout (GPT-2's ``transformer.drop``, GPT-NeoX's
    ``emb_dropout``, T5's ``encoder.dropout``) sits in the container that also holds the trainable
    fusion layer: in training it is in eval mode, as when the feature cache was filled, so a training
    forward without the cache gives the cached one's logits; the fusion layer and the head's dropout
    train."""
    data = toy_dataset(train=30, dev=8, test=8)
    experiment = NerExperiment(NerSettings(model=folders[family], data="toy", max_length=64), data)
    cell = Cell(method, "fe", shots=2, epochs=1, trial=0)
    model, located = experiment.build(cell)
    train = experiment.train_sample(cell.shots, cell.trial)[:4]
    cache = experiment.filled_cache(train, cell)
    eval_frozen_subtrees(model)  # what every training step runs in (TrainingLoop)
    task_model = model.get_base_model()
    assert not task_model.get_submodule(CONTAINER_DROPOUT[family]).training
    assert fusion_layer_of(model).training and task_model.dropout.training  # the head's dropout trains
    logits = []
    for replayed in (cache, None):
        torch.manual_seed(0)  # the head's dropout draws the same mask in both
        values, labels = experiment.runner(model, located, replayed).logits(train, torch.device("cpu"))
        logits.append(values[labels != -100])  # (labelled, C): what the loss reads
    assert logits[0].abs().max() > 0.01  # real logits
    torch.testing.assert_close(logits[0], logits[1], atol=1e-6, rtol=0)


def test_r_plus_n_on_t5_gets_the_position_bias_from_a_replay_cached_equal_to_uncached(folders):
    """T5's block 0 computes the relative position bias and each block hands it to the next: a replay
    runs block 0 for it (its state still the cached one) and the replayed blocks hand it on, so R+n's
    extra block gets it as in a real forward (without it, other logits)."""
    data = toy_dataset(train=30, dev=8, test=8)
    experiment = NerExperiment(NerSettings(model=folders["t5"], data="toy", max_length=64), data)
    cell = Cell("extra_layers", "fe", shots=2, epochs=1, trial=0)
    model, located = experiment.build(cell)
    cache = experiment.filled_cache(experiment.dev, cell)
    outputs = cache.block_outputs  # (hidden, position bias, cross-attention bias) per block
    assert outputs.computes(0) and not outputs.computes(1) and outputs.exact_calls
    model.eval()
    device, labelled = torch.device("cpu"), collate(experiment.dev)["labels"] != -100
    with torch.no_grad():
        cached = experiment.runner(model, located, cache).logits(experiment.dev, device)[0]  # (batch, seq, C)
        uncached = experiment.runner(model, located, None).logits(experiment.dev, device)[0]
        blind = experiment.runner(model, located, cache)
        blind.replays_block_calls = False  # no block runs: the extra block gets no position bias
        without_bias = blind.logits(experiment.dev, device)[0]
    assert cached.abs().max() > 0.01  # real logits
    torch.testing.assert_close(cached[labelled], uncached[labelled], atol=1e-6, rtol=0)
    assert not torch.allclose(without_bias[labelled], uncached[labelled], atol=1e-3)


def test_r_plus_n_on_t5_trains_cached_as_uncached(folders):
    data = toy_dataset(train=30, dev=8, test=8)
    settings = NerSettings(model=folders["t5"], data="toy", lr=3e-2, batch_size=4, max_length=64)
    experiment = NerExperiment(settings, data)
    cell = Cell("extra_layers", "fe", shots=2, epochs=2, trial=0)
    cached, uncached = experiment.run(cell, use_cache=True), experiment.run(cell, use_cache=False)
    assert cached["cached"] and not uncached["cached"]
    assert result_fields(cached) == result_fields(uncached)


def test_r_plus_n_trains_without_the_cache_where_a_replay_cannot_give_the_real_block_call(folders, capsys):
    """An encoder whose replay cannot give the last block the call of a real forward (the cache learned
    so: ``exact_calls``) trains R+n without the cache, saying so in one line; the plain head, which reads
    no block call, still replays it."""
    data = toy_dataset(train=30, dev=8, test=8)
    settings = NerSettings(model=folders["t5"], data="toy", lr=3e-2, batch_size=4, max_length=64)
    experiment = NerExperiment(settings, data)
    cache = experiment.cache()
    cache.block_outputs = dataclasses.replace(cache.block_outputs, exact_calls=False)
    cell = Cell("extra_layers", "fe", shots=2, epochs=2, trial=0)
    refused = experiment.run(cell, use_cache=True)
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("layerfusion:")]
    assert "cannot give the last block the arguments of a real forward" in line
    assert line.endswith("this run trains without the cache")
    assert not refused["cached"]
    assert result_fields(refused) == result_fields(experiment.run(cell, use_cache=False))
    assert experiment.run(Cell("none", "fe", shots=2, epochs=1, trial=0), use_cache=True)["cached"]
    with pytest.raises(ValueError, match="cannot give the last block"):
        cache.replay(find_encoder_blocks(cache.base_model), cache.batch(experiment.dev[:2]))


def test_default_token_head_names_the_models_head(folders):
    assert default_token_head(folders["llama"]) == ("score",)
    assert default_token_head(folders["bert"]) == ("classifier",)
    assert default_token_head("no/such-model-here") == ("classifier",)  # unread: the encoders' name


def metaspace_tokenizer():
    """A SentencePiece-like tokenizer (Gemma's way): a space becomes ``▁`` inside the next token."""
    vocab = ["<unk>", "<s>", "<pad>", "Hello", "▁world", "▁.", "world", ".", "▁Paris", "Paris", "▁is"]
    backend = Tokenizer(models.WordLevel({token: i for i, token in enumerate(vocab)}, unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", bos_token="<s>"
    )


def test_words_are_tokenized_as_the_running_text(folders):
    """Pre-split words lose a SentencePiece tokenizer's word-start marker (``world`` for ``▁world``):
    a space goes before each word but the first there; a BERT tokenizer's words stay as given."""
    tokenizer = metaspace_tokenizer()
    assert word_separator(tokenizer) == " "
    assert word_separator(AutoTokenizer.from_pretrained(folders["bert"])) == ""
    sentence = NerSentence(("Paris", "is", "world"), ("B-LOC", "O", "O"))
    [feature] = encode_ner(tokenizer, [sentence], {"O": 0, "B-LOC": 1})
    assert tokenizer.convert_ids_to_tokens(feature["input_ids"]) == ["<s>", "Paris", "▁is", "▁world"]
    assert feature["labels"] == [-100, 1, 0, 0] and feature["labelled_words"] == [0, 1, 2]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_model_with_no_token_head_that_is_no_decoder_is_refused_in_one_line(folders, tmp_path, capsys):
    bart = write_tiny_decoder(tmp_path / "bart")  # its tokenizer, then a BART in place of the Llama
    config = BartConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
    )  # fmt: skip
    BartForConditionalGeneration(config).save_pretrained(bart)
    capsys.readouterr()  # the saving's progress bars
    assert main(ner_argv(bart, folders["data"], tmp_path / "out")) == 2
    line = one_error_line(capsys)
    assert "no token-classification model for its type 'bart'" in line and "not a decoder-only" in line
    assert not (tmp_path / "out").exists()


def test_a_missing_gguf_file_is_one_line(folders, tmp_path, capsys):
    assert main(ner_argv(str(tmp_path / "absent.gguf"), folders["data"], tmp_path / "out")) == 2
    assert one_error_line(capsys).endswith("absent.gguf': no such GGUF file")  # said before torch loads


def test_a_named_model_without_its_extra_is_one_line(folders, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LAYERFUSION_CACHE", str(tmp_path / "cache"))  # no copy converted there
    absent = NamedGGUF(
        "gemma-3-270m-q4_k_m.gguf", ("no_such_part_package_1", "no_such_part_package_2"), "0" * 64
    )
    monkeypatch.setitem(gemma.NAMED_MODELS, "gemma3-270m", absent)
    assert main(ner_argv("gemma3-270m", folders["data"], tmp_path / "out")) == 2
    assert one_error_line(capsys).endswith('the optional extra is not installed: pip install -e ".[llm]"')


GEMMA_COPY = gemma.cache_root() / "models" / "gemma3-270m"


@pytest.mark.skipif(
    not GEMMA_COPY.is_dir(), reason="the converted Gemma 3 270M copy (the llm extra) is absent"
)
def test_the_real_gemma3_270m_gets_the_linear_token_head_over_its_18_blocks():
    skeleton = token_classifier_skeleton(gemma.resolve_model("gemma3-270m"), num_labels=9)  # meta device
    assert isinstance(skeleton, DecoderTokenClassifier) and skeleton.classifier.in_features == 640
    assert find_encoder_blocks(skeleton).num_blocks == 18
    assert json.loads((GEMMA_COPY / "config.json").read_text())["model_type"] == "gemma3_text"
