"""``layerfusion report``: the generated blocks of RESULTS.md, rebuilt from the published summaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from layerfusion_recipes.cli import main
from layerfusion_recipes.reporting import results_md
from layerfusion_recipes.reporting.summaries import SUMMARIES, write_summary

REPO = Path(__file__).resolve().parents[3]
PROSE_BEFORE = "# Results\n\nHand-written prose, kept as it is.\n\n"
PROSE_AFTER = "\nMore prose after the block.\n"


def _method(test: list[float], dev: list[float], lr: float = 0.01, **more) -> dict:
    return {"trials": [0, 1, 2], "test": test, "dev": dev, "lr": lr, "lrs": [0.001, 0.01, 0.1], **more}


def _sweep(name: str = "fake", title: str = "Fake, tiny") -> dict:
    methods = {
        "none": _method([40.0, 50.0, 60.0], [50.0, 60.0, 70.0]),
        "dwatt": _method([60.0, 70.0, 80.0], [70.0, 80.0, 90.0], lr=0.1),
    }
    return {
        "kind": "sweep",
        "name": name,
        "title": title,
        "metric": "f1",
        "metrics": ["f1"],
        "commands": [f"layerfusion ner --config benchmarks/grids/{name}.yaml"],
        "model": {"name": "tiny", "fingerprints": ["ab12"]},
        "data": {"name": "toy", "fingerprints": []},
        "pairs": [["dwatt", "none"]],
        "cost": "18 runs",
        "cells": [{"shots": 8, "epochs": 25, "regime": "fe", "methods": methods}],
    }


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository root with one summary (``fake``) and a stale RESULTS.md block."""
    write_summary(tmp_path / SUMMARIES / "fake.json", _sweep())
    block = "<!-- generated: fake -->\nstale table\n<!-- end generated: fake -->\n"
    (tmp_path / "benchmarks" / "RESULTS.md").write_text(PROSE_BEFORE + block + PROSE_AFTER)
    return tmp_path


def _markers(spec: str) -> str:
    """A block's begin and end marker lines."""
    return f"<!-- generated: {spec} -->\n<!-- end generated: {spec} -->\n"


def _run(repo: Path, *argv: str) -> int:
    return main(["report", "--root", str(repo), *argv])


def _text(repo: Path) -> str:
    return (repo / "benchmarks" / "RESULTS.md").read_text()


def test_a_block_is_regenerated_from_its_summary_and_the_prose_is_kept(repo, capsys):
    assert _run(repo) == 0
    text = _text(repo)
    assert text.startswith(PROSE_BEFORE) and text.endswith(PROSE_AFTER) and "stale" not in text
    # t(0.975, 2) * 10 / sqrt(3) = 24.8; 0.1 is the top of dwatt's grid
    cells = "50.0 ± 24.8 @0.01 (dev 60.0) (n=3) | 70.0 ± 24.8 @0.1 ⚠ (dev 80.0) (n=3)"
    assert f"| fe | 25 | 8 | {cells} |" in text
    assert "| fe | 25 | 8 | **+20.0 ± 0.0** |" in text  # dwatt - none, every trial +20
    assert "Model tiny (ab12), data toy; 18 runs." in text
    assert "```\nlayerfusion ner --config benchmarks/grids/fake.yaml\n```" in text
    assert "regenerated 1 generated block" in capsys.readouterr().out
    assert _run(repo) == 0 and "up to date (1 generated block)" in capsys.readouterr().out


def test_check_prints_a_diff_and_writes_nothing(repo, capsys):
    before = _text(repo)
    assert _run(repo, "--check") == 1
    captured = capsys.readouterr()
    assert "-stale table" in captured.out and "is out of date" in captured.err
    assert _text(repo) == before


def test_a_summary_changed_after_the_page_makes_check_fail(repo):
    assert _run(repo) == 0 and _run(repo, "--check") == 0
    summary = _sweep()
    summary["cells"][0]["methods"]["none"]["test"] = [41.0, 50.0, 60.0]
    write_summary(repo / SUMMARIES / "fake.json", summary)
    assert _run(repo, "--check") == 1


