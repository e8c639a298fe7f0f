"""Masked LM recipe: splits without a train file, masking, smoke runs that lower perplexity, the LR
grid (one record per LR in results.jsonl, resumed only under the same settings) and its selection on
dev, and the summary of a grid and its seeds."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from conftest import write_tiny_model

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.options.grids import DEFAULT_MLM_LR_GRIDS
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.mlm import command as mlm_command
from layerfusion_recipes.mlm import experiment as mlm
from layerfusion_recipes.mlm.experiment import load_text_splits, make_blocks, mask_tokens
from layerfusion_recipes.mlm.records import (
    SELECTION_RULE,
    folder_grids,
    read_mlm_records,
    run_key,
    summarize,
)
from layerfusion_recipes.mlm.results import mlm_summary
from layerfusion_recipes.mlm.settings import MlmSettings

TEXT = " = Heading = \n\n" + "\n".join(
    "alice went to paris and bob met alice in london today ." for _ in range(60)
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlm")
    (root / "wt").mkdir()
    (root / "wt" / "valid.txt").write_text(TEXT)
    (root / "wt" / "test.txt").write_text(TEXT)
    return write_tiny_model(root / "model"), str(root / "wt")


def test_without_train_split_valid_is_cut_and_said(tiny):
    splits = load_text_splits(tiny[1], holdout=0.1)
    assert (len(splits.train), len(splits.valid), len(splits.test)) == (55, 6, 61)
    assert "no train split" in splits.note and "test.txt" in splits.note


def test_blocks_and_bert_masking(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny[0])
    blocks = make_blocks(tokenizer, ["alice went to paris"] * 40, block_size=10)
    assert blocks.shape == (20, 10)  # 160 tokens, 8 per block
    assert (blocks[:, 0] == tokenizer.cls_token_id).all()
    inputs, labels = mask_tokens(blocks, tokenizer, 0.5, torch.Generator().manual_seed(0))
    chosen = labels != -100
    assert not chosen[:, 0].any() and not chosen[:, -1].any()  # specials never predicted
    assert 0.4 < chosen[:, 1:-1].float().mean() < 0.6
    assert (labels[chosen] == blocks[chosen]).all() and (inputs[~chosen] == blocks[~chosen]).all()
    masked = (inputs[chosen] == tokenizer.mask_token_id).float().mean()
    assert 0.65 < masked < 0.95


def _argv(tiny, output, *extra: str) -> list[str]:
    model, data = tiny
    return ["mlm", "--model", model, "--data", data, "--block-size", "16", "--output", str(output), *extra]


def _read(path) -> dict:
    return json.loads(path.read_text())


def _runs(output, method: str = "dwatt", regime: str = "fe") -> dict[float, dict]:
    """The records of ``output``'s results file of (method, regime) by LR (the last one of an LR)."""
    return {
        record["lr"]: record
        for record in read_records(output / "results.jsonl")
        if (record["method"], record["regime"]) == (method, regime)
    }


def _summary(output, method: str = "dwatt", regime: str = "fe") -> dict:
    """The summary of (method, regime) that ``layerfusion report`` makes of ``output``'s records."""
    return summarize(folder_grids(read_mlm_records(output))[0][method, regime])


