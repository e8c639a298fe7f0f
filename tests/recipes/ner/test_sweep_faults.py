"""Fault injection and concurrency: a sweep killed with SIGKILL at several points, then resumed,
ends with the records of an uninterrupted sweep (none twice, no temp files); two sweeps on one
output write every key once; files with duplicates count each key once."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import write_tiny_model, write_toy_data

from layerfusion_recipes.core.results.cells import grid_cells
from layerfusion_recipes.core.results.records import append_record, read_records
from layerfusion_recipes.core.sweeps.sweep import run_cells
from layerfusion_recipes.core.sweeps.sweep_log import read_sweep_log
from layerfusion_recipes.ner.experiment import NerSettings
from layerfusion_recipes.reporting.plot import summarize

GRID = {"methods": ["none", "concat"], "regimes": ["fe"], "shots": [2, 3], "epochs": [2], "trials": 2}
VOLATILE = ("seconds", "pid")  # wall time and process id: the only fields allowed to differ


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    return NerSettings(
        model=write_tiny_model(root / "model"), data=write_toy_data(root / "data"), lr=[1e-2, 3e-2]
    )


def _sweep(settings: NerSettings, results: str) -> None:
    import torch

    torch.set_num_threads(1)
    run_cells(grid_cells(GRID), results, settings, progress=False)


def _lines(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _stable(records: list[dict]) -> dict[str, dict]:
    return {r["key"]: {k: v for k, v in r.items() if k not in VOLATILE} for r in records}


def test_sigkill_at_several_points_then_resume_equals_an_uninterrupted_sweep(tmp_path, settings):
    reference = tmp_path / "reference.jsonl"
    _sweep(settings, str(reference))
    expected = _stable(read_records(reference))
    assert len(expected) == 16  # 8 cells x 2 LRs

    results = tmp_path / "out" / "results.jsonl"
    context = multiprocessing.get_context("fork")  # a fresh interpreter per start would cost seconds
    kills = []
    for kill_after in (1, 6, 11):  # records on disk when the kill lands (mid-cell or between cells)
        process = context.Process(target=_sweep, args=(settings, str(results)))
        process.start()
        deadline = time.monotonic() + 60
        while _lines(results) < kill_after and process.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        kills.append(_lines(results))
    assert kills[0] < 16 and kills == sorted(kills)  # every kill interrupted a sweep with work left
    _sweep(settings, str(results))  # the final resume

    lines = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    assert len(lines) == len({line["key"] for line in lines}) == 16  # none twice, none torn
    assert _stable(read_records(results)) == expected  # the same records as without interruption
    assert os.listdir(results.parent) == ["results.jsonl"]  # no temp files left behind


def test_sigterm_stops_a_sweep_and_its_workers_and_the_sweep_logs_itself(tmp_path, settings):
    results = tmp_path / "out" / "results.jsonl"
    command = [sys.executable, "-m", "layerfusion_recipes.cli", "sweep", "--model", settings.model]
    command += ["--data", settings.data, "--lr", "1e-2", "3e-2", "--methods", "none", "concat"]
    command += ["--regimes", "fe", "--shots", "2", "3", "--epochs", "30", "--trials", "2"]
    command += ["--output", str(results.parent), "--workers", "2", "--threads", "1", "--quiet"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while _lines(results) < 1 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, process.stderr.read()  # still running, with work left
    pgrep = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True)
    workers = [int(pid) for pid in pgrep.stdout.split()]
    assert len(workers) >= 2  # the pool (and multiprocessing's resource tracker)
    process.send_signal(signal.SIGTERM)  # the parent only, as `kill PID` does
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143 and stderr.strip().endswith("layerfusion sweep: stopped by SIGTERM")
    (line,) = read_sweep_log(results)
    assert line["completed"] is False and line["error"] == "SIGTERM"
    assert 1 <= line["runs"] == line["runs_total"] < 16
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)  # the workers went with it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _append_all(path: str, records: list[dict]) -> None:
    for record in records:
        append_record(path, record)


def test_concurrent_writers_keep_one_record_per_key(tmp_path):
    path = tmp_path / "r.jsonl"
    records = [{"key": f"k{i}", "best_f1": i / 100} for i in range(60)]
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_append_all, args=(str(path), records)) for _ in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 60 and {json.loads(line)["key"] for line in lines} == {r["key"] for r in records}
    assert append_record(path, records[0]) is False and len(path.read_text().splitlines()) == 60


def test_two_sweeps_on_one_output_write_each_record_once(tmp_path, settings):
    results = tmp_path / "results.jsonl"
    context = multiprocessing.get_context("fork")
    sweeps = [context.Process(target=_sweep, args=(settings, str(results))) for _ in range(2)]
    for sweep in sweeps:
        sweep.start()
    for sweep in sweeps:
        sweep.join()
    assert [sweep.exitcode for sweep in sweeps] == [0, 0]
    keys = [json.loads(line)["key"] for line in results.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 16


def test_a_file_with_duplicate_keys_counts_each_once(tmp_path):
    path = tmp_path / "r.jsonl"
    record = {"key": "a", "setup": "s", "method": "none", "regime": "fe", "shots": 2, "epochs": 1, "trial": 0}
    with open(path, "w") as handle:  # written without the lock (by hand, or two copies joined)
        for f1 in (0.2, 0.9, 0.9):
            handle.write(json.dumps({**record, "dev_f1": f1}) + "\n")
        handle.write(json.dumps({**record, "key": "b", "trial": 1, "dev_f1": 0.4}) + "\n")
    records = read_records(path)
    assert [r["dev_f1"] for r in records] == [0.2, 0.4]  # the first record of each key
    (row,) = summarize(records)
    assert row["n"] == 2 and row["mean"] == pytest.approx(30.0)
