"""Each method against the best single layer chosen on dev (reporting/best_layer.py): the comparator and
the guard on planted records, by hand; the section a sweep with probes writes into ``table.md``."""

from __future__ import annotations

import pytest

from layerfusion_recipes.core.probes.probes import guarded
from layerfusion_recipes.reporting.best_layer import (
    BEST_LAYER,
    best_layer_markdown,
    best_layer_section,
    guarded_scores,
    method_scores,
    run_label,
    union_probes,
)


def _probe(trial: int, scores: list[tuple[float, float]], features: str = "none", edge: bool = False) -> dict:
    """A probe record of one trial and feature kind: (dev, test) of layers 1, 2, ..., each at penalty 0.1
    (``edge``: at the end of its grid)."""
    layers = [
        {"layer": n, "penalty": 0.1, "penalty_on_edge": edge, "dev_f1": dev, "test_f1": test}
        for n, (dev, test) in enumerate(scores, start=1)
    ]
    return {"features": features, "trial": trial, "shots": 8, "epochs": 5, "metric": "f1", "layers": layers}


def _run(method: str, trial: int, lr: float, dev: float, test: float, **options) -> dict:
    return {"method": method, "regime": "fe", "shots": 8, "epochs": 5, "trial": trial, "lr": lr,
            "dev_f1": dev, "test_f1": test, "dev_entities": 400,
            **({"method_options": options} if options else {})}  # fmt: skip


# best layer per trial: trial 0 -> layer 2 (dev 0.70, test 0.60); trial 1 -> layer 1 (dev 0.80, test 0.50);
# trial 2 -> layer 3 of the none kind (dev 0.60 ties the unit-RMS one, test 0.40)
PROBES = [
    _probe(0, [(0.50, 0.90), (0.70, 0.60), (0.40, 0.40)]),
    _probe(1, [(0.80, 0.50), (0.30, 0.30), (0.20, 0.20)]),
    _probe(2, [(0.10, 0.10), (0.20, 0.20), (0.60, 0.45)], "rms"),
    _probe(2, [(0.10, 0.10), (0.20, 0.20), (0.60, 0.40)]),
]
# the mix at its selected LR 0.1 (mean dev 0.70 against 0.50 at 0.01): above the layer on dev in trials 0, 2
RUNS = [
    _run("layer_mix", 0, 0.1, dev=0.75, test=0.65),
    _run("layer_mix", 1, 0.1, dev=0.70, test=0.90),  # below on dev: the layer's 0.50 stands, unseen 0.90
    _run("layer_mix", 2, 0.1, dev=0.65, test=0.35),
    *(_run("layer_mix", trial, 0.01, dev=0.50, test=0.99) for trial in range(3)),
    *(_run("none", trial, 0.01, dev=0.30, test=0.20 + 0.1 * trial) for trial in range(3)),
]


def test_the_guard_keeps_a_run_only_where_its_dev_score_beats_the_layer_s_by_one_standard_error():
    best = {"dev": 0.7, "test": 0.6}  # on 2100 dev units: sqrt(0.7 * 0.3 / 2100) = 0.01
    assert guarded(0.711, 0.1, best, 2100) == (0.1, True)
    assert guarded(0.709, 0.9, best, 2100) == (0.6, False)  # above the layer, within its noise
    assert guarded(0.70, 0.9, best, 2100) == (0.6, False)  # a tie keeps the layer
    assert guarded(0.709, 0.1, best, 21000) == (0.1, True)  # ten times the dev set: a tenth of the noise


def test_each_method_against_the_best_layer_paired_by_trial_and_guarded():
    text, numbers = best_layer_markdown(RUNS, PROBES)
    cell = numbers["N=8 epochs=5"]
    assert cell[BEST_LAYER]["layers"] == {0: 2, 1: 1, 2: 3}
    assert cell[BEST_LAYER]["trials"] == pytest.approx({0: 60.0, 1: 50.0, 2: 40.0})
    mix = cell["layer_mix"]
    assert mix["lr"] == 0.1 and mix["trials"] == pytest.approx({0: 65.0, 1: 90.0, 2: 35.0})
    assert mix["dev_minus_best_layer"] == pytest.approx((5 - 10 + 5) / 3)
    assert mix["guarded"] == pytest.approx({0: 65.0, 1: 50.0, 2: 35.0}) and mix["kept"] == 2
    plain = cell["none"]
    assert plain["guarded"] == cell[BEST_LAYER]["trials"] and plain["kept"] == 0
    row = next(line for line in text.splitlines() if line.startswith("| layer_mix |"))
    # test 63.3; minus the layer +13.3 (5, 40, -5); guarded +0.0 (5, 0, -5) over 3 trials, 2 kept
    assert row.startswith("| layer_mix | 63.3 ± ") and "| 0.1 | +13.3 ± " in row
    assert row.endswith("| +0.0 ± 12.4 (2/3) |")
    assert "trial 0: z_2 λ 0.1, trial 1: z_1 λ 0.1, trial 2: z_3 λ 0.1" in text


def test_a_run_with_method_options_is_its_own_row():
    varied = [_run("layer_mix", trial, 0.1, dev=0.9, test=0.9, mixing_lr_multiplier=10) for trial in range(3)]
    scores = method_scores(RUNS + varied)
    assert set(scores) == {"layer_mix", "none", "layer_mix (mixing_lr_multiplier=10)"}
    assert run_label(varied[0]) == "layer_mix (mixing_lr_multiplier=10)"
    _, numbers = best_layer_markdown(RUNS + varied, PROBES)
    assert numbers["N=8 epochs=5"]["layer_mix (mixing_lr_multiplier=10)"]["kept"] == 3


