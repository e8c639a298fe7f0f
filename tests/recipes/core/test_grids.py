"""The grids' defaults, each written once: dev every k epochs, the LR grids, the LR of a lone run."""

from __future__ import annotations

import dataclasses

from layerfusion_recipes.classify.settings import resolve as resolve_classify
from layerfusion_recipes.cli import build_parser
from layerfusion_recipes.core.engine.experiment import TaskSettings
from layerfusion_recipes.core.engine.fitting import TrainSettings
from layerfusion_recipes.core.options.grids import (
    DEFAULT_EVAL_EVERY,
    DEMO_AXES,
    EVERY_EPOCH,
    PAPER_AXES,
    USER_AXES,
)
from layerfusion_recipes.ner.settings import resolve as resolve_ner


def _default(cls: type, name: str):
    return {field.name: field.default for field in dataclasses.fields(cls)}[name]


def test_dev_every_k_epochs_has_one_default_per_path():
    """Your data: every 5 epochs for both tasks; the paper's grid and a script's settings: every epoch;
    the demo: its own."""
    ner, _ = resolve_ner(build_parser().parse_args(["ner", "--data", "conll/"]))
    args = build_parser().parse_args(["classify", "--data", "sst2/", "--model", "m/"])
    classify, _ = resolve_classify(args)
    assert ner.eval_every == classify.eval_every == USER_AXES["eval_every"] == DEFAULT_EVAL_EVERY == 5
    paper, _ = resolve_ner(build_parser().parse_args(["ner", "--data", "conll/", "--paper-grid"]))
    assert paper.eval_every == _default(TaskSettings, "eval_every") == _default(TrainSettings, "eval_every")
    assert paper.eval_every == PAPER_AXES["eval_every"] == EVERY_EPOCH == 1
    assert DEMO_AXES["eval_every"] == 3
    help_text = build_parser()._subparsers._group_actions[0].choices["classify"].format_help()
    assert f"Default: {DEFAULT_EVAL_EVERY} (scoring dev" in " ".join(help_text.split())


def test_the_training_settings_hold_no_lr():
    """A run's max LRs go to ``fit`` beside its settings, one per candidate: no field to set and ignore."""
    assert "lr" not in {field.name for field in dataclasses.fields(TrainSettings)}
