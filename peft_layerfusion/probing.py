"""Linear probes of hidden states (one convex, deterministic trainer) and where a fusion should start.

A frozen model's intermediate layers often carry a task better than its last one (on decoders the
middle of the stack, Skean et al. 2025). A probe says which: a linear classifier trained on one state.

**The probe** is a ridge classifier: class scores ``W x + b`` (``W`` ``(C, d)``, ``b`` ``(C,)``), the
weighted least-squares fit of the one-hot labels, on cached features, one row per example (a sentence
task: the pooled state; a token task: one row per labelled token), minimising

    mean_i w_i ||onehot(y_i) - W x_i - b||^2 + penalty * m * ||W||_F^2,     m = mean of x^2 over the rows

with each class weighing the same (``w_i = n / (C' count(y_i))``, :func:`balanced_weights`: all 1 on a
stratified sample, and a token task's ``O`` rows no longer drown its entity tags), in float64
(:func:`fit_probe`). ``m`` makes the penalty scale-free: features scaled by ``c`` give ``W / c``
and the same scores, so one grid of penalties fits every depth however large its stream has grown
(states read at unit RMS have ``m = 1``). The objective is strictly convex in ``W`` (``b`` unpenalised);
its optimum has a closed form, computed from one symmetric eigendecomposition of the centred rows for
every penalty at once (of their ``(n, n)`` inner products where the rows are fewer than the features, read
from one Gram matrix that every fold of a cross-validation shares, :class:`Gram`): no iterations, no
random start, no shuffling, the same numbers on every run, and on another machine up to float rounding.
The scores estimate the class probabilities; clipped at 0 and
renormalised they are the probe's probabilities (:func:`probabilities`). Rows labelled ``-100``
(:data:`IGNORE_INDEX`) are ignored, in training and in every score.

**Its penalty** is chosen by k-fold cross-validation on the training rows alone
(:func:`cross_validated_probe`): folds stratified by label (or whole groups, e.g. a sentence's tokens)
and dealt from a seed; the penalty of :data:`PENALTIES` (grown past an end where the best sits on it,
:data:`GROW_STEPS` steps at most, and flagged where it still does) with the smallest out-of-fold Brier
score (the squared error of the scores against the one-hot labels, a proper scoring rule); where that
loss sits on a flat stretch at an end, having met its limit there, the least extreme penalty that scores
as well (:func:`inward`). The out-of-fold probabilities of every row are kept: what a probe ensemble, a
stacked combiner or a paired test builds on.

**Per block** (:func:`layer_probes`): one cross-validated probe on each state of ``(n, K, d)``, e.g. the
pooled token of every ``output_hidden_states`` entry: ``torch.stack(out.hidden_states, 1)[rows, position]``,
all on the same folds. Each state is read at unit RMS by default (``z / rms(z)``, as ``state_norm="rms"``
mixes it); ``state_norm="none"`` reads it as it is. :func:`best_layer` picks the block to start a mix on
(``ScalarMixConfig.from_preset("layer_mix", start_layer=...)``) or the top blocks to fuse (``layers=[...]``);
:func:`layer_probe_scores` scores each block's probe on held-out data the caller passes.

The last step is a guard (:func:`keep_fusion`): keep the trained mix only where its held-out score beats
the best probe's by more than one standard error of that score, else read that block alone
(``AverageConfig(layers=[block], state_norm="rms_after_norm")``: exactly ``z / rms(z)`` of that block
where the head reads, what its probe read, also on a pre-norm decoder). The mix starts as that block and
can only move away from it; on a few examples it sometimes moves the wrong way, and a gain smaller than
the score's own noise is more often the luck of the choice than a better model.

Example:
    >>> _ = torch.manual_seed(0)
    >>> states = torch.randn(40, 4, 16)  # (examples, hidden states z_0..z_3, d)
    >>> labels = (states[:, 2, 0] > 0).long()  # the label lives in z_2
    >>> probes = layer_probes(states, labels, folds=4)
    >>> best_layer(probes.cv_accuracies, skip_embeddings=True)
    2
    >>> probes.out_of_fold.shape  # (states, examples, classes): each row predicted by the other folds
    torch.Size([4, 40, 2])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from .config import invalid
from .fusion import unit_rms

IGNORE_INDEX = -100  # a row with this label is ignored, in training and in scoring
# What a probe reads of one state: the state as it is, or at unit RMS per position (the config's
# "rms_after_norm" places a mix after the final norm; a single state has no such choice).
PROBED_STATE_NORMS: tuple[str, ...] = ("none", "rms")
PENALTIES: tuple[float, ...] = tuple(10.0 ** (k / 2) for k in range(-8, 5))  # 1e-4 .. 1e2, half decades
FOLDS = 4  # cross-validation folds
GROW_STEPS = 8  # penalties a grid may grow past each of its ends (a step: the ratio of its two end values)
FLAT = 1e-3  # out-of-fold losses within this fraction of the best one are a tie (a flat stretch of the curve)


@dataclass(frozen=True)
class Probe:
    """A fitted ridge probe: class scores ``W x + b`` (:func:`fit_probe`), the least-squares estimates of
    the class probabilities.

    Args:
        weight: ``W`` ``(C, d)``, float64.
        bias: ``b`` ``(C,)``, float64 (0 for a class that no fitted row had: never its best score).
        penalty: The L2 penalty it was fitted with.
    """

    weight: torch.Tensor
    bias: torch.Tensor
    penalty: float

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The scores ``W x + b`` of each row of ``features`` ``(m, d)``: ``(m, C)``, float64."""
        return torch.addmm(self.bias, features.detach().to(torch.float64), self.weight.T)

    def predict_proba(self, features: torch.Tensor) -> torch.Tensor:
        """The class probabilities of each row of ``features`` ``(m, d)`` (:func:`probabilities` of the
        scores): ``(m, C)``, float64."""
        return probabilities(self.logits(features))

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """The most probable class of each row of ``features`` ``(m, d)``: ``(m,)``."""
        return self.logits(features).argmax(-1)