def test_a_cell_with_probes_and_no_runs_shows_the_best_layer_alone():
    lone = [{**probe, "shots": 32} for probe in PROBES]  # probed at N = 32, no method ran there
    text, numbers = best_layer_markdown(RUNS, PROBES + lone)
    assert list(numbers["N=32 epochs=5"]) == [BEST_LAYER]
    assert numbers["N=32 epochs=5"][BEST_LAYER]["trials"] == pytest.approx({0: 60.0, 1: 50.0, 2: 40.0})
    assert numbers["N=8 epochs=5"]["layer_mix"]["kept"] == 2


def test_the_guard_pairs_only_the_trials_both_have():
    scores, kept = guarded_scores({0: 70.0, 5: 99.0}, {0: 90.0, 5: 99.0}, {0: {"dev": 0.8, "test": 0.6}}, 100)
    assert scores == {0: 70.0} and kept == [0]  # trial 0 kept: 90 beats 80 by more than one SE


def test_the_section_needs_probes_and_fe_runs():
    assert best_layer_section(RUNS, []) == ""
    assert best_layer_section([{**run, "regime": "ft"} for run in RUNS], PROBES) == ""
    section = best_layer_section(RUNS, PROBES)
    assert section.startswith("## Against the best single layer chosen on dev\n")
    assert "| best layer (dev) | 50.0 ± " in section
    assert "beats that layer's by more than one standard error of the layer's dev score" in section


def test_a_later_sweep_s_probes_join_the_candidates_and_the_first_sweep_wins_a_shared_kind():
    wider = [
        _probe(1, [(0.99, 0.99), (0.99, 0.99), (0.99, 0.99)]),  # the same (trial, kind): ignored
        _probe(1, [(0.85, 0.55), (0.10, 0.10), (0.10, 0.10)], "rms"),  # a new kind beats layer 1's dev
        _probe(7, [(0.85, 0.55), (0.10, 0.10), (0.10, 0.10)], "rms"),  # a trial the first sweep lacks
    ]
    probes = union_probes([PROBES, wider])
    assert len(probes) == len(PROBES) + 1
    _, numbers = best_layer_markdown(RUNS, probes)
    best = numbers["N=8 epochs=5"][BEST_LAYER]
    assert best["trials"] == pytest.approx({0: 60.0, 1: 55.0, 2: 40.0}) and best["layers"][1] == 1


def test_a_file_run_again_under_a_new_setup_gets_a_table_per_setup_each_with_its_own_bar():
    # the same probes under an old and a new setup (e.g. the model's files installed again), the new
    # setup's trial 0 unit-RMS probe too (dev 0.65, under layer 2's 0.70), and the runs of each setup
    probes = [
        *({**probe, "setup": setup} for setup in ("old", "new") for probe in PROBES),
        {**_probe(0, [(0.65, 0.99)] * 3, "rms"), "setup": "new"},
    ]
    runs = [{**run, "setup": "old"} for run in RUNS] + [
        {**run, "setup": "new", "test_f1": run["test_f1"] - 0.1} for run in RUNS
    ]
    text, numbers = best_layer_markdown(runs, union_probes([probes]))
    assert sorted(numbers) == ["N=8 epochs=5 setup=new", "N=8 epochs=5 setup=old"]
    assert "**N=8, max 5 epochs** (setup old): best layer" in text
    for setup, shift in (("old", 0.0), ("new", -10.0)):  # each setup's runs against its own bar
        cell = numbers[f"N=8 epochs=5 setup={setup}"]
        assert cell[BEST_LAYER]["trials"] == pytest.approx({0: 60.0, 1: 50.0, 2: 40.0})  # as before
        assert cell["layer_mix"]["trials"] == pytest.approx(
            {0: 65.0 + shift, 1: 90.0 + shift, 2: 35.0 + shift}
        )


def test_probes_of_another_setup_join_the_candidates_without_hiding_the_first_sweep_s():
    main = [{**probe, "setup": "main"} for probe in PROBES]
    wider = [{**_probe(1, [(0.75, 0.55), (0.10, 0.10), (0.10, 0.10)], "rms"), "setup": "wide"}]  # under 0.80
    _, numbers = best_layer_markdown(RUNS, union_probes([main, wider]))
    assert numbers["N=8 epochs=5"][BEST_LAYER]["trials"] == pytest.approx({0: 60.0, 1: 50.0, 2: 40.0})


def test_a_best_layer_whose_penalty_sits_at_the_end_of_its_grid_is_flagged():
    assert "⚠" not in best_layer_markdown(RUNS, PROBES)[0]
    edge = [*PROBES[:3], _probe(2, [(0.10, 0.10), (0.20, 0.20), (0.60, 0.40)], edge=True)]  # trial 2's best
    assert "penalty is at the end of its grid in trial(s) 2 " in best_layer_markdown(RUNS, edge)[0]
    elsewhere = [*PROBES[:3], _probe(2, [(0.10, 0.10), (0.20, 0.20), (0.60, 0.40)], "none")]
    elsewhere[2] = {
        **elsewhere[2],
        "layers": [{**e, "penalty_on_edge": True} for e in elsewhere[2]["layers"]],
    }
    assert "⚠" not in best_layer_markdown(RUNS, elsewhere)[0]  # the unit-RMS probe on its edge: not the best
