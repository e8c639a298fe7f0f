"""Pooling as the model's own head does it (first token / pooler for BERT, last real token for a
decoder) and mean pooling, each equal to an independent recomputation from ``output_hidden_states``;
fusing at the read positions only equals fusing everywhere; the feature cache equals the model."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest import write_folders, write_text_data, write_tiny_decoder, write_tiny_model
from torch import nn

from layerfusion_recipes.classify.experiment import ClassifyExperiment, ClassifySettings
from layerfusion_recipes.classify.models import new_modules
from layerfusion_recipes.core.engine.experiment import cache_positions_for
from layerfusion_recipes.core.engine.plan import SweepPlan
from layerfusion_recipes.core.engine.runner import Runner
from layerfusion_recipes.core.results.cells import Cell
from peft_layerfusion.discovery import EncoderBlocks
from peft_layerfusion.registration import ENCODER_METHODS
from peft_layerfusion.utils import eval_mode

CPU = torch.device("cpu")
# the pre-norm placement rule (the decoders branch): a cache replays a decoder's z_L before its final norm
PRE_NORM = "final_norms" in EncoderBlocks.__dataclass_fields__
DECODER_CACHE = pytest.param(
    "decoder",
    "model",
    "data",
    marks=pytest.mark.skipif(not PRE_NORM, reason="needs the pre-norm placement rule"),
)
TOKEN_WISE = [method.name for method in ENCODER_METHODS if method.token_wise]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_folders(
        tmp_path_factory,
        encoder=partial(write_tiny_model, segments=True),
        decoder=write_tiny_decoder,
        data=write_text_data,
        pairs=partial(write_text_data, pairs=True),
    )


def experiment(paths, model="encoder", data="data", plan=None, **options) -> ClassifyExperiment:
    return ClassifyExperiment(ClassifySettings(model=paths[model], data=paths[data], **options), plan=plan)


def batch_of(exp: ClassifyExperiment, count: int = 6) -> list[dict]:
    features = exp.dev[-count:]  # sorted by length: the longest, of several lengths (padding)
    assert len({len(f["input_ids"]) for f in features}) > 1
    return features


def reference_case(paths, positions: str, **options) -> tuple[ClassifyExperiment, list[dict], nn.Module]:
    """The experiment of ``options`` (its head reading ``positions``), a batch of its dev examples and
    its model as the cell's trial 0 draws it (the same head), the reference."""
    exp = experiment(paths, **options)
    assert exp.positions == positions
    features = batch_of(exp)
    return exp, features, exp.load_model(seed=exp.settings.seed).eval()


def inputs(features: list[dict]) -> dict[str, torch.Tensor]:
    width = max(len(f["input_ids"]) for f in features)
    pad = lambda key, value: torch.tensor([f[key] + [value] * (width - len(f[key])) for f in features])  # noqa: E731
    keys = [key for key in ("input_ids", "attention_mask", "token_type_ids") if key in features[0]]
    return {key: pad(key, 0) for key in keys}


def fused_states(hidden_states: tuple[torch.Tensor, ...], method: str) -> torch.Tensor:
    """The final state the head reads: ``z_L`` (plain head) or the Average of ``z_1 .. z_L``."""
    return hidden_states[-1] if method == "none" else torch.stack(hidden_states[1:]).mean(0)


def runner_logits(exp: ClassifyExperiment, method: str, features: list[dict], cache=None) -> torch.Tensor:
    model, located = exp.build(Cell(method, "fe", 2, 1, 0))
    runner = exp.runner(model, located, cache)
    with eval_mode(model):
        logits, labels = runner.logits(features, CPU)
    assert labels.tolist() == [f["labels"] for f in features]
    return logits


