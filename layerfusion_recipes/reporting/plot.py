"""``layerfusion plot``: paper-style figures and a markdown table from a results file.

The score is the records' metric (:func:`~layerfusion_recipes.core.results.selection.record_metric`):
seqeval micro-F1 for NER (``F1`` below), accuracy (and macro-F1 beside it) for ``classify``.

* ``f1_vs_shots.png`` (``accuracy_vs_shots.png``...): per method, the reported score (test score
  at the dev-selected LR and epoch; best dev score without a test split) vs shots (mean over
  trials, 95% t-CI band; the full train set at the right, "all"), each point labelled with its
  selected LR ("edge": at the edge of its grid), one panel per max-epochs (and regime);
* ``f1_vs_lr.png`` (when a cell has several LRs): mean dev F1 (solid) and test F1 (dashed) vs
  LR per method, the selected LR marked, one panel per (regime, epochs, shots);
* ``dev_curves.png``: dev F1 vs training steps (mean over trials) per method at its selected LR;
* ``dwatt_attention.png``: for DWAtt and Scaled DWAtt cells, the mean depth-attention weight of every
  fused layer (which layers the task uses) at the selected LR, one row per (method, setup, regime,
  shots, epochs);
* ``table.md``: per cell, the selected LR and test F1 mean +- CI, best dev F1 beside it,
  a selected LR at the edge of its grid flagged ("widen the grid"); the paired differences; for
  records with several metrics (``classify``: accuracy, macro-F1) one table and paired table
  each, every one at the LR and epoch the first metric selected on dev.

Every figure draws a method in one colour (:func:`method_color`, the registry's order), names methods
and regimes as the registry labels them (:func:`method_label`: "last layer (plain head)", "R+n",
"DWAtt"; :func:`regime_label`: "frozen encoder"), puts one legend beside its panels, clips CI bands to
[0, 100] and labels its y axis with the score it shows.

LR selection: :mod:`layerfusion_recipes.core.results.selection`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import zlib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peft_layerfusion.names import METHOD_LABELS, PLAIN_HEAD, REGIME_LABELS, TRAINED_NAMES
from peft_layerfusion.registration import TRAINED_METHODS
from peft_layerfusion.utils import atomic_write, atomic_write_text

from ..core.results.cells import FULL_TRAIN, shots_size
from ..core.results.selection import cell_of, dev_score, record_metric, test_score
from ..core.results.stats import excludes_zero
from ..core.results.summary import GroupSummary, Layout, paired_by_trial, summarize_groups
from ..core.sweeps.tasks import read_task_records, sweep_task

GROUP = ("regime", "epochs", "shots", "method")


@dataclass(frozen=True)
class Metric:
    """How the tables and figures name a metric.

    Args:
        long: In a legend's "Test ..." (``micro-F1 (seqeval)``).
        short: After "dev" (``F1``).
        axis: On a figure's axis (``micro-F1``).
    """

    long: str
    short: str
    axis: str


METRICS: dict[str, Metric] = {
    "f1": Metric("micro-F1 (seqeval)", "F1", "micro-F1"),
    "accuracy": Metric("accuracy", "accuracy", "accuracy"),
    "macro_f1": Metric("macro-F1", "macro-F1", "macro-F1"),
    "ppl": Metric("perplexity (lower is better)", "perplexity", "perplexity"),
    "exact_match": Metric("exact match", "exact match", "exact match"),
    "chrf": Metric("chrF", "chrF", "chrF"),
    "bleu": Metric("BLEU", "BLEU", "BLEU"),
}


def metric_named(metric: str) -> Metric:
    """The :class:`Metric` of a record metric (an unknown one is named as it is)."""
    return METRICS.get(metric, Metric(metric, metric, metric))


def record_metrics(records: Sequence[dict[str, Any]]) -> list[str]:
    """The metrics the records hold, the selecting one first: their ``metrics`` field (``classify``),
    else their :func:`~layerfusion_recipes.core.results.selection.record_metric` (NER: ``["f1"]``).

    Example:
        >>> record_metrics([{"metric": "accuracy", "metrics": ["accuracy", "macro_f1"]}])
        ['accuracy', 'macro_f1']
        >>> record_metrics([{"dev_f1": 0.5}])
        ['f1']
    """
    found: dict[str, None] = {}
    for record in records:
        found.update(dict.fromkeys(record.get("metrics", [record_metric(record)])))
    return list(found)


def shots_text(shots: int) -> str:
    """The shots of a cell as the tables write them: ``all`` for the full train set.

    Example:
        >>> shots_text(8), shots_text(FULL_TRAIN)
        ('8', 'all')
    """
    return "all" if shots == FULL_TRAIN else str(shots)


def method_rank(method: str) -> tuple[int, str]:
    """Columns in one order whatever order the records were written in: the registry's
    (``none`` first), then any other method by name."""
    known = TRAINED_NAMES.index(method) if method in TRAINED_NAMES else len(TRAINED_NAMES)
    return known, method


def method_label(method: str) -> str:
    """The name of a method in figures (:data:`~peft_layerfusion.names.METHOD_LABELS`, from
    the
    registry); an unknown one as it is.

    Example:
        >>> method_label("none"), method_label("extra_layers"), method_label("dwatt")
        ('last layer (plain head)', 'R+n', 'DWAtt')
    """
    return METHOD_LABELS.get(method, method)


def regime_label(regime: str) -> str:
    """The name of a regime in figures (:data:`~peft_layerfusion.names.REGIME_LABELS`).

    Example:
        >>> regime_label("fe")
        'frozen encoder'
    """
    return REGIME_LABELS.get(regime, regime)


def score_groups(
    records: Sequence[dict[str, Any]], metric: Callable[[dict[str, Any]], str] = record_metric
) -> dict[tuple, GroupSummary]:
    """The records' cells through the one summariser
    (:func:`~layerfusion_recipes.core.results.summary.summarize_groups`): setting (setup, regime, epochs,
    shots) and method, each cell's LR selected on its records' own dev metric; at it the metrics
    ``"dev"`` (best dev score) and ``"test"`` (test score at that epoch, ``None`` without one) in
    points, in ``metric(record)`` (default: the record's own).

    Example:
        >>> groups = score_groups(sweep_records)
        >>> list(groups)[0]  # ((setup, regime, epochs, N), method)
        (('3f2a9c0d1e4b', 'fe', 25, 8), 'none')
        >>> groups[list(groups)[0]].lr, groups[list(groups)[0]].stats["test"]  # 3 trials at the selected LR
        (0.01, MeanCI(mean=41.0, half_width=9.93..., n=3))
    """
    layout = Layout(
        setting=lambda record: cell_of(record)[:-1],
        dev=dev_score,
        metrics={
            "dev": lambda record: _points(dev_score(record, metric(record))),
            "test": lambda record: _points(test_score(record, metric(record))),
        },
    )
    return summarize_groups(records, layout)


def _points(score: float | None) -> float | None:
    return None if score is None else 100.0 * score


def summarize(records: Sequence[dict[str, Any]], metric: str | None = None) -> list[dict[str, Any]]:
    """One row per cell (setup, regime, epochs, shots, method), its LR selected on dev (:func:`score_groups`).

    Row fields: the cell's, ``lr`` (selected, on the records' own metric), ``lrs`` (its grid),
    ``edge`` (selected LR at the edge of a grid of 2+), ``metric`` (the reported one: ``metric``,
    else the records' own), ``mean``/``ci``/``n`` (the reported score in points: test score at the
    dev-selected LR when every run there has one, else best dev score; ``score`` says which),
    ``dev_mean``/``dev_ci`` (dev score at the selected LR and each run's best epoch, the paper's
    number), and per LR ``dev_by_lr`` / ``test_by_lr`` (means in points; test ``None`` where missing).

    Example:
        >>> record = {"key": "k", "setup": "3f2a", "regime": "fe", "epochs": 25, "shots": 8,
        ...           "method": "dwatt", "dev_f1": 0.5}
        >>> summarize([record])[0]["mean"]
        50.0
    """
    groups = score_groups(records, lambda record: metric or record_metric(record))

    def order(key: tuple) -> tuple:
        (setup, regime, epochs, shots), method = key
        return setup, regime, epochs, shots_size(shots), method_rank(method)

    return [_row(groups[key], metric) for key in sorted(groups, key=order)]


def _row(group: GroupSummary, metric: str | None) -> dict[str, Any]:
    """The :func:`summarize` row of a cell's
    :class:`~layerfusion_recipes.core.results.summary.GroupSummary`."""
    selecting = record_metric(next(iter(group.runs.values())))
    own = metric or selecting
    score = "test" if group.stats["test"] is not None else "dev"
    mean, half, n = group.stats[score]
    dev_mean, dev_ci, _ = group.stats["dev"]
    return {
        **dict(zip(("setup", *GROUP), (*group.setting, group.method), strict=True)),
        "lr": group.lr,
        "lrs": group.lrs,
        "edge": group.at_edge,
        "selection_trials": group.selection.trials,
        "metric": own,
        "selected_by": selecting,
        "score": score,
        "mean": mean,
        "ci": half,
        "n": n,
        "dev_mean": dev_mean,
        "dev_ci": dev_ci,
        "dev_by_lr": (
            {lr: 100.0 * m for lr, m in group.dev_by_lr.items()} if own == selecting else group.by_lr["dev"]
        ),
        "test_by_lr": group.by_lr["test"],
    }


def format_lr(lr: float | None) -> str:
    """An LR as the tables write it (``-`` for records without one).

    Args:
        lr: The LR, or ``None``.

    Example:
        >>> format_lr(0.001), format_lr(3e-05), format_lr(None)
        ('0.001', '3e-05', '-')
    """
    return "-" if lr is None else f"{lr:g}"


def cell_text(row: dict[str, Any]) -> str:
    """One cell of :func:`markdown_table`: score mean ± CI, ``@`` selected LR (``⚠`` at the edge of
    its grid), the best dev F1 beside a test score, the number of trials.

    Args:
        row: A row of :func:`summarize`.

    Example:
        >>> row = {"mean": 50.0, "ci": 2.5, "lr": 0.1, "edge": True, "score": "test", "n": 3}
        >>> cell_text({**row, "dev_mean": 60.0})
        '50.0 ± 2.5 @0.1 ⚠ (dev 60.0) (n=3)'
        >>> cell_text({**row, "dev_mean": 60.0, "n": 1})  # one trial: no interval
        '50.0 @0.1 ⚠ (dev 60.0) (n=1)'
    """
    text = f"{row['mean']:.1f}" + (f" ± {row['ci']:.1f}" if row["n"] > 1 else "")
    if row["lr"] is not None:
        text += f" @{format_lr(row['lr'])}" + (" ⚠" if row["edge"] else "")
    if row["score"] == "test":
        text += f" (dev {row['dev_mean']:.1f})"
    return text + f" (n={row['n']})"


def markdown_row(columns: Sequence[Any]) -> str:
    """One line of a markdown table.

    Args:
        columns: Its cells (written with ``str``).

    Example:
        >>> markdown_row(["fe", 25, "50.0"])
        '| fe | 25 | 50.0 |'
    """
    return "| " + " | ".join(map(str, columns)) + " |"


def markdown_table(rows: Sequence[dict[str, Any]], lead: Sequence[str] = (), edges: bool = True) -> str:
    """Rows of :func:`summarize` as a markdown table (one column per method, in the registry's order),
    legend and edge flags.

    Args:
        rows: Rows of :func:`summarize`.
        lead: Row fields written first in every line and in its edge flag, and grouping the lines with
            the cell's fields: e.g. ``("language",)`` for the rows of several results files, each row
            tagged with its file's language (:func:`grouped_table_markdown`).
        edges: List the cells whose selected LR is at the edge of its grid under the legend (a
            second table of the same cells, another metric, leaves them to the first).

    Example:
        >>> print(markdown_table(summarize(sweep_records)).splitlines()[2])  # the first row (2 LRs: edges)
        | fe | 25 | 8 | 41.0 ± 9.9 @0.01 ⚠ (dev 44.0) (n=3) | 56.0 ± 9.9 @0.1 ⚠ (dev 59.0) (n=3) | ...
    """
    methods = sorted(dict.fromkeys(row["method"] for row in rows), key=method_rank)
    # a setup column only where one group (e.g. one language) mixes setups
    setups_per_group = defaultdict(set)
    for row in rows:
        setups_per_group[tuple(row[field] for field in lead)].add(row["setup"])
    setup = ["setup"] if any(len(found) > 1 for found in setups_per_group.values()) else []
    header = [*lead, *setup, "regime", "epochs", "shots", *methods]
    lines = [markdown_row(header), "|" + "---|" * len(header)]
    by_cell: dict[tuple, dict[str, str]] = defaultdict(dict)
    for row in rows:
        cell = (*(row[field] for field in lead), row["setup"], row["regime"], row["epochs"], row["shots"])
        by_cell[cell][row["method"]] = cell_text(row)
    for (*leading, setup_name, regime, epochs, shots), texts in by_cell.items():
        first = [setup_name] if setup else []
        lines.append(
            markdown_row(
                [*leading, *first, regime, epochs, shots_text(shots), *(texts.get(m, "-") for m in methods)]
            )
        )
    legend = table_legend(rows)
    flagged = [row for row in rows if row["edge"]] if edges else []
    if flagged:
        legend += "\n⚠ widen the grid: the selected LR is at the edge of its grid:\n" + "".join(
            f"- {_lead_text(r, lead)}{r['method']} {r['regime']} {r['epochs']} epochs "
            f"N={shots_text(r['shots'])}: "
            f"{format_lr(r['lr'])} of [{', '.join(map(format_lr, r['lrs']))}]\n"
            for r in flagged
        )
    return "\n".join(lines) + "\n" + legend


def table_legend(rows: Sequence[dict[str, Any]]) -> str:
    """The legend under :func:`markdown_table`: which score, where its epoch and LR come from.

    Example:
        >>> table_legend([{"score": "test", "metric": "accuracy", "selected_by": "accuracy"}])[:43]
        "\\nTest accuracy at each run's best dev epoch"
    """
    tested = any(row["score"] == "test" for row in rows)
    own, by = (rows[0].get("metric", "f1"), rows[0].get("selected_by", "f1")) if rows else ("f1", "f1")
    metric, selecting = metric_named(own), metric_named(by)
    if not tested:
        return (
            f"\nDev {metric.long}, best over epochs, mean ± 95% CI (t) over trials, at the LR (@) "
            "selected on dev (the records have no test score: no test split; this number is optimistic).\n"
        )
    if own == by:
        return (
            f"\nTest {metric.long} at each run's best dev epoch, mean ± 95% CI (t) over trials, at the LR "
            f"(@) selected on dev (mean best dev {selecting.short} over trials, ties to the smaller LR); "
            f"(dev x) is the best dev {metric.short} at that LR (the paper's number, chosen on the data it "
            "reports).\n"
        )
    return (
        f"\nTest {metric.long} at each run's best dev epoch (best by dev {selecting.short}), mean ± 95% "
        f"CI (t) over trials, at the LR (@) selected on dev (mean best dev {selecting.short} over trials, "
        f"ties to the smaller LR); (dev x) is the dev {metric.short} at those epochs and LR.\n"
    )


def _lead_text(row: dict[str, Any], lead: Sequence[str]) -> str:
    """The ``lead`` fields of a row before its cell in a line of text, e.g. ``"de: "``."""
    return ", ".join(str(row[field]) for field in lead) + ": " if lead else ""


def _save(figure, path: Path) -> Path:
    return atomic_write(path, lambda temp: figure.savefig(temp, dpi=120, bbox_inches="tight", format="png"))


def _caption(figure, note: str) -> None:
    """Write ``note`` (:func:`variants_note`) under ``figure`` where there is one: its lines and legends
    name each run by its method alone."""
    if note:  # below everything drawn so far (rotated tick labels and axis titles reach under y = 0)
        drawn = figure.get_tightbbox(figure.canvas.get_renderer())  # inches
        figure.text(0.01, drawn.y0 / figure.get_figheight() - 0.02, note, fontsize=9, ha="left", va="top")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def method_color(method: str) -> str:
    """The colour of ``method`` in every figure: matplotlib's ten-colour cycle in the registry's order
    (the plain head first), so a method has one colour whatever else a figure shows.

    Example:
        >>> method_color("none"), method_color("dwatt")
        ('C0', 'C1')
    """
    rank = method_rank(method)[0]
    if rank == len(TRAINED_NAMES):  # not a registered method (an old record): a stable colour of its name
        rank = zlib.crc32(method.encode())
    return f"C{rank % 10}"


def _legend(axes) -> None:
    """One legend, right of the last panel (never over a line): every method once, by its display name
    (:func:`method_label`), in the registry's order."""
    handles: dict[str, Any] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    methods = {method_label(method): method for method in METHOD_LABELS}
    labels = sorted(handles, key=lambda label: method_rank(methods.get(label, label)))
    axes[0][-1].legend(
        [handles[label] for label in labels],
        labels,
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
    )


def _finish_panels(plt, figure, axes, path: str | os.PathLike, ylabel: str, note: str = "") -> Path:
    """Label the first panel's y axis, put the legend right of the last, save the PNG (``note`` under
    it) and close it."""
    axes[0][0].set_ylabel(ylabel)
    _legend(axes)
    _caption(figure, note)
    saved = _save(figure, Path(path))
    plt.close(figure)
    return saved


# where an LR label may sit, tried in this order: (dx, dy) in points from its point, ha, va
LABEL_PLACES = (
    (5, 0, "left", "center"),
    (-5, 0, "right", "center"),
    (0, 6, "center", "bottom"),
    (0, -6, "center", "top"),
    *((dx, dy, ha, "center") for dy in (8, -8, 16, -16, 24, -24) for dx, ha in ((5, "left"), (-5, "right"))),
)
MARKER_RADIUS_PT = 3.5  # half a default marker (6 points) and a margin: a label never covers a point
LINE_COST = 0.25  # a label crossing a line costs as much as covering a quarter of another label


def _lr_labels(ax, labels: Sequence[tuple[float, float, str, str]]) -> None:
    """Write each ``(x, y, text, method)`` beside its point in the method's colour, at the first place of
    :data:`LABEL_PLACES` where it covers no other label, no point, crosses no line and stays inside the
    panel (the least covered place when none is free): right of its point, else left, above, below,
    then further up or down. Close shot sizes (N = 2, 3, 4 on the log axis) and close scores thus keep
    their labels apart."""
    renderer = ax.figure.canvas.get_renderer()
    radius = MARKER_RADIUS_PT * ax.figure.dpi / 72
    taken = [
        _Box(px - radius, py - radius, px + radius, py + radius)
        for px, py in (ax.transData.transform((x, y)) for x, y, *_ in labels)
    ]
    lines = [line.get_transform().transform_path(line.get_path()) for line in ax.get_lines()]
    panel = ax.get_window_extent(renderer)
    for x, y, text, method in sorted(labels, key=lambda label: (label[0], -label[1])):
        best = None
        for dx, dy, ha, va in LABEL_PLACES:
            note = ax.annotate(
                text, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, va=va, fontsize=6,
                color=method_color(method),
            )  # fmt: skip
            box = note.get_window_extent(renderer)
            crossed = sum(path.intersects_bbox(box, filled=False) for path in lines)
            cost = sum(_overlap(box, other) for other in taken) + _outside(box, panel)
            cost += crossed * LINE_COST * box.width * box.height
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, note, box)
            else:
                note.remove()
            if cost == 0:
                break
        taken.append(best[2])


