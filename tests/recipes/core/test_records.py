"""The shared resume of every task (core.results.records): keys, the finished runs of a results file, and
run-or-resume appending each new run once."""

from __future__ import annotations

import json

from layerfusion_recipes.core.results.records import (
    fingerprint,
    finished_records,
    read_records,
    run_or_resume,
    unit_key,
)


def test_keys_name_the_cell_the_lr_and_the_settings():
    setup = fingerprint({"model": "/m", "epochs": 3})
    assert setup == fingerprint({"epochs": 3, "model": "/m"}) != fingerprint({"model": "/m", "epochs": 4})
    assert len(setup) == 12 and int(setup, 16) >= 0
    assert unit_key("dwatt|fe|0", 3e-5, setup) == f"dwatt|fe|0|lr=3e-05|{setup}"
    assert unit_key("dwatt|fe|0", 1, setup) == f"dwatt|fe|0|lr=1.0|{setup}"  # one spelling per LR


def test_the_finished_records_are_the_first_of_each_key_in_the_results_file(tmp_path):
    path = tmp_path / "results.jsonl"
    lines = [{"key": "a", "dev": 1.0}, {"key": "a", "dev": 9.0}, {"key": "c", "dev": 3.0}]
    torn = '{"key": "b", "dev"'  # a torn last line
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + torn)
    assert finished_records(path) == {"a": {"key": "a", "dev": 1.0}, "c": {"key": "c", "dev": 3.0}}
    assert finished_records(tmp_path / "missing.jsonl") == {}


def test_run_or_resume_runs_a_missing_key_once_and_appends_it(tmp_path):
    path, calls = tmp_path / "out" / "results.jsonl", []

    def run():
        calls.append(1)
        return {"dev_ppl": 20.0 + len(calls)}

    finished = {"old": {"key": "old", "dev_ppl": 5.0}}  # finished already (another process's)
    assert run_or_resume(path, finished, "old", run) == ({"key": "old", "dev_ppl": 5.0}, False)
    assert run_or_resume(path, finished, "new", run) == ({"dev_ppl": 21.0, "key": "new"}, True)
    assert run_or_resume(path, finished, "new", run) == ({"dev_ppl": 21.0, "key": "new"}, False)
    assert calls == [1] and read_records(path) == [{"dev_ppl": 21.0, "key": "new"}]  # old: not copied
    assert run_or_resume(path, finished_records(path), "new", run)[1] is False  # a new process resumes it


def test_lines_that_are_no_record_are_skipped_and_said_once_in_one_line(tmp_path, capsys):
    """Torn, not JSON, not UTF-8, a foreign object: skipped (a sweep runs them again), and said in one
    warning line naming the file and the line numbers; once per process, again only for new lines."""
    path = tmp_path / "results.jsonl"
    lines = [
        json.dumps({"key": "a", "dev": 1.0}).encode(),
        b"not json",
        json.dumps({"key": 5}).encode(),  # an object, but no record
        b"\xff\xfe{}",  # not UTF-8
        json.dumps({"key": "b", "dev": 2.0}).encode(),
        b'{"key": "c", "de',  # torn
    ]
    path.write_bytes(b"\n".join(lines))
    assert [r["key"] for r in read_records(path)] == ["a", "b"]
    assert finished_records(path).keys() == {"a", "b"}  # read again: said once
    warning = (
        f"layerfusion: warning: {path}:2,3,4,6: skipped 4 lines that are not complete records "
        "(torn, not JSON, or missing fields)"
    )
    assert capsys.readouterr().err.splitlines() == [warning]
    assert [r["key"] for r in read_records(path, lambda record: record["dev"] > 1)] == ["b"]
    more = warning.replace(":2,3,4,6: skipped 4", ":1,2,3,4,6: skipped 5")  # line 1 now skipped too
    assert capsys.readouterr().err.splitlines() == [more]
