"""True few-shot selection (few_shot.py): folds, per-block probes chosen by cross-validation, the fusions
as linear read-outs, the guard, and a read-out deployed as one adapter, exact against the read-out
recomputed from ``output_hidden_states``."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import NO_DROPOUT, tiny_bert
from peft import PeftModel
from tiny_decoders import FAMILIES

from peft_layerfusion import few_shot
from peft_layerfusion.fusion import unit_rms


def planted(label_states: tuple[int, ...], rows: int = 48, states: int = 5, width: int = 12, seed: int = 0):
    """``(states (rows, states, width), labels)``: the label is the sign of a sum over the first four
    coordinates of each state in ``label_states``, every state at its own scale."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, 3, states).view(1, states, 1)
    x = torch.randn(rows, states, width, generator=generator, dtype=torch.float64) * scales
    signal = sum(unit_rms(x[:, s])[:, :4].sum(-1) for s in label_states)
    return few_shot.head_states(list(x.unbind(1))), (signal > 0).long()


def test_head_states_read_every_state_but_the_last_at_unit_rms():
    z = [torch.tensor([[3.0, 4.0]]), torch.tensor([[6.0, 8.0]]), torch.tensor([[1.0, 7.0]])]
    states = few_shot.head_states(z)
    assert states.dtype == torch.float64 and states.shape == (1, 3, 2)
    rms = (12.5**0.5, 50**0.5)
    assert torch.allclose(states[0, 0], torch.tensor([3 / rms[0], 4 / rms[0]], dtype=torch.float64))
    assert torch.allclose(states[0, 1], torch.tensor([6 / rms[1], 8 / rms[1]], dtype=torch.float64))
    assert states[0, 2].tolist() == [1.0, 7.0]


