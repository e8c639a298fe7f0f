"""The library's probe trainer (probing.py): an L2-regularised ridge probe found exactly (against the
normal equations solved here and the objective's gradient), the same on every run and up to rounding on
permuted rows, rows labelled
-100 ignored in fitting and scoring, its penalty chosen by cross-validation off the grid's edge, the state
that carries the label found by cross-validation alone; bad input refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from peft_layerfusion import (
    best_layer,
    cross_validated_probe,
    dev_standard_error,
    fit_probe,
    keep_fusion,
    layer_probe_scores,
    layer_probes,
)
from peft_layerfusion.probing import (
    FLAT,
    GROW_STEPS,
    PENALTIES,
    Gram,
    Reduced,
    probe_accuracy,
    probe_folds,
)


def toy(label_state: int, scales=(1.0, 30.0, 900.0, 27000.0), rows: int = 60, seed: int = 0):
    """``(states (rows, 4, 16), labels)``: the label is the sign of one coordinate of ``label_state``;
    the states' scales grow with depth as a pre-norm stream's do."""
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(rows, 4, 16, generator=generator) * torch.tensor(scales).view(1, 4, 1)
    labels = (states[:, label_state, 3] > 0).long()
    return states, labels


def planted(rows: int = 48, width: int = 10, classes: int = 3, signal: float = 1.5, seed: int = 0):
    """``(features (rows, width) float64, labels)``: class ``c`` shifts coordinate ``c`` by ``signal``, with
    unit Gaussian noise: a problem whose best penalty lies inside the grid."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(rows) % classes
    features = torch.randn(rows, width, generator=generator, dtype=torch.float64)
    features[torch.arange(rows), labels] += signal
    return features, labels


def objective(features: torch.Tensor, labels: torch.Tensor, penalty: float, weight, bias) -> torch.Tensor:
    """The probe's objective, written out here: mean squared error of one-hot labels + penalty m ||W||^2."""
    mean_square = features.pow(2).mean()
    targets = torch.nn.functional.one_hot(labels, weight.shape[0]).to(features.dtype)
    residual = targets - features @ weight.T - bias
    return residual.pow(2).sum(-1).mean() + penalty * mean_square * weight.pow(2).sum()


def normal_equations(features: torch.Tensor, labels: torch.Tensor, penalty: float, classes: int):
    """``(W, b)`` solved here from the normal equations of :func:`objective`."""
    mean, targets = features.mean(0), torch.nn.functional.one_hot(labels, classes).to(features.dtype)
    centred = features - mean
    system = centred.T @ centred + penalty * features.pow(2).mean() * len(features) * torch.eye(
        features.shape[1]
    )
    weight = torch.linalg.solve(system.to(features.dtype), centred.T @ (targets - targets.mean(0))).T
    return weight, targets.mean(0) - weight @ mean


# ------------------------------------------------------------------------------------------ the optimum
def test_the_probe_is_the_optimum_of_the_normal_equations_and_its_gradient_vanishes():
    features, labels = planted(rows=15, width=4, classes=3, seed=2)
    penalty = 0.05
    probe = fit_probe(features, labels, penalty)
    weight, bias = normal_equations(features, labels, penalty, 3)
    torch.testing.assert_close(probe.weight, weight, rtol=0, atol=1e-8)
    torch.testing.assert_close(probe.bias, bias, rtol=0, atol=1e-8)
    weight, bias = probe.weight.clone().requires_grad_(True), probe.bias.clone().requires_grad_(True)
    objective(features, labels, penalty, weight, bias).backward()
    assert max(weight.grad.abs().max(), bias.grad.abs().max()) < 1e-10


def test_every_class_weighs_the_same_the_weighted_normal_equations():
    features, labels = planted(rows=40, width=5, classes=3, seed=8)
    labels = torch.where(torch.arange(40) < 28, 0, labels)  # class 0 holds most rows
    probe = fit_probe(features, labels, 0.05)
    counts = torch.bincount(labels, minlength=3).double()
    weights = (40 / (3 * counts[labels]))[:, None]
    targets = torch.nn.functional.one_hot(labels, 3).double()
    mean, target_mean = (weights * features).sum(0) / 40, (weights * targets).sum(0) / 40
    centred, residual = features - mean, targets - target_mean
    system = centred.T @ (weights * centred) + 0.05 * features.pow(2).mean() * 40 * torch.eye(
        5, dtype=torch.float64
    )
    weight = torch.linalg.solve(system, centred.T @ (weights * residual)).T
    torch.testing.assert_close(probe.weight, weight, rtol=0, atol=1e-9)
    torch.testing.assert_close(probe.bias, target_mean - weight @ mean, rtol=0, atol=1e-9)


