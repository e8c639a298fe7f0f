"""`layerfusion ner|sweep|plot|mlm`: help for every option, smoke runs on a tiny random model."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys

import pytest
from conftest import write_tiny_model, write_toy_data

from layerfusion_recipes.cli import COMMANDS, build_parser, main
from layerfusion_recipes.core.options.grids import DEFAULT_LR_GRIDS
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.core.sweeps.sweep_log import read_sweep_log
from layerfusion_recipes.ner.experiment import NerExperiment

RECIPES = tuple(COMMANDS)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", RECIPES)
def test_every_option_has_help(name, capsys):
    parser = _subparsers()[name]
    for action in parser._actions:
        assert action.help and len(action.help) > 10, (name, action.dest)
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage: layerfusion " + name in capsys.readouterr().out


def test_help_imports_no_heavy_library():
    """`layerfusion --help` and every `layerfusion COMMAND --help` build their parsers from the
    standard library alone: torch, transformers and peft load only when a command runs."""
    script = (
        "import sys\n"
        "from layerfusion_recipes.cli import build_parser\n"
        "build_parser()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'peft', 'peft_layerfusion', 'datasets') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_method_is_one_line_with_the_allowed_names(capsys):
    assert main(["ner", "--methods", "dwat", "--model", "m", "--data", "d", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "layerfusion ner: error: --methods: unknown ['dwat']; allowed: "
        + ", ".join(
            ["none", "dwatt", "concat", "average", "scalar_mix", "scaled_dwatt", "layer_mix", "extra_layers"]
            + ["probe_ensemble", "stacked", "joint_probe", "joint_ensemble"]  # few-shot read-outs (Concat)
        )
    ]


def test_methods_lists_every_registered_type_and_what_it_is(capsys):
    from peft_layerfusion.registration import BASELINE_TYPES, METHODS

    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [m.name for m in METHODS] + [name for name, *_ in BASELINE_TYPES] + ["none"]
    assert [line.split()[0] for line in lines[1:]] == names  # bitfit included
    peft_types = [m.peft_type for m in METHODS] + [name.upper() for name, *_ in BASELINE_TYPES]
    assert [line.split()[1] for line in lines[1:-1]] == peft_types  # a preset: its method's type
    bitfit = next(line for line in lines if line.startswith("bitfit"))
    assert "train the base model's bias terms only" in bitfit
    assert "depth-wise attention over every block's output" in lines[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    return write_tiny_model(root / "model"), write_toy_data(root / "data", train=30, dev=8, test=8)


def test_ner_smoke_run_writes_results_table_and_figures(tiny, tmp_path, capsys, monkeypatch):
    model, data = tiny
    argv = [
        "ner",
        "--model",
        model,
        "--data",
        data,
        "--methods",
        "none",
        "dwatt",
        "--shots",
        "2",
        "--epochs",
        "2",
        "--trials",
        "2",
        "--lr",
        "0.03",
        "--output",
        str(tmp_path),
        "--quiet",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| regime | epochs | shots | none | dwatt |" in out and "(n=2)" in out
    assert [r["task"] for r in read_records(tmp_path / "results.jsonl")] == ["ner"] * 4
    for name in ("table.md", "f1_vs_shots.png", "dev_curves.png", "dwatt_attention.png"):
        assert (tmp_path / name).stat().st_size > 0

    def no_cache(self):
        raise AssertionError("a finished sweep built the feature cache")

    monkeypatch.setattr(NerExperiment, "_cache_object", no_cache)
    assert main(argv) == 0  # resumed: nothing to run, no feature cache built
    assert len(read_records(tmp_path / "results.jsonl")) == 4
    assert main(["plot", str(tmp_path / "results.jsonl"), "--output", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "f1_vs_shots.png").exists()


def test_each_task_has_its_own_output_and_a_results_file_holds_one_task(tiny, tmp_path, capsys):
    """`ner` (and `sweep`) and `classify` never share a results file by default, and a sweep refuses
    a file holding another task's records, in one line, before any run."""
    from layerfusion_recipes.classify.settings import resolve as resolve_classify
    from layerfusion_recipes.ner.settings import resolve as resolve_ner

    model, data = tiny
    base = ["--model", model, "--data", data]
    assert resolve_ner(build_parser().parse_args(["ner", *base]))[1]["output"] == "layerfusion-results/ner"
    assert resolve_ner(build_parser().parse_args(["sweep", *base]))[1]["output"] == "layerfusion-results/ner"
    classify = resolve_classify(build_parser().parse_args(["classify", *base]))[1]
    assert classify["results"] == "layerfusion-results/classify/results.jsonl"
    assert build_parser().parse_args(["mlm", "--data", data]).output == "layerfusion-results/mlm"
    results = tmp_path / "results.jsonl"
    record = {"key": "none|fe|2|1|0|lr=0.03|s", "method": "none", "regime": "fe", "shots": 2, "epochs": 1}
    results.write_text(json.dumps({**record, "trial": 0, "dev_f1": 0.5, "task": "ner"}) + "\n")  # ner's
    assert main(["classify", *base, "--results", str(results), "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"layerfusion classify: error: {results} holds records of ner (1 record), not classify: a results "
        "file holds one task's records; give classify its own --output (or --results)"
    ]
    assert len(results.read_text().splitlines()) == 1 and not (tmp_path / "sweeps.jsonl").exists()


def test_sweep_from_yaml(tiny, tmp_path, capsys):
    model, data = tiny
    config = tmp_path / "grid.yaml"
    config.write_text(
        f"model: {model}\ndata: {data}\nmethods: [average]\nshots: [2, 3]\nepochs: [1]\ntrials: 1\n"
    )
    assert main(["sweep", "--config", str(config), "--results", str(tmp_path / "r.jsonl"), "--quiet"]) == 0
    records = read_records(tmp_path / "r.jsonl")  # no lr given: the FE regime's default grid
    size = len(DEFAULT_LR_GRIDS["fe"])
    assert sorted(r["shots"] for r in records) == [2] * size + [3] * size
    assert sorted({r["lr"] for r in records}) == list(DEFAULT_LR_GRIDS["fe"])
    assert "average" in capsys.readouterr().out


def test_each_sweep_invocation_logs_one_line_however_it_ends(tiny, tmp_path, monkeypatch):
    model, data = tiny
    config = tmp_path / "grid.yaml"
    config.write_text(
        f"model: {model}\ndata: {data}\nmethods: [none]\nshots: [2, 3]\nepochs: [1]\ntrials: 1\nlr: 0.03\n"
        f"output: {tmp_path / 'out'}\n"
    )
    argv = ["sweep", "--config", str(config), "--quiet"]
    monkeypatch.setattr(sys, "argv", ["layerfusion", *argv])
    run = NerExperiment.run  # one LR per cell: each cell is one run
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C during the second cell
        return run(self, *args, **kwargs)

    monkeypatch.setattr(NerExperiment, "run", interrupted)
    assert main(argv) == 130  # Ctrl-C: one line, 128 + SIGINT
    assert len(calls) == 2
    monkeypatch.setattr(NerExperiment, "run", run)
    assert main(argv) == 0  # resumes: the second cell only
    results = tmp_path / "out" / "results.jsonl"
    assert len(read_records(results)) == 2
    first, second = read_sweep_log(results)
    assert (first["completed"], first["error"]) == (False, "KeyboardInterrupt")
    assert (second["completed"], second["error"]) == (True, None)
    assert (first["runs"], first["runs_total"], second["runs"], second["runs_total"]) == (1, 1, 1, 2)
    for line in first, second:
        assert line["argv"] == ["layerfusion", *argv] and line["config"] == str(config)
        assert (line["workers"], line["threads"], line["num_processes"], line["runs_planned"]) == (1, 1, 1, 2)
        assert line["peak_rss_mb"] == max(line["peak_rss_self_mb"], line["peak_rss_children_mb"]) > 0
        assert line["wall_s"] > 0 and line["results"] == str(results)


def test_missing_paths_are_one_line_before_the_library_is_imported(tmp_path):
    """The light checks of the command line: a missing path answers at once, torch never imported."""
    missing = str(tmp_path / "nowhere")
    script = (
        "import sys\n"
        "from layerfusion_recipes.cli import main\n"
        f"codes = [main(argv) for argv in {ARGVS!r}]\n".replace("MISSING", missing)
        + "print(codes, sorted({'torch', 'transformers', 'peft'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"{[2] * len(ARGVS)} []"
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"layerfusion ner: error: --data '{missing}': no such file or directory",
        f"layerfusion sweep: error: --config '{missing}': no such file",
        f"layerfusion mlm: error: --data '{missing}': no such file or directory",
        f"layerfusion seq2seq: error: --train-file '{missing}': no such file or directory",
        "layerfusion seq2seq: error: give --data DIR (valid.txt, test.txt) or --train-file and --test-file",
        f"layerfusion audit: error: CONFIG '{missing}': no such file or directory",
        f"layerfusion plot: error: '{missing}': no such results file",
        f"layerfusion ner: error: --model '{missing}': no such model folder or file",
        f"layerfusion classify: error: --model '{missing}.gguf': no such GGUF file",
    ]


def test_a_missing_relative_model_folder_is_one_line_not_a_hub_name(tmp_path):
    """``runs/minilm`` beside a ``runs/`` folder is a path (not the Hub's owner/name): said at once."""
    (tmp_path / "runs").mkdir()
    script = "from layerfusion_recipes.cli import main\nprint(main(['ner', '--model', 'runs/minilm']))\n"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path, timeout=60
    )
    assert result.stdout.strip() == "2"
    message = "layerfusion ner: error: --model 'runs/minilm': no such model folder or file"
    assert result.stderr.splitlines() == [message]


