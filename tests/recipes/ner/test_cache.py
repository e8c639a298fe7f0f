"""The FE feature cache: same logits and F1 as the uncached path, replay restores the blocks."""

from __future__ import annotations

import pytest
import torch
from conftest import toy_dataset, write_tiny_model
from torch import nn

from layerfusion_recipes.core.batches import collate
from layerfusion_recipes.core.cache.feature_cache import (
    COMPUTED,
    NOTHING,
    FeatureCache,
    OutputSlot,
    learn_block_outputs,
    same_arguments,
)
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings
from layerfusion_recipes.ner.training import TokenClassifierRunner, TrainSettings, train_token_classifier
from peft_layerfusion.discovery import EncoderBlocks, find_encoder_blocks


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return NerExperiment(NerSettings(model=path, data="toy", lr=3e-2, batch_size=4), toy_dataset(train=40))


def _train_one_epoch(experiment: NerExperiment, method: str, use_cache: bool):
    cell = Cell(method, "fe", shots=4, epochs=1, trial=0)
    train = experiment.train_sample(cell.shots, cell.trial)
    model, located = experiment.build(cell)
    cache = experiment.cache() if use_cache else None
    if cache is not None:
        cache.fill(train)
    runner = TokenClassifierRunner(model, located, cache)
    result = train_token_classifier(
        runner, train, experiment.dev, experiment.id2label, TrainSettings(epochs=1, batch_size=4), 3e-2
    )
    model.eval()
    with torch.no_grad():
        logits, labels = runner.logits(experiment.dev, torch.device("cpu"))
    return logits, collate(experiment.dev)["attention_mask"].bool(), result


@pytest.mark.parametrize("method", ["none", "concat", "dwatt", "extra_layers", "scalar_mix"])
def test_cached_logits_equal_uncached_after_one_epoch(experiment, method):
    plain, mask, plain_result = _train_one_epoch(experiment, method, use_cache=False)
    cached, _, cached_result = _train_one_epoch(experiment, method, use_cache=True)
    assert plain.abs().max() > 0.01  # real logits, not zeros
    torch.testing.assert_close(cached[mask], plain[mask], atol=1e-5, rtol=0)
    assert abs(cached_result.best_f1 - plain_result.best_f1) <= 0.005


def test_cached_and_uncached_runs_give_the_same_dev_f1(experiment):
    cell = Cell("concat", "fe", shots=6, epochs=4, trial=1)
    plain, cached = experiment.run(cell, use_cache=False), experiment.run(cell, use_cache=True)
    assert cached["cached"] and not plain["cached"]
    assert plain["best_f1"] > 0.3  # it learned something
    assert [p["dev_f1"] for p in plain["curve"]] == pytest.approx(
        [c["dev_f1"] for c in cached["curve"]], abs=0.005
    )


