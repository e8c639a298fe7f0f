"""The true few-shot protocol of the few-shot commands: every choice made from each trial's own sample.

Per trial of a shot size (the same N-per-class sample every method sees), from that sample alone
(:func:`peft_layerfusion.few_shot.choose`, k-fold cross-validation): one probe per block, the plain
last-layer head (``none``), the block the same selection picks (``best_layer``), every fusion of
:data:`peft_layerfusion.few_shot.METHODS`, and the recommended recipe
(:data:`peft_layerfusion.few_shot.RECOMMENDED`). No dev split is read. Each is then scored once on
test; beside them, as a ceiling no user could deploy, the block chosen on test (``test_best_block``).

The states every method reads come from one forward per example with ``output_hidden_states``
(:func:`head_rows`): the sample's and the test set's, kept in ``OUTPUT/states/`` under a name that
fingerprints the setup and the examples, so that a rerun reads them and a change of model, data or
settings computes them anew. Each trial's record is appended to ``OUTPUT/results.jsonl`` as it ends (an
interrupted sweep resumes at the next trial); ``OUTPUT/summary.json`` holds each method's test score per
trial; the recommended recipe of each trial is saved as one adapter, ``OUTPUT/adapters/N-shot/trial-T``,
and reloaded to check that it gives the same logits bitwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from peft_layerfusion import few_shot
from peft_layerfusion.names import ENTRIES, TRAINED_NAMES
from peft_layerfusion.utils import atomic_write, atomic_write_json, atomic_write_text

from ..batches import collate
from ..engine.cross_fit import cross_fit, example_folds
from ..engine.experiment import FewShotExperiment
from ..errors import UserError
from ..options.locations import source_name
from ..results.records import append_record, read_records
from ..results.stats import mean_ci, paired_mean_ci
from .tasks import check_task

RECOMMENDED = few_shot.RECOMMENDED  # the recipe the project recommends, under its method name
BASELINE = "best_layer"  # the bar: the block chosen by the same selection
CEILING = "test_best_block"  # the block chosen on test: a reference, never deployable
TRAINED_PREFIX = "trained_"  # a trained fusion's name in a summary: `average` is also a fitted read-out's
STATES_FOLDER = "states"
ADAPTERS_FOLDER = "adapters"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class Plan:
    """What a true few-shot sweep runs.

    Args:
        shots: The shot sizes.
        trials: Trials per shot size (trial ``t`` of every size draws its own sample).
        folds: ``k`` of the cross-validation on each sample.
        alpha: The guard's level (:func:`peft_layerfusion.few_shot.guard`).
        save_adapters: Save the recommended recipe of every trial as one adapter.
        trained: Trained fusions run beside the read-outs, each with its LR and epoch chosen by
            cross-validation on the sample (:func:`~layerfusion_recipes.core.engine.cross_fit.cross_fit`).
        epochs: The most epochs a trained fusion tries.
    """

    shots: tuple[int, ...]
    trials: int
    folds: int = 4
    alpha: float = 0.05
    save_adapters: bool = True
    trained: tuple[str, ...] = ()
    epochs: int = 20


@dataclass(frozen=True)
class Rows:
    """The states a head reads, one row per labelled unit, for a list of examples.

    Args:
        states: ``(rows, L + 1, d)`` float32 (:func:`peft_layerfusion.few_shot.head_states`).
        labels: ``(rows,)`` class ids.
        example: ``(rows,)`` the example (sentence) of each row, ``0 .. len(examples) - 1``.
    """

    states: torch.Tensor
    labels: torch.Tensor
    example: torch.Tensor


def backbone_of(model: nn.Module) -> nn.Module:
    """What returns ``output_hidden_states``: the model itself, or a pooled classifier's backbone."""
    return getattr(model, "backbone", model)