ARGVS = [
    ["ner", "--data", "MISSING"],
    ["sweep", "--config", "MISSING"],
    ["mlm", "--data", "MISSING"],
    ["seq2seq", "--train-file", "MISSING", "--test-file", "MISSING"],
    ["seq2seq"],
    ["audit", "MISSING"],
    ["plot", "MISSING"],
    ["ner", "--model", "MISSING"],
    ["classify", "--data", "sst2", "--model", "MISSING.gguf"],
]


def _grid_of(argv: list[str]) -> tuple[dict, int]:
    from layerfusion_recipes.core.results.cells import grid_cells, planned_runs
    from layerfusion_recipes.ner.settings import resolve

    settings, grid = resolve(build_parser().parse_args(["ner", *argv]))
    axes = {name: grid[name] for name in ("methods", "regimes", "shots", "epochs", "trials")}
    return {**axes, "eval_every": settings.eval_every}, planned_runs(grid_cells(grid), settings)


def test_your_data_gets_a_small_default_grid_and_the_papers_is_behind_an_option(tiny, tmp_path, capsys):
    from layerfusion_recipes.ner.experiment import NerSettings, check_sample_sizes

    model, data = tiny
    axes, runs = _grid_of(["--model", model, "--data", data])
    methods = ["none", "extra_layers", "concat", "dwatt"]
    small = {
        "methods": methods,
        "regimes": ["fe"],
        "shots": [2, 8],
        "epochs": [25],
        "trials": 3,
        "eval_every": 5,
    }
    assert axes == small
    assert runs == 4 * 2 * 1 * 3 * len(DEFAULT_LR_GRIDS["fe"]) == 168  # was the paper's 2,800
    settings = NerSettings(model=model, data=data)
    check_sample_sizes(settings, axes["shots"], 30, 3)  # a 30-sentence train split gives both (was: 32)
    axes, runs = _grid_of(["--model", model, "--data", data, "--paper-grid"])
    paper = ([8, 16, 32, 64, 128], [25, 50, 75, 100], 5, 1, 2800)
    assert (axes["shots"], axes["epochs"], axes["trials"], axes["eval_every"], runs) == paper
    axes, _ = _grid_of(["--model", model, "--data", data, "--paper-grid", "--shots", "8", "--trials", "2"])
    assert (axes["shots"], axes["epochs"], axes["trials"]) == ([8], [25, 50, 75, 100], 2)  # flags win
    config = tmp_path / "grid.yaml"
    config.write_text(f"model: {model}\ndata: {data}\npaper_grid: true\nepochs: [25]\n")
    axes, _ = _grid_of(["--config", str(config)])
    assert (axes["shots"], axes["epochs"], axes["trials"]) == ([8, 16, 32, 64, 128], [25], 5)


