"""benchmarks/results_md.py: the generated blocks of RESULTS.md, rebuilt from grid files and results."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from layerfusion_recipes.results import append_line, append_record

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "results_md.py"
_spec = importlib.util.spec_from_file_location("results_md", SCRIPT)
results_md = sys.modules["results_md"] = importlib.util.module_from_spec(_spec)  # a script, not a package
_spec.loader.exec_module(results_md)

LRS = (0.001, 0.01, 0.1)
# per method: the LR that wins on dev, its dev and test F1 per trial (every other LR: dev 0.2)
RUNS = {
    "none": (0.01, (0.5, 0.6, 0.7), (0.4, 0.5, 0.6)),
    "dwatt": (0.1, (0.7, 0.8, 0.9), (0.6, 0.7, 0.8)),
}
NONE_CELL = "50.0 ± 24.8 @0.01 (dev 60.0) (n=3)"  # t(0.975, 2) * 10 / sqrt(3) = 24.8
DWATT_CELL = "70.0 ± 24.8 @0.1 ⚠ (dev 80.0) (n=3)"  # 0.1: the top of the grid


def _write_results(path: Path, runs: dict = RUNS) -> int:
    count = 0
    for method, (best, devs, tests) in runs.items():
        for lr in LRS:
            for trial in range(3):
                dev, test = (devs[trial], tests[trial]) if lr == best else (0.2, 0.1)
                cell = {"method": method, "regime": "fe", "shots": 8, "epochs": 25, "trial": trial, "lr": lr}
                record = {
                    **cell,
                    "key": f"{method}|{trial}|{lr}",
                    "setup": "s",
                    "dev_f1": dev,
                    "test_f1": test,
                }
                count += append_record(path, record)
    return count


def _sweep_entry(wall_s: float, peak: float, runs: int, completed: bool, load: float) -> dict:
    """A line of sweeps.jsonl: the keys the cost line reads (the sweep tests check what a sweep writes)."""
    entry = {"wall_s": wall_s, "peak_rss_mb": peak, "runs": runs, "completed": completed}
    return {**entry, "workers": 2, "threads": 1, "cpu_count": 2, "load_1min": load}


GRID = "methods: [none, dwatt]\nregimes: [fe]\nshots: [8]\nepochs: [25]\ntrials: 3\n"
PROSE_BEFORE = "# Results\n\nHand-written prose, kept as it is.\n\n"
PROSE_AFTER = "\nMore prose after the block.\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository root with one grid (``fake``), its 18 results and a stale RESULTS.md block."""
    (tmp_path / "benchmarks" / "grids").mkdir(parents=True)
    (tmp_path / "benchmarks" / "grids" / "fake.yaml").write_text(GRID + "output: benchmarks/results/fake\n")
    assert _write_results(tmp_path / "benchmarks" / "results" / "fake" / "results.jsonl") == 18
    block = "<!-- generated: fake -->\nstale table\n<!-- end generated: fake -->\n"
    (tmp_path / "benchmarks" / "RESULTS.md").write_text(PROSE_BEFORE + block + PROSE_AFTER)
    return tmp_path


def _markers(spec: str) -> str:
    """A block's begin and end marker lines."""
    return f"<!-- generated: {spec} -->\n<!-- end generated: {spec} -->\n"


def _run(repo: Path, *argv: str) -> int:
    return results_md.main(["--root", str(repo), *argv])


def _text(repo: Path) -> str:
    return (repo / "benchmarks" / "RESULTS.md").read_text()


def test_a_block_is_regenerated_from_its_grid_and_the_prose_is_kept(repo, capsys):
    assert _run(repo) == 0
    text = _text(repo)
    assert text.startswith(PROSE_BEFORE + "<!-- generated: fake -->\n") and "stale" not in text
    assert text.endswith("<!-- end generated: fake -->\n" + PROSE_AFTER)
    assert f"| fe | 25 | 8 | {NONE_CELL} | {DWATT_CELL} |" in text
    assert "- dwatt fe 25 epochs N=8: 0.1 of [0.001, 0.01, 0.1]" in text  # the edge flag
    assert "| fe | 25 | 8 | **+20.0 ± 0.0** |" in text  # paired: dwatt - none, 20 points every trial
    assert "18 runs in `benchmarks/results/fake/results.jsonl`; wall time not recorded" in text
    commands = "```\nlayerfusion sweep --config benchmarks/grids/fake.yaml\n"
    assert commands + "layerfusion plot benchmarks/results/fake/results.jsonl\n```\n" in text
    assert _run(repo, "--check") == 0  # regenerating again changes nothing
    assert "up to date" in capsys.readouterr().out


