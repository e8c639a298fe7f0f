"""Where a fusion should start: a linear probe per layer, scored on dev (a probe-guided start).

A frozen model's intermediate layers often carry a task better than its last one (on decoders the
middle of the stack, Skean et al. 2025). :func:`layer_probe_scores` trains one linear probe per hidden
state on the training examples and scores it on dev; :func:`best_layer` picks the block to start a
mix on (``LayerMixConfig(start_layer=...)``, ``ScalarMixConfig(start_layer=...)``) or the top blocks
to fuse (``layers=[...]``). Test data never enters: the choice is made on dev.

The inputs are the states a head would read, one row per example, e.g. the pooled token of every
``output_hidden_states`` entry: ``torch.stack(out.hidden_states, 1)[rows, position]`` ``(n, L + 1, d)``.
Each state is read at unit RMS by default (``z / rms(z)``, as ``state_norm="rms"`` mixes it), so one
learning rate fits every depth however large the stream has grown; ``state_norm="none"`` reads it as it
is. Neither reading wins on every task and model: the strongest single-layer bar probes both and keeps
whichever dev prefers (the recipes' ``--probe-layers`` do, each over an LR grid grown until its best is
inside).

The last step is a guard, on dev too (:func:`keep_fusion`): keep the trained mix only where its dev
score beats the best probe's by more than one standard error of that score, else read that block alone
(``AverageConfig(layers=[block], state_norm="rms_after_norm")``: exactly ``z / rms(z)`` of that block
where the head reads, what its probe read, also on a pre-norm decoder, whose final norm would otherwise
multiply it by a gain fitted to ``z_L``). The mix starts as that block and can only move
away from it; on a few examples it sometimes moves the wrong way, and a dev gain smaller than the dev
score's own noise is more often the luck of the choice than a better model.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> states = torch.randn(40, 4, 16)  # (examples, hidden states z_0..z_3, d)
    >>> labels = (states[:, 2, 0] > 0).long()  # the label lives in z_2
    >>> scores = layer_probe_scores(states[:30], labels[:30], states[30:], labels[30:])
    >>> best_layer(scores, skip_embeddings=True)
    2
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .config import invalid
from .fusion import unit_rms

# What a probe reads of one state: the state as it is, or at unit RMS per position (the config's
# "rms_after_norm" places a mix after the final norm; a single state has no such choice).
PROBED_STATE_NORMS: tuple[str, ...] = ("none", "rms")


def layer_probe_scores(
    train_states: torch.Tensor,
    train_labels: torch.Tensor,
    dev_states: torch.Tensor,
    dev_labels: torch.Tensor,
    steps: int = 200,
    lr: float = 1e-2,
    seed: int = 0,
    state_norm: str = "rms",
) -> list[float]:
    """Dev accuracy of a linear probe on each hidden state, trained on the training examples.

    Args:
        train_states: ``(n, K, d)``: each training example's ``K`` hidden states (e.g. ``z_0 .. z_L``
            at the position the head reads).
        train_labels: ``(n,)`` class ids.
        dev_states: ``(m, K, d)``.
        dev_labels: ``(m,)``.
        steps: Full-batch Adam steps of every probe (all ``K`` train together, each on its own state).
        lr: Adam's learning rate.
        seed: Seed of the probes' initial weights.
        state_norm: ``"rms"``: each state read as ``z / rms(z)`` per row; ``"none"``: as it is.

    Returns:
        ``K`` dev accuracies in ``[0, 1]``, in the order of the states.

    Raises:
        ValueError: when the shapes do not agree (naming them), or ``state_norm`` is not one of
            ``"none"``, ``"rms"``.

    Example:
        >>> states = torch.randn(12, 3, 8) * torch.tensor([1.0, 40.0, 1600.0]).view(1, 3, 1)  # (n, K, d)
        >>> labels = (states[:, 1, 0] > 0).long()
        >>> scores = layer_probe_scores(states[:8], labels[:8], states[8:], labels[8:], state_norm="none")
        >>> len(scores), all(0.0 <= score <= 1.0 for score in scores)
        (3, True)
    """
    if state_norm not in PROBED_STATE_NORMS:
        raise invalid("state_norm", state_norm, f"one of {list(PROBED_STATE_NORMS)}")
    if train_states.dim() != 3 or dev_states.shape[1:] != train_states.shape[1:]:
        raise ValueError(
            f"train_states {tuple(train_states.shape)} and dev_states {tuple(dev_states.shape)}: expected "
            "(examples, states, d) with the same states and d"
        )
    if len(train_labels) != len(train_states) or len(dev_labels) != len(dev_states):
        raise ValueError("one label per example expected in train_labels and dev_labels")
    classes = int(max(train_labels.max(), dev_labels.max())) + 1
    count, width = train_states.shape[1], train_states.shape[2]
    generator = torch.Generator().manual_seed(seed)
    weight = (torch.randn(count, width, classes, generator=generator) / width**0.5).requires_grad_(True)
    bias = torch.zeros(count, 1, classes, requires_grad=True)
    read = unit_rms if state_norm == "rms" else torch.clone
    train = read(train_states.detach().float()).transpose(0, 1)  # (K, n, d)
    dev = read(dev_states.detach().float()).transpose(0, 1)  # (K, m, d)
    optimizer = torch.optim.Adam([weight, bias], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            logits = torch.baddbmm(bias, train, weight)  # (K, n, C)
            loss = F.cross_entropy(logits.flatten(0, 1), train_labels.repeat(count), reduction="sum") / len(
                train_labels
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        predicted = torch.baddbmm(bias, dev, weight).argmax(-1)  # (K, m)
        return (predicted == dev_labels).float().mean(-1).tolist()


def best_layer(scores: Sequence[float], skip_embeddings: bool = False) -> int:
    """The index of the best score (ties to the deeper state), optionally never ``z_0``.

    Example:
        >>> best_layer([0.5, 0.7, 0.7, 0.6])
        2
    """
    candidates = range(1 if skip_embeddings else 0, len(scores))
    return max(candidates, key=lambda index: (scores[index], index))


def dev_standard_error(score: float, dev_size: int) -> float:
    """The binomial standard error of a dev score: ``sqrt(score * (1 - score) / dev_size)``.

    Args:
        score: A dev score in ``[0, 1]`` that averages over ``dev_size`` units: accuracy over examples;
            for an entity F1, about the fraction of the gold entities found, so ``dev_size`` counts them.
        dev_size: How many units the score averages over (at least 1).

    Example:
        >>> round(dev_standard_error(0.8, 1000), 4)  # 0.8 on 1000 dev examples: 1.3 points of noise
        0.0126
    """
    if not 0.0 <= score <= 1.0:
        raise invalid("score", score, "a dev score in [0, 1]")
    if dev_size < 1:
        raise invalid("dev_size", dev_size, "the number of dev units, at least 1")
    return math.sqrt(score * (1.0 - score) / dev_size)


def keep_fusion(fusion_dev: float, layer_dev: float, dev_size: int) -> bool:
    """Whether a trained fusion earns its place over the best single layer: the one-standard-error rule.

    Keep the fusion only where its dev score beats the best layer's by more than one standard error of
    the layer's dev score (:func:`dev_standard_error`); else read the layer alone. It is the rule of
    Breiman et al. (1984) for choosing among models on held-out data: take the simplest model whose
    score is within one standard error of the best. Both scores are maxima over a grid of LRs and
    epochs (and the layer's over blocks), so a gain smaller than that noise is as likely the winner's
    luck as a better model.

    Args:
        fusion_dev: The trained fusion's dev score, in ``[0, 1]``.
        layer_dev: The best single layer's dev score (its probe, chosen on the same dev set).
        dev_size: How many units both scores average over (dev examples; gold entities for NER).

    Example:
        >>> keep_fusion(0.83, 0.80, 1000), keep_fusion(0.81, 0.80, 1000)  # noise: 1.3 points
        (True, False)
    """
    if not 0.0 <= fusion_dev <= 1.0:
        raise invalid("fusion_dev", fusion_dev, "a dev score in [0, 1]")
    return fusion_dev > layer_dev + dev_standard_error(layer_dev, dev_size)