@dataclass(frozen=True)
class CrossValidatedProbe:
    """A probe whose penalty was chosen by cross-validation on its training rows
    (:func:`cross_validated_probe`).

    Args:
        probe: Fitted on every labelled row at the chosen penalty.
        penalty: The chosen penalty: the smallest out-of-fold Brier score (ties to the larger penalty),
            moved inwards across a flat stretch at an end of the grid (:func:`inward`).
        penalties: Every penalty tried, ascending (the grid, grown past an end where the best sat on it).
        losses: The out-of-fold Brier score at each of ``penalties``.
        accuracies: The out-of-fold accuracy at each of ``penalties``.
        out_of_fold_scores: ``(n, C)``: each row's scores ``W x + b`` from the probe fitted on the other
            folds at the chosen penalty (``NaN`` on rows labelled ``-100``).
        out_of_fold: ``(n, C)``: each row's probabilities from the probe fitted on the other folds at the
            chosen penalty; ``NaN`` on rows labelled ``-100``.
        on_edge: Whether the chosen penalty is still an end of ``penalties`` (grown as far as allowed):
            the loss still fell there, and the best may lie beyond it.
    """

    probe: Probe
    penalty: float
    penalties: tuple[float, ...]
    losses: tuple[float, ...]
    accuracies: tuple[float, ...]
    out_of_fold: torch.Tensor
    out_of_fold_scores: torch.Tensor
    on_edge: bool

    @property
    def loss(self) -> float:
        """The out-of-fold Brier score at the chosen penalty."""
        return self.losses[self.penalties.index(self.penalty)]

    @property
    def accuracy(self) -> float:
        """The out-of-fold accuracy at the chosen penalty."""
        return self.accuracies[self.penalties.index(self.penalty)]


@dataclass(frozen=True)
class LayerProbes:
    """One cross-validated probe per hidden state, on the same folds (:func:`layer_probes`).

    Args:
        fits: One :class:`CrossValidatedProbe` per state, in the order of the states.
        state_norm: How each state was read: ``"rms"`` (``z / rms(z)`` per row) or ``"none"``.
    """

    fits: tuple[CrossValidatedProbe, ...]
    state_norm: str

    @property
    def cv_accuracies(self) -> list[float]:
        """Each state's out-of-fold accuracy at its chosen penalty."""
        return [fit.accuracy for fit in self.fits]

    @property
    def cv_losses(self) -> list[float]:
        """Each state's out-of-fold Brier score at its chosen penalty."""
        return [fit.loss for fit in self.fits]

    @property
    def penalties(self) -> list[float]:
        """Each state's chosen penalty."""
        return [fit.penalty for fit in self.fits]

    @property
    def out_of_fold(self) -> torch.Tensor:
        """``(K, n, C)``: every state's out-of-fold probabilities (``NaN`` on rows labelled ``-100``)."""
        return torch.stack([fit.out_of_fold for fit in self.fits])

    def predict_proba(self, states: torch.Tensor) -> torch.Tensor:
        """``(K, m, C)``: each state's probe on ``states`` ``(m, K, d)``, read as the probes were fitted."""
        sizes = len(self.fits), self.fits[0].probe.weight.shape[1]
        read = read_states(check_states("states", states, *sizes), self.state_norm)
        return torch.stack([fit.probe.predict_proba(read[:, k]) for k, fit in enumerate(self.fits)])

    def accuracies(self, states: torch.Tensor, labels: torch.Tensor) -> list[float]:
        """Each state's probe's accuracy on ``states`` ``(m, K, d)`` and ``labels`` ``(m,)`` (rows labelled
        ``-100`` not counted)."""
        classes = self.fits[0].probe.weight.shape[0]
        labels = check_labels("labels", labels, len(states), classes)
        return [probe_accuracy(proba, labels) for proba in self.predict_proba(states)]