def test_folds_are_stratified_and_never_split_a_sentence():
    labels = torch.tensor([0] * 8 + [1] * 8)
    folds = few_shot.make_cv(labels, 4, seed=0).of_row
    assert [(folds[labels == c] == f).sum().item() for c in (0, 1) for f in range(4)] == [2] * 8
    assert not torch.equal(folds, few_shot.make_cv(labels, 4, seed=1).of_row)  # the seed deals them
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 4, 5])
    cv = few_shot.make_cv(torch.tensor([1, 0, 0, 2, 0, 1, 0, 0, 2, 1]), 3, seed=0, groups=groups)
    assert torch.equal(cv.of_row, cv.of_unit[groups])  # every token in its sentence's fold
    assert sorted(cv.of_unit.bincount().tolist()) == [2, 2, 2]


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: few_shot.make_cv(torch.tensor([0, 0, 1]), 4, 0),
            "`folds`=4 is not allowed: expected an integer from 2 to the 3 labelled rows",
        ),
        (lambda: few_shot.choose(torch.randn(4, 3, 2), torch.tensor([0.0, 1, 0, 1])), "`labels`="),
        (
            lambda: few_shot.choose(torch.randn(4, 3, 2), torch.tensor([0, 1, -100, 1])),
            "drop rows labelled -100 first",
        ),
        (
            lambda: few_shot.choose(torch.full((4, 3, 2), float("nan")), torch.tensor([0, 1, 0, 1])),
            "finite hidden states",
        ),
        (
            lambda: few_shot.choose(torch.randn(0, 3, 2), torch.tensor([], dtype=torch.long)),
            "a non-empty (rows",
        ),
    ],
)
def test_bad_input_gets_one_line(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_probes_find_the_planted_block_and_the_readouts_recompute():
    states, labels = planted((3,))
    trial = few_shot.choose(states, labels, folds=4, seed=0)
    assert trial.best_block == 3 and [p.block for p in trial.probes] == [1, 2, 3, 4]
    assert trial.probes[2].cv_score >= 0.75 > 0.65 >= max(p.cv_score for p in trial.probes if p.block != 3)
    probes = {p.block: p for p in trial.probes}
    logits = {s: states[:, s] @ p.weight.T + p.bias for s, p in probes.items()}  # each probe alone
    assert torch.allclose(trial.readouts["none"].logits(states), logits[4])
    assert torch.allclose(trial.readouts["best_layer"].logits(states), logits[3])
    blocks = trial.readouts["probe_ensemble"].blocks
    assert len(blocks) == trial.top_k and blocks[0] == 3
    mean = sum(logits[s] for s in blocks) / len(blocks)  # the geometric mean's logits
    assert torch.allclose(trial.readouts["probe_ensemble"].logits(states), mean)
    # stacked: sum_s alpha_s (W_s x_s + b_s) + c, c the same on every row
    mixed = sum(a * logits[s] for a, s in zip(trial.stack_weights, probes, strict=True))
    offset = trial.readouts["stacked"].logits(states) - mixed
    assert torch.allclose(offset, offset[:1].expand_as(offset), atol=1e-9)
    assert trial.stack_weights[2] == max(trial.stack_weights)  # the planted block weighs most


def test_a_probe_is_deterministic_and_its_penalty_off_the_grid_edge():
    states, labels = planted((2,), seed=3)
    first, second = (few_shot.choose(states, labels, folds=4, seed=0) for _ in range(2))
    for a, b in zip(first.probes, second.probes, strict=True):
        assert torch.equal(a.weight, b.weight) and a.penalty == b.penalty
    penalties = sorted({p.penalty for p in first.probes})
    assert all(1e-8 <= p <= 1e6 for p in penalties)


def test_the_guard_keeps_the_ensemble_unless_the_block_clearly_wins():
    spread, labels = planted((1, 2, 3, 4), rows=64, seed=1)  # every block carries part of the label
    trial = few_shot.choose(spread, labels, folds=4)
    assert trial.guard.deploy == "joint_ensemble"  # what the recipe deploys: the joint ensemble
    cv = few_shot.make_cv(labels, 4, seed=0)
    assert few_shot.guard(trial.probes, cv).deploy == "probe_ensemble"  # without the joint probe
    alone, labels = planted((2,), rows=96, states=9, seed=2)  # one block of 8: the rest is noise
    verdict = few_shot.choose(alone, labels, folds=4).guard
    assert verdict.blocks == (2, 2, 2, 2)  # every fold, choosing on the others, finds it
    assert verdict.block_score >= verdict.ensemble_score


def bert_states(sentences: int, seed: int):
    """A tiny 3-class BERT, ``sentences`` random 7-token inputs and the head states of their tokens,
    ``(sentences * 7, 4, 32)``, from ``output_hidden_states``."""
    base = tiny_bert(num_labels=3, **NO_DROPOUT)
    ids = torch.randint(1, 50, (sentences, 7), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        hidden = base(input_ids=ids, output_hidden_states=True).hidden_states
    return base, ids, few_shot.head_states(hidden).flatten(0, 1)


def deployed_exactly(base, readout, ids, states, folder):
    """``readout`` deployed on a copy of ``base``: its logits are the read-out's of ``states`` (float32
    rounding), and the adapter saved to ``folder`` reloads to the same logits bitwise."""
    model = few_shot.deploy(copy.deepcopy(base), readout, "classifier").eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits.flatten(0, 1)
    assert torch.allclose(logits.double(), readout.logits(states), atol=1e-5)
    model.save_pretrained(folder)
    reloaded = PeftModel.from_pretrained(copy.deepcopy(base), folder).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits.flatten(0, 1), logits)
    return model


@pytest.mark.parametrize("blocks", [(2,), (1, 3)])
def test_a_readout_deploys_as_one_adapter_exactly(blocks, tmp_path):
    base, ids, states = bert_states(sentences=2, seed=1)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3, len(blocks), 32, generator=generator, dtype=torch.float64)
    readout = few_shot.LinearReadout(blocks, weight, torch.randn(3, generator=generator, dtype=torch.float64))
    deployed_exactly(base, readout, ids, states, tmp_path)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt2"])
@pytest.mark.parametrize("blocks", [(2,), (1, 2)])
def test_a_readout_deploys_on_a_decoder_head_without_bias(family, blocks):
    base = FAMILIES[family].build("seq")
    assert base.score.bias is None
    ids = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():  # the last token's states: z_1 / rms, and z_2 after the final norm
        states = few_shot.head_states(base(input_ids=ids, output_hidden_states=True).hidden_states)[0, -1:]
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3, len(blocks), 32, generator=generator, dtype=torch.float64)
    readout = few_shot.LinearReadout(blocks, weight, torch.randn(3, generator=generator, dtype=torch.float64))
    model = few_shot.deploy(copy.deepcopy(base), readout, "score").eval()
    assert type(model.peft_config["default"]).__name__ == "ConcatConfig"  # the bias goes in the map
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.allclose(logits.double(), readout.logits(states), atol=1e-5)


def test_token_rows_fold_and_resample_by_sentence():
    states, labels = planted((2,), rows=60, seed=4)
    groups = torch.arange(60) // 3  # 20 sentences of 3 tokens
    trial = few_shot.choose(states, labels, folds=4, groups=groups)
    cv = few_shot.make_cv(labels, 4, 0, groups)
    assert cv.of_unit.bincount().tolist() == [5, 5, 5, 5] and torch.equal(cv.of_row, cv.of_unit[groups])
    assert trial.best_block == 2 and len(trial.guard.blocks) == 4


def test_a_sample_without_some_class_gives_readouts_of_every_class_of_the_head():
    states, labels = planted((2,), seed=5)
    trial = few_shot.choose(states, labels, folds=4, classes=5)  # the head has 5 classes, the sample 2
    for name, readout in trial.readouts.items():
        assert readout.weight.shape[0] == 5 and readout.bias.shape == (5,), name
        assert set(readout.predict(states).tolist()) <= {0, 1}, name  # never a class it has not seen


