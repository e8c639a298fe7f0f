"""Summaries: a sweep's records as a small JSON (issue 60's shape), written atomically, read back, and
the tables rendered from it equal the tables rendered from the records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerfusion_recipes.reporting import summaries
from layerfusion_recipes.reporting.plot import markdown_table, paired_differences, paired_table, summarize
from layerfusion_recipes.reporting.summaries import (
    guard_table,
    read_summary,
    scores_table,
    speed_markdown,
    speed_summary,
    sweep_summary,
    write_summary,
)

LRS = (0.001, 0.01, 0.1)
# per method: the LR that wins on dev, its dev and test F1 per trial (every other LR: dev 0.2, test 0.1)
RUNS = {
    "none": (0.01, (0.5, 0.6, 0.7), (0.4, 0.5, 0.62)),
    "dwatt": (0.1, (0.7, 0.8, 0.9), (0.6, 0.7, 0.83)),
    "extra_layers": (0.001, (0.6, 0.6, 0.7), (0.5, 0.55, 0.6)),
}
SETTINGS = {
    "model": "/home/u/.venv/lib/python3.11/site-packages/tiny_model/model",
    "data": "/nowhere/conll",
    "seed": 0,
    "content": {"model": "aaaa1111bbbb2222", "data": "cccc3333dddd4444"},
}


def _records(runs: dict = RUNS, setup: str = "s1", trials: int = 3) -> list[dict]:
    records = []
    for method, (best, devs, tests) in runs.items():
        for lr in LRS:
            for trial in range(trials):
                dev, test = (devs[trial % 3], tests[trial % 3]) if lr == best else (0.2, 0.1)
                records.append(
                    {
                        "key": f"{method}|{trial}|{lr}|{setup}",
                        "method": method,
                        "regime": "fe",
                        "shots": 8,
                        "epochs": 25,
                        "trial": trial,
                        "lr": lr,
                        "setup": setup,
                        "dev_f1": dev,
                        "test_f1": test,
                        "dev_entities": 1000,
                        "settings": SETTINGS,
                    }
                )
    return records


def test_a_sweep_summary_holds_each_trial_s_test_score_at_the_selected_lr():
    summary = sweep_summary(_records(), name="demo", commands=["layerfusion ner --config g.yaml"])
    (cell,) = summary["cells"]
    assert (cell["shots"], cell["epochs"], cell["regime"]) == (8, 25, "fe")
    dwatt = cell["methods"]["dwatt"]
    assert dwatt["trials"] == [0, 1, 2] and dwatt["lr"] == 0.1 and dwatt["lrs"] == list(LRS)
    assert dwatt["test"] == [60.0, 70.0, 83.0] and dwatt["dev"] == [70.0, 80.0, 90.0]
    assert dwatt["dev_by_lr"] == [20.0, 20.0, 80.0]  # per LR of its grid
    assert "selection_trials" not in dwatt  # every trial chose: nothing to say
    assert list(cell["methods"]) == ["none", "dwatt", "extra_layers"]  # the registry's order
    assert summary["task"] == "ner" and summary["metric"] == "f1" and summary["runs"] == 27
    assert ["dwatt", "extra_layers"] in summary["pairs"] and ["dwatt", "none"] in summary["pairs"]


def test_a_summary_names_model_and_data_by_name_and_fingerprint_never_by_machine_path(tmp_path):
    summary = sweep_summary(_records(), name="demo", commands=[])
    assert summary["model"] == {"name": "tiny-model", "fingerprints": ["aaaa1111bbbb2222"]}
    assert summary["data"] == {"name": "conll", "fingerprints": ["cccc3333dddd4444"]}
    assert summary["setup"] == {"seed": 0} and summary["setups"]["s1"]["model"] == "aaaa1111bbbb2222"
    text = write_summary(tmp_path / "summary.json", summary).read_text()
    assert "/home/u" not in text and "site-packages" not in text and "/nowhere" not in text


def test_the_tables_from_a_summary_equal_the_tables_from_its_records(tmp_path):
    records = _records()
    summary = read_summary(write_summary(tmp_path / "s.json", sweep_summary(records, name="s", commands=[])))
    rows = summarize(records)
    from_records = [line for line in markdown_table(rows).splitlines() if line.startswith("| fe")]
    assert [line for line in scores_table(summary).splitlines() if line.startswith("| fe")] == from_records
    paired = [line for line in paired_table(paired_differences(records, rows)).splitlines() if "| fe" in line]
    assert [line for line in summaries.paired_table(summary).splitlines() if "| fe" in line] == paired


def test_a_summary_is_written_atomically_and_a_file_that_is_not_one_is_refused_in_one_line(tmp_path):
    path = tmp_path / "s.json"
    write_summary(path, {"kind": "table", "name": "t", "columns": ["a"], "rows": [[1, 2]]})
    assert json.loads(path.read_text())["rows"] == [[1, 2]] and "[1, 2]" in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temporary file left
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"s\.json: not a summary \(JSON\)") as error:
        read_summary(path)
    assert "\n" not in str(error.value)
    path.write_text('{"kind": "grid"}')
    kinds = r"kind must be one of \['sweep', 'report', 'speed', 'table', 'true_few_shot'\], got 'grid'"
    with pytest.raises(ValueError, match=kinds):
        read_summary(path)


def _probes(setup: str = "s1") -> list[dict]:
    """Per trial, probes of blocks 1 and 2 on the states as they are: block 2 best on dev (0.75), test 0.65"""
    return [
        {
            "shots": 8,
            "epochs": 25,
            "trial": trial,
            "features": "none",
            "metric": "f1",
            "setup": setup,
            "layers": [
                {"layer": 1, "penalty": 0.1, "penalty_on_edge": False, "dev_f1": 0.3, "test_f1": 0.3},
                {"layer": 2, "penalty": 0.1, "penalty_on_edge": False, "dev_f1": 0.75, "test_f1": 0.65},
            ],
        }
        for trial in range(3)
    ]


def test_with_probes_a_cell_has_the_best_layer_and_each_method_guarded_by_it():
    runs = {**RUNS, "layer_mix": (0.1, (0.9, 0.76, 0.5), (0.9, 0.2, 0.2))}
    summary = sweep_summary(_records(runs), _probes(), name="p", commands=[], fresh={8: 1})
    (cell,) = summary["cells"]
    best = cell["methods"]["best_layer"]
    assert best["layers"] == [2, 2, 2] and best["test"] == [65.0] * 3 and best["features"] == ["none"] * 3
    # trial 0: 90 dev beats 75 by more than one standard error (1.4 over 1000 entities): kept;
    # trial 1: 76 does not; trial 2: 50 does not
    assert cell["methods"]["layer_mix"]["guarded"] == {"test": [90.0, 65.0, 65.0], "kept": [0]}
    assert [found["layer"] for found in cell["layers"]] == [1, 2] and cell["layers"][1]["test"] == [65.0] * 3
    assert cell["fresh"] == 1
    rows = guard_table([{**summary, "title": "CoNLL, tiny"}], fresh_only=True).splitlines()
    assert rows[-1].startswith("| CoNLL, tiny | 8 | 1-2 | 56.0 ± 76.2 | 65.0 ± 0.0 | **-45.0 ± 0.0** |")
    assert "| +0.0 ± 0.0 (0/2) |" in rows[-1]  # guarded over trials 1-2: the block, never kept
    assert "(1/3)" in guard_table([summary], fresh_only=False).splitlines()[-1]  # trial 0 kept the mix


def test_without_layers_the_summary_leaves_out_the_per_block_probes():
    summary = sweep_summary(_records(), _probes(), name="p", commands=[], layers=False)
    assert "layers" not in summary["cells"][0] and "best_layer" in summary["cells"][0]["methods"]


def _report(date: str, heading: str, rows: list[str]) -> dict:
    lines = ["llama: 2 blocks, d = 8, 0.01 B parameters, float32; torch 2", f"\n### {heading}\n"]
    lines += ["| method | tokens/s / base (median of paired rounds) | FLOP bound |", "|---|---|---|", *rows]
    return {"command": f"python benchmarks/llm_speed.py # {date}", "date": date, "lines": lines}


def test_speed_keeps_each_method_s_newest_timing_of_the_newest_settings():
    longer, shorter = "Generation: 32 new tokens", "Generation: 16 new tokens"
    old = _report("2026-11-01", longer, ["| dwatt | 0.80x | 0.9x |", "| concat | 0.8x | 0.9x |"])
    rerun = _report("2026-11-02", shorter, ["| dwatt | 0.90x | 0.9x |", "| concat | 0.91x | 0.9x |"])
    newer = _report("2026-11-03", shorter, ["| base again | 1.00x | 1.0x |", "| dwatt | 0.93x | 0.9x |"])
    summary = speed_summary([newer, old, rerun], name="speed", machine="CPU")
    rows = {row[2]: (row[3], row[-1]) for row in summary["rows"]}
    assert rows == {"dwatt": ("0.93x", 1), "concat": ("0.91x", 0)}  # the 32-token run is another setting
    assert [report["date"] for report in summary["reports"]] == ["2026-11-02", "2026-11-03"]
    table = speed_markdown(summary)
    assert "| dwatt | 0.93x (bound 0.9x) [2] |" in table and "Generation: 16 new tokens" in table


def test_the_committed_summaries_are_small_and_name_no_machine_path():
    root = Path(__file__).resolve().parents[3] / summaries.SUMMARIES
    files = sorted(root.glob("*.json"))
    assert len(files) >= 20
    for path in files:
        text = path.read_text()
        summary = read_summary(path)
        assert summary["name"] == path.stem and len(text) < 16_000, path.name
        assert "/work/" not in text and "site-packages" not in text and "/root/" not in text, path.name
        if summary["kind"] == "sweep":
            assert summary["commands"] and all(cell["methods"] for cell in summary["cells"]), path.name