def test_replay_skips_blocks_and_restores_them(experiment):
    cache = experiment.cache()
    model, located = experiment.build(Cell("none", "fe", 2, 1, 0))
    features = experiment.dev[:3]
    calls = []
    handle = located.blocks[0].register_forward_hook(lambda *a: calls.append(1))
    states = cache.batch_states(features)  # (L, batch, seq, d)
    assert states.shape[:2] == (located.num_blocks, 3)
    with cache.replay(located, torch.zeros_like(states)):
        batch = collate(features)
        hidden = model.bert(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
    assert hidden.abs().max() == 0  # last block's replayed (zero) output reached the head's input
    assert "forward" not in located.blocks[0].__dict__  # the real forward is back
    handle.remove()


def test_cache_fills_once_and_persists(tmp_path, experiment):
    from layerfusion_recipes.ner.models import load_token_classifier

    base = load_token_classifier(experiment.settings.model, 5, seed=0)
    located = find_encoder_blocks(base)
    cache = FeatureCache(base, located, experiment.settings.model, 128, directory=tmp_path)
    assert cache.fill(experiment.dev[:5]) == 5
    assert cache.fill(experiment.dev[:7]) == 2
    reloaded = FeatureCache(base, located, experiment.settings.model, 128, directory=tmp_path)
    assert len(reloaded) == 7 and reloaded.fill(experiment.dev[:7]) == 0
    key = cache.key_of(experiment.dev[0])
    torch.testing.assert_close(reloaded.states[key], cache.states[key], atol=0, rtol=0)
    other = FeatureCache(base, located, experiment.settings.model, 64, directory=tmp_path)
    assert len(other) == 0  # max_length is part of the key


def test_workers_share_shards_and_never_recompute(tmp_path, experiment):
    from layerfusion_recipes.ner.models import load_token_classifier

    base = load_token_classifier(experiment.settings.model, 5, seed=0)
    located = find_encoder_blocks(base)
    first = FeatureCache(base, located, experiment.settings.model, 128, directory=tmp_path)
    second = FeatureCache(base, located, experiment.settings.model, 128, directory=tmp_path)  # a 2nd worker
    assert first.fill(experiment.dev[:5]) == 5
    (first.path / "crashed-writer.tmp").write_bytes(b"half a file")  # an interrupted write is ignored
    assert second.fill(experiment.dev[:7]) == 2  # read the first worker's shard, computed the rest
    assert first.fill(experiment.dev[:7]) == 0 and len(first) == 7
    assert sorted(p.suffix for p in first.path.iterdir()) == [".safetensors", ".safetensors", ".tmp"]
    key = first.key_of(experiment.dev[6])
    torch.testing.assert_close(first.states[key], second.states[key], atol=0, rtol=0)


class BiasBlock(nn.Module):
    """A block that returns ``(hidden, bias)``: the bias it got, or a new one where it got none (as T5's
    blocks hand on the position bias that block 0 computes)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(
        self, hidden: torch.Tensor, bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bias = torch.arange(4.0) if bias is None else bias
        return self.linear(hidden) + bias, bias


class BiasStack(nn.Module):
    """Three :class:`BiasBlock`; with ``rescale`` the container doubles the bias between blocks."""

    def __init__(self, rescale: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList(BiasBlock() for _ in range(3))
        self.rescale = rescale

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden, bias = self.embed(input_ids), None
        for layer in self.layers:
            hidden, bias = layer(hidden, bias=bias)
            if self.rescale and bias is not None:
                bias = bias * 2  # what a block hands on changes between blocks: no replay rebuilds it
        return hidden


@pytest.mark.parametrize("rescale", [False, True])
def test_what_the_blocks_hand_on_is_learned_from_a_real_forward(rescale):
    """A value a block computes and the next one reads: that block runs in a replay; a value a block got
    and returns: handed on. Where the container changes it between blocks, the replayed sentence gives the
    last block another call, and the cache says so (``exact_calls``)."""
    stack = BiasStack(rescale)
    located = EncoderBlocks("layers", stack.layers, "", stack)
    outputs = learn_block_outputs(stack, located, {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]})
    handed_on = (OutputSlot("kwarg", "bias"),)
    assert outputs.slots == ((NOTHING if rescale else COMPUTED,), handed_on, handed_on)
    assert outputs.computes(0) is not rescale
    assert outputs.exact_calls is not rescale


def test_block_calls_are_the_same_only_with_equal_tensors_and_values():
    call = ((torch.ones(2, 3), None), {"bias": torch.zeros(3), "layer": 1})
    assert same_arguments(call, ((torch.ones(2, 3), None), {"bias": torch.zeros(3), "layer": 1}))
    assert not same_arguments(call, ((torch.ones(2, 3), None), {"bias": None, "layer": 1}))  # bias missing
    assert not same_arguments(call, ((torch.ones(2, 3), None), {"bias": torch.ones(3), "layer": 1}))
    assert not same_arguments(call, ((torch.ones(2, 3), None), {"bias": torch.zeros(3), "layer": 2}))
    assert not same_arguments(call, ((torch.ones(2, 3).double(), None), {"bias": torch.zeros(3), "layer": 1}))
