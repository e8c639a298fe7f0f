r"""True few-shot selection: every choice made from the training sample alone, by cross-validation.

A few-shot user has a frozen model and ``N`` labelled examples per class, and no dev set. Choices made on
a large dev set overstate few-shot results (Perez, Kiela and Cho 2021, "True Few-Shot Learning with
Language Models"); the honest protocol makes them by cross-validation on the sample itself. With so few
labels a single-layer pick is noisy, and a fusion of every block is the robust choice: this module makes
both, from the sample alone, and says which to deploy.

Inputs are the states a head reads, one row per labelled unit (a sentence, or a token for token tasks),
for every hidden state ``z_0 .. z_L`` as a fusion with ``state_norm="rms_after_norm"`` hands them to the
head (:func:`head_states`): ``x_s = z_s / rms(z_s)`` for ``s < L`` and ``x_L`` as the head reads it.

Per trial, from the sample's rows only (:func:`choose`):

1. ``k`` folds, stratified by label; token rows fold by sentence (``groups``), never split.
2. Every coordinate of every state standardized over the sample's rows (:class:`Standardizer`), so that
   one penalty weighs every coordinate alike; an affine map, so every read-out below is still linear in
   the states themselves.
3. One probe per block ``s = 1 .. L`` (:mod:`.probing`'s ridge probe: class scores
   :math:`f_s(x) = W_s x_s + b_s`, every class weighing the same), its penalty chosen by cross-validation,
   with out-of-fold scores for every row.
4. What each method deploys, every one a linear read-out of the states (:class:`LinearReadout`):

   * ``none``: the last block's probe (the plain last-layer head);
   * ``best_layer``: the probe of the block with the best cross-validated score (the task's metric of the
     out-of-fold predictions; ties to the lower Brier score, then the deeper block);
   * ``probe_ensemble``: the mean of the best ``k`` blocks' scores, ``k`` chosen by cross-validation,

     .. math:: f(x) = \tfrac{1}{k} \sum_{s \in B_k} (W_s x_s + b_s);

   * ``stacked``: :math:`f(x) = \sum_s \alpha_s (W_s x_s + b_s) + c`, ``alpha`` and ``c`` a balanced
     least-squares fit to the labels on the out-of-fold scores (cross-fitted), pulled towards
     :math:`\alpha_s = 1/L`;
   * ``average``: one probe on the mean of the states, :math:`\bar x = \frac1L \sum_s x_s`;
   * ``joint_probe``: one probe on the concatenation of every block's state, each block scaled by a
     constant to unit mean square over the sample (:func:`joint_probe`), its penalty chosen by the same
     cross-validation: a Concat read-out fitted in closed form (the dual form where rows are fewer than
     the ``L d`` features), which can use what no single block holds;
   * ``joint_ensemble``: the mean of the joint probe's and the probe ensemble's scores,
     :math:`f(x) = \tfrac12 f_{\mathrm{joint}}(x) + \tfrac12 f_{\mathrm{ensemble}}(x)`;
   * ``guarded_ensemble``, the recommended recipe (:data:`RECOMMENDED`): the joint ensemble, unless the
     guard deploys the block.

5. The guard (:func:`guard`): the joint ensemble against the block, on per-row out-of-fold predictions,
   each fold's block ranking and ``k`` chosen on the *other* folds (no winner's curse), compared by a
   paired bootstrap over units (sentences). The block is deployed only where it scores above the fusion
   in at least ``1 - alpha`` of the resamples.

Each read-out deploys as one adapter (the recipes save it with ``save_pretrained``): one block as
``AverageConfig(layers=[b], state_norm="rms_after_norm")``, several as a Concat map over them.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> states = torch.randn(48, 4, 16)  # (rows, z_0..z_3, d)
    >>> labels = (states[:, 2, :4].sum(-1) > 0).long()  # the label lives in z_2
    >>> trial = choose(states, labels, folds=4, seed=0)
    >>> trial.best_block, list(trial.readouts) == list(METHODS), trial.guard.deploy
    (2, True, 'joint_ensemble')
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
import torch.nn.functional as F
from peft import PeftModel, get_peft_model
from torch import nn

from .config import LayerFusionConfig, invalid
from .fusion import unit_rms
from .layer import active_fusion_module
from .methods.average import AverageConfig
from .methods.concat import ConcatConfig
from .probing import (
    FOLDS,
    PENALTIES,
    CrossValidatedProbe,
    balanced_weights,
    brier_errors,
    check_penalties,
    cross_validate,
    probe_folds,
)

# what :func:`choose` deploys: the plain head, the chosen block, the fusions, and the guarded joint ensemble
METHODS: tuple[str, ...] = (
    "none",
    "best_layer",
    "probe_ensemble",
    "stacked",
    "average",
    "joint_probe",
    "joint_ensemble",
    "guarded_ensemble",
)
RECOMMENDED = "guarded_ensemble"  # the recipe this protocol recommends
# bumped whenever :func:`choose` would choose differently on the same rows: a saved trial keyed by an
# older version is run again, never served
SELECTION_VERSION = 4


def head_states(hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
    """``output_hidden_states`` as a head reads them after an ``rms_after_norm`` fusion: ``z_s / rms(z_s)``
    for ``s < L``, the last as the model returns it (after a pre-norm stack's final norm).

    Args:
        hidden_states: ``L + 1`` tensors ``(..., d)``: the embeddings' output, then each block's.

    Returns:
        ``(..., L + 1, d)``, float64.

    Example:
        >>> states = head_states([torch.full((2, 3), 2.0), torch.full((2, 3), 5.0)])
        >>> states.shape, states[0, 0].round(decimals=4).tolist(), states[0, 1].tolist()
        (torch.Size([2, 2, 3]), [1.0, 1.0, 1.0], [5.0, 5.0, 5.0])
    """
    *inner, last = hidden_states
    return torch.stack([*(unit_rms(z.double()) for z in inner), last.double()], dim=-2)


@dataclass(frozen=True)
class LinearReadout:
    r"""What a method deploys: :math:`\mathrm{logits} = \sum_{s \in B} W_s x_s + b` over its blocks ``B``.

    Args:
        blocks: The hidden states read, indices into ``z_0 .. z_L``.
        weight: ``(C, |B|, d)``.
        bias: ``(C,)``.
        method: The method of :data:`METHODS` it is (set by :func:`choose`); :func:`deploy` saves a
            ``probe_ensemble`` or ``stacked`` read-out as the Concat preset of that name.
    """

    blocks: tuple[int, ...]
    weight: torch.Tensor
    bias: torch.Tensor
    method: str | None = None

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """``(n, C)`` logits of rows ``(n, L + 1, d)``."""
        picked = states[:, list(self.blocks)].to(self.weight.dtype)  # (n, |B|, d)
        return torch.einsum("nbd,cbd->nc", picked, self.weight) + self.bias

    def predict(self, states: torch.Tensor) -> torch.Tensor:
        return self.logits(states).argmax(-1)


@dataclass(frozen=True)
class Standardizer:
    r"""Every coordinate of every state at unit variance over the sample's rows,
    :math:`x'_{s,j} = (x_{s,j} - m_{s,j}) / \sigma_{s,j}`, before any probe is fitted.

    One ridge penalty then weighs every coordinate alike: without it, the few coordinates a pre-norm
    stream carries at a far larger scale than the rest (the "massive activations" of decoder LLMs) fill
    the probes' Gram matrices, and with few rows the probes read little else. The map is affine, so a
    read-out of the standardized states is one of the states themselves (:meth:`raw`): what deploys is
    unchanged. It reads the sample's states only, never its labels.

    Args:
        center: ``(L + 1, d)`` the rows' mean of each coordinate, :math:`m`.
        scale: ``(L + 1, d)`` their standard deviation, :math:`\sigma`, floored at ``1e-6`` of the state's
            median one (a coordinate constant over the sample gets no weight anyway).

    Example:
        >>> states = torch.tensor([[[1.0, 10.0]], [[3.0, 30.0]]], dtype=torch.float64)  # (rows, 1, d)
        >>> standard = Standardizer.of(states)
        >>> standard(states)[:, 0].tolist()
        [[-1.0, -1.0], [1.0, 1.0]]
        >>> raw = standard.raw(LinearReadout((0,), torch.ones(1, 1, 2), torch.zeros(1)))
        >>> torch.allclose(raw.logits(states), standard(states)[:, 0].sum(-1, keepdim=True))
        True
    """

    center: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def of(cls, states: torch.Tensor) -> Standardizer:
        """The standardizer of the rows ``(n, L + 1, d)``."""
        deviation = states.std(0, correction=0)  # (L + 1, d)
        floor = 1e-6 * deviation.median(-1, keepdim=True).values  # (L + 1, 1)
        return cls(states.mean(0), torch.maximum(deviation, floor).clamp_min(torch.finfo(states.dtype).tiny))

    def __call__(self, states: torch.Tensor) -> torch.Tensor:
        """``(n, L + 1, d)`` standardized."""
        return (states - self.center) / self.scale

    def raw(self, readout: LinearReadout) -> LinearReadout:
        r"""``readout`` of standardized states as the same read-out of the states themselves:
        :math:`W_s / \sigma_s` and :math:`b - \sum_s (W_s / \sigma_s) m_s`."""
        blocks = list(readout.blocks)
        weight = readout.weight / self.scale[blocks]  # (C, |B|, d)
        bias = readout.bias - torch.einsum("cbd,bd->c", weight, self.center[blocks])
        return replace(readout, weight=weight, bias=bias)

    def raw_probe(self, probe: BlockProbe) -> BlockProbe:
        """A block's probe of the standardized states as one of the states themselves."""
        raw = self.raw(LinearReadout((probe.block,), probe.weight[:, None], probe.bias))
        return replace(probe, weight=raw.weight[:, 0], bias=raw.bias)


def _check_rows(states: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor | None) -> None:
    if states.dim() != 3 or len(states) == 0:
        raise invalid("states", tuple(states.shape), "a non-empty (rows, hidden states, d) tensor")
    if labels.shape != (len(states),) or labels.dtype.is_floating_point:
        raise invalid(
            "labels", f"{labels.dtype} {tuple(labels.shape)}", f"integer class ids of shape ({len(states)},)"
        )
    if labels.min() < 0:
        raise invalid("labels", int(labels.min()), "class ids >= 0 (drop rows labelled -100 first)")
    if not torch.isfinite(states).all():
        raise invalid("states", "NaN or infinite values", "finite hidden states")
    if groups is not None and groups.shape != labels.shape:
        raise invalid("groups", tuple(groups.shape), f"one group id per row, ({len(labels)},)")


class Scorer(Protocol):
    """A task's metric, per unit (a sentence; a row of a sentence task), so that any set of units, a
    fold or a bootstrap resample, scores from the sum of its units' statistics."""

    def stats(self, predicted: torch.Tensor) -> torch.Tensor:
        """``(units, m)`` statistics of the row predictions ``(n,)``, units in group-id order."""
        ...

    def score(self, totals: torch.Tensor) -> torch.Tensor:
        """The score of summed statistics ``(..., m)``, ``(...)``: higher is better."""
        ...


@dataclass(frozen=True)
class Accuracy:
    """Accuracy over rows, each unit's statistics ``(correct, rows)``.

    Args:
        labels: ``(n,)`` class ids.
        unit_of_row: ``(n,)`` the unit of each row, ``0 .. units - 1`` (:func:`units_of`).

    Example:
        >>> scorer = Accuracy(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 1]))
        >>> stats = scorer.stats(torch.tensor([0, 1, 0]))
        >>> stats.tolist(), scorer.score(stats.sum(0)).item()
        ([[1.0, 1.0], [1.0, 2.0]], 0.6666666666666666)
    """

    labels: torch.Tensor
    unit_of_row: torch.Tensor

    def stats(self, predicted: torch.Tensor) -> torch.Tensor:
        per_row = torch.stack(
            [(predicted == self.labels).double(), torch.ones(len(predicted), dtype=torch.float64)], 1
        )
        units = int(self.unit_of_row.max()) + 1
        return torch.zeros(units, 2, dtype=torch.float64).index_add_(0, self.unit_of_row, per_row)

    def score(self, totals: torch.Tensor) -> torch.Tensor:
        return totals[..., 0] / totals[..., 1].clamp_min(1.0)


def units_of(groups: torch.Tensor) -> torch.Tensor:
    """The unit of each row, ``0 .. units - 1`` in group-id order.

    Example:
        >>> units_of(torch.tensor([7, 7, 3, 9])).tolist()
        [1, 1, 0, 2]
    """
    return torch.unique(groups, return_inverse=True)[1]


@dataclass
class BlockProbe:
    """One block's probe: its penalty chosen by cross-validation, its out-of-fold log-probabilities, and
    the probe refitted on every row.

    Args:
        block: The hidden state read (``-1``: the mean of the blocks, :func:`choose`'s average).
        penalty: The chosen L2 penalty.
        cv_score: The out-of-fold score at that penalty.
        cv_brier: The out-of-fold Brier score there (every class weighing the same; lower is better).
        oof: ``(n, C)`` out-of-fold scores ``W x + b``.
        weight: ``(C, d)`` refitted on every row.
        bias: ``(C,)``.
    """

    block: int
    penalty: float
    cv_score: float
    cv_brier: float
    oof: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor

    def key(self) -> tuple[float, float, int]:
        """How blocks rank: by score, ties to the lower Brier score, then to the deeper."""
        return (self.cv_score, -self.cv_brier, self.block)


@contextmanager
def single_thread() -> Iterator[None]:
    """torch on one thread for the duration (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Folds:
    """A trial's cross-validation: the fold of every row and of every unit, and the scorer.

    Args:
        of_row: ``(n,)`` fold of each row.
        of_unit: ``(units,)`` fold of each unit.
        unit_of_row: ``(n,)`` unit of each row.
        labels: ``(n,)`` class ids.
        scorer: The task's per-unit metric.
    """

    of_row: torch.Tensor
    of_unit: torch.Tensor
    unit_of_row: torch.Tensor
    labels: torch.Tensor
    scorer: Scorer

    @property
    def count(self) -> int:
        return int(self.of_row.max()) + 1

    def score(self, predicted: torch.Tensor, units: torch.Tensor | None = None) -> float:
        """The score of row predictions over ``units`` (a boolean mask over units; default: all)."""
        stats = self.scorer.stats(predicted)
        return float(self.scorer.score((stats if units is None else stats[units]).sum(0)))

    def brier(self, scores: torch.Tensor, rows: torch.Tensor | None = None) -> float:
        """The Brier score of ``scores`` ``(n, C)`` over ``rows`` (a boolean mask; default: all), every class
        weighing the same (:func:`~peft_layerfusion.probing.brier_errors`)."""
        errors = brier_errors(scores, self.labels)  # (n,)
        return float(errors.mean() if rows is None else errors[rows].mean())


def block_probe(fit: CrossValidatedProbe, folds: Folds, block: int) -> BlockProbe:
    """A :class:`BlockProbe` of a cross-validated probe: its out-of-fold score under the task's scorer."""
    oof = fit.out_of_fold_scores  # (n, C)
    return BlockProbe(
        block, fit.penalty, folds.score(oof.argmax(-1)), fit.loss, oof, fit.probe.weight, fit.probe.bias
    )


def _top_k(ranked: Sequence[BlockProbe], folds: Folds, units: torch.Tensor | None = None) -> int:
    """How many of the ranked blocks the ensemble averages: the best out-of-fold score over ``units``,
    ties to the lower Brier score, then to more blocks."""
    rows = None if units is None else units[folds.unit_of_row]
    best, best_key = 1, None
    for k in range(1, len(ranked) + 1):
        mean = torch.stack([p.oof for p in ranked[:k]], 1).mean(1)  # (n, C): the ensemble's scores
        key = (folds.score(mean.argmax(-1), units), -folds.brier(mean, rows), k)
        if best_key is None or key > best_key:
            best, best_key = k, key
    return best


@dataclass(frozen=True)
class GuardResult:
    """The guard's verdict: the ensemble against the chosen block, out of fold, paired per unit.

    Args:
        deploy: ``"probe_ensemble"`` or ``"best_layer"``.
        ensemble_score: The ensemble's out-of-fold score, each fold's choices made on the other folds.
        block_score: The block's, likewise.
        block_wins: The paired bootstrap's probability that the block scores above the ensemble.
        blocks: The block each fold chose.
    """

    deploy: str
    ensemble_score: float
    block_score: float
    block_wins: float
    blocks: tuple[int, ...]


@dataclass
class Trial:
    """Every choice of one trial, made on its sample alone (:func:`choose`).

    Args:
        probes: One :class:`BlockProbe` per block ``1 .. L``.
        best_block: The block with the best cross-validated score.
        top_k: How many of the best blocks the ensemble averages (chosen by cross-validation).
        stack_weights: ``alpha_s`` of the stacked combiner, one per block.
        guard: The guard's verdict (:class:`GuardResult`).
        readouts: What each method of :data:`METHODS` deploys.
        cv_scores: The out-of-fold score of ``none``, ``best_layer``, ``average``, ``joint_probe`` and
            ``joint_ensemble`` (the last with the ensemble's blocks chosen on every fold: optimistic).
        joint: The joint probe (:func:`joint_probe`).
    """

    probes: list[BlockProbe]
    best_block: int
    top_k: int
    stack_weights: list[float]
    guard: GuardResult
    readouts: dict[str, LinearReadout]
    cv_scores: dict[str, float] = field(default_factory=dict)
    joint: BlockProbe | None = None

    def choices(self) -> dict[str, object]:
        """What the trial chose, as a record's fields (JSON types)."""
        return {
            "best_block": self.best_block,
            "top_k": self.top_k,
            "ensemble_blocks": list(self.readouts["probe_ensemble"].blocks),
            "penalties": {str(p.block): p.penalty for p in self.probes},
            "block_cv": {str(p.block): round(p.cv_score, 6) for p in self.probes},
            "stack_weights": [round(a, 6) for a in self.stack_weights],
            "joint_penalty": None if self.joint is None else self.joint.penalty,
            "guard": self.guard.deploy,
            "guard_block_wins": self.guard.block_wins,
            "guard_blocks": list(self.guard.blocks),
        }


def _readout(
    probes: Sequence[BlockProbe], weights: Sequence[float], offset: torch.Tensor | None = None
) -> LinearReadout:
    """``sum_s a_s (W_s x_s + b_s) + offset`` as one read-out."""
    weight = torch.stack([a * p.weight for a, p in zip(weights, probes, strict=True)], dim=1)  # (C, |B|, d)
    bias = torch.stack([a * p.bias for a, p in zip(weights, probes, strict=True)]).sum(0)
    return LinearReadout(tuple(p.block for p in probes), weight, bias if offset is None else bias + offset)


def _combine(readouts: Sequence[LinearReadout], weights: Sequence[float]) -> LinearReadout:
    """``sum_i a_i f_i(x)`` of read-outs as one read-out over the union of their blocks."""
    blocks = sorted({b for readout in readouts for b in readout.blocks})
    classes, _, width = readouts[0].weight.shape
    weight = torch.zeros(classes, len(blocks), width, dtype=torch.float64)  # (C, |B|, d)
    bias = torch.zeros(classes, dtype=torch.float64)
    for readout, a in zip(readouts, weights, strict=True):
        where = [blocks.index(b) for b in readout.blocks]
        weight[:, where] += a * readout.weight.double()
        bias += a * readout.bias.double()
    return LinearReadout(tuple(blocks), weight, bias)


def joint_probe(
    states: torch.Tensor, labels: torch.Tensor, classes: int, folds: Folds, grid: Sequence[float]
) -> tuple[BlockProbe, LinearReadout]:
    r"""One ridge probe on every block at once: :math:`f(x) = \sum_s W_s x_s / c_s + b`, fitted on the
    concatenated rows :math:`[x_1 / c_1, \dots, x_L / c_L]`, its penalty chosen by cross-validation on
    ``folds``.

    ``c_s`` is block ``s``'s root mean square over the sample's rows, a constant (so the read-out stays
    linear in the states): every block enters at the same scale, the last one (read after a final norm)
    included, and one penalty serves them all. The solver works in the dual (the rows' Gram matrix)
    where rows are fewer than the ``L d`` features.

    Args:
        states: ``(n, L + 1, d)`` float64 rows (:func:`head_states`).
        labels: ``(n,)``.
        classes: ``C``.
        folds: The trial's :class:`Folds`.
        grid: The penalties to try (grown at an edge).

    Returns:
        The probe (``block`` ``-2``: every block) with its out-of-fold scores, and its read-out over
        blocks ``1 .. L``.
    """
    blocks = list(range(1, states.shape[1]))
    parts = states[:, blocks]  # (n, L, d)
    scale = parts.pow(2).mean((0, 2)).sqrt().clamp_min(torch.finfo(torch.float64).tiny)  # (L,): c_s
    features = (parts / scale[None, :, None]).flatten(1)  # (n, L d)
    probe = block_probe(cross_validate(features, labels, classes, folds.of_row, list(grid)), folds, -2)
    weight = probe.weight.view(classes, len(blocks), -1) / scale[None, :, None]  # (C, L, d)
    return probe, LinearReadout(tuple(blocks), weight, probe.bias)


def _stack(oofs: torch.Tensor, labels: torch.Tensor, penalty: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``alpha`` ``(B,)`` and ``c`` ``(C,)`` of ``sum_s alpha_s oof_s + c`` closest to the one-hot labels in
    the balanced squared error, plus ``penalty |alpha - 1/B|^2``: the plain mean where the out-of-fold
    evidence is flat. A linear least-squares problem in ``B + C`` unknowns.

    Args:
        oofs: ``(n, B, C)`` the blocks' out-of-fold scores.
        labels: ``(n,)``.
        penalty: Pulls ``alpha`` towards ``1/B``.
    """
    count, blocks, classes = oofs.shape
    weights = balanced_weights(labels, classes).sqrt()[:, None, None]  # (n, 1, 1)
    design = torch.cat([oofs.transpose(1, 2), torch.eye(classes, dtype=oofs.dtype).expand(count, -1, -1)], 2)
    design = (weights * design).reshape(count * classes, blocks + classes)  # rows (i, c): [S_sic, onehot(c)]
    target = (weights[..., 0] * F.one_hot(labels, classes).to(oofs.dtype)).reshape(-1)
    prior = torch.cat([torch.full((blocks,), 1.0 / blocks), torch.zeros(classes)]).to(oofs.dtype)
    pull = torch.cat([torch.full((blocks,), penalty * count), torch.zeros(classes)]).to(oofs.dtype)
    system = design.T @ design + torch.diag(pull)
    solution = torch.linalg.solve(system, design.T @ target + pull * prior)
    return solution[:blocks], solution[blocks:]


def _bootstrap_counts(units: int, resamples: int, seed: int) -> torch.Tensor:
    """``(resamples, units)``: how often each unit is drawn in each resample (with replacement)."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(units, (resamples, units), generator=generator)
    return torch.zeros(resamples, units, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones_like(draws, dtype=torch.float64)
    )


def guard(
    probes: Sequence[BlockProbe],
    folds: Folds,
    alpha: float = 0.05,
    resamples: int = 2000,
    seed: int = 0,
    joint: torch.Tensor | None = None,
) -> GuardResult:
    """The fusion against the best block, paired per unit, out of fold, no winner's curse.

    The fusion is the probe ensemble, or with ``joint`` the joint ensemble (the mean of the ensemble's and
    the joint probe's scores). For each fold, the block ranking and the ensemble's ``top_k`` are chosen on
    the *other* folds' units (from the probes' out-of-fold scores), and both choices predict the fold's
    rows. A paired bootstrap resamples units (sentences) ``resamples`` times; the block is deployed only
    where it scores above the fusion in at least ``1 - alpha`` of them: with few labels the fusion is the
    robust default, and the block must show that it is better.

    Args:
        probes: The block probes of :func:`choose` (their out-of-fold scores).
        folds: The trial's :class:`Folds`.
        alpha: The level: the block needs a bootstrap win rate of ``1 - alpha``.
        resamples: Bootstrap resamples.
        seed: Seeds the bootstrap.
        joint: ``(n, C)`` the joint probe's out-of-fold scores (its penalty chosen on every fold), or
            ``None`` to guard the probe ensemble alone.
    """
    if not 0.0 < alpha < 1.0:
        raise invalid("alpha", alpha, "a level in (0, 1)")
    ensemble = torch.empty_like(folds.labels)
    block = torch.empty_like(folds.labels)
    chosen = []
    for fold in range(folds.count):
        others = folds.of_unit != fold  # (units,)
        ranked = sorted(probes, key=lambda p: (folds.score(p.oof.argmax(-1), others), p.block), reverse=True)
        k = _top_k(ranked, folds, others)
        held = folds.of_row == fold
        fused = torch.stack([p.oof[held] for p in ranked[:k]], 1).mean(1)  # (rows held, C)
        ensemble[held] = (fused if joint is None else 0.5 * fused + 0.5 * joint[held]).argmax(-1)
        block[held] = ranked[0].oof[held].argmax(-1)
        chosen.append(ranked[0].block)
    counts = _bootstrap_counts(len(folds.of_unit), resamples, seed)  # (B, units)
    block_stats, ensemble_stats = folds.scorer.stats(block), folds.scorer.stats(ensemble)  # (units, m)
    wins = folds.scorer.score(counts @ block_stats) > folds.scorer.score(counts @ ensemble_stats)  # (B,)
    block_wins = float(wins.double().mean())
    fusion = "probe_ensemble" if joint is None else "joint_ensemble"
    return GuardResult(
        "best_layer" if block_wins >= 1.0 - alpha else fusion,
        folds.score(ensemble),
        folds.score(block),
        block_wins,
        tuple(chosen),
    )


def make_cv(
    labels: torch.Tensor,
    folds: int,
    seed: int,
    groups: torch.Tensor | None = None,
    scorer: Scorer | None = None,
) -> Folds:
    """A trial's :class:`Folds`: :func:`~peft_layerfusion.probing.probe_folds` (stratified by label, or by
    whole groups where a group holds several rows), the units of ``groups`` (one per row without), and
    the scorer (default: :class:`Accuracy`).

    Example:
        >>> labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        >>> make_cv(labels, 2, seed=0, groups=torch.arange(8)).of_row[labels == 1].bincount().tolist()
        [2, 2]
    """
    single = groups is None or len(torch.unique(groups)) == len(groups)  # a row per unit: stratify by label
    of_row = probe_folds(labels, folds, seed, None if single else groups)
    unit_of_row = units_of(torch.arange(len(labels)) if groups is None else groups)
    of_unit = torch.zeros(int(unit_of_row.max()) + 1, dtype=torch.long).scatter_(0, unit_of_row, of_row)
    return Folds(of_row, of_unit, unit_of_row, labels, scorer or Accuracy(labels, unit_of_row))


def choose(
    states: torch.Tensor,
    labels: torch.Tensor,
    folds: int = FOLDS,
    seed: int = 0,
    groups: torch.Tensor | None = None,
    scorer: Scorer | None = None,
    penalties: Sequence[float] = PENALTIES,
    stack_penalty: float = 1.0,
    alpha: float = 0.05,
    classes: int | None = None,
) -> Trial:
    """Every method's read-out for one trial, chosen by ``folds``-fold cross-validation on its sample.

    Args:
        states: ``(n, L + 1, d)`` rows of the sample (:func:`head_states`).
        labels: ``(n,)`` class ids (token tasks: drop the rows labelled ``-100`` first).
        folds: ``k`` of the cross-validation.
        seed: Seeds the folds and the guard's bootstrap.
        groups: ``(n,)`` group of each row (token tasks: its sentence): folds never split a group, and
            the guard resamples groups.
        scorer: The task's per-unit metric over those groups (:class:`Scorer`); default: accuracy.
        penalties: The probes' L2 grid (grown where the best is at an edge).
        stack_penalty: Pulls the stacked weights towards the plain mean.
        alpha: The guard's level (:func:`guard`).
        classes: ``C``, the head's classes (a sample may lack some); default: the largest label + 1.

    Returns:
        A :class:`Trial`.
    """
    _check_rows(states, labels, groups)
    cv = make_cv(labels, folds, seed, groups, scorer)
    classes = classes or int(labels.max()) + 1
    last = states.shape[1] - 1
    grid = check_penalties(penalties)
    standard = Standardizer.of(states.detach().double())
    z = standard(states.detach().double())  # (n, L + 1, d): every coordinate at unit variance

    def probe(features: torch.Tensor, block: int) -> BlockProbe:
        return block_probe(cross_validate(features, labels, classes, cv.of_row, grid), cv, block)

    with single_thread():  # small products: a second thread costs more than it brings
        probes = [standard.raw_probe(probe(z[:, s], s)) for s in range(1, last + 1)]
        average = probe(z[:, 1:].mean(1), -1)
        joint, joint_readout = joint_probe(z, labels, classes, cv, grid)
    ranked = sorted(probes, key=BlockProbe.key, reverse=True)
    top_k = _top_k(ranked, cv)
    alpha_s, offset = _stack(torch.stack([p.oof for p in probes], dim=1), labels, stack_penalty)
    verdict = guard(probes, cv, alpha=alpha, seed=seed, joint=joint.oof)
    readouts = {
        "none": _readout([probes[-1]], [1.0]),
        "best_layer": _readout([ranked[0]], [1.0]),
        "probe_ensemble": _readout(ranked[:top_k], [1.0 / top_k] * top_k),
        "stacked": _readout(probes, alpha_s.tolist(), offset),
        "average": standard.raw(  # one probe on the mean of the L states: W / L on each
            LinearReadout(
                tuple(range(1, last + 1)),
                (average.weight / last)[:, None].expand(-1, last, -1).clone(),
                average.bias,
            )
        ),
        "joint_probe": standard.raw(joint_readout),
    }
    readouts = {name: replace(readout, method=name) for name, readout in readouts.items()}
    joint_ensemble = _combine([readouts["joint_probe"], readouts["probe_ensemble"]], [0.5, 0.5])
    readouts["joint_ensemble"] = replace(joint_ensemble, method="joint_ensemble")
    readouts["guarded_ensemble"] = readouts[verdict.deploy]
    ensemble_oof = torch.stack([p.oof for p in ranked[:top_k]], 1).mean(1)  # (n, C)
    scores = {
        "none": probes[-1].cv_score,
        "best_layer": ranked[0].cv_score,
        "average": average.cv_score,
        "joint_probe": joint.cv_score,
        "joint_ensemble": cv.score((0.5 * joint.oof + 0.5 * ensemble_oof).argmax(-1)),
    }
    return Trial(probes, ranked[0].block, top_k, alpha_s.tolist(), verdict, readouts, scores, joint)


def readout_config(
    readout: LinearReadout, head: str, head_bias: bool = True, **options: object
) -> LayerFusionConfig:
    """The adapter config that deploys ``readout`` on a model whose linear head is named ``head``.

    One block ``b``: ``AverageConfig(layers=[b], state_norm="rms_after_norm")``, the head reading
    ``x_b`` (its weights are the probe's). Several, or a head without a bias: a Concat map of rank ``C``
    over them, ``A_s = W_s`` and ``B`` summing the ``C`` codes (plus the bias) into the first ``C``
    channels, the head reading those: the Concat preset named by ``readout.method`` (``probe_ensemble``,
    ``stacked``: the saved config says how it was fitted), else a plain Concat with the same options.

    Args:
        readout: What to deploy.
        head: The name of the model's linear head (``classifier``, ``score``...), saved with the adapter.
        head_bias: Whether that head has a bias.
        **options: Further config fields (``task_type``...).

    Example:
        >>> one = LinearReadout((2,), torch.zeros(3, 1, 8), torch.zeros(3))
        >>> type(readout_config(one, "classifier")).__name__, readout_config(one, "classifier").layers
        ('AverageConfig', [2])
        >>> two = LinearReadout((1, 3), torch.zeros(3, 2, 8), torch.zeros(3), method="stacked")
        >>> readout_config(two, "classifier").readout_fit, readout_config(two, "classifier").map_rank
        ('stacked', 3)
    """
    common = {"layers": list(readout.blocks), "state_norm": "rms_after_norm", "modules_to_save": [head]}
    if len(readout.blocks) == 1 and head_bias:
        return AverageConfig(**common, **options)
    fields = {**common, "map_rank": readout.weight.shape[0], "fusion_init": "paper", **options}
    if readout.method in ConcatConfig.PRESETS:  # the preset sets readout_fit: how the weights were fitted
        return ConcatConfig.from_preset(readout.method, **fields)
    return ConcatConfig(**fields)


def _trained_copy(model: nn.Module, head: str) -> nn.Linear:
    module = model.base_model.model.get_submodule(head)
    module = module.modules_to_save[model.active_adapter] if hasattr(module, "modules_to_save") else module
    if not isinstance(module, nn.Linear):
        raise invalid("head", head, "the name of the model's linear head (an nn.Linear)")
    return module


@torch.no_grad()
def deploy(base_model: nn.Module, readout: LinearReadout, head: str, **options: object) -> PeftModel:
    """``base_model`` with ``readout`` as one saved-and-loaded-like-any adapter (:func:`readout_config`):
    its logits are ``readout.logits`` of the head's states, in the model's dtype.

    Args:
        base_model: The model, its head ``head`` a ``nn.Linear(d, C)``.
        readout: What to deploy (:func:`choose`'s ``readouts``).
        head: The head's module name.
        **options: Further config fields.
    """
    classes, count, width = readout.weight.shape
    config = readout_config(
        readout, head, getattr(base_model.get_submodule(head), "bias", None) is not None, **options
    )
    model = get_peft_model(base_model, config)
    linear = _trained_copy(model, head)
    if linear.out_features != classes or linear.in_features != width:
        raise invalid(
            "head", f"{head} {linear.in_features}->{linear.out_features}", f"nn.Linear({width}, {classes})"
        )
    dtype = linear.weight.dtype
    if isinstance(config, AverageConfig):  # the head reads x_b: it is the probe
        linear.weight.copy_(readout.weight[:, 0].to(dtype))
        linear.bias.copy_(readout.bias.to(dtype))
        return model
    fusion = active_fusion_module(model)  # Concat of rank C: h[:C] = sum_s W_s x_s + b; the head reads h[:C]
    fusion.down_weight.copy_(readout.weight.permute(1, 2, 0).to(dtype))  # (K, d, C): A_s, stored transposed
    fusion.up.weight.zero_()
    fusion.up.bias.zero_()
    for s in range(count):
        fusion.up.weight[:classes, s * classes : (s + 1) * classes] = torch.eye(classes, dtype=dtype)
    fusion.up.bias[:classes] = readout.bias.to(dtype)
    linear.weight.zero_()
    linear.weight[:, :classes] = torch.eye(classes, dtype=dtype)
    if linear.bias is not None:
        linear.bias.zero_()
    return model