def fit_probe(
    features: torch.Tensor,
    labels: torch.Tensor,
    penalty: float,
    classes: int | None = None,
) -> Probe:
    """The ridge probe of ``features`` at one L2 penalty (the objective: the module docstring).

    Args:
        features: ``(n, d)``, one row per example (or per labelled token).
        labels: ``(n,)`` class ids; ``-100`` ignores a row.
        penalty: The L2 penalty, ``> 0``, on ``W`` scaled by the features' mean square.
        classes: ``C``; by default the largest label + 1.

    Returns:
        The :class:`Probe`.

    Raises:
        ValueError: one line naming the field, the value and what is allowed: no labelled row, labels out
            of range or not integers, non-finite features, lengths that disagree, a penalty not ``> 0``.

    Example:
        >>> features = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
        >>> probe = fit_probe(features, torch.tensor([0, 1, 0, 1]), penalty=0.1)
        >>> probe.predict(torch.tensor([[0.0, 3.0], [3.0, 0.0]])).tolist()
        [0, 1]
        >>> fit_probe(features, torch.tensor([0.0, 1.0, 0.0, 1.0]), penalty=0.1)
        Traceback (most recent call last):
        ValueError: `labels` has dtype torch.float32: expected integer class ids (-100: ignored).
    """
    check_penalty(penalty)
    features, labels, classes = check_rows("features", features, labels, classes)
    return reduce(Gram(features), labels, classes).probe(penalty)


def cross_validated_probe(
    features: torch.Tensor,
    labels: torch.Tensor,
    penalties: Sequence[float] = PENALTIES,
    folds: int = FOLDS,
    seed: int = 0,
    groups: torch.Tensor | None = None,
    classes: int | None = None,
) -> CrossValidatedProbe:
    """A ridge probe whose penalty is chosen by ``folds``-fold cross-validation on these rows alone.

    Each penalty's probes are fitted on all folds but one and predict the one left out; the penalty with
    the smallest out-of-fold Brier score wins (ties to the larger), moved inwards where it sits on a
    flat stretch at an end that has met its limit (:func:`inward`). Where the choice is the smallest or
    largest tried, the grid grows one step past that end (the ratio of its two end values),
    :data:`GROW_STEPS` times at most; ``on_edge`` says where it still sits on an end.

    Args:
        features: ``(n, d)``.
        labels: ``(n,)`` class ids; ``-100`` ignores a row (in the fits and in every score).
        penalties: The penalties to try (each ``> 0``; two at least for the grid to grow).
        folds: ``k``, from 2 to the number of labelled rows (or groups).
        seed: Deals the folds (:func:`probe_folds`).
        groups: ``(n,)`` integer ids of rows that stay in one fold (a sentence's tokens); ``None``: each row
            its own, the folds stratified by label.
        classes: ``C``; by default the largest label + 1.

    Returns:
        The :class:`CrossValidatedProbe`.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> features = torch.randn(32, 8)
        >>> labels = (features[:, 0] > 0).long()
        >>> found = cross_validated_probe(features, labels, folds=4)
        >>> found.penalty in found.penalties, found.on_edge, round(found.accuracy, 2)
        (True, False, 0.78)
        >>> cross_validated_probe(features[:3], labels[:3], folds=4)
        Traceback (most recent call last):
        ValueError: `folds`=4 is not allowed: expected an integer from 2 to the 3 labelled rows.
    """
    grid = check_penalties(penalties)
    features, labels, classes = check_rows("features", features, labels, classes)
    fold_of = probe_folds(labels, folds, seed, groups)
    return cross_validate(features, labels, classes, fold_of, grid)


def layer_probes(
    states: torch.Tensor,
    labels: torch.Tensor,
    penalties: Sequence[float] = PENALTIES,
    folds: int = FOLDS,
    seed: int = 0,
    groups: torch.Tensor | None = None,
    classes: int | None = None,
    state_norm: str = "rms",
) -> LayerProbes:
    """A cross-validated probe (:func:`cross_validated_probe`) on each hidden state, all on the same folds.

    Args:
        states: ``(n, K, d)``: each row's ``K`` hidden states (e.g. ``z_0 .. z_L`` at the position the head
            reads).
        labels: ``(n,)`` class ids; ``-100`` ignores a row.
        penalties: The penalties each state's probe tries (grown past an end as needed).
        folds: ``k``.
        seed: Deals the folds.
        groups: ``(n,)`` ids of rows that stay in one fold (a token task: each token's sentence).
        classes: ``C``; by default the largest label + 1.
        state_norm: ``"rms"``: each state read as ``z / rms(z)`` per row; ``"none"``: as it is.

    Returns:
        The :class:`LayerProbes`: per state, its chosen penalty, out-of-fold scores and probabilities.

    Example:
        >>> states = torch.randn(24, 3, 8) * torch.tensor([1.0, 40.0, 1600.0]).view(1, 3, 1)  # (n, K, d)
        >>> labels = (states[:, 1, 0] > 0).long()
        >>> probes = layer_probes(states, labels, folds=3, state_norm="none")
        >>> len(probes.cv_accuracies), probes.cv_accuracies[1] > max(probes.cv_accuracies[0], 0.7)
        (3, True)
    """
    if state_norm not in PROBED_STATE_NORMS:
        raise invalid("state_norm", state_norm, f"one of {list(PROBED_STATE_NORMS)}")
    grid = check_penalties(penalties)
    states = check_states("states", states, "states", "d")
    labels = check_labels("labels", labels, len(states), check_classes(classes))
    classes = classes or int(labels.max()) + 1
    fold_of = probe_folds(labels, folds, seed, groups)
    read = read_states(states, state_norm)
    fits = [cross_validate(read[:, k], labels, classes, fold_of, grid) for k in range(read.shape[1])]
    return LayerProbes(tuple(fits), state_norm)


