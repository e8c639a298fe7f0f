"""sweeps.jsonl: one line per sweep invocation, however it ends, written by the main process only."""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from layerfusion_recipes.core.errors import Terminated
from layerfusion_recipes.core.results.records import append_record, read_lines
from layerfusion_recipes.core.sweeps.sweep_log import (
    logged_sweep,
    peak_rss_mb,
    read_sweep_log,
    sweep_log_path,
    sweep_totals,
)

FIELDS = {"workers": 2, "threads": 1, "num_processes": 1, "argv": ["layerfusion", "sweep"], "config": None}


def test_a_normal_end_logs_times_memory_runs_and_load(tmp_path):
    results = tmp_path / "out" / "results.jsonl"
    append_record(results, {"key": "a"})  # finished by an earlier sweep
    append_record(results, {"key": "other grid"})
    with logged_sweep(results, {"a", "b", "c"}, {**FIELDS, "runs_planned": 3}):
        append_record(results, {"key": "b"})
    (line,) = read_sweep_log(results)
    assert sweep_log_path(results) == tmp_path / "out" / "sweeps.jsonl"
    assert line["completed"] is True and line["error"] is None
    assert (line["runs"], line["runs_total"], line["runs_planned"]) == (1, 2, 3)  # b now, a and b in all
    assert {k: line[k] for k in FIELDS} == FIELDS and line["results"] == str(results)
    start, end = datetime.fromisoformat(line["start"]), datetime.fromisoformat(line["end"])
    assert start.utcoffset().total_seconds() == 0 and start <= end
    assert 0 <= line["wall_s"] <= (end - start).total_seconds() + 1
    assert line["peak_rss_mb"] == max(line["peak_rss_self_mb"], line["peak_rss_children_mb"])
    assert line["peak_rss_self_mb"] <= peak_rss_mb()[0]
    status = Path("/proc/self/status")
    if status.exists():  # Linux: the kernel's own peak resident set, in kB
        peak_kb = int(re.search(r"VmHWM:\s+(\d+) kB", status.read_text())[1])
        assert line["peak_rss_self_mb"] == pytest.approx(peak_kb / 1024, rel=0.25)  # MB, not kB
    assert line["cpu_count"] == os.cpu_count() and line["load_1min"] >= 0


@pytest.mark.parametrize("exception", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_sweep_logs_its_line_and_the_exception_goes_on(tmp_path, exception):
    results = tmp_path / "results.jsonl"
    with pytest.raises(exception), logged_sweep(results, {"a", "b"}, FIELDS):
        append_record(results, {"key": "a"})
        raise exception
    (line,) = read_sweep_log(results)
    assert line["completed"] is False and line["error"] == exception.__name__ and line["runs"] == 1


def test_sigterm_ends_the_sweep_like_ctrl_c_and_the_line_says_so(tmp_path):
    results = tmp_path / "results.jsonl"
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), logged_sweep(results, {"a", "b"}, FIELDS):
        append_record(results, {"key": "a"})
        os.kill(os.getpid(), signal.SIGTERM)  # `kill PID` from outside
        time.sleep(30)  # interrupted by the handler's exception
    (line,) = read_sweep_log(results)
    assert line["completed"] is False and line["error"] == "SIGTERM" and line["runs"] == 1
    assert line["wall_s"] < 30
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the block's only


def test_a_sweep_refused_by_its_checks_before_its_first_run_logs_nothing_and_makes_no_folder(tmp_path):
    results = tmp_path / "out" / "results.jsonl"
    with pytest.raises(ValueError), logged_sweep(results, {"a"}, FIELDS, checks_first=True):
        raise ValueError("--data nowhere: no such file")  # before start.begin()
    assert not (tmp_path / "out").exists()
    with pytest.raises(RuntimeError), logged_sweep(results, {"a"}, FIELDS, checks_first=True) as start:
        start.begin()
        raise RuntimeError("in the first run")
    (line,) = read_sweep_log(results)
    assert line["completed"] is False and line["error"] == "RuntimeError"
    with logged_sweep(results, {"a"}, FIELDS, checks_first=True):
        pass  # ends normally without a run to start: logged
    assert [line["completed"] for line in read_sweep_log(results)] == [False, True]


def test_only_the_main_process_writes(tmp_path):
    results = tmp_path / "results.jsonl"
    with logged_sweep(results, {"a"}, FIELDS, enabled=False):
        append_record(results, {"key": "a"})
    assert not sweep_log_path(results).exists()


def test_totals_sum_wall_time_and_keep_the_largest_peak(tmp_path):
    results = tmp_path / "results.jsonl"
    for workers in (2, 1):
        with logged_sweep(results, {"a"}, {**FIELDS, "workers": workers}):
            pass
    lines = read_lines(sweep_log_path(results))
    totals = sweep_totals(lines)
    assert totals.sweeps == 2 and totals.interrupted == 0 and totals.workers == [1, 2]
    assert totals.wall_s == pytest.approx(sum(line["wall_s"] for line in lines))
    assert totals.peak_rss_mb == max(line["peak_rss_mb"] for line in lines)
    assert sweep_totals([]) is None