def test_a_wide_probe_in_the_span_of_its_rows_has_a_vanishing_gradient_in_every_coordinate():
    """d = 384 > n = 20: the solution from the rows' Gram matrix; the gradient in all 384 coordinates is 0."""
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(20, 384, generator=generator, dtype=torch.float64) + 3.0  # an offset: not centred
    labels = torch.arange(20) % 4
    for penalty in (1e-4, 1e-1, 1e2):
        probe = fit_probe(features, labels, penalty)
        weight, bias = probe.weight.clone().requires_grad_(True), probe.bias.clone().requires_grad_(True)
        objective(features, labels, penalty, weight, bias).backward()
        assert max(weight.grad.abs().max(), bias.grad.abs().max()) < 1e-9, penalty


def test_scaled_features_give_the_same_probabilities_the_penalty_is_scale_free():
    features, labels = planted(seed=3)
    probe = fit_probe(features, labels, 0.1)
    scaled = fit_probe(features * 1000.0, labels, 0.1)
    torch.testing.assert_close(scaled.weight * 1000.0, probe.weight, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        scaled.predict_proba(features * 1000.0), probe.predict_proba(features), rtol=0, atol=1e-9
    )


def test_a_class_no_row_has_gets_probability_0():
    features, labels = planted(classes=2)
    probe = fit_probe(features, labels, 0.1, classes=4)
    proba = probe.predict_proba(features)
    assert proba.shape == (48, 4) and proba[:, 2:].max() == 0.0
    torch.testing.assert_close(proba.sum(-1), torch.ones(48, dtype=torch.float64))


# ------------------------------------------------------------------------------------------ determinism
def test_two_fits_are_bitwise_equal_and_permuted_rows_give_the_same_probe_within_1e_9():
    features, labels = planted(seed=4)
    first, second = fit_probe(features, labels, 0.03), fit_probe(features, labels, 0.03)
    assert torch.equal(first.weight, second.weight) and torch.equal(first.bias, second.bias)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(5))
    permuted = fit_probe(features[order], labels[order], 0.03)
    torch.testing.assert_close(permuted.weight, first.weight, rtol=0, atol=1e-9)
    torch.testing.assert_close(permuted.bias, first.bias, rtol=0, atol=1e-9)

    states, state_labels = toy(2)
    runs = [layer_probes(states, state_labels, seed=1) for _ in range(2)]
    assert torch.equal(runs[0].out_of_fold, runs[1].out_of_fold) and runs[0].penalties == runs[1].penalties
    assert all(
        torch.equal(a.probe.weight, b.probe.weight) for a, b in zip(runs[0].fits, runs[1].fits, strict=True)
    )


def test_the_folds_are_stratified_dealt_from_the_seed_and_keep_groups_whole():
    labels = torch.tensor([0] * 9 + [1] * 6 + [2] * 3)
    folds = probe_folds(labels, 3, seed=7)
    assert torch.equal(folds, probe_folds(labels, 3, seed=7))
    assert not torch.equal(folds, probe_folds(labels, 3, seed=8))
    for c, count in ((0, 9), (1, 6), (2, 3)):  # every class spread evenly over the folds
        assert torch.bincount(folds[labels == c], minlength=3).tolist() == [count // 3] * 3
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 4, 4, 5])
    grouped = probe_folds(torch.zeros(12, dtype=torch.long), 3, seed=0, groups=groups)
    assert all(len(set(grouped[groups == g].tolist())) == 1 for g in range(6))  # a group in one fold
    assert sorted(set(grouped.tolist())) == [0, 1, 2]