@dataclass(frozen=True)
class _Box:
    """A rectangle in display coordinates (as matplotlib's ``Bbox`` names its sides)."""

    x0: float
    y0: float
    x1: float
    y1: float


def _overlap(a, b) -> float:
    """The area two display boxes share (0 when apart)."""
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(0.0, width) * max(0.0, height)


def _outside(box, panel) -> float:
    """How much of ``box`` lies outside ``panel``, weighed as a cover of it."""
    return _overlap(box, box) - _overlap(box, panel)


def shots_axis(shots: Sequence[int]) -> dict[int, float]:
    """Where each shots value sits on a log2 axis: N at N, the full train set at twice the largest N
    (1 without one).

    Example:
        >>> shots_axis([8, 32, FULL_TRAIN])
        {8: 8, 32: 32, 0: 64}
    """
    largest = max((n for n in shots if n != FULL_TRAIN), default=0.5)
    return {n: 2 * largest if n == FULL_TRAIN else n for n in shots}


def setup_label(setup: str) -> str:
    """How every table, title and label names a setup, where a file holds runs of several: a report never
    pools two setups' runs (their data, model or settings differ), it shows each apart.

    Example:
        >>> setup_label("3f2a")
        '(setup 3f2a)'
    """
    return f"(setup {setup})"


