"""Layer diagnostics: which layers carry the task, from the layer probes and the learned mixing weights.

The probes (:mod:`layerfusion_recipes.core.probes.probes`, ``--probe-layers``) fit a ridge probe on each
block output ``z_n`` at the positions the task's head reads, its penalty chosen by cross-validation on
the trial's sample. Here:

* :func:`probe_rows`: one row per (setup, shots, max epochs, layer): the feature kind selected on dev
  for that layer (:func:`selected_kind`: mean dev score over trials, ties to ``none``), its test score
  (mean ± 95% t-CI over the trials), the dev score beside it, every further metric (``classify``'s
  macro-F1) at the same probes;
* :func:`learned_weights`: what the trained fusion runs learned per layer, at their cell's LR selected
  on dev, mean over trials: ScalarMix's weights ``s`` (``mix_weights``), DWAtt's depth attention
  averaged over the dev positions it reads (``depth_attention``);
* :func:`best_layers`: the ``k`` layers with the best dev score, as a ``layers=[...]`` list every
  fusion config takes (:func:`layers_text`);
* ``layers.png`` (:func:`plot_layers`): per (shots, max epochs), the probes' score against depth
  above the learned weights against depth, the methods in their colours; the same numbers in
  ``table.md`` (:func:`layers_markdown`).
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from peft_layerfusion.utils import atomic_write_text

from ..core.probes.probes import FEATURES, PROBE_REGIME, UNIT_RMS
from ..core.results.cells import shots_size
from ..core.results.selection import cell_of, dev_score, record_metric, test_score
from ..core.results.stats import mean_ci
from ..core.sweeps.tasks import read_task_probes, read_task_records, sweep_task
from .best_layer import best_layer_section
from .plot import (
    _caption,
    _pyplot,
    _save,
    markdown_row,
    method_color,
    method_label,
    method_rank,
    metric_named,
    regime_label,
    setup_label,
    setup_suffix,
    shots_text,
    summarize,
    variants_note,
    write_report,
)

DEFAULT_TOP = 3  # layers in the subset printed as layers=[...]
WEIGHT_FIELDS = {  # record field -> what it is, for the legend and the table
    "mix_weights": "mix weights",  # softmax(w), or e_b + β (softmax(w) - e_b) from a one-hot start
    "depth_attention": "mean depth attention",
}
PROBE_COLOR = "black"  # the probes are no method: none of the methods' colours
LAYERS_FIGURE = "layers.png"  # the layer figure, in the report's output folder


def layer_runs(records: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each layer of each probe record as a run of its own: the record's fields with the layer's
    (``layer``, ``penalty``, ``dev_METRIC``, ``test_METRIC``...) in place of ``layers``.

    Example:
        >>> [run["layer"] for run in layer_runs([{"shots": 8, "layers": [{"layer": 1}, {"layer": 2}]}])]
        [1, 2]
    """
    for record in records:
        shared = {key: value for key, value in record.items() if key != "layers"}
        for entry in record["layers"]:
            yield {**shared, **entry}