def test_help_gives_each_grid_default(capsys):
    with pytest.raises(SystemExit):
        main(["ner", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--shots" in text and "Default: 2 8 (demo: 2 8; --paper-grid: 8 16 32 64 128)." in text
    assert "Max epochs. Default: 25 (demo: 15; --paper-grid: 25 50 75 100)." in text
    assert "new seed and sample. Default: 3 (demo: 3; --paper-grid: 5)." in text
    assert "the best dev score is reported. Default: 5 (demo: 3; --paper-grid: 1)." in text
    assert "--paper-grid The paper's grid" in text
    assert (
        "3e-05 0.0001 0.0003 0.001; adapter_seqbn" in text
        and "the demo: none 0.003 0.01 0.03 0.1 0.3; extra_layers 0.0003 0.001 0.003;" in text
    )


def test_a_command_does_not_print_the_bitsandbytes_kernels_warning(caplog):
    """bitsandbytes logs a warning at `import peft` on CPUs with AVX512-BF16 (it asks for `kernels`, a Hub
    download); a command raises that logger to errors, and no other."""
    quiet, other = logging.getLogger("bitsandbytes.backends.cpu.ops"), logging.getLogger("bitsandbytes.other")
    before = quiet.level
    try:
        quiet.setLevel(logging.NOTSET)
        assert main(["methods"]) == 0
        with caplog.at_level(logging.WARNING):
            quiet.warning("Failed to load CPU gemm_4bit_forward from kernels-community")
            other.warning("still shown")
        assert [r.getMessage() for r in caplog.records] == ["still shown"]
    finally:
        quiet.setLevel(before)