def setup_suffix(setup: str, several: bool) -> str:
    """A panel title's second line naming its setup (:func:`setup_label`), where the runs drawn come from
    several setups: a figure gives each setup its own panels.

    Example:
        >>> setup_suffix("3f2a", True), setup_suffix("3f2a", False)
        ('\\n(setup 3f2a)', '')
    """
    return f"\n{setup_label(setup)}" if several else ""


def panel_title(panel: tuple[str, str, int, int], several: bool) -> str:
    """The title of a ``(setup, regime, epochs, shots)`` panel (its setup named where there are several).

    Example:
        >>> print(panel_title(("3f2a", "fe", 25, 8), several=True))
        frozen encoder, 25 epochs, N=8
        (setup 3f2a)
    """
    setup, regime, epochs, shots = panel
    return f"{regime_label(regime)}, {epochs} epochs, N={shots_text(shots)}{setup_suffix(setup, several)}"


def plot_f1_vs_shots(rows: Sequence[dict[str, Any]], path: str | os.PathLike, note: str = "") -> Path:
    """The reported score vs shots with CI bands per method, one panel per (setup, regime, max epochs); each
    point labelled with its LR selected on dev, in the method's colour; ``note`` under it
    (:func:`variants_note`)."""
    plt = _pyplot()
    panels = list(dict.fromkeys((row["setup"], row["regime"], row["epochs"]) for row in rows))
    several = len({setup for setup, *_ in panels}) > 1
    where = shots_axis([row["shots"] for row in rows])
    figure, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False, sharey=True)
    labels: list[list[tuple[float, float, str, str]]] = [[] for _ in panels]
    for ax, (setup, regime, epochs), own in zip(axes[0], panels, labels, strict=True):
        panel = [
            row for row in rows if (row["setup"], row["regime"], row["epochs"]) == (setup, regime, epochs)
        ]
        for method in sorted(dict.fromkeys(row["method"] for row in panel), key=method_rank):
            line = sorted((r for r in panel if r["method"] == method), key=lambda r: shots_size(r["shots"]))
            shots = [where[r["shots"]] for r in line]
            mean = [r["mean"] for r in line]
            color = method_color(method)
            ax.plot(shots, mean, marker="o", label=method_label(method), color=color)
            for row, x, y in zip(line, shots, mean, strict=True):  # the LR selected on dev, per point
                if row.get("lrs") and len(row["lrs"]) > 1:
                    own.append((x, y, f"{row['lr']:g}" + (" (edge)" if row["edge"] else ""), method))
            low = [max(0.0, m - r["ci"]) for m, r in zip(mean, line, strict=True)]  # a score is in [0, 100]:
            high = [min(100.0, m + r["ci"]) for m, r in zip(mean, line, strict=True)]  # so is its interval
            if len(shots) > 1:
                ax.fill_between(shots, low, high, alpha=0.2, color=color)
            else:  # one shot size: a band would be a hairline
                yerr = [[mean[0] - low[0]], [high[0] - mean[0]]]
                ax.errorbar(shots, mean, yerr=yerr, color=color, capsize=4, alpha=0.6, linestyle="none")
        ax.set_xscale("log", base=2)
        ticks = sorted({row["shots"] for row in panel}, key=shots_size)
        smallest, largest = where[ticks[0]], where[ticks[-1]]
        ax.set_xlim(smallest / 2**0.3, largest * 2**0.9)  # room for the LR labels right of the points
        ax.set_xticks([where[n] for n in ticks], [shots_text(n) for n in ticks])
        ax.minorticks_off()
        ax.set_title(f"{regime_label(regime)}, max {epochs} epochs{setup_suffix(setup, several)}")
        ax.set_xlabel("shots N (labels: LR selected on dev)")
    for ax, own in zip(axes[0], labels, strict=True):  # once every panel has its y range (shared)
        _lr_labels(ax, own)
    score = "test" if all(row["score"] == "test" for row in rows) else "dev"
    axis = metric_named(rows[0]["metric"] if rows else "f1").axis
    return _finish_panels(plt, figure, axes, path, f"{score} {axis} (%)\nmean ± 95% CI over trials", note)