def test_mlm_cli_trains_every_lr_and_selects_on_dev(tiny, tmp_path, capsys):
    assert main(_argv(tiny, tmp_path, "--method", "dwatt", "--epochs", "3", "--lr", "0.01", "1e-4")) == 0
    out = capsys.readouterr().out
    assert "no train split" in out and "test perplexity" in out
    runs = _runs(tmp_path)
    assert sorted(runs) == [1e-4, 1e-2] and sorted(os.listdir(tmp_path)) == ["results.jsonl"]
    for record in runs.values():
        assert record["key"] == run_key(record["settings"])
        assert record["head_modules"] == ["cls"] and "no train split" in record["data"]
        curve = [point["valid_ppl"] for point in record["curve"]]
        assert record["dev_ppl"] == record["best_valid_ppl"] == min(curve)
        assert math.isfinite(record["test_ppl"])
    fast = runs[0.01]
    assert fast["test_ppl"] < 20 < 76  # vocabulary of 76: chance ~76
    assert fast["dev_ppl"] < fast["curve"][0]["valid_ppl"]
    summary = _summary(tmp_path)
    best = min(runs.values(), key=lambda record: record["dev_ppl"])
    assert (summary["selected_lr"], summary["dev_ppl"], summary["test_ppl"]) == (
        best["lr"],
        best["dev_ppl"],
        best["test_ppl"],
    )
    assert summary["lrs"] == [1e-4, 1e-2] and summary["at_edge"]
    assert "no train split" in summary["data"]


def test_a_run_in_a_grid_equals_the_lone_run_at_its_lr(tiny, tmp_path, capsys):
    """Same seed, data and masks for every LR: the grid around a run does not change it."""
    main(_argv(tiny, tmp_path / "grid", "--epochs", "2", "--lr", "1e-4", "0.01"))
    main(_argv(tiny, tmp_path / "lone", "--epochs", "2", "--lr", "0.01"))
    in_grid, lone = (_runs(tmp_path / name)[0.01] for name in ("grid", "lone"))
    assert in_grid["curve"] == lone["curve"] and in_grid["test_ppl"] == lone["test_ppl"]


def test_changed_epochs_train_a_new_record(tiny, tmp_path, capsys):
    main(_argv(tiny, tmp_path, "--epochs", "1", "--lr", "0.01"))
    assert len(_runs(tmp_path)[0.01]["curve"]) == 1
    main(_argv(tiny, tmp_path, "--epochs", "2", "--lr", "0.01"))
    records = read_records(tmp_path / "results.jsonl")
    assert [len(record["curve"]) for record in records] == [1, 2]  # the old record stays, keyed apart
    assert records[0]["key"] != records[1]["key"] and records[1]["settings"]["epochs"] == 2
    assert _summary(tmp_path)["settings"]["epochs"] == 2


# Fake runs: (dev perplexity, test perplexity) by LR. The lowest test perplexity is never at the
# lowest dev perplexity, so a selection that looked at test would pick another LR.
PERPLEXITIES = {1e-4: (30.0, 10.0), 1e-3: (20.0, 40.0), 1e-2: (25.0, 5.0), 3e-2: (20.0, 1.0)}


@pytest.fixture
def fake_runs(monkeypatch):
    """``train_at_lr`` replaced by a table lookup; returns the (lr, epochs) of every run started."""
    calls = []

    def fake_train(settings, data, lr):
        calls.append((lr, settings.epochs))
        return mlm.run_record(settings, lr, *PERPLEXITIES.get(lr, (50.0, 50.0)), data.note)

    monkeypatch.setattr(mlm, "train_at_lr", fake_train)
    return calls


@pytest.fixture
def summaries(monkeypatch):
    """The summary each ``layerfusion mlm`` invocation selected (``run_mlm``'s), in order."""
    found = []
    run_mlm = mlm.run_mlm

    def recorded(*args, **kwargs):
        found.append(run_mlm(*args, **kwargs))
        return found[-1]

    monkeypatch.setattr(mlm_command, "run_mlm", recorded)
    return found


def test_selection_takes_the_lowest_dev_perplexity_and_never_test(
    tiny, tmp_path, fake_runs, summaries, capsys
):
    assert main(_argv(tiny, tmp_path, "--lr", "1e-4", "1e-3", "1e-2")) == 0
    (summary,) = summaries
    assert summary["selected_lr"] == 1e-3  # dev 20 (test 40); test is lowest at 1e-2 (5) and 1e-4 (10)
    assert (summary["dev_ppl"], summary["test_ppl"], summary["at_edge"]) == (20.0, 40.0, False)
    assert _summary(tmp_path) == summary  # the report selects the same from the records
    captured = capsys.readouterr()
    assert "lr 0.001 selected on dev" in captured.out.splitlines()[-1] and "warning" not in captured.err
    assert str(tmp_path / "results.jsonl") in captured.out.splitlines()[-1]