def layer_probe_scores(
    train_states: torch.Tensor,
    train_labels: torch.Tensor,
    dev_states: torch.Tensor,
    dev_labels: torch.Tensor,
    folds: int = FOLDS,
    seed: int = 0,
    state_norm: str = "rms",
) -> list[float]:
    """Held-out accuracy of each hidden state's probe, fitted on the training rows (:func:`layer_probes`:
    its penalty chosen by cross-validation on them alone).

    Args:
        train_states: ``(n, K, d)``: each training example's ``K`` hidden states.
        train_labels: ``(n,)`` class ids (``-100``: ignored).
        dev_states: ``(m, K, d)``: the rows to score on.
        dev_labels: ``(m,)`` (``-100``: not scored).
        folds: The cross-validation folds on the training rows.
        seed: Deals the folds.
        state_norm: ``"rms"``: each state read as ``z / rms(z)`` per row; ``"none"``: as it is.

    Returns:
        ``K`` accuracies in ``[0, 1]``, in the order of the states.

    Example:
        >>> states = torch.randn(16, 3, 8) * torch.tensor([1.0, 40.0, 1600.0]).view(1, 3, 1)  # (n, K, d)
        >>> labels = (states[:, 1, 0] > 0).long()
        >>> scores = layer_probe_scores(states[:12], labels[:12], states[12:], labels[12:], folds=3)
        >>> len(scores), all(0.0 <= score <= 1.0 for score in scores)
        (3, True)
        >>> layer_probe_scores(states[:12], labels[:12], states[12:, :2], labels[12:], folds=3)
        Traceback (most recent call last):
        ValueError: `dev_states` has shape (4, 2, 8): expected (rows, 3, 8), as the training states.
    """
    train_states = check_states("train_states", train_states, "states", "d")
    check_states("dev_states", dev_states, *train_states.shape[1:])
    train_labels = check_labels("train_labels", train_labels, len(train_states), None)
    dev_labels = check_labels("dev_labels", dev_labels, len(dev_states), None)
    classes = int(max(train_labels.max(), dev_labels.max())) + 1
    probes = layer_probes(
        train_states, train_labels, folds=folds, seed=seed, classes=classes, state_norm=state_norm
    )
    return probes.accuracies(dev_states, dev_labels)


def probe_folds(
    labels: torch.Tensor, folds: int, seed: int = 0, groups: torch.Tensor | None = None
) -> torch.Tensor:
    """The fold of each row, ``0 .. folds - 1`` (``-1`` where the label is ``-100``).

    Without ``groups``, stratified: each class's rows, in a seeded random order, are dealt round the
    folds, each class going on where the last one stopped (fold sizes differ by one at most). With
    ``groups``, each group's rows stay together, the groups dealt in a seeded random order. The same
    labels, groups and seed give the same folds on every machine.

    Args:
        labels: ``(n,)`` class ids (``-100``: no fold).
        folds: ``k``, from 2 to the labelled rows (or their groups).
        seed: The seed of the order.
        groups: ``(n,)`` integer group ids, or ``None``.

    Example:
        >>> probe_folds(torch.tensor([0, 0, 0, 1, 1, 1, -100]), folds=3).tolist()
        [1, 2, 0, 2, 1, 0, -1]
        >>> probe_folds(torch.tensor([0, 1, 1, 0, 1]), folds=2, groups=torch.tensor([7, 7, 8, 8, 9])).tolist()
        [1, 1, 0, 0, 0]
    """
    labels = check_labels("labels", labels, len(labels), None)
    kept = labels != IGNORE_INDEX
    generator = torch.Generator().manual_seed(seed)
    if groups is None:
        units = labels[kept]  # a row per unit, stratified by its label
        strata = [torch.nonzero(units == c).flatten() for c in torch.unique(units).tolist()]
    else:
        if groups.shape != labels.shape or groups.is_floating_point():
            raise ValueError(f"`groups` has shape {tuple(groups.shape)}: expected {len(labels)} integer ids.")
        names, units = torch.unique(groups[kept], return_inverse=True)  # a group per unit
        strata = [torch.arange(len(names))]
    count = sum(len(members) for members in strata)
    if isinstance(folds, bool) or not isinstance(folds, int) or not 2 <= folds <= count:
        unit = "labelled rows" if groups is None else "groups of labelled rows"
        raise invalid("folds", folds, f"an integer from 2 to the {count} {unit}")
    unit_fold = torch.empty(count, dtype=torch.long)
    dealt = 0
    for members in strata:
        order = members[torch.randperm(len(members), generator=generator)]
        unit_fold[order] = (dealt + torch.arange(len(order))) % folds
        dealt += len(order)
    fold = torch.full_like(labels, -1)
    fold[kept] = unit_fold if groups is None else unit_fold[units]
    return fold


