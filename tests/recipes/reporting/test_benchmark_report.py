"""layerfusion_recipes/reporting/benchmark_report.py: a benchmark's printed report, saved as JSON and read
back."""

from __future__ import annotations

import json

import pytest

from layerfusion_recipes.reporting.benchmark_report import REPORT_KEYS, Report, read_report


def test_a_report_saves_what_it_printed(tmp_path, capsys):
    report = Report("benchmarks/overhead.py", ["--rounds", "3", "--output", "a b.json"])
    report.print("base forward: 3 ms")
    report.print("| dwatt | 1.1x |")
    assert capsys.readouterr().out == "base forward: 3 ms\n| dwatt | 1.1x |\n"
    path = tmp_path / "perf" / "overhead.json"
    report.save(None)  # no --output: nothing written
    assert not path.parent.exists()
    path.parent.mkdir()
    report.save(path)
    saved = read_report(path)
    assert saved["command"] == "python benchmarks/overhead.py --rounds 3 --output 'a b.json'"
    assert saved["lines"] == ["base forward: 3 ms", "| dwatt | 1.1x |"]
    assert set(saved) == set(REPORT_KEYS) and saved["date"].endswith("+00:00")
    assert [p.name for p in path.parent.iterdir()] == ["overhead.json"]  # no temporary file left


def test_a_file_that_is_not_a_report_is_refused_naming_it(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("{")
    with pytest.raises(ValueError, match=r"r\.json: not a benchmark report \(JSON\)"):
        read_report(path)
    path.write_text(json.dumps({"command": "x", "lines": []}))
    with pytest.raises(
        ValueError, match=r"r\.json: not a benchmark report: no date, load_1min, cpu_count, torch"
    ):
        read_report(path)
