"""``layerfusion paired``: paired differences between cells of different results files."""

from __future__ import annotations

from pathlib import Path

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.results.records import append_record

SETTINGS = {"data": "/d", "seed": 0, "dev_limit": 500, "method_options": {}}


def _write(
    path: Path, method: str, tests: dict[float, tuple[float, ...]], setup: str = "s", **settings
) -> str:
    """Runs of one cell (lora, N = 128, 25 epochs) of ``setup``: per LR the test F1 of trials 0, 1, 2;
    dev = test."""
    for lr, scores in tests.items():
        for trial, score in enumerate(scores):
            cell = {"method": method, "regime": "lora", "shots": 128, "epochs": 25, "trial": trial, "lr": lr}
            record = {
                **cell,
                "key": f"{method}|{trial}|{lr}|{setup}",
                "task": "ner",
                "setup": setup,
                "dev_f1": score,
                "test_f1": score,
            }
            append_record(path, {**record, "settings": {**SETTINGS, **settings}})
    return f"{path}:{method}:lora"


def test_cells_of_two_files_pair_by_trial_each_at_its_selected_lr(tmp_path, capsys):
    # the matched baseline (its own method options) is best at 3e-3; dwatt at 1e-3
    matched = _write(
        tmp_path / "a.jsonl",
        "none",
        {3e-3: (0.75, 0.70, 0.80), 1e-2: (0.1, 0.1, 0.1)},
        method_options={"lora_r": 122},
    )
    fusion = _write(tmp_path / "b.jsonl", "dwatt", {1e-3: (0.70, 0.60, 0.80), 3e-3: (0.2, 0.2, 0.2)})
    assert main(["paired", "--shots", "128", fusion, matched]) == 0
    line = capsys.readouterr().out.strip()
    # per trial -5, -10, 0: mean -5.0, t(0.975, 2) * 5 / sqrt(3) = 12.4
    assert line == f"{fusion} @0.001 - {matched} @0.003: -5.0 ± 12.4 (n=3)"


def test_cells_of_other_samples_or_settings_are_refused(tmp_path, capsys):
    first = _write(tmp_path / "a.jsonl", "none", {3e-3: (0.7, 0.7, 0.7)})
    other = _write(tmp_path / "b.jsonl", "dwatt", {3e-3: (0.7, 0.7, 0.7)}, dev_limit=1000, seed=1)
    assert main(["paired", "--shots", "128", first, other]) == 2
    assert "differ in dev_limit, seed: not the same samples" in capsys.readouterr().err
    assert main(["paired", "--shots", "8", first, first]) == 2  # no such row
    assert "no runs of none / lora at N = 8, 25 epochs" in capsys.readouterr().err
    _write(tmp_path / "c.jsonl", "none", {3e-3: (0.7, 0.7, 0.7)})
    mixed = _write(tmp_path / "c.jsonl", "none", {1e-2: (0.1, 0.1, 0.1)}, setup="t")  # a second setup
    assert main(["paired", "--shots", "128", mixed, other]) == 2
    assert "its runs are of 2 setups (s, t), not one" in capsys.readouterr().err
    assert main(["paired", "--shots", "128", first, "nocolon"]) == 2
    assert "expected RESULTS:METHOD:REGIME" in capsys.readouterr().err
