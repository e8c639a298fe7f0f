"""User errors: one line naming what and where, exit code 2; ``--debug`` shows the traceback."""

from __future__ import annotations

import argparse
import sys

import pytest

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.engine.plan import SweepPlan
from layerfusion_recipes.core.errors import DataSourceError, Terminated, UserError, run_command


def _ner(tmp_path, data) -> list[str]:
    (tmp_path / "model").mkdir(exist_ok=True)  # there (a missing one is refused first), never read
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
        "B-/I-<type> (E-/S- of BIOES and L-/U- of BILOU are converted) like the other tags (e.g. 'B-ORG')"
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
    from layerfusion_recipes.core.sweeps import sweep
    from layerfusion_recipes.ner.experiment import Cell, NerSettings

    monkeypatch.setattr(sweep, "_WORKER", None)
    sweep._init_worker(NerSettings(model="m", data=str(tmp_path / "nope.jsonl")), SweepPlan(), threads=1)
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


CTRL_C_SCRIPT = """
import signal, sys, time
from layerfusion_recipes.cli import main
from layerfusion_recipes.ner.experiment import NerExperiment

def slow(self, cell, lrs, use_cache=None):
    print("training", flush=True)
    time.sleep(120)  # Ctrl-C arrives here
    yield from ()

NerExperiment.iter_lrs = slow
# Python's own Ctrl-C handler, as in a terminal (a shell's background job inherits SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_ends_a_sweep_in_one_line_with_exit_130(tmp_path):
    """SIGINT, as a terminal's Ctrl-C sends it: the sweep's log line is written, then one line on stderr
    and exit code 130 (128 + SIGINT), as SIGTERM ends in one line with 143; no traceback."""
    import json
    import signal
    import subprocess

    from conftest import write_tiny_model, write_toy_data

    model = write_tiny_model(tmp_path / "model")
    data = write_toy_data(tmp_path / "data", train=20, dev=4, test=4)
    argv = ["ner", "--model", model, "--data", data, "--methods", "none", "--shots", "2", "--epochs", "1"]
    argv += ["--trials", "1", "--lr", "0.03", "--no-cache", "--quiet", "--output", str(tmp_path / "out")]
    command = [sys.executable, "-c", CTRL_C_SCRIPT, *argv]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "training\n"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130
    assert "Traceback" not in err and err.splitlines()[-1] == "layerfusion ner: stopped by SIGINT (Ctrl-C)"
    (line,) = [json.loads(text) for text in (tmp_path / "out" / "sweeps.jsonl").read_text().splitlines()]
    assert (line["completed"], line["error"]) == (False, "KeyboardInterrupt")


def test_debug_shows_the_traceback_of_ctrl_c():
    def interrupted(args):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_command(interrupted, argparse.Namespace(), debug=True)