def probe_accuracy(proba: torch.Tensor, labels: torch.Tensor) -> float:
    """The accuracy of class probabilities ``(m, C)`` (their argmax) on ``labels`` ``(m,)``, rows labelled
    ``-100`` not counted.

    Example:
        >>> probe_accuracy(torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), torch.tensor([0, 0, -100]))
        0.5
    """
    kept = labels != IGNORE_INDEX
    if not kept.any():
        raise ValueError("`labels` are all -100: expected at least one labelled row to score.")
    return (proba[kept].argmax(-1) == labels[kept]).double().mean().item()


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
    score is within one standard error of the best. Both scores are maxima over a grid of choices (and
    the layer's over blocks), so a gain smaller than that noise is as likely the winner's luck as a
    better model.

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


# ----------------------------------------------------------------------------------------- checks
def check_penalty(penalty: float) -> float:
    """``penalty`` where it is a finite number ``> 0``, else a one-line error."""
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not 0 < penalty < math.inf:
        raise invalid("penalty", penalty, "a finite number > 0")
    return float(penalty)


def check_penalties(penalties: Sequence[float]) -> list[float]:
    """``penalties`` sorted, where each is a finite number ``> 0`` and there is one at least."""
    if len(penalties) == 0:
        raise invalid("penalties", penalties, "at least one finite number > 0")
    for penalty in penalties:
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not 0 < penalty < math.inf:
            raise invalid("penalties", list(penalties), "finite numbers > 0")
    return sorted({float(penalty) for penalty in penalties})


def check_states(name: str, states: torch.Tensor, *sizes: int | str) -> torch.Tensor:
    """``states`` as float64 where it is ``(rows, *sizes)`` (a string: any size), has a row and holds
    finite numbers, else a one-line error naming ``name``."""
    expected = f"(rows, {', '.join(map(str, sizes))})"
    fits = isinstance(states, torch.Tensor) and states.dim() == 1 + len(sizes)
    if not fits or any(
        isinstance(size, int) and size != got for size, got in zip(sizes, states.shape[1:], strict=True)
    ):
        got = tuple(states.shape) if isinstance(states, torch.Tensor) else type(states).__name__
        suffix = ", as the training states" if name.startswith("dev") else ""
        raise ValueError(f"`{name}` has shape {got}: expected {expected}{suffix}.")
    if len(states) == 0:
        raise ValueError(f"`{name}` has 0 rows: expected at least one.")
    if not states.is_floating_point():
        raise ValueError(f"`{name}` has dtype {states.dtype}: expected floating-point numbers.")
    states = states.detach().to(torch.float64)
    finite = torch.isfinite(states)
    if not finite.all():
        where = torch.nonzero(~finite)[0].tolist()
        raise ValueError(f"`{name}` holds {states[tuple(where)].item()} at {where}: expected finite numbers.")
    return states


def check_labels(name: str, labels: torch.Tensor, rows: int, classes: int | None) -> torch.Tensor:
    """``labels`` where they are ``rows`` integer class ids in ``0 .. classes - 1`` (any where ``classes`` is
    ``None``) or ``-100``, one at least not ``-100``, else a one-line error naming ``name``."""
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex():
        what = labels.dtype if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"`{name}` has dtype {what}: expected integer class ids (-100: ignored).")
    if labels.shape != (rows,):
        raise ValueError(f"`{name}` has shape {tuple(labels.shape)}: expected ({rows},), one per row.")
    labels = labels.long()
    kept = labels[labels != IGNORE_INDEX]
    if len(kept) == 0:
        raise ValueError(f"`{name}` are all -100: expected at least one labelled row.")
    allowed = ">= 0" if classes is None else f"0 .. {classes - 1}"
    bad = kept[(kept < 0) | (kept >= (classes or 2**62))]
    if len(bad):
        raise ValueError(f"`{name}` holds {int(bad[0])}: expected class ids {allowed} (-100: ignored).")
    return labels