def probe_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (setup, shots, epochs, layer) of probe records, at its feature kind selected on dev
    (:func:`selected_kind`).

    Row fields: ``setup``, ``shots``, ``epochs``, ``layer``, ``features`` (selected), ``penalties`` (each
    trial's, chosen by cross-validation on its sample), ``edge`` (a trial's penalty at an end of its grown
    grid), ``metric`` (the selecting one), ``score`` (``test``, or ``dev`` without a test split),
    ``mean`` / ``ci`` (that score in points), ``dev_mean`` / ``dev_ci``, ``n`` (trials), ``others``
    (every further metric: ``{metric: (mean, ci)}`` at the same probes, ``None`` without a test split).

    Example:
        >>> layers = [{"layer": 1, "penalty": 0.1, "penalty_on_edge": False, "dev_f1": 0.5, "test_f1": 0.4}]
        >>> record = {"shots": 8, "epochs": 5, "trial": 0, "features": "rms", "metric": "f1"}
        >>> row = probe_rows([{**record, "layers": layers}])[0]
        >>> row["layer"], row["features"], row["penalties"], row["mean"]
        (1, 'rms', [0.1], 40.0)
    """
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for run in layer_runs(records):
        groups[(run.get("setup", ""), run["shots"], run["epochs"], run["layer"])].append(run)
    rows = []
    for (setup, shots, epochs, layer), runs in sorted(groups.items(), key=lambda item: _cell_order(item[0])):
        features = selected_kind(runs)
        chosen = sorted((run for run in runs if run["features"] == features), key=lambda run: run["trial"])
        metric = record_metric(chosen[0])
        tested = all(test_score(run, metric) is not None for run in chosen)
        score = test_score if tested else dev_score
        others = {
            name: mean_ci([100.0 * score(run, name) for run in chosen]) if tested else None
            for name in chosen[0].get("metrics", [metric])[1:]
        }
        mean, half = mean_ci([100.0 * score(run, metric) for run in chosen])
        dev_mean, dev_half = mean_ci([100.0 * dev_score(run) for run in chosen])
        rows.append(
            {
                "setup": setup,
                "shots": shots,
                "epochs": epochs,
                "layer": layer,
                "features": features,
                "penalties": [run["penalty"] for run in chosen],
                "edge": any(run["penalty_on_edge"] for run in chosen),
                "metric": metric,
                "score": "test" if tested else "dev",
                "mean": mean,
                "ci": half,
                "dev_mean": dev_mean,
                "dev_ci": dev_half,
                "n": len(chosen),
                "others": others,
            }
        )
    return rows


def selected_kind(runs: Sequence[dict[str, Any]]) -> str:
    """One layer's feature kind: the one whose probes have the better mean dev score over trials (the
    ``none`` kind on ties).

    Example:
        >>> none = {"features": "none", "trial": 0, "dev_f1": 0.5}
        >>> selected_kind([none, {**none, "dev_f1": 0.6, "features": "rms"}])
        'rms'
    """
    means = {}
    for features in FEATURES:
        own = [dev_score(run) for run in runs if run["features"] == features]
        if own:
            means[features] = sum(own) / len(own)
    assert means, "selected_kind needs at least one run"
    return max(means, key=lambda features: (means[features], features == FEATURES[0]))


def _cell_order(key: tuple) -> tuple:
    setup, shots, epochs, *rest = key
    return (setup, epochs, shots_size(shots), *rest)  # the full train set after every N


def probe_cells(rows: Sequence[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """The rows of :func:`probe_rows` by (setup, shots, epochs), each list by layer."""
    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        cells[(row["setup"], row["shots"], row["epochs"])].append(row)
    return dict(cells)


def best_layers(rows: Sequence[dict[str, Any]], k: int = DEFAULT_TOP) -> list[int]:
    """The ``k`` layers of one cell's rows with the best mean dev score at their selected LR (ties to
    the lower layer), ascending: a ``layers`` list for any fusion config.

    Example:
        >>> best_layers([{"layer": 1, "dev_mean": 50.0}, {"layer": 2, "dev_mean": 70.0},
        ...              {"layer": 3, "dev_mean": 60.0}], k=2)
        [2, 3]
    """
    ranked = sorted(rows, key=lambda row: (-row["dev_mean"], row["layer"]))
    return sorted(row["layer"] for row in ranked[:k])


def layers_text(layers: Sequence[int]) -> str:
    """A layer subset as a config takes it.

    Example:
        >>> layers_text([2, 5, 6])
        'layers=[2, 5, 6]'
    """
    return f"layers={list(layers)!r}"


def learned_weights(
    records: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]] | None = None
) -> dict[tuple, dict[str, Any]]:
    """The learned layer weights of the runs that record them (:data:`WEIGHT_FIELDS`), at each cell's
    LR selected on dev (the rows of :func:`~layerfusion_recipes.reporting.plot.summarize`), mean over
    trials.

    Returns:
        ``{(setup, regime, shots, epochs, method): {"field", "layers", "weights", "n"}}``: the field,
        the fused layers, the mean weight of each, the trials.

    Example:
        >>> weights = learned_weights(sweep_records)
        >>> [cell for cell in weights if cell[-1] == "scalar_mix"][0][1:]  # (setup, regime, N, epochs, ...)
        ('fe', 8, 25, 'scalar_mix')
        >>> weights[sweep_records[0]["setup"], "fe", 8, 25, "scalar_mix"]["weights"]  # mean over trials
        [0.1..., 0.6, 0.3]
    """
    selected = {cell_of(row): row["lr"] for row in (summarize(records) if rows is None else rows)}
    found: dict[tuple, dict[str, Any]] = {}
    for record in records:
        field = next((name for name in WEIGHT_FIELDS if record.get(name)), None)
        if field is None or record.get("lr") != selected.get(cell_of(record)):
            continue
        setup, regime, epochs, shots, method = cell_of(record)
        entry = found.setdefault(
            (setup, regime, shots, epochs, method),
            {"field": field, "layers": record.get("fused_layers"), "runs": []},
        )
        entry["runs"].append(record[field])
    return {
        key: {
            "field": entry["field"],
            "layers": entry["layers"] or list(range(1, len(entry["runs"][0]) + 1)),
            "weights": [sum(column) / len(column) for column in zip(*entry["runs"], strict=True)],
            "n": len(entry["runs"]),
        }
        for key, entry in found.items()
    }


def _weights_of(weights: dict[tuple, dict[str, Any]], cell: tuple) -> list[tuple[str, str, dict[str, Any]]]:
    """The learned weights of a probe cell ``(setup, shots, epochs)``: ``(method, regime, entry)``, FE
    first, methods in the registry's order."""
    setup, shots, epochs = cell
    found = [
        (method, regime, entry)
        for (own, regime, n, e, method), entry in weights.items()
        if (own, n, e) == (setup, shots, epochs)
    ]
    return sorted(found, key=lambda item: (item[1] != PROBE_REGIME, item[1], method_rank(item[0])))