def test_the_guard_block_puts_a_line_per_cell_of_several_summaries(repo):
    def with_probes(name: str, title: str, kept: list[int]) -> dict:
        summary = _sweep(name, title)
        methods = summary["cells"][0]["methods"]
        methods["best_layer"] = {"trials": [0, 1, 2], "test": [55.0, 65.0, 75.0], "dev": [60.0, 70.0, 80.0]}
        methods["layer_mix"] = _method([56.0, 66.0, 77.0], [61.0, 71.0, 85.0])
        methods["layer_mix"]["guarded"] = {"test": [55.0, 65.0, 77.0], "kept": kept}
        summary["cells"][0]["fresh"] = 1
        return summary

    write_summary(repo / SUMMARIES / "a.json", with_probes("a", "TREC, tiny", [2]))
    write_summary(repo / SUMMARIES / "b.json", with_probes("b", "SST-2, tiny", []))
    spec = "guard of=a,b trials=fresh"
    (repo / "benchmarks" / "RESULTS.md").write_text(_markers(spec))
    assert _run(repo) == 0
    lines = [line for line in _text(repo).splitlines() if line.startswith("| ") and "tiny" in line]
    leading = [line.split(" | ")[:3] for line in lines]
    assert leading == [["| TREC, tiny", "8", "1-2"], ["| SST-2, tiny", "8", "1-2"]]
    # fresh trials 1-2: the guarded mix 65, 77 against the block's 65, 75 (kept in trial 2 only)
    assert "| +1.0 ± 12.7 (1/2) |" in lines[0] and "| +1.0 ± 12.7 (0/2) |" in lines[1]


def test_a_report_block_shows_a_saved_benchmark_run_and_a_table_block_its_rows(repo):
    report = {"kind": "report", "name": "overhead", "command": "python benchmarks/overhead.py --rounds 3"}
    report |= {"date": "2026-11-28T22:24:00+00:00", "load_1min": 0.5, "cpu_count": 2, "torch": "2.13.0+cpu"}
    report["lines"] = ["BERT-base shape", "| method | latency |", "|---|---|", "| dwatt | 1.1x |"]
    write_summary(repo / SUMMARIES / "overhead.json", report)
    table = {"kind": "table", "name": "mteb", "columns": ["k", "last"], "rows": [[8, "62.7 ± 3.8"]]}
    write_summary(repo / SUMMARIES / "mteb.json", {**table, "note": "5 draws.", "commands": ["python x.py"]})
    (repo / "benchmarks" / "RESULTS.md").write_text(_markers("overhead") + _markers("mteb"))
    assert _run(repo) == 0
    page = _text(repo)
    assert "Run of 2026-11-28 22:24:00 UTC, torch 2.13.0+cpu, 1-min load average 0.5 on 2 CPUs" in page
    assert "- BERT-base shape\n\n| method | latency |\n|---|---|\n| dwatt | 1.1x |" in page
    assert "| 8 | 62.7 ± 3.8 |\n\n5 draws.\n\n```\npython x.py\n```" in page


def test_a_report_renders_printed_headings_as_headings_and_never_an_empty_item():
    printed = ["model line", "\n### Forward: batch 2\n", "| a |", "|---|", "| 1 |", "\n", "load at the end"]
    assert results_md.report_markdown(printed) == (
        "- model line\n\n### Forward: batch 2\n\n| a |\n|---|\n| 1 |\n\n- load at the end"
    )


@pytest.mark.parametrize(
    "markers, message",
    [
        (_markers("nowhere"), "no summary benchmarks/summaries/nowhere.json"),
        ("<!-- generated: fake -->\n", "has no end marker"),
        ("<!-- end generated: fake -->\n", "has no begin marker"),
        (_markers("fake x"), "parameter 'x' is not key=value"),
        (_markers("fake a=1"), "not a parameter of this block: a"),
        (_markers("fake metrics=bleu"), "metrics= names"),
        (_markers("guard of=fake"), "trials= one of fresh, all"),
    ],
)
def test_bad_markers_stop_with_one_line_naming_the_marker(repo, capsys, markers, message):
    (repo / "benchmarks" / "RESULTS.md").write_text(markers)
    assert _run(repo) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "marker" in err


def test_a_summary_that_is_not_one_names_its_file(repo, capsys):
    (repo / SUMMARIES / "fake.json").write_text('{"kind": "grid"}')
    assert _run(repo) == 2
    assert "fake.json: kind must be one of" in capsys.readouterr().err


def test_a_marker_quoted_inside_prose_is_not_a_marker(repo):
    text = PROSE_BEFORE + "Blocks start with `<!-- generated: NAME -->` lines.\n"
    assert results_md.find_blocks(text) == []


def test_the_committed_results_page_is_up_to_date_and_short(capsys):
    assert _run(REPO, "--check") == 0, capsys.readouterr().out[-2000:]
    page = (REPO / "benchmarks" / "RESULTS.md").read_text().splitlines()
    assert len(page) <= 600
    shown = {block.name for block in results_md.find_blocks("\n".join(page))}
    assert {"conll_fe_lr", "guard", "mlm", "seq2seq", "speed_cpu", "speed_gpu"} <= shown