def check_rows(
    name: str, features: torch.Tensor, labels: torch.Tensor, classes: int | None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(features (n, d) float64, labels, C)`` of a probe's rows, each checked (:func:`check_states`,
    :func:`check_labels`, :func:`check_classes`)."""
    features = check_states(name, features, "d")
    labels = check_labels("labels", labels, len(features), check_classes(classes))
    return features, labels, classes or int(labels.max()) + 1


def check_classes(classes: int | None) -> int | None:
    """``classes`` where it is ``None`` or an integer ``>= 1``, else a one-line error."""
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int) or classes < 1):
        raise invalid("classes", classes, "None or an integer >= 1")
    return classes


def read_states(states: torch.Tensor, state_norm: str) -> torch.Tensor:
    """``states`` as a probe reads them: at unit RMS per row (``"rms"``) or as they are (``"none"``)."""
    return unit_rms(states) if state_norm == "rms" else states


# ----------------------------------------------------------------------------------------- solver
@dataclass(frozen=True)
class Spectrum:
    """One probe problem's scores at every penalty, in the singular basis of its centred rows.

    The labelled rows, weighted and centred, are ``X_c = U S V^T`` (thin, rank ``r``), the one-hot targets
    centred ``Y_c``. The ridge solution at penalty ``a`` is ``W^T = V diag(s / (s^2 + a m n)) U^T Y_c`` and
    ``b = y_mean - W x_mean``: a row coded as ``(x - x_mean) V`` scores ``coded diag(shrink) U^T Y_c +
    y_mean`` at each penalty in ``O(r C)``.
    """

    singular: torch.Tensor  # (r,): s
    projected: torch.Tensor  # (r, C): U^T Y_c
    target_mean: torch.Tensor  # (C,): the one-hot targets' mean (the class frequencies)
    scale: float  # m n: the penalty's multiplier

    def shrink(self, penalty: float) -> torch.Tensor:
        """``s / (s^2 + a m n)``: ``(r,)``."""
        return self.singular / (self.singular.pow(2) + penalty * self.scale)

    def scores(self, coded: torch.Tensor, penalties: Sequence[float]) -> torch.Tensor:
        """``(P, m, C)``: the probes at each of ``penalties`` on rows already coded ``(m, r)``."""
        shrink = torch.stack([self.shrink(p) for p in penalties])  # (P, r)
        return torch.einsum("mr,pr,rc->pmc", coded, shrink, self.projected) + self.target_mean


@dataclass(frozen=True)
class Weighted:
    """The labelled rows of a problem: which rows, their class-balancing weights and the targets."""

    rows: torch.Tensor  # (n,): indices of the rows whose label is not -100
    weights: torch.Tensor  # (n,): balanced_weights, mean 1
    targets: torch.Tensor  # (n, C): one-hot, float64
    target_mean: torch.Tensor  # (C,): the weighted targets' mean

    @classmethod
    def of(cls, labels: torch.Tensor, classes: int) -> Weighted:
        rows = (labels != IGNORE_INDEX).nonzero().squeeze(1)
        weights = balanced_weights(labels[rows], classes)
        targets = torch.nn.functional.one_hot(labels[rows], classes).to(torch.float64)
        return cls(rows, weights, targets, (weights[:, None] * targets).sum(0) / len(rows))

    @property
    def root(self) -> torch.Tensor:
        """``(n, 1)``: the weights' square roots, what multiplies each centred row."""
        return self.weights.sqrt()[:, None]

    def centred_targets(self) -> torch.Tensor:
        """``Y_c``: ``(n, C)``."""
        return self.root * (self.targets - self.target_mean)

    def mean(self, kept: torch.Tensor) -> torch.Tensor:
        """``(d,)``: the weighted mean of the rows ``kept`` ``(n, d)`` (the features at :attr:`rows`)."""
        return (self.weights[:, None] * kept).sum(0) / len(kept)

    def scale(self, kept: torch.Tensor) -> float:
        """``m n``: the mean square of the rows ``kept`` ``(n, d)`` times their number (1 where that is 0)."""
        return kept.pow(2).mean().item() * len(kept) or 1.0