def plot_f1_vs_lr(rows: Sequence[dict[str, Any]], path: str | os.PathLike, note: str = "") -> Path | None:
    """Mean dev F1 (solid) and test F1 (dashed) vs LR per method, the selected LR circled; one
    panel per (setup, regime, epochs, shots); ``note`` under it (:func:`variants_note`). ``None`` when no cell
    has two LRs or more."""
    rows = [row for row in rows if len(row["lrs"]) > 1 and None not in row["lrs"]]
    if not rows:
        return None
    plt = _pyplot()
    panels = list(dict.fromkeys((row["setup"], row["regime"], row["epochs"], row["shots"]) for row in rows))
    several = len({panel[0] for panel in panels}) > 1
    figure, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels, strict=True):
        panel_rows = sorted(
            (r for r in rows if (r["setup"], r["regime"], r["epochs"], r["shots"]) == panel),
            key=lambda r: method_rank(r["method"]),
        )
        for row in panel_rows:
            lrs, color = row["lrs"], method_color(row["method"])
            label = method_label(row["method"])
            ax.plot(lrs, [row["dev_by_lr"][lr] for lr in lrs], marker="o", color=color, label=label)
            tests = [row["test_by_lr"][lr] for lr in lrs]
            if all(t is not None for t in tests):
                ax.plot(lrs, tests, linestyle="--", color=color)
            selected = (row["lr"], row["dev_by_lr"][row["lr"]])
            ax.plot(*selected, marker="o", markersize=12, fillstyle="none", color=color)
        ax.set_xscale("log")
        ax.minorticks_off()  # one labelled tick per LR of the panel, none between them
        ticks = sorted({lr for row in panel_rows for lr in row["lrs"]})
        ax.set_xticks(ticks, [format_lr(lr) for lr in ticks], rotation=45, fontsize=8)
        ax.set_title(panel_title(panel, several))
        ax.set_xlabel("max LR (circled: selected on dev)")
    axis = metric_named(rows[0]["metric"]).axis
    label = f"{axis} (%), mean over trials\n(solid: dev, dashed: test)"
    return _finish_panels(plt, figure, axes, path, label, note)