@pytest.mark.parametrize("data", ["data", "pairs"])
@pytest.mark.parametrize("method", ["none", "average"])
def test_bert_head_reads_the_first_token_through_its_pooler(paths, method, data):
    exp, features, reference = reference_case(paths, "first", data=data)
    with torch.no_grad():
        hidden = reference.bert(**inputs(features), output_hidden_states=True).hidden_states
        first = fused_states(hidden, method)[:, 0]  # (batch, d)
        expected = reference.classifier(torch.tanh(reference.bert.pooler.dense(first)))
    if data == "pairs":  # the second text's segment reaches the model
        assert any(1 in f["token_type_ids"] for f in features)
    torch.testing.assert_close(runner_logits(exp, method, features), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", ["none", "average"])
def test_mean_pooling_averages_the_real_tokens(paths, method):
    exp, features, reference = reference_case(paths, "all", pooling="mean")
    assert exp.head_modules() == ("classifier",)
    given = inputs(features)
    with torch.no_grad():
        hidden = reference.backbone(**given, output_hidden_states=True).hidden_states
        states = fused_states(hidden, method)
        pooled = torch.stack(
            [states[row, : int(given["attention_mask"][row].sum())].mean(0) for row in range(len(features))]
        )
        expected = reference.classifier(pooled)
    torch.testing.assert_close(runner_logits(exp, method, features), expected, rtol=0, atol=1e-6)


def test_decoder_head_reads_the_last_real_token(paths):
    exp, features, reference = reference_case(paths, "last", model="decoder")
    assert exp.head_modules() == ("score",)
    given = inputs(features)
    with torch.no_grad():
        last = reference.model(**given, output_hidden_states=True).last_hidden_state  # F(z_L)
        rows = torch.arange(len(features))
        expected = reference.score(last[rows, given["attention_mask"].sum(1) - 1])
    torch.testing.assert_close(runner_logits(exp, "none", features), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("model", "pooling"), [("encoder", "model"), ("encoder", "mean"), ("decoder", "model")]
)
@pytest.mark.parametrize("method", TOKEN_WISE)
def test_fusing_the_read_positions_only_equals_fusing_everywhere(paths, model, pooling, method):
    exp = experiment(paths, model=model, pooling=pooling)
    features = batch_of(exp)
    built, located = exp.build(Cell(method, "fe", 2, 1, 0))
    with eval_mode(built), torch.no_grad():
        restricted, _ = exp.runner(built, located, None).logits(features, CPU)
        everywhere, _ = Runner(built, pad_id=exp.pad_id).logits(features, CPU)
    torch.testing.assert_close(restricted, everywhere, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("model", "pooling", "data"),
    [("encoder", "model", "data"), ("encoder", "model", "pairs"), ("encoder", "mean", "data"), DECODER_CACHE],
)
@pytest.mark.parametrize("method", ["none", "dwatt", "extra_layers"])
def test_cached_logits_equal_the_model(paths, model, pooling, data, method):
    exp = experiment(paths, model=model, pooling=pooling, data=data)
    features = batch_of(exp)
    cached = runner_logits(exp, method, features, exp.cache())
    torch.testing.assert_close(cached, runner_logits(exp, method, features), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("model", "pooling", "data", "kept"),
    [
        ("encoder", "model", "pairs", "first"),
        ("encoder", "mean", "data", "all"),
        ("decoder", "model", "data", "last"),
    ],
)
@pytest.mark.parametrize("method", ["none", "dwatt"])
def test_a_cache_of_the_pooled_position_alone_gives_the_logits_of_the_model(
    paths, model, pooling, data, kept, method
):
    exp = experiment(paths, model=model, pooling=pooling, data=data, plan=SweepPlan(cache_positions="read"))
    features = batch_of(exp)
    cache = exp.cache()
    assert cache.positions.name == kept
    if kept != "all":  # one position of each example kept, not the whole sentence
        assert all(len(cache.key_of(f)[1]) == 1 < len(f["input_ids"]) for f in features)
    cached = runner_logits(exp, method, features, cache)
    torch.testing.assert_close(cached, runner_logits(exp, method, features), rtol=0, atol=1e-5)
    assert cache_positions_for([method, "extra_layers"]) == "all"  # R+n reads every position
    assert cache_positions_for([method]) == "read"


def test_new_modules_are_the_outermost_modules_the_checkpoint_lacks():
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48)
    model = BertForSequenceClassification(config)
    missing = ["classifier.weight", "classifier.bias", "bert.pooler.dense.weight", "bert.pooler.dense.bias"]
    assert new_modules(model, missing) == ("bert.pooler", "classifier")
    assert new_modules(model, missing[:1]) == ()  # a module keeps its checkpoint bias: not new