def test_the_cost_line_sums_the_logged_sweeps(repo):
    log = repo / "benchmarks" / "results" / "fake" / "sweeps.jsonl"
    for wall, peak, runs, completed, load in ((100.0, 900.0, 10, False, 1.5), (3700.4, 2560.0, 8, True, 2.3)):
        append_line(log, _sweep_entry(wall, peak, runs, completed, load))
    assert _run(repo) == 0
    line = next(line for line in _text(repo).splitlines() if line.startswith("18 runs in"))
    assert "wall time 1 h 03 min 20 s over 2 sweeps, 1 interrupted" in line  # 100 + 3700.4 s
    assert "peak RSS 2.5 GB" in line  # the larger of 900 and 2560 MB
    assert "workers 2, threads 1" in line and "up to 2.3 on 2 CPUs" in line
    assert "timed" not in line  # the logged sweeps ran all 18 runs
    log.write_text(log.read_text().splitlines()[0] + "\n")  # only the interrupted sweep logged
    assert _run(repo) == 0
    line = next(line for line in _text(repo).splitlines() if line.startswith("18 runs in"))
    assert "wall time 1 min 40 s over 1 sweep, 1 interrupted, peak RSS 900 MB" in line
    assert "(timed: 10 of the 18 runs; the others ran before sweeps were logged)" in line


def test_check_prints_a_diff_and_writes_nothing(repo, capsys):
    before = _text(repo)
    assert _run(repo, "--check") == 1
    captured = capsys.readouterr()
    assert "-stale table" in captured.out and f"+| fe | 25 | 8 | {NONE_CELL} | {DWATT_CELL} |" in captured.out
    assert "out of date" in captured.err
    assert _text(repo) == before
    assert _run(repo) == 0 and _run(repo, "--check") == 0
    _write_results(repo / "benchmarks" / "results" / "fake" / "results.jsonl", {"concat": RUNS["none"]})
    assert _run(repo, "--check") == 1  # new results make the file stale again
    assert "+| regime | epochs | shots | none | dwatt | concat |" in capsys.readouterr().out


def test_per_language_blocks_name_their_sweep_options(repo):
    (repo / "benchmarks" / "grids" / "wiki.yaml").write_text(GRID)  # no output: one per language
    results = repo / "benchmarks" / "results" / "wiki"
    _write_results(results / "de" / "results.jsonl")
    _write_results(results / "en" / "results.jsonl", {"none": (0.001, (0.3, 0.3, 0.3), (0.25, 0.25, 0.25))})
    blocks = "".join(
        _markers(f"wiki language={lang} output=benchmarks/results/wiki/{lang}") for lang in ("de", "en")
    )
    (repo / "benchmarks" / "RESULTS.md").write_text(blocks)
    assert _run(repo) == 0
    de, en = _text(repo).split("<!-- generated: wiki language=en")
    assert f"| {NONE_CELL} | {DWATT_CELL} |" in de and "25.0 ± 0.0" not in de
    assert "| fe | 25 | 8 | 25.0 ± 0.0 @0.001 ⚠ (dev 30.0) (n=3) |" in en and NONE_CELL not in en
    for lang, block in (("de", de), ("en", en)):
        output = f"benchmarks/results/wiki/{lang}"
        assert (
            f"layerfusion sweep --config benchmarks/grids/wiki.yaml --language {lang} --output {output}\n"
            in block
        )
        assert f"layerfusion plot {output}/results.jsonl\n" in block
    assert "9 runs in `benchmarks/results/wiki/en/results.jsonl`" in en


@pytest.mark.parametrize(
    "markers, message",
    [
        (_markers("nosuch"), "'generated: nosuch': no grid file benchmarks/grids/nosuch.yaml"),
        (_markers("wiki"), "'generated: wiki': benchmarks/grids/wiki.yaml has no output"),
        (_markers("fake output=out"), "'generated: fake output=out': no results in out/results.jsonl"),
        (
            _markers("fake bogus=1"),
            "'generated: fake bogus=1': not a `layerfusion sweep` option: ['--bogus', '1']",
        ),
        (_markers("fake shot=1"), "not a `layerfusion sweep` option: ['--shot', '1']"),  # not --shots
        (_markers("fake trials"), "'generated: fake trials': parameter 'trials' is not key=value"),
        (_markers("fake epochs=0"), "'generated: fake epochs=0': argument --epochs: must be an integer >= 1"),
        (_markers("bad"), "'generated: bad': while parsing"),  # the grid file is not valid YAML
        ("<!-- generated: fake -->\ntext\n", "'generated: fake' has no end marker"),
        ("<!-- generated: fake -->\n<!-- end generated: other -->\n", "'end generated: other' has no begin"),
        ("<!-- end generated: fake -->\n", "'end generated: fake' has no begin marker"),
    ],
)
def test_bad_markers_stop_with_one_line_naming_the_marker(repo, capsys, markers, message):
    (repo / "benchmarks" / "grids" / "wiki.yaml").write_text(GRID)
    (repo / "benchmarks" / "grids" / "bad.yaml").write_text("methods: [none\n")  # a YAML syntax error
    (repo / "benchmarks" / "RESULTS.md").write_text(PROSE_BEFORE + markers)
    assert _run(repo) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert _text(repo) == PROSE_BEFORE + markers  # nothing written


def test_a_marker_quoted_inside_prose_is_not_a_marker(repo):
    quoted = "Blocks start with `<!-- generated: NAME -->` on a line of their own.\n"
    (repo / "benchmarks" / "RESULTS.md").write_text(quoted)
    assert results_md.find_blocks(quoted) == []
    assert _run(repo, "--check") == 0