def plot_dev_curves(
    records: Sequence[dict[str, Any]], path: str | os.PathLike, rows: Sequence[dict[str, Any]] | None = None
) -> Path:
    """Dev F1 vs training steps (mean over trials) per method, one panel per (setup, regime, epochs,
    shots), at each cell's LR selected on dev (the rows of :func:`summarize`, computed when not given)."""
    plt = _pyplot()
    metric = record_metric(records[0])
    selected = {cell_of(row): row["lr"] for row in (summarize(records) if rows is None else rows)}
    curves: dict[tuple, dict[str, list[list[dict]]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if record.get("lr") != selected.get(cell_of(record)):
            continue
        panel = (record["setup"], record["regime"], record["epochs"], record["shots"])
        curves[panel][record["method"]].append(record["curve"])
    panels = sorted(curves)
    several = len({panel[0] for panel in panels}) > 1
    figure, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels, strict=True):
        drawn: set[int] = set()
        for method in sorted(curves[panel], key=method_rank):
            runs = curves[panel][method]
            length = min(len(run) for run in runs)
            steps = [runs[0][i]["step"] for i in range(length)]
            mean = [100 * sum(run[i][f"dev_{metric}"] for run in runs) / len(runs) for i in range(length)]
            # markers: a run with one dev evaluation is one point, which a line alone does not show
            color = method_color(method)
            ax.plot(steps, mean, marker="o", markersize=4, label=method_label(method), color=color)
            drawn.update(steps)
        ax.set_title(panel_title(panel, several))
        if len(drawn) < 3:  # one or two evaluations: ticks at their steps, none between
            ax.set_xticks(sorted(drawn))
        ax.set_xlabel("training steps")
    axis = metric_named(metric).axis
    label = f"dev {axis} (%)\nselected LR, mean over trials"
    return _finish_panels(plt, figure, axes, path, label, variants_note(records))


def plot_depth_attention(
    records: Sequence[dict[str, Any]], path: str | os.PathLike, rows: Sequence[dict[str, Any]] | None = None
) -> Path | None:
    """Heatmap of the mean depth-attention per fused layer of every depth-attention method (DWAtt,
    Scaled DWAtt), one row per method and cell, at the cell's LR selected on dev (the rows of
    :func:`summarize`, computed when not given); ``None`` without depth-attention records. Each row
    averages one method's trials of one setup only."""
    selected = {cell_of(row): row["lr"] for row in (summarize(records) if rows is None else rows)}
    groups: dict[tuple, list[list[float]]] = defaultdict(list)
    for record in records:
        if record.get("depth_attention") and record.get("lr") == selected.get(cell_of(record)):
            method, setup = record["method"], record["setup"]
            key = (method_rank(method), method, setup, record["regime"], record["shots"], record["epochs"])
            groups[key].append(record["depth_attention"])
    if not groups:
        return None
    plt = _pyplot()
    keys = sorted(groups)
    several_setups = len({key[2] for key in keys}) > 1
    matrix = [[sum(col) / len(col) for col in zip(*groups[key], strict=True)] for key in keys]
    layers = len(matrix[0])
    # wide and tall enough for the title and the colour bar's label whatever the layer and row counts
    figure, ax = plt.subplots(figsize=(max(4.5, 2.0 + 0.6 * layers), max(2.4, 1.2 + 0.4 * len(keys))))
    image = ax.imshow(matrix, aspect="auto", cmap="viridis")
    ax.set_xticks(range(layers), [str(i) for i in records_layers(records, layers)])
    labels = []
    for _, method, setup, regime, shots, epochs in keys:
        label = f"{method_label(method)}: {regime_label(regime)} N={shots_text(shots)} ep={epochs}"
        labels.append(f"{label} {setup_label(setup)}" if several_setups else label)
    ax.set_yticks(range(len(keys)), labels)
    ax.set_xlabel("fused layer")
    ax.set_title("mean depth attention\n(dev tokens, at the selected LR)", fontsize=10)
    figure.colorbar(image, ax=ax).set_label("mean attention weight\n(each row sums to 1)")
    _caption(figure, variants_note(records))
    path = _save(figure, Path(path))
    plt.close(figure)
    return path


def records_layers(records: Sequence[dict[str, Any]], count: int) -> list[int]:
    """Layer indices of the DWAtt records (default ``1..K``: blocks 1..L)."""
    for record in records:
        if record.get("fused_layers"):
            return list(record["fused_layers"])
    return list(range(1, count + 1))


def method_pairs() -> tuple[tuple[str, str], ...]:
    """The pairs whose per-trial differences are tabulated (when both methods are in the results),
    from the registry's flags, in its order: each fusion method sized to the budget minus each depth
    baseline (a method that is not token-wise: R+n), those fusion methods against each other, each
    of them minus the plain head, then each method not sized to a budget minus each depth baseline.

    Example:
        >>> method_pairs()[:3]
        (('dwatt', 'extra_layers'), ('concat', 'extra_layers'), ('scaled_dwatt', 'extra_layers'))
    """
    budget = [m.name for m in TRAINED_METHODS if m.module_cls.sized_to_budget and m.token_wise]
    depth = [m.name for m in TRAINED_METHODS if not m.token_wise]
    light = [m.name for m in TRAINED_METHODS if not m.module_cls.sized_to_budget]
    recommended = [
        m.name for m in TRAINED_METHODS if getattr(m, "recommended", False) and m.name not in budget
    ]
    return (
        *itertools.product(budget, depth),
        *itertools.combinations(budget, 2),
        *((name, PLAIN_HEAD) for name in budget),
        *itertools.product(light, depth),
        *((name, PLAIN_HEAD) for name in recommended),  # the method we recommend against the plain head
    )


PAIRS = method_pairs()


def paired_differences(records: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> list[dict]:
    """Per cell and pair of methods: the per-trial differences of the reported score, each method at
    its own dev-selected LR (trials share their sample across methods, so the pair is matched;
    :func:`~layerfusion_recipes.core.results.summary.paired_by_trial`).

    Returns rows ``{setup, regime, epochs, shots, pair, mean, ci, n}`` (points; mean ± 95% t-CI).

    Example:
        >>> differences = paired_differences(sweep_records, summarize(sweep_records))
        >>> differences[0]["pair"], round(differences[0]["mean"], 1)  # every trial 15 points apart
        (('dwatt', 'none'), 15.0)
    """
    chosen = {(cell[:-1], cell[-1]): row for row in rows for cell in [cell_of(row)]}

    def metric(record: dict[str, Any]) -> str:
        row = chosen.get((cell_of(record)[:-1], record["method"]))
        return record_metric(record) if row is None else row["metric"]

    groups = score_groups(records, metric)
    groups = {key: groups[key] for key in chosen if key in groups}
    out = []
    for setting, first, second, (mean, half, n) in paired_by_trial(
        groups, PAIRS, lambda group: chosen[group.setting, group.method]["score"]
    ):
        cell = dict(zip(("setup", "regime", "epochs", "shots"), setting, strict=True))
        out.append({**cell, "pair": (first, second), "mean": mean, "ci": half, "n": n})
    return out


def paired_table(differences: Sequence[dict[str, Any]], lead: Sequence[str] = ()) -> str:
    """Markdown: one row per cell, one column per pair, ``+x ± ci`` (bold when the CI excludes 0).

    Args:
        differences: Rows of :func:`paired_differences`.
        lead: Fields written first in every line and grouping the lines with the cell's (as in
            :func:`markdown_table`), e.g. ``("language",)``.

    Example:
        >>> print(paired_table(paired_differences(sweep_records, summarize(sweep_records))).splitlines()[0])
        | regime | epochs | shots | dwatt - none | layer_mix - none |
    """
    if not differences:
        return ""
    pairs = sorted(dict.fromkeys(d["pair"] for d in differences), key=PAIRS.index)
    header = [*lead, "regime", "epochs", "shots", *(f"{a} - {b}" for a, b in pairs)]
    lines = [markdown_row(header), "|" + "---|" * len(header)]
    by_cell: dict[tuple, dict[tuple, str]] = {}
    for d in differences:
        # one pair has no interval: say n rather than a "± 0.0" that reads as a tight one
        text = f"{d['mean']:+.1f} ± {d['ci']:.1f}" if d["n"] > 1 else f"{d['mean']:+.1f} (n=1)"
        cell = (*(d[field] for field in lead), d["regime"], d["epochs"], shots_text(d["shots"]))
        by_cell.setdefault(cell, {})[d["pair"]] = (
            f"**{text}**" if excludes_zero(d["mean"], d["ci"], d["n"]) else text
        )
    for cell, texts in by_cell.items():
        lines.append(markdown_row([*cell, *(texts.get(pair, "-") for pair in pairs)]))
    return (
        "\n".join(lines)
        + "\n\nPaired per-trial differences of the same score (points), each method at its own selected LR, "
        "mean ± 95% t-CI over the trials both have; bold: the interval excludes 0.\n"
    )


def _tables(table: str, paired: str) -> str:
    return table + ("\n" + paired if paired else "")


def variant_text(record: dict[str, Any]) -> str:
    """What a run changed of its method's defaults: its ``method_options``, and the number of probed
    blocks it fuses where the probes chose them (``--probe-fuse``); ``""`` for none.

    Example:
        >>> run = {"method": "average", "method_options": {"state_norm": "rms"}, "probe_layers": [2, 4]}
        >>> variant_text(run)
        'state_norm=rms, the 2 best probed blocks'
        >>> variant_text({"method": "dwatt"})
        ''
    """
    options = [f"{k}={v}" for k, v in sorted((record.get("method_options") or {}).items())]
    if "probe_layers" in record:
        options.append(f"the {len(record['probe_layers'])} best probed blocks")
    return ", ".join(options)


def variants_note(records: Sequence[dict[str, Any]]) -> str:
    """A line naming the options each method's runs were given (:func:`variant_text`: the experiment's
    ``method_options``, and the blocks ``--probe-fuse`` chose), for the tables and figures that label a
    run by its method alone; ``""`` where no run was given any.

    Example:
        >>> variants_note([{"method": "average", "probe_layers": [2, 3]}, {"method": "none"}])
        'Options given to these runs: Average: the 2 best probed blocks.'
    """
    named = {  # each method's variant once, in file order
        f"{method_label(record['method'])}: {variant}": None
        for record in records
        if (variant := variant_text(record))
    }
    return f"Options given to these runs: {'; '.join(named)}." if named else ""


def table_markdown(records: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]] | None = None) -> str:
    """The text of ``table.md``: :func:`markdown_table` then, when two paired methods are in the
    records, :func:`paired_table` of their :func:`paired_differences`; the same again for each
    further metric of the records (:func:`record_metrics`: ``classify``'s macro-F1), at the LRs and
    epochs the first one selected.

    Args:
        records: The records of a results file.
        rows: Their :func:`summarize` (computed when not given).

    Example:
        >>> print(table_markdown(sweep_records).splitlines()[0])
        | regime | epochs | shots | none | dwatt | scalar_mix | layer_mix |
    """
    rows = summarize(records) if rows is None else rows
    text = _tables(markdown_table(rows), paired_table(paired_differences(records, rows)))
    for metric in record_metrics(records)[1:]:
        other = summarize(records, metric)
        differences = paired_differences(records, other)
        text += "\n" + _tables(markdown_table(other, edges=False), paired_table(differences))
    note = variants_note(records)
    return text + (f"\n{note}\n" if note else "")