def layer_count(rows: Sequence[dict[str, Any]]) -> int:
    """How many layers the probe rows (:func:`probe_rows`) hold: the model's blocks."""
    return len({row["layer"] for row in rows})


def clamped_top(top: int, rows: Sequence[dict[str, Any]]) -> int:
    """``top`` (``--probe-layers K``) at most the layers there are: the best 99 of 3 layers are all 3.

    Example:
        >>> clamped_top(99, [{"layer": 1}, {"layer": 2}, {"layer": 3}]), clamped_top(2, [{"layer": 1}])
        (3, 1)
    """
    return min(top, layer_count(rows)) if rows else top


def clamp_note(top: int, rows: Sequence[dict[str, Any]]) -> str | None:
    """What :func:`clamped_top` did, in one line (``None`` when ``top`` fits the model).

    Example:
        >>> clamp_note(99, [{"layer": 1}, {"layer": 2}, {"layer": 3}])
        '--probe-layers 99: the model has 3 layers, so all 3 are listed'
    """
    count = layer_count(rows)
    if not rows or top <= count:
        return None
    return f"--probe-layers {top}: the model has {count} layers, so all {count} are listed"


def _weight_label(method: str, regime: str, field: str, display: bool = False) -> str:
    """What a method's learned weights are called: in the table by names, in the figure (``display``) by
    the registry's labels (``ScalarMix mix weights``)."""
    name, regime_name = (method_label(method), regime_label(regime)) if display else (method, regime)
    return f"{name} {WEIGHT_FIELDS[field]}" + ("" if regime == PROBE_REGIME else f" ({regime_name})")


def _cell_title(cell: tuple, several_setups: bool, in_figure: bool = False) -> str:
    """A cell's title, its setup named where there are several (on a second line in a figure's panel)."""
    setup, shots, epochs = cell
    title = f"N={shots_text(shots)}, max {epochs} epochs"
    if in_figure:
        return title + setup_suffix(setup, several_setups)
    return title + (f" {setup_label(setup)}" if several_setups else "")