def test_summary_and_record_content(tiny, tmp_path, fake_runs, summaries, capsys):
    assert main(_argv(tiny, tmp_path, "--lr", "1e-2", "1e-4", "1e-3", "--epochs", "2", "--seed", "3")) == 0
    (summary,) = summaries
    assert summary == {
        "method": "dwatt",
        "regime": "fe",
        "model": tiny[0],
        "selected_lr": 1e-3,
        "dev_ppl": 20.0,
        "test_ppl": 40.0,
        "at_edge": False,
        "lrs": [1e-4, 1e-3, 1e-2],
        "runs": [
            {"lr": 1e-4, "dev_ppl": 30.0, "test_ppl": 10.0},
            {"lr": 1e-3, "dev_ppl": 20.0, "test_ppl": 40.0},
            {"lr": 1e-2, "dev_ppl": 25.0, "test_ppl": 5.0},
        ],
        "selection": SELECTION_RULE,
        "data": summary["data"],
        "settings": {
            "model": os.path.realpath(tiny[0]),
            "data": os.path.realpath(tiny[1]),
            "holdout": 0.1,
            "method": "dwatt",
            "regime": "fe",
            "epochs": 2,
            "batch_size": 8,
            "block_size": 16,
            "mlm_probability": 0.15,
            "max_train_blocks": None,
            "max_eval_blocks": None,
            "head_modules": None,
            "seed": 3,
        },
    }
    assert "no train split" in summary["data"]
    runs = _runs(tmp_path)
    assert list(runs) == [1e-4, 1e-3, 1e-2]  # appended as they ran: the grid's LRs ascending
    for run in summary["runs"]:  # every run's record is there, with its settings, key, LR and cost
        record = runs[run["lr"]]
        assert record["settings"] == {**summary["settings"], "lr": run["lr"]}
        assert record["key"] == run_key(record["settings"])
        assert record["key"].startswith(f"dwatt|fe|3|lr={run['lr']!r}|")
        assert (record["dev_ppl"], record["test_ppl"]) == (run["dev_ppl"], run["test_ppl"])
        assert record["seconds"] >= 0 and record["peak_rss_mb"] > 10  # this process holds torch
        assert record["threads"] == torch.get_num_threads() and record["cpu_count"] == os.cpu_count()
        assert record["load_1min"] >= 0


def test_selected_lr_at_the_edge_is_flagged_and_warned(tiny, tmp_path, fake_runs, summaries, capsys):
    main(_argv(tiny, tmp_path, "--lr", "1e-3", "1e-2"))  # dev 20 at 1e-3, 25 at 1e-2
    assert summaries[-1]["selected_lr"] == 1e-3 and summaries[-1]["at_edge"]
    assert "warning: the selected lr 0.001 is the smallest of the grid" in capsys.readouterr().err
    main(_argv(tiny, tmp_path, "--lr", "1e-3"))  # one LR: nothing to select, no edge
    assert not summaries[-1]["at_edge"] and summaries[-1]["lrs"] == [1e-3]
    assert "warning" not in capsys.readouterr().err