def eigen(symmetric: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, vectors)`` of a centred Gram matrix ``(k, k)``: singular values ``sqrt`` of its eigenvalues
    above rounding (relative to the largest, ``max(k, width)`` ulps) and their eigenvectors ``(k, r)``."""
    values, vectors = torch.linalg.eigh(symmetric)
    keep = values > values.max().clamp_min(0) * max(len(symmetric), width) * torch.finfo(torch.float64).eps
    return values[keep].sqrt(), vectors[:, keep]


@dataclass(frozen=True)
class Reduced(Spectrum):
    """A problem with more rows than features: the basis ``V`` from the ``(d, d)`` eigenproblem of
    ``X_c^T X_c``; rows are coded from their features."""

    gram: Gram  # the rows it was made from
    basis: torch.Tensor  # (d, r): V
    mean: torch.Tensor  # (d,): the rows' weighted mean

    @classmethod
    def of(cls, gram: Gram, labels: torch.Tensor, classes: int) -> Reduced:
        """The problem of the rows of ``gram`` whose label is not ``-100``."""
        rows = Weighted.of(labels, classes)
        kept = gram.features[rows.rows]  # (n, d)
        mean = rows.mean(kept)
        centred = rows.root * (kept - mean)  # (n, d): X_c
        singular, basis = eigen(centred.T @ centred, len(kept))
        left = centred @ basis / singular  # (n, r): U
        projected = left.T @ rows.centred_targets()
        return cls(singular, projected, rows.target_mean, rows.scale(kept), gram, basis, mean)

    def code_rows(self, index: torch.Tensor) -> torch.Tensor:
        """``(m, r)``: the rows of index ``index`` ``(m,)``, centred and in the basis."""
        return (self.gram.features[index] - self.mean) @ self.basis

    def probe(self, penalty: float) -> Probe:
        """The :class:`Probe` at ``penalty``, in the original features."""
        weight = (self.basis * self.shrink(penalty)) @ self.projected  # (d, C)
        return Probe(weight.T.contiguous(), self.target_mean - self.mean @ weight, penalty)


class Gram:
    """The inner products of all rows, ``K = X X^T`` ``(n, n)`` (``X``: the features less their overall
    mean, float64), computed once: every problem on a subset of the rows (a fold's training rows) is
    centred, decomposed and scores its held-out rows from ``K`` alone, in ``O(n^2)`` memory and no further
    ``(n, d) x (d, n)`` product.

    Centring in ``K``: rows ``T`` with weights ``w`` (``k`` of them) have the weighted mean ``mu``; with
    ``a = K_TT w / k`` (each row's ``x . mu``) and ``c = w^T K_TT w / k^2`` (``mu . mu``), the centred inner
    products are ``K_TT - a 1^T - 1 a^T + c``, and a held-out row's against them ``K_HT - b 1^T - 1 a^T + c``
    with ``b = K_HT w / k``.
    """

    def __init__(self, features: torch.Tensor) -> None:
        self.features = features.to(torch.float64)  # (n, d)

    @cached_property
    def inner(self) -> torch.Tensor:
        """``K``: ``(n, n)``, made at the first problem that needs it."""
        shifted = self.features - self.features.mean(0)
        return shifted @ shifted.T

    def problem(self, labels: torch.Tensor, classes: int) -> DualReduced:
        """The problem of the rows whose label is not ``-100``."""
        rows = Weighted.of(labels, classes)
        block = self.inner[rows.rows][:, rows.rows]  # (k, k): K_TT
        count = len(rows.rows)
        along = block @ rows.weights / count  # (k,): a
        square = (rows.weights @ along / count).item()  # c
        root = rows.root  # (k, 1)
        centred = root * (block - along[:, None] - along[None, :] + square) * root.T  # (k, k): X_c X_c^T
        singular, left = eigen(centred, self.features.shape[1])
        loading = root * left / singular  # (k, r): R U / s, what turns centred inner products into codes
        projected = left.T @ rows.centred_targets()
        scale = rows.scale(self.features[rows.rows])
        return DualReduced(singular, projected, rows.target_mean, scale, self, rows, along, loading)


@dataclass(frozen=True)
class DualReduced(Spectrum):
    """A problem with at most as many rows as features, from a :class:`Gram`: ``U`` from the ``(k, k)``
    eigenproblem of ``X_c X_c^T``; ``V = X_c^T U / s`` is never formed (rows are coded from ``K``)."""

    gram: Gram  # the rows it was made from
    rows: Weighted
    along: torch.Tensor  # (k,): a, each training row's inner product with the weighted mean
    loading: torch.Tensor  # (k, r): R U / s

    def code_rows(self, index: torch.Tensor) -> torch.Tensor:
        """``(m, r)``: the rows of index ``index`` ``(m,)``, centred and in the basis, from ``K``."""
        cross = self.gram.inner[index][:, self.rows.rows]  # (m, k): K_HT
        # the centred K_HT - b 1^T - 1 a^T + c, less the terms constant along each row (b, c): the loading's
        # columns are orthogonal to sqrt(w), the null direction of the weighted, centred rows
        return (cross - self.along[None, :]) @ self.loading

    def probe(self, penalty: float) -> Probe:
        """The :class:`Probe` at ``penalty``: ``W = (X_T - mu)^T R U diag(1 / (s^2 + a m n)) U^T Y_c``."""
        kept = self.gram.features[self.rows.rows]  # (k, d)
        mean = self.rows.mean(kept)  # (d,)
        weight = (kept - mean).T @ ((self.loading * self.shrink(penalty)) @ self.projected)  # (d, C)
        return Probe(weight.T.contiguous(), self.target_mean - mean @ weight, penalty)


def reduce(gram: Gram, labels: torch.Tensor, classes: int) -> Reduced | DualReduced:
    """The problem of the rows of ``gram`` whose label is not ``-100``: from ``K`` where they are no more
    than the features (:class:`DualReduced`), else from the ``(d, d)`` eigenproblem (:class:`Reduced`)."""
    if int((labels != IGNORE_INDEX).sum()) > gram.features.shape[1]:
        return Reduced.of(gram, labels, classes)
    return gram.problem(labels, classes)


# ----------------------------------------------------------------------------------------- cross-validation
def cross_validate(
    features: torch.Tensor, labels: torch.Tensor, classes: int, fold_of: torch.Tensor, grid: list[float]
) -> CrossValidatedProbe:
    """:func:`cross_validated_probe` on checked rows and given folds (``fold_of``: :func:`probe_folds`)."""
    folds = int(fold_of.max()) + 1
    kept = labels != IGNORE_INDEX
    gram = Gram(features)  # the rows' inner products, shared by every fold's problem that reads them
    # each fold's problem, its held-out rows and their coding: computed once, shared by every penalty tried
    splits = []
    for k in range(folds):
        problem = reduce(gram, torch.where(fold_of == k, IGNORE_INDEX, labels), classes)
        held_out = (fold_of == k).nonzero().squeeze(1)
        splits.append((problem, held_out, problem.code_rows(held_out)))

    def out_of_fold(penalties: Sequence[float]) -> torch.Tensor:  # (P, n, C): each row's scores
        out = torch.full((len(penalties), len(labels), classes), math.nan, dtype=torch.float64)
        for problem, held_out, coded in splits:
            out[:, held_out] = problem.scores(coded, penalties)
        return out

    def brier(scores: torch.Tensor) -> float:  # every class weighs the same
        return brier_errors(scores[kept], labels[kept]).mean().item()

    # each penalty's (loss, accuracy, proba, scores)
    scored: dict[float, tuple[float, float, torch.Tensor, torch.Tensor]] = {}

    def score(penalties: Sequence[float]) -> None:
        for penalty, scores in zip(penalties, out_of_fold(penalties), strict=True):
            loss = brier(scores)
            proba = probabilities(scores)
            proba[~kept] = math.nan  # a row labelled -100 is predicted by no fold
            scores[~kept] = math.nan
            scored[penalty] = (loss, probe_accuracy(proba, labels), proba, scores)

    limits = tuple(brier(scores) for scores in out_of_fold([0.0, math.inf]))  # least-norm fits; frequencies

    def best() -> float:
        penalties = sorted(scored)
        return inward(penalties, [scored[p][0] for p in penalties], limits)

    score(grid)
    grown = {"low": 0, "high": 0}
    while len(scored) > 1:
        ends = sorted(scored)
        chosen = best()
        if chosen == ends[0] and grown["low"] < GROW_STEPS:
            grown["low"] += 1
            score([float(f"{ends[0] * ends[0] / ends[1]:.12g}")])
        elif chosen == ends[-1] and grown["high"] < GROW_STEPS:
            grown["high"] += 1
            score([float(f"{ends[-1] * ends[-1] / ends[-2]:.12g}")])
        else:
            break
    penalties = tuple(sorted(scored))
    chosen = best()
    on_edge = len(penalties) > 1 and chosen in (penalties[0], penalties[-1])
    return CrossValidatedProbe(
        probe=reduce(gram, labels, classes).probe(chosen),
        penalty=chosen,
        penalties=penalties,
        losses=tuple(scored[p][0] for p in penalties),
        accuracies=tuple(scored[p][1] for p in penalties),
        out_of_fold=scored[chosen][2],
        out_of_fold_scores=scored[chosen][3],
        on_edge=on_edge,
    )


def inward(penalties: Sequence[float], losses: Sequence[float], limits: tuple[float, float]) -> float:
    """The penalty of the smallest out-of-fold loss (ties: the larger penalty); where that is an end of
    the grid and the loss there has reached its limit, moved inwards across the flat stretch.

    Ridge's loss flattens towards two limits: the least-norm fit as the penalty goes to 0, the class
    frequencies as it grows without bound (``limits``: the loss of each, on the same folds). On a few
    rows the smallest loss often sits at an end of the grid within float noise of that end's limit (or
    still creeping towards it): no penalty beyond would score better, and the end is only where the
    search stopped. The choice is then moved inwards while the next penalty scores within :data:`FLAT`
    of the best loss (never past the middle of the grid): the least extreme penalty that scores as well.
    An end whose loss has not reached its limit is kept, and the grid grows past it.

    Args:
        penalties: Ascending.
        losses: The out-of-fold loss at each.
        limits: The loss as the penalty goes to 0 and to infinity.

    Example:
        >>> losses = [0.5, 0.5004, 0.51, 0.6, 0.7]  # flat at the low end
        >>> inward([1e-2, 1e-1, 1.0, 10.0, 100.0], losses, limits=(0.5, 0.75))
        0.1
        >>> inward([1e-2, 1e-1, 1.0, 10.0, 100.0], losses, limits=(0.45, 0.75))  # still falling below
        0.01
    """
    at = min(range(len(losses)), key=lambda k: (losses[k], -penalties[k]))
    end = {0: limits[0], len(losses) - 1: limits[1]}
    if len(losses) < 2 or at not in end or abs(losses[at] - end[at]) > FLAT * losses[at]:
        return penalties[at]
    tie = losses[at] * (1 + FLAT)  # a Brier score is >= 0
    step = 1 if at == 0 else -1
    middle = (math.log(penalties[0]) + math.log(penalties[-1])) / 2
    while losses[at + step] <= tie and (math.log(penalties[at + step]) - middle) * step <= 0:
        at += step
    return penalties[at]


def balanced_weights(labels: torch.Tensor, classes: int) -> torch.Tensor:
    """Each row's weight ``n / (C' count(y))`` (``C'`` the classes present): every class weighs the same in
    the fit and in the Brier score, whatever its share of the rows (a token task's ``O`` tags); all 1 on a
    stratified sample.

    Example:
        >>> balanced_weights(torch.tensor([0, 0, 0, 1]), 3).tolist()
        [0.6666666666666666, 0.6666666666666666, 0.6666666666666666, 2.0]
    """
    counts = torch.bincount(labels, minlength=classes).to(torch.float64)
    present = int((counts > 0).sum())
    return len(labels) / (present * counts[labels])


def brier_errors(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's squared error ``w_i ||scores_i - onehot(y_i)||^2`` ``(n,)``, weighted by
    :func:`balanced_weights` (every class weighs the same); the Brier score is their mean.

    Example:
        >>> scores = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
        >>> brier_errors(scores, torch.tensor([0, 0, 0, 1])).tolist()
        [0.0, 0.3333333333333333, 1.3333333333333333, 0.0]
    """
    targets = torch.nn.functional.one_hot(labels, scores.shape[-1]).to(scores.dtype)  # (n, C)
    return balanced_weights(labels, scores.shape[-1]) * (scores - targets).pow(2).sum(-1)


def probabilities(scores: torch.Tensor) -> torch.Tensor:
    """Class probabilities of ridge scores ``(..., C)``: the scores (least-squares estimates of the class
    probabilities) clipped at 0 and renormalised; uniform where every score is at most 0.

    Example:
        >>> probabilities(torch.tensor([[0.8, 0.4, -0.2], [-0.1, -0.3, 0.0]], dtype=torch.float64))
        tensor([[0.6667, 0.3333, 0.0000],
                [0.3333, 0.3333, 0.3333]], dtype=torch.float64)
    """
    clipped = scores.clamp_min(0.0)
    total = clipped.sum(-1, keepdim=True)
    uniform = torch.full_like(scores, 1.0 / scores.shape[-1])
    return torch.where(total > 0, clipped / total.clamp_min(torch.finfo(scores.dtype).tiny), uniform)
