"""``layerfusion plot``: paper-style figures and a markdown table from a results file.

* ``f1_vs_shots.png``: best dev F1 vs shots per method (mean over trials, 95% t-CI band),
  one panel per max-epochs (and regime);
* ``dev_curves.png``: dev F1 vs training steps (mean over trials) per method;
* ``dwatt_attention.png``: for DWAtt cells, the mean depth-attention weight of every fused
  layer (which layers the task uses), one row per (regime, shots, epochs);
* ``table.md``: mean +- CI per cell.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .results import read_records
from .stats import mean_ci

GROUP = ("regime", "epochs", "shots", "method")


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (regime, epochs, shots, method): mean best dev F1 (in points), CI half-width, n.

    Example:
        >>> record = {"regime": "fe", "epochs": 25, "shots": 8, "method": "dwatt", "best_f1": 0.5}
        >>> summarize([record])[0]["mean"]
        50.0
    """
    groups: dict[tuple, list[float]] = defaultdict(list)
    for record in records:
        groups[tuple(record[k] for k in GROUP)].append(100.0 * record["best_f1"])
    rows = []
    method_order = {method: i for i, method in enumerate(dict.fromkeys(r["method"] for r in records))}
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], method_order[k[3]])):
        mean, half = mean_ci(groups[key])
        rows.append({**dict(zip(GROUP, key, strict=True)), "mean": mean, "ci": half, "n": len(groups[key])})
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of :func:`summarize` as a markdown table (one column per method)."""
    methods = list(dict.fromkeys(row["method"] for row in rows))
    header = "| regime | epochs | shots | " + " | ".join(methods) + " |"
    lines = [header, "|" + "---|" * (3 + len(methods))]
    by_cell: dict[tuple, dict[str, str]] = defaultdict(dict)
    for row in rows:
        by_cell[(row["regime"], row["epochs"], row["shots"])][row["method"]] = (
            f"{row['mean']:.1f} ± {row['ci']:.1f} (n={row['n']})"
        )
    for (regime, epochs, shots), cells in by_cell.items():
        lines.append(
            f"| {regime} | {epochs} | {shots} | " + " | ".join(cells.get(m, "-") for m in methods) + " |"
        )
    return "\n".join(lines) + "\n\nDev micro-F1 (seqeval), best over epochs, mean ± 95% CI (t) over trials.\n"


def _save(figure, path: Path) -> Path:
    handle, temp = tempfile.mkstemp(dir=path.parent, suffix=".png")
    os.close(handle)
    figure.savefig(temp, dpi=120, bbox_inches="tight", format="png")
    os.replace(temp, path)
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish_panels(plt, figure, axes, path: str | os.PathLike) -> Path:
    """Label the first panel's y axis, put the legend on the last, save the PNG and close it."""
    axes[0][0].set_ylabel("dev micro-F1")
    axes[0][-1].legend(fontsize=8)
    saved = _save(figure, Path(path))
    plt.close(figure)
    return saved