@torch.no_grad()
def head_rows(
    experiment: FewShotExperiment,
    model: nn.Module,
    examples: Sequence[dict],
    batch_size: int = 16,
    quiet: bool = True,
) -> Rows:
    """One forward per batch of ``examples`` with ``output_hidden_states``; the rows the task's head reads
    (:meth:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment.probe_inputs`: a pooled token, the
    mean
    over the tokens, or every labelled word), every state as an ``rms_after_norm`` fusion hands it on."""
    backbone = backbone_of(model).eval()
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    starts = range(0, len(examples), batch_size)
    for start in tqdm(
        starts, desc=f"states of {len(examples)} examples", unit="batch", disable=quiet, leave=False
    ):
        batch = collate(examples[start : start + batch_size], getattr(experiment, "pad_id", 0) or 0)
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        hidden = backbone(**inputs, output_hidden_states=True).hidden_states
        states = few_shot.head_states(hidden).float().permute(2, 0, 1, 3)  # (L + 1, batch, seq, d)
        rows, labels = experiment.probe_inputs(states, batch)  # (read, L + 1, d), (read,)
        index = torch.arange(start, start + states.shape[1], dtype=torch.float32)  # each example's own id
        marks = index.view(1, -1, 1, 1).expand(1, -1, states.shape[2], 1)  # (1, batch, seq, 1)
        example, _ = experiment.probe_inputs(marks, batch)  # (read, 1, 1): the same rows' examples
        parts.append((rows, labels, example.view(-1).round().long()))
    states, labels, example = (torch.cat(part) for part in zip(*parts, strict=True))
    return Rows(states, labels.long(), example)


def fingerprint(experiment: FewShotExperiment, examples: Sequence[dict]) -> str:
    """A name for the states of ``examples`` under this setup (model, data, settings)."""
    digest = hashlib.sha256(experiment.setup.encode())
    for example in examples:
        digest.update(json.dumps([example["input_ids"], example.get("labels")]).encode())
    return digest.hexdigest()[:20]


class StateStore:
    """The states of a sweep's examples, computed once per fingerprint and kept in ``folder``.

    Args:
        experiment: The task's experiment (its model is loaded on the first miss).
        folder: Where the ``.safetensors`` files go.
    """

    def __init__(self, experiment: FewShotExperiment, folder: Path, quiet: bool = True) -> None:
        self.experiment, self.folder, self.quiet = experiment, folder, quiet
        self._model: nn.Module | None = None

    def rows(self, examples: Sequence[dict]) -> Rows:
        path = self.folder / f"{fingerprint(self.experiment, examples)}.safetensors"
        if path.exists():
            saved = load_file(path)
            return Rows(saved["states"], saved["labels"], saved["example"])
        rows = head_rows(
            self.experiment, self.model(), examples, self.experiment.settings.batch_size, self.quiet
        )
        tensors = {"states": rows.states.contiguous(), "labels": rows.labels, "example": rows.example}
        atomic_write(path, lambda temporary: save_file(tensors, temporary))  # the whole file or none
        return rows

    def model(self) -> nn.Module:
        """The frozen model, loaded on the first miss (a rerun that finds every state loads none)."""
        if self._model is None:
            self._model = self.experiment.load_model(seed=self.experiment.settings.seed)
        return self._model


def trial_key(experiment: FewShotExperiment, plan: Plan, shots: int, trial: int) -> str:
    """A record's key: the selection's version, the resolved setup, the protocol's settings, the cell."""
    version = few_shot.SELECTION_VERSION
    trained = f"|trained={','.join(plan.trained)}|epochs={plan.epochs}" if plan.trained else ""
    return (
        f"true_few_shot|v{version}|{experiment.setup}|folds={plan.folds}|alpha={plan.alpha}{trained}"
        f"|{shots}|{trial}"
    )