def test_the_joint_probe_is_the_ridge_fit_of_the_scaled_concatenation():
    states, labels = planted((1, 3), rows=64, seed=6)  # the label needs two blocks at once
    assert labels.bincount().tolist() == [32, 32]
    trial = few_shot.choose(states, labels, folds=4, seed=0)
    readout, penalty = trial.readouts["joint_probe"], trial.joint.penalty
    assert readout.blocks == (1, 2, 3, 4) and trial.choices()["joint_penalty"] == penalty
    # recomputed independently: the normal equations of the scaled concatenation at the chosen penalty,
    # every coordinate standardized over the rows first
    parts = states[:, 1:]  # (n, L, d)
    parts = (parts - parts.mean(0)) / parts.std(0, correction=0)
    scale = parts.pow(2).mean((0, 2)).sqrt()
    x = (parts / scale[None, :, None]).flatten(1)  # (n, L d)
    targets = torch.nn.functional.one_hot(labels, 2).double()
    centred, mean_t = x - x.mean(0), targets.mean(0)  # a stratified sample: every row weighs 1
    system = centred.T @ centred + penalty * x.pow(2).mean() * len(x) * torch.eye(x.shape[1], dtype=x.dtype)
    weight = torch.linalg.solve(system, centred.T @ (targets - mean_t))  # (L d, C)
    expected = (x - x.mean(0)) @ weight + mean_t
    assert torch.allclose(readout.logits(states), expected, atol=1e-8)
    # the concatenation sees what no single block holds: its out-of-fold score tops every block's
    assert trial.cv_scores["joint_probe"] == 50 / 64  # 0.781
    assert [p.cv_score for p in trial.probes] == [39 / 64, 31 / 64, 41 / 64, 41 / 64]  # 0.641 at most


def test_every_choice_is_blind_to_the_scale_of_each_coordinate():
    """The states are standardized before any fit: rescaling and shifting coordinates (as a pre-norm
    stream's few huge ones) changes no choice, and every read-out's logits on the moved states are the
    same (the read-outs absorb the map)."""
    states, labels = planted((2, 3), rows=48, seed=8)
    gain = torch.logspace(-2, 3, states.shape[-1], dtype=torch.float64)  # (d,): 1e-2 .. 1e3
    moved = states * gain + 7.0
    first, second = (few_shot.choose(x, labels, folds=4, seed=2) for x in (states, moved))
    assert first.choices() == second.choices()
    for name in few_shot.METHODS:
        a, b = first.readouts[name].logits(states), second.readouts[name].logits(moved)
        assert torch.allclose(a, b, atol=1e-6), name


def test_the_joint_ensemble_is_the_mean_of_the_joint_probe_and_the_ensemble():
    states, labels = planted((2, 3), rows=48, seed=7)
    trial = few_shot.choose(states, labels, folds=4, seed=1)
    assert few_shot.RECOMMENDED == "guarded_ensemble" and "joint_ensemble" in few_shot.METHODS
    joint, ensemble = (trial.readouts[name].logits(states) for name in ("joint_probe", "probe_ensemble"))
    assert trial.readouts["joint_ensemble"].blocks == (1, 2, 3, 4)
    assert torch.allclose(trial.readouts["joint_ensemble"].logits(states), (joint + ensemble) / 2, atol=1e-10)


def test_the_joint_probe_reads_the_sample_alone():
    states, labels = planted((1, 3), rows=40, seed=6)
    first = few_shot.choose(states, labels, folds=4, seed=0)
    # rows outside the sample (a test set) cannot move it; the sample's own rows do
    again = few_shot.choose(states.clone(), labels.clone(), folds=4, seed=0)
    assert torch.equal(first.readouts["joint_probe"].weight, again.readouts["joint_probe"].weight)
    fewer = few_shot.choose(states[:36], labels[:36], folds=4, seed=0)
    assert not torch.allclose(fewer.readouts["joint_probe"].weight, first.readouts["joint_probe"].weight)


@pytest.mark.parametrize("name", ["joint_probe", "joint_ensemble"])
def test_the_joint_readouts_deploy_as_one_adapter_exactly(name, tmp_path):
    base, ids, states = bert_states(sentences=6, seed=3)  # states: (42 tokens, 4, 32)
    labels = torch.arange(len(states)) % 3
    readout = few_shot.choose(states, labels, folds=3, seed=0).readouts[name]
    assert readout.blocks == (1, 2, 3)
    model = deployed_exactly(base, readout, ids, states, tmp_path)
    assert type(model.peft_config["default"]).__name__ == "ConcatConfig"