# ------------------------------------------------------------------------------------------ -100
def test_rows_labelled_minus_100_are_ignored_in_fitting_and_in_scoring():
    features, labels = planted(seed=6)
    noise = torch.randn(
        10, features.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    with_ignored = torch.cat([features[:20], noise * 50, features[20:]])
    ignored_labels = torch.cat([labels[:20], torch.full((10,), -100), labels[20:]])
    kept = ignored_labels != -100

    probe, alone = fit_probe(with_ignored, ignored_labels, 0.1), fit_probe(features, labels, 0.1)
    torch.testing.assert_close(probe.weight, alone.weight, rtol=0, atol=1e-12)
    torch.testing.assert_close(probe.bias, alone.bias, rtol=0, atol=1e-12)

    found = cross_validated_probe(with_ignored, ignored_labels, folds=4, seed=3)
    plain = cross_validated_probe(features, labels, folds=4, seed=3)
    assert (found.penalty, found.accuracies) == (plain.penalty, plain.accuracies)
    assert found.losses == pytest.approx(plain.losses, rel=0, abs=1e-12)
    torch.testing.assert_close(found.out_of_fold[kept], plain.out_of_fold, rtol=0, atol=1e-12)
    assert found.out_of_fold[~kept].isnan().all()

    proba = probe.predict_proba(with_ignored)
    assert probe_accuracy(proba, ignored_labels) == probe_accuracy(proba[kept], labels)

    states, state_labels = toy(1)
    padded = torch.cat([states, states[:7] * -3.0])
    padded_labels = torch.cat([state_labels, torch.full((7,), -100)])
    scores = layer_probe_scores(states[:40], state_labels[:40], states[40:], state_labels[40:], folds=4)
    ignored = layer_probe_scores(padded[:40], padded_labels[:40], padded[40:], padded_labels[40:], folds=4)
    assert ignored == scores  # the 7 rows labelled -100 sit in dev: no error counted


# ------------------------------------------------------------------------------------------ the penalty
def test_the_penalty_chosen_by_cross_validation_is_inside_the_grid_on_a_planted_problem():
    features, labels = planted(rows=60, width=20, classes=3, signal=1.2, seed=0)
    found = cross_validated_probe(features, labels, folds=5, seed=0)
    assert found.penalties == tuple(sorted(PENALTIES))  # nothing grown
    assert not found.on_edge and PENALTIES[0] < found.penalty < PENALTIES[-1]
    assert found.loss == min(found.losses) and found.loss < found.losses[0] and found.loss < found.losses[-1]
    assert found.probe.penalty == found.penalty
    refit = fit_probe(features, labels, found.penalty)  # the returned probe: every row at that penalty
    assert torch.equal(refit.weight, found.probe.weight)
    assert found.accuracy > 0.5  # 3 classes: chance is 1/3


def test_a_penalty_on_an_end_grows_the_grid_and_is_flagged_where_it_still_sits_there():
    """The planted problem's best penalty is 1 (the test above): a grid below it grows up one step (the
    ratio of its end values) at a time until the best is inside; one too far below or above grows
    GROW_STEPS steps and says the penalty still sits on its edge."""
    features, labels = planted(rows=60, width=20, classes=3, signal=1.2, seed=0)
    assert cross_validated_probe(features, labels, folds=5).penalty == pytest.approx(1.0)
    below = cross_validated_probe(features, labels, penalties=[1e-3, 1e-2], folds=5)
    assert below.penalties == pytest.approx([1e-3, 1e-2, 1e-1, 1.0, 10.0])
    assert below.penalty == pytest.approx(1.0) and not below.on_edge
    from_below = cross_validated_probe(features, labels, penalties=[1e-8, 1e-7], folds=5)
    assert len(from_below.penalties) == 10 and from_below.penalty == pytest.approx(1.0)  # 8 steps up
    far_below = cross_validated_probe(features, labels, penalties=[1e-14, 1e-13], folds=5)
    assert len(far_below.penalties) == 2 + GROW_STEPS and far_below.penalty == pytest.approx(1e-5)
    assert far_below.on_edge
    far_above = cross_validated_probe(features, labels, penalties=[1e10, 1e11], folds=5)
    assert far_above.penalties[0] == pytest.approx(100.0) and far_above.penalty == pytest.approx(100.0)
    assert far_above.on_edge


@pytest.mark.parametrize("seed", [1, 3])
def test_on_rows_without_signal_the_penalty_stops_where_the_loss_meets_its_limit_inside_the_grid(seed):
    """16 rows of noise: the loss falls towards the class frequencies' (0.5 on two balanced classes) as
    the penalty grows. The grid grows until it flattens there, and the choice is the smallest penalty
    within FLAT of the best loss: inside the grid, one step or more below its end."""
    features, labels = planted(rows=16, width=200, classes=2, signal=0.0, seed=seed)
    found = cross_validated_probe(features, labels, folds=4)
    assert not found.on_edge and found.penalty < found.penalties[-1] and found.penalty > PENALTIES[-1]
    assert found.loss <= min(found.losses) * (1 + FLAT) and found.loss == pytest.approx(0.5, abs=2e-3)
    below = found.penalties[found.penalties.index(found.penalty) - 1]
    assert found.losses[found.penalties.index(below)] > min(found.losses) * (1 + FLAT)  # the least such


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_where_the_loss_is_flat_towards_a_zero_penalty_the_choice_moves_inwards_off_the_end(seed):
    """16 separable rows in 200 dimensions: every small penalty gives the least-norm fit's loss, the
    smallest of them by float noise. The choice moves up the flat stretch: off the end, within FLAT."""
    features, labels = planted(rows=16, width=200, classes=2, signal=6.0, seed=seed)
    found = cross_validated_probe(features, labels, folds=4)
    assert found.penalties[0] == PENALTIES[0] and not found.on_edge and found.penalty > PENALTIES[0]
    assert found.loss <= min(found.losses) * (1 + FLAT)
    above = found.penalties.index(found.penalty) + 1
    assert found.losses[above] > min(found.losses) * (1 + FLAT)  # the largest such


@pytest.mark.parametrize(
    "width", [6, 20, 40]
)  # folds and all rows: both wider than tall, folds only, neither
def test_the_out_of_fold_probabilities_come_from_probes_that_did_not_see_the_row(width):
    features, labels = planted(rows=24, width=width, classes=2, seed=9)
    found = cross_validated_probe(features, labels, penalties=[0.1], folds=3, seed=4)
    folds = probe_folds(labels, 3, seed=4)
    for fold in range(3):
        held = folds == fold
        own = fit_probe(features[~held], labels[~held], 0.1, classes=2)
        torch.testing.assert_close(
            found.out_of_fold[held], own.predict_proba(features[held]), rtol=0, atol=1e-12
        )
    assert found.accuracy == probe_accuracy(found.out_of_fold, labels)


@pytest.mark.parametrize(("rows", "width"), [(30, 80), (30, 12)])
def test_the_problem_from_the_rows_inner_products_equals_the_one_from_their_features(rows, width):
    # the same weighted ridge problem two ways: from K = X X^T (never forming V) and from X^T X, on rows far
    # from the origin (a stream's mean), unbalanced classes and a row labelled -100
    features, labels = planted(rows=rows, width=width, classes=3, seed=2)
    features = features + 40.0 * torch.arange(width, dtype=torch.float64)
    labels[:7] = 0
    labels[9] = -100
    held_out = torch.tensor([1, 5, 9, 17])
    train = labels.clone()
    train[held_out] = -100
    gram = Gram(features)
    dual, primal = gram.problem(train, 3), Reduced.of(gram, train, 3)
    torch.testing.assert_close(dual.singular, primal.singular, rtol=1e-9, atol=0)
    for penalty in (1e-4, 0.3, 30.0):
        torch.testing.assert_close(
            dual.scores(dual.code_rows(held_out), [penalty]),
            primal.scores(primal.code_rows(held_out), [penalty]),
            rtol=0,
            atol=1e-9,
        )
        one, two = dual.probe(penalty), primal.probe(penalty)
        torch.testing.assert_close(one.weight, two.weight, rtol=0, atol=1e-12)
        torch.testing.assert_close(one.bias, two.bias, rtol=0, atol=1e-9)


# ------------------------------------------------------------------------------------------ per block
@pytest.mark.parametrize("label_state", [1, 2, 3])
def test_cross_validation_alone_finds_the_state_that_carries_the_label(label_state):
    states, labels = toy(label_state)
    probes = layer_probes(states, labels, folds=4)
    assert len(probes.fits) == 4 and best_layer(probes.cv_accuracies, skip_embeddings=True) == label_state
    assert min(range(4), key=lambda k: probes.cv_losses[k]) == label_state
    others = [score for index, score in enumerate(probes.cv_accuracies) if index != label_state]
    assert probes.cv_accuracies[label_state] >= max(others) + 0.15  # the others: about the majority class
    assert probes.out_of_fold.shape == (4, 60, 2)
    dev, dev_labels = toy(label_state, seed=1)
    scores = probes.accuracies(dev, dev_labels)
    assert best_layer(scores, skip_embeddings=True) == label_state and scores[label_state] >= 0.75


def test_held_out_scores_find_the_state_and_a_disagreeing_dev_set_moves_the_choice():
    states, labels = toy(2)
    scores = layer_probe_scores(states[:40], labels[:40], states[40:], labels[40:])
    assert best_layer(scores, skip_embeddings=True) == 2
    flipped = layer_probe_scores(states[:40], labels[:40], states[40:], 1 - labels[40:])
    assert best_layer(flipped, skip_embeddings=True) != 2


def test_state_norm_none_reads_the_states_as_they_are():
    """``state_norm="none"`` on states put at unit RMS by hand is the default on the raw ones; on the raw
    states themselves, the rows' own scales count."""
    states, labels = toy(2)
    states = states.double()
    by_hand = states / torch.sqrt((states * states).mean(-1, keepdim=True) + 1e-6)
    default = layer_probes(states, labels)
    none = layer_probes(by_hand, labels, state_norm="none")
    assert none.penalties == default.penalties
    torch.testing.assert_close(none.out_of_fold, default.out_of_fold, rtol=0, atol=1e-9)
    raw = layer_probes(states, labels, state_norm="none")  # each row's own scale kept: other numbers
    assert not torch.allclose(raw.out_of_fold, default.out_of_fold, rtol=0, atol=1e-6)


def test_two_threads_give_the_numbers_of_one_within_1e_9():
    features, labels = planted(rows=48, width=64, classes=3, seed=1)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(cross_validated_probe(features, labels, penalties=[0.01, 0.1, 1.0], folds=4))
    finally:
        torch.set_num_threads(before)
    one, two = runs
    assert one.penalty == two.penalty and one.losses == pytest.approx(two.losses, rel=0, abs=1e-12)
    torch.testing.assert_close(one.out_of_fold, two.out_of_fold, rtol=0, atol=1e-9)
    torch.testing.assert_close(one.probe.weight, two.probe.weight, rtol=0, atol=1e-9)


# ------------------------------------------------------------------------------------------ bad input
STATES, LABELS = torch.zeros(6, 2, 4), torch.tensor([0, 1, 0, 1, 0, 1])
NAN = STATES.clone()
NAN[3, 1, 2] = math.nan


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: layer_probes(STATES[:0], LABELS[:0]), "`states` has 0 rows: expected at least one."),
        (
            lambda: layer_probes(STATES, torch.full((6,), -100)),
            "`labels` are all -100: expected at least one labelled row.",
        ),
        (
            lambda: layer_probes(STATES, LABELS.float()),
            "`labels` has dtype torch.float32: expected integer class ids (-100: ignored).",
        ),
        (
            lambda: layer_probes(STATES, torch.tensor([0, 1, 0, 1, 0, 3]), classes=3),
            "`labels` holds 3: expected class ids 0 .. 2 (-100: ignored).",
        ),
        (
            lambda: layer_probes(STATES, torch.tensor([0, 1, -1, 1, 0, 1])),
            "`labels` holds -1: expected class ids >= 0 (-100: ignored).",
        ),
        (lambda: layer_probes(NAN, LABELS), "`states` holds nan at [3, 1, 2]: expected finite numbers."),
        (
            lambda: fit_probe(torch.tensor([[1.0], [math.inf]]), torch.tensor([0, 1]), 1.0),
            "`features` holds inf at [1, 0]: expected finite numbers.",
        ),
        (lambda: layer_probes(STATES, LABELS[:5]), "`labels` has shape (5,): expected (6,), one per row."),
        (
            lambda: layer_probes(STATES[:, 0], LABELS),
            "`states` has shape (6, 4): expected (rows, states, d).",
        ),
        (
            lambda: layer_probes(STATES[:3], LABELS[:3], folds=4),
            "`folds`=4 is not allowed: expected an integer from 2 to the 3 labelled rows.",
        ),
        (
            lambda: layer_probes(STATES, LABELS, folds=3, groups=torch.tensor([0, 0, 0, 1, 1, 1])),
            "`folds`=3 is not allowed: expected an integer from 2 to the 2 groups of labelled rows.",
        ),
        (
            lambda: fit_probe(STATES[:, 0], LABELS, 0.0),
            "`penalty`=0.0 is not allowed: expected a finite number > 0.",
        ),
        (
            lambda: layer_probes(STATES, LABELS, state_norm="layer"),
            "`state_norm`='layer' is not allowed: expected one of ['none', 'rms'].",
        ),
        (
            lambda: layer_probe_scores(STATES, LABELS, STATES[:, :1], LABELS),
            "`dev_states` has shape (6, 1, 4): expected (rows, 2, 4), as the training states.",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line_naming_the_field_the_value_and_what_is_allowed(call, message):
    with pytest.raises(ValueError) as raised:
        call()
    assert str(raised.value) == message


# ------------------------------------------------------------------------------------------ the guard
def test_best_layer_ties_go_deeper_and_can_skip_the_embeddings():
    assert best_layer([0.9, 0.5, 0.7, 0.7]) == 0
    assert best_layer([0.9, 0.5, 0.7, 0.7], skip_embeddings=True) == 3


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