def test_dev_ties_go_to_the_smaller_lr_and_diverged_runs_rank_last():
    def record(lr, dev, test):
        settings = {"lr": lr}
        return {"lr": lr, "dev_ppl": dev, "test_ppl": test, "method": "none", "regime": "ft", "model": "m",
                "data": "d", "settings": settings}  # fmt: skip

    tie = summarize([record(3e-2, 20.0, 1.0), record(1e-3, 20.0, 9.0), record(1e-2, 25.0, 1.0)])
    assert (tie["selected_lr"], tie["lrs"], tie["at_edge"]) == (1e-3, [1e-3, 1e-2, 3e-2], True)
    diverged = summarize([record(1e-4, math.nan, 1.0), record(1e-3, 30.0, 9.0), record(1e-2, math.inf, 1.0)])
    assert diverged["selected_lr"] == 1e-3
    with pytest.raises(
        ValueError, match=r"one \(method, regime\) grid, got \[\('none', 'ft'\), \('none', 'fe'\)\]"
    ):
        summarize([record(1e-3, 20.0, 1.0), {**record(1e-2, 20.0, 1.0), "regime": "fe"}])


def test_default_grid_is_the_regimes(tiny, tmp_path, fake_runs, summaries, capsys):
    main(_argv(tiny, tmp_path, "--regime", "lora"))
    assert [lr for lr, _ in fake_runs] == list(DEFAULT_MLM_LR_GRIDS["lora"])
    assert summaries[0]["lrs"] == list(DEFAULT_MLM_LR_GRIDS["lora"]) == sorted(_runs(tmp_path, regime="lora"))


def test_finished_runs_are_skipped_and_a_new_lr_runs_alone(
    tiny, tmp_path, fake_runs, summaries, monkeypatch, capsys
):
    main(_argv(tiny, tmp_path, "--lr", "1e-4", "1e-3"))
    assert fake_runs == [(1e-4, 3), (1e-3, 3)]
    results = (tmp_path / "results.jsonl").read_text()
    prepare_data = mlm.prepare_data
    monkeypatch.setattr(mlm, "prepare_data", None)  # nothing to run: the data are not even loaded
    capsys.readouterr()
    main(_argv(tiny, tmp_path, "--lr", "1e-4", "1e-3"))
    assert len(fake_runs) == 2 and (tmp_path / "results.jsonl").read_text() == results  # nothing appended
    assert summaries[1] == summaries[0]
    assert capsys.readouterr().out.count("finished earlier with these settings, skipped") == 2
    monkeypatch.setattr(mlm, "prepare_data", prepare_data)
    main(_argv(tiny, tmp_path, "--lr", "1e-4", "1e-3", "1e-2"))
    assert fake_runs[2:] == [(1e-2, 3)]  # the grid is not part of a run's settings
    assert summaries[2]["lrs"] == [1e-4, 1e-3, 1e-2] and len(_runs(tmp_path)) == 3


def test_a_grid_killed_midway_resumes_only_the_missing_lr(tiny, tmp_path, fake_runs, monkeypatch, capsys):
    main(_argv(tiny, tmp_path, "--lr", "1e-4", "1e-3"))
    fake_train = mlm.train_at_lr

    def killed_at_the_second_lr(settings, data, lr):
        if lr == 1e-3:
            raise KeyboardInterrupt
        return fake_train(settings, data, lr)

    monkeypatch.setattr(mlm, "train_at_lr", killed_at_the_second_lr)
    assert main(_argv(tiny, tmp_path, "--lr", "1e-4", "1e-3", "--epochs", "2")) == 130  # Ctrl-C
    epochs = [record["settings"]["epochs"] for record in read_records(tmp_path / "results.jsonl")]
    assert epochs == [3, 3, 2]  # the finished LR of the killed grid is on disk, the other is not
    monkeypatch.setattr(mlm, "train_at_lr", fake_train)
    main(_argv(tiny, tmp_path, "--lr", "1e-4", "1e-3", "--epochs", "2"))
    assert fake_runs == [(1e-4, 3), (1e-3, 3), (1e-4, 2), (1e-3, 2)]  # resumed: the missing LR only
    summary = _summary(tmp_path)
    assert summary["settings"]["epochs"] == 2 and (summary["selected_lr"], summary["dev_ppl"]) == (1e-3, 20.0)


