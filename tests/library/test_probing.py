"""The library's probe-guided start (probing.py): a label that lives in one hidden state is found
there, on dev; one learning rate fits states of any scale (each read at unit RMS)."""

from __future__ import annotations

import pytest
import torch

from peft_layerfusion import best_layer, dev_standard_error, keep_fusion, layer_probe_scores


def toy(label_state: int, scales: tuple[float, ...] = (1.0, 30.0, 900.0, 27000.0), seed: int = 0):
    """``(states (60, 4, 16), labels)``: the label is the sign of one coordinate of ``label_state``; the
    states' scales grow with depth as a pre-norm stream's do."""
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(60, 4, 16, generator=generator) * torch.tensor(scales).view(1, 4, 1)
    labels = (states[:, label_state, 3] > 0).long()
    return states, labels


@pytest.mark.parametrize("label_state", [1, 2, 3])
def test_the_probes_find_the_state_that_carries_the_label(label_state):
    states, labels = toy(label_state)
    scores = layer_probe_scores(states[:40], labels[:40], states[40:], labels[40:])
    assert len(scores) == 4 and best_layer(scores, skip_embeddings=True) == label_state
    others = [score for index, score in enumerate(scores) if index != label_state]
    assert scores[label_state] >= max(others) + 0.2  # 0.85-0.95 against 0.6 at most (40 examples)


def test_dev_alone_decides():
    states, labels = toy(2)
    flipped = layer_probe_scores(states[:40], labels[:40], states[40:], 1 - labels[40:])
    assert best_layer(flipped, skip_embeddings=True) != 2  # a dev set that disagrees moves the choice


def test_best_layer_ties_go_deeper_and_can_skip_the_embeddings():
    assert best_layer([0.9, 0.5, 0.7, 0.7]) == 0
    assert best_layer([0.9, 0.5, 0.7, 0.7], skip_embeddings=True) == 3


def test_shapes_that_disagree_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"train_states \(4, 3, 8\) and dev_states \(4, 2, 8\)"):
        labels = torch.zeros(4).long()
        layer_probe_scores(torch.zeros(4, 3, 8), labels, torch.zeros(4, 2, 8), labels)


def test_state_norm_none_reads_the_states_as_they_are():
    """``state_norm="none"`` on states put at unit RMS by hand scores as the default on the raw ones;
    on the raw states themselves (scales 1 .. 27000) one LR no longer fits every depth."""
    states, labels = toy(2)
    by_hand = states / torch.sqrt((states * states).mean(-1, keepdim=True) + 1e-6)
    default = layer_probe_scores(states[:40], labels[:40], states[40:], labels[40:])
    none = layer_probe_scores(by_hand[:40], labels[:40], by_hand[40:], labels[40:], state_norm="none")
    assert none == pytest.approx(default, abs=1e-12)
    raw = layer_probe_scores(states[:40], labels[:40], states[40:], labels[40:], state_norm="none")
    assert raw != default
    with pytest.raises(
        ValueError, match=r"`state_norm`='layer' is not allowed: expected one of \['none', 'rms'\]"
    ):
        layer_probe_scores(states[:40], labels[:40], states[40:], labels[40:], state_norm="layer")


def test_the_dev_score_s_standard_error_is_binomial():
    assert dev_standard_error(0.5, 100) == pytest.approx(0.05)  # sqrt(0.25 / 100)
    assert dev_standard_error(0.9, 900) == pytest.approx(0.01)  # sqrt(0.09 / 900)
    assert dev_standard_error(1.0, 10) == 0.0


def test_the_fusion_is_kept_only_beyond_one_standard_error_of_the_layer_s_dev_score():
    assert keep_fusion(0.56, 0.5, 100)  # +6 points against 5 of noise
    assert not keep_fusion(0.54, 0.5, 100)  # +4 points: within the noise, the layer stays
    assert keep_fusion(0.54, 0.5, 10000)  # the same gain on 100x the dev set: 0.5 points of noise
    assert not keep_fusion(0.5, 0.5, 10**9)  # a tie keeps the layer


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: keep_fusion(1.5, 0.5, 100), r"`fusion_dev`=1.5 is not allowed: expected a dev score in \["),
        (lambda: keep_fusion(0.6, 60.0, 100), r"`score`=60.0 is not allowed"),  # points, not a fraction
        (lambda: dev_standard_error(0.5, 0), r"`dev_size`=0 is not allowed: expected the number of dev"),
    ],
)
def test_scores_outside_0_1_and_an_empty_dev_set_are_refused_naming_the_field(call, message):
    with pytest.raises(ValueError, match=message):
        call()