def grouped_table_markdown(groups: Mapping[str, Sequence[dict[str, Any]]], field: str) -> str:
    """:func:`table_markdown` of several results files in one: each file's rows and paired differences
    (computed within the file) tagged with its name in ``field``, which leads every line.

    Args:
        groups: The records of each results file, by name (e.g. by language), in the tables' order.
        field: The name of the leading column, e.g. ``"language"``.

    Example:
        >>> files = {lang: [{**r, "setup": lang} for r in sweep_records] for lang in ("en", "de")}
        >>> print(grouped_table_markdown(files, "language").splitlines()[2])  # the first row
        | en | fe | 25 | 8 | 41.0 ± 9.9 @0.01 ⚠ (dev 44.0) (n=3) | 56.0 ± 9.9 @0.1 ⚠ (dev 59.0) (n=3) | ...
    """
    rows: list[dict[str, Any]] = []
    differences: list[dict[str, Any]] = []
    for name, records in groups.items():
        own = summarize(records)
        rows += [{**row, field: name} for row in own]
        differences += [{**d, field: name} for d in paired_differences(records, own)]
    return _tables(markdown_table(rows, (field,)), paired_table(differences, (field,)))


def write_report(records: Sequence[dict[str, Any]], output: str | os.PathLike) -> dict[str, Path]:
    """Write ``table.md`` and the figures into ``output``; returns their paths by name.

    The figures of the score are named after the records' metric: ``f1_vs_shots.png`` for NER,
    ``accuracy_vs_shots.png`` for ``classify``.

    Example:
        >>> write_report(sweep_records, "out")["f1_vs_shots"]
        PosixPath('out/f1_vs_shots.png')
    """
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    rows = summarize(records)
    metric = record_metric(records[0])
    table = atomic_write_text(output / "table.md", table_markdown(records, rows))
    note = variants_note(records)  # the figures name each run by its method alone
    paths = {
        "table": table,
        f"{metric}_vs_shots": plot_f1_vs_shots(rows, output / f"{metric}_vs_shots.png", note),
        "dev_curves": plot_dev_curves(records, output / "dev_curves.png", rows),
    }
    by_lr = plot_f1_vs_lr(rows, output / f"{metric}_vs_lr.png", note)
    if by_lr is not None:
        paths[f"{metric}_vs_lr"] = by_lr
    heatmap = plot_depth_attention(records, output / "dwatt_attention.png", rows)
    if heatmap is not None:
        paths["dwatt_attention"] = heatmap
    return paths


def plot_main(args: argparse.Namespace) -> int:
    records = read_task_records(args.results)  # lines that are no record: skipped, said on stderr
    sweep_task(records, args.results)  # one task's, that of a sweep
    if not records:
        raise SystemExit(f"{args.results}: no finished cell found")
    paths = write_report(records, args.output or Path(args.results).parent)
    print(paths["table"].read_text())
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