def plot_f1_vs_shots(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """F1 vs shots with CI bands per method, one panel per (regime, max epochs)."""
    plt = _pyplot()
    panels = list(dict.fromkeys((row["regime"], row["epochs"]) for row in rows))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, (regime, epochs) in zip(axes[0], panels, strict=True):
        panel = [row for row in rows if (row["regime"], row["epochs"]) == (regime, epochs)]
        for method in dict.fromkeys(row["method"] for row in panel):
            line = sorted((r for r in panel if r["method"] == method), key=lambda r: r["shots"])
            shots = [r["shots"] for r in line]
            mean = [r["mean"] for r in line]
            ax.plot(shots, mean, marker="o", label=method)
            ax.fill_between(
                shots,
                [m - r["ci"] for m, r in zip(mean, line, strict=True)],
                [m + r["ci"] for m, r in zip(mean, line, strict=True)],
                alpha=0.2,
            )
        ax.set_xscale("log", base=2)
        ax.set_title(f"{regime}, max {epochs} epochs")
        ax.set_xlabel("shots N")
    return _finish_panels(plt, figure, axes, path)


def plot_dev_curves(records: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Dev F1 vs training steps (mean over trials) per method, one panel per (regime, epochs, shots)."""
    plt = _pyplot()
    curves: dict[tuple, dict[str, list[list[dict]]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        curves[(record["regime"], record["epochs"], record["shots"])][record["method"]].append(
            record["curve"]
        )
    panels = sorted(curves)
    figure, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels, strict=True):
        for method, runs in curves[panel].items():
            length = min(len(run) for run in runs)
            steps = [runs[0][i]["step"] for i in range(length)]
            mean = [100 * sum(run[i]["dev_f1"] for run in runs) / len(runs) for i in range(length)]
            ax.plot(steps, mean, label=method)
        ax.set_title("{}, {} epochs, N={}".format(*panel))
        ax.set_xlabel("training steps")
    return _finish_panels(plt, figure, axes, path)


def plot_depth_attention(records: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path | None:
    """Heatmap of DWAtt's mean depth-attention per fused layer; ``None`` without DWAtt records."""
    groups: dict[tuple, list[list[float]]] = defaultdict(list)
    for record in records:
        if record.get("depth_attention"):
            groups[(record["regime"], record["shots"], record["epochs"])].append(record["depth_attention"])
    if not groups:
        return None
    plt = _pyplot()
    keys = sorted(groups)
    matrix = [[sum(col) / len(col) for col in zip(*groups[key], strict=True)] for key in keys]
    layers = len(matrix[0])
    figure, ax = plt.subplots(figsize=(1.0 + 0.6 * layers, 0.9 + 0.4 * len(keys)))
    image = ax.imshow(matrix, aspect="auto", cmap="viridis")
    ax.set_xticks(range(layers), [str(i) for i in records_layers(records, layers)])
    ax.set_yticks(range(len(keys)), [f"{r} N={n} ep={e}" for r, n, e in keys])
    ax.set_xlabel("fused layer")
    ax.set_title("DWAtt mean depth attention (dev tokens)")
    figure.colorbar(image, ax=ax)
    path = _save(figure, Path(path))
    plt.close(figure)
    return path


def records_layers(records: Sequence[dict[str, Any]], count: int) -> list[int]:
    """Layer indices of the DWAtt records (default ``1..K``: blocks 1..L)."""
    for record in records:
        if record.get("fused_layers"):
            return list(record["fused_layers"])
    return list(range(1, count + 1))


def write_report(records: Sequence[dict[str, Any]], output: str | os.PathLike) -> dict[str, Path]:
    """Write ``table.md`` and the figures into ``output``; returns their paths by name.

    Example:
        >>> write_report(read_records("out/results.jsonl"), "out")["f1_vs_shots"]
    """
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    rows = summarize(records)
    table = output / "table.md"
    handle, temp = tempfile.mkstemp(dir=output, suffix=".md")
    with os.fdopen(handle, "w") as stream:
        stream.write(markdown_table(rows))
    os.replace(temp, table)
    paths = {
        "table": table,
        "f1_vs_shots": plot_f1_vs_shots(rows, output / "f1_vs_shots.png"),
        "dev_curves": plot_dev_curves(records, output / "dev_curves.png"),
    }
    heatmap = plot_depth_attention(records, output / "dwatt_attention.png")
    if heatmap is not None:
        paths["dwatt_attention"] = heatmap
    return paths


def plot_main(args: argparse.Namespace) -> int:
    records = read_records(args.results)
    if not records:
        raise SystemExit(f"{args.results}: no finished cell found")
    paths = write_report(records, args.output or Path(args.results).parent)
    print(paths["table"].read_text())
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``layerfusion plot``."""
    parser = subparsers.add_parser(
        "plot",
        help="Figures and a markdown table from a results file.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "results", help="Results file written by `layerfusion ner` / `layerfusion sweep` (JSON lines)."
    )
    parser.add_argument(
        "--output", help="Folder for table.md and the PNG figures (default: the results file's folder)."
    )
    parser.set_defaults(func=plot_main)
    return parser