def layers_markdown(
    probes: Sequence[dict[str, Any]],
    records: Sequence[dict[str, Any]],
    top: int = DEFAULT_TOP,
    heading: str = "## Layer probes",
) -> str:
    """The layer diagnostics of ``table.md``: per (shots, epochs), one row per layer with the probe's
    score (the kind selected on dev, dev beside it), every further metric and the learned weights of
    each method that has them; the best ``top`` layers on dev as ``layers=[...]``. ``heading`` is the
    first line (a page that has its own sections, as RESULTS.md, takes another).

    Example:
        >>> from layerfusion_recipes.core.results.records import read_records
        >>> probes = read_records("out/results.probes.jsonl")
        >>> print(layers_markdown(probes, read_records("out/results.jsonl")))
    """
    rows = probe_rows(probes)
    if not rows:
        return ""
    note = clamp_note(top, rows)
    top = clamped_top(top, rows)
    cells = probe_cells(rows)
    weights = learned_weights(records)
    several = len({cell[0] for cell in cells}) > 1
    metric = metric_named(rows[0]["metric"])
    lines = [
        heading,
        "",
        f"A linear probe on each block output z_n at the positions the head reads (frozen encoder, feature "
        f"cache), on z_n itself or on z_n / rms(z_n) (z/rms), its L2 penalty (λ) chosen by cross-validation "
        f"on each trial's sample: {rows[0]['score']} {metric.long} of the kind selected on dev for that "
        f"layer (mean dev {metric.short} over trials, ties to z_n itself), mean ± 95% CI (t) over trials, "
        "(dev x) beside it; then the layer weights the trained runs learned at their cell's selected LR, "
        f"mean over trials. The best {top} layers on dev are a `layers=[...]` list any fusion config takes "
        "(e.g. `DWAttConfig(layers=[...])`)." + (f" ({note}.)" if note else ""),
    ]
    for cell, cell_rows in cells.items():
        own_weights = _weights_of(weights, cell)
        others = list(cell_rows[0]["others"])
        score = cell_rows[0]["score"]
        header = [
            "layer",
            f"probe {score} {metric.axis}",
            *(f"probe {score} {metric_named(name).axis}" for name in others),
            *(_weight_label(method, regime, entry["field"]) for method, regime, entry in own_weights),
        ]
        lines += [
            "",
            f"**{_cell_title(cell, several)}**: best {top} layers on dev: "
            f"`{layers_text(best_layers(cell_rows, top))}`",
            "",
            markdown_row(header),
            "|" + "---|" * len(header),
        ]
        for row in cell_rows:
            weight_texts = [_weight_text(entry, row["layer"]) for _, _, entry in own_weights]
            other_texts = [_interval(row["others"][name], row["n"]) for name in others]
            lines.append(markdown_row([row["layer"], _probe_text(row), *other_texts, *weight_texts]))
    flagged = [row for row in rows if row["edge"]]
    if flagged:
        lines += [
            "",
            "⚠ a probe's penalty is at the end of its grown grid (the best may lie beyond) for "
            + ", ".join(
                f"N={shots_text(r['shots'])} {r['epochs']} epochs layer {r['layer']} ({penalty_text(r)})"
                for r in flagged
            ),
        ]
    return "\n".join(lines) + "\n"


def _interval(value: tuple[float, float] | None, n: int) -> str:
    """A further metric's mean ± CI over ``n`` trials; one trial has no interval (as :func:`_probe_text`)."""
    if value is None:
        return "-"
    return f"{value[0]:.1f}" + (f" ± {value[1]:.1f}" if n > 1 else "")


def _probe_text(row: dict[str, Any]) -> str:
    text = f"{row['mean']:.1f}" + (f" ± {row['ci']:.1f}" if row["n"] > 1 else "")
    text += f" λ {penalty_text(row)}" + (" z/rms" if row.get("features") == UNIT_RMS else "")
    text += " ⚠" if row["edge"] else ""
    if row["score"] == "test":
        text += f" (dev {row['dev_mean']:.1f})"
    return text + f" (n={row['n']})"


def penalty_text(row: dict[str, Any]) -> str:
    """A row's penalties over its trials: the one they share, or their range.

    Example:
        >>> penalty_text({"penalties": [0.1, 0.1]}), penalty_text({"penalties": [1.0, 0.01, 0.1]})
        ('0.1', '0.01-1')
    """
    low, high = min(row["penalties"]), max(row["penalties"])
    return f"{low:.3g}" if low == high else f"{low:.3g}-{high:.3g}"


def _weight_text(entry: dict[str, Any], layer: int) -> str:
    if layer not in entry["layers"]:
        return "-"
    return f"{entry['weights'][entry['layers'].index(layer)]:.3f}"


MAX_TICK_LABELS = 12  # more labels than this run into each other on a panel's width