@pytest.mark.parametrize(
    "option, value, setting",
    [
        ("--epochs", "2", 2),
        ("--seed", "1", 1),
        ("--batch-size", "4", 4),
        ("--block-size", "12", 12),
        ("--max-eval-blocks", "3", 3),
        ("--max-train-blocks", "5", 5),
        ("--mlm-probability", "0.2", 0.2),
        ("--holdout", "0.2", 0.2),
        ("--head-modules", "cls", ["cls"]),
    ],
)
def test_a_changed_setting_reruns_instead_of_serving_the_stale_record(
    tiny, tmp_path, fake_runs, summaries, capsys, option, value, setting
):
    main(_argv(tiny, tmp_path, "--lr", "1e-4", "1e-3", "--epochs", "1"))
    assert len(fake_runs) == 2
    with_option = _argv(tiny, tmp_path, "--lr", "1e-4", "1e-3", "--epochs", "1", option, value)
    main(with_option)
    assert len(fake_runs) == 4  # both LRs again
    name = option[2:].replace("-", "_")
    assert read_records(tmp_path / "results.jsonl")[-1]["settings"][name] == setting
    assert summaries[-1]["settings"][name] == setting == _summary(tmp_path)["settings"][name]
    main(with_option)
    assert len(fake_runs) == 4  # now finished under these settings


def test_other_model_or_data_reruns(tiny, tmp_path, fake_runs, capsys):
    model, data = tiny
    main(_argv(tiny, tmp_path, "--lr", "1e-3"))
    other_data = tmp_path / "copy"
    other_data.mkdir()
    for name in ("valid.txt", "test.txt"):
        (other_data / name).write_text(open(os.path.join(data, name)).read())
    main(_argv((model, str(other_data)), tmp_path, "--lr", "1e-3"))
    other_model = write_tiny_model(tmp_path / "model2", seed=1)
    main(_argv((other_model, str(other_data)), tmp_path, "--lr", "1e-3"))
    main(_argv((other_model, str(other_data)), tmp_path, "--lr", "1e-3"))
    assert len(fake_runs) == 3 and len(read_records(tmp_path / "results.jsonl")) == 3


@pytest.mark.parametrize("value", ["0", "-0.001", "nan", "inf", "abc"])
def test_bad_lr_values_are_refused_naming_the_option(tiny, tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exit_info:
        main(_argv(tiny, tmp_path, "--lr", "1e-3", value))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"argument --lr: must be a finite number > 0, got '{value}'")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "option, value, allowed",
    [
        ("--mlm-probability", "0", "(0, 1]"),  # predicted nothing: perplexity 1.000, an LR selected on it
        ("--mlm-probability", "-0.1", "(0, 1]"),
        ("--mlm-probability", "1.5", "(0, 1]"),
        ("--mlm-probability", "nan", "(0, 1]"),
        ("--holdout", "0", "(0, 1)"),
        ("--holdout", "1", "(0, 1)"),
    ],
)
def test_degenerate_shares_are_refused_in_one_line_before_any_run(
    tiny, tmp_path, capsys, option, value, allowed
):
    assert main(_argv(tiny, tmp_path, "--lr", "1e-3", option, value)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"layerfusion mlm: error: {option} {float(value)!r}: must be in {allowed}, "
    ), lines
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--block-size", "2"), "--block-size 2: must be >= 3 ([CLS] token [SEP]), e.g. 128"),  # was 1 / 0
        (  # the tiny model has 128 positions: an IndexError traceback in the first forward
            ("--block-size", "129"),
            "--block-size 129: BertForMaskedLM embeds at most 128 positions; use --block-size <= 128",
        ),
        (  # peft skips a modules_to_save name that matches nothing: nothing trains (a traceback)
            ("--head-modules", "nope", "--method", "none"),
            "--head-modules ['nope']: no module of BertForMaskedLM ends with that name; "
            "its top-level modules: bert, cls",
        ),
    ],
)
def test_what_the_model_cannot_run_is_refused_in_one_line_before_any_run(
    tiny, tmp_path, capsys, extra, message
):
    assert main(_argv(tiny, tmp_path, "--lr", "1e-3", *extra)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"layerfusion mlm: error: {message}"]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option, value", [("--max-train-blocks", "0"), ("--max-eval-blocks", "-1")])
