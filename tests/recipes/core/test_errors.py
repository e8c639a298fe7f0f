"""User errors: one line naming what and where, exit code 2; ``--debug`` shows the traceback."""

from __future__ import annotations

import argparse
import sys

import pytest
from layerfusion_recipes.cli import main
from layerfusion_recipes.core.errors import DataSourceError, Terminated, UserError, run_command


def _ner(tmp_path, data) -> list[str]:
    return ["ner", "--model", str(tmp_path / "model"), "--data", str(data), "--output", str(tmp_path / "out")]


def _error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_missing_data_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    assert main([*_ner(tmp_path, missing), "--quiet"]) == 2
    assert _error_lines(capsys) == [f"layerfusion ner: error: --data '{missing}': no such file or directory"]


@pytest.mark.parametrize("position", ["before", "after"])
def test_debug_shows_the_traceback(tmp_path, position):
    argv = [*_ner(tmp_path, tmp_path / "nope.jsonl"), "--quiet"]
    argv = ["--debug", *argv] if position == "before" else [*argv, "--debug"]
    with pytest.raises(DataSourceError, match="no such file or directory"):
        main(argv)


def test_malformed_file_names_file_and_line(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text("EU\tB-ORG\nBob\tPERSON\n")
    assert main([*_ner(tmp_path, tmp_path / "data"), "--quiet"]) == 2
    (line,) = _error_lines(capsys)
    assert line == (
        f"layerfusion ner: error: {tmp_path / 'data' / 'train.txt'}, line 2: tag 'PERSON' is not O or "
        "B-/I-<type> (E-/S- of BIOES and L-/U- of BILOU are converted)"
    )


def test_yaml_syntax_error_is_one_line(tmp_path, capsys):
    config = tmp_path / "grid.yaml"
    config.write_text("shots: [8, 16\nepochs: 3\n")
    assert main(["sweep", "--config", str(config), "--quiet"]) == 2
    (line,) = _error_lines(capsys)
    assert line.startswith("layerfusion sweep: error: while parsing a flow sequence") and "line 1" in line


def test_mlm_folder_without_text_files(tmp_path, capsys):
    (tmp_path / "train.txt").write_text("text\n")
    assert main(["mlm", "--data", str(tmp_path)]) == 2
    assert _error_lines(capsys) == [
        f"layerfusion mlm: error: {tmp_path}: needs valid.txt and test.txt (train.txt optional), "
        "missing ['valid.txt', 'test.txt'], found ['train.txt']"
    ]


def test_bugs_keep_their_traceback():
    def broken(args):
        raise KeyError("bug")

    with pytest.raises(KeyError):
        run_command(broken, argparse.Namespace())
    assert run_command(lambda args: None, argparse.Namespace()) == 0
    assert run_command(lambda args: 3, argparse.Namespace()) == 3


@pytest.mark.parametrize(
    "error",
    [
        OSError("model is not a local folder and is not a valid model identifier"),
        PermissionError(13, "denied"),
    ],
)
def test_os_errors_are_user_errors(error, capsys):
    def fails(args):
        raise error

    assert run_command(fails, argparse.Namespace()) == 2
    assert capsys.readouterr().err == f"layerfusion: error: {error}\n"


def test_user_error_message_is_one_line(capsys):
    def fails(args):
        raise UserError("first\n  second")

    assert run_command(fails, argparse.Namespace(), prog="layerfusion x") == 2
    assert capsys.readouterr().err == "layerfusion x: error: first / second\n"


def test_sweep_worker_with_bad_data_fails_its_cell_instead_of_respawning(tmp_path, monkeypatch):
    from layerfusion_recipes.core import sweep
    from layerfusion_recipes.ner.experiment import Cell, ExperimentSettings

    monkeypatch.setattr(sweep, "_WORKER", None)
    sweep._init_worker(ExperimentSettings(model="m", data=str(tmp_path / "nope.jsonl")), threads=1)
    with pytest.raises(DataSourceError, match="nope.jsonl'?: no such file"):
        sweep._run_in_worker(Cell("none", "fe", 1, 1, 0))


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy of an imported module
def test_exit_code_of_the_command(tmp_path, monkeypatch, capsys):
    import runpy

    monkeypatch.setattr(sys, "argv", ["layerfusion", "mlm", "--data", str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit) as exit_info:  # the `python -m layerfusion_recipes.cli` entry, in-process
        runpy.run_module("layerfusion_recipes.cli", run_name="__main__")
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err
        == f"layerfusion mlm: error: --data '{tmp_path / 'nowhere'}': no such file or directory\n"
    )


def test_a_command_stopped_by_sigterm_exits_143_with_one_line(capsys):
    def stopped(args):
        raise Terminated("SIGTERM")

    assert run_command(stopped, argparse.Namespace(), prog="layerfusion sweep") == 143
    assert capsys.readouterr().err == "layerfusion sweep: stopped by SIGTERM\n"
