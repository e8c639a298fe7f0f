"""Which task wrote a record: a new task over core's grid is a sweep with no list to extend."""

from __future__ import annotations

import pytest

from layerfusion_recipes.core.errors import UserError
from layerfusion_recipes.core.sweeps.tasks import CELL_RECORD_FIELDS, is_sweep_task, readable, sweep_task


def _cell(task: str, **extra) -> dict:
    return {"task": task, **dict.fromkeys(CELL_RECORD_FIELDS, 1), "method": "none", **extra}


def test_a_new_task_over_the_grid_is_a_sweep_without_being_listed():
    records = [_cell("tagging"), _cell("tagging", trial=2)]
    assert is_sweep_task("tagging") and all(map(readable, records))
    assert sweep_task(records, "out/results.jsonl") == "tagging"
    assert not readable({"task": "tagging", "method": "none"})  # a sweep's record without its cell


def test_a_task_of_single_runs_is_no_sweep():
    mlm = {"task": "mlm", "settings": {}, "dev_ppl": 20.0, "test_ppl": 21.0}
    assert readable(mlm) and not is_sweep_task("mlm") and not is_sweep_task("seq2seq")
    with pytest.raises(UserError, match=r"holds records of mlm \(1 record\): tables and figures are drawn"):
        sweep_task([mlm], "mlm/results.jsonl")
