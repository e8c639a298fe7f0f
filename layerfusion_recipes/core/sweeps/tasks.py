"""Which task wrote a record, and one task per results file.

``ner`` (``layerfusion ner`` and ``sweep``), ``classify``, ``mlm`` and ``seq2seq`` each write their own
records; each has its own default output folder
(:func:`~layerfusion_recipes.core.options.options.default_output`), and a results file holds one task's
records:
a command refuses a file that holds another task's (:func:`check_task`), in one line naming the file,
the task found there and its own. A sweep's record says its task (``task``); the masked LM's and
seq2seq's, single runs of a shape of their own, are told by it (:func:`record_task`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import UserError
from ..probes.probes import current_probes, current_runs, probes_path
from ..results.records import read_records

# the tasks whose records are no grid's cells (each has a record shape and a block of RESULTS.md of its
# own); every other task is a sweep over core's grid (ner, classify, a new one): `layerfusion plot`
# draws its records
RUN_TASKS = ("mlm", "seq2seq")
# the fields a sweep's record has whatever its task: its cell (what the tables and figures group by)
CELL_RECORD_FIELDS = ("method", "regime", "shots", "epochs", "trial")


def is_mlm_record(record: dict[str, Any]) -> bool:
    """Whether ``record`` is a ``layerfusion mlm`` run's (its ``settings`` and perplexities), not another
    command's in the same folder (a sweep's ``results.jsonl``).

    Example:
        >>> is_mlm_record({"settings": {}, "dev_ppl": 20.0, "test_ppl": 21.0}), is_mlm_record({"f1": 0.5})
        (True, False)
    """
    return isinstance(record.get("settings"), dict) and {"dev_ppl", "test_ppl"} <= record.keys()


def record_task(record: dict[str, Any]) -> str | None:
    """The task that wrote ``record``: its ``task`` field (a sweep's), else ``mlm`` (its perplexities) or
    ``seq2seq`` (chrF and a learning rate); ``None`` for none of these.

    Example:
        >>> record_task({"task": "classify"}), record_task({"dev_ppl": 2.0, "test_ppl": 2.1, "settings": {}})
        ('classify', 'mlm')
        >>> record_task({"dev_f1": 0.5}) is None  # a sweep's record without its task
        True
    """
    if isinstance(record.get("task"), str):
        return record["task"]
    if is_mlm_record(record):
        return "mlm"
    if "chrf" in record and "learning_rate" in record:
        return "seq2seq"
    return None


def task_counts(records: Iterable[dict[str, Any]]) -> Counter:
    """How many of ``records`` each task wrote (records of no known task not counted).

    Example:
        >>> task_counts([{"task": "ner"}, {"task": "classify"}, {"task": "ner"}])
        Counter({'ner': 2, 'classify': 1})
    """
    return Counter(task for task in map(record_task, records) if task is not None)


def describe_tasks(counts: Counter) -> str:
    """``ner (72 records), classify (4 records)``: the tasks of a file, most records first."""
    return ", ".join(f"{task} ({n} record{'s' if n > 1 else ''})" for task, n in counts.most_common())


def check_task(records: Iterable[dict[str, Any]], path: str | os.PathLike, task: str) -> None:
    """Refuse a results file that holds records of another task than ``task``.

    Raises:
        UserError: ``PATH holds records of ner (72 records), not classify: a results file holds one
            task's records; give classify its own --output (or --results)``.

    Example:
        >>> check_task([{"task": "ner"}], "out/results.jsonl", "classify")
        Traceback (most recent call last):
        layerfusion_recipes.core.errors.UserError: out/results.jsonl holds records of ner (1 record), ...
    """
    counts = task_counts(records)
    if set(counts) - {task}:
        raise UserError(
            f"{path} holds records of {describe_tasks(counts)}, not {task}: a results file holds one task's "
            f"records; give {task} its own --output (or --results)"
        )


def is_sweep_task(task: str) -> bool:
    """Whether ``task``'s records are a sweep's, a grid of cells (every task but :data:`RUN_TASKS`).

    Example:
        >>> is_sweep_task("classify"), is_sweep_task("mlm")
        (True, False)
    """
    return task not in RUN_TASKS


def has_cell_fields(record: dict[str, Any]) -> bool:
    """Whether ``record`` has the fields of a sweep's cell (:data:`CELL_RECORD_FIELDS`)."""
    return all(field in record for field in CELL_RECORD_FIELDS)


def is_probe_record(record: dict[str, Any]) -> bool:
    """Whether ``record`` is a layer probe's (a cell and its ``layers``), as the probes file holds them."""
    return has_cell_fields(record) and isinstance(record.get("layers"), list)


def readable(record: dict[str, Any]) -> bool:
    """Whether a results file's ``record`` can be read as its task's: a known task, and a sweep's record
    (:func:`is_sweep_task`) with the fields of its cell (:data:`CELL_RECORD_FIELDS`)."""
    task = record_task(record)
    return task is not None and (not is_sweep_task(task) or has_cell_fields(record))


def read_task_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a results file that its task can read (:func:`readable`), one per key, a
    probe-guided run only from the block its trial's probes (the probes file beside) start it on now
    (:func:`~layerfusion_recipes.core.probes.probes.current_runs`); every other line is skipped and said in
    one warning line (:func:`~layerfusion_recipes.core.results.records.read_lines`).

    Example:
        >>> len(read_task_records(sweep_results))  # 4 methods x 2 LRs x 3 trials
        24
    """
    probes = read_records(probes_path(path), is_probe_record)
    return current_runs(read_records(path, readable), probes)


def read_task_probes(path: str | os.PathLike, runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The layer probes beside the results file ``path`` that a report of its ``runs`` reads
    (:func:`~layerfusion_recipes.core.probes.probes.current_probes`: none of a setup the runs lack).

    Example:
        >>> from layerfusion_recipes.core.results.records import append_record
        >>> stale = {**probe_records[0], "key": "probe|stale", "setup": "0dd5e7b0a1c2"}  # of an older setup
        >>> append_record("sweep/results.probes.jsonl", stale)
        True
        >>> len(read_task_probes(sweep_results, read_task_records(sweep_results)))  # the runs' setup's only
        6
    """
    return current_probes(read_records(probes_path(path), is_probe_record), runs)


def sweep_task(records: Iterable[dict[str, Any]], path: str | os.PathLike) -> str | None:
    """The one sweep task (``ner``, ``classify``: :func:`is_sweep_task`) of a results file's ``records``
    (``None`` without any).

    Raises:
        UserError: The file holds several tasks' records, or another task's (``mlm``, ``seq2seq``).

    Example:
        >>> sweep_task([{"task": "classify"}], "out/results.jsonl")
        'classify'
    """
    counts = task_counts(records)
    if len(counts) > 1:
        raise UserError(
            f"{path} holds records of {describe_tasks(counts)}: a results file holds one task's records; "
            "give each task its own --output"
        )
    task = next(iter(counts), None)
    if task is not None and not is_sweep_task(task):
        raise UserError(
            f"{path} holds records of {describe_tasks(counts)}: tables and figures are drawn from a "
            "sweep's records, a grid of cells (layerfusion ner, sweep, classify)"
        )
    return task