def _predict(readout: few_shot.LinearReadout, states: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    return torch.cat([readout.predict(states[i : i + chunk].double()) for i in range(0, len(states), chunk)])


def test_scores(
    trial: few_shot.Trial, test: Rows, score: Callable[[torch.Tensor], float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Each method's test score, and each block's probe's (the ceiling is their best)."""
    methods = {name: score(_predict(readout, test.states)) for name, readout in trial.readouts.items()}
    blocks = {
        str(p.block): score(
            _predict(few_shot.LinearReadout((p.block,), p.weight[:, None], p.bias), test.states)
        )
        for p in trial.probes
    }
    methods[CEILING] = max(blocks.values())
    return methods, blocks


def save_adapter(
    store: StateStore, readout: few_shot.LinearReadout, folder: Path, head: str, probe: Sequence[dict]
) -> bool:
    """Deploy ``readout`` on a fresh copy of the model, save it to ``folder``, reload it: whether the
    reloaded adapter gives the saved one's logits bitwise on ``probe`` examples (and the read-out's, up
    to float32 rounding)."""
    experiment = store.experiment
    adapted = few_shot.deploy(experiment.load_model(seed=experiment.settings.seed), readout, head).eval()
    batch = collate(list(probe), getattr(experiment, "pad_id", 0) or 0)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    with torch.no_grad():
        logits = adapted(**inputs).logits
    partial = folder.with_name(folder.name + ".partial")
    adapted.save_pretrained(partial)
    if folder.exists():
        for file in folder.iterdir():
            file.unlink()
        folder.rmdir()
    os.replace(partial, folder)
    reloaded = PeftModel.from_pretrained(experiment.load_model(seed=experiment.settings.seed), folder).eval()
    with torch.no_grad():
        return bool(torch.equal(reloaded(**inputs).logits, logits))


def run_trial(
    experiment: FewShotExperiment,
    store: StateStore,
    test: Rows,
    plan: Plan,
    shots: int,
    trial: int,
    output: Path,
) -> dict[str, Any]:
    """One trial: its sample's rows, every choice made on them, every method scored once on test."""
    started = time.perf_counter()
    sample = experiment.train_sample(shots, trial)
    rows = store.rows(sample)
    scorer = experiment.unit_scorer(sample, rows.labels, rows.example)
    choice = few_shot.choose(
        rows.states,
        rows.labels,
        folds=plan.folds,
        seed=trial,
        groups=rows.example,
        scorer=scorer,
        alpha=plan.alpha,
        classes=len(experiment.labels),  # the head's: a sample may lack a tag
    )
    score = experiment.test_score
    methods, blocks = test_scores(choice, test, score)
    trained = {}
    if plan.trained:
        folds_of = example_folds(rows.labels, rows.example, len(sample), plan.folds, trial)
        for method in plan.trained:
            trained[method] = cross_fit(
                experiment, method, sample, folds_of, shots, trial, plan.epochs, choice.best_block
            )
            methods[TRAINED_PREFIX + method] = trained[method]["test"]
    record: dict[str, Any] = {
        "key": trial_key(experiment, plan, shots, trial),
        "task": experiment.settings.TASK,
        "selection": "cv",
        "shots": shots,
        "trial": trial,
        "folds": plan.folds,
        "train_examples": len(sample),
        "choices": choice.choices(),
        "cv": choice.cv_scores,
        "test": methods,
        "test_blocks": blocks,
        "metric": experiment.metric_name,
        **({"trained": trained} if trained else {}),
    }
    if plan.save_adapters:
        folder = output / ADAPTERS_FOLDER / f"{shots}-shot" / f"trial-{trial}"
        store.model()  # the head's name needs the model (none is loaded where every state was kept)
        head = experiment.head_modules()[0]
        record["adapter"] = str(folder.relative_to(output))
        record["adapter_reloaded_bitwise"] = save_adapter(
            store, choice.readouts[RECOMMENDED], folder, head, experiment.test[:4]
        )
    record["seconds"] = round(time.perf_counter() - started, 2)
    return {**record, **experiment.provenance()}


def cells(plan: Plan) -> Iterator[tuple[int, int]]:
    for shots in plan.shots:
        for trial in range(plan.trials):
            yield shots, trial


def run_true_few_shot(
    experiment: FewShotExperiment,
    plan: Plan,
    output: str | os.PathLike,
    command: str = "",
    quiet: bool = False,
    results: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Every trial of ``plan`` (resuming at the first one the results file lacks: ``results``, default
    ``OUTPUT/results.jsonl``), then the summary; returns it."""
    output = Path(output)
    results = Path(results) if results is not None else output / "results.jsonl"
    done = {record["key"] for record in read_records(results)} if results.exists() else set()
    store = StateStore(experiment, output / STATES_FOLDER, quiet)
    todo = [cell for cell in cells(plan) if trial_key(experiment, plan, *cell) not in done]
    test = store.rows(experiment.test) if todo else None
    for shots, trial in tqdm(todo, desc="trials", unit="trial", disable=quiet or not todo):
        append_record(results, run_trial(experiment, store, test, plan, shots, trial, output))
    keys = {trial_key(experiment, plan, *cell) for cell in cells(plan)}
    records = [r for r in read_records(results) if r["key"] in keys]
    summary = summarize(records, experiment, plan, command)
    atomic_write_json(output / SUMMARY_FILE, summary)
    return summary


def target_name(settings: Any) -> str | None:
    """What a summary scores where the user named it: a classify ``--label-column``, an NER
    ``--tag-column`` (two summaries of one data set then tell their labels apart), else ``None``.

    Example:
        >>> from types import SimpleNamespace as Settings
        >>> target_name(Settings(label_column="fine_label")), target_name(Settings(tag_column=1))
        ('fine_label', 'tag column 1')
    """
    label, tag = getattr(settings, "label_column", None), getattr(settings, "tag_column", None)
    return label if label is not None else (f"tag column {tag}" if tag is not None else None)


def title(summary: dict[str, Any]) -> str:
    """A summary's row title: its data (and the labels it scores, where named), its model."""
    data = summary["data"]
    labels = f" ({data['labels']})" if data.get("labels") else ""
    return f"{data['name']}{labels}, {summary['model']['name']}"


def summarize(
    records: Sequence[dict[str, Any]], experiment: FewShotExperiment, plan: Plan, command: str
) -> dict[str, Any]:
    """``{"setup": ..., "cells": [{"shots": N, "epochs": None, "regime": "fe", "selection": "cv",
    "methods": {NAME: {"trials": [...], "test": [...]}}}]}``: what each method deploys, per trial."""
    cells_out = []
    for shots in plan.shots:
        own = sorted((r for r in records if r["shots"] == shots), key=lambda r: r["trial"])
        names = list(own[0]["test"]) if own else []
        methods = {
            name: {"trials": [r["trial"] for r in own], "test": [r["test"][name] for r in own]}
            for name in names
        }
        kept = sum(r["choices"]["guard"] != BASELINE for r in own)
        cell = {"shots": shots, "epochs": None, "regime": "fe", "selection": "cv", "methods": methods}
        cells_out.append({**cell, "ensemble_kept": f"{kept}/{len(own)}"})
    fingerprints = experiment.settings.content_fingerprints()
    return {
        "kind": "true_few_shot",
        "task": experiment.settings.TASK,
        "model": {
            "name": source_name(experiment.settings.model),
            "fingerprint": fingerprints.get("model", ""),
        },
        "data": {
            "name": source_name(experiment.data_name),
            "fingerprint": fingerprints.get("data", ""),
            **({"labels": labels} if (labels := target_name(experiment.settings)) else {}),
        },
        "setup": experiment.setup,
        "metric": experiment.metric_name,
        "folds": plan.folds,
        "alpha": plan.alpha,
        "commands": [command],
        "cells": cells_out,
    }


def verdict(summary: dict[str, Any]) -> str:
    """One line in words: how the recommended recipe did against the selected block, over every cell."""
    lines = []
    for cell in summary["cells"]:
        methods = cell["methods"]
        if RECOMMENDED not in methods:
            continue
        ours = dict(zip(methods[RECOMMENDED]["trials"], methods[RECOMMENDED]["test"], strict=True))
        bar = dict(zip(methods[BASELINE]["trials"], methods[BASELINE]["test"], strict=True))
        diff = paired_mean_ci({k: 100 * v for k, v in ours.items()}, {k: 100 * v for k, v in bar.items()})
        if diff is None:
            continue
        if diff.n < 2:
            lines.append(f"N={cell['shots']}: {_points(diff.mean):+.1f} points (1 trial: no interval)")
        else:
            sure = "interval excludes 0" if diff.resolved else "interval includes 0"
            interval = f"{_points(diff.mean):+.1f} ± {diff.half_width:.1f} points over {diff.n} trials"
            lines.append(f"N={cell['shots']}: {interval} ({sure})")
    return (
        f"The recommended recipe ({NAMES[RECOMMENDED]}) against the block chosen the same way: "
        + "; ".join(lines)
    )


NAMES = {  # how the tables name a method of few_shot.METHODS (default: its name in words)
    "none": "last-layer head",
    "best_layer": "selected block",
    "average": "average (unit RMS)",
    "guarded_ensemble": "guarded joint ensemble",
}
LABELS = {
    **{name: NAMES.get(name, name.replace("_", " ")) for name in few_shot.METHODS},
    **{TRAINED_PREFIX + e.name: f"{e.label} (trained)" for e in ENTRIES if e.name in TRAINED_NAMES[1:]},
    CEILING: "block chosen on test (ceiling)",
}
LABELS[RECOMMENDED] = "recommended"


def table(summary: dict[str, Any]) -> str:
    """One markdown table: mean test score (± 95% t-interval where there are 2 trials or more)."""
    names = [name for name in LABELS if any(name in cell["methods"] for cell in summary["cells"])]
    lines = ["| N | " + " | ".join(LABELS[n] for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for cell in summary["cells"]:
        parts = []
        for name in names:
            values = [100 * v for v in cell["methods"].get(name, {}).get("test", [])]
            if not values:
                parts.append("")
                continue
            mean, half = mean_ci(values)
            parts.append(f"{mean:.1f}" if len(values) < 2 else f"{mean:.1f} ± {half:.1f}")
        lines.append(f"| {cell['shots']} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def paired_table(summary: dict[str, Any], title: str = "", shots: Container[int] | None = None) -> str:
    """The recommended recipe against the selected block and the last-layer head, per shot size: paired
    per trial (mean ± 95% t-interval, bold where it excludes 0), beside each one's mean test score and
    the ceiling. ``title`` names the rows' task and model; ``shots``, where given, the rows to show."""
    lines = [
        "| task, model | N | trials | last-layer head | selected block | recommended | ceiling "
        "| recommended − block | recommended − head |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in summary["cells"]:
        methods = cell["methods"]
        if RECOMMENDED not in methods or (shots is not None and cell["shots"] not in shots):
            continue
        by_trial = {
            name: dict(zip(m["trials"], (100 * v for v in m["test"]), strict=True))
            for name, m in methods.items()
        }
        means = {name: mean_ci(list(values.values()))[0] for name, values in by_trial.items()}
        diffs = [paired_mean_ci(by_trial[RECOMMENDED], by_trial[other]) for other in (BASELINE, "none")]
        lines.append(
            f"| {title} | {cell['shots']} | {len(by_trial[RECOMMENDED])} | {means['none']:.1f} "
            f"| {means[BASELINE]:.1f} | {means[RECOMMENDED]:.1f} | {means.get(CEILING, float('nan')):.1f} "
            f"| {_difference(diffs[0])} | {_difference(diffs[1])} |"
        )
    return "\n".join(lines)


def trained_table(summary: dict[str, Any], title: str = "") -> str:
    """The trained fusions of a summary (``--selection cv --methods ...``) against the selected block and
    the recommended recipe, paired per trial, a row per method and N; empty where none trained.

    Example:
        >>> methods = {name: {"trials": [0, 1], "test": test} for name, test in
        ...            {"best_layer": [0.6, 0.7], "guarded_ensemble": [0.7, 0.8],
        ...             "trained_dwatt": [0.5, 0.62]}.items()}
        >>> print(trained_table({"cells": [{"shots": 8, "methods": methods}]}, "sst2"))
        | task, model | N | trained fusion | test | − selected block | − recommended |
        |---|---|---|---|---|---|
        | sst2 | 8 | DWAtt (trained) | 56.0 | -9.0 ± 12.7 | **-19.0 ± 12.7** |
    """
    lines = []
    for cell in summary["cells"]:
        by_trial = {
            name: dict(zip(m["trials"], (100 * v for v in m["test"]), strict=True))
            for name, m in cell["methods"].items()
        }
        for name in (n for n in LABELS if n.startswith(TRAINED_PREFIX) and n in by_trial):
            diffs = [paired_mean_ci(by_trial[name], by_trial[other]) for other in (BASELINE, RECOMMENDED)]
            mean = mean_ci(list(by_trial[name].values()))[0]
            lines.append(
                f"| {title} | {cell['shots']} | {LABELS[name]} | {mean:.1f} "
                f"| {_difference(diffs[0])} | {_difference(diffs[1])} |"
            )
    if not lines:
        return ""
    header = "| task, model | N | trained fusion | test | − selected block | − recommended |"
    return "\n".join([header, "|---|---|---|---|---|---|", *lines])


def summaries_markdown(summaries: Sequence[dict[str, Any]]) -> str:
    """Published true few-shot summaries on the results page (one is a list of one): their paired table
    (a row per task, model and N), the trained fusions of those that ran some (:func:`trained_table`),
    then, folded (a page has a line budget; the tables have the rows), what they ran on (each model and
    data set once, with its fingerprint) and the commands that make them again."""
    shown = shown_rows(summaries)
    tables = [paired_table(s, title(s), shown[i]).splitlines() for i, s in enumerate(summaries)]
    lines = tables[0][:2] + [row for table in tables for row in table[2:]]
    trained = [table for s in summaries if (table := trained_table(s, title(s)))]
    if trained:
        rows = [row for table in trained for row in table.splitlines()[2:]]
        lines += ["", *trained[0].splitlines()[:2], *rows]
    return "\n".join([*lines, "", *provenance(summaries)])


def shown_rows(summaries: Sequence[dict[str, Any]]) -> list[set[int]]:
    """The shot sizes each summary shows in the paired table: one row per setup and N, that of the
    summary with the most trials there (the same setup draws the same sample for a trial, so a subset
    run, e.g. one that also trains fusions, repeats its twin's first trials). Summaries without a setup
    are each their own.

    Example:
        >>> cell = lambda n, trials: {"shots": n, "methods": {"none": {"trials": list(range(trials))}}}
        >>> full = {"setup": "ab", "cells": [cell(8, 10), cell(32, 10)]}
        >>> subset = {"setup": "ab", "cells": [cell(8, 5), cell(128, 5)]}
        >>> shown_rows([full, subset])
        [{8, 32}, {128}]
    """
    best: dict[tuple[object, int], tuple[int, int]] = {}  # (setup, N) -> (summary, its trials)
    for index, summary in enumerate(summaries):
        for cell in summary["cells"]:
            trials = max((len(m["trials"]) for m in cell["methods"].values()), default=0)
            key = (summary.get("setup") or f"#{index}", cell["shots"])
            if key not in best or trials > best[key][1]:
                best[key] = (index, trials)
    return [{n for (_, n), (i, _) in best.items() if i == index} for index in range(len(summaries))]


def provenance(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """What ``summaries`` ran on and their commands, as a folded block of the results page (an HTML
    ``details`` element: GitHub and the docs site both fold it).

    Example:
        >>> one = {"model": {"name": "m", "fingerprint": "ab"}, "data": {"name": "d", "fingerprint": ""},
        ...        "metric": "accuracy", "folds": 4, "commands": ["layerfusion classify --data $DATA/d"]}
        >>> folded = provenance([one, one])
        >>> folded[0], folded[-1]
        ('<details markdown="1"><summary>What the rows ran on, and their commands</summary>', '</details>')
        >>> folded[2][:70]  # each model and data set once
        'Model `m` (ab); data `d` (no fingerprint); test accuracy; 4-fold cross'
        >>> folded[2][-45:]
        'sets): `layerfusion classify --data $DATA/d`.'
        >>> other = {**one, "commands": ["layerfusion ner --data $NEW/e"], "folders": {"$NEW": "made by x"}}
        >>> provenance([one, other])[2].split("Commands ")[1][:57]  # a summary's own folder, said where used
        '(`$DATA`: the folder of the data sets; `$NEW`: made by x)'
    """

    def named(kind: str) -> str:
        found = {(s[kind]["name"], s[kind]["fingerprint"] or "no fingerprint"): None for s in summaries}
        return ", ".join(f"`{name}` ({fingerprint})" for name, fingerprint in found)

    def listed(field: str) -> str:
        return " or ".join(str(value) for value in dict.fromkeys(s[field] for s in summaries))

    commands = dict.fromkeys(command for s in summaries for command in s["commands"] if command)
    models, data = named("model"), named("data")
    folders = {"$DATA": "the folder of the data sets"}  # and what a summary says of its own folders
    for s in summaries:
        folders.update(s.get("folders", {}))
    said = "; ".join(
        f"`{name}`: {what}" for name, what in folders.items() if any(name in c for c in commands)
    )
    line = (
        f"Model{'s' * (', ' in models)} {models}; data {data}; test {listed('metric')}; "
        f"{listed('folds')}-fold cross-validation on each trial's sample, no dev split read. Commands "
        f"({said}): {'; '.join(f'`{command}`' for command in commands)}."
    )
    summary = '<details markdown="1"><summary>What the rows ran on, and their commands</summary>'
    return [summary, "", line, "", "</details>"]


def _points(value: float) -> float:
    """``value`` to one decimal, never ``-0.0``."""
    return round(value, 1) + 0.0


def _difference(found: Any) -> str:
    if found is None:
        return ""
    if found.n < 2:
        return f"{_points(found.mean):+.1f} (1 trial)"
    text = f"{_points(found.mean):+.1f} ± {found.half_width:.1f}"
    return f"**{text}**" if found.resolved else text


def report(summary: dict[str, Any]) -> str:
    """What a person reads first: the verdict line, the table, and what the columns are."""
    folds = summary["folds"]
    note = (
        f"Test {summary['metric']} (%), mean ± 95% t-interval over trials. Every choice was made from each "
        f"trial's sample alone ({folds}-fold cross-validation); no dev split was read. The ceiling is the "
        "block chosen on test: a reference no user could deploy."
    )
    return "\n\n".join([verdict(summary), table(summary), note])


def check_linear_head(experiment: FewShotExperiment) -> None:
    """Refuse, in one line, a head that reads the fused state through a nonlinear layer: the read-outs
    are linear in the blocks' states and :func:`~peft_layerfusion.few_shot.deploy` writes them where
    a linear head reads, so the saved adapter would not give the scored logits. A sequence-classification
    head of an encoder that reads the first token (``positions == "first"``: BERT's pooler, RoBERTa's
    dense + tanh, DistilBERT's pre-classifier) is one; a token head, a decoder's ``score`` and mean
    pooling's ``classifier`` are linear.

    Raises:
        UserError: naming ``--pooling`` and what to use instead.
    """
    if getattr(experiment, "positions", None) == "first":
        raise UserError(
            "--pooling model: this encoder's classification head reads its first token through a "
            "nonlinear layer (pooler or dense + tanh), which a read-out linear in the blocks' states "
            "cannot deploy exactly; use --pooling mean (or --selection dev)"
        )


def protocol_main(settings: Any, grid: dict[str, Any]) -> int:
    """``--selection cv`` of a few-shot command: the trials of ``grid``'s shots, the report printed and
    written to ``OUTPUT/table.md``."""
    check_task(read_records(grid["results"]), grid["results"], settings.TASK)  # one task per file
    if not grid.get("quiet"):  # a word before the data and the model load, the bars after
        print(
            f"layerfusion: reading {source_name(settings.data)}, loading {source_name(settings.model)}",
            file=sys.stderr,
        )
    if grid.get("threads"):
        torch.set_num_threads(grid["threads"])
    experiment = settings.make_experiment()
    check_linear_head(experiment)
    experiment.check_shots(grid["shots"])
    trained = tuple(grid.get("trained") or ())
    epochs = max(grid.get("epochs") or [Plan.epochs])
    plan = Plan(tuple(grid["shots"]), grid["trials"], grid["folds"], trained=trained, epochs=epochs)
    command = shlex.join(["layerfusion", *sys.argv[1:]])
    quiet = bool(grid.get("quiet"))
    summary = run_true_few_shot(experiment, plan, grid["output"], command, quiet, grid["results"])
    text = report(summary)
    atomic_write_text(Path(grid["output"]) / "table.md", text + "\n")
    print(text)
    return 0