def layer_tick_labels(layers: Sequence[int]) -> list[str]:
    """A label for every ``k``-th layer of ``layers`` counted back from the last, which always has
    its label (the others get a tick without one), ``k`` the smallest step that keeps at most
    :data:`MAX_TICK_LABELS`.

    Example:
        >>> layer_tick_labels(range(1, 19))[:4], layer_tick_labels(range(1, 19))[-1]
        (['', '2', '', '4'], '18')
    """
    layers = list(layers)
    step = -(-len(layers) // MAX_TICK_LABELS)  # ceil
    back = range(len(layers) - 1, -1, -1)  # 0 at the last layer
    return [str(n) if i % step == 0 else "" for i, n in zip(back, layers, strict=True)]


def plot_layers(
    probes: Sequence[dict[str, Any]],
    records: Sequence[dict[str, Any]],
    path: str | os.PathLike,
    top: int = DEFAULT_TOP,
) -> Path | None:
    """``layers.png``: per (shots, max epochs) a column, the probes' score against depth on top (test
    score at each layer's selected LR, mean ± 95% CI band; dev dashed; the best ``top`` layers on dev
    starred; each FE method's own test score as a dotted line in its colour), the learned layer
    weights below (ScalarMix's, DWAtt's, in their colours; uniform ``1/K`` dotted); ``None`` without
    probe records.

    Example:
        >>> from layerfusion_recipes.core.results.records import read_records
        >>> probes = read_records("out/results.probes.jsonl")
        >>> plot_layers(probes, read_records("out/results.jsonl"), "out/layers.png")
    """
    rows = probe_rows(probes)
    if not rows:
        return None
    top = clamped_top(top, rows)
    plt = _pyplot()
    cells = probe_cells(rows)
    weights = learned_weights(records)
    methods = [row for row in summarize(records) if row["regime"] == PROBE_REGIME] if records else []
    several = len({cell[0] for cell in cells}) > 1
    figure, axes = plt.subplots(
        2, len(cells), figsize=(4.5 * len(cells), 6.4), squeeze=False, sharex="col", sharey="row"
    )
    for column, (cell, cell_rows) in enumerate(cells.items()):
        top_ax, bottom_ax = axes[0][column], axes[1][column]
        _draw_probes(top_ax, cell_rows, top)
        for row in methods:
            if (row["setup"], row["shots"], row["epochs"]) == cell:
                top_ax.axhline(
                    row["mean"],
                    color=method_color(row["method"]),
                    linestyle=":",
                    label=f"{method_label(row['method'])} ({row['score']})",
                )
        top_ax.set_title(_cell_title(cell, several, in_figure=True))
        _draw_weights(bottom_ax, _weights_of(weights, cell))
        bottom_ax.set_xlabel("layer n (z_n: output of block n)")
        layers = sorted({row["layer"] for row in cell_rows})
        bottom_ax.set_xticks(layers, layer_tick_labels(layers))
    metric = metric_named(rows[0]["metric"])
    axes[0][0].set_ylabel(f"{rows[0]['score']} {metric.axis} (%), mean ± 95% CI")
    axes[1][0].set_ylabel("learned layer weight (mean over trials)")
    for row_axes in axes:
        _legend_right(row_axes)
    _caption(figure, variants_note(records) if records else "")
    saved = _save(figure, Path(path))
    plt.close(figure)
    return saved


def _draw_probes(ax, rows: Sequence[dict[str, Any]], top: int) -> None:
    """One cell's probes: score with its CI band, dev dashed, the best ``top`` layers on dev starred."""
    layers = [row["layer"] for row in rows]
    mean = [row["mean"] for row in rows]
    ax.plot(layers, mean, marker="o", color=PROBE_COLOR, label=f"linear probe ({rows[0]['score']})")
    ax.fill_between(
        layers,
        [max(0.0, row["mean"] - row["ci"]) for row in rows],
        [min(100.0, row["mean"] + row["ci"]) for row in rows],
        color=PROBE_COLOR,
        alpha=0.15,
    )
    if rows[0]["score"] == "test":
        ax.plot(
            layers,
            [row["dev_mean"] for row in rows],
            linestyle="--",
            color="grey",
            label="linear probe (dev)",
        )
    best = best_layers(rows, top)
    ax.plot(
        best,
        [mean[layers.index(n)] for n in best],
        linestyle="none",
        marker="*",
        markersize=13,
        color=PROBE_COLOR,
        label=f"best {top} on dev",
    )


def _draw_weights(ax, found: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
    """One cell's learned weights per method (FE solid, other regimes dashed) and the uniform ``1/K``."""
    if not found:
        ax.text(0.5, 0.5, "no ScalarMix / DWAtt runs", ha="center", va="center", transform=ax.transAxes)
        return
    for method, regime, entry in found:
        ax.plot(
            entry["layers"],
            entry["weights"],
            marker="o",
            color=method_color(method),
            linestyle="-" if regime == PROBE_REGIME else "--",
            label=_weight_label(method, regime, entry["field"], display=True),
        )
    counts = {len(entry["layers"]) for _, _, entry in found}
    for count in sorted(counts):
        ax.axhline(1.0 / count, color="grey", linestyle=":", label="uniform 1/K")


def _legend_right(axes) -> None:
    """One legend right of a row's last panel (never over a line): every label of the row once."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        axes[-1].legend(
            list(handles.values()),
            list(handles),
            fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
        )


def write_layer_report(
    records: Sequence[dict[str, Any]], probes: Sequence[dict[str, Any]], output: str | os.PathLike, top: int
) -> dict[str, Path]:
    """``layers.png`` into ``output``, and the probe tables and each method against the best single
    layer (:func:`~layerfusion_recipes.reporting.best_layer.best_layer_section`) appended to its
    ``table.md`` (written by :func:`~layerfusion_recipes.reporting.plot.write_report` first); nothing
    without probes.

    Example:
        >>> from layerfusion_recipes.core.probes.probes import run_probes
        >>> grid = {**grid, "results": "probed/results.jsonl"}
        >>> probes = run_probes(experiment, grid, progress=False)  # 2 trials of N = 2, max 2 epochs
        >>> _ = atomic_write_text(Path("probed") / "table.md", "# runs")  # as write_report leaves it
        >>> write_layer_report([], probes, "probed", top=2)["layers"]  # no runs: the probes alone
        PosixPath('probed/layers.png')
        >>> "## Layer probes" in (Path("probed") / "table.md").read_text()
        True
    """
    figure = plot_layers(probes, records, Path(output) / LAYERS_FIGURE, top)
    if figure is None:
        return {}
    table = Path(output) / "table.md"
    sections = [table.read_text(), layers_markdown(probes, records, top), best_layer_section(records, probes)]
    atomic_write_text(table, "\n".join(section for section in sections if section))
    return {"layers": figure}


def best_layers_lines(probes: Sequence[dict[str, Any]], top: int) -> list[str]:
    """One line per probe cell: its best ``top`` layers on dev as a config takes them (``top`` at most
    the model's layers, then a note saying so).

    Example:
        >>> from layerfusion_recipes.core.probes.probes import run_probes
        >>> grid = {**grid, "results": "probed/results.jsonl"}
        >>> best_layers_lines(run_probes(experiment, grid, progress=False), 2)  # the tiny BERT's 3 blocks
        ['layers (best 2 on dev), N=2, max 2 epochs: layers=[...]']
    """
    rows = probe_rows(probes)
    note = clamp_note(top, rows)
    top = clamped_top(top, rows)
    cells = probe_cells(rows)
    several = len({cell[0] for cell in cells}) > 1
    lines = [
        f"layers (best {top} on dev), {_cell_title(cell, several)}: {layers_text(best_layers(rows, top))}"
        for cell, rows in cells.items()
    ]
    return lines + ([f"note: {note}"] if note else [])


def plot_main(args: argparse.Namespace) -> int:
    """``layerfusion plot``: table.md and the figures of a results file, and the layer diagnostics when
    its probes file (:func:`~layerfusion_recipes.core.probes.probes.probes_path`) is beside it."""
    records = read_task_records(args.results)  # lines that are no record: skipped, said on stderr
    sweep_task(records, args.results)  # one task's, that of a sweep
    if not records:
        raise SystemExit(f"{args.results}: no finished cell found")
    output = args.output or Path(args.results).parent
    paths = write_report(records, output)
    top = getattr(args, "probe_layers", None) or DEFAULT_TOP
    probes = read_task_probes(args.results, records)  # none of a setup the runs lack
    paths.update(write_layer_report(records, probes, output, top))
    print(paths["table"].read_text())
    for line in best_layers_lines(probes, top):
        print(line)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