def test_block_limits_below_one_are_refused_at_parse_time(tiny, tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exit_info:
        main(_argv(tiny, tmp_path, option, value))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"argument {option}: must be an integer >= 1, got '{value}'")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("values", [[0.0], [1e-3, -1.0], [float("nan")], [float("inf")], [True], ["1e-3"]])
def test_bad_lr_values_raise_naming_the_option_outside_the_cli(values):
    with pytest.raises(ValueError, match=r"^lr must be one or more finite numbers > 0, got \["):
        MlmSettings("wt2", "m", lr=values)
    with pytest.raises(ValueError, match=r"^lr must be one or more finite numbers > 0, got \[\]"):
        MlmSettings("wt2", "m", lr=[])


def test_help_shows_the_default_grids(capsys):
    with pytest.raises(SystemExit):
        main(["mlm", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "fe: 0.0001 0.0003 0.001 0.003" in text and "ft: 0.0001 0.0003 0.001" in text


@pytest.mark.parametrize("method", ["dwatt", "concat", "extra_layers", "none"])
def test_masked_logits_equal_the_full_logits_at_the_predicted_positions(tiny, method):
    from transformers import AutoModelForMaskedLM

    from layerfusion_recipes.core.models.models import apply_regime
    from layerfusion_recipes.mlm.experiment import masked_logits

    torch.manual_seed(0)
    model = apply_regime(AutoModelForMaskedLM.from_pretrained(tiny[0]), method, "fe", head_modules=("cls",))
    model.eval()
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randint(5, 40, (3, 9), generator=generator)
    labels = torch.where(torch.rand(3, 9, generator=generator) < 0.3, inputs, torch.full_like(inputs, -100))
    with torch.no_grad():
        full = model(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits  # (3, 9, vocab)
        logits, targets = masked_logits(model, inputs, labels)
    chosen = labels != -100
    assert logits.shape == (int(chosen.sum()), full.shape[-1]) and torch.equal(targets, labels[chosen])
    torch.testing.assert_close(logits, full[chosen], atol=1e-5, rtol=1e-5)


def test_the_summary_pairs_each_seed_at_the_lr_its_grid_selected():
    def run(method, lr, dev, test, seed=0):
        settings = {"seed": seed, "epochs": 1, "model": "/x/site-packages/m/model", "data": "/d/wikitext-2"}
        scores = {"lr": lr, "dev_ppl": dev, "test_ppl": test}
        return {"method": method, "regime": "fe", **scores, "settings": settings, "model": "m", "data": "d"}

    grid = [
        run(method, lr, dev, dev + 1)
        for method, base in (("none", 30.0), ("dwatt", 20.0))
        for lr, dev in ((1e-3, base), (3e-3, base + 5))
    ]
    # seed 1: none at its grid's LR, dwatt at another (left out)
    seeds = [[run("none", 1e-3, 28.0, 29.0, seed=1), run("dwatt", 3e-3, 1.0, 1.0, seed=1)]]
    summary = mlm_summary(grid, seeds, name="mlm", commands=["layerfusion mlm ..."])
    (cell,) = summary["cells"]
    assert cell["methods"]["none"]["trials"] == [0, 1] and cell["methods"]["none"]["test"] == [31.0, 29.0]
    assert cell["methods"]["dwatt"]["trials"] == [0] and cell["methods"]["dwatt"]["dev_by_lr"] == [20.0, 25.0]
    assert summary["pairs"] == [["dwatt", "none"]] and summary["model"]["name"] == "m"
    assert summary["lower_is_better"] and summary["metric"] == "ppl"
